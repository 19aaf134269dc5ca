"""Streaming routed experts through the arena (issue 5): packed directories, bit-identical logits at any arena
size, the memory plan, corruption, read errors, process RSS, MoCE and the cache policy.

The reference for "correct" here is the same model with every expert resident (views into the mapped GGUF),
itself checked against transformers in tests/model/test_qwen4exp_model.py: streaming must not change a bit.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import regolith
from regolith import MemoryPlanError, ModelFormatError, _core, model_sizes
from regolith import memory_plan as mp
from regolith import pack as pk

torch.set_num_threads(1)

OVERRIDES = {"indexer_n_heads": 8, "output_gate_type": "sigmoid"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    tmp = tmp_path_factory.mktemp("stream")
    save_tiny_model(tmp / "hf", 7, **OVERRIDES)
    return convert(tmp / "hf", tmp / "tiny.gguf", "q4_k")


@pytest.fixture(scope="module")
def packed(tiny: Path, tmp_path_factory) -> Path:
    return pk.pack(tiny, tmp_path_factory.mktemp("packed") / "tiny.pack")


def _ids(vocab: int, n: int = 40, seed: int = 0) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, vocab, n).astype(np.int32)
    ids[17] = 2  # an EOS inside: resets the PLE n-gram context
    return ids


def _arena_gb(path: Path, slots: int) -> float:
    """arena_gb holding exactly ``slots`` slots of this model."""
    with regolith.gguf.open(pk.open_packed(path).dense if pk.is_packed(path) else path) as f:
        manifest = pk.open_packed(path).manifest if pk.is_packed(path) else None
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, manifest)
    return slots * sizes.slot_bytes / 2**30


def _run(model: regolith.Model, ids: np.ndarray) -> np.ndarray:
    """A 13-token prefill, then one token at a time (the decode path, where lookahead prefetches)."""
    w = model.window(64)
    return np.concatenate([w.eval(ids[:13]), *(w.eval(ids[i : i + 1]) for i in range(13, len(ids)))])


@pytest.fixture(scope="module")
def reference(tiny: Path) -> np.ndarray:
    model = regolith.Model.load(tiny)
    assert not model.plan.streaming  # small enough to keep every expert resident
    return _run(model, _ids(model.config["vocab_size"]))


# ---- bit-identical at any arena size ---------------------------------------------------------------


@pytest.mark.parametrize("slots", [1, 2, 3, 5, 17, 64])
@pytest.mark.parametrize("source", ["gguf", "packed"])
def test_logits_bit_identical_at_any_arena_size(tiny, packed, reference, slots, source):
    path = tiny if source == "gguf" else packed
    model = regolith.Model.load(path, arena_gb=_arena_gb(path, slots))
    assert model.plan.arena_slots == slots
    info = model._core.arena_info()
    assert info["slots"] == slots
    assert info["slot_bytes"] == model.plan.sizes.slot_bytes  # the plan sizes slots as the arena does
    got = _run(model, _ids(model.config["vocab_size"]))
    np.testing.assert_array_equal(got, reference)
    st = model.stats()
    assert st["hits"] + st["misses"] > 0 and st["tokens"] == 40
    if slots == 64:  # every expert fits: each is read once, then hits
        assert st["reads"] == 64 and st["hit_rate"] > 0.8


def test_lookahead_off_and_whole_prompt_bit_identical(tiny, packed, reference):
    ids = _ids(304)
    model = regolith.Model.load(packed, arena_gb=_arena_gb(packed, 4), lookahead=False)
    np.testing.assert_array_equal(_run(model, ids), reference)
    assert model.stats()["prefetches"] == 0
    # a 40-token prefill needs more experts per layer than 2 slots: it runs them in waves
    whole = regolith.Model.load(packed, arena_gb=_arena_gb(packed, 2)).window(64).eval(ids)
    np.testing.assert_array_equal(whole, regolith.Model.load(tiny).window(64).eval(ids))


def test_lookahead_prefetches_are_used(packed):
    model = regolith.Model.load(packed, arena_gb=_arena_gb(packed, 8))
    _run(model, _ids(304))
    st = model.stats()
    assert st["prefetches"] > 0 and 0 < st["prefetch_hits"] <= st["prefetches"]
    assert len(st["per_layer_hit_rate"]) == 4


# ---- the host tier behind a device arena --------------------------------------------------------------


def _device_backend(tiny: Path, reference: np.ndarray, ids: np.ndarray) -> tuple[str, np.ndarray]:
    """The backend the suite runs on where it has memory of its own (a GPU), else cpu-opaque (its arena is not
    host memory; a backend with unified memory has no host tier), with that backend's resident output."""
    chosen = regolith.backends.resolve(None)
    backend = chosen if regolith.backends.device_memory(chosen) else "cpu-opaque"
    if backend != chosen:
        reference = _run(regolith.Model.load(tiny, backend=backend), ids)
    return backend, reference


