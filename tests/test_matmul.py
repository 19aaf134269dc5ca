"""CPU matmul kernels (matvec, small batch, prefill GEMM) against dequantize-then-float64.

The weights' reference values come from the `gguf` package's dequantizers (tests/quant_data.py). Two
sources of error are allowed, each with a bound derived from the kernel's arithmetic, not fitted:

* Float rounding. The kernel sums products of the integer decomposition w = scale*q + bias in float32, so
  its rounding error is at most gamma * sum_i (|scale*q_i| + |bias|) * |x_i| with gamma = (k + 8) * eps32,
  k = cols / 16 the number of float accumulation steps per lane (plus the 8-lane reduction and the
  per-group scale products). The magnitudes come from _core.decode_blocks.
* Activation quantization. Activations are quantized to int8 per block of 32 elements (128 for the types
  whose kernels accumulate half blocks in int32; scale amax/127), so each |x_i - x_hat_i| <= amax/254.
  The bias term uses the quantized activations' sums (as the scale term), so the kernel computes
  w . x_hat and the error is at most sum_i |w_i| * amax_block(i)/254. The "q8-exact" tests use
  activations that Q8 represents exactly, so only float rounding remains.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regolith import _core
from regolith.quant import TYPE_IDS, type_size
from tests.quant_data import (
    QUANT_TYPES,
    decomposition_magnitudes,
    q8_exact_activations,
    random_matrix,
    reference,
)

ISAS = _core.available_isas()
EPS32 = float(np.finfo(np.float32).eps)
FLOAT_TYPES = {"F32": (0, np.float32), "F16": (1, np.float16), "BF16": (30, None)}


@pytest.fixture(params=ISAS)
def isa(request):
    before = _core.isa()
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(before)


def _check_quant(name: str, rows: int, cols: int, ntok: int, rng: np.random.Generator, exact_acts: bool):
    wq = random_matrix(name, rows, cols, rng)
    w = reference(wq, name).astype(np.float64)
    if exact_acts:
        x = q8_exact_activations(ntok, cols, rng)
    else:
        x = rng.standard_normal((ntok, cols)).astype(np.float32) * rng.uniform(0.01, 10)
    y = _core.matmul(TYPE_IDS[name], wq, cols, x)
    ref = x.astype(np.float64) @ w.T

    sq, b = decomposition_magnitudes(TYPE_IDS[name], wq, rows, cols)
    ax = np.abs(x.astype(np.float64))
    bound = (cols / 16 + 8) * EPS32 * ((sq + b) @ ax.T).T
    if not exact_acts:
        ab = _core.activation_block(TYPE_IDS[name])
        amax = np.repeat(ax.reshape(ntok, cols // ab, ab).max(axis=2), ab, axis=1)
        bound += (np.abs(w) @ (amax / 254.0).T).T * (1 + 1e-6)
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == (ntok, rows)
    assert np.all(err <= bound + 1e-30), f"{name}: max excess {np.max(err - bound)}"


@pytest.mark.parametrize("ntok", [1, 2, 5, 8, 9, 33])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_matmul_q8_exact_matches_dequantize_float64(name, ntok, isa):
    qk, _ = type_size(name)
    rng = np.random.default_rng([TYPE_IDS[name], ntok])
    _check_quant(name, rows=19, cols=max(qk, 256) * 2, ntok=ntok, rng=rng, exact_acts=True)


@pytest.mark.parametrize("ntok", [1, 4, 8, 20])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_matmul_matches_dequantize_float64_within_q8_bound(name, ntok, isa):
    qk, _ = type_size(name)
    rng = np.random.default_rng([TYPE_IDS[name], ntok, 1])
    _check_quant(name, rows=7, cols=max(qk, 256), ntok=ntok, rng=rng, exact_acts=False)


@pytest.mark.parametrize("ntok", [1, 3, 8, 12])
@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_float_matmul_matches_float64(name, ntok, isa):
    rng = np.random.default_rng(ntok)
    rows, cols = 11, 301
    w32 = rng.standard_normal((rows, cols)).astype(np.float32)
    if name == "BF16":
        bits = (w32.view(np.uint32) >> 16).astype(np.uint16)
        w = (bits.astype(np.uint32) << 16).view(np.float32)
        raw = bits.view(np.uint8).reshape(rows, -1)
    else:
        w = w32.astype(FLOAT_TYPES[name][1])
        raw = w.view(np.uint8).reshape(rows, -1)
    x = rng.standard_normal((ntok, cols)).astype(np.float32)
    y = _core.matmul(FLOAT_TYPES[name][0], raw, cols, x)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = (cols / 8 + 8) * EPS32 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)
    assert np.all(np.abs(y - ref) <= bound)


def _weights(name: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """A random weight matrix of a quant type or F32 / F16 / BF16, as raw rows, and its type id."""
    if name not in FLOAT_TYPES:
        return random_matrix(name, rows, cols, rng), TYPE_IDS[name]
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if name == "BF16":
        raw = (w.view(np.uint32) >> 16).astype(np.uint16)
    else:
        raw = np.ascontiguousarray(w.astype(np.float16) if name == "F16" else w)
    return raw.view(np.uint8).reshape(rows, -1), FLOAT_TYPES[name][0]


@pytest.mark.parametrize("name", QUANT_TYPES + list(FLOAT_TYPES))
def test_rows_do_not_depend_on_ntok(name, isa):
    """Backend::matmul's contract: y[t] is bit for bit the same in decode (ntok <= 8) and prefill tiles."""
    rng = np.random.default_rng([len(name), 3])
    cols = 512
    raw, type_id = _weights(name, 21, cols, rng)
    x = rng.standard_normal((37, cols)).astype(np.float32)
    whole = _core.matmul(type_id, raw, cols, x)
    for n in (1, 3, 8):
        parts = [
            _core.matmul(type_id, raw, cols, np.ascontiguousarray(x[i : i + n])) for i in range(0, 37, n)
        ]
        np.testing.assert_array_equal(np.concatenate(parts), whole, err_msg=f"{name}, {n} tokens per call")


