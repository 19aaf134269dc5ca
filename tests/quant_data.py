"""Quantized test data shared by the dequantization and kernel tests and the kernel benchmark.

Random bytes are a valid block of every type once its float fields (the scales) are finite. The oracle is
the `gguf` package's numpy dequantizer; for the types gguf-py 0.19 lacks (Q8_K, Q1_0, Q2_0) it is an
independent numpy transcription of the format definition (see docs/formats.md).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from regolith import _core
from regolith.quant import type_size

# Byte offsets of fp16 scale fields inside a block (IQ1_M spreads its scale over nibbles; handled apart).
# fmt: off
FP16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
    "IQ1_M": (), "IQ4_NL": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,),
    "MXFP4": (), "NVFP4": (), "Q8_K": (), "Q1_0": (0,), "Q2_0": (0,),
}
GGUF_TYPES = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4",
]
# fmt: on
OWN_REF_TYPES = ["Q8_K", "Q1_0", "Q2_0"]
QUANT_TYPES = GGUF_TYPES + OWN_REF_TYPES
IQ1_M_SCALES = 48  # offset of the 4 uint16 scales whose top nibbles hold d


# ---- independent references ----------------------------------------------------------------------------
def _ref_q8_k(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, :4].copy().view(np.float32)
    qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return d * qs


def _ref_q1_0(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    bits = np.unpackbits(blocks[:, 2:18], axis=-1, bitorder="little")  # element j: bit j%8 of qs[j/8]
    return np.where(bits == 1, d, -d).astype(np.float32)


def _ref_q2_0(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    j = np.arange(64)
    codes = (blocks[:, 2 + j // 4] >> (2 * (j % 4)).astype(np.uint8)) & np.uint8(3)
    return (codes.astype(np.int8) - np.int8(1)).astype(np.float32) * d


OWN_REFS = {"Q8_K": _ref_q8_k, "Q1_0": _ref_q1_0, "Q2_0": _ref_q2_0}


def reference(data: np.ndarray, name: str) -> np.ndarray:
    """The oracle: gguf.quants.dequantize, or our spec reference for types gguf-py lacks."""
    if name in OWN_REFS:
        elems, nbytes = type_size(name)
        blocks = data.reshape(-1, nbytes)
        with np.errstate(all="ignore"):
            out = OWN_REFS[name](blocks)
        return out.reshape(*data.shape[:-1], data.shape[-1] // nbytes * elems)
    with np.errstate(all="ignore"):
        return gguf_quants.dequantize(data, GGMLQuantizationType[name])


# ---- block generators ----------------------------------------------------------------------------------
def set_fp16(blocks: np.ndarray, name: str, value: np.ndarray | int) -> None:
    """Write fp16 bit patterns into every scale field of each block."""
    v = np.broadcast_to(np.asarray(value, dtype=np.uint16), (blocks.shape[0],)).copy()
    for off in FP16_FIELDS[name]:
        blocks[:, off : off + 2] = v.view(np.uint8).reshape(-1, 2)
    if name == "IQ1_M":
        sc = blocks[:, IQ1_M_SCALES : IQ1_M_SCALES + 8].copy().view(np.uint16)
        for u in range(4):
            sc[:, u] = (sc[:, u] & np.uint16(0x0FFF)) | (
                ((v >> np.uint16(4 * u)) & np.uint16(0xF)) << np.uint16(12)
            )
        blocks[:, IQ1_M_SCALES : IQ1_M_SCALES + 8] = sc.view(np.uint8)
    if name == "Q8_K":  # float32 d: the fp16 value, widened
        blocks[:, :4] = v.view(np.float16).astype(np.float32).view(np.uint8).reshape(-1, 4)


def _finite_fp16(rng: np.random.Generator, n: int) -> np.ndarray:
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_nan = (h & np.uint16(0x7C00)) == np.uint16(0x7C00)
    return np.where(inf_nan, h & np.uint16(0xBFFF), h)  # clear the exponent's top bit: finite


def random_blocks(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n random valid blocks: random bytes with finite scale fields."""
    _, nbytes = type_size(name)
    blocks = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    set_fp16(blocks, name, _finite_fp16(rng, n))
    return blocks


def special_blocks(name: str, rng: np.random.Generator) -> np.ndarray:
    """Edge cases: zero and -0 scales, largest/smallest fp16 scales, all-zero and all-ones codes."""
    scales = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]
    out = []
    for fill in (None, 0x00, 0xFF, 0x55, 0xAA):
        for s in scales:
            b = random_blocks(name, 2, rng)
            if fill is not None:
                b[:] = fill
            set_fp16(b, name, s)
            out.append(b)
    return np.concatenate(out)


def random_matrix(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, row_bytes) of random blocks with moderate scales (2^-8 .. 1, either sign), for products
    whose float32 sums must not overflow."""
    elems, nbytes = type_size(name)
    n = rows * cols // elems
    blocks = random_blocks(name, n, rng)
    mag = np.exp2(rng.uniform(-8.0, 0.0, n)) * rng.choice([-1.0, 1.0], n)
    set_fp16(blocks, name, mag.astype(np.float16).view(np.uint16))
    if name == "MXFP4":
        blocks[:, 0] = rng.integers(118, 131, n)  # E8M0 exponents: scales 2^-9 .. 2^3
    return blocks.reshape(rows, cols // elems * nbytes)


def q8_exact_activations(ntok: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Activations that Q8 represents exactly, with 32-, 128- or 256-element blocks (scale amax/127).

    Each 32-block is 2^e * k with integers |k| <= 127 and one |k| == 127, and e is shared by each 256
    elements, so amax/127 == 2^e exactly for any of these block sizes and quantizing loses nothing: a kernel's
    only error is then float rounding.
    """
    k = rng.integers(-127, 128, (ntok, cols // 32, 32))
    k[:, :, 0] = rng.choice([-127, 127], (ntok, cols // 32))
    k = rng.permuted(k, axis=2)
    e = rng.integers(-6, 3, (ntok, -(-cols // 256)))
    scale = np.exp2(np.repeat(e, 8, axis=1)[:, : cols // 32, None])
    return (k * scale).reshape(ntok, cols).astype(np.float32)


def decomposition_magnitudes(
    type_id: int, wq: np.ndarray, rows: int, cols: int
) -> tuple[np.ndarray, np.ndarray]:
    """|scale*q| and |bias| per element (float64, (rows, cols)) of the kernels' integer decomposition."""
    q, scale, bias, g = _core.decode_blocks(type_id, np.ascontiguousarray(wq).reshape(-1), rows * cols)
    sq = np.abs(q.astype(np.float64) * np.repeat(scale.astype(np.float64), g))
    b = np.zeros_like(sq) if bias is None else np.abs(np.repeat(bias.astype(np.float64), g))
    return sq.reshape(rows, cols), b.reshape(rows, cols)