@pytest.mark.parametrize("host_slots", [8, 64])
@pytest.mark.parametrize("source", ["gguf", "packed"])
def test_host_tier_is_bit_identical_and_spares_disk_reads(tiny, packed, reference, host_slots, source):
    """A device arena (a GPU's, or cpu-opaque's memory the host cannot address, as a GPU's is): records land
    in the host tier and are copied to the device slots; a miss the tier holds is a copy, not a read."""
    path = tiny if source == "gguf" else packed
    ids = _ids(304)
    backend, reference = _device_backend(tiny, reference, ids)
    opts = {"arena_gb": _arena_gb(path, 3), "backend": backend, "lock_memory": False}
    model = regolith.Model.load(path, host_cache_gb=_arena_gb(path, host_slots), **opts)
    assert model._core.arena_info()["host_slots"] == host_slots == model.plan.host_slots
    assert not model._core.arena_info()["device_routed"]
    assert "expert host tier" in model.plan.render()
    np.testing.assert_array_equal(_run(model, ids), reference)
    first = model.stats()
    np.testing.assert_array_equal(_run(model, ids), reference)
    second = model.stats()
    # every device miss is a read or a host-tier copy
    assert second["reads"] + second["host_hits"] >= second["misses"] > 0
    if host_slots == 64:  # the tier holds every expert: each is read from disk once, then copied
        assert second["reads"] == first["reads"] <= 64
        assert second["host_hits"] > first["host_hits"] > 0
        without = regolith.Model.load(path, **opts)
        _run(without, ids)
        _run(without, ids)
        assert without.stats()["host_hits"] == 0 and without.stats()["reads"] > 4 * second["reads"]


@pytest.mark.parametrize("slots", [1, 3, 17])
@pytest.mark.parametrize("source", ["gguf", "packed"])
def test_device_routing_is_bit_identical_at_any_arena_size(tiny, packed, reference, slots, source):
    """A host tier of every expert behind a device arena: every record is read at load into memory the device
    reads in place, each layer's experts run with no host round trip from whichever slot holds them, and
    between tokens the arena takes the misses the policy admits. The same bits as resident experts."""
    path = tiny if source == "gguf" else packed
    ids = _ids(304)
    backend, reference = _device_backend(tiny, reference, ids)
    model = regolith.Model.load(
        path,
        arena_gb=_arena_gb(path, slots),
        host_cache_gb=_arena_gb(path, 64),
        device_routing=True,
        backend=backend,
        lock_memory=False,
    )
    assert model._core.arena_info()["device_routed"]
    np.testing.assert_array_equal(_run(model, ids), reference)
    first = model.stats()
    # a second window: the arena as the first left it
    np.testing.assert_array_equal(_run(model, ids), reference)
    second = model.stats()
    pairs = len(ids) * model.config["n_layer"] * model.config["num_experts_per_tok"]
    assert first["reads"] == second["reads"] == 64  # each record once, at load
    assert first["hits"] + first["misses"] == pairs and second["hits"] + second["misses"] == 2 * pairs
    assert second["prefetches"] == 0 and second["read_stall_s"] == 0
    # misses are copied into the arena between tokens, at most one token's records a step
    assert 0 < first["host_hits"] <= first["misses"]
    if slots == 17:  # the second pass starts from the first's arena: it hits more often
        assert second["hits"] - first["hits"] > first["hits"] > 0
    # a 40-token prefill copies each layer's records to device memory before its products
    whole = regolith.Model.load(tiny, backend=backend).window(64).eval(ids)
    np.testing.assert_array_equal(model.window(64).eval(ids), whole)


def test_device_routing_honours_exact_activations(tiny, reference):
    """Exact products (quantized weights dequantized to f32) of experts in slots: the same bits as resident."""
    ids = _ids(304)
    backend, reference = _device_backend(tiny, reference, ids)
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        resident = _run(regolith.Model.load(tiny, backend=backend), ids)
        routed = regolith.Model.load(
            tiny,
            arena_gb=_arena_gb(tiny, 5),
            host_cache_gb=_arena_gb(tiny, 64),
            device_routing=True,
            backend=backend,
            lock_memory=False,
        )
        np.testing.assert_array_equal(_run(routed, ids), resident)
    finally:
        _core.set_exact_activations(before)
    assert not np.array_equal(resident, reference)  # the mode was on: other products than the default's


