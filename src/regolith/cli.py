"""The ``regolith`` command line."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .errors import MemoryPlanError, RegolithError
from .inspection import inspect_command
from .models import DEFAULT_MODEL, KNOWN_MODELS, resolve_files
from .terminal import (
    CHAT_HELP,
    PrefillBar,
    human_bytes,
    read_message,
    report,
    report_arena,
    stream,
)

if TYPE_CHECKING:
    from .model import Model

__all__ = ["main"]

DEFAULT_PARALLEL = 4  # `regolith serve`'s --parallel where the memory plan fits that many windows


def _pull(args: argparse.Namespace, console: Console) -> int:
    from . import hub

    spec = hub.parse_repo(args.repo)
    if spec is None:
        raise RegolithError(f"{args.repo}: expected ORG/REPO or ORG/REPO:QUANT")
    files = hub.pull(*spec, revision=args.revision)
    for line in hub.describe(files):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(escape(str(files["model"][0])), highlight=False, soft_wrap=True)
    return 0


def _convert(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .convert import convert
    from .gguf_split import parse_size

    try:
        max_size = parse_size(args.split_max_size) if args.split_max_size else None
    except ValueError as e:
        raise RegolithError(f"--split-max-size {e}") from None

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=args.quiet) as bar:
        task = bar.add_task(f"converting to {args.outtype}", total=None)

        def step(name: str, index: int, count: int) -> None:
            bar.update(task, completed=index + 1, total=count, description=escape(name))

        written = convert(
            args.source,
            args.out,
            args.outtype,
            tokenizer_pre=args.tokenizer_pre,
            progress=step,
            mmproj=args.mmproj,
            split_max_size=max_size,
            split_max_tensors=args.split_max_tensors,
        )
    if not args.quiet:
        from .gguf import split_paths

        shards = split_paths(written)
        for path in (*shards, args.mmproj) if args.mmproj else shards:
            console.print(f"wrote {escape(str(path))} ({human_bytes(os.path.getsize(path))})", soft_wrap=True)
    return 0


def _pack(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .pack import pack

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    files = resolve_files(args.model, ple=args.ple, mtp=args.mtp)
    with Progress(*columns, console=console, transient=True, disable=args.quiet) as bar:
        tasks: dict[str, Any] = {}

        def step(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"writing {name}", total=total)
            bar.update(tasks[name], completed=done, total=total)

        out = pack(files.model, args.out, side_files=files.side_files, overwrite=args.force, progress=step)
    if not args.quiet:
        size = sum(f.stat().st_size for f in out.iterdir())
        console.print(f"wrote {escape(str(out))} ({human_bytes(size)})", soft_wrap=True)
    return 0


def _load(args: argparse.Namespace, console: Console, windows: int = 1) -> Model:
    from .model import Model

    template = None
    if args.chat_template_file:
        with open(args.chat_template_file, encoding="utf-8") as f:
            template = f.read()
    with console.status("loading the model", spinner="dots"):
        model = Model.load(
            args.model,
            n_ctx=args.ctx,
            chat_template=template,
            ple=args.ple,
            mtp=args.mtp,
            mmproj=getattr(args, "mmproj", None),
            windows=windows,
            **_memory_options(args),
        )
        model.tokenizer  # noqa: B018 - built here so its cost shows under the spinner, not in the first reply
    model.speculative = _speculative_option(args)
    trained = model.config.get("context_length")
    if args.ctx and trained and args.ctx > int(trained):
        print(
            f"warning: --ctx {args.ctx} is more than the {int(trained)} tokens the model was trained on; "
            "past them its output degrades",
            file=sys.stderr,
        )
    if model.plan is not None and model.plan.streaming and not getattr(args, "quiet", False):
        console.print(
            f"[dim]{escape(model.plan.render(width=console.width))}[/dim]", highlight=False, soft_wrap=True
        )
    return model


def _speculative_option(args: argparse.Namespace) -> Any:
    from .speculative import Speculation

    spec, draft_max = getattr(args, "spec", "auto"), getattr(args, "draft_max", 7)
    if spec == "off" or draft_max == 0:
        return False
    drafters = ("suffix", "mtp") if spec == "auto" else (spec,)
    return Speculation(draft_max=draft_max, drafters=drafters)


def _memory_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "memory_gb": args.memory_gb,
        "arena_gb": args.arena_gb,
        "ple_cache_gb": args.ple_cache_gb,
        "host_cache_gb": args.host_cache_gb,
        "moce": args.moce,
        "backend": args.backend,
        "kv_type": args.kv_type,
    }


def _generation_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temp,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repeat_penalty": args.repeat_penalty,
        "seed": args.seed,
        "stop": args.stop or None,
        "antislop": _antislop_option(args),
    }
    return options


def _antislop_option(args: argparse.Namespace) -> bool | Any:
    if args.slop_list:
        from .antislop import SlopList

        return SlopList.load(args.slop_list)
    return args.antislop


def _run(args: argparse.Namespace, console: Console) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt:
        print("error: the prompt is empty: give it with -p TEXT or on stdin", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    model = _load(args, err)
    options = _generation_options(args)
    bar = PrefillBar(err)
    if not args.quiet:
        options["on_prefill"] = bar
    if args.chat:
        gen = model.chat([{"role": "user", "content": prompt}], stream=True, **options)
    else:
        gen = model.generate(prompt, stream=True, **options)
    try:
        stream(gen, sys.stdout)
    finally:
        bar.close()
        gen.close()
    sys.stdout.write("\n")
    if not args.quiet:
        report(gen, err)
        report_arena(model, err)
    return 0


def _number(
    kind: type,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Any:
    """An argparse type: a finite `kind` in the range [lo, hi] (ends open where asked, absent where None);
    a value outside it is the one-line usage error argparse exits 2 with."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        below = lo is not None and (value <= lo if lo_open else value < lo)
        above = hi is not None and (value >= hi if hi_open else value > hi)
        if below or above:
            if hi is None:
                want = f"{'>' if lo_open else '>='} {lo}"
            elif lo is None:
                want = f"{'<' if hi_open else '<='} {hi}"
            else:
                want = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def _positive(kind: type) -> Any:
    return _number(kind, 0, lo_open=True)


