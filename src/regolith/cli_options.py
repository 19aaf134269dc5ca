"""The ``regolith`` command line's shared options: argument types, the argument groups several commands take,
and what those arguments become as ``Model.load`` and generation keywords."""

from __future__ import annotations

import argparse
import math
from typing import Any

from .models import DEFAULT_MODEL, KNOWN_MODELS

__all__ = [
    "add_generation_arguments",
    "add_memory_arguments",
    "add_model_argument",
    "add_ray_arguments",
    "add_spec_arguments",
    "add_template_argument",
    "contexts",
    "generation_options",
    "memory_options",
    "number",
    "positive",
    "speculative_option",
]


def speculative_option(args: argparse.Namespace) -> Any:
    from .speculative import Speculation

    spec, draft_max = getattr(args, "spec", "auto"), getattr(args, "draft_max", 7)
    if spec == "off" or draft_max == 0:
        return False
    drafters = ("suffix", "mtp") if spec == "auto" else (spec,)
    return Speculation(draft_max=draft_max, drafters=drafters)


def memory_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "memory_gb": args.memory_gb,
        "arena_gb": args.arena_gb,
        "ple_cache_gb": args.ple_cache_gb,
        "host_cache_gb": args.host_cache_gb,
        "device_routing": args.device_routing,
        "moce": args.moce,
        "backend": args.backend,
        "kv_type": args.kv_type,
    }


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
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


def number(
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


def positive(kind: type) -> Any:
    return number(kind, 0, lo_open=True)


def contexts(text: str) -> list[int]:
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


def add_model_argument(p: argparse.ArgumentParser) -> None:
    known = ", ".join(f"{k} ({m.description})" for k, m in KNOWN_MODELS.items())
    p.add_argument(
        "model",
        nargs="?",
        help="a .gguf file (any shard of a split model), a model directory, hf://ORG/REPO[:QUANT] (downloaded "
        f"from the Hugging Face Hub) or a known model name (default: {DEFAULT_MODEL}); known models: {known}",
    )
    p.add_argument("--ple", metavar="PLE.gguf", help="the PLE n-gram table kept in its own GGUF")
    p.add_argument("--mtp", metavar="MTP.gguf", help="the MTP head kept in its own GGUF")


def add_generation_arguments(p: argparse.ArgumentParser, *, antislop_default: bool) -> None:
    add_model_argument(p)
    p.add_argument(
        "-n", "--max-tokens", type=number(int, 0), default=256, help="most tokens to generate (default 256)"
    )
    p.add_argument(
        "--temp", type=number(float, 0), default=0.8, help="temperature; 0 is greedy (default 0.8)"
    )
    p.add_argument(
        "--top-p",
        type=number(float, 0, 1, lo_open=True),
        default=0.95,
        help="nucleus sampling mass (default 0.95; 1 = off)",
    )
    p.add_argument(
        "--top-k",
        type=number(int, 0),
        default=40,
        help="keep the k most likely tokens (default 40; 0 = off)",
    )
    p.add_argument(
        "--min-p",
        type=number(float, 0, 1),
        default=0.05,
        help="drop tokens below min-p x the best (default 0.05)",
    )
    p.add_argument(
        "--repeat-penalty", type=positive(float), default=1.0, help="repetition penalty (default 1 = off)"
    )
    p.add_argument(
        "--seed",
        type=number(int, 0, 2**64, hi_open=True),
        help="random seed (default: a fresh one each run)",
    )
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop before this text (repeatable)")
    p.add_argument(
        "--ctx", type=positive(int), help="context size in tokens (default: the model's, at most 8192)"
    )
    add_template_argument(p)
    add_memory_arguments(p)
    p.add_argument(
        "--antislop",
        action=argparse.BooleanOptionalAction,
        default=antislop_default,
        help=f"ban overused phrases in prose (default {'on' if antislop_default else 'off'})",
    )
    p.add_argument("--slop-list", metavar="FILE", help="phrases to ban, one per line (implies --antislop)")
    add_spec_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no speed report")


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--no-spec-memory",
        action="store_true",
        help="start speculation's cost model afresh and do not save it (default: kept per model and machine "
        "under ~/.cache/regolith/speculation, so a new process drafts as well as the last one ended)",
    )


def _backend_name(text: str) -> str:
    from . import backends

    try:
        return backends.resolve(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_memory_arguments(p: argparse.ArgumentParser) -> None:
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
        "default i8 for qwen4exp, f16 for the others",
    )
    p.add_argument(
        "--memory-gb",
        type=positive(float),
        help="memory budget in GiB (default: 3/4 of RAM); a model over it streams its experts",
    )
    p.add_argument(
        "--arena-gb", type=positive(float), help="stream the experts through an arena of this size"
    )
    p.add_argument("--ple-cache-gb", type=positive(float), help="PLE row cache size in GiB (default 256 MiB)")
    p.add_argument(
        "--host-cache-gb",
        type=positive(float),
        help="with --arena-gb on a GPU backend: keep this many GiB of experts in RAM behind the device arena",
    )
    p.add_argument(
        "--device-routing",
        action="store_true",
        help="with a --host-cache-gb of every expert: the GPU reads the experts it lacks in place, no layer "
        "waits on the host",
    )
    p.add_argument(
        "--moce",
        action="store_true",
        help="cache-aware routing: prefer experts already in the arena (changes the output; default off)",
    )


def add_template_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chat-template-file",
        metavar="FILE",
        help="a jinja2 chat template to use instead of the model's own",
    )


def _bounds(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        pair = (int(low), int(high)) if sep else None
    except ValueError:
        pair = None
    if pair is None or not 0 <= pair[0] <= pair[1] or pair[1] < 1:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX with 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return pair


def add_ray_arguments(p: argparse.ArgumentParser) -> None:
    """``regolith serve``'s Ray Serve options (docs/scaling.md)."""
    g = p.add_argument_group("Ray Serve (pip install 'regolith[ray]'; docs/scaling.md)")
    g.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="serve replicas on Ray Serve: on the Ray cluster at ADDRESS ('auto': the one this machine "
        "joined), or without ADDRESS on a cluster started on this machine",
    )
    g.add_argument(
        "--replicas",
        type=positive(int),
        default=1,
        metavar="N",
        help="replicas, each its own model (default 1)",
    )
    g.add_argument(
        "--autoscale",
        type=_bounds,
        metavar="MIN:MAX",
        help="scale the replicas between MIN and MAX by load instead of --replicas",
    )
    g.add_argument(
        "--replica-cpus",
        type=positive(float),
        default=1.0,
        metavar="C",
        help="Ray CPUs per replica, and its threads (default 1)",
    )
    g.add_argument(
        "--replica-gpus",
        type=number(float, 0),
        default=0.0,
        metavar="G",
        help="Ray GPUs per replica (default 0)",
    )
    g.add_argument(
        "--no-affinity",
        action="store_true",
        help="route requests by load alone, not to the replica that served their prompt's prefix",
    )