def test_device_routing_takes_moce_resident_experts_from_the_arena(tiny, reference):
    ids = _ids(304)
    backend, reference = _device_backend(tiny, reference, ids)
    opts = {
        "arena_gb": _arena_gb(tiny, 24),
        "host_cache_gb": _arena_gb(tiny, 64),
        "device_routing": True,
        "backend": backend,
        "lock_memory": False,
    }
    plain = regolith.Model.load(tiny, **opts)
    _run(plain, ids)
    moce = regolith.Model.load(tiny, moce={"bonus": 4.0, "protect": 1}, **opts)
    got = _run(moce, ids)
    assert moce._core.arena_info()["device_routed"]
    assert np.isfinite(got).all() and not np.array_equal(got, reference)
    assert moce.stats()["hit_rate"] > plain.stats()["hit_rate"]
    same = regolith.Model.load(
        tiny, moce={"bonus": 4.0, "protect": 4}, **opts
    )  # protect = k: the router's top-k
    np.testing.assert_array_equal(_run(same, ids), reference)


def test_device_routing_is_refused_where_it_cannot_be_had(tiny):
    gb = _arena_gb(tiny, 3)
    with pytest.raises(MemoryPlanError, match="host tier of every expert"):
        regolith.Model.load(
            tiny, arena_gb=gb, host_cache_gb=_arena_gb(tiny, 32), device_routing=True, backend="cpu-opaque"
        )
    with pytest.raises(MemoryPlanError, match="host tier of every expert"):
        regolith.Model.load(tiny, arena_gb=gb, device_routing=True)
    off = regolith.Model.load(tiny, arena_gb=gb, host_cache_gb=_arena_gb(tiny, 64), backend="cpu-opaque")
    assert not off._core.arena_info()["device_routed"]  # off unless asked for
    if "metal-emu" in regolith.backends.available():  # unified memory: the arena is host memory already
        with pytest.raises(regolith.RegolithError, match="device routing needs a backend"):
            regolith.Model.load(
                tiny, arena_gb=gb, host_cache_gb=_arena_gb(tiny, 64), device_routing=True, backend="metal-emu"
            )


def test_host_tier_options_are_checked(tiny):
    gb = _arena_gb(tiny, 3)
    with pytest.raises(MemoryPlanError, match="cpu backend"):
        regolith.Model.load(tiny, arena_gb=gb, host_cache_gb=4 * gb, backend="cpu")
    with pytest.raises(MemoryPlanError, match="needs arena_gb"):
        regolith.Model.load(tiny, host_cache_gb=4 * gb, backend="cpu-opaque")
    with pytest.raises(MemoryPlanError, match="no more than the arena"):
        regolith.Model.load(tiny, arena_gb=gb, host_cache_gb=gb, backend="cpu-opaque")


# ---- the pack format --------------------------------------------------------------------------------