def _contexts(text: str) -> list[int]:
    """Context sizes: comma-separated positive integers, each optionally with k (x1024)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = 1024 if part.endswith("k") else 1
        digits = part.removesuffix("k")
        if not digits.isdigit() or int(digits) == 0:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected positive token counts such as 32768 or 32k,128k"
            )
        out.append(int(digits) * scale)
    return out


def _bench(args: argparse.Namespace, console: Console) -> int:
    """llama-bench's measurement on one model: prefill of --prompt random tokens, then --gen greedy decode
    steps, --repetitions times; the arena's hit rate and disk reads over the runs; peak memory."""
    import resource
    import statistics
    import time

    import numpy as np

    from .generation import prefill

    err = Console(stderr=True)
    args.ctx = args.prompt + args.gen + 1
    model = _load(args, err)
    rng = np.random.default_rng(0)
    window = model.window(args.ctx)
    before = model.stats()
    pp, tg = [], []
    t_all = time.perf_counter()
    for _ in range(args.repetitions):
        window.reset()
        ids = rng.integers(0, model.config["vocab_size"], args.prompt).tolist()
        t = time.perf_counter()
        last, _ = prefill(window, ids)
        pp.append(args.prompt / (time.perf_counter() - t))
        t = time.perf_counter()
        for _ in range(args.gen):
            last = window.eval([int(np.argmax(last))], all_logits=False)[0]
        if args.gen:
            tg.append(args.gen / (time.perf_counter() - t))
    seconds = time.perf_counter() - t_all
    after = model.stats()

    def rate(values: list[float]) -> str:
        if not values:
            return "-"
        spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
        return f"{statistics.mean(values):.1f}{spread} tok/s"

    from . import backends

    title = f"{os.path.basename(model.path)} on {backends.resolve(args.backend)}"
    table = Table(title=title, title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    device = backends.device_name(backends.resolve(args.backend))
    if device:
        table.add_row("device", device)
    table.add_row(f"prefill (pp{args.prompt})", rate(pp))
    table.add_row(f"decode (tg{args.gen})", rate(tg))
    if "hits" in after:
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        read = after["bytes_read"] - before["bytes_read"]
        table.add_row("arena hit rate", f"{hits / (hits + misses):.1%}" if hits + misses else "-")
        table.add_row("disk reads", f"{human_bytes(read)}, {read / seconds / 1e6:.1f} MB/s")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    table.add_row("peak memory (RSS)", human_bytes(peak))
    if model.plan is not None:
        table.add_row("memory plan", human_bytes(model.plan.total_bytes))
    table.add_row("repetitions", str(args.repetitions))
    console.print(table)
    return 0


def _serve(args: argparse.Namespace, console: Console) -> int:
    from .server import DEFAULT_MAX_TOKENS, ServerConfig, serve

    err = Console(stderr=True)
    try:  # the windows are planned before an arena sized to the budget takes the rest
        model = _load(args, err, windows=args.parallel or DEFAULT_PARALLEL)
    except MemoryPlanError:
        if args.parallel:
            raise
        model = _load(args, err)  # then as many as a plan for one leaves room for
    parallel = args.parallel or DEFAULT_PARALLEL
    if model.plan is not None and not args.parallel:
        parallel = model.plan.windows_that_fit(DEFAULT_PARALLEL)
        model.plan = model.plan.with_windows(parallel)
    if args.model_name:
        name = args.model_name
    elif args.model is None or args.model in KNOWN_MODELS:
        name = args.model or DEFAULT_MODEL
    else:
        name = os.path.basename(model.path).removesuffix(".gguf")
    if args.cache_dir:
        from .prompt_cache import PromptCache

        model.prompt_cache = PromptCache(args.cache_dir, int(args.cache_size_gb * 2**30))
    config = ServerConfig(
        model_name=name,
        aliases=tuple(args.alias),
        api_key=args.api_key or os.environ.get("REGOLITH_API_KEY") or None,
        max_queue=args.max_queue,
        timeout=args.timeout,
        max_body=args.max_body,
        default_max_tokens=args.max_tokens or DEFAULT_MAX_TOKENS,
        antislop=args.antislop,
        parallel=parallel,
    )
    if config.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"[yellow]warning: serving on {escape(args.host)} without an API key (--api-key)[/yellow]")
    err.print(
        f"[dim]serving {escape(name)} (context {model.n_ctx}, {parallel} at once) on "
        f"http://{escape(args.host)}:{args.port}[/dim]",
        highlight=False,
    )
    serve(model, config, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _chat(args: argparse.Namespace, console: Console) -> int:
    from .session import Session

    model = _load(args, console)
    session = Session(model, system=args.system, **_generation_options(args))
    if not args.quiet:
        console.print(
            f"[dim]{escape(os.path.basename(model.path))} - {escape(CHAT_HELP)}[/dim]", highlight=False
        )
    while True:
        text = read_message(console)
        if text is None:
            break
        command = text.strip()
        if not command:
            continue
        # a first word like /name is a command (a message may still start with a path such as /usr/bin)
        word, _, rest = command.partition(" ")
        if re.fullmatch(r"/[A-Za-z?]+", word):
            if word in ("/exit", "/quit"):
                break
            if word == "/reset":
                session.reset()
                console.print("[dim]conversation cleared[/dim]")
            elif word == "/save":
                path = rest.strip()
                if not path:
                    console.print("[red]usage: /save PATH[/red]")
                    continue
                try:
                    session.save_transcript(path)
                except OSError as e:
                    where = os.fsdecode(e.filename) if e.filename else path
                    console.print(
                        f"[red]error: {escape(e.strerror or str(e))}: {escape(where)}[/red]", soft_wrap=True
                    )
                    continue
                console.print(
                    f"[dim]saved {len(session.messages)} messages to {escape(path)}[/dim]", soft_wrap=True
                )
            elif word in ("/help", "/?"):
                console.print(escape(CHAT_HELP), highlight=False)
            else:
                console.print(
                    f"[red]unknown command {escape(word)}[/red]\n{escape(CHAT_HELP)}", highlight=False
                )
            continue
        bar = PrefillBar(Console(stderr=True))
        gen = session.send(text, stream=True, on_prefill=None if args.quiet else bar)
        try:
            stream(gen, sys.stdout)
        except KeyboardInterrupt:
            console.print("\n[dim]stopped[/dim]")
        finally:
            bar.close()
            gen.close()
        sys.stdout.write("\n")
        if not args.quiet:
            report(gen, console)
    return 0


def _add_model_argument(p: argparse.ArgumentParser) -> None:
    known = ", ".join(f"{k} ({m.description})" for k, m in KNOWN_MODELS.items())
    p.add_argument(
        "model",
        nargs="?",
        help="a .gguf file (any shard of a split model), a model directory, hf://ORG/REPO[:QUANT] (downloaded "
        f"from the Hugging Face Hub) or a known model name (default: {DEFAULT_MODEL}); known models: {known}",
    )
    p.add_argument("--ple", metavar="PLE.gguf", help="the PLE n-gram table kept in its own GGUF")
    p.add_argument("--mtp", metavar="MTP.gguf", help="the MTP head kept in its own GGUF")


def _add_generation_arguments(p: argparse.ArgumentParser, *, antislop_default: bool) -> None:
    _add_model_argument(p)
    p.add_argument(
        "-n", "--max-tokens", type=_number(int, 0), default=256, help="most tokens to generate (default 256)"
    )
    p.add_argument(
        "--temp", type=_number(float, 0), default=0.8, help="temperature; 0 is greedy (default 0.8)"
    )
    p.add_argument(
        "--top-p",
        type=_number(float, 0, 1, lo_open=True),
        default=0.95,
        help="nucleus sampling mass (default 0.95; 1 = off)",
    )
    p.add_argument(
        "--top-k",
        type=_number(int, 0),
        default=40,
        help="keep the k most likely tokens (default 40; 0 = off)",
    )
    p.add_argument(
        "--min-p",
        type=_number(float, 0, 1),
        default=0.05,
        help="drop tokens below min-p x the best (default 0.05)",
    )
    p.add_argument(
        "--repeat-penalty", type=_positive(float), default=1.0, help="repetition penalty (default 1 = off)"
    )
    p.add_argument(
        "--seed",
        type=_number(int, 0, 2**64, hi_open=True),
        help="random seed (default: a fresh one each run)",
    )
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop before this text (repeatable)")
    p.add_argument(
        "--ctx", type=_positive(int), help="context size in tokens (default: the model's, at most 8192)"
    )
    _add_template_argument(p)
    _add_memory_arguments(p)
    p.add_argument(
        "--antislop",
        action=argparse.BooleanOptionalAction,
        default=antislop_default,
        help=f"ban overused phrases in prose (default {'on' if antislop_default else 'off'})",
    )
    p.add_argument("--slop-list", metavar="FILE", help="phrases to ban, one per line (implies --antislop)")
    _add_spec_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no speed report")


def _add_spec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spec",
        choices=["auto", "off", "suffix", "mtp"],
        default="auto",
        help="speculative decoding: auto (drafts from repeated text and the model's MTP head, only when a cost "
        "model measures a gain), off, or one drafter (default auto; output is the same either way)",
    )
    p.add_argument(
        "--draft-max",
        type=int,
        choices=range(8),
        default=7,
        metavar="N",
        help="most draft tokens per verification, 0-7 (default 7; 0 = off)",
    )


