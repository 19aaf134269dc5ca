"""The mixture-of-experts families' routed experts through the expert arena, on a quantized tiny file of each
(qwen3moe, qwen35moe, qwen3next, gpt-oss; regolith's converter, Q4_K experts): the file against its dequantized twin;
streamed through arenas of one slot, a layer's worth, one token's worth and one more, and every expert, from the
GGUF and from a pack, bit-identical to resident (lookahead on and off); the host tier and device routing on a
device arena; MoCE; speculative decoding, saved sessions and the prompt cache while streaming; the plan's
scratch against what a window's workspace holds. The families' oracle tests are tests/model/test_qwen3moe.py,
test_qwen_hybrid.py and test_gpt_oss.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import _core, model_sizes
from regolith import pack as pk
from regolith.convert import convert
from regolith.speculative import Speculation
from tests.dense_models import save_tiny_checkpoint
from tests.model.twin import write_dequantized_twin

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

ARCHES = ("qwen3moe", "qwen35moe", "qwen3next", "gptoss")
N_EXPERT, N_USED = 16, 4


@pytest.fixture(scope="module", params=ARCHES)
def quantized(request, tmp_path_factory) -> Path:
    """hidden 256 and expert width 256, so the expert and attention matrices are Q4_K (regolith's quantizer)."""
    root = tmp_path_factory.mktemp(f"{request.param}-q")
    ov = {"hidden_size": 256, "num_experts_per_tok": N_USED}
    if request.param == "gptoss":  # its experts' width and count under gpt-oss's names
        ov.update(intermediate_size=256, num_local_experts=N_EXPERT)
    else:
        ov.update(moe_intermediate_size=256, num_experts=N_EXPERT)
    return convert(save_tiny_checkpoint(request.param, root / "hf", 4, **ov), root / "q.gguf", "q4_k")


@pytest.fixture(scope="module")
def packed(quantized: Path, tmp_path_factory) -> Path:
    return pk.pack(quantized, tmp_path_factory.mktemp("moe-packed") / "q.pack")


def _ids(n: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 300, n).astype(np.int32)


def _slots(path: Path, which: str) -> int:
    """Arena slots of the file's model: one, a layer's worth (one a layer), a token's experts and one more, all."""
    with regolith.gguf.open(path) as f:
        n_layer = int(f.metadata[f"{f.architecture}.block_count"])
    return {"one": 1, "layers": n_layer, "token+1": n_layer * N_USED + 1, "all": n_layer * N_EXPERT}[which]


def test_quantized_file_matches_its_dequantized_twin(quantized, tmp_path):
    with regolith.gguf.open(quantized) as f:
        assert f.tensors["blk.0.ffn_gate_exps.weight"].type_name == "Q4_K"
    twin = write_dequantized_twin(quantized, tmp_path / "twin.gguf")
    ids = _ids(32, 1)
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        got = regolith.Model.load(quantized, kv_type="f32").window(64).eval(ids)
        want = regolith.Model.load(twin, kv_type="f32").window(64).eval(ids)
    finally:
        _core.set_exact_activations(before)
    np.testing.assert_array_equal(got, want)


def _arena_gb(path: Path, slots: int) -> float:
    """arena_gb holding exactly ``slots`` slots of this model."""
    src = pk.open_packed(path) if pk.is_packed(path) else None
    with regolith.gguf.open(src.dense if src else path) as f:
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, src.manifest if src else None)
    return slots * sizes.slot_bytes / 2**30


def _run(model: regolith.Model, ids: np.ndarray) -> np.ndarray:
    """A 13-token prefill, then one token at a time (the decode path, where lookahead prefetches)."""
    w = model.window(64)
    return np.concatenate([w.eval(ids[:13]), *(w.eval(ids[i : i + 1]) for i in range(13, len(ids)))])


@pytest.fixture(scope="module")
def reference(quantized) -> np.ndarray:
    model = regolith.Model.load(quantized)
    assert not model.plan.streaming
    return _run(model, _ids())


@pytest.mark.parametrize("which", ["one", "layers", "token+1", "all"])
@pytest.mark.parametrize("source", ["gguf", "packed"])
def test_streamed_experts_are_bit_identical_at_any_arena_size(quantized, packed, reference, which, source):
    path = quantized if source == "gguf" else packed
    slots = _slots(quantized, which)
    model = regolith.Model.load(path, arena_gb=_arena_gb(path, slots), lock_memory=False)
    assert model.plan.streaming and model._core.arena_info()["slots"] == slots
    np.testing.assert_array_equal(_run(model, _ids()), reference)
    st = model.stats()
    assert st["misses"] > 0 and st["bytes_read"] > 0
    if which == "all":  # the arena holds every expert: the second pass finds each one it routes to resident
        _run(model, _ids())
        again = model.stats()
        assert again["misses"] == st["misses"] and again["hits"] > st["hits"]
    off = regolith.Model.load(path, arena_gb=_arena_gb(path, slots), lock_memory=False, lookahead=False)
    np.testing.assert_array_equal(_run(off, _ids()), reference)


def test_lookahead_prefetches_are_used(quantized, packed):
    model = regolith.Model.load(
        packed, arena_gb=_arena_gb(packed, _slots(quantized, "token+1")), lock_memory=False
    )
    _run(model, _ids())
    st = model.stats()
    assert st["prefetches"] > 0 and st["prefetch_hits"] > 0


