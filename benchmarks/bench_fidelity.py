"""Fidelity of regolith's default path: how far its next-token distributions are from the exact model's.

For Gemma 3 270M and Qwen2.5-Coder 0.5B (Q4_K_M) and the bundled demo model (qwen4exp, Q8_0), over three
512-token texts (prose, code, a chat in the model's template): the mean KL divergence KL(reference || engine) over the full vocabulary, in nats, the
share of positions whose top-1 token is the reference's, and the perplexity of the text, for

- ``default``: regolith as loaded (int8 activations, the default f16 KV cache);
- ``exact``: regolith's exact mode (float activations, ``_core.set_exact_activations``) with an f32 KV cache;
- ``llama.cpp``: llama-cpp-python 0.3.36 with f16 K and V cache, no flash attention (computed against the
  full reference when the fixture was recorded; not for the demo model, whose qwen4exp llama.cpp computes
  differently from transformers: make_fidelity_fixtures.py).

The reference is transformers in float64 on the GGUF's dequantized weights, run here (1-2 minutes per text
on 2 cores; needs torch, transformers and accelerate). ``--compact`` uses the committed reference instead
(tests/fixtures/reference/fidelity-<arch>.npz, recorded by tools/reference_fixtures/
make_fidelity_fixtures.py): its top-32 log-probabilities per position, with the rest of the vocabulary
merged into one outcome, which gives a lower bound of the KL divergence (merging outcomes never increases
it); llama.cpp's column then uses the same bound.

    python benchmarks/bench_fidelity.py [--models gemma3 qwen2 qwen4exp] [--compact] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from regolith import _core
from regolith.logprobs import log_softmax
from regolith.models import resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "reference"
MODELS = {"gemma3": "gemma3-270m", "qwen2": "qwen2.5-coder-0.5b", "qwen4exp": "regolith-demo"}
TEXTS = ("prose", "code", "chat")


def compact_kl(top_logprobs: np.ndarray, logprobs_at_top: np.ndarray) -> np.ndarray:
    """Per position, KL(reference || engine) over the reference's top-k tokens plus one outcome for the rest
    of the vocabulary: a lower bound of the full divergence. Both arguments [n][k], log-probabilities of the
    same tokens."""
    p, q = np.exp(top_logprobs.astype(np.float64)), np.exp(logprobs_at_top.astype(np.float64))
    p_rest, q_rest = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0), np.clip(1.0 - q.sum(axis=1), 1e-300, 1.0)
    rest = np.where(p_rest > 0, p_rest * np.log(np.maximum(p_rest, 1e-300) / q_rest), 0.0)
    return (p * (top_logprobs - logprobs_at_top)).sum(axis=1) + rest


def regolith_logits(model: regolith.Model, ids: np.ndarray, exact: bool) -> np.ndarray:
    """Every position's logits of one evaluation of ``ids``: the default path or exact mode (f32 cache)."""
    _core.set_exact_activations(exact)
    try:
        return model._core.new_window(len(ids), "f32" if exact else model.kv_type).eval(ids, True)
    finally:
        _core.set_exact_activations(False)


class Reference:
    """transformers in float64 on the GGUF's dequantized weights: full log-probabilities of a text."""

    def __init__(self, arch: str, path: Path):
        import torch

        from tools.reference_fixtures.make_fidelity_fixtures import reference_model

        torch.set_num_threads(os.cpu_count() or 1)
        self.torch = torch
        self.model = reference_model(arch, path)

    def logprobs(self, ids: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            return log_softmax(self.model(self.torch.tensor([ids.tolist()])).logits[0].numpy())


def measure(arch: str, compact: bool) -> list[dict]:
    """The rows of one model: per text, the reference's perplexity and each engine's figures."""
    fx = np.load(FIXTURES / f"fidelity-{arch}.npz")
    path = resolve_model(MODELS[arch])
    model = regolith.Model.load(path)
    reference = None if compact else Reference(arch, path)
    rows = []
    for text in TEXTS:
        ids = fx[f"{text}/ids"]
        top_ids, top_lp = fx[f"{text}/top_ids"], fx[f"{text}/top_logprobs"]
        nxt = (np.arange(len(ids) - 1), ids[1:])
        ref = None if compact else reference.logprobs(ids)
        if ref is not None and not np.array_equal(ref.argmax(axis=1), top_ids[:, 0]):
            raise SystemExit(f"{arch} {text}: the reference computed here is not the fixture's")
        rows.append({"model": MODELS[arch], "text": text, "engine": "float64 reference", "kl": 0.0,
                     "top1": 1.0, "ppl": float(np.exp(fx[f"{text}/ref_nll"].mean()))})  # fmt: skip
        for engine, exact in (("regolith default", False), ("regolith exact", True)):
            lp = log_softmax(regolith_logits(model, ids, exact))
            if compact:
                kl = compact_kl(top_lp, np.take_along_axis(lp, top_ids, axis=1))
            else:
                kl = (np.exp(ref) * (ref - lp)).sum(axis=1)
            rows.append({"model": MODELS[arch], "text": text, "engine": engine, "kl": float(kl.mean()),
                         "top1": float(np.mean(lp.argmax(axis=1) == top_ids[:, 0])),
                         "ppl": float(np.exp(-lp[nxt].mean()))})  # fmt: skip
        if f"{text}/llama_kl" not in fx:
            continue
        llama_kl = compact_kl(top_lp, fx[f"{text}/llama_top_logprobs"]) if compact else fx[f"{text}/llama_kl"]
        rows.append({"model": MODELS[arch], "text": text, "engine": "llama.cpp", "kl": float(llama_kl.mean()),
                     "top1": float(fx[f"{text}/llama_top1"].mean()),
                     "ppl": float(np.exp(fx[f"{text}/llama_nll"].mean()))})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--compact", action="store_true", help="the committed top-32 reference (KL lower bound)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = p.parse_args(argv)
    rows = [r for arch in args.models for r in measure(arch, args.compact)]
    kl_name = "mean KL (top-32 + rest, lower bound)" if args.compact else "mean KL (full vocabulary)"
    header = ["model", "text", "engine", kl_name, "top-1 agreement", "perplexity"]
    cells = [
        [r["model"], r["text"], r["engine"], f"{r['kl']:.5f}", f"{r['top1']:.4f}", f"{r['ppl']:.3f}"]
        for r in rows
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for c in cells:
            print("| " + " | ".join(c) + " |")
    else:
        table = Table(*header)
        for c in cells:
            table.add_row(*c)
        Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
