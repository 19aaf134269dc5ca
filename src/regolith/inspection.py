"""`regolith inspect`: what a GGUF file (or packed model directory) holds, or the memory plan a load of it
would make."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import gguf as _gguf
from .models import resolve_files
from .terminal import human_bytes

__all__ = ["inspect_command"]


def _human_count(n: int) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _scalar_str(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def inspect_command(args: argparse.Namespace, console: Console) -> int:
    """`regolith inspect`: the summary, hyper-parameters and tensor types of a GGUF file or packed model, or
    with --plan the memory plan a load would make; returns the exit status."""
    from . import memory_plan, model_sizes
    from .model import default_n_ctx, plan_sizes, tokenizer_at_load
    from .pack import is_packed, open_packed

    files = resolve_files(args.model, ple=args.ple, mtp=args.mtp)
    path = str(files.model)
    side = files.side_files
    packed = open_packed(path, verify_dense=False) if is_packed(path) else None
    if packed is not None:
        path = str(packed.dense)
        console.print(
            f"[bold]packed model[/bold] {escape(str(packed.path))} (source {escape(packed.manifest['source']['name'])})"
        )
    if args.plan:
        from . import backends

        dev = backends.device_memory(args.backend)  # a GPU backend: its parts against its free memory
        with _gguf.open(path, side_files=side) as f:
            arch = f.architecture or ""
            kv_type = args.kv_type or model_sizes.default_kv_type(arch)
            sizes = plan_sizes(files, f.tensors, f.metadata, packed.manifest if packed else None, kv_type)
            contexts = args.ctx or [default_n_ctx(f.metadata.get(f"{arch}.context_length"))]
            _held = tokenizer_at_load(f.metadata)  # held while the process is measured, as a load holds it
            overhead = memory_plan.runtime_overhead()
        plans = [
            memory_plan.plan_memory(
                sizes,
                n_ctx=ctx,
                memory_gb=args.memory_gb,
                arena_gb=args.arena_gb,
                ple_cache_gb=args.ple_cache_gb,
                host_cache_gb=args.host_cache_gb,
                device_routing=args.device_routing,
                overhead_bytes=overhead,
                device=(backends.resolve(args.backend), dev[0]) if dev else None,
            )
            for ctx in contexts
        ]
        text = plans[0].render(width=console.width) if len(plans) == 1 else memory_plan.render_contexts(plans)
        console.print(escape(text), highlight=False, soft_wrap=True)
        return 0
    with _gguf.open(path, side_files=side) as f:
        md = f.metadata
        arch = f.architecture

        summary = Table(title=f"[bold]{escape(path)}[/bold]", show_header=False, title_justify="left")
        summary.add_column("key", style="cyan")
        summary.add_column("value", overflow="fold")
        summary.add_row("GGUF version", str(f.version))
        summary.add_row("architecture", escape(arch or "(none)"))
        if "general.name" in md:
            summary.add_row("name", escape(_scalar_str(md["general.name"])))
        tok_model = md.get("tokenizer.ggml.model")
        if tok_model is not None:
            summary.add_row("tokenizer", escape(_scalar_str(tok_model)))
        tokens = md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list):
            summary.add_row("vocab size", f"{len(tokens):,}")
        n_params = sum(t.n_elements for t in f.tensors.values())
        summary.add_row("tensors", f"{len(f.tensors):,}")
        summary.add_row("parameters", f"{n_params:,} ({_human_count(n_params)})")
        summary.add_row("file size", f"{f.file_size:,} bytes ({human_bytes(f.file_size)})")
        if len(f.paths) > 1:
            shards = len(f.groups[0])
            parts = [f"{shards} shards" if shards > 1 else "1 file"]
            parts += [
                f"side file {escape(g[0])}" + (f" ({len(g)} shards)" if len(g) > 1 else "")
                for g in f.groups[1:]
            ]
            summary.add_row("files", ", ".join(parts))
        summary.add_row("alignment", str(f.alignment))
        summary.add_row("metadata keys", str(len(md)))
        console.print(summary)

        if arch:
            prefix = arch + "."
            hparams = Table(title="hyper-parameters", title_justify="left")
            hparams.add_column("key", style="cyan")
            hparams.add_column("value", justify="right")
            for key, value in md.items():
                if key.startswith(prefix) and not isinstance(value, list):
                    hparams.add_row(escape(key[len(prefix) :]), escape(_scalar_str(value)))
            if hparams.row_count:
                console.print(hparams)

        hist: dict[str, list[int]] = {}
        for t in f.tensors.values():
            row = hist.setdefault(t.type_name, [0, 0, 0])
            row[0] += 1
            row[1] += t.n_elements
            row[2] += t.nbytes
        total_bytes = sum(r[2] for r in hist.values())
        types = Table(title="tensor types", title_justify="left")
        for col in ("type", "count", "elements", "bytes", "share"):
            types.add_column(col, justify="left" if col == "type" else "right")
        for name, (count, elems, nbytes) in sorted(hist.items(), key=lambda kv: -kv[1][2]):
            share = 100.0 * nbytes / total_bytes if total_bytes else 0.0
            types.add_row(name, str(count), f"{elems:,}", human_bytes(nbytes), f"{share:.1f}%")
        console.print(types)

        if args.tensors:
            listing = Table(title="tensors", title_justify="left")
            listing.add_column("name", style="cyan", overflow="fold")
            listing.add_column("type")
            listing.add_column("shape", justify="right")
            listing.add_column("bytes", justify="right")
            for t in f.tensors.values():
                listing.add_row(escape(t.name), t.type_name, "×".join(map(str, t.shape)), f"{t.nbytes:,}")
            console.print(listing)
    return 0
