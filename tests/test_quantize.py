"""Reference quantizers (csrc/core/quantize.cpp) against gguf-py and against bounds derived from each format.

Oracles: gguf.quants.quantize for bytes (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); gguf.quants.dequantize to
decode everything else except Q2_0 (not in gguf 0.19), which is decoded and re-derived here from upstream's
definition. Error bounds use FP16_ERR: rounding v to fp16 moves it by at most max(2^-11 |v|, 2^-25)
(half an ulp; 2^-25 is half the subnormal spacing), and F32_TOL covers float32 rounding of the decode.
"""

from __future__ import annotations

import warnings

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from regolith import _core
from regolith.errors import RegolithError
from regolith.quant import quantize

GGUF_EXACT = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
FAST = settings(max_examples=100, deadline=None)
RNG = np.random.default_rng(1234)


def fp16_err(v: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(v) * 2.0**-11, 2.0**-25)


def f32_tol(*mags: np.ndarray) -> np.ndarray:
    return 4 * 2.0**-23 * sum(np.abs(m) for m in mags)


def gguf_quantize(x: np.ndarray, name: str) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return gguf.quants.quantize(x, GT[name]).view(np.uint8).reshape(*x.shape[:-1], -1)


def deq(q: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(q, GT[name]).reshape(-1)


def blocks_f16(q: np.ndarray, nbytes: int, at: int) -> np.ndarray:
    b = q.reshape(-1, nbytes)
    return b[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(-1)


# ---- byte identity with gguf-py ------------------------------------------------------------------------


def edge_rows() -> np.ndarray:
    """64-element rows (two 32-blocks each) covering the cases where rounding and casting rules show."""
    f = np.float32
    rows = [
        RNG.standard_normal(64) * 0.02,
        np.zeros(64),
        np.r_[np.full(32, -0.0), -0.0, 0.5, np.full(30, -0.0)],  # -0 as min and max
        np.full(64, -3.25),
        np.full(64, 7.0),
        np.r_[-3.0, 3.0, RNG.uniform(-3, 3, 62)],  # tie |max| = |min|, first one negative
        np.r_[3.0, -3.0, RNG.uniform(-3, 3, 62)],
        -np.abs(RNG.standard_normal(64)),  # negative max
        RNG.standard_normal(64) * 1e-40,  # subnormal inputs: inf reciprocal scales
        RNG.standard_normal(64) * 1e-30,
        np.r_[1e-45, np.zeros(63)],
        RNG.standard_normal(64) * 7e4,  # scales near/over the fp16 limit
        np.arange(64) * 0.5 - 16,  # exact .5 ties after scaling
        np.r_[np.inf, RNG.standard_normal(63)],
        np.r_[RNG.standard_normal(40), -np.inf, RNG.standard_normal(23)],
        np.r_[RNG.standard_normal(10), np.nan, RNG.standard_normal(53)],
        np.full(64, np.nan),
        np.r_[1e30, -1e30, RNG.standard_normal(62)],  # max - min overflows to inf
        RNG.standard_normal(64) * np.exp(RNG.uniform(-20, 20, 64)),
    ]
    return np.stack([np.asarray(r, dtype=f) for r in rows])


@pytest.mark.parametrize("name", GGUF_EXACT)
def test_quantize_matches_gguf(name: str) -> None:
    x = edge_rows()
    np.testing.assert_array_equal(quantize(x, name), gguf_quantize(x, name))


@pytest.mark.parametrize("name", GGUF_EXACT)
def test_quantize_matches_gguf_random_rows(name: str) -> None:
    x = (RNG.standard_normal((5, 3, 256)) * np.exp(RNG.uniform(-6, 6, (5, 3, 1)))).astype(np.float32)
    got = quantize(x, name)
    assert got.shape == gguf_quantize(x, name).shape
    np.testing.assert_array_equal(got, gguf_quantize(x, name))


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_fp_conversion_matches_gguf_over_bit_patterns(name: str) -> None:
    # every exponent, signaling and quiet NaN payloads, subnormals, the fp16 overflow boundary
    bits = RNG.integers(0, 2**32, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [
            0x7F800001,
            0xFF800123,
            0x7FC00001,
            0x477FEFFF,
            0x477FF000,
            0x33000000,
            0x33000001,
            0x387FC000,
            0x387FE000,
            0x00000001,
            0x80000000,
        ],
        dtype=np.uint32,
    )
    x = np.r_[bits, special].view(np.float32).reshape(1, -1)
    np.testing.assert_array_equal(quantize(x, name), gguf_quantize(x, name))


@given(hnp.arrays(np.float32, 64, elements=st.floats(width=32, allow_nan=False)))
@FAST
def test_quantize_matches_gguf_hypothesis(x: np.ndarray) -> None:
    # numpy's min/max pick between +0 and -0 by SIMD lane order (machine-dependent); keep one zero sign
    x = np.where(x == 0, np.float32(0), x)
    for name in GGUF_EXACT:
        np.testing.assert_array_equal(quantize(x, name), gguf_quantize(x, name), err_msg=name)


# ---- round-trip bounds for the legacy types (codes rounded against the fp32 scale, stored fp16) ---------


def bounded_rows(n: int) -> np.ndarray:
    """Rows whose scales stay in fp16 range: random block scales 1e-6..1e3, plus zero and constant rows."""
    x = RNG.standard_normal((6, n)) * np.exp(RNG.uniform(np.log(1e-6), np.log(1e3), (6, 1)))
    x[1] = 0
    x[2] = -0.3
    x[3] = np.exp(RNG.uniform(-12, 6, n)) * RNG.choice([-1, 1], n)  # huge dynamic range within blocks
    return x.astype(np.float32)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q5_0"])
def test_symmetric_round_trip_error_bound(name: str) -> None:
    # Q8_0: q = round(x/d), |x - d q| <= |d|/2. Q4_0/Q5_0: d = max/-2^(b-1) puts the max at code 0; the other
    # sign reaches +2^(b-1) |d| but the top code is 2^(b-1)-1, so one side clips by a full step: |x - d q| <= |d|.
    # The stored D = fp16(d) moves d*q by |d - D| |q| <= fp16_err(D) * qmax.
    qk, nbytes, qmax, step = {
        "Q8_0": (32, 34, 127, 0.5),
        "Q4_0": (32, 18, 8, 1.0),
        "Q5_0": (32, 22, 16, 1.0),
    }[name]
    x = bounded_rows(256)
    q = quantize(x, name)
    D = np.repeat(np.abs(blocks_f16(q, nbytes, 0)), qk)
    x = x.reshape(-1)
    bound = step * (D + fp16_err(D)) + fp16_err(D) * qmax + f32_tol(x)
    assert np.all(np.abs(x - deq(q, name)) <= bound)


@pytest.mark.parametrize("name", ["Q4_1", "Q5_1"])
def test_affine_round_trip_error_bound(name: str) -> None:
    # q = trunc((x - min)/d + 0.5) is round-half-up onto min + d*[0, 2^b-1]: |x - (min + d q)| <= d/2; storing
    # D = fp16(d) and M = fp16(min) moves the grid point by <= fp16_err(D) * qmax + fp16_err(M).
    nbytes, qmax = {"Q4_1": (20, 15), "Q5_1": (24, 31)}[name]
    x = bounded_rows(256)
    q = quantize(x, name)
    D = np.repeat(blocks_f16(q, nbytes, 0), 32)
    M = np.repeat(blocks_f16(q, nbytes, 2), 32)
    x = x.reshape(-1)
    bound = (D + fp16_err(D)) / 2 + fp16_err(D) * qmax + fp16_err(M) + f32_tol(x, M, D * qmax)
    assert np.all(np.abs(x - deq(q, name)) <= bound)


# ---- K-quants and IQ4_NL: bounds from the decoded grid ------------------------------------------------


def q4_k_grid(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-element (step D_j = d*sc_j, offset M_j = dmin*m_j) of the 8 sub-blocks of each Q4_K block."""
    b = q.reshape(-1, 144)
    d, dmin = blocks_f16(q, 144, 0)[:, None], blocks_f16(q, 144, 2)[:, None]
    s = b[:, 4:16].astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return np.repeat(d * sc, 32, axis=1).reshape(-1), np.repeat(dmin * mn, 32, axis=1).reshape(-1)


def q6_k_step(q: np.ndarray) -> np.ndarray:
    b = q.reshape(-1, 210)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    return np.repeat(blocks_f16(q, 210, 208)[:, None] * sc, 16, axis=1).reshape(-1)


def outside(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.maximum(lo - x, 0) + np.maximum(x - hi, 0)


def check_q4_k(x: np.ndarray) -> None:
    # The last pass re-rounds every code against the scales as stored: q = clamp(round((x + M)/D), 0, 15).
    # So x inside the decoded grid [-M, -M + 15 D] is within D/2 of its value, and x outside is decoded to the
    # nearest end. (How far outside can be is the scale search's choice, not the format's; see the RMSE test.)
    q = quantize(x, "Q4_K")
    x = x.reshape(-1)
    D, M = q4_k_grid(q)
    err = np.abs(x - deq(q, "Q4_K"))
    assert np.all(err <= D / 2 + outside(x, -M, -M + 15 * D) + f32_tol(x, M, 15 * D))


def check_q6_k(x: np.ndarray) -> None:
    # Same re-rounding: q = clamp(round(x/D), -32, 31) on the grid D*[-32, 31].
    q = quantize(x, "Q6_K")
    x = x.reshape(-1)
    D = q6_k_step(q)
    lo, hi = np.minimum(-32 * D, 31 * D), np.maximum(-32 * D, 31 * D)
    err = np.abs(x - deq(q, "Q6_K"))
    assert np.all(err <= np.abs(D) / 2 + outside(x, lo, hi) + f32_tol(x, 32 * D))


IQ4NL_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32
)


def check_iq4_nl(x: np.ndarray) -> None:
    # Codes are the nearest table entries to x/d for the fp32 scale d; D = fp16(d) is stored. Against the stored
    # grid D*values the chosen entry is at most 2 * 127 * |d - D| worse than the nearest one.
    q = quantize(x, "IQ4_NL")
    x = x.reshape(-1)
    D = np.repeat(blocks_f16(q, 18, 0), 32)
    nearest = np.min(np.abs(x[:, None] - D[:, None] * IQ4NL_VALUES[None, :]), axis=1)
    err = np.abs(x - deq(q, "IQ4_NL"))
    assert np.all(err <= nearest + 2 * 127 * fp16_err(D) + f32_tol(x, 127 * D))


@pytest.mark.parametrize("check", [check_q4_k, check_q6_k, check_iq4_nl], ids=["Q4_K", "Q6_K", "IQ4_NL"])
def test_kquant_round_trip_error_bound(check) -> None:
    check(bounded_rows(512))


def test_q4_k_round_trip_error_bound() -> None:
    check_q4_k((RNG.standard_t(2, (4, 1024)) * 0.05).astype(np.float32))


def rows_strategy(qk: int):
    @st.composite
    def rows(draw) -> np.ndarray:
        nrows, nblocks = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        kind = draw(st.sampled_from(["gauss", "constant", "zero", "range", "sparse"]))
        scale = 10.0 ** draw(st.floats(-6, 3))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        shape = (nrows, nblocks * qk)
        if kind == "gauss":
            x = rng.standard_normal(shape) * scale
        elif kind == "constant":
            x = np.full(shape, draw(st.sampled_from([-1.0, 1.0])) * scale)
        elif kind == "zero":
            x = np.zeros(shape)
        elif kind == "range":
            x = rng.choice([-1, 1], shape) * np.exp(rng.uniform(-14, 0, shape)) * scale
        else:
            x = np.where(rng.uniform(size=shape) < 0.1, rng.standard_normal(shape) * scale, 0.0)
        return x.astype(np.float32)

    return rows()


@given(rows_strategy(256))
@FAST
def test_q4_k_q6_k_round_trip_error_bound_hypothesis(x: np.ndarray) -> None:
    check_q4_k(x)
    check_q6_k(x)


@given(rows_strategy(32))
@FAST
def test_iq4_nl_round_trip_error_bound_hypothesis(x: np.ndarray) -> None:
    check_iq4_nl(x)


def rel_rmse(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x - y) ** 2) / np.mean(x**2)))


def test_rmse_beats_naive_baselines() -> None:
    # Gaussian and heavy-tailed weights. Baselines store fewer constraints or more bits:
    # Q4_K (4.5 bpw, 6-bit sub-scales) vs gguf's min/max Q4_1 (5 bpw, fp16 scale and min per 32);
    # IQ4_NL vs gguf's absmax Q4_0 (both 4.5 bpw); Q6_K vs absmax/31 6-bit rounding with exact fp32 scales per 16.
    for x in [RNG.standard_normal((8, 1024)), RNG.standard_t(3, (8, 1024))]:
        x = (x * 0.02).astype(np.float32)
        r = {n: rel_rmse(x.reshape(-1), deq(quantize(x, n), n)) for n in ["Q4_K", "Q6_K", "IQ4_NL"]}
        q4_1 = rel_rmse(x.reshape(-1), deq(quantize(x, "Q4_1"), "Q4_1"))
        q4_0 = rel_rmse(x.reshape(-1), deq(quantize(x, "Q4_0"), "Q4_0"))
        b = x.reshape(-1, 16)
        d = np.abs(b).max(axis=1, keepdims=True) / 31
        naive6 = rel_rmse(b, np.clip(np.round(b / d), -32, 31) * d)
        assert r["Q4_K"] < q4_1
        assert r["IQ4_NL"] < 0.95 * q4_0
        assert r["Q6_K"] < naive6


# ---- Q2_0 (upstream ggml type 42; gguf 0.19 has no codec) -----------------------------------------------


def q2_0_reference(x: np.ndarray) -> np.ndarray:
    """upstream quantize_row_q2_0_ref: d = max|x|, code = clamp(roundf(x/d) + 1, 0, 3), LSB-first 2-bit.

    For subnormal d, 1/d is inf and x/d is +-inf or NaN; C's (int) cast of those is INT_MIN on x86: code 0.
    """
    b = x.reshape(-1, 64)
    d = np.abs(b).max(axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        v = b * inv
        r = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))  # roundf: half away from zero
        c = np.where(np.isfinite(r), np.clip(r + 1, 0, 3), 0).astype(np.uint8).reshape(-1, 16, 4)
        d16 = d.astype(np.float16)
    qs = c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)
    return np.concatenate([d16.view(np.uint8), qs], axis=1).reshape(-1)


def q2_0_dequantize(q: np.ndarray) -> np.ndarray:
    b = q.reshape(-1, 18)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    c = (b[:, 2:, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    return (d * (c.reshape(-1, 64).astype(np.float32) - 1)).reshape(-1)


def test_q2_0_matches_upstream_reference() -> None:
    finite = edge_rows()[:12]  # Q2_0 rejects inf/NaN
    for x in [bounded_rows(128), finite]:
        np.testing.assert_array_equal(quantize(x, "Q2_0").reshape(-1), q2_0_reference(x))


def test_q2_0_round_trip_error_bound() -> None:
    # |x/d| <= 1, so codes 0..2 hold round(x/d) exactly: |x - d (c - 1)| <= d/2, plus |d - D| for D = fp16(d).
    x = bounded_rows(256)
    q = quantize(x, "Q2_0")
    D = np.repeat(blocks_f16(q, 18, 0), 64)
    x, y = x.reshape(-1), q2_0_dequantize(q)
    assert np.all(np.abs(x - y) <= (D + fp16_err(D)) / 2 + fp16_err(D) + f32_tol(x))
    qs = q.reshape(-1, 18)[:, 2:]
    assert not np.any(qs & (qs >> 1) & 0x55)  # the reference never emits code 3 (+2d)


# ---- API ------------------------------------------------------------------------------------------------


def test_quantize_shapes_and_names() -> None:
    x = RNG.standard_normal((2, 3, 256)).astype(np.float32)
    assert quantize(x, "q4_k").shape == (2, 3, 144)
    np.testing.assert_array_equal(quantize(x, int(GT.Q6_K)), quantize(x.astype(np.float64), "Q6_K"))
    np.testing.assert_array_equal(quantize(x[:, :, ::2].copy(), "Q8_0"), quantize(x[:, :, ::2], "Q8_0"))
    assert quantize(x, "F32").dtype == np.float32


def test_quantize_rejects_bad_input() -> None:
    x = np.zeros(256, np.float32)
    with pytest.raises(RegolithError, match="block size"):
        quantize(x[:100], "Q4_0")
    with pytest.raises(RegolithError, match="not supported"):
        quantize(x, "Q3_K")
    with pytest.raises(RegolithError, match="unknown"):
        quantize(x, "Q9_9")
    for bad in [x.astype(np.float64), np.zeros(512, np.float32)[::2], x.reshape(2, 128)]:
        with pytest.raises(TypeError):
            _core.quantize(int(GT.Q8_0), bad)  # the binding takes only 1-D C-contiguous float32
    for name in ["Q4_K", "Q6_K", "IQ4_NL", "Q2_0"]:
        y = x.copy()
        y[7] = np.nan
        with pytest.raises(RegolithError, match="non-finite"):
            quantize(y, name)