def _device_backend(quantized: Path, reference: np.ndarray) -> tuple[str, np.ndarray]:
    """A backend with memory of its own: the suite's where it has one, else cpu-opaque (its arena is not
    host memory, as a GPU's is), with that backend's resident output."""
    chosen = regolith.backends.resolve(None)
    backend = chosen if regolith.backends.device_memory(chosen) else "cpu-opaque"
    if backend != chosen:
        reference = _run(regolith.Model.load(quantized, backend=backend), _ids())
    return backend, reference


@pytest.mark.parametrize("source", ["gguf", "packed"])
def test_device_arena_host_tier_and_device_routing_are_bit_identical(quantized, packed, reference, source):
    path = quantized if source == "gguf" else packed
    backend, reference = _device_backend(quantized, reference)
    every = _slots(quantized, "all")
    opts = {
        "arena_gb": _arena_gb(path, _slots(quantized, "layers") + 2),
        "backend": backend,
        "lock_memory": False,
    }
    tier = regolith.Model.load(path, host_cache_gb=_arena_gb(path, every), **opts)
    np.testing.assert_array_equal(_run(tier, _ids()), reference)
    assert tier.stats()["host_hits"] > 0
    routed = regolith.Model.load(path, host_cache_gb=_arena_gb(path, every), device_routing=True, **opts)
    assert routed._core.arena_info()["device_routed"]
    np.testing.assert_array_equal(_run(routed, _ids()), reference)
    st = routed.stats()
    assert st["reads"] == every and st["prefetches"] == 0  # every record once, at load


def test_moce_raises_the_hit_rate_and_protect_all_is_exact(quantized, packed, reference):
    arena = _arena_gb(packed, _slots(quantized, "token+1"))  # one token's experts and one more
    exact = regolith.Model.load(packed, arena_gb=arena, lookahead=False, lock_memory=False)
    _run(exact, _ids())
    moce = regolith.Model.load(
        packed, arena_gb=arena, lookahead=False, lock_memory=False, moce={"bonus": 4.0, "protect": 1}
    )
    got = _run(moce, _ids())
    assert np.isfinite(got).all() and not np.array_equal(got, reference)
    assert moce.stats()["hit_rate"] > exact.stats()["hit_rate"]
    same = regolith.Model.load(packed, arena_gb=arena, lock_memory=False, moce={"bonus": 4.0, "protect": 4})
    np.testing.assert_array_equal(_run(same, _ids()), reference)


@pytest.fixture(scope="module")
def streaming(quantized, packed) -> regolith.Model:
    slots = _slots(quantized, "token+1")
    return regolith.Model.load(packed, arena_gb=_arena_gb(packed, slots), lock_memory=False, n_ctx=256)


def test_speculative_greedy_is_token_identical_while_streaming(streaming):
    rng = np.random.default_rng(2)
    base = [int(t) for t in rng.integers(3, 300, 9)]
    for prompt in (base, base * 3):
        plain = streaming.generate(prompt, 24, stream=True, speculative=False, temperature=0.0)
        text = "".join(plain)
        spec = streaming.generate(
            prompt, 24, stream=True, speculative=Speculation(gate=False), temperature=0.0
        )
        assert "".join(spec) == text and spec.tokens == plain.tokens
    assert not streaming._window.has_draft_head  # these files have no MTP head: suffix drafting only


def test_saved_session_and_prompt_cache_continue_exactly(streaming, tmp_path):
    s = regolith.Session(streaming, temperature=0.0, max_tokens=12)
    first = s.send("the quick brown fox")
    s.save(tmp_path / "s.state")
    after = s.send("jumps over")
    restored = regolith.Session.load(streaming, tmp_path / "s.state", temperature=0.0, max_tokens=12)
    assert first and restored.send("jumps over") == after

    prompt = [int(t) for t in _ids(30, 5)]
    plain = streaming.generate(prompt, 8, temperature=0.0)
    streaming.prompt_cache = regolith.PromptCache(tmp_path / "cache", 1 << 30)
    try:
        assert streaming.generate(prompt, 8, temperature=0.0) == plain  # stores the prompt
        streaming._window = None  # a new window: the prefix comes from disk
        again = streaming.generate(prompt, 8, stream=True, temperature=0.0)
        assert "".join(again) == plain and again.stats.cached_tokens > 0  # restored from disk
    finally:
        streaming.prompt_cache = None


@pytest.mark.parametrize("streamed", [False, True])
def test_the_plan_counts_the_scratch_a_prefill_chunk_holds(quantized, streamed):
    """The most a window's workspace held over one prefill chunk, resident or streamed experts: never more than
    the plan's scratch (less the backend's batch of resident experts, held outside the workspace), and the plan
    not more than twice it."""
    ids = np.random.default_rng(3).integers(0, 300, model_sizes.PREFILL_CHUNK)
    slots = _slots(quantized, "layers") + 2
    arena = {"arena_gb": _arena_gb(quantized, slots), "lock_memory": False} if streamed else {}
    model = regolith.Model.load(quantized, n_ctx=model_sizes.PREFILL_CHUNK + 1, **arena)
    w = model.window()
    w.eval(ids, all_logits=False)
    held = w._w.scratch_peak_bytes
    # the workspace's part: not the attention's buffers beside it (dense architectures)
    planned = model.plan.scratch_bytes - model.plan.sizes.attention_per_token * model.plan.n_ctx
    assert model.plan.streaming == streamed
    if not streamed:
        planned -= model.plan.sizes.expert_batch_bytes
    assert held <= planned <= 2 * held, (held, planned)
