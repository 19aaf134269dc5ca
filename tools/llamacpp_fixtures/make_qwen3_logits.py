"""Record llama.cpp's logits on the tiny qwen3 / qwen3moe GGUFs regolith's converter writes, for
tests/model/test_qwen3moe.py.

Usage (from the repository root, with llama-cpp-python installed — it builds from its sdist in 10-35 min:
``pip install llama-cpp-python==0.3.36``)::

    python tools/llamacpp_fixtures/make_qwen3_logits.py

For every checkpoint in ``tests.model.test_qwen3moe.VARIANTS`` this saves the tiny model
(``tests/dense_models.py``), converts it with ``regolith convert --outtype f32``, evaluates the test prompt in
llama.cpp with an f32 KV cache and every position's logits, and stores them in
``tests/fixtures/llamacpp/qwen3-logits.npz`` (``<name>/ids``, ``<name>/logits``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from regolith.convert import convert
from tests.dense_models import save_tiny_checkpoint
from tests.model.test_qwen3moe import LLAMACPP_LOGITS, VARIANTS, _ids


def main() -> None:
    import llama_cpp

    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (arch, seed, overrides) in VARIANTS.items():
            hf = save_tiny_checkpoint(arch, Path(tmp) / name, seed, **overrides)
            path = convert(hf, Path(tmp) / f"{name}.gguf", "f32")
            ids = _ids()
            llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=2,
                type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
            )  # fmt: skip
            llm.eval(ids.tolist())
            out[f"{name}/ids"] = ids
            out[f"{name}/logits"] = np.array(llm.scores[: len(ids)], dtype=np.float32)
            print(name, out[f"{name}/logits"].shape)
    np.savez_compressed(LLAMACPP_LOGITS, **out)
    print("wrote", LLAMACPP_LOGITS)


if __name__ == "__main__":
    main()
