"""Fidelity of the attention cache types (``Model.load(kv_type=...)``) against the f32 cache over long contexts.

Every cache type evaluates the same long held-out text (this repository's docs/*.md, which no model here was
trained on) in chunks, side by side with an f32-cache window; per position it compares the next-token
distribution with the f32 cache's: KL(f32 || type) (mean, 99th percentile, max), top-1 agreement, and the
perplexity of the text itself. The cache's bytes per token come from the memory plan at that type.

The row "f32, 1/8 chunks" is the noise floor: the f32 cache again, each chunk evaluated in 8 pieces. Its
sums run in another order (prefill in other chunk sizes), so it differs from the f32 row by float rounding
alone, and what that rounding moves (a QSA block chosen between two near-equal scores) shows up there too.

    python benchmarks/bench_kv.py --models regolith-demo gemma3-270m qwen2.5-coder-0.5b --ctx 4096 --markdown
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import regolith
from regolith.model import KV_TYPES

ROOT = Path(__file__).resolve().parents[1]
FLOOR = "f32, 1/8 chunks"


def held_out_text() -> str:
    return "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def measure(name: str, n_ctx: int, chunk: int, types: list[str]) -> list[dict]:
    models = {kv: regolith.Model.load(name, kv_type=kv, n_ctx=n_ctx) for kv in ["f32", *types]}
    models[FLOOR] = models["f32"]
    types = [FLOOR, *types]
    ids = models["f32"].tokenizer.encode(held_out_text())
    if len(ids) < n_ctx:
        raise SystemExit(f"the held-out text is {len(ids)} tokens of {name}'s tokenizer, fewer than {n_ctx}")
    ids = np.asarray(ids[:n_ctx], np.int32)
    windows = {kv: m.window(n_ctx) for kv, m in models.items()}
    kl = {kv: [] for kv in types}
    top1 = {kv: [] for kv in types}
    nll = {kv: [] for kv in ["f32", *types]}
    seconds = dict.fromkeys(["f32", *types], 0.0)
    for a in range(0, n_ctx, chunk):
        b = min(n_ctx, a + chunk)
        logp = {}
        for kv, w in windows.items():
            t = time.perf_counter()
            if kv == FLOOR:
                step = max(1, (b - a + 7) // 8)
                logits = np.concatenate([w.eval(ids[c : min(b, c + step)]) for c in range(a, b, step)])
            else:
                logits = w.eval(ids[a:b])
            seconds[kv] += time.perf_counter() - t
            logp[kv] = _log_softmax(logits)
        nxt = ids[a + 1 : b + 1]  # the text's next tokens (the last position has none)
        for kv, lp in logp.items():
            nll[kv].append(-lp[np.arange(len(nxt)), nxt])
        ref = logp["f32"]
        for kv in types:
            kl[kv].append((np.exp(ref) * (ref - logp[kv])).sum(-1))
            top1[kv].append(logp[kv].argmax(-1) == ref.argmax(-1))
        print(f"  {name} {b}/{n_ctx}", file=sys.stderr, flush=True)
    rows = []
    for kv in ["f32", *types]:
        k = np.concatenate(kl[kv]) if kv in kl else np.zeros(1)
        rows.append(
            {
                "model": name,
                "ctx": n_ctx,
                "kv": kv,
                "bytes_per_token": models[kv].plan.sizes.state_per_token,
                "kl_mean": float(k.mean()),
                "kl_p99": float(np.percentile(k, 99)),
                "kl_max": float(k.max()),
                "top1": float(np.concatenate(top1[kv]).mean()) if kv in top1 else 1.0,
                "ppl": float(np.exp(np.concatenate(nll[kv]).mean())),
                "seconds": seconds[kv],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["regolith-demo"])
    p.add_argument("--ctx", type=int, nargs="+", default=[4096])
    p.add_argument("--chunk", type=int, default=256, help="tokens per eval (bounds the logits held at once)")
    p.add_argument("--types", nargs="+", default=[t for t in KV_TYPES if t != "f32"])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    if args.markdown:
        print(
            "| model | context | kv | cache bytes / token | mean KL | p99 KL | max KL | top-1 | ppl | eval s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        for ctx in args.ctx:
            for r in measure(name, ctx, args.chunk, args.types):
                if not args.markdown:
                    print(r, flush=True)
                    continue
                print(
                    f"| {r['model']} | {r['ctx']} | {r['kv']} | {r['bytes_per_token']:,} | {r['kl_mean']:.2e} | "
                    f"{r['kl_p99']:.2e} | {r['kl_max']:.2e} | {100 * r['top1']:.2f}% | {r['ppl']:.4f} | "
                    f"{r['seconds']:.0f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
