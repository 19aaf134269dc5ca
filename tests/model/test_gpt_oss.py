"""gpt-oss against transformers 5.24 (tiny random checkpoints, fp32; tests/dense_models.py ``gptoss``), converted by
regolith's converter (whose layout tests/model/test_convert_gpt_oss.py checks against llama.cpp's): whole, chunked
and token by token within 1e-4 (llama.cpp's logits on the same files: transformers' with YaRN rounded) over prompts longer than the sliding window, so the attention sinks, the
alternating sliding-window layers, YaRN RoPE (not truncated, as the released configs say), the biased router and
experts and the clamped SwiGLU all count; a checkpoint with MXFP4 experts against transformers running the
experts it dequantizes. The experts streamed, quantized files, speculation and sessions:
tests/model/test_moe_streaming.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import _core
from regolith.convert import convert
from regolith.errors import ModelFormatError
from tests.dense_models import save_tiny_checkpoint, save_tiny_mxfp4_checkpoint, tiny_model
from tests.llamacpp_layout import GPTOSS_VARIANTS

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

TOL = 1e-4
# the float-expert checkpoints: name -> (tests/dense_models.py arch, seed, overrides)
VARIANTS = {
    name: ("gptoss", seed, ov) for name, (kind, seed, ov) in GPTOSS_VARIANTS.items() if kind == "float"
}
FLOAT = list(VARIANTS)
# llama.cpp's logits on the same f32 files (tools/llamacpp_fixtures/make_qwen3_logits.py gptoss,
# llama-cpp-python 0.3.36)
LLAMACPP_LOGITS = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "gptoss-logits.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gptoss")
    out = {}
    for name, (kind, seed, ov) in GPTOSS_VARIANTS.items():
        save = (
            save_tiny_mxfp4_checkpoint
            if kind == "mxfp4"
            else lambda p, s, **o: save_tiny_checkpoint("gptoss", p, s, **o)
        )
        out[name] = convert(save(root / name, seed, **ov), root / f"{name}.gguf", "f32")
    return out


def _ids(n: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 300, n).astype(np.int32)


def _transformers(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids[None].astype(np.int64))).logits[0].numpy()


def _check_three_ways(path: Path, ids: np.ndarray, want: np.ndarray) -> None:
    model = regolith.Model.load(path, kv_type="f32")
    np.testing.assert_allclose(model.window(64).eval(ids), want, atol=TOL, rtol=0)
    w = model.window(64)
    chunked = np.concatenate([w.eval(ids[:7]), w.eval(ids[7:23]), w.eval(ids[23:])])
    np.testing.assert_allclose(chunked, want, atol=TOL, rtol=0)
    w = model.window(64)
    single = np.concatenate([w.eval(ids[i : i + 1]) for i in range(len(ids))])
    np.testing.assert_allclose(single, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", FLOAT)
def test_logits_match_transformers_whole_chunked_and_token_by_token(files, name):
    _, seed, ov = GPTOSS_VARIANTS[name]
    ids = _ids()
    _check_three_ways(files[name], ids, _transformers(tiny_model("gptoss", seed, **ov), ids))


@pytest.mark.parametrize("name", FLOAT)
def test_llamacpp_computes_the_same_model_but_rounds_yarns_correction_range(files, name):
    """llama.cpp is a second opinion: on the same files it computes transformers' gpt-oss with YaRN's correction
    range rounded out (ggml_rope_yarn_corr_dims floors and ceils it; gpt-oss's configs say truncate: false,
    which no GGUF key records), measured 1.3e-6 from it, and so differs from regolith and transformers by
    ~1e-2 on these logits."""
    arch, seed, ov = VARIANTS[name]
    with np.load(LLAMACPP_LOGITS) as f:
        ids, lc = f[f"{name}/ids"], f[f"{name}/logits"]
    np.testing.assert_array_equal(ids, _ids())
    rope = dict(tiny_model(arch, seed, **ov).config.rope_parameters, truncate=True)
    np.testing.assert_allclose(
        lc, _transformers(tiny_model(arch, seed, **ov, rope_parameters=rope), ids), atol=TOL, rtol=0
    )
    ours = regolith.Model.load(files[name], kv_type="f32").window(64).eval(ids)
    assert np.abs(lc - ours).max() > 10 * TOL


def test_the_oracle_tells_truncated_yarn_and_missing_sinks_apart(files):
    """The comparison above fails for each piece of gpt-oss computed otherwise: YaRN's correction range rounded
    out (transformers' default, llama.cpp's rule), the sinks dropped (the clamp: the next test)."""
    _, seed, ov = GPTOSS_VARIANTS["gptoss-tiny"]
    ids = _ids()
    ours = regolith.Model.load(files["gptoss-tiny"], kv_type="f32").window(64).eval(ids)
    reference = tiny_model("gptoss", seed, **ov)
    rope = dict(reference.config.rope_parameters, truncate=True)
    truncated = tiny_model("gptoss", seed, **ov, rope_parameters=rope)
    assert np.abs(ours - _transformers(truncated, ids)).max() > 10 * TOL
    no_sinks = tiny_model("gptoss", seed, **ov)
    with torch.no_grad():
        for layer in no_sinks.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
    assert np.abs(ours - _transformers(no_sinks, ids)).max() > 10 * TOL


def _clamping_checkpoint(path: Path) -> Path:
    """gptoss-tiny with its experts' gate / up products scaled up tenfold, so that a good share of them pass
    the SwiGLU's clamps at +-7 (the tiny model's own stay within +-2)."""
    from safetensors.numpy import load_file, save_file

    _, seed, ov = GPTOSS_VARIANTS["gptoss-tiny"]
    save_tiny_checkpoint("gptoss", path, seed, **ov)
    (file,) = path.glob("model*.safetensors")
    tensors = load_file(str(file))
    for name in tensors:
        if name.endswith(("experts.gate_up_proj", "experts.gate_up_proj_bias")):
            tensors[name] = tensors[name] * np.float32(10.0)
    save_file(tensors, str(file), metadata={"format": "pt"})
    return path


def test_the_clamped_swiglu_matches_transformers_where_it_clamps(tmp_path):
    from transformers import GptOssForCausalLM

    hf = _clamping_checkpoint(tmp_path / "hf")
    reference = GptOssForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    ids = _ids()
    clamped = 0

    def count(module, args, output):
        nonlocal clamped
        x = args[0]
        gate_up = torch.einsum("th,ehf->etf", x, module.gate_up_proj) + module.gate_up_proj_bias[:, None]
        clamped += int((gate_up[..., ::2] > 7).sum() + (gate_up[..., 1::2].abs() > 7).sum())

    hooks = [layer.mlp.experts.register_forward_hook(count) for layer in reference.model.layers]
    want = _transformers(reference, ids)
    for h in hooks:
        h.remove()
    assert clamped > 1000  # products past a clamp, counted over every expert (routed or not)
    _check_three_ways(convert(hf, tmp_path / "c.gguf", "f32"), ids, want)
    unclamped = GptOssForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    for layer in unclamped.model.layers:
        layer.mlp.experts.limit = 1e9
    ours = regolith.Model.load(tmp_path / "c.gguf", kv_type="f32").window(64).eval(ids)
    assert np.abs(ours - _transformers(unclamped, ids)).max() > 10 * TOL


def test_mxfp4_experts_match_transformers_on_the_experts_they_dequantize(files, tmp_path):
    """A checkpoint as the released ones (experts as MXFP4 blocks and scales) keeps its experts MXFP4 in the
    GGUF; with float activations (exact mode) the model is transformers' with those experts dequantized by
    transformers' own ``convert_moe_packed_tensors``."""
    from safetensors.numpy import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    _, seed, ov = GPTOSS_VARIANTS["gptoss-tiny-mxfp4"]
    with regolith.gguf.open(files["gptoss-tiny-mxfp4"]) as f:
        assert f.tensors["blk.0.ffn_gate_exps.weight"].type_name == "MXFP4"
    ckpt = load_file(str(save_tiny_mxfp4_checkpoint(tmp_path / "hf", seed, **ov) / "model.safetensors"))
    model = tiny_model("gptoss", seed, **ov)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for part in ("gate_up_proj", "down_proj"):
                p = f"model.layers.{i}.mlp.experts.{part}"
                blocks, scales = torch.from_numpy(ckpt[p + "_blocks"]), torch.from_numpy(ckpt[p + "_scales"])
                w = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
                getattr(layer.mlp.experts, part).copy_(w)
    ids = _ids(40, 3)
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        _check_three_ways(files["gptoss-tiny-mxfp4"], ids, _transformers(model, ids))
    finally:
        _core.set_exact_activations(before)


