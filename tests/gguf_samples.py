"""Small GGUF files for the reader tests, written with gguf-py's GGUFWriter (the oracle writer)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType

# (key, value, type, array sub-type): one of every metadata value type, arrays of each, nested arrays.
ALL_VALUE_KVS: list[tuple[str, Any, VT, VT | None]] = [
    ("t.u8", 255, VT.UINT8, None),
    ("t.i8", -128, VT.INT8, None),
    ("t.u16", 65535, VT.UINT16, None),
    ("t.i16", -32768, VT.INT16, None),
    ("t.u32", 4294967295, VT.UINT32, None),
    ("t.i32", -2147483648, VT.INT32, None),
    ("t.f32", 0.1, VT.FLOAT32, None),
    ("t.bool_true", True, VT.BOOL, None),
    ("t.bool_false", False, VT.BOOL, None),
    ("t.str", "héllo wörld ✓ 🚀", VT.STRING, None),
    ("t.str_empty", "", VT.STRING, None),
    ("t.u64", 2**64 - 1, VT.UINT64, None),
    ("t.i64", -(2**63), VT.INT64, None),
    ("t.f64", 1e300, VT.FLOAT64, None),
    ("a.u8", [0, 1, 255], VT.ARRAY, VT.UINT8),
    ("a.i8", [-128, 0, 127], VT.ARRAY, VT.INT8),
    ("a.u16", [0, 65535], VT.ARRAY, VT.UINT16),
    ("a.i16", [-32768, 32767], VT.ARRAY, VT.INT16),
    ("a.u32", [0, 4294967295], VT.ARRAY, VT.UINT32),
    ("a.i32", [-2147483648, 7], VT.ARRAY, VT.INT32),
    ("a.f32", [0.5, -1.25, 3.0e38], VT.ARRAY, VT.FLOAT32),
    ("a.bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("a.str", ["", "a", "ünï", "<0x0A>"], VT.ARRAY, VT.STRING),
    ("a.u64", [0, 2**64 - 1], VT.ARRAY, VT.UINT64),
    ("a.i64", [-(2**63), 2**63 - 1], VT.ARRAY, VT.INT64),
    ("a.f64", [1e-300, -2.5], VT.ARRAY, VT.FLOAT64),
    ("a.nested", [[1, 2, 3], ["x", "yz"], [[True], [False, True]], [[[0.5]]]], VT.ARRAY, None),
]


def expected_value(value: Any, vtype: VT, sub_type: VT | None = None) -> Any:
    """What a reader should return for a written value (float32 values are rounded to float32)."""
    if vtype == VT.FLOAT32:
        return float(np.float32(value))
    if vtype == VT.ARRAY:
        if sub_type is None:
            return [
                expected_value(v, VT.ARRAY) if isinstance(v, list) else expected_value(v, VT.get_type(v))
                for v in value
            ]
        return [expected_value(v, sub_type) for v in value]
    return value


def write_gguf(
    path: Path,
    kvs: list[tuple[str, Any, VT, VT | None]] = (),
    tensors: list[tuple[str, np.ndarray, QT | None]] = (),
    arch: str = "llama",
) -> Path:
    """Write a GGUF v3 file; tensors are (name, data, raw_dtype) with data in numpy order."""
    w = gguf.GGUFWriter(path, arch)
    for key, value, vtype, sub_type in kvs:
        if key == "general.alignment" and vtype == VT.UINT32 and value > 0 and value & (value - 1) == 0:
            w.add_custom_alignment(value)
        else:
            w.add_key_value(key, value, vtype, sub_type)
    for name, data, raw_dtype in tensors:
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def q8_0_bytes(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q8_0 data for a (rows, cols) tensor, as (rows, row_bytes) uint8 with finite scales."""
    rng = np.random.default_rng(seed)
    return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), QT.Q8_0)


def sample_file(path: Path) -> Path:
    """A small model-like file: a few metadata types and three tensors ending exactly at EOF."""
    kvs = [
        ("general.name", "tiny", VT.STRING, None),
        ("llama.block_count", 2, VT.UINT32, None),
        ("llama.context_length", 128, VT.UINT32, None),
        ("llama.rope.freq_base", 10000.0, VT.FLOAT32, None),
        ("llama.use_bias", True, VT.BOOL, None),
        ("tokenizer.ggml.model", "gpt2", VT.STRING, None),
        ("tokenizer.ggml.tokens", ["<s>", "a", "b", "c"], VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0], VT.ARRAY, VT.FLOAT32),
        ("x.nested", [[1, 2], ["p", "q"]], VT.ARRAY, None),
        ("x.key_a", 1, VT.UINT8, None),
        ("x.key_b", 2, VT.UINT8, None),
    ]
    rng = np.random.default_rng(1)
    tensors = [
        ("blk.0.ffn_up.weight", q8_0_bytes(2, 64), QT.Q8_0),
        ("blk.0.attn_norm.weight", rng.standard_normal(16).astype(np.float16), None),
        ("token_embd.weight", rng.standard_normal((4, 8)).astype(np.float32), None),  # 128 B: no tail pad
    ]
    return write_gguf(path, kvs, tensors)


def field_pos(data: bytes, marker: bytes) -> int:
    """Offset of the byte just after the only occurrence of `marker` (a key or tensor name) in the header."""
    pos = data.find(marker)
    assert pos >= 0 and data.find(marker, pos + 1) < 0, f"marker {marker!r} not unique"
    return pos + len(marker)


def tensor_fields(data: bytes, name: str) -> dict[str, int]:
    """Offsets of a tensor info's fields: n_dims, dims (first), type, offset."""
    p = field_pos(data, struct.pack("<Q", len(name)) + name.encode())
    (n_dims,) = struct.unpack_from("<I", data, p)
    return {"n_dims": p, "dims": p + 4, "type": p + 4 + 8 * n_dims, "offset": p + 4 + 8 * n_dims + 4}