def test_pack_layout_matches_the_source(tiny, packed):
    """experts.bin and ple.bin parsed here from docs/formats.md, compared with the source tensors byte for byte."""
    pm = pk.open_packed(packed)
    pm.verify()
    man = pm.manifest
    assert man["format"] == "regolith-pack" and man["version"] == 1 and man["source"]["name"] == tiny.name
    assert bytes.fromhex(man["source"]["fingerprint"]) == regolith.state.model_fingerprint(tiny)
    with regolith.gguf.open(tiny) as src, regolith.gguf.open(pm.dense) as dense:
        assert dense.alignment == 16384
        assert all(t.offset % 16384 == 0 for t in dense.tensors.values())
        expert_names = {n for n in src.tensors if "_exps." in n} | {"per_layer_token_embd.weight"}
        assert set(dense.tensors) == set(src.tensors) - expert_names
        for name in dense.tensors:
            np.testing.assert_array_equal(dense.tensor_bytes(name), src.tensor_bytes(name))
        md = {k: v for k, v in src.metadata.items() if k != "general.alignment"}
        assert {k: v for k, v in dense.metadata.items() if k != "general.alignment"} == md
        assert dense.metadata_types == {**src.metadata_types, "general.alignment": 4}

        raw = pm.experts.read_bytes()
        magic, version, n_layer, n_expert, align, index_off, data_off, size = struct.unpack_from(
            "<8sIIIIQQQ", raw
        )
        assert (magic, version, n_layer, n_expert, align, size) == (b"RGEXPERT", 1, 4, 16, 16384, len(raw))
        for layer in range(n_layer):
            parts = [src.tensor_bytes(f"blk.{layer}.ffn_{k}_exps.weight") for k in ("gate", "up", "down")]
            for e in range(n_expert):
                off, crc = struct.unpack_from("<QI", raw, index_off + 16 * (layer * n_expert + e))
                assert off % 16384 == 0 and off >= data_off
                record = b"".join(p[e].tobytes() for p in parts)
                assert raw[off : off + len(record)] == record
                assert crc == _core.crc32c(record, 0)

        ple = pm.ple.read_bytes()
        head = struct.unpack_from("<8sIIQQQQQQQQQ", ple)
        _, _, type_id, rows, _, row_bytes, per_block, block, n_blocks, crc_off, data, fsize = head
        table = src.tensor_bytes("per_layer_token_embd.weight")
        assert type_id == src.tensors["per_layer_token_embd.weight"].type_id
        assert (rows, row_bytes, fsize, block % 4096) == (table.shape[0], table.shape[1], len(ple), 0)
        for r in range(rows):
            at = data + (r // per_block) * block + (r % per_block) * row_bytes
            assert ple[at : at + row_bytes] == table[r].tobytes()
        crcs = np.frombuffer(ple, dtype="<u4", count=n_blocks, offset=crc_off)
        for b in range(n_blocks):
            assert crcs[b] == _core.crc32c(ple[data + b * block : data + (b + 1) * block], 0)


def test_pack_is_atomic_and_refuses_to_overwrite(tiny, tmp_path):
    out = tmp_path / "p"

    def boom(name, done, total):
        if name == "experts.bin":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pk.pack(tiny, out, progress=boom)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temporary directory is left
    pk.pack(tiny, out)
    with pytest.raises(FileExistsError):
        pk.pack(tiny, out)
    pk.pack(tiny, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)


def test_pack_refuses_a_dense_model(tmp_path):
    from tests.dense_models import tiny_model, write_gguf

    path = write_gguf(tiny_model("qwen2", 0), tmp_path / "dense.gguf")
    with pytest.raises(ModelFormatError, match="routed experts"):
        pk.pack(path, tmp_path / "p")


# ---- corruption and read errors -----------------------------------------------------------------------


def _copy_pack(packed: Path, dest: Path) -> Path:
    dest.mkdir()
    for f in packed.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_corrupt_manifest_and_truncated_files_fail_at_load(packed, tmp_path):
    p = _copy_pack(packed, tmp_path / "a")
    (p / "manifest.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        regolith.Model.load(p)
    p = _copy_pack(packed, tmp_path / "b")
    man = json.loads((p / "manifest.json").read_text())
    man["version"] = 99
    (p / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ModelFormatError, match="version 99"):
        regolith.Model.load(p)
    p = _copy_pack(packed, tmp_path / "c")
    os.truncate(p / "experts.bin", (p / "experts.bin").stat().st_size - 4096)
    with pytest.raises(ModelFormatError, match="truncated"):
        regolith.Model.load(p)
    p = _copy_pack(packed, tmp_path / "d")
    (p / "ple.bin").unlink()
    with pytest.raises(ModelFormatError, match="missing ple.bin"):
        regolith.Model.load(p)
    p = _copy_pack(packed, tmp_path / "e")
    _flip(p / "dense.gguf", (p / "dense.gguf").stat().st_size - 100)  # a weight byte
    with pytest.raises(ModelFormatError, match="dense.gguf: checksum mismatch"):
        regolith.Model.load(p)


def test_corrupt_headers_fail_at_load(packed, tmp_path):
    """Files whose manifest entry still matches (size) but whose own headers were damaged."""
    for name, offset, match in [
        ("experts.bin", 60, "header checksum"),  # the layer table
        ("experts.bin", 0, "bad magic"),
        ("ple.bin", 20, "header checksum"),
        ("ple.bin", 4096, "header checksum"),  # the block checksum table
    ]:
        p = _copy_pack(packed, tmp_path / f"{name}{offset}")
        _flip(p / name, offset)
        with pytest.raises(ModelFormatError, match=match):
            regolith.Model.load(p)


@pytest.mark.parametrize("name", ["experts.bin", "ple.bin"])
def test_corrupt_data_is_an_error_never_garbage(packed, tmp_path, name):
    p = _copy_pack(packed, tmp_path / "x")
    size = (p / name).stat().st_size
    data = struct.unpack_from("<Q", (p / name).read_bytes(), 32 if name == "experts.bin" else 72)[0]
    for offset in range(data, size, 331):  # bytes all over the records / blocks, none in the headers
        _flip(p / name, offset)
    model = regolith.Model.load(p, arena_gb=_arena_gb(p, 64))
    w = model.window(64)
    with pytest.raises(ModelFormatError, match="fails its checksum"):
        for i in range(0, 40, 8):
            w.eval(_ids(304)[i : i + 8])
    assert w.n_past == 0  # the window was reset, not left mid-way


def test_device_routing_refuses_a_corrupt_record_at_load(packed, tmp_path):
    """Routed on the device, every record is read (and checked) at load: a corrupt one is a ModelFormatError
    there, before anything runs, rather than a wrong expert later."""
    p = _copy_pack(packed, tmp_path / "x")
    data = struct.unpack_from("<Q", (p / "experts.bin").read_bytes(), 32)[0]
    _flip(p / "experts.bin", data + (p / "experts.bin").stat().st_size // 2 - data // 2)
    gb = _arena_gb(p, 3)
    with pytest.raises(ModelFormatError, match="fails its checksum"):
        regolith.Model.load(
            p,
            arena_gb=gb,
            host_cache_gb=_arena_gb(p, 64),
            device_routing=True,
            backend="cpu-opaque",
            lock_memory=False,
        )


def test_read_error_during_decode_raises_not_hangs(packed, tmp_path):
    p = _copy_pack(packed, tmp_path / "r")
    model = regolith.Model.load(p, arena_gb=_arena_gb(p, 2))
    w = model.window(64)
    w.eval(_ids(304)[:4])
    os.truncate(p / "experts.bin", 16384)  # every record is gone from under the running model
    outcome: list[BaseException | None] = []

    def decode():
        try:
            for t in _ids(304)[4:]:
                w.eval([int(t)])
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(e)

    t = threading.Thread(target=decode, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "decode hung on a failed read"
    assert isinstance(outcome[0], OSError) and "end of file" in str(outcome[0])


# ---- memory plan --------------------------------------------------------------------------------------


def test_plan_state_bytes_equal_a_saved_state(tiny, tmp_path):
    """The plan's KV/state figure equals the bytes a window at that many tokens actually holds."""
    model = regolith.Model.load(tiny)
    w = model.window(64)
    w.eval(_ids(304))  # 40 tokens: a whole number of indexer blocks (compress ratio 4)
    w.save(tmp_path / "s.state")
    head = regolith.state.read_header(tmp_path / "s.state")
    assert sum(p[3] for p in head.parts) == model.plan.sizes.state_bytes(
        40
    )  # (kind, layer, offset, bytes, crc)


def test_plan_errors_before_allocating(tiny, packed):
    with pytest.raises(MemoryPlanError, match="holds no expert"):
        regolith.Model.load(tiny, arena_gb=1e-9)
    with pytest.raises(MemoryPlanError, match="budget"):
        regolith.Model.load(packed, memory_gb=0.001)
    with pytest.raises(MemoryPlanError, match="positive"):
        regolith.Model.load(tiny, memory_gb=-1)
    sizes = regolith.Model.load(tiny).plan.sizes
    full = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20)
    assert not full.streaming and full.resident_expert_bytes == sizes.expert_bytes
    # a packed model streams: a budget that leaves room for 5.5 slots after everything else (the streamed
    # path's scratch included) gives 5 slots, within the budget
    sizes = regolith.Model.load(packed).plan.sizes
    one = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, arena_gb=sizes.slot_bytes / 2**30)
    fixed = one.total_bytes - one.arena_bytes
    assert fixed > full.total_bytes - full.resident_expert_bytes  # the batched rows
    budget = (fixed + 5.5 * sizes.slot_bytes) / 2**30
    small = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, memory_gb=budget)
    assert small.arena_slots == 5 and small.total_bytes <= small.budget_bytes
    with pytest.raises(MemoryPlanError, match="does not fit"):
        mp.plan_memory(
            sizes, n_ctx=64, overhead_bytes=1 << 20, memory_gb=budget, arena_gb=7 * sizes.slot_bytes / 2**30
        )


def test_plan_counts_every_window_of_a_parallel_server(packed):
    """A plan for N windows holds N windows' state, and an arena sized to the budget leaves their room; the
    windows that fit beside a plan fill what its budget leaves."""
    sizes = regolith.Model.load(packed).plan.sizes  # packed: streamed whatever the budget
    one = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, arena_gb=sizes.slot_bytes / 2**30)
    state = sizes.state_bytes(64)
    fixed = one.total_bytes - one.arena_bytes  # streaming: its scratch holds the batched rows too
    budget = (fixed + 3 * state + 6.5 * sizes.slot_bytes) / 2**30
    four = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, memory_gb=budget, windows=4)
    alone = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, memory_gb=budget)
    assert four.state_bytes == 4 * state and four.arena_slots == 6
    assert alone.resident_expert_bytes > four.resident_expert_bytes  # one window leaves the experts more room
    assert four.total_bytes <= four.budget_bytes and four.windows_that_fit(8) == 4
    assert four.with_windows(1).windows_that_fit(8) == 4 and four.with_windows(1).windows_that_fit(2) == 2
    assert "4 windows" in four.render()
    with pytest.raises(MemoryPlanError, match="at least one window"):
        mp.plan_memory(sizes, n_ctx=64, windows=0)


