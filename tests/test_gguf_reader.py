"""regolith.gguf against files written by gguf-py's GGUFWriter and read back by gguf-py's GGUFReader."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

import regolith
from tests.gguf_samples import ALL_VALUE_KVS, QT, VT, expected_value, q8_0_bytes, sample_file, write_gguf
from tests.quant_data import random_blocks, reference


@pytest.fixture
def all_values_path(tmp_path):
    return write_gguf(tmp_path / "values.gguf", ALL_VALUE_KVS)


def test_metadata_roundtrip_matches_written(all_values_path):
    with regolith.gguf.open(all_values_path) as f:
        md = f.metadata
        types = f.metadata_types
        assert list(md) == ["general.architecture"] + [k for k, *_ in ALL_VALUE_KVS]
        assert md["general.architecture"] == "llama" == f.architecture
        for key, value, vtype, sub_type in ALL_VALUE_KVS:
            got = md[key]
            assert got == expected_value(value, vtype, sub_type), key
            assert types[key] == int(vtype), key
            assert type(got) is type(expected_value(value, vtype, sub_type)), key


def test_metadata_matches_gguf_reader(all_values_path):
    reader = gguf.GGUFReader(all_values_path)
    with regolith.gguf.open(all_values_path) as f:
        md = f.metadata
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "a.nested":  # GGUFReader can't flatten nested arrays
                continue
            ours = md[key]
            theirs = field.contents()
            if isinstance(ours, float):
                assert ours == pytest.approx(float(theirs), rel=0, abs=0), key
            else:
                assert ours == theirs, key


def test_nested_arrays_and_depth_limit(tmp_path):
    deep = 1
    for _ in range(64):  # 64 levels of arrays: the deepest the reader accepts
        deep = [deep]
    path = write_gguf(tmp_path / "deep.gguf", [("deep", deep, VT.ARRAY, None)])
    with regolith.gguf.open(path) as f:
        assert f.metadata["deep"] == deep


def test_invalid_utf8_string_value_is_replaced(tmp_path):
    path = write_gguf(tmp_path / "u.gguf", [("s", b"ok\xff\xfe", VT.STRING, None)])
    with regolith.gguf.open(path) as f:
        assert f.metadata["s"] == "ok\ufffd\ufffd"


def test_version_2_file(tmp_path):
    path = sample_file(tmp_path / "v3.gguf")
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<I", data, 4)[0] == 3
    struct.pack_into("<I", data, 4, 2)
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(data)
    with regolith.gguf.open(path) as f3, regolith.gguf.open(v2) as f2:
        assert (f3.version, f2.version) == (3, 2)
        assert f2.metadata == f3.metadata
        assert f2.tensors == f3.tensors


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    rng = np.random.default_rng(0)
    tensors = [(f"t{i}", rng.standard_normal(3 + i).astype(np.float32), None) for i in range(3)]
    path = write_gguf(tmp_path / "al.gguf", [("general.alignment", alignment, VT.UINT32, None)], tensors)
    reader = gguf.GGUFReader(path)
    with regolith.gguf.open(path) as f:
        assert f.alignment == alignment
        data_start = min(t.offset for t in f.tensors.values())
        assert data_start % alignment == 0
        for (name, arr, _), rt in zip(tensors, reader.tensors, strict=True):
            info = f.tensors[name]
            assert (info.offset - data_start) % alignment == 0
            assert info.offset == rt.data_offset
            np.testing.assert_array_equal(f.tensor(name), arr)


def test_default_alignment(tmp_path):
    with regolith.gguf.open(sample_file(tmp_path / "s.gguf")) as f:
        assert f.alignment == 32
        assert all(t.offset % 32 == 0 for t in f.tensors.values())


def test_tensor_infos_match_gguf_reader(tmp_path):
    path = sample_file(tmp_path / "s.gguf")
    reader = gguf.GGUFReader(path)
    with regolith.gguf.open(path) as f:
        assert list(f.tensors) == [t.name for t in reader.tensors]
        for rt in reader.tensors:
            info = f.tensors[rt.name]
            assert info.shape == tuple(int(d) for d in reversed(rt.shape))
            assert info.type_id == int(rt.tensor_type)
            assert info.type_name == rt.tensor_type.name
            assert info.offset == rt.data_offset
            assert info.nbytes == rt.n_bytes
            assert info.n_elements == rt.n_elements
            view = f.tensor_bytes(rt.name)
            assert view.dtype == np.uint8
            assert view.shape == (*info.shape[:-1], info.row_bytes)
            assert view.tobytes() == np.asarray(rt.data).tobytes()


def test_tensor_bytes_zero_copy_and_outlive_close(tmp_path):
    path = sample_file(tmp_path / "s.gguf")
    f = regolith.gguf.open(path)
    a = f.tensor_bytes("token_embd.weight")
    b = f.tensor_bytes("token_embd.weight")
    assert np.shares_memory(a, b)  # both are views of the one mapping
    assert not a.flags.writeable
    emb = f.tensor("token_embd.weight")  # F32: a view as well
    assert np.shares_memory(emb, a)
    expected = a.copy()
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.tensor_bytes("token_embd.weight")
    del f, b
    np.testing.assert_array_equal(a, expected)  # the view keeps the mapping alive


def test_plain_tensor_types(tmp_path):
    rng = np.random.default_rng(2)
    bf16_src = rng.standard_normal((3, 4)).astype(np.float32)
    bf16_bits = (bf16_src.view(np.uint32) >> 16).astype(np.uint16)
    arrays = {
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f16": rng.standard_normal((5, 6)).astype(np.float16),
        "f64": rng.standard_normal(7),
        "i8": np.arange(-8, 8, dtype=np.int8).reshape(4, 4),
        "i16": np.arange(12, dtype=np.int16),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(2, 2, 3),
        "i64": np.arange(5, dtype=np.int64),
        "four_d": rng.standard_normal((2, 1, 3, 2)).astype(np.float32),
    }
    tensors = [(n, a, None) for n, a in arrays.items()] + [("bf16", bf16_bits, QT.BF16)]
    path = write_gguf(tmp_path / "p.gguf", [], tensors)
    with regolith.gguf.open(path) as f:
        for name, arr in arrays.items():
            out = f.tensor(name)
            assert out.dtype == np.float32 and out.shape == arr.shape, name
            np.testing.assert_array_equal(out, arr.astype(np.float32))
        assert f.tensors["bf16"].type_name == "BF16"
        expected = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(f.tensor("bf16"), expected)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K", "IQ2_XS", "IQ4_XS", "MXFP4"])
def test_quantized_tensor_matches_reference_dequantize(tmp_path, name):
    blocks = random_blocks(name, 6, np.random.default_rng(3))
    raw = blocks.reshape(3, -1)
    path = write_gguf(tmp_path / "q.gguf", [], [("w", raw, gguf.GGMLQuantizationType[name])])
    with regolith.gguf.open(path) as f:
        out = f.tensor("w")
    want = reference(raw, name)
    assert out.shape == want.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_quantized_tensor_bytes_shape(tmp_path):
    raw = q8_0_bytes(3, 96)
    path = write_gguf(tmp_path / "q.gguf", [], [("w", raw, QT.Q8_0)])
    with regolith.gguf.open(path) as f:
        info = f.tensors["w"]
        assert (info.shape, info.type_name, info.row_bytes, info.nbytes) == ((3, 96), "Q8_0", 102, 306)
        np.testing.assert_array_equal(f.tensor_bytes("w"), raw)


def test_open_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        regolith.gguf.open(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError):
        regolith.gguf.open(tmp_path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(regolith.GGUFError, match="truncated.*offset 0"):
        regolith.gguf.open(empty)


def test_metadata_only_file(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", [("k", 1, VT.UINT8, None)], arch="qwen3moe")
    with regolith.gguf.open(path) as f:
        assert f.tensors == {} and f.architecture == "qwen3moe" and f.metadata["k"] == 1
        assert "v3 0 tensors" in repr(f)


def test_big_vocab_metadata_round_trips(tmp_path):
    n = 262_144
    tokens = [f"▁token{i}" for i in range(n)]
    kvs = [
        ("tokenizer.ggml.tokens", tokens, VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.scores", [float(-i) for i in range(n)], VT.ARRAY, VT.FLOAT32),
        ("tokenizer.ggml.token_type", [1] * n, VT.ARRAY, VT.INT32),
    ]
    path = write_gguf(tmp_path / "vocab.gguf", kvs)
    with regolith.gguf.open(path) as f:
        md = f.metadata
    assert md["tokenizer.ggml.tokens"] == tokens
    assert md["tokenizer.ggml.scores"][-1] == -(n - 1)