def test_config_reports_gpt_oss(files):
    c = regolith.Model.load(files["gptoss-tiny"]).config
    assert c["architecture"] == "gpt-oss"
    assert c["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert (c["sliding_window"], c["rope_type"], c["original_max_position_embeddings"]) == (8, "yarn", 4096)
    assert c["rope_scaling_factor"] == pytest.approx(32.0)
    assert c["rope_attention_factor"] == pytest.approx(0.1 * np.log(32.0) + 1.0)
    assert (c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]) == (8, 3, 32)
    assert c["experts_activation"] == "swiglu_oai" and c["experts_bias"] and c["attention_sinks"]


def test_a_file_missing_its_sinks_is_refused(files, tmp_path):
    from tests.model.twin import write_dequantized_twin

    broken = write_dequantized_twin(files["gptoss-tiny"], tmp_path / "b.gguf", drop="blk.1.attn_sinks.weight")
    with pytest.raises(ModelFormatError, match="blk.1.attn_sinks.weight"):
        regolith.Model.load(broken)
    broken = write_dequantized_twin(
        files["gptoss-tiny"], tmp_path / "c.gguf", drop="blk.0.ffn_down_exps.bias"
    )
    with pytest.raises(ModelFormatError, match="blk.0.ffn_down_exps.bias"):
        regolith.Model.load(broken)