def _backend_name(text: str) -> str:
    from . import backends

    try:
        return backends.resolve(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_memory_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        type=_backend_name,
        help="compute engine: cpu, cuda, metal, metal-emu (Metal's kernels on the CPU: a test mode), or auto "
        "(cuda or metal where this build and machine have it, else cpu); default $REGOLITH_BACKEND or cpu",
    )
    p.add_argument(
        "--kv-type",
        choices=["f32", "f16", "q8_0", "i8"],
        help="attention cache type (llama.cpp's -ctk/-ctv names; i8: int8 rows with one f32 scale each); "
        "default i8 for qwen4exp, f16 for gemma3 / qwen2",
    )
    p.add_argument(
        "--memory-gb",
        type=_positive(float),
        help="memory budget in GiB (default: 3/4 of RAM); a model over it streams its experts",
    )
    p.add_argument(
        "--arena-gb", type=_positive(float), help="stream the experts through an arena of this size"
    )
    p.add_argument(
        "--ple-cache-gb", type=_positive(float), help="PLE row cache size in GiB (default 256 MiB)"
    )
    p.add_argument(
        "--host-cache-gb",
        type=_positive(float),
        help="with --arena-gb on a GPU backend: keep this many GiB of experts in RAM behind the device arena",
    )
    p.add_argument(
        "--moce",
        action="store_true",
        help="cache-aware routing: prefer experts already in the arena (changes the output; default off)",
    )


