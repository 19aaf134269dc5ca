"""Per-token cost of sampling at Gemma's vocabulary (262144) and of anti-slop matching on a growing text.

Sampling: logits shaped like a language model's (a normal bulk plus a few strong candidates, or a saved
float32 vector via --logits, e.g. from a real model), best of many calls to Sampler.sample, which includes
the Python call overhead. Anti-slop: find_violation + pending_prefix per 4 appended characters, as a
streaming loop calls them, on texts of 10k and 100k characters with code blocks.

    python benchmarks/bench_sampling.py [--logits logits.npy] [--reps 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from regolith.antislop import SlopMatcher
from regolith.sampling import Sampler, SamplingParams

SETTINGS = [
    ("greedy", {"temperature": 0.0}),
    ("temperature 1", {}),
    ("top_p 0.95", {"top_p": 0.95}),
    ("T 0.7, top_p 0.9, min_p 0.05", {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05}),
    ("top_k 40, top_p 0.95", {"top_k": 40, "top_p": 0.95}),
    ("min_p 0.05", {"min_p": 0.05}),
    ("top_p 0.95 + penalties", {"top_p": 0.95, "repeat_penalty": 1.1, "frequency_penalty": 0.2}),
]


def lm_like_logits(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(-2.0, 2.5, n)
    logits[rng.choice(n, 30, replace=False)] += rng.uniform(8, 20, 30)
    return logits.astype(np.float32)


def best_ms(f, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def growing_text(n: int) -> str:
    rng = np.random.default_rng(1)
    prose = (
        "The committee met on Tuesday to review the budget, and after a long discussion about roads, "
        "schools and the new library, they agreed to postpone the vote until the spring session.\n"
    )
    code = "\n```python\nfor i in range(10):\n    print(`i`)\n```\n"
    parts: list[str] = []
    while sum(map(len, parts)) < n:
        parts.append(prose if rng.random() < 0.9 else code)
    return "".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logits", help="a float32 .npy vector of logits to sample from")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    logits = np.load(args.logits).astype(np.float32).ravel() if args.logits else lm_like_logits(262144)
    console = Console()

    table = Table(title=f"Sampler.sample, vocabulary {len(logits)} (best of {args.reps})")
    table.add_column("setting")
    table.add_column("ms / token", justify="right")
    table.add_column("tokens kept", justify="right")
    history = list(np.argsort(logits)[-20:])
    for name, kw in SETTINGS:
        s = Sampler(SamplingParams(seed=0, **kw), len(logits))
        s.set_history(history)
        kept = int((s.probabilities(logits) > 0).sum())
        table.add_row(name, f"{best_ms(lambda s=s: s.sample(logits), args.reps):.3f}", str(kept))
    console.print(table)

    table = Table(title="Anti-slop matching while streaming (default list)")
    table.add_column("text length", justify="right")
    table.add_column("ms per 4-char step", justify="right")
    table.add_column("full find_violation ms", justify="right")
    for n in (10_000, 100_000):
        full = growing_text(n + 2000)
        m = SlopMatcher()
        emitted, k, steps = 0, n, 0
        m.prose.scan(full[:k], partial=True)
        t0 = time.perf_counter()
        while k < len(full):
            k, steps = k + 4, steps + 1
            text = full[:k]
            m.find_violation(text, emitted, partial=True)
            emitted = m.pending_prefix(text)
        per_step = (time.perf_counter() - t0) / steps * 1e3
        whole = best_ms(lambda full=full, m=m: m.find_violation(full), 3)
        table.add_row(str(n), f"{per_step:.3f}", f"{whole:.1f}")
    console.print(table)


if __name__ == "__main__":
    main()
