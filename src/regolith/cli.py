"""The ``regolith`` command line."""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .cli_options import (
    add_generation_arguments,
    add_memory_arguments,
    add_model_argument,
    add_ray_arguments,
    add_spec_arguments,
    add_template_argument,
    contexts,
    generation_options,
    memory_options,
    number,
    positive,
    speculative_option,
)
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
    from .server import ServerConfig

__all__ = ["main", "ray_app"]

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
            **memory_options(args),
        )
        model.tokenizer  # noqa: B018 - built here so its cost shows under the spinner, not in the first reply
    model.speculative = speculative_option(args)
    if model.speculative and not getattr(args, "no_spec_memory", True):
        model.remember_speculation()
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


def _run(args: argparse.Namespace, console: Console) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt:
        print("error: the prompt is empty: give it with -p TEXT or on stdin", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    model = _load(args, err)
    options = generation_options(args)
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


def _server(args: argparse.Namespace, err: Console) -> tuple[Model, ServerConfig]:
    """The model ``regolith serve`` loads and its server configuration (the prompt cache not attached)."""
    from .server import DEFAULT_MAX_TOKENS, ServerConfig

    try:  # the windows are planned before an arena sized to the budget takes the rest
        model = _load(args, err, windows=args.parallel or DEFAULT_PARALLEL)
    except MemoryPlanError:
        if args.parallel:
            raise
        model = _load(args, err)  # then as many as a plan for one leaves room for
    model.scr = args.scr
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
    return model, config


def _replica_server(args: argparse.Namespace) -> tuple[Model, ServerConfig]:
    return _server(args, Console(stderr=True))


def ray_app(args: dict[str, Any]) -> Any:
    """``regolith serve`` as a Ray Serve application (:func:`regolith.server.ray.application`), and a Serve
    config file's application builder (``import_path: regolith.cli:ray_app``): ``args["serve"]`` is the
    command line without ``serve`` (a string or a list), e.g. ``"regolith-demo --arena-gb 0.004 --replicas
    2"``; its Ray options shape the deployments, which the file's ``deployments:`` section may override as
    Serve allows. A bad command line raises SystemExit (argparse's usage error)."""
    argv = args.get("serve", "")
    return _ray_application(
        _parser().parse_args(["serve", *(shlex.split(argv) if isinstance(argv, str) else argv)])
    )


def _ray_application(args: argparse.Namespace) -> Any:
    from .server import ray as ray_server

    return ray_server.application(
        functools.partial(_replica_server, args),
        replicas=args.replicas,
        autoscale=args.autoscale,
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
        replica_memory_gb=args.memory_gb,
        affinity=not args.no_affinity,
        cache_dir=args.cache_dir,
        cache_gb=args.cache_size_gb,
        max_body=args.max_body,
        # what a replica's own queue and batch take: past them it answers 503 itself, as one server does
        max_ongoing=args.max_queue + (args.parallel or DEFAULT_PARALLEL),
    )


def _warn_open(args: argparse.Namespace, err: Console) -> None:
    if not (args.api_key or os.environ.get("REGOLITH_API_KEY")) and args.host not in (
        "127.0.0.1",
        "localhost",
        "::1",
    ):
        err.print(f"[yellow]warning: serving on {escape(args.host)} without an API key (--api-key)[/yellow]")


def _serve(args: argparse.Namespace, console: Console) -> int:
    err = Console(stderr=True)
    _warn_open(args, err)
    if args.ray is not None:
        try:
            from .server import ray as ray_server
        except ImportError as e:
            err.print(
                escape(f"error: --ray needs Ray Serve ({e}): pip install 'regolith[ray]'"),
                highlight=False,
                soft_wrap=True,
            )
            return 2

        address = None if args.ray == "local" else args.ray
        where = (
            "a Ray cluster on this machine" if address is None else f"the Ray cluster at {escape(address)}"
        )
        err.print(f"[dim]serving on {where}: http://{escape(args.host)}:{args.port}[/dim]", highlight=False)
        if args.memory_gb is None and (args.replicas > 1 or args.autoscale):
            err.print(
                "[yellow]warning: each replica plans for 3/4 of its machine's RAM; give each its share with "
                "--memory-gb (Ray then places no more replicas on a machine than fit)[/yellow]"
            )
        ray_server.run(_ray_application(args), address=address, host=args.host, port=args.port)
        return 0
    from .server import serve

    model, config = _server(args, err)
    if args.cache_dir:
        from .prompt_cache import PromptCache

        model.prompt_cache = PromptCache(args.cache_dir, int(args.cache_size_gb * 2**30))
    err.print(
        f"[dim]serving {escape(config.model_name)} (context {model.n_ctx}, {config.parallel} at once) on "
        f"http://{escape(args.host)}:{args.port}[/dim]",
        highlight=False,
    )
    serve(model, config, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _chat(args: argparse.Namespace, console: Console) -> int:
    from .session import Session

    model = _load(args, console)
    session = Session(model, system=args.system, **generation_options(args))
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
    add_model_argument(p)
    p.add_argument("--tensors", action="store_true", help="also list every tensor (name, type, shape, bytes)")
    p.add_argument(
        "--plan", action="store_true", help="print the memory plan a load would make (with --memory-gb, ...)"
    )
    p.add_argument(
        "--ctx",
        type=contexts,
        help="context size in tokens for --plan, or several side by side: 32768,131072 or 32k,128k (k = 1024; "
        "default: the model's, at most 8192)",
    )
    add_memory_arguments(p)
    p.set_defaults(func=inspect_command)

    k = sub.add_parser(
        "pack",
        help="lay out a GGUF with routed experts (qwen4exp, qwen3moe) for streaming them from disk",
        description="Write a packed model directory: dense.gguf (resident weights, 16 KiB-aligned), "
        "experts.bin (one aligned, checksummed record per expert: one direct read each), ple.bin (qwen4exp's "
        "n-gram table in checksummed 4 KiB blocks) and manifest.json. The directory appears only when "
        "complete. Load it like a GGUF: regolith run DIR. See docs/formats.md.",
    )
    add_model_argument(k)
    k.add_argument("out", help="the directory to write")
    k.add_argument("-f", "--force", action="store_true", help="replace an existing directory")
    k.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    k.set_defaults(func=_pack)

    from .convert.writer import OUTTYPES

    c = sub.add_parser(
        "convert",
        help="convert a Hugging Face qwen4_exp, qwen3, qwen3_moe, qwen3_5_moe, qwen3_next or gpt_oss checkpoint "
        "to GGUF (llama.cpp's layout)",
        description="Convert a Hugging Face qwen4_exp, qwen3, qwen3_moe, qwen3_5_moe (Qwen3.5 MoE), qwen3_next "
        "(Qwen3-Next) or gpt_oss (gpt-oss) checkpoint directory (config.json, *.safetensors, tokenizer.json) to "
        "one GGUF file in llama.cpp's layout for it (qwen4exp, qwen3, qwen3moe, qwen35moe, qwen3next, gpt-oss). "
        "The output appears only when complete (written to a temporary file beside it, then renamed). "
        "qwen4_exp's MTP tensors are converted when config.json sets mtp_num_hidden_layers, qwen3_5_moe's and "
        "qwen3_next's when the checkpoint holds them. gpt-oss' MXFP4 experts are repacked as GGUF MXFP4 "
        "whatever the outtype.",
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
        "--split-max-tensors", type=positive(int), metavar="N", help="write shards of at most N tensors"
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
    add_generation_arguments(r, antislop_default=False)
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
    add_generation_arguments(ch, antislop_default=True)
    ch.add_argument("--system", help="a system prompt")
    ch.set_defaults(func=_chat)

    b = sub.add_parser(
        "bench",
        help="measure prefill and decode speed, the arena's hit rate, disk reads and memory",
        description="llama-bench's measurement: a prompt of random tokens prefilled, then greedy decode steps "
        "(no speculation), repeated; one table with tok/s (mean ± spread), the arena's hit rate and disk "
        "reads (streaming models), peak memory and the memory plan.",
    )
    add_model_argument(b)
    b.add_argument("-p", "--prompt", type=positive(int), default=512, help="prompt tokens (default 512)")
    b.add_argument("-n", "--gen", type=number(int, 0), default=128, help="decode steps (default 128)")
    b.add_argument("-r", "--repetitions", type=positive(int), default=3, help="repetitions (default 3)")
    add_memory_arguments(b)
    b.set_defaults(func=_bench, chat_template_file=None, quiet=False, spec="off")

    sv = sub.add_parser(
        "serve",
        help="serve a model over OpenAI- and Anthropic-compatible HTTP APIs",
        description="Serve one model over HTTP: POST /v1/chat/completions, /v1/completions, /v1/messages, "
        "/v1/messages/count_tokens; GET /v1/models, /health, /metrics. Requests are queued and run one at a "
        "time. See docs/server.md.",
    )
    add_model_argument(sv)
    sv.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    sv.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    sv.add_argument(
        "--api-key",
        help="require this key (Authorization: Bearer KEY or x-api-key: KEY); default: $REGOLITH_API_KEY, else none",
    )
    sv.add_argument(
        "--ctx", type=positive(int), help="context size in tokens (default: the model's, at most 8192)"
    )
    add_template_argument(sv)
    add_memory_arguments(sv)
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
        type=positive(int),
        help="reply length for requests that do not set one (default 4096: the server's DEFAULT_MAX_TOKENS)",
    )
    sv.add_argument(
        "--parallel",
        "-np",
        type=positive(int),
        help=f"requests generated at once, batched (default: as many as fit, at most {DEFAULT_PARALLEL}); "
        "above 1, speculative decoding drafts by the suffix drafter alone",
    )
    sv.add_argument(
        "--max-queue",
        type=positive(int),
        default=64,
        help="requests that may wait (default 64); more get 503",
    )
    sv.add_argument(
        "--timeout",
        type=positive(float),
        default=600.0,
        help="seconds a request may take, queued or running (default 600)",
    )
    sv.add_argument(
        "--max-body",
        type=positive(int),
        default=16 * 1024 * 1024,
        help="largest request body in bytes (default 16 MiB)",
    )
    sv.add_argument("--antislop", action="store_true", help="ban overused phrases in prose (default off)")
    add_spec_arguments(sv)
    sv.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="keep a prompt cache here: prompts that start like an earlier one (even before a restart) "
        "evaluate only the rest",
    )
    sv.add_argument(
        "--scr",
        action="store_true",
        help="suffix cache reuse: after an edit in the middle of a conversation, move the tokens a window "
        "holds past it instead of evaluating them again (attention-only models; changes the output; default "
        "off)",
    )
    sv.add_argument(
        "--cache-size-gb",
        type=positive(float),
        default=4.0,
        help="the prompt cache's size cap in GiB; least recently used states go first (default 4)",
    )
    sv.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default info)",
    )
    add_ray_arguments(sv)
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