def _add_template_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chat-template-file",
        metavar="FILE",
        help="a jinja2 chat template to use instead of the model's own",
    )


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
    _add_model_argument(p)
    p.add_argument("--tensors", action="store_true", help="also list every tensor (name, type, shape, bytes)")
    p.add_argument(
        "--plan", action="store_true", help="print the memory plan a load would make (with --memory-gb, ...)"
    )
    p.add_argument(
        "--ctx",
        type=_contexts,
        help="context size in tokens for --plan, or several side by side: 32768,131072 or 32k,128k (k = 1024; "
        "default: the model's, at most 8192)",
    )
    _add_memory_arguments(p)
    p.set_defaults(func=inspect_command)

    k = sub.add_parser(
        "pack",
        help="lay out a qwen4exp GGUF for streaming its experts from disk",
        description="Write a packed model directory: dense.gguf (resident weights, 16 KiB-aligned), "
        "experts.bin (one aligned, checksummed record per expert: one direct read each), ple.bin (the "
        "n-gram table in checksummed 4 KiB blocks) and manifest.json. The directory appears only when "
        "complete. Load it like a GGUF: regolith run DIR. See docs/formats.md.",
    )
    _add_model_argument(k)
    k.add_argument("out", help="the directory to write")
    k.add_argument("-f", "--force", action="store_true", help="replace an existing directory")
    k.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    k.set_defaults(func=_pack)

    from .convert.writer import OUTTYPES

    c = sub.add_parser(
        "convert",
        help="convert a Hugging Face qwen4_exp checkpoint to GGUF (llama.cpp's qwen4exp layout)",
        description="Convert a Hugging Face qwen4_exp checkpoint directory (config.json, *.safetensors, "
        "tokenizer.json) to one GGUF file in llama.cpp's qwen4exp layout. The output appears only when "
        "complete (written to a temporary file beside it, then renamed). MTP tensors are not converted.",
    )
    c.add_argument(
        "source", help="the Hugging Face model directory, or a GGUF (any shard of a split one) to re-split"
    )
    c.add_argument("out", help="the GGUF file to write (replaced if it exists)")
    c.add_argument(
        "--outtype",
        choices=list(OUTTYPES),
        help="type of the weight matrices of a Hugging Face checkpoint (norms, routers and conv kernels stay "
        "f32; default f16); a GGUF source keeps its types",
    )
    split = c.add_mutually_exclusive_group()
    split.add_argument(
        "--split-max-size",
        metavar="N(M|G)",
        help="write shards of at most this much tensor data (M = 10^6, G = 10^9 bytes) in llama.cpp's gguf-split "
        "layout: OUT-00001-of-0000N.gguf, ...",
    )
    split.add_argument(
        "--split-max-tensors", type=_positive(int), metavar="N", help="write shards of at most N tensors"
    )
    c.add_argument("--tokenizer-pre", help="llama.cpp pre-tokenizer name, when the regex is not recognised")
    c.add_argument(
        "--mmproj",
        metavar="MMPROJ.gguf",
        help="also write the vision tower as a projector GGUF (llama.cpp's mmproj layout; f16, or f32 with "
        "--outtype f32)",
    )
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    c.set_defaults(func=_convert)

    pl = sub.add_parser(
        "pull",
        help="download a model from the Hugging Face Hub",
        description="Download a GGUF model of a Hugging Face Hub repository (the quantization named by QUANT, "
        "e.g. Q4_K_M: only its shards) and its side files (ple-*, mtp-*, mmproj-*) into the Hub's cache, "
        "resuming interrupted downloads and checking each file's sha256 against the Hub's; prints the path "
        "to load. HF_ENDPOINT, HF_HUB_CACHE and HF_TOKEN apply. Then: regolith run hf://ORG/REPO:QUANT.",
    )
    pl.add_argument("repo", metavar="ORG/REPO[:QUANT]", help="the repository, and the quantization to fetch")
    pl.add_argument("--revision", help="a branch, tag or commit (default: main)")
    pl.set_defaults(func=_pull)

    r = sub.add_parser(
        "run",
        help="generate text from a prompt",
        description="Continue a prompt (or, with --chat, answer it as a chat message) and stream the text; "
        "the speed is reported on stderr.",
    )
    _add_generation_arguments(r, antislop_default=False)
    r.add_argument("-p", "--prompt", help="the prompt (default: read standard input)")
    r.add_argument(
        "--chat", action="store_true", help="send the prompt as a user message through the chat template"
    )
    r.set_defaults(func=_run)

    ch = sub.add_parser(
        "chat",
        help="chat with a model in the terminal",
        description="An interactive conversation, streamed; only each turn's new tokens are evaluated. "
        + CHAT_HELP,
    )
    _add_generation_arguments(ch, antislop_default=True)
    ch.add_argument("--system", help="a system prompt")
    ch.set_defaults(func=_chat)

    b = sub.add_parser(
        "bench",
        help="measure prefill and decode speed, the arena's hit rate, disk reads and memory",
        description="llama-bench's measurement: a prompt of random tokens prefilled, then greedy decode steps "
        "(no speculation), repeated; one table with tok/s (mean ± spread), the arena's hit rate and disk "
        "reads (streaming models), peak memory and the memory plan.",
    )
    _add_model_argument(b)
    b.add_argument("-p", "--prompt", type=_positive(int), default=512, help="prompt tokens (default 512)")
    b.add_argument("-n", "--gen", type=_number(int, 0), default=128, help="decode steps (default 128)")
    b.add_argument("-r", "--repetitions", type=_positive(int), default=3, help="repetitions (default 3)")
    _add_memory_arguments(b)
    b.set_defaults(func=_bench, chat_template_file=None, quiet=False, spec="off")

    sv = sub.add_parser(
        "serve",
        help="serve a model over OpenAI- and Anthropic-compatible HTTP APIs",
        description="Serve one model over HTTP: POST /v1/chat/completions, /v1/completions, /v1/messages, "
        "/v1/messages/count_tokens; GET /v1/models, /health, /metrics. Requests are queued and run one at a "
        "time. See docs/server.md.",
    )
    _add_model_argument(sv)
    sv.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    sv.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    sv.add_argument(
        "--api-key",
        help="require this key (Authorization: Bearer KEY or x-api-key: KEY); default: $REGOLITH_API_KEY, else none",
    )
    sv.add_argument(
        "--ctx", type=_positive(int), help="context size in tokens (default: the model's, at most 8192)"
    )
    _add_template_argument(sv)
    _add_memory_arguments(sv)
    sv.add_argument(
        "--mmproj",
        metavar="MMPROJ.gguf",
        help="the model's projector GGUF: requests may then carry images (loaded on the first one)",
    )
    sv.add_argument("--model-name", help="the model id clients use (default: the file name without .gguf)")
    sv.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another model id to accept (repeatable), e.g. the name a client insists on",
    )
    sv.add_argument(
        "-n",
        "--max-tokens",
        type=_positive(int),
        help="reply length for requests that do not set one (default 4096: the server's DEFAULT_MAX_TOKENS)",
    )
    sv.add_argument(
        "--parallel",
        "-np",
        type=_positive(int),
        help=f"requests generated at once, batched (default: as many as fit, at most {DEFAULT_PARALLEL}); "
        "speculative decoding runs only at 1",
    )
    sv.add_argument(
        "--max-queue",
        type=_positive(int),
        default=64,
        help="requests that may wait (default 64); more get 503",
    )
    sv.add_argument(
        "--timeout",
        type=_positive(float),
        default=600.0,
        help="seconds a request may take, queued or running (default 600)",
    )
    sv.add_argument(
        "--max-body",
        type=_positive(int),
        default=16 * 1024 * 1024,
        help="largest request body in bytes (default 16 MiB)",
    )
    sv.add_argument("--antislop", action="store_true", help="ban overused phrases in prose (default off)")
    _add_spec_arguments(sv)
    sv.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="keep a prompt cache here: prompts that start like an earlier one (even before a restart) "
        "evaluate only the rest",
    )
    sv.add_argument(
        "--cache-size-gb",
        type=_positive(float),
        default=4.0,
        help="the prompt cache's size cap in GiB; least recently used states go first (default 4)",
    )
    sv.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default info)",
    )
    sv.set_defaults(func=_serve)
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
