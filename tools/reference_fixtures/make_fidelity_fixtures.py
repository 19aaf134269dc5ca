"""Record the fidelity fixtures of the real gemma3 / qwen2 GGUFs and the bundled demo model (qwen4exp): the
float64 reference in compact form and llama.cpp's distance from it over the full vocabulary, for
benchmarks/bench_fidelity.py and tests/model/test_fidelity_real.py.

The reference is transformers running the model in float64 on the GGUF's own weights, dequantized by its
GGUF loader (as make_dense_oracle.py); transformers cannot load a qwen4exp GGUF, so the demo model's
weights go through qwen4exp_from_gguf.py (the inverse of ``regolith convert``) into ``Qwen4ExpForCausalLM``
built from tools/train_demo/config.json. The demo model has no llama.cpp columns: llama.cpp's qwen4exp
computes another model than transformers' (its GDN output gate is always a sigmoid where the demo's is
silu, and its QSA block selection differs; docs/qwen4exp.md), so its distance would not measure rounding. llama.cpp runs as make_dense_fixtures.py's ``SETTINGS`` (f16 K and V
cache, no flash attention, one 512-token batch, 2 threads). Full-vocabulary logits (512 x 262,144 floats per
text) are too big to commit, so everything llama.cpp's columns need is computed here, against the full
reference, and the reference itself is kept as its top ``TOP_K`` log-probabilities per position.

Usage (from the repository root; the test extras plus ``accelerate`` and llama-cpp-python 0.3.36; with the
build of /work/llamacpp_build: ``PYTHONPATH=<its source>:<its pure-python deps> LLAMA_CPP_LIB_PATH=<its
build/bin>``)::

    python tools/reference_fixtures/make_fidelity_fixtures.py [gemma3 qwen2 qwen4exp]

For each model it writes ``tests/fixtures/reference/fidelity-<arch>.npz``, for each text of ``TEXTS``
(prose, code, a chat rendered with the model's own template) under ``<text>/``:

- ``ids`` [N]: the text's first N = 512 tokens (regolith's tokenizer, identical to llama.cpp's);
- ``top_ids`` [N][TOP_K], ``top_logprobs`` [N][TOP_K]: the reference's most likely next tokens
  (descending) and their log-probabilities (float64 log-softmax over the full vocabulary, stored as float32);
- ``ref_nll`` [N-1]: the reference's negative log-likelihood of each actual next token;
- ``llama_kl`` [N], ``llama_top1`` [N], ``llama_nll`` [N-1]: llama.cpp's KL divergence from the reference
  over the full vocabulary, KL(reference || llama.cpp) in nats, whether its top-1 token is the reference's,
  and its negative log-likelihood of each next token; ``llama_top_logprobs`` [N][TOP_K]: its
  log-probabilities of the reference's top tokens (to compare llama.cpp with regolith on the compact form
  too, where the full reference is not at hand).

and ``meta``: a JSON string with the model, the reference's and llama.cpp's versions and settings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from regolith.logprobs import log_softmax
from regolith.models import resolve_model
from tools.llamacpp_fixtures.make_dense_fixtures import SETTINGS, make_llama
from tools.llamacpp_fixtures.make_dense_fixtures import TEXT as PROSE
from tools.reference_fixtures.fidelity_texts import CHAT, CODE

MODELS = {"gemma3": "gemma3-270m", "qwen2": "qwen2.5-coder-0.5b", "qwen4exp": "regolith-demo"}
DEMO_CONFIG = ROOT / "tools" / "train_demo" / "config.json"
OUT = ROOT / "tests" / "fixtures" / "reference"
N_TOKENS = 512
TOP_K = 32


def text_ids(model, name: str) -> list[int]:
    """The first N_TOKENS tokens of text ``name`` for ``model`` (a regolith.Model)."""
    if name == "chat":
        ids = model.chat_prompt(CHAT, add_generation_prompt=False)
    else:
        ids = model.tokenize(PROSE if name == "prose" else CODE)
    if len(ids) < N_TOKENS:
        raise SystemExit(f"{model.config['architecture']} {name}: only {len(ids)} tokens")
    return ids[:N_TOKENS]


def reference_model(arch: str, path: Path):
    """transformers' model of the GGUF at ``path`` in float64, on its dequantized weights."""
    import torch
    from transformers import AutoModelForCausalLM

    if arch == "qwen4exp":
        from tools.reference_fixtures.qwen4exp_from_gguf import state_dict

        model, weights = state_dict(json.loads(DEMO_CONFIG.read_text()), path)
        model = model.double()
        model.load_state_dict(weights)
        return model.eval()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.double().eval()


def record(arch: str, name: str) -> Path:
    import torch
    import transformers

    import regolith

    path = resolve_model(name)
    model = regolith.Model.load(path)
    ref_model = reference_model(arch, path)
    llm = None if arch == "qwen4exp" else make_llama(name, flash_attn=SETTINGS["flash_attn"])
    out: dict[str, np.ndarray] = {}
    for text in ("prose", "code", "chat"):
        ids = text_ids(model, text)
        with torch.no_grad():
            ref = log_softmax(ref_model(torch.tensor([ids])).logits[0].numpy())
        nxt = (np.arange(N_TOKENS - 1), np.array(ids[1:]))
        top = np.argsort(-ref, axis=1, kind="stable")[:, :TOP_K]
        out[f"{text}/ids"] = np.array(ids, dtype=np.int32)
        out[f"{text}/top_ids"] = top.astype(np.int32)
        out[f"{text}/top_logprobs"] = np.take_along_axis(ref, top, axis=1).astype(np.float32)
        out[f"{text}/ref_nll"] = (-ref[nxt]).astype(np.float32)
        if llm is None:
            print(
                f"{arch} {text}: reference perplexity {np.exp(out[f'{text}/ref_nll'].mean()):.3f}", flush=True
            )
            continue
        llm.reset()
        llm.eval(ids)
        lcpp = log_softmax(np.array(llm.scores[:N_TOKENS], dtype=np.float32))
        out[f"{text}/llama_kl"] = (np.exp(ref) * (ref - lcpp)).sum(axis=1).astype(np.float32)
        out[f"{text}/llama_top1"] = lcpp.argmax(axis=1) == top[:, 0]
        out[f"{text}/llama_nll"] = (-lcpp[nxt]).astype(np.float32)
        out[f"{text}/llama_top_logprobs"] = np.take_along_axis(lcpp, top, axis=1).astype(np.float32)
        print(
            f"{arch} {text}: llama.cpp KL {out[f'{text}/llama_kl'].mean():.5f} "
            f"top-1 {out[f'{text}/llama_top1'].mean():.4f}",
            flush=True,
        )
    meta = {
        "model": name,
        "reference": f"transformers {transformers.__version__}, float64, GGUF weights dequantized",
        "top_k": TOP_K,
    }
    if llm is not None:
        import llama_cpp

        meta["llama_cpp"] = {"version": llama_cpp.__version__, **SETTINGS}
    dst = OUT / f"fidelity-{arch}.npz"
    tmp = dst.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(meta)), **out)
    tmp.replace(dst)
    return dst


def main(argv: list[str] | None = None) -> None:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", help=f"the models to record, of {', '.join(MODELS)} (default: all)")
    archs = ap.parse_args(argv).archs or list(MODELS)
    if set(archs) - set(MODELS):
        ap.error(f"unknown models {sorted(set(archs) - set(MODELS))}: choose from {', '.join(MODELS)}")
    torch.set_num_threads(2)
    for arch, name in ((a, MODELS[a]) for a in archs):
        dst = record(arch, name)
        print("wrote", dst, dst.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
