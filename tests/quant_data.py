"""Random valid quantized blocks and reference dequantization for the kernel tests.

Random bytes are a valid block of every type once the float fields (the scales) hold finite values; the
references are the `gguf` package's numpy dequantizers, and for the types gguf 0.19 does not know yet
(Q1_0, Q2_0) a numpy transcription of the upstream ggml definition.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

Q1_0, Q2_0 = 41, 42
SIZES = {Q1_0: (128, 18), Q2_0: (64, 18)}

# Byte offsets of the fp16 scale fields inside one block (ggml layouts).
_F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
    "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64], "Q1_0": [0], "Q2_0": [0],
}

QUANT_TYPES = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_K", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0",
]


def type_id(name: str) -> int:
    return {"Q1_0": Q1_0, "Q2_0": Q2_0}.get(name) or GGMLQuantizationType[name].value


def block_size(name: str) -> tuple[int, int]:
    tid = type_id(name)
    return SIZES.get(tid) or GGML_QUANT_SIZES[GGMLQuantizationType(tid)]


def _random_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = np.exp2(rng.uniform(-8.0, 0.0, n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)


def random_blocks(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """uint8 array of shape (*shape[:-1], bytes for shape[-1] elements) holding random valid blocks."""
    qk, bs = block_size(name)
    assert shape[-1] % qk == 0
    n_blocks = int(np.prod(shape)) // qk
    blocks = rng.integers(0, 256, (n_blocks, bs), dtype=np.uint8)
    for off in _F16_FIELDS.get(name, []):
        blocks[:, off:off + 2] = _random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if name == "Q8_K":
        d = (np.exp2(rng.uniform(-8, 0, n_blocks)) * rng.choice([-1, 1], n_blocks)).astype(np.float32)
        blocks[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    elif name == "MXFP4":
        blocks[:, 0] = rng.integers(118, 131, n_blocks)  # E8M0 exponents 2^-9 .. 2^3
    elif name == "IQ1_M":
        # the fp16 super-block scale is the top nibble of each of the 4 uint16 scale words
        d = _random_f16(rng, n_blocks).view(np.uint16)
        sc = blocks[:, 48:56].copy().view(np.uint16).reshape(n_blocks, 4)
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8).reshape(n_blocks, 8)
    return blocks.reshape(*shape[:-1], shape[-1] // qk * bs)


def reference_dequantize(data: np.ndarray, name: str) -> np.ndarray:
    """float32 dequantization by the independent reference (gguf's numpy code, or the ggml definition)."""
    tid = type_id(name)
    if tid not in SIZES:
        return gguf_dequantize(data, GGMLQuantizationType(tid))
    qk, bs = SIZES[tid]
    rows = data.reshape(-1, bs)
    d = rows[:, :2].copy().view(np.float16).astype(np.float32)
    qs = rows[:, 2:]
    if tid == Q1_0:  # bit j of the block: +d if set, -d if clear (LSB first)
        bits = np.unpackbits(qs, axis=1, bitorder="little").astype(np.float32)
        vals = bits * 2.0 - 1.0
    else:  # Q2_0: 2-bit code c per element, LSB first, value (c - 1) * d
        codes = (qs[:, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
        vals = codes.reshape(len(rows), qk).astype(np.float32) - 1.0
    out = (d * vals).astype(np.float32)
    return out.reshape(*data.shape[:-1], data.shape[-1] // bs * qk)


def q8_exact_activations(ntok: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Activations that Q8 (32-element blocks, scale amax/127) represents exactly.

    Each 32-block is 2^e * k with integers |k| <= 127 and one |k| == 127, so amax/127 == 2^e exactly and
    quantizing loses nothing: a kernel's only error is then float rounding.
    """
    k = rng.integers(-127, 128, (ntok, cols // 32, 32))
    k[:, :, 0] = rng.choice([-127, 127], (ntok, cols // 32))
    perm = rng.permuted(np.tile(np.arange(32), (ntok, cols // 32, 1)), axis=2)
    k = np.take_along_axis(k, perm, axis=2)
    scale = np.exp2(rng.integers(-6, 3, (ntok, cols // 32, 1)))
    return (k * scale).reshape(ntok, cols).astype(np.float32)
