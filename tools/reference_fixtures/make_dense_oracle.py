"""Record the float64 reference logits of the real gemma3 / qwen2 GGUFs, for tests/model/test_dense_real.py.

The reference is transformers running the model in float64 on the GGUF's own weights, dequantized by
transformers' GGUF loader (``from_pretrained(..., gguf_file=...)``): the quantized model computed without
any rounding of activations, KV cache or intermediate values. It judges regolith independently of
llama.cpp, which rounds activations to int8 and its KV cache to f16 as regolith's fast path does.

Usage (from the repository root; needs the test extras plus ``accelerate``, which transformers' GGUF loader
requires: ``pip install '.[test]' accelerate``)::

    python tools/reference_fixtures/make_dense_oracle.py

For each model it reads the 512-token text of ``tests/fixtures/llamacpp/dense-<arch>.json`` and writes
``tests/fixtures/reference/dense-<arch>.json``: for every position the reference's top-5 next-token ids
(descending) and their logits, and the largest absolute logit of the text (the scale tolerances refer to).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from regolith.models import resolve_model

MODELS = {"gemma3": "gemma3-270m", "qwen2": "qwen2.5-coder-0.5b"}
OUT = ROOT / "tests" / "fixtures" / "reference"


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    OUT.mkdir(parents=True, exist_ok=True)
    for arch, name in MODELS.items():
        path = resolve_model(name)
        text = json.loads((ROOT / "tests" / "fixtures" / "llamacpp" / f"dense-{arch}.json").read_text())[
            "text"
        ]
        ids = text["ids"]
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        model = model.double().eval()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy()
        top = np.argsort(-logits, axis=1, kind="stable")[:, :5]
        record = {
            "model": name,
            "reference": f"transformers {__import__('transformers').__version__}, float64, GGUF weights dequantized",
            "ids": ids,
            "top5_ids": top.tolist(),
            "top5_logits": np.take_along_axis(logits, top, axis=1).tolist(),
            "max_abs_logit": float(np.abs(logits).max()),
        }
        (OUT / f"dense-{arch}.json").write_text(json.dumps(record) + "\n")
        print(f"{arch}: {len(ids)} positions")


if __name__ == "__main__":
    main()
