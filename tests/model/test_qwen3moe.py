"""qwen3 and qwen3moe against transformers 5.24 (tiny random checkpoints, fp32), converted by regolith's converter
(whose layout tests/test_convert_qwen3.py checks against llama.cpp's): whole, chunked and token by token within
1e-4, and llama.cpp's logits on the same files. qwen3moe's experts streamed, quantized files, speculation and
sessions: tests/model/test_moe_streaming.py."""

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
from tests.llamacpp_layout import QWEN3_VARIANTS

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

VARIANTS = {**QWEN3_VARIANTS, "qwen3moe-unnormalised": ("qwen3moe", 3, {"norm_topk_prob": False})}
TOL = 1e-4
# llama.cpp's logits on the same f32 files (tools/llamacpp_fixtures/make_qwen3_logits.py, llama-cpp-python 0.3.36)
LLAMACPP_LOGITS = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "qwen3-logits.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3moe")
    out = {}
    for name, (arch, seed, ov) in VARIANTS.items():
        out[name] = convert(save_tiny_checkpoint(arch, root / name, seed, **ov), root / f"{name}.gguf", "f32")
    return out


def _ids(n: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 300, n).astype(np.int32)


def _transformers(name: str, ids: np.ndarray) -> np.ndarray:
    arch, seed, ov = VARIANTS[name]
    with torch.no_grad():
        return tiny_model(arch, seed, **ov)(torch.from_numpy(ids[None].astype(np.int64))).logits[0].numpy()


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
def test_llamacpp_agrees_where_its_graph_computes_what_transformers_does(files, name):
    """llama.cpp is a second opinion: on the same files it agrees with regolith and transformers (measured
    5e-7 relative or less), except where its qwen3moe graph renormalises the top-k weights a checkpoint does not."""
    with np.load(LLAMACPP_LOGITS) as f:
        ids, lc = f[f"{name}/ids"], f[f"{name}/logits"]
    np.testing.assert_array_equal(ids, _ids())
    ours = regolith.Model.load(files[name], kv_type="f32").window(64).eval(ids)
    want = _transformers(name, ids)
    rel = float(np.abs(lc - want).max() / np.abs(want).max())
    if VARIANTS[name][2].get("norm_topk_prob", True):
        assert rel <= 1e-4 and float(np.abs(lc - ours).max() / np.abs(ours).max()) <= 1e-4
    else:
        assert rel > 0.01  # llama.cpp ignores qwen3moe.expert_weights_norm


def test_qwen3moe_config_and_plan(files):
    model = regolith.Model.load(files["qwen3moe-tiny"])
    c = model.config
    assert (c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["norm_topk_prob"]) == (
        8,
        3,
        32,
        True,
    )
    sizes = model.plan.sizes
    assert sizes.n_expert == 8 and sizes.n_used == 3 and len(sizes.expert_record_bytes) == 3
    assert sizes.expert_record_bytes[0] == 3 * 32 * 64 * 4  # f32 gate, up and down of one expert
    assert not model.plan.streaming  # tiny: every expert resident
    assert regolith.Model.load(files["qwen3moe-unnormalised"]).config["norm_topk_prob"] is False