def test_plan_for_device_routing_counts_a_layers_experts_in_the_scratch(tiny):
    sizes = regolith.Model.load(tiny).plan.sizes
    slot = sizes.slot_bytes / 2**30
    opts = {"n_ctx": 64, "overhead_bytes": 1 << 20, "device": ("cuda", 1 << 40), "arena_gb": 3 * slot}
    on_demand = mp.plan_memory(sizes, host_cache_gb=64 * slot, **opts)
    routed = mp.plan_memory(sizes, host_cache_gb=64 * slot, device_routing=True, **opts)
    assert routed.host_slots == on_demand.host_slots == sizes.n_experts_total == 64
    # a prefill chunk copies one layer's records (n_expert slots) to the device, where the on-demand arena's
    # path batches the routed rows in the scratch instead
    staged = sizes.n_expert * sizes.slot_bytes
    attention = sizes.attention_per_token * 64  # at the end of the context (n_ctx)
    assert routed.scratch_bytes == sizes.scratch_bytes() + staged + attention and staged > 0
    assert on_demand.scratch_bytes == sizes.scratch_bytes(streamed=True) + attention
    assert sizes.scratch_bytes(streamed=True) > sizes.scratch_bytes()
    assert routed.device_bytes - on_demand.device_bytes == routed.scratch_bytes - on_demand.scratch_bytes
    assert "a layer's experts staged" in routed.render()
    with pytest.raises(MemoryPlanError, match="holds 32 of 64"):
        mp.plan_memory(sizes, host_cache_gb=32 * slot, device_routing=True, **opts)


