"""The ``regolith`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from . import gguf as _gguf
from .errors import RegolithError
from .models import DEFAULT_MODEL, KNOWN_MODELS, resolve_model

__all__ = ["main"]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def _human_count(n: int) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _scalar_str(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _inspect(args: argparse.Namespace, console: Console) -> int:
    path = str(resolve_model(args.model))
    with _gguf.open(path) as f:
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
        summary.add_row("file size", f"{f.file_size:,} bytes ({_human_bytes(f.file_size)})")
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
            types.add_row(name, str(count), f"{elems:,}", _human_bytes(nbytes), f"{share:.1f}%")
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


def _convert(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .convert import convert

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=args.quiet) as bar:
        task = bar.add_task(f"converting to {args.outtype}", total=None)

        def step(name: str, index: int, count: int) -> None:
            bar.update(task, completed=index + 1, total=count, description=escape(name))

        out = convert(args.hf_dir, args.out, args.outtype, tokenizer_pre=args.tokenizer_pre, progress=step)
    if not args.quiet:
        console.print(f"wrote {escape(str(out))} ({_human_bytes(os.path.getsize(out))}, {args.outtype})")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="regolith",
        description="Run huge sparse Mixture-of-Experts language models on machines far smaller than the model.",
        epilog="example: regolith inspect model.gguf --tensors",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"regolith {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "inspect",
        help="show a GGUF file's architecture, hyper-parameters and tensor types",
        description="Show a GGUF file's architecture, hyper-parameters, tensor-type histogram and size.",
    )
    known = ", ".join(f"{k} ({m.description})" for k, m in KNOWN_MODELS.items())
    p.add_argument(
        "model",
        nargs="?",
        help=f"a .gguf file or a known model name (default: {DEFAULT_MODEL}); known models: {known}",
    )
    p.add_argument("--tensors", action="store_true", help="also list every tensor (name, type, shape, bytes)")
    p.set_defaults(func=_inspect)

    from .convert.writer import OUTTYPES

    c = sub.add_parser(
        "convert",
        help="convert a Hugging Face qwen4_exp checkpoint to GGUF (llama.cpp's qwen4exp layout)",
        description="Convert a Hugging Face qwen4_exp checkpoint directory (config.json, *.safetensors, "
        "tokenizer.json) to one GGUF file in llama.cpp's qwen4exp layout. The output appears only when "
        "complete (written to a temporary file beside it, then renamed). MTP tensors are not converted.",
    )
    c.add_argument("hf_dir", help="the Hugging Face model directory")
    c.add_argument("out", help="the GGUF file to write (replaced if it exists)")
    c.add_argument(
        "--outtype",
        choices=list(OUTTYPES),
        default="f16",
        help="type of the weight matrices (norms, routers and conv kernels stay f32; default f16)",
    )
    c.add_argument("--tokenizer-pre", help="llama.cpp pre-tokenizer name, when the regex is not recognised")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    c.set_defaults(func=_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``regolith`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.func(args, Console())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RegolithError, OSError) as e:
        msg = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename else str(e)
        print(f"error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
