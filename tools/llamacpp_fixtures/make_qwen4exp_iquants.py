"""Quantize a tiny qwen4exp GGUF with llama.cpp's own quantizer, for tests/model/test_llamacpp_quantized.py.

Usage (from the repository root, with llama-cpp-python installed: ``pip install llama-cpp-python==0.3.36``,
which builds from its sdist)::

    python tools/llamacpp_fixtures/make_qwen4exp_iquants.py

Builds the checkpoint ``tests.model.test_llamacpp_quantized.CONFIG`` (``tests/qwen4exp_models.py``),
converts it with ``regolith convert --outtype f32`` and runs ``llama_model_quantize`` to each of
``FTYPES``, writing ``tests/fixtures/llamacpp/qwen4exp-<type>.gguf``. The lower-bit i-quants (IQ1_*,
IQ2_*, IQ3_XXS) need an importance matrix in llama.cpp's quantizer, which llama-cpp-python cannot compute,
so they are not among them.
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from regolith.convert import convert
from tests.model.test_llamacpp_quantized import CONFIG, FTYPES, SEED, fixture
from tests.qwen4exp_models import save_tiny_model


def main() -> None:
    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        src = convert(save_tiny_model(Path(tmp) / "hf", SEED, **CONFIG), Path(tmp) / "f32.gguf", "f32")
        for ftype in FTYPES:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
            params.nthread = 2
            out = fixture(ftype)
            if (
                llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
                != 0
            ):
                raise SystemExit(f"llama.cpp failed to quantize to {ftype}")
            print("wrote", out, out.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