def test_plan_for_a_gpu_sizes_the_arena_by_its_free_memory(tiny, packed):
    """A backend with memory of its own (a GPU) holds the dense weights, the experts or their arena, the
    state and scratch; the plan sizes them against 90% of its free memory and the rest against RAM."""
    sizes = regolith.Model.load(tiny).plan.sizes
    roomy = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, device=("cuda", 1 << 40))
    assert not roomy.streaming
    assert (
        roomy.device_bytes == sizes.dense_bytes + sizes.expert_bytes + roomy.state_bytes + roomy.scratch_bytes
    )
    assert roomy.scratch_bytes == sizes.scratch_bytes() + sizes.attention_per_token * 64
    assert roomy.host_bytes == roomy.total_bytes - roomy.device_bytes > 0
    assert "VRAM" in roomy.render() and "free on cuda" in roomy.render()
    # a packed model streams: free memory whose 90% leaves room for 5.5 slots after the fixed parts (the
    # streamed path's scratch included) gives an arena of 5
    sizes = regolith.Model.load(packed).plan.sizes
    one = mp.plan_memory(
        sizes, n_ctx=64, overhead_bytes=1 << 20, device=("cuda", 1 << 40), arena_gb=sizes.slot_bytes / 2**30
    )
    fixed = one.device_bytes - one.arena_bytes
    free = int((fixed + 5.5 * sizes.slot_bytes) / 0.9) + 1
    small = mp.plan_memory(sizes, n_ctx=64, overhead_bytes=1 << 20, device=("cuda", free))
    assert small.arena_slots == 5 and small.device_bytes <= free * 0.9
    # the host tier is RAM, however large the arena
    tier = mp.plan_memory(
        sizes,
        n_ctx=64,
        overhead_bytes=1 << 20,
        device=("cuda", free),
        arena_gb=3 * sizes.slot_bytes / 2**30,
        host_cache_gb=40 * sizes.slot_bytes / 2**30,
    )
    assert tier.device_bytes == fixed + 3 * sizes.slot_bytes and tier.host_bytes >= 40 * sizes.slot_bytes
    with pytest.raises(MemoryPlanError, match="over 90% of its"):
        mp.plan_memory(
            sizes,
            n_ctx=64,
            device=("cuda", free),
            arena_gb=7 * sizes.slot_bytes / 2**30,
            overhead_bytes=1 << 20,
        )
    with pytest.raises(MemoryPlanError, match="on cuda .dense weights, state, one expert slot"):
        mp.plan_memory(sizes, n_ctx=64, device=("cuda", fixed), overhead_bytes=1 << 20)
    assert (
        regolith.backends.device_memory("cpu") is None
        and regolith.backends.device_memory("cpu-opaque") is None
    )


