"""qwen4exp GGUFs quantized by llama.cpp's own quantizer (IQ4_XS, IQ3_S mixes, with its IQ4_NL, Q5_1, Q6_K,
Q8_0 and F16 fallbacks) decode correctly in regolith.

With float activations (exact mode) a quantized file must compute exactly what its dequantized twin does
(tests/model/twin.py); the twin runs the f32 path that the transformers tests check, so this is the
dequantize-then-reference comparison, with zero tolerance. The default int8-activation kernels then differ
from it only by activation rounding, bounded per product in tests/test_matmul.py. Fixtures:
tools/llamacpp_fixtures/make_qwen4exp_iquants.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import regolith
from regolith import _core
from tests.model.twin import write_dequantized_twin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"
SEED = 7
FTYPES = ("IQ4_XS", "IQ3_S")
# 256-wide rows so llama.cpp's 256-element i-quants apply; 4 experts keep the files small
CONFIG = {
    "indexer_n_heads": 8,
    "output_gate_type": "sigmoid",
    "hidden_size": 256,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "ple_layer_ids": [1],
}


def fixture(ftype: str) -> Path:
    return FIXTURES / f"qwen4exp-{ftype.lower()}.gguf"


@pytest.mark.parametrize("ftype", FTYPES)
def test_llamacpp_quantized_file_matches_dequantized_twin(tmp_path, ftype):
    path = fixture(ftype)
    with regolith.gguf.open(path) as f:
        types = Counter(t.type_name for t in f.tensors.values())
    assert types[ftype] >= 10, types  # the expert and projection matrices
    twin = write_dequantized_twin(path, tmp_path / "twin.gguf")
    ids = np.random.default_rng(1).integers(3, 304, 32)
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        got = regolith.Model.load(path).window(64).eval(ids)
        want = regolith.Model.load(twin).window(64).eval(ids)
    finally:
        _core.set_exact_activations(before)
    np.testing.assert_array_equal(got, want)
    fast = regolith.Model.load(path).window(64).eval(ids)
    assert np.isfinite(fast).all() and fast.shape == want.shape
