"""Record llama.cpp's logits on the tiny qwen3 / qwen3moe / qwen35moe / qwen3next / gpt-oss GGUFs regolith's
converter writes, for tests/model/test_qwen3moe.py, test_qwen_hybrid.py and test_gpt_oss.py.

Usage (from the repository root, with llama-cpp-python installed — it builds from its sdist in 10-35 min:
``pip install llama-cpp-python==0.3.36``)::

    python tools/llamacpp_fixtures/make_qwen3_logits.py [qwen3 | hybrid | gptoss]

For every checkpoint in the test module's ``VARIANTS`` (``qwen3``: tests.model.test_qwen3moe, ``hybrid``:
tests.model.test_qwen_hybrid, ``gptoss``: tests.model.test_gpt_oss; all by default) this saves the tiny model (``tests/dense_models.py``), converts
it with ``regolith convert --outtype f32``, evaluates the test prompt in llama.cpp with an f32 KV cache and
every position's logits, and stores them in the module's ``LLAMACPP_LOGITS`` file
(``tests/fixtures/llamacpp/qwen3-logits.npz``, ``qwen-hybrid-logits.npz``, ``gptoss-logits.npz``:
``<name>/ids``, ``<name>/logits``).
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from regolith.convert import convert
from tests.dense_models import save_tiny_checkpoint
from tools.llamacpp_fixtures.make_qwen4exp_logits import llamacpp_logits

TEST_MODULES = {
    "qwen3": "tests.model.test_qwen3moe",
    "hybrid": "tests.model.test_qwen_hybrid",
    "gptoss": "tests.model.test_gpt_oss",
}


def record(module_name: str) -> None:
    test = importlib.import_module(module_name)
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (arch, seed, overrides) in test.VARIANTS.items():
            hf = save_tiny_checkpoint(arch, Path(tmp) / name, seed, **overrides)
            path = convert(hf, Path(tmp) / f"{name}.gguf", "f32")
            ids = test._ids()
            out[f"{name}/ids"] = ids
            out[f"{name}/logits"] = llamacpp_logits(path, ids)
            print(name, out[f"{name}/logits"].shape)
    np.savez_compressed(test.LLAMACPP_LOGITS, **out)
    print("wrote", test.LLAMACPP_LOGITS)


def main() -> None:
    for family in sys.argv[1:] or list(TEST_MODULES):
        record(TEST_MODULES[family])


if __name__ == "__main__":
    main()
