"""Qwen3.5 MoE (``qwen35moe``) and Qwen3-Next (``qwen3next``) against transformers 5.24 (tiny random checkpoints,
fp32), converted by regolith's converter (whose layouts tests/test_convert_qwen35moe.py and
test_convert_qwen3next.py check against llama.cpp's): whole, chunked and token by token within 1e-4; a quantized
file against its dequantized twin;
the routed experts streamed through a tiny arena, from the GGUF and from a pack, bit-identical to resident ones
(host tier and device routing on a device arena too); MoCE; speculative decoding, saved sessions and the prompt
cache on a streaming model; the plan's state and scratch against what a window holds."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import _core
from regolith import memory_plan as mp
from regolith import pack as pk
from regolith.convert import convert
from regolith.speculative import Speculation
from tests.dense_models import save_tiny_checkpoint, tiny_model
from tests.model.twin import write_dequantized_twin

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

ARCHES = ("qwen35moe", "qwen3next")
# name: (architecture, seed, config overrides)
VARIANTS = {
    f"{arch}-{tag}": (arch, seed, ov)
    for arch in ARCHES
    for tag, seed, ov in (
        # 3 Gated DeltaNet layers (2 key heads, 4 value heads) then gated full attention, 8 experts top 3
        ("tiny", 0, {}),
        # attention first and last, GQA 4:1, tied embeddings, as many value heads as key heads, wider experts
        (
            "tiny-b",
            1,
            {
                "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"],
                "num_key_value_heads": 1,
                "tie_word_embeddings": True,
                "linear_num_value_heads": 2,
                "num_experts": 6,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 48,
            },
        ),
    )
}
TOL = 1e-4
# llama.cpp's logits on the same f32 files (tools/llamacpp_fixtures/make_qwen3_logits.py, llama-cpp-python 0.3.36)
LLAMACPP_LOGITS = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "qwen-hybrid-logits.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrid")
    return {
        name: convert(save_tiny_checkpoint(arch, root / name, seed, **ov), root / f"{name}.gguf", "f32")
        for name, (arch, seed, ov) in VARIANTS.items()
    }


@pytest.fixture(scope="module", params=ARCHES)
def quantized(request, tmp_path_factory) -> Path:
    """hidden 256 and expert width 256, so the expert and attention matrices are Q4_K (regolith's quantizer)."""
    root = tmp_path_factory.mktemp(f"{request.param}-q")
    ov = {"hidden_size": 256, "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4}
    return convert(save_tiny_checkpoint(request.param, root / "hf", 4, **ov), root / "q.gguf", "q4_k")


@pytest.fixture(scope="module")
def packed(quantized: Path, tmp_path_factory) -> Path:
    return pk.pack(quantized, tmp_path_factory.mktemp("hybrid-packed") / "q.pack")


def _ids(n: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 300, n).astype(np.int32)


def _transformers(name: str, ids: np.ndarray) -> np.ndarray:
    arch, seed, ov = VARIANTS[name]
    with torch.no_grad():
        logits = tiny_model(arch, seed, **ov)(torch.from_numpy(ids[None].astype(np.int64))).logits
    return logits[0].numpy()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_whole_chunked_and_token_by_token(files, name):
    ids = _ids()
    want = _transformers(name, ids)
    model = regolith.Model.load(files[name], kv_type="f32")
    assert model.config["architecture"] == VARIANTS[name][0]
    whole = model.window(64).eval(ids)
    np.testing.assert_allclose(whole, want, atol=TOL, rtol=0)
    w = model.window(64)
    chunked = np.concatenate([w.eval(ids[:7]), w.eval(ids[7:23]), w.eval(ids[23:])])
    np.testing.assert_allclose(chunked, want, atol=TOL, rtol=0)
    w = model.window(64)
    single = np.concatenate([w.eval(ids[i : i + 1]) for i in range(len(ids))])
    np.testing.assert_allclose(single, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_llamacpp_agrees(files, name):
    """llama.cpp is a second opinion: on the same files its qwen35moe / qwen3next graphs agree with regolith and
    with transformers within 1e-4 of the largest logit (measured: 1.3e-6 to 6.2e-6)."""
    with np.load(LLAMACPP_LOGITS) as f:
        ids, lc = f[f"{name}/ids"], f[f"{name}/logits"]
    np.testing.assert_array_equal(ids, _ids())
    ours = regolith.Model.load(files[name], kv_type="f32").window(64).eval(ids)
    want = _transformers(name, ids)
    scale = np.abs(want).max()
    assert np.abs(lc - want).max() <= 1e-4 * scale and np.abs(lc - ours).max() <= 1e-4 * scale


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "i8"])
def test_quantized_attention_caches_are_used_and_stay_close(files, arch, kv_type):
    """The full-attention layers' KV caches of each type (f16 is the default, as llama.cpp's) hold fewer bytes
    than f32's and change the logits a little: the median row by under 1e-2 of the largest logit (measured
    2.5e-3; f16 under 3e-4, measured 1e-4).
    Single rows may move more: an 8-bit key can flip a tiny random router's top-k choice (measured: 1 of 40
    rows by 0.23)."""
    ids = _ids()
    path = files[f"{arch}-tiny"]
    exact_model = regolith.Model.load(path, kv_type="f32")
    exact_w = exact_model.window(64)
    exact = exact_w.eval(ids)
    model = regolith.Model.load(path, kv_type=kv_type)
    assert model.kv_type == kv_type and regolith.Model.load(path).kv_type == "f16"
    w = model.window(64)
    got = w.eval(ids)
    assert w._w.attention_cache_bytes < exact_w._w.attention_cache_bytes
    rows = np.abs(got - exact).max(axis=1) / np.abs(exact).max()
    assert rows.max() > 0 and np.median(rows) < {"f16": 3e-4, "q8_0": 1e-2, "i8": 1e-2}[kv_type], rows


@pytest.mark.parametrize("arch", ARCHES)
def test_config_and_plan(files, arch):
    model = regolith.Model.load(files[f"{arch}-tiny"], kv_type="f32")
    c = model.config
    assert c["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert (c["num_experts"], c["num_experts_per_tok"], c["shared_expert_intermediate_size"]) == (8, 3, 48)
    assert c["hc_count"] == 1 and not c["mtp"]
    sizes = model.plan.sizes
    assert sizes.architecture == arch and sizes.n_expert == 8 and len(sizes.expert_record_bytes) == 4
    assert sizes.expert_record_bytes[0] == 3 * 32 * 64 * 4  # f32 gate, up and down of one expert
    # per token: one attention layer's keys and values (2 kv heads of 32, f32); fixed: three Gated DeltaNet
    # layers' conv history (3 taps of 2*2*16 + 4*16 channels) and recurrent state (4 heads of 16 x 16), f32
    assert sizes.state_per_token == 2 * 2 * 32 * 4
    assert sizes.state_fixed == 3 * 4 * (3 * 128 + 4 * 16 * 16)
    w = model.window(64)
    w.eval(_ids(40))
    assert w._w.attention_cache_bytes >= 40 * sizes.state_per_token


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
        sizes = mp.sizes_from_gguf(f.tensors, f.metadata, src.manifest if src else None)
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


@pytest.mark.parametrize("slots", [1, 4, 17, 64])
@pytest.mark.parametrize("source", ["gguf", "packed"])
def test_streamed_experts_are_bit_identical_at_any_arena_size(quantized, packed, reference, slots, source):
    path = quantized if source == "gguf" else packed
    model = regolith.Model.load(path, arena_gb=_arena_gb(path, slots), lock_memory=False)
    assert model.plan.streaming and model._core.arena_info()["slots"] == slots
    np.testing.assert_array_equal(_run(model, _ids()), reference)
    st = model.stats()
    assert st["misses"] > 0 and st["bytes_read"] > 0
    if slots == 64:  # the arena holds every expert: the second pass finds each one it routes to resident
        _run(model, _ids())
        again = model.stats()
        assert again["misses"] == st["misses"] and again["hits"] > st["hits"]
    off = regolith.Model.load(path, arena_gb=_arena_gb(path, slots), lock_memory=False, lookahead=False)
    np.testing.assert_array_equal(_run(off, _ids()), reference)


def test_lookahead_prefetches_are_used(packed):
    model = regolith.Model.load(packed, arena_gb=_arena_gb(packed, 17), lock_memory=False)
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
    opts = {"arena_gb": _arena_gb(path, 6), "backend": backend, "lock_memory": False}
    tier = regolith.Model.load(path, host_cache_gb=_arena_gb(path, 64), **opts)
    np.testing.assert_array_equal(_run(tier, _ids()), reference)
    assert tier.stats()["host_hits"] > 0
    routed = regolith.Model.load(path, host_cache_gb=_arena_gb(path, 64), device_routing=True, **opts)
    assert routed._core.arena_info()["device_routed"]
    np.testing.assert_array_equal(_run(routed, _ids()), reference)
    st = routed.stats()
    assert st["reads"] == 64 and st["prefetches"] == 0  # every record once, at load


def test_moce_raises_the_hit_rate_and_protect_all_is_exact(packed, reference):
    arena = _arena_gb(packed, 17)  # one token's 16 experts and one more
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
def streaming(packed) -> regolith.Model:
    return regolith.Model.load(packed, arena_gb=_arena_gb(packed, 17), lock_memory=False, n_ctx=256)


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


@pytest.mark.parametrize("slots", [0, 6])
def test_the_plan_counts_the_scratch_a_prefill_chunk_holds(quantized, slots):
    """The most a window's workspace held over one prefill chunk, resident or streamed experts: never more than
    the plan's scratch (less the backend's batch of resident experts, held outside the workspace), and the plan
    not more than twice it."""
    ids = np.random.default_rng(3).integers(0, 300, mp.PREFILL_CHUNK)
    arena = {"arena_gb": _arena_gb(quantized, slots), "lock_memory": False} if slots else {}
    model = regolith.Model.load(quantized, n_ctx=mp.PREFILL_CHUNK + 1, **arena)
    w = model.window()
    w.eval(ids, all_logits=False)
    held, planned = w._w.scratch_peak_bytes, model.plan.scratch_bytes
    assert model.plan.streaming == bool(slots)
    if not slots:
        planned -= model.plan.sizes.expert_batch_bytes
    assert held <= planned <= 2 * held, (held, planned)
