"""Qwen3.5 MoE (``qwen35moe``) and Qwen3-Next (``qwen3next``) against transformers 5.24 (tiny random checkpoints,
fp32), converted by regolith's converter (whose layouts tests/test_convert_qwen35moe.py and
test_convert_qwen3next.py check against llama.cpp's): whole, chunked and token by token within 1e-4; llama.cpp's
logits on the same files; the KV cache types; the plan's state against what a window holds. Their experts
streamed, quantized files, speculation and sessions: tests/model/test_moe_streaming.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith.convert import convert
from tests.dense_models import save_tiny_checkpoint, tiny_model

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
