"""Record llama.cpp's logits on tiny qwen4exp GGUFs, for tests/model/test_llamacpp_parity.py.

Usage (from the repository root, with llama-cpp-python installed — it builds from its sdist in 10-35 min:
``pip install llama-cpp-python==0.3.36``)::

    python tools/llamacpp_fixtures/make_qwen4exp_logits.py

For every case in ``tests.model.test_llamacpp_parity.CASES`` this builds the tiny checkpoint
(``tests/qwen4exp_models.py``), converts it with ``regolith convert --outtype f32`` (llama.cpp's layout; the
converter tests check it against llama.cpp's own converter), evaluates the test prompt in llama.cpp with
an f32 KV cache and every position's logits, and stores them in
``tests/fixtures/llamacpp/qwen4exp-logits.npz`` (``<case>/ids``, ``<case>/logits``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from regolith.convert import convert
from tests.model.test_llamacpp_parity import CASES, FIXTURE, SEED, case_prompt
from tests.qwen4exp_models import save_tiny_model


def llamacpp_logits(path: Path, ids: np.ndarray) -> np.ndarray:
    """llama.cpp's logits of every position of ``ids`` on the GGUF ``path`` (an f32 KV cache, 64 tokens)."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=2,
        type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
    )  # fmt: skip
    llm.eval(ids.tolist())
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def main() -> None:
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in CASES.items():
            hf = save_tiny_model(Path(tmp) / name, SEED, **overrides)
            path = convert(hf, Path(tmp) / f"{name}.gguf", "f32")
            ids = case_prompt()
            out[f"{name}/ids"] = ids
            out[f"{name}/logits"] = llamacpp_logits(path, ids)
            print(name, out[f"{name}/logits"].shape)
    np.savez_compressed(FIXTURE, **out)
    print("wrote", FIXTURE)


if __name__ == "__main__":
    main()
