"""Suffix cache reuse (SCR, issue 25): time to first token and quality cost on agent-like edit traces.

A window holds an agent's old context; the agent resends it changed. Each trace times the prefill of the new
prompt on that window (``regolith.generation.prefill``) without SCR (today's prefix reuse: everything after
the first changed token is evaluated again) and with it (``scr=True``: the runs after the edit are moved,
only the gaps evaluated), and measures what SCR costs in quality: both windows are then teacher-forced
through the ``--continuation`` tokens that truly follow the prompt, and at each of those positions the SCR
window's next-token distribution is compared with the plain one's (the exact re-evaluation): KL(full || scr)
in nats (mean and max over the positions) and top-1 agreement.

The text is real source code, this repository's .py files concatenated (src/, then tests/ and benchmarks/),
tokenized by the model's tokenizer; the old context of size N is its first N tokens. Traces, on that context:

- ``edit 25%`` / ``edit 50%``: a file edited in the middle: the ~30 tokens of the lines from a line start
  near 25% (50%) of the context replaced by a 4-line snippet of other code (a few dozen tokens);
- ``strip 40%``: a stripped think block: ``--strip-tokens`` tokens removed from a line start near 40%;
- ``regen 25%``: a reply regenerated after an edit: the window holds the context and a reply to it (the
  ``--continuation`` tokens that follow it in the text), and the prompt is the context edited as for
  ``edit 25%``, without the reply. On a model with recurrent layers the old end's state has then read the
  reply last, so SCR evaluates the prompt's last tokens again (``regolith.generation.RECURRENT_TAIL``);
- ``tool +N``: a tool result appended: the next ``--tool-tokens`` tokens of the text after the context.
  Nothing moves, so SCR must equal the plain path bit for bit (column ``same``).

The edits are spliced in as token ids, not re-tokenized text (the two differ at most at the splice points).
The old context is evaluated once per model at the largest size (in chunks of 512, as the prefill does) and
kept as a snapshot; each row restores it and cuts it back to the row's size (on a recurrent model, which
cannot be cut back, each size is evaluated on its own). Each prefill runs once: the plain one first. On a
model with recurrent state (qwen4exp: regolith-demo) SCR moves the attention rows and the recurrent layers
keep their state after the old tokens (docs/cache.md); without SCR such a window re-evaluates the whole
prompt after an edit, as its state cannot be cut back to the prefix. Sizes are capped to what the model's
context holds.

    python benchmarks/bench_scr.py [--models gemma3-270m qwen2.5-coder-0.5b regolith-demo]
        [--sizes 4096 8192 16384] [--traces ...] [--kv-type f16] [--continuation 64] [--markdown]

Goal (issue 25): >= 5x lower time to first token on edits in the first half of a 16k context (the
``edit 25%``, ``edit 50%``, ``strip 40%`` and ``regen 25%`` rows) with mean KL below 0.05 nats; the script
says per model whether its rows at 16384 tokens (or its largest, where its context is shorter) meet it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from regolith.errors import RegolithError
from regolith.generation import prefill
from regolith.model import KV_TYPES, _host_cpu
from regolith.models import resolve_model
from regolith.tokenizer import Tokenizer
from regolith.window import Window, WindowSnapshot

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("edit 25%", "edit 50%", "strip 40%", "regen 25%", "tool")
GOAL_TRACES = ("edit 25%", "edit 50%", "strip 40%", "regen 25%")  # edits in the first half of the context
GOAL_SIZE, GOAL_SPEEDUP, GOAL_KL = 16384, 5.0, 0.05
EDIT_TOKENS = 24  # at least this many tokens replaced: up to the next line start after them
SNIPPET = """        # retry with a bounded backoff (edited)
        for attempt in range(self.max_retries):
            if attempt:
                time.sleep(self.backoff * attempt)
