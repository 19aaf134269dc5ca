"""Fuzz the GGUF reader: mutated valid files must open cleanly (and read fully) or raise GGUFError."""

from __future__ import annotations

import os
import resource
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import regolith
from regolith import GGUFError
from tests.gguf_samples import sample_file, tensor_fields

EXTREMES = [
    0,
    1,
    2,
    5,
    0x7F,
    0xFF,
    2**16 - 1,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
]
PLAIN_TYPES = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


def _max_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[bytes, list[int], int, Path]:
    """(sample bytes, header field positions, end of header, scratch path)."""
    d = tmp_path_factory.mktemp("fuzz")
    path = sample_file(d / "base.gguf")
    data = path.read_bytes()
    with regolith.gguf.open(path) as f:
        header_end = min(t.offset for t in f.tensors.values())
        keys, names = list(f.metadata), list(f.tensors)
    fields = [4, 8, 16, 24]
    for key in keys:
        p = data.find(struct.pack("<Q", len(key)) + key.encode())
        fields += [
            p,
            p + 8 + len(key),
            p + 12 + len(key),
            p + 16 + len(key),
        ]  # length, type, value/elem type, count
    for name in names:
        fields += tensor_fields(data, name).values()
    return data, sorted(set(fields)), header_end, d / "mutant.gguf"


POS = st.integers(0, 10**6)  # a position, taken modulo the current length

mutation = st.one_of(
    st.tuples(st.just("flip"), POS, st.integers(0, 7)),
    st.tuples(st.just("byte"), POS, st.integers(0, 255)),
    st.tuples(st.just("truncate"), POS),
    st.tuples(st.just("insert"), POS, st.binary(min_size=1, max_size=24)),
    st.tuples(st.just("delete"), POS, st.integers(1, 16)),
    st.tuples(
        st.just("extreme_field"), st.integers(0, 10**6), st.sampled_from(EXTREMES), st.sampled_from("IQ")
    ),
    st.tuples(
        st.just("extreme_header"),
        POS,
        st.sampled_from(EXTREMES),
        st.sampled_from("IQ"),
    ),
)


def mutate(data: bytes, fields: list[int], header_end: int, ops: list[tuple]) -> bytes:
    buf = bytearray(data)
    for op, *args in ops:
        if not buf:
            break
        pos = args[0] % (len(buf) + (op == "insert"))
        if op == "flip":
            buf[pos] ^= 1 << args[1]
        elif op == "byte":
            buf[pos] = args[1]
        elif op == "truncate":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = args[1]
        elif op == "delete":
            del buf[pos : pos + args[1]]
        else:
            fmt = "<" + args[2]
            value = args[1] & (0xFFFFFFFF if args[2] == "I" else 2**64 - 1)
            if op == "extreme_field":
                pos = fields[args[0] % len(fields)]
            else:
                pos = args[0] % min(header_end, len(buf))
            if pos + struct.calcsize(fmt) <= len(buf):
                struct.pack_into(fmt, buf, pos, value)
    return bytes(buf)


def read_everything(path: Path) -> str:
    """Open and touch every metadata value and tensor byte; only GGUFError may escape from open().

    Returns the outcome: "opened" or the first word of the error.
    """
    try:
        f = regolith.gguf.open(path)
    except GGUFError as e:
        assert "offset" in str(e)
        return "GGUFError: " + str(e).split(" ")[0]
    with f:
        md = f.metadata
        assert len(md) == len(f.metadata_types)
        _ = f.architecture
        for name, info in f.tensors.items():
            assert 0 < info.offset and info.offset + info.nbytes <= f.file_size
            view = f.tensor_bytes(name)
            assert view.nbytes == info.nbytes
            int(view.sum(dtype="uint64"))  # touch every byte
            if info.type_name in PLAIN_TYPES:
                assert f.tensor(name).shape == info.shape
    return "opened"


@settings(
    max_examples=int(os.environ.get("REGOLITH_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_files_open_cleanly_or_raise_gguf_error(base, ops):
    data, fields, header_end, path = base
    path.write_bytes(mutate(data, fields, header_end, ops))
    event(read_everything(path))


def test_fuzz_memory_stays_small(base):
    """Many hostile counts in a row must not grow the process (counts are checked before allocating)."""
    data, fields, _, path = base
    before = _max_rss_bytes()
    for pos in fields:
        for value in (2**62, 2**63 - 1, 2**64 - 1, 2**32 - 1):
            for fmt in ("<Q", "<I"):
                buf = bytearray(data)
                if pos + struct.calcsize(fmt) <= len(buf):
                    struct.pack_into(fmt, buf, pos, value & (2 ** (8 * struct.calcsize(fmt)) - 1))
                path.write_bytes(buf)
                read_everything(path)
    assert _max_rss_bytes() - before < 64 * 2**20