RSS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import regolith
    from regolith import memory_plan as mp
    from regolith import model_sizes
    regolith.backends.device_memory(regolith.backends.resolve(None))  # a GPU's driver state: before the baseline
    before = mp.process_rss()
    model = regolith.Model.load(sys.argv[1], n_ctx=64, arena_gb=float(sys.argv[2]))
    w = model.window(64)
    ids = np.random.default_rng(0).integers(3, model.config["vocab_size"], 48).astype(np.int32)
    w.eval(ids[:16])
    for t in ids[16:]:
        w.eval([int(t)])
    p = model.plan
    print(json.dumps({"before": before, "after": mp.process_rss(), "dense": p.sizes.dense_bytes,
                      "arena": p.arena_bytes, "state": p.state_bytes, "scratch": p.scratch_bytes,
                      "ple": p.ple_cache_bytes, "experts": p.sizes.expert_bytes,
                      "reads": model.stats()["bytes_read"]}))
    """
)


def test_rss_stays_within_the_plan_when_experts_are_4x_the_arena(tmp_path):
    """A model whose experts (48 MiB) are 8x its arena: process RSS grows by at most dense + arena + state +
    scratch + PLE cache + a fixed 48 MiB (regolith's and numpy's own allocations), measured from /proc."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc")
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    save_tiny_model(
        tmp_path / "hf", 3, hidden_size=256, moe_intermediate_size=256, num_experts=48, **OVERRIDES
    )
    path = convert(tmp_path / "hf", tmp_path / "big.gguf", "f32")
    arena_gb = 6 * 2**20 / 2**30
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(path), str(arena_gb)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    r = json.loads(out.stdout)
    assert r["experts"] >= 4 * r["arena"]
    assert r["reads"] > r["arena"]  # it really streamed
    fixed = 48 << 20
    allowed = r["dense"] + r["arena"] + r["state"] + r["scratch"] + r["ple"] + fixed
    assert r["after"] - r["before"] <= allowed, (r["after"] - r["before"], allowed)
    assert (
        r["after"] - r["before"] < r["experts"]
    )  # less than the experts alone: they were never all in memory


# ---- MoCE -----------------------------------------------------------------------------------------------


def test_moce_raises_the_hit_rate_and_protect_all_is_exact(packed, reference):
    ids = _ids(304)
    arena = _arena_gb(packed, 24)  # more than one token's 16 experts: some of a layer's stay resident
    exact = regolith.Model.load(packed, arena_gb=arena, lookahead=False)
    _run(exact, ids)
    moce = regolith.Model.load(packed, arena_gb=arena, lookahead=False, moce={"bonus": 4.0, "protect": 1})
    got = _run(moce, ids)
    assert np.isfinite(got).all() and not np.array_equal(got, reference)
    assert moce.stats()["hit_rate"] > exact.stats()["hit_rate"]
    # every routed expert protected (protect = k): routing is exactly the router's top-k
    same = regolith.Model.load(packed, arena_gb=arena, moce={"bonus": 4.0, "protect": 4})
    np.testing.assert_array_equal(_run(same, ids), reference)


# ---- the cache policy -----------------------------------------------------------------------------------


