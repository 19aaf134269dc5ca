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
