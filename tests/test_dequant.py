"""regolith.quant.dequantize vs gguf-py's numpy dequantizers (and our references where gguf has none).

Comparisons are bit-exact: float32 bit patterns must be identical, -0.0 vs +0.0 included. The one exception is
NaN: when a stored scale is inf or NaN, the outputs must be NaN in the same places, but the NaN's sign and
payload may differ. Two reasons: (1) Q4_K/Q5_K compute d*q - dm in gguf and scale*q + bias with
bias = -(dm) in our decoder contract, which is the same float for every non-NaN dm but flips the sign of a
NaN; (2) the sign/payload of a NaN produced by arithmetic is not something numpy specifies.
Q8_K, Q1_0 and Q2_0 have no gguf-py 0.19 numpy class; they are checked against independent numpy
references written from the format spec (see /work/notes/q2_0.md for Q1_0/Q2_0).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants
from hypothesis import given, settings
from hypothesis import strategies as st

from regolith import RegolithError, _core
from regolith.quant import TYPE_IDS, dequantize, type_size
from tests.quant_data import (
    FP16_FIELDS,
    GGUF_TYPES,
    OWN_REF_TYPES,
    QUANT_TYPES,
    random_blocks,
    reference,
    set_fp16,
    special_blocks,
)

ROOT = Path(__file__).resolve().parent.parent


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    bad = got.view(np.uint32) != want.view(np.uint32)
    if bad.any():
        i = np.flatnonzero(bad.reshape(-1))[:5]
        raise AssertionError(
            f"{bad.sum()} of {bad.size} differ, first at flat index {i}: "
            f"got {got.reshape(-1)[i]!r} want {want.reshape(-1)[i]!r}"
        )


def assert_equal_up_to_nan_payload(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert_bits_equal(np.where(nan, np.float32(0), got), np.where(nan, np.float32(0), want))


# ---- tests ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GGUF_TYPES)
def test_dequantize_matches_gguf(name: str) -> None:
    rng = np.random.default_rng(TYPE_IDS[name])
    data = np.concatenate([random_blocks(name, 256, rng), special_blocks(name, rng)])
    assert_bits_equal(dequantize(data, name), reference(data, name))


PART_TYPES = [t for t in QUANT_TYPES if TYPE_IDS[t] in _core.part_decoded_types()]


def test_the_gpu_hot_types_decode_in_parts() -> None:
    # the CUDA products give a block's 32-element parts to separate lanes for these (others: a block a lane)
    hot = {"IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ1_M", "IQ4_XS", "Q2_0", "Q4_K", "Q6_K"}
    assert hot <= set(PART_TYPES)


@pytest.mark.parametrize("name", PART_TYPES)
def test_dequantize_by_parts_matches_reference(name: str) -> None:
    rng = np.random.default_rng(2000 + TYPE_IDS[name])
    data = np.concatenate([random_blocks(name, 256, rng), special_blocks(name, rng)])
    got = _core.dequantize_parts(TYPE_IDS[name], data.reshape(-1), data.shape[0] * type_size(name)[0])
    assert_bits_equal(got.reshape(data.shape[0], -1), reference(data, name))


def test_dequantize_by_parts_refuses_a_type_without_parts() -> None:
    assert TYPE_IDS["Q8_0"] not in _core.part_decoded_types()  # one 32-element block: the block is the part
    with pytest.raises(RegolithError, match="no 32-element part decoder"):
        _core.dequantize_parts(TYPE_IDS["Q8_0"], np.zeros(34, np.uint8), 32)


@pytest.mark.parametrize("name", OWN_REF_TYPES)
def test_dequantize_matches_spec_reference(name: str) -> None:
    rng = np.random.default_rng(TYPE_IDS[name])
    data = np.concatenate([random_blocks(name, 256, rng), special_blocks(name, rng)])
    assert_bits_equal(dequantize(data, name), reference(data, name))


def test_q2_0_and_q1_0_spec_examples() -> None:
    # Q2_0: codes {0,1,2,3} -> {-1,0,+1,+2} * d, element j at bits 2*(j%4) of qs[j/4]
    b = np.zeros(18, np.uint8)
    b[:2] = np.array([2.0], np.float16).view(np.uint8)
    b[2] = 0b11_10_01_00
    got = dequantize(b, "Q2_0")
    assert got[:5].tolist() == [-2.0, 0.0, 2.0, 4.0, -2.0]
    # Q1_0: bit 1 -> +d, bit 0 -> -d, LSB first
    b = np.zeros(18, np.uint8)
    b[:2] = np.array([0.5], np.float16).view(np.uint8)
    b[2] = 0b0000_0101
    assert dequantize(b, "Q1_0")[:4].tolist() == [0.5, -0.5, 0.5, -0.5]


@pytest.mark.parametrize("name", [t for t in QUANT_TYPES if FP16_FIELDS[t] or t == "IQ1_M"])
def test_nonfinite_scales_match_reference_up_to_nan_payload(name: str) -> None:
    rng = np.random.default_rng(1000 + TYPE_IDS[name])
    data = random_blocks(name, 64, rng)
    set_fp16(data, name, rng.choice(np.array([0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01], np.uint16), 64))
    assert_equal_up_to_nan_payload(dequantize(data, name), reference(data, name))


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_plain_types_match_gguf(name: str) -> None:
    # every bit pattern of the 16-bit types, random float32 words (NaN payloads: see module docstring)
    n = 1 << 16 if name != "F32" else 1 << 14
    rng = np.random.default_rng(7)
    raw = np.arange(n, dtype=np.uint16) if name != "F32" else rng.integers(0, 1 << 32, n, dtype=np.uint32)
    data = raw.view(np.uint8).reshape(4, -1)
    assert_equal_up_to_nan_payload(
        dequantize(data, name), gguf_quants.dequantize(data, GGMLQuantizationType[name])
    )


def test_block_sizes_match_gguf_quant_sizes() -> None:
    checked = 0
    for qtype, (elems, nbytes) in GGML_QUANT_SIZES.items():
        if qtype.name in TYPE_IDS:
            assert TYPE_IDS[qtype.name] == int(qtype)
            assert type_size(qtype.name) == (elems, nbytes), qtype.name
            checked += 1
    assert checked >= len(QUANT_TYPES) - 1  # all but Q2_0, which gguf-py 0.19 predates
    assert type_size("Q2_0") == (64, 18)  # upstream ggml: {fp16 d; uint8 qs[16]}


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(QUANT_TYPES),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    n_blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_shapes_match_reference(name: str, lead: list[int], n_blocks: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    elems, nbytes = type_size(name)
    rows = int(np.prod(lead, dtype=np.int64))
    data = random_blocks(name, rows * n_blocks, rng).reshape(*lead, n_blocks * nbytes)
    got = dequantize(data, name)
    assert got.shape == (*lead, n_blocks * elems)
    assert_bits_equal(got, reference(data, name))


def test_dequantize_accepts_bytes_and_type_ids() -> None:
    rng = np.random.default_rng(3)
    data = random_blocks("Q4_K", 3, rng).reshape(-1)
    want = dequantize(data, "q4_k")
    assert_bits_equal(dequantize(data.tobytes(), int(GGMLQuantizationType.Q4_K)), want)
    assert dequantize(np.zeros((2, 0), np.uint8), "Q4_0").shape == (2, 0)


def test_dequantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="multiple"):
        dequantize(np.zeros(17, np.uint8), "Q4_0")
    with pytest.raises(RegolithError):
        dequantize(np.zeros(8, np.uint8), "I8")  # a known type without a decoder
    with pytest.raises(RegolithError):
        dequantize(np.zeros(40, np.uint8), 9)  # Q8_1: activation format, not stored in files
    with pytest.raises(RegolithError):
        dequantize(np.zeros(18, np.uint8), 4)  # removed id
    with pytest.raises(RegolithError):
        dequantize(np.zeros(18, np.uint8), "Q9_9")
    # the binding validates sizes itself
    with pytest.raises(ValueError, match="bytes"):
        _core.dequantize(TYPE_IDS["Q4_0"], np.zeros(17, np.uint8), 32)
    with pytest.raises(ValueError, match="multiple"):
        _core.dequantize(TYPE_IDS["Q4_0"], np.zeros(18, np.uint8), 31)
    with pytest.raises(ValueError, match="unknown"):
        _core.dequantize(1000, np.zeros(18, np.uint8), 32)
    with pytest.raises(RegolithError):
        _core.dequantize(TYPE_IDS["I8"], np.zeros(4, np.uint8), 4)
    with pytest.raises(TypeError):
        _core.dequantize(TYPE_IDS["Q4_0"], np.zeros((2, 18), np.uint8), 64)  # must be 1-D


def test_quant_tables_header_is_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("gen_quant_tables", ROOT / "tools" / "gen_quant_tables.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (ROOT / "csrc" / "core" / "quant_tables.h").read_text() == gen.generate()