@pytest.mark.parametrize("cols", [301, 2083])
@pytest.mark.parametrize("name", list(FLOAT_TYPES))
def test_float_prefill_tiles_match_decode(name, cols, isa):
    """Float-weight prefill (row panels, 2-row x 3-token tiles over column chunks and token blocks, an odd
    last row, leftover tokens, a column tail) gives each token decode's bits."""
    rng = np.random.default_rng([cols, len(name)])
    rows, ntok = 37, 101
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if name == "BF16":
        raw = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    else:
        raw = np.ascontiguousarray(w.astype(FLOAT_TYPES[name][1])).view(np.uint8).reshape(rows, -1)
    x = rng.standard_normal((ntok, cols)).astype(np.float32)
    whole = _core.matmul(FLOAT_TYPES[name][0], raw, cols, x)
    one = [
        _core.matmul(FLOAT_TYPES[name][0], raw, cols, np.ascontiguousarray(x[t : t + 1])) for t in range(ntok)
    ]
    np.testing.assert_array_equal(np.concatenate(one), whole)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["Q4_K", "IQ2_XS", "Q8_0", "Q6_K", "IQ4_NL", "Q2_0"]),
    rows=st.integers(1, 40),
    nblocks=st.integers(1, 6),
    ntok=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_shapes_property(name, rows, nblocks, ntok, seed):
    qk, _ = type_size(name)
    _check_quant(name, rows, qk * nblocks, ntok, np.random.default_rng(seed), exact_acts=True)


def test_isas_agree_to_float_rounding():
    if len(ISAS) < 2:
        pytest.skip("only the scalar kernels exist on this machine")
    rng = np.random.default_rng(7)
    wq = random_matrix("Q4_K", 64, 1024, rng)
    x = rng.standard_normal((5, 1024)).astype(np.float32)
    ys = {}
    before = _core.isa()
    for isa_name in ISAS:
        _core.set_isa(isa_name)
        ys[isa_name] = _core.matmul(TYPE_IDS["Q4_K"], wq, 1024, x)
    _core.set_isa(before)
    base = ys["scalar"].astype(np.float64)
    for y in ys.values():
        np.testing.assert_allclose(y, base, rtol=0, atol=1e-4 * np.abs(base).max())


@pytest.mark.parametrize("fast", ["avxvnni", "avx512"])
@pytest.mark.parametrize("name", QUANT_TYPES + list(FLOAT_TYPES))
def test_vnni_sets_equal_avx2_bit_for_bit(name, fast):
    """The AVX-VNNI and AVX-512 kernels compute AVX2's integers (with VNNI, and AVX-512's wider decoding and
    two-row tiles) and AVX2's float steps: every output equal, in decode (1-8 tokens) and prefill."""
    if fast not in ISAS:
        pytest.skip(f"this CPU (or build) has no {fast} kernels (available: {', '.join(ISAS)})")
    rng = np.random.default_rng([len(name), 11])
    cols = 1024
    raw, type_id = _weights(name, 19, cols, rng)
    before = _core.isa()
    try:
        for ntok in (1, 3, 8, 21):
            x = rng.standard_normal((ntok, cols)).astype(np.float32)
            ys = {}
            for isa_name in ("avx2", fast):
                _core.set_isa(isa_name)
                ys[isa_name] = _core.matmul(type_id, raw, cols, x)
            np.testing.assert_array_equal(ys[fast], ys["avx2"], err_msg=f"{name}, {ntok} tokens")
    finally:
        _core.set_isa(before)


def test_matmul_rejects_bad_shapes():
    wq = random_matrix("Q4_K", 4, 256, np.random.default_rng(0))
    with pytest.raises(ValueError):
        _core.matmul(TYPE_IDS["Q4_K"], wq, 512, np.zeros((1, 512), np.float32))
    with pytest.raises(ValueError):
        _core.matmul(TYPE_IDS["Q4_K"], wq, 256, np.zeros((1, 255), np.float32))
    with pytest.raises(ValueError):
        _core.matmul(999, wq, 256, np.zeros((1, 256), np.float32))


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_exact_activations_match_dequantize_float64(name, isa):
    """Exact mode: rows dequantized to f32, float activations; only float rounding remains."""
    qk, _ = type_size(name)
    rng = np.random.default_rng([TYPE_IDS[name], 3])
    rows, cols = 5, max(qk, 256)
    wq = random_matrix(name, rows, cols, rng)
    w = reference(wq, name).astype(np.float64)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        y = _core.matmul(TYPE_IDS[name], wq, cols, x)
    finally:
        _core.set_exact_activations(before)
    ref = x.astype(np.float64) @ w.T
    bound = (cols / 8 + 8) * EPS32 * (np.abs(x.astype(np.float64)) @ np.abs(w).T)
    assert np.all(np.abs(y - ref) <= bound)
