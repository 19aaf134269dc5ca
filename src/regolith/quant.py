"""Quantized tensor data: dequantize and quantize with the C++ reference implementations."""

from __future__ import annotations

import numpy as np

from . import _core
from .errors import RegolithError

__all__ = ["TYPE_IDS", "dequantize", "quantize", "type_name", "type_size"]

TYPE_IDS: dict[str, int] = {
    info[0]: i for i in range(_core.type_count()) if (info := _core.type_info(i)) is not None
}


def _type_id(qtype: int | str) -> int:
    if isinstance(qtype, str):
        try:
            return TYPE_IDS[qtype.upper()]
        except KeyError:
            raise RegolithError(f"unknown ggml type name {qtype!r}") from None
    if _core.type_info(int(qtype)) is None:
        raise RegolithError(f"unknown ggml type id {qtype}")
    return int(qtype)


def type_name(qtype: int | str) -> str:
    """ggml's name for a type id (or a name, normalised)."""
    return _core.type_info(_type_id(qtype))[0]


def type_size(qtype: int | str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a type."""
    _, elems, nbytes, _ = _core.type_info(_type_id(qtype))
    return elems, nbytes


def dequantize(data: np.ndarray | bytes, qtype: int | str) -> np.ndarray:
    """Decode GGUF tensor data of type ``qtype`` to float32, bit-exact with ``gguf.quants.dequantize``.

    ``data`` is viewed as bytes (``bytes`` is one row): shape ``(..., row_bytes)`` gives
    ``(..., row_bytes // block_bytes * block_elems)``. Raises ValueError when a row is not a whole number
    of blocks and RegolithError for types regolith cannot decode.
    """
    type_id = _type_id(qtype)
    arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    arr = np.ascontiguousarray(arr)
    if arr.ndim == 0:
        raise ValueError("dequantize needs at least one dimension (the row bytes)")
    arr = arr.view(np.uint8)
    elems, nbytes = type_size(type_id)
    row_bytes = arr.shape[-1]
    if row_bytes % nbytes != 0:
        raise ValueError(
            f"{type_name(type_id)}: bytes per row ({row_bytes}) is not a multiple of the block size {nbytes}"
        )
    out_shape = (*arr.shape[:-1], row_bytes // nbytes * elems)
    flat = arr.reshape(-1)
    out = _core.dequantize(type_id, flat, flat.size // nbytes * elems)
    return out.reshape(out_shape)


def quantize(data: np.ndarray, qtype: int | str) -> np.ndarray:
    """Quantize float rows to GGUF block bytes, like ``gguf.quants.quantize``.

    ``data`` has shape (..., n) and is converted to float32 first; n must be a multiple of the type's
    block size. Returns uint8 of shape (..., row_bytes). F32 returns the float32 data itself, as gguf does.
    F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are byte-identical to gguf's numpy quantizers; Q4_K, Q6_K,
    IQ4_NL and Q2_0 follow llama.cpp's reference quantizers and reject inf/NaN.
    """
    type_id = _type_id(qtype)
    rows = np.ascontiguousarray(data, dtype=np.float32)
    if type_id == TYPE_IDS["F32"]:
        return rows
    if not _core.can_quantize(type_id):
        raise RegolithError(f"quantizing to {type_name(type_id)} is not supported")
    if rows.ndim == 0:
        raise RegolithError("quantize needs an array of shape (..., n), got a scalar")
    elems, nbytes = type_size(type_id)
    n = rows.shape[-1]
    if n % elems:
        raise RegolithError(
            f"row length {n} is not a multiple of the {type_name(type_id)} block size {elems}; pad the rows"
        )
    # Blocks never straddle rows, so the rows quantize as one run of blocks.
    out = _core.quantize(type_id, rows.reshape(-1))
    return out.reshape(*rows.shape[:-1], n // elems * nbytes)
