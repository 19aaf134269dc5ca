"""A model split into gguf-split shards with its PLE table and MTP head in side files computes exactly what its
single-file twin computes: loaded from a directory or from a shard with the side files named, resident or
streaming its experts, packed, and generating (the MTP head drafting)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import regolith
from regolith import gguf_split
from regolith.models import DEFAULT_MODEL, resolve_files, resolve_model
from regolith.pack import pack

DEMO = resolve_model(DEFAULT_MODEL)
PLE_TABLE = "per_layer_token_embd.weight"
PROMPT = "def read_config(path):\n    with open(path) as f:"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The demo model as a Hub bundle: 3 shards without the PLE table and MTP head, ple-q8_0.gguf, and the
    MTP head split in 2 shards of its own."""
    d = tmp_path_factory.mktemp("bundle")
    with regolith.gguf.open(DEMO) as src:
        head = f"blk.{src.metadata['qwen4exp.block_count'] - 1}."
        mtp = [n for n in src.tensors if n.startswith(head)]
        rest = [n for n in src.tensors if n != PLE_TABLE and n not in mtp]
        main = gguf_split.write_split(src, d / "demo-Q8_0.gguf", max_tensors=len(rest) // 3 + 1, tensors=rest)
        gguf_split.write_merged(src, d / "ple-q8_0.gguf", tensors=[PLE_TABLE], metadata=False)
        side = gguf_split.write_split(
            src, d / "mtp-q8_0.gguf", max_tensors=len(mtp) // 2 + 1, tensors=mtp, metadata=False
        )
    assert len(main) == 3 and len(side) == 2
    return d


def _logits(model, ids):
    return model.window(64).eval(ids)


def test_directory_finds_shards_and_side_files(bundle):
    files = resolve_files(bundle)
    assert files.model.name == "demo-Q8_0-00001-of-00003.gguf"
    assert files.ple.name == "ple-q8_0.gguf"
    assert files.mtp.name == "mtp-q8_0-00001-of-00002.gguf"
    assert files.mmproj is None


def test_split_bundle_computes_what_the_single_file_computes(bundle):
    whole = regolith.Model.load(DEMO, n_ctx=128)
    ids = whole.tokenize(PROMPT)
    expect = _logits(whole, ids)
    from_dir = regolith.Model.load(bundle, n_ctx=128)
    np.testing.assert_array_equal(_logits(from_dir, ids), expect)
    named = regolith.Model.load(
        bundle / "demo-Q8_0-00002-of-00003.gguf",
        n_ctx=128,
        ple=bundle / "ple-q8_0.gguf",
        mtp=bundle / "mtp-q8_0-00002-of-00002.gguf",
    )
    np.testing.assert_array_equal(_logits(named, ids), expect)
    # greedy with the MTP head drafting (the head's tensors come from its side file): the same text
    text = whole.generate(PROMPT, 40, temperature=0, speculative="mtp")
    assert from_dir.generate(PROMPT, 40, temperature=0, speculative="mtp") == text
    assert from_dir.generate(PROMPT, 40, temperature=0, speculative=False) == text


def test_split_bundle_streams_like_the_single_file(bundle):
    ids = regolith.Model.load(DEMO).tokenize(PROMPT)
    whole = regolith.Model.load(DEMO, n_ctx=128, arena_gb=0.004, lock_memory=False)
    split = regolith.Model.load(bundle, n_ctx=128, arena_gb=0.004, lock_memory=False)
    np.testing.assert_array_equal(_logits(split, ids), _logits(whole, ids))
    stats = split.stats()
    assert stats["misses"] > 0 and stats["bytes_read"] > 0 and stats["ple_rows_read"] > 0


def test_pack_of_the_bundle_equals_pack_of_the_single_file(bundle, tmp_path):
    files = resolve_files(bundle)
    a = pack(DEMO, tmp_path / "a")
    b = pack(files.model, tmp_path / "b", side_files=files.side_files)
    for name in ("experts.bin", "ple.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    split = regolith.Model.load(bundle, n_ctx=128)
    manifest = json.loads((b / "manifest.json").read_text())
    assert bytes.fromhex(manifest["source"]["fingerprint"]) == split.fingerprint
    ids = split.tokenize(PROMPT)
    np.testing.assert_array_equal(
        _logits(regolith.Model.load(b, n_ctx=128), ids), _logits(regolith.Model.load(a, n_ctx=128), ids)
    )


def test_fingerprint_covers_every_file(bundle, tmp_path):
    split = regolith.Model.load(bundle, n_ctx=128)
    assert split.fingerprint != regolith.Model.load(DEMO).fingerprint
    assert regolith.Model.load(bundle, n_ctx=128).fingerprint == split.fingerprint
    other = tmp_path / "other"
    shutil.copytree(bundle, other)
    with regolith.gguf.open(other / "ple-q8_0.gguf") as side:
        t = side.tensors[PLE_TABLE]
    with open(other / "ple-q8_0.gguf", "r+b") as f:  # a byte the fingerprint samples, mid-table
        f.seek(t.offset + t.nbytes // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    assert regolith.Model.load(other, n_ctx=128).fingerprint != split.fingerprint


def test_missing_side_file_and_ambiguous_directory(bundle, tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    for p in bundle.glob("demo-*.gguf"):
        shutil.copy(p, lone / p.name)
    with pytest.raises(regolith.ModelFormatError, match=PLE_TABLE):
        regolith.Model.load(lone)
    shutil.copy(bundle / "ple-q8_0.gguf", lone / "ple-q8_0.gguf")
    shutil.copy(bundle / "ple-q8_0.gguf", lone / "ple-f16.gguf")
    with pytest.raises(regolith.ModelFormatError, match=r"several ple files .*; pass ple= to choose"):
        regolith.Model.load(lone)
    loaded = regolith.Model.load(lone / "demo-Q8_0-00001-of-00003.gguf", ple=lone / "ple-f16.gguf", n_ctx=64)
    assert loaded.files.ple == lone / "ple-f16.gguf" and loaded.files.mtp is None
    with pytest.raises(regolith.RegolithError, match="no such ple file"):
        regolith.Model.load(lone, ple=lone / "nope.gguf")