"""


def corpus() -> str:
    """This repository's Python files, each after a header line naming it: real code, as an agent reads."""
    files = [p for d in ("src", "tests", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    return "".join(f"# ---- {p.relative_to(ROOT)}\n{p.read_text(encoding='utf-8')}\n" for p in files)


def line_start(tok: Tokenizer, ids: Sequence[int], i: int) -> int:
    """The first position at or after ``i`` that follows a token ending a line (``i`` when none is near)."""
    for j in range(max(i, 1), min(i + 256, len(ids))):
        if tok.token_bytes(ids[j - 1]).endswith(b"\n"):
            return j
    return i


@dataclass(frozen=True)
class Trace:
    name: str
    prompt: list[int]  # the new prompt; the old context is the text's first `size` tokens
    continuation: list[int]  # the tokens that follow the prompt in the text
    reply: list[int] = field(default_factory=list)  # evaluated after the old context, before the prompt


def traces(
    tok: Tokenizer, text: list[int], size: int, names: Sequence[str], n_cont: int, n_strip: int, n_tool: int
) -> list[Trace]:
    old = text[:size]
    cont = text[size : size + n_cont]
    snippet = tok.encode(SNIPPET, add_special=False, parse_special=False)
    out = []
    for name in names:
        if name.startswith(("edit", "regen")):
            at = line_start(tok, old, size * int(name.split()[1][:-1]) // 100)
            end = line_start(tok, old, at + EDIT_TOKENS)
            out.append(
                Trace(name, old[:at] + snippet + old[end:], cont, cont if name.startswith("regen") else [])
            )
        elif name.startswith("strip"):
            at = line_start(tok, old, size * int(name[6:-1]) // 100)
            out.append(Trace(name, old[:at] + old[at + n_strip :], cont))
        else:
            out.append(
                Trace(f"tool +{n_tool}", text[: size + n_tool], text[size + n_tool : size + n_tool + n_cont])
            )
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@dataclass
class Prefill:
    seconds: float
    evaluated: int
    reused: int
    logits: np.ndarray  # (n_cont, vocab): the next-token logits at each continuation position


def hold(window: Window, snapshot: WindowSnapshot, size: int, reply: Sequence[int]) -> None:
    """Bring ``window`` to the old context: the snapshot, cut back to ``size`` tokens, and ``reply`` after it."""
    window.restore(snapshot)
    if not window.try_truncate(size):
        raise RuntimeError(f"the snapshot of {len(snapshot.tokens)} tokens cannot be cut back to {size}")
    if reply:
        window.eval(reply, all_logits=False)


def run(window: Window, trace: Trace, scr: bool) -> Prefill:
    """The timed prefill of the trace's prompt on ``window`` (holding the old context), then the continuation
    teacher-forced: the logits predicting each continuation token."""
    n0 = window.n_evaluated
    t = time.perf_counter()
    first, reused = prefill(window, trace.prompt, scr=scr)
    seconds = time.perf_counter() - t
    evaluated = window.n_evaluated - n0
    rest = window.eval(trace.continuation[:-1], all_logits=True)
    return Prefill(seconds, evaluated, reused, np.vstack([first[None], rest]))


def old_context(window: Window, text: list[int], size: int, base: WindowSnapshot | None) -> WindowSnapshot:
    """A snapshot holding the text's first ``size`` tokens: ``base`` where it can be cut back to them, else
    those tokens prefilled as the agent's earlier prompt (the snapshot keeps the logits after them)."""
    if base is not None and len(base.tokens) >= size:
        window.restore(base)
        if window.try_truncate(size):
            return base
    window.reset()
    prefill(window, text[:size])
    return window.snapshot()


COLUMNS = (
    "model",
    "context",
    "trace",
    "evaluated plain",
    "evaluated scr",
    "reused scr",
    "TTFT plain s",
    "TTFT scr s",
    "speedup",
    "KL mean",
    "KL max",
    "top-1",
    "same",
)


def bench_model(name: str, args: argparse.Namespace, console: Console) -> list[list[str]] | None:
    try:
        path = resolve_model(name)
    except RegolithError as e:
        console.print(f"[yellow]{name}: skipped ({e})[/yellow]")
        return None
    probe = regolith.Model.load(path, n_ctx=256)
    limit = int(probe.config["context_length"]) - args.tool_tokens - args.continuation - 1
    sizes = sorted({min(s, limit // 256 * 256) for s in args.sizes})
    if sizes != sorted(set(args.sizes)):
        console.print(f"[yellow]{name}: its context holds {limit + args.tool_tokens + args.continuation + 1} "
                      f"tokens; sizes {sizes}[/yellow]")  # fmt: skip
    del probe
    n_ctx = max(sizes) + args.tool_tokens + args.continuation + 1
    model = regolith.Model.load(path, n_ctx=n_ctx, kv_type=args.kv_type)
    tok = model.tokenizer
    t0 = time.perf_counter()
    need = max(sizes) + max(args.tool_tokens, 0) + args.continuation
    source = corpus()
    text = tok.encode(source[: need * 8])
    if len(text) < need:
        text = tok.encode(source)
    if len(text) < need:
        raise SystemExit(f"{name}: the corpus is {len(text)} tokens, fewer than the {need} needed")
    plain_w, scr_w = model.window(n_ctx), model.window(n_ctx)
    movable = plain_w.can_move
    console.print(f"[dim]{name}: kv {model.kv_type}, can move: {movable}, tokenized in "
                  f"{time.perf_counter() - t0:.1f} s[/dim]")  # fmt: skip
    base = None
    rows = []
    for size in sorted(sizes, reverse=movable):  # the largest first where it can be cut back to the others
        t0 = time.perf_counter()
        base = old_context(plain_w, text, size, base if movable else None)
        console.print(f"[dim]{name} {size}: old context ready in {time.perf_counter() - t0:.1f} s[/dim]")
        for trace in traces(
            tok, text, size, args.traces, args.continuation, args.strip_tokens, args.tool_tokens
        ):
            t0 = time.perf_counter()
            hold(plain_w, base, size, trace.reply)
            plain = run(plain_w, trace, scr=False)
            hold(scr_w, base, size, trace.reply)
            scr = run(scr_w, trace, scr=True)
            lp, lq = _log_softmax(plain.logits), _log_softmax(scr.logits)
            kl = (np.exp(lp) * (lp - lq)).sum(-1)
            top1 = float(np.mean(lp.argmax(-1) == lq.argmax(-1)))
            same = bool(np.array_equal(plain.logits, scr.logits))
            rows.append(
                [
                    name,
                    str(size),
                    trace.name,
                    str(plain.evaluated),
                    str(scr.evaluated),
                    str(scr.reused),
                    f"{plain.seconds:.3f}",
                    f"{scr.seconds:.3f}",
                    f"{plain.seconds / scr.seconds:.1f}",
                    f"{kl.mean():.4f}",
                    f"{kl.max():.4f}",
                    f"{top1:.0%}",
                    "yes" if same else "no",
                ]
            )
            console.print(f"[dim]{name} {size} {trace.name}: {time.perf_counter() - t0:.0f} s[/dim]")
            if trace.name.startswith("tool") and not same:
                console.print(f"[red]{name} {size} {trace.name}: SCR differs from the plain path[/red]")
    return sorted(rows, key=lambda r: int(r[1]))  # stable: the traces keep their order


def goal(rows: list[list[str]], console: Console) -> None:
    """Per model: whether its first-half edit rows meet issue 25's goal at GOAL_SIZE, or at the largest
    context it ran where its own context is shorter (regolith-demo's 4096 tokens)."""
    for name in dict.fromkeys(r[0] for r in rows):
        sizes = {int(r[1]) for r in rows if r[0] == name and r[2] in GOAL_TRACES}
        if not sizes:
            console.print(f"goal: {name} has no first-half edit rows")
            continue
        size = GOAL_SIZE if GOAL_SIZE in sizes else max(sizes)
        mine = [r for r in rows if r[0] == name and r[1] == str(size) and r[2] in GOAL_TRACES]
        misses = [
            f"{r[2]} ({r[8]}x, KL {r[9]})"
            for r in mine
            if float(r[8]) < GOAL_SPEEDUP or float(r[9]) >= GOAL_KL
        ]
        verdict = "met" if not misses else "not met: " + ", ".join(misses)
        where = f"{size}" if size == GOAL_SIZE else f"{size}, the largest run (the goal's is {GOAL_SIZE})"
        console.print(f"goal (>= {GOAL_SPEEDUP:g}x TTFT, mean KL < {GOAL_KL} at {where}): {name}: {verdict}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "qwen2.5-coder-0.5b", "regolith-demo"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[4096, 8192, 16384], help="old context tokens")
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=TRACES)
    ap.add_argument(
        "--kv-type", choices=KV_TYPES, default=None, help="default: the model's (f16; i8 on qwen4exp)"
    )
    ap.add_argument("--continuation", type=int, default=64, help="teacher-forced tokens compared")
    ap.add_argument("--strip-tokens", type=int, default=300, help="tokens the strip trace removes")
    ap.add_argument("--tool-tokens", type=int, default=256, help="tokens the tool trace appends")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    if args.continuation < 1 or args.strip_tokens < 1 or args.tool_tokens < 1:
        ap.error("--continuation, --strip-tokens and --tool-tokens must be >= 1")

    console = Console()
    threads = os.environ.get("REGOLITH_THREADS", "all")
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for name in args.models:
        rows += bench_model(name, args, console) or []
    title = (
        f"suffix cache reuse: time to first token and KL over {args.continuation} tokens; {_host_cpu()}, "
        f"{os.cpu_count()} CPUs, threads {threads}, {started:%Y-%m-%d %H:%M} UTC"
    )
    show(console, title, COLUMNS, rows, args.markdown, left=("model", "trace"))
    goal(rows, console)


def show(
    console: Console,
    title: str,
    columns: Sequence[str],
    rows: list[list[str]],
    markdown: bool,
    left: Sequence[str],
) -> None:
    """The rows as a table (the ``left`` columns left-aligned), and as markdown too with ``markdown``."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if markdown:
        print("| " + " | ".join(columns) + " |")
        print("|" + "---|" * len(columns))
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
