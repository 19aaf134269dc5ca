"""What suffix cache reuse (SCR) costs on a model with recurrent layers, policy by policy (issue 25).

A recurrent window (Gated DeltaNet, PLE's conv history) holds only its state after all its tokens, "the old
end's". After an edit, SCR moves the attention rows of the tokens past it; this script measures what the
recurrent layers should read, on regolith-demo (qwen4exp) and ``bench_scr``'s edit traces, in two settings:

- ``resent``: the window holds the old prompt (prefilled, so the logits after it are known) and the prompt
  comes again edited: the plan's last run ends one token before the old end;
- ``regen``: the window holds the old prompt and a 64-token reply to it, and the prompt comes again edited
  without the reply (a reply regenerated): the old end's state has read the reply last.

Policies, each built from the window's own operations (``truncate_attention``, ``append_moved``,
``adopt_recurrent``): ``keep`` (the state kept through the gaps, never the old end's), ``read last, then
adopt`` (the prompt's last token evaluated with the state kept, then the old end's taken: the policy until
2026-12-07), ``tail N`` (the old end's state taken N tokens before the prompt's end, those N evaluated
again), ``built`` (``prefill(scr=True)``: what regolith does), and ``oracle`` (the built path, then the
recurrent state of the edited prompt truly evaluated: what no policy can beat; its first position is the
built path's). Each cell: the mean KL(full || policy) in nats over the ``--continuation`` teacher-forced
tokens after the prompt, against the plain path (the whole prompt evaluated); ``first``: the KL at the first
of them, the distribution the first reply token is sampled from.

    python benchmarks/bench_scr_policies.py [--size 3584] [--tails 1 16 64 128 256 1024] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np
from rich.console import Console

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bench_scr

import regolith
from regolith.generation import PREFILL_CHUNK, prefill
from regolith.models import resolve_model
from regolith.scr import Run, plan_reuse
from regolith.window import Window

TRACES = ("edit 25%", "edit 50%", "strip 40%")
REPLY = 64  # tokens of the reply the regen setting's window holds


def _eval(window: Window, tokens: Sequence[int]) -> np.ndarray | None:
    logits = None
    for start in range(0, len(tokens), PREFILL_CHUNK):
        logits = window.eval(tokens[start : start + PREFILL_CHUNK], all_logits=False)
    return None if logits is None else logits[0]


def by_hand(window: Window, prompt: list[int], tail: int, adopt: str) -> np.ndarray:
    """SCR step by step: the plan's runs moved, the last cut back to leave the prompt's last ``tail`` tokens,
    which are evaluated; the old end's recurrent state taken before them (``adopt="before"``), after them
    (``"after"``) or never (``"never"``). Returns the logits after the prompt."""
    snap = window.snapshot()
    runs = plan_reuse(snap.tokens, prompt[:-1])
    head = runs[0].length if runs[0].dst == 0 else 0
    window.truncate_attention(head)
    moved = [r for r in runs if r.dst > 0]
    last = moved[-1]
    moved[-1] = Run(last.src, last.dst, min(last.length, max(0, len(prompt) - tail - last.dst)))
    done = head
    for run in moved:
        _eval(window, prompt[done : run.dst])
        window.append_moved(snap, run.src, run.length)
        done = run.dst + run.length
    if adopt == "before":
        window.adopt_recurrent(snap)
    logits = _eval(window, prompt[done:])
    if adopt == "after":
        window.adopt_recurrent(snap)
    assert logits is not None
    return logits


def kl(plain: np.ndarray, other: np.ndarray) -> np.ndarray:
    lp, lq = bench_scr._log_softmax(plain), bench_scr._log_softmax(other)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="regolith-demo", help="a model with recurrent layers")
    ap.add_argument("--size", type=int, default=3584, help="old context tokens")
    ap.add_argument("--tails", nargs="+", type=int, default=[1, 16, 64, 128, 256, 1024])
    ap.add_argument("--continuation", type=int, default=64)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    n_ctx = args.size + REPLY + args.continuation + 1
    model = regolith.Model.load(resolve_model(args.model), n_ctx=n_ctx)
    tok = model.tokenizer
    if not model.window(16).recurrent:
        raise SystemExit(f"{args.model} has no recurrent layers")
    text = tok.encode(bench_scr.corpus()[: (n_ctx + 256) * 8])
    plain_w, w = model.window(n_ctx), model.window(n_ctx)
    bases = {}
    for setting, reply in (("resent", []), ("regen", text[args.size : args.size + REPLY])):
        w.reset()
        prefill(w, text[: args.size])
        if reply:
            w.eval(reply, all_logits=False)
        bases[setting] = w.snapshot()

    rows: list[list[str]] = []
    for trace in bench_scr.traces(tok, text, args.size, TRACES, args.continuation, 300, 256):
        cont = trace.continuation[:-1]
        plain_w.restore(bases["resent"])
        first, _ = prefill(plain_w, trace.prompt)
        truth = plain_w.snapshot()
        plain = np.vstack([first[None], plain_w.eval(cont)])
        for setting, base in bases.items():
            prompt = trace.prompt
            policies: dict[str, Callable[[], np.ndarray]] = {
                "keep": lambda p=prompt: by_hand(w, p, 1, "never"),
                "read last, then adopt": lambda p=prompt: by_hand(w, p, 1, "after"),
                **{f"tail {t}": (lambda t=t, p=prompt: by_hand(w, p, t, "before")) for t in args.tails},
                "built": lambda p=prompt: prefill(w, p, scr=True)[0],
            }
            for name, policy in policies.items():
                w.restore(base)
                got = np.vstack([policy()[None], w.eval(cont)])
                k = kl(plain, got)
                rows.append([setting, trace.name, name, f"{k.mean():.4f}", f"{k[0]:.4f}"])
                if name == "built":  # the oracle: the built path's moved rows, the true recurrent state
                    w.restore(base)
                    first, _ = prefill(w, prompt, scr=True)
                    w.adopt_recurrent(truth)
                    k = kl(plain, np.vstack([first[None], w.eval(cont)]))
                    rows.append([setting, trace.name, "oracle", f"{k.mean():.4f}", f"{k[0]:.4f}"])
    columns = ("setting", "trace", "policy", "KL mean", "KL first")
    title = f"SCR on {args.model}'s recurrent layers: {args.size} tokens, {args.continuation} compared"
    bench_scr.show(Console(), title, columns, rows, args.markdown, left=columns[:3])


if __name__ == "__main__":
    main()
