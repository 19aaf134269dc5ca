"""Hand-made corruptions of GGUFWriter files: each must raise GGUFError naming the problem and its offset."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import regolith
from regolith import GGUFError
from tests.gguf_samples import VT, field_pos, sample_file, tensor_fields, write_gguf

Mutation = Callable[[bytearray], None]


def put(fmt: str, pos_of: Callable[[bytes], int], value: int | bytes) -> Mutation:
    def mutate(data: bytearray) -> None:
        struct.pack_into(fmt, data, pos_of(bytes(data)), value)

    return mutate


def at(pos: int) -> Callable[[bytes], int]:
    return lambda data: pos


def after(marker: bytes, skip: int = 0) -> Callable[[bytes], int]:
    """Position `skip` bytes after a key or name in the header."""
    return lambda data: field_pos(data, marker) + skip


def tensor_field(name: str, field: str, extra: int = 0) -> Callable[[bytes], int]:
    return lambda data: tensor_fields(data, name)[field] + extra


def add_to_offset(name: str, delta: int) -> Mutation:
    def mutate(data: bytearray) -> None:
        p = tensor_fields(bytes(data), name)["offset"]
        struct.pack_into("<Q", data, p, struct.unpack_from("<Q", data, p)[0] + delta)

    return mutate


EMB, NORM, FFN = "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ffn_up.weight"

# (id, mutation of sample_file's bytes, regex the message must match)
SAMPLE_CORRUPTIONS: list[tuple[str, Mutation, str]] = [
    ("bad_magic", put("4s", at(0), b"GGUX"), r"bad magic"),
    ("version_1", put("<I", at(4), 1), r"unsupported GGUF version 1\b"),
    ("version_4", put("<I", at(4), 4), r"unsupported GGUF version 4\b"),
    ("big_endian", put(">I", at(4), 3), r"big-endian"),
    ("huge_tensor_count", put("<Q", at(8), 2**60), r"tensor count \d+ cannot fit"),
    ("huge_kv_count", put("<Q", at(16), 2**64 - 1), r"metadata count \d+ cannot fit"),
    ("huge_key_length", put("<Q", at(24), 2**63), r"metadata key length \d+ runs past the end"),
    (
        "huge_string_length",
        put("<Q", after(b"general.name", 4), 2**64 - 1),
        r"string value length \d+ runs past",
    ),
    (
        "huge_string_array_count",
        put("<Q", after(b"tokenizer.ggml.tokens", 8), 2**62),
        r"array of 4611686018427387904 string elements runs past",
    ),
    (
        "huge_float_array_count",
        put("<Q", after(b"tokenizer.ggml.scores", 8), 2**61 + 1),
        r"array of \d+ float32 elements runs past",
    ),
    ("unknown_value_type", put("<I", after(b"llama.block_count"), 13), r"unknown metadata value type 13\b"),
    (
        "unknown_array_type",
        put("<I", after(b"tokenizer.ggml.tokens", 4), 99),
        r"unknown metadata value type 99\b",
    ),
    ("invalid_bool", put("<B", after(b"llama.use_bias", 4), 2), r"invalid bool value 2"),
    (
        "duplicate_key",
        put("7s", after(b"\x07\x00\x00\x00\x00\x00\x00\x00x.key_b", -7), b"x.key_a"),
        r"duplicate ",
    ),
    ("key_not_utf8", put("B", after(b"x.key_b", -1), 0xFF), r"metadata key is not valid UTF-8"),
    ("tensor_name_not_utf8", put("B", after(EMB.encode(), -1), 0xC0), r"tensor name is not valid UTF-8"),
    ("unknown_tensor_type", put("<I", tensor_field(EMB, "type"), 1000), r"unknown type id 1000"),
    ("removed_tensor_type", put("<I", tensor_field(EMB, "type"), 4), r"unknown type id 4\b"),
    ("n_dims_0", put("<I", tensor_field(EMB, "n_dims"), 0), r"has 0 dimensions \(must be 1\.\.4\)"),
    ("n_dims_5", put("<I", tensor_field(EMB, "n_dims"), 5), r"has 5 dimensions"),
    ("zero_dim", put("<Q", tensor_field(EMB, "dims", 8), 0), r"has a zero dimension"),
    (
        "dim_product_overflow",
        lambda d: (
            put("<Q", tensor_field(EMB, "dims"), 2**40)(d),
            put("<Q", tensor_field(EMB, "dims", 8), 2**40)(d),
        ),
        r"element count overflows",
    ),
    (
        "byte_size_overflow",
        lambda d: (
            put("<Q", tensor_field(EMB, "dims"), 2**62)(d),
            put("<Q", tensor_field(EMB, "dims", 8), 1)(d),
        ),
        r"byte size overflows",
    ),
    (
        "block_size",
        put("<Q", tensor_field(FFN, "dims"), 48),
        r"row length 48 is not a multiple of the Q8_0 block",
    ),
    ("misaligned_offset", add_to_offset(EMB, 4), r"data offset \d+ is not a multiple of the alignment 32"),
    ("data_beyond_eof", add_to_offset(EMB, 32 * 1000), r"lies outside the file"),
    ("offset_wraps_around", put("<Q", tensor_field(EMB, "offset"), 2**64 - 32), r"lies outside the file"),
    ("overlapping_tensors", put("<Q", tensor_field(NORM, "offset"), 0), r"overlap"),
    ("overlapping_tail", add_to_offset(NORM, -32), r"overlap"),
]


def expect_gguf_error(path: Path, pattern: str) -> GGUFError:
    with pytest.raises(GGUFError) as info:
        regolith.gguf.open(path)
    msg = str(info.value)
    assert re.search(pattern, msg), msg
    assert re.search(r"\(at byte offset \d+\)$", msg), msg
    return info.value


@pytest.fixture(scope="module")
def sample_bytes(tmp_path_factory) -> bytes:
    return sample_file(tmp_path_factory.mktemp("sample") / "s.gguf").read_bytes()


def test_sample_is_valid(sample_bytes, tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(sample_bytes)
    with regolith.gguf.open(path) as f:
        last = max(f.tensors.values(), key=lambda t: t.offset)
        assert last.offset + last.nbytes == len(sample_bytes)  # so every truncation must be caught


@pytest.mark.parametrize(
    ("mutate", "pattern"), [c[1:] for c in SAMPLE_CORRUPTIONS], ids=[c[0] for c in SAMPLE_CORRUPTIONS]
)
def test_corruption(sample_bytes, tmp_path, mutate, pattern):
    data = bytearray(sample_bytes)
    mutate(data)
    assert bytes(data) != sample_bytes
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    expect_gguf_error(path, pattern)


def test_truncated_everywhere(sample_bytes, tmp_path):
    path = tmp_path / "cut.gguf"
    for n in range(len(sample_bytes)):
        path.write_bytes(sample_bytes[:n])
        expect_gguf_error(path, r"truncated file|runs past the end|lies outside the file|cannot fit")


def test_duplicate_tensor_name(tmp_path):
    tensors = [(n, np.zeros(4, np.float32), None) for n in ("w.a", "w.b")]
    data = bytearray(write_gguf(tmp_path / "t.gguf", [], tensors).read_bytes())
    p = field_pos(bytes(data), b"w.b")
    data[p - 1 : p] = b"a"
    (tmp_path / "dup.gguf").write_bytes(data)
    expect_gguf_error(tmp_path / "dup.gguf", r"duplicate tensor name 'w.a'")


@pytest.mark.parametrize(
    ("value", "vtype", "pattern"),
    [
        (0, VT.UINT32, r"general.alignment 0 is not a nonzero power of two"),
        (48, VT.UINT32, r"general.alignment 48 is not a nonzero power of two"),
        (2**31 + 1, VT.UINT32, r"is not a nonzero power of two"),
        (32, VT.UINT64, r"general.alignment must be a uint32, not uint64"),
        ("32", VT.STRING, r"general.alignment must be a uint32, not string"),
    ],
)
def test_bad_alignment(tmp_path, value, vtype, pattern):
    path = write_gguf(tmp_path / "a.gguf", [("general.alignment", value, vtype, None)])
    expect_gguf_error(path, pattern)


def test_nested_array_depth_limit(tmp_path):
    deep = 1
    for _ in range(65):  # 65 levels: one more than the reader accepts
        deep = [deep]
    path = write_gguf(tmp_path / "deep.gguf", [("deep", deep, VT.ARRAY, None)])
    expect_gguf_error(path, r"nested deeper than 64 levels")


def test_nested_array_depth_bomb(tmp_path):
    """A million levels of arrays of one array: rejected without recursing (or allocating) that deep."""
    data = write_gguf(tmp_path / "two.gguf", [("bomb", [[7]], VT.ARRAY, None)]).read_bytes()
    level = struct.pack("<IQ", int(VT.ARRAY), 1)  # element type array, one element
    p = field_pos(data, b"bomb") + 4  # the outer array's (element type, count)
    bomb = data[:p] + level * 1_000_000 + data[p:]
    (tmp_path / "bomb.gguf").write_bytes(bomb)
    expect_gguf_error(tmp_path / "bomb.gguf", r"nested deeper than 64 levels")


def test_huge_array_claims_fail_before_allocating(tmp_path):
    """A 2^62-element array claim in a small file is refused by the count check, before any allocation."""
    for value in ([1, 2], ["a", "b"], [[1], [2]]):
        data = bytearray(write_gguf(tmp_path / "a.gguf", [("arr", value, VT.ARRAY, None)]).read_bytes())
        struct.pack_into("<Q", data, field_pos(bytes(data), b"arr") + 8, 2**62)
        (tmp_path / "huge.gguf").write_bytes(data)
        expect_gguf_error(
            tmp_path / "huge.gguf", r"array of 4611686018427387904 \w+ elements runs past the end"
        )