def _lru_reference(trace: np.ndarray, n_expert: int, n_slots: int) -> tuple[int, int]:
    """Plain LRU written independently: each layer's experts pinned while that layer runs."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = misses = 0
    for step in trace:
        for layer, ids in enumerate(step):
            pinned: set[int] = set()
            for e in ids:
                if e < 0:
                    continue
                key = layer * n_expert + int(e)
                if key in cache:
                    hits += 1
                    cache.move_to_end(key)
                else:
                    misses += 1
                    if len(cache) >= n_slots:
                        victim = next((k for k in cache if k not in pinned), None)
                        if victim is None:
                            continue
                        del cache[victim]
                    cache[key] = None
                pinned.add(key)
    return hits, misses


@pytest.mark.parametrize("seed", range(4))
def test_replay_with_no_hot_set_is_lru(seed):
    rng = np.random.default_rng(seed)
    n_expert, k = 12, 3
    # skewed usage with some repetition, as real routing has
    p = rng.dirichlet(np.full(n_expert, 0.3))
    trace = np.stack([[rng.choice(n_expert, k, replace=False, p=p) for _ in range(3)] for _ in range(300)])
    trace = trace.astype(np.int32)
    for slots in (2, 5, 11, 36):
        got = _core.replay_trace(trace, n_expert, slots, hot_fraction=0.0)
        assert (got["hits"], got["misses"]) == _lru_reference(trace, n_expert, slots)


def _routed_reference(trace: np.ndarray, n_expert: int, n_slots: int, limit: int) -> tuple[int, int, int]:
    """The device-routed arena's policy written independently, with no hot set: each token a step whose
    experts hit where the arena held them when it began; then the step's distinct misses (its last `limit`)
    each offered to the first empty slot, else the least recently used (the lowest such slot on a tie),
    admitted where that slot is empty or its record's usage score (halved every 16 arenas' worth of uses) is
    lower than the miss's. Admitted records count as used at the step's last use."""
    decay = 0.5 ** (1 / (16 * n_slots))
    score: dict[int, float] = {}
    last: dict[int, int] = {}
    clock = 0

    def now(key: int) -> float:
        return score.get(key, 0.0) * decay ** (clock - last.get(key, 0))

    slot_key = [-1] * n_slots
    slot_used = [0] * n_slots
    hits = misses = copies = 0
    for step in trace:
        missed: list[int] = []
        for layer, ids in enumerate(step):
            for e in ids:
                key = layer * n_expert + int(e)
                clock += 1
                score[key], last[key] = now(key) + 1.0, clock
                if key in slot_key:
                    hits += 1
                    slot_used[slot_key.index(key)] = clock
                else:
                    misses += 1
                    if key not in missed:
                        missed.append(key)
        for key in missed[-limit:] if limit else []:
            if key in slot_key:
                continue
            empty = [s for s in range(n_slots) if slot_key[s] < 0]
            victim = empty[0] if empty else min(range(n_slots), key=lambda s: (slot_used[s], s))
            if slot_key[victim] >= 0 and now(key) <= now(slot_key[victim]):
                continue
            slot_key[victim], slot_used[victim] = key, clock
            copies += 1
    return hits, misses, copies


@pytest.mark.parametrize("seed", range(3))
def test_routed_replay_admits_by_usage_score(seed):
    rng = np.random.default_rng(seed)
    n_expert, k, layers = 16, 3, 3
    p = rng.dirichlet(np.full(n_expert, 0.3))
    trace = np.stack(
        [[rng.choice(n_expert, k, replace=False, p=p) for _ in range(layers)] for _ in range(300)]
    )
    trace = trace.astype(np.int32)
    for slots, limit in ((4, 9), (12, 9), (12, 2), (40, 9)):
        got = _core.replay_routed_trace(trace, n_expert, slots, hot_fraction=0.0, limit=limit)
        assert (got["hits"], got["misses"], got["copies"]) == _routed_reference(trace, n_expert, slots, limit)
    # admission copies far fewer records than admitting every miss (LRU) would, at a hit rate as good
    got = _core.replay_routed_trace(trace, n_expert, 12, hot_fraction=0.0)
    assert got["copies"] < 0.25 * got["misses"]


def test_hot_set_survives_a_scan():
    """Expert 0 used every 10th step while every step brings a one-off expert: LRU has evicted expert 0 each
    time it returns (10 newer ones in 8 slots); the learned hot set keeps it."""
    n_expert, steps = 4096, 4000
    trace = np.full((steps, 1, 2), -1, dtype=np.int32)
    trace[::10, 0, 0] = 0
    trace[:, 0, 1] = 1 + np.arange(steps) % (n_expert - 1)  # never repeats within the arena's reach
    lru = _core.replay_trace(trace, n_expert, 8, hot_fraction=0.0)
    hot = _core.replay_trace(trace, n_expert, 8, hot_fraction=0.25, refresh=16)
    assert lru["hits"] == 0
    assert hot["hits"] >= steps // 10 - 4  # expert 0 hits from the first hot-set refresh on


def test_cli_pack_inspect_plan_and_run(tiny, tmp_path, capsys):
    from regolith.cli import main

    assert main(["pack", str(tiny), str(tmp_path / "p"), "-q"]) == 0
    assert (
        main(["inspect", str(tmp_path / "p"), "--plan", "--arena-gb", str(_arena_gb(tmp_path / "p", 3))]) == 0
    )
    out = capsys.readouterr().out
    assert "expert arena" in out and "3 of 64 experts" in out
    assert (
        main(["run", str(tmp_path / "p"), "-p", "hello", "-n", "4", "--temp", "0", "--arena-gb", "0.0001"])
        == 0
    )
    err = capsys.readouterr().err
    assert "hit rate" in err and "prefetches used" in err
    assert main(["pack", str(tiny), str(tmp_path / "p"), "-q"]) == 2  # exists: an error, not a traceback
    assert mp.human_bytes(3 * 2**30) == "3 GiB"
