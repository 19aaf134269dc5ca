"""Split GGUFs: shards written in llama.cpp's gguf-split layout (read back with the gguf package), a split model
opened as one from any shard, and every way a set can be broken refused with the file named."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import itertools

import regolith
from regolith import gguf_split
from regolith.cli import main
from regolith.models import DEFAULT_MODEL, resolve_model

DEMO = resolve_model(DEFAULT_MODEL)
LLAMACPP = Path(__file__).parent / "fixtures" / "llamacpp" / "split.json"
SPLIT_KEYS = {"split.no": 0, "split.tensors.count": 0, "split.count": 0}  # in gguf-split's order


@pytest.fixture(scope="module")
def demo():
    with regolith.gguf.open(DEMO) as f:
        yield f


@pytest.fixture(scope="module")
def shards(tmp_path_factory, demo):
    return gguf_split.write_split(demo, tmp_path_factory.mktemp("split") / "demo.gguf", max_size=10**7)


def _fields(reader):
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def test_shards_match_gguf_split_layout_read_by_gguf_package(demo, shards):
    """gguf-split's layout (tools/gguf-split/gguf-split.cpp), checked through the gguf package's reader: the
    names, every metadata key in the first shard followed by the split keys, the split keys alone elsewhere,
    their types (u16, u16, i32), the tensors in the model's order, split where the padded sizes pass the limit."""
    assert [p.name for p in shards] == [f"demo-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    readers = [gguf.GGUFReader(p) for p in shards]
    first = _fields(readers[0])
    assert list(first)[: len(demo.metadata)] == list(demo.metadata)
    assert list(first)[len(demo.metadata) :] == list(SPLIT_KEYS)
    for i, r in enumerate(readers):
        fields = _fields(r) if i else {k: first[k] for k in SPLIT_KEYS}
        assert fields == {"split.no": i, "split.count": 3, "split.tensors.count": len(demo.tensors)}
        assert r.fields["split.no"].types == [gguf.GGUFValueType.UINT16]
        assert r.fields["split.count"].types == [gguf.GGUFValueType.UINT16]
        assert r.fields["split.tensors.count"].types == [gguf.GGUFValueType.INT32]
        assert r.alignment == 32
    names = [t.name for r in readers for t in r.tensors]
    assert names == list(demo.tensors)
    for r in readers:
        for t in r.tensors:
            assert bytes(t.data.reshape(-1).view(np.uint8)) == bytes(demo.tensor_bytes(t.name).reshape(-1))
    sizes = [[(int(t.n_bytes) + 31) // 32 * 32 for t in r.tensors] for r in readers]
    for a, b in itertools.pairwise(sizes):
        assert sum(a) <= 10**7 < sum(a) + b[0]


def _sha256(path: Path, start: int = 0) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize(
    ("mode", "limit"), [("tensors", {"max_tensors": 100}), ("size", {"max_size": 10**7})]
)
def test_shards_are_byte_for_byte_llama_gguf_splits(demo, tmp_path, mode, limit):
    """llama-gguf-split --split-max-tensors 100 / --split-max-size 10M on the same model (the fixture holds the
    sha256 of each shard it wrote: tools/llamacpp_fixtures/make_split_fixture.py)."""
    expect = json.loads(LLAMACPP.read_text())["gguf_split"][mode]
    shards = gguf_split.write_split(demo, tmp_path / f"{mode}.gguf", **limit)
    assert {p.name: _sha256(p) for p in shards} == expect


def test_llama_gguf_split_merges_our_shards_into_the_model(demo, shards):
    """llama-gguf-split --merge read regolith's shards (by size, as the fixture above) back into a file whose
    tensor data is the model's, byte for byte."""
    merged = json.loads(LLAMACPP.read_text())["merge"]
    assert merged["tensors"] == len(demo.tensors)
    assert merged["tensor_data_sha256"] == _sha256(DEMO, min(t.offset for t in demo.tensors.values()))


def test_plan_by_tensor_count_is_gguf_splits():
    assert gguf_split.plan_shards([1] * 7, max_tensors=3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert gguf_split.plan_shards([10, 20, 100, 1], max_size=64) == [[0, 1], [2], [3]]
    assert gguf_split.parse_size("48G") == 48 * 10**9
    for bad in ("10", "0M", "1.5G", "5K", "-1M"):
        with pytest.raises(ValueError):
            gguf_split.parse_size(bad)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_any_shard_opens_the_whole_model(demo, shards, which):
    with regolith.gguf.open(shards[which]) as f:
        assert f.paths == [str(p) for p in shards]
        assert f.metadata == demo.metadata  # split.* describe the files, not the model
        assert list(f.tensors) == list(demo.tensors)
        for name, t in f.tensors.items():
            assert (
                t.shape == _ggml_dims(demo.tensors[name].shape)
                and t.type_name == demo.tensors[name].type_name
            )
            assert np.array_equal(f.tensor_bytes(name).reshape(-1), demo.tensor_bytes(name).reshape(-1))
        assert f.file_size == sum(p.stat().st_size for p in shards)


def test_merge_restores_the_single_file(demo, shards, tmp_path):
    """The demo's only 1-row matrix ([1, 256], which the shards store as ggml does, 1-D) aside, its bytes."""
    with regolith.gguf.open(shards[0]) as f:
        out = gguf_split.write_merged(f, tmp_path / "merged.gguf")
    with regolith.gguf.open(out) as m:
        assert m.metadata == demo.metadata and list(m.tensors) == list(demo.tensors)
        for name, t in demo.tensors.items():
            assert np.array_equal(m.tensor_bytes(name).reshape(-1), demo.tensor_bytes(name).reshape(-1))
            assert m.tensors[name].shape == _ggml_dims(t.shape)


def _ggml_dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A numpy shape as ggml counts its dims: leading 1s (ggml's trailing ones) dropped, at least one kept."""
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def _copy_set(shards, to: Path) -> list[Path]:
    to.mkdir()
    return [Path(shutil.copy(p, to / p.name)) for p in shards]


def test_missing_shard_is_named(shards, tmp_path):
    copy = _copy_set(shards, tmp_path / "s")
    copy[1].unlink()
    with pytest.raises(regolith.ModelFormatError, match=r"demo-00002-of-00003\.gguf: missing"):
        regolith.gguf.open(copy[2])


def test_renamed_lone_shard_is_refused(shards, tmp_path):
    lone = Path(shutil.copy(shards[0], tmp_path / "model.gguf"))
    with pytest.raises(regolith.ModelFormatError, match=r"model\.gguf is shard 1 of 3"):
        regolith.gguf.open(lone)


def test_shard_from_another_set_is_named(demo, shards, tmp_path):
    other = gguf_split.write_split(demo, tmp_path / "o" / "demo.gguf", max_tensors=100)
    assert len(other) == 3
    copy = _copy_set(shards, tmp_path / "s")
    shutil.copy(other[1], copy[1])
    with pytest.raises(
        regolith.ModelFormatError,
        match=r"demo-0000[23]-of-00003\.gguf: tensor '.*' is also in .*demo-0000[23]-of-00003",
    ):
        regolith.gguf.open(copy[0])


def test_shard_in_the_wrong_place_is_named(shards, tmp_path):
    copy = _copy_set(shards, tmp_path / "s")
    shutil.copy(shards[2], copy[1])
    with pytest.raises(
        regolith.ModelFormatError, match=r"demo-00002-of-00003\.gguf \(shard 2 of 3\) says it is shard 3"
    ):
        regolith.gguf.open(copy[0])


def test_shard_of_a_set_of_another_size_is_named(demo, shards, tmp_path):
    two = gguf_split.write_split(demo, tmp_path / "t" / "demo.gguf", max_tensors=200)
    copy = _copy_set(shards, tmp_path / "s")
    shutil.copy(two[1], copy[1])
    with pytest.raises(regolith.ModelFormatError, match=r"demo-00002-of-00003\.gguf .* set of 2 shards"):
        regolith.gguf.open(copy[0])


def test_truncated_shard_is_a_gguf_error_naming_it(shards, tmp_path):
    copy = _copy_set(shards, tmp_path / "s")
    with open(copy[2], "r+b") as f:
        f.truncate(copy[2].stat().st_size - 100)
    with pytest.raises(regolith.GGUFError, match=r"demo-00003-of-00003\.gguf: "):
        regolith.gguf.open(copy[0])


def test_side_file_tensors_join_the_model_and_must_not_repeat(demo, tmp_path):
    table = "per_layer_token_embd.weight"
    rest = [n for n in demo.tensors if n != table]
    main_path = gguf_split.write_merged(demo, tmp_path / "main.gguf", tensors=rest)
    side = gguf_split.write_merged(demo, tmp_path / "ple-q8_0.gguf", tensors=[table], metadata=False)
    assert set(gguf.GGUFReader(side).fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"} == {
        "general.architecture"
    }
    with regolith.gguf.open(main_path, side_files=[side]) as f:
        assert list(f.tensors) == [*rest, table]
        assert f.tensors[table].path == str(side)
        assert np.array_equal(f.tensor_bytes(table), demo.tensor_bytes(table))
    with pytest.raises(regolith.ModelFormatError, match=r"tensor 'per_layer_token_embd.weight' is also in"):
        regolith.gguf.open(DEMO, side_files=[side])


def test_side_file_of_another_architecture_is_refused(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "mtp-x.gguf"), "qwen2")
    writer.add_tensor("x", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(regolith.ModelFormatError, match=r"mtp-x\.gguf: a side file of a 'qwen4exp' model"):
        regolith.gguf.open(DEMO, side_files=[tmp_path / "mtp-x.gguf"])


def test_convert_cli_splits_and_merges_a_gguf(tmp_path, capsys):
    assert main(["convert", str(DEMO), str(tmp_path / "m.gguf"), "--split-max-tensors", "100", "-q"]) == 0
    written = sorted(tmp_path.glob("m-*.gguf"))
    assert [p.name for p in written] == [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert [len(gguf.GGUFReader(p).tensors) for p in written] == [100, 100, 47]
    assert main(["convert", str(written[1]), str(tmp_path / "whole.gguf")]) == 0
    with regolith.gguf.open(tmp_path / "whole.gguf") as whole, regolith.gguf.open(DEMO) as demo:
        assert whole.paths == [str(tmp_path / "whole.gguf")] and whole.metadata == demo.metadata
        assert all(
            np.array_equal(whole.tensor_bytes(n).reshape(-1), demo.tensor_bytes(n).reshape(-1))
            for n in demo.tensors
        )
    assert f"wrote {tmp_path / 'whole.gguf'} (" in capsys.readouterr().out  # unbroken, whatever the width
    assert main(["convert", str(DEMO), str(tmp_path / "x.gguf"), "--split-max-size", "12K"]) == 2
    assert not list(tmp_path.glob("x*"))
