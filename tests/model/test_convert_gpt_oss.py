"""regolith convert for gpt_oss: llama.cpp's layout (names, shapes, types, order, metadata, data) for float and
MXFP4 experts, the values against the checkpoint (float tensors) and against transformers' own MXFP4 decoding
(``convert_moe_packed_tensors``), the repacking bit for bit, and clear errors for malformed checkpoints and for
what llama.cpp's graph hard-codes. The layout oracle is llama.cpp's converter, recorded in
tests/fixtures/llamacpp/ by tools/llamacpp_fixtures/make_gptoss_layout.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import gguf

import regolith
from regolith.cli import main
from regolith.convert import convert, gpt_oss
from regolith.convert.checkpoint import Checkpoint
from tests.dense_models import save_tiny_checkpoint, save_tiny_mxfp4_checkpoint, tiny_config
from tests.llamacpp_layout import FIXTURE_DIR, GPTOSS_VARIANTS, gguf_layout

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The GPTOSS_VARIANTS checkpoints, saved as make_gptoss_layout.py saves them (same directory names)."""
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gptoss")
    out = {}
    for name, (experts, seed, ov) in GPTOSS_VARIANTS.items():
        if experts == "mxfp4":
            out[name] = save_tiny_mxfp4_checkpoint(root / name, seed, **ov)
        else:
            out[name] = save_tiny_checkpoint("gptoss", root / name, seed, **ov)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _weights(ckpt_dir: Path) -> dict[str, np.ndarray]:
    return {name: t.load() for name, t in Checkpoint(ckpt_dir).tensors()}


def _rewrite_weights(ckpt_dir: Path, edit) -> None:
    from safetensors.numpy import save_file

    tensors = _weights(ckpt_dir)
    edit(tensors)
    for f in ckpt_dir.glob("model*.safetensors"):
        f.unlink()
    save_file(tensors, str(ckpt_dir / "model.safetensors"))


def _edit_config(ckpt_dir: Path, **changes) -> None:
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg.update(changes)
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))


def _read(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF tensor -> (type name, values in numpy order), dequantized by gguf-py (the reference decoder)."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape))
        data = (
            np.asarray(t.data)
            if qtype == gguf.GGMLQuantizationType.F32
            else gguf.quants.dequantize(t.data, qtype)
        )
        out[t.name] = (qtype.name, np.asarray(data, np.float32).reshape(shape))
    return out


@pytest.mark.parametrize("variant", list(GPTOSS_VARIANTS))
def test_convert_f32_matches_llamacpp_layout(
    variant: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    expected = json.loads((FIXTURE_DIR / f"{variant}.json").read_text())
    got = gguf_layout(convert(checkpoints[variant], tmp_path / "m.gguf", "f32"))

    assert list(got["metadata"]) == list(expected["metadata"])  # same keys, same order
    for key, want in expected["metadata"].items():
        assert got["metadata"][key] == want, key
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]
    for g, want in zip(got["tensors"], expected["tensors"], strict=True):
        assert (g["shape"], g["type"], g["sha256"]) == (want["shape"], want["type"], want["sha256"]), want[
            "name"
        ]


def test_float_tensors_equal_the_checkpoint(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """Every tensor of an f32 file is the checkpoint tensor it comes from: experts transposed to [E][out][in]
    with gate and up de-interleaved (gate = columns 0::2 of gate_up_proj, up = 1::2), biases likewise."""
    hf = _weights(checkpoints["gptoss-tiny"])
    got = _read(convert(checkpoints["gptoss-tiny"], tmp_path / "m.gguf", "f32"))
    assert {t for t, _ in got.values()} == {"F32"}
    want = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "output.weight": hf["lm_head.weight"],
        "output_norm.weight": hf["model.norm.weight"],
    }
    for i in range(4):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        gate_up, gate_up_b = hf[p + "mlp.experts.gate_up_proj"], hf[p + "mlp.experts.gate_up_proj_bias"]
        want.update(
            {
                b + "attn_norm.weight": hf[p + "input_layernorm.weight"],
                b + "post_attention_norm.weight": hf[p + "post_attention_layernorm.weight"],
                b + "attn_sinks.weight": hf[p + "self_attn.sinks"],
                b + "ffn_gate_inp.weight": hf[p + "mlp.router.weight"],
                b + "ffn_gate_inp.bias": hf[p + "mlp.router.bias"],
                b + "ffn_gate_exps.weight": gate_up[..., 0::2].transpose(0, 2, 1),
                b + "ffn_up_exps.weight": gate_up[..., 1::2].transpose(0, 2, 1),
                b + "ffn_down_exps.weight": hf[p + "mlp.experts.down_proj"].transpose(0, 2, 1),
                b + "ffn_gate_exps.bias": gate_up_b[:, 0::2],
                b + "ffn_up_exps.bias": gate_up_b[:, 1::2],
                b + "ffn_down_exps.bias": hf[p + "mlp.experts.down_proj_bias"],
            }
        )
        for hf_name, out in (
            ("q_proj", "attn_q"),
            ("k_proj", "attn_k"),
            ("v_proj", "attn_v"),
            ("o_proj", "attn_output"),
        ):
            want[f"{b}{out}.weight"] = hf[f"{p}self_attn.{hf_name}.weight"]
            want[f"{b}{out}.bias"] = hf[f"{p}self_attn.{hf_name}.bias"]
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        np.testing.assert_array_equal(got[name][1], values, err_msg=name)


def _unrepack(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF MXFP4 rows [..., nb * 17] back to gpt-oss' blocks [..., nb, 16] and scales [..., nb]."""
    blk = raw.reshape(*raw.shape[:-1], raw.shape[-1] // 17, 17)
    qs = blk[..., 1:]
    codes = np.concatenate((qs & 0x0F, qs >> 4), axis=-1)  # elements 0..15, then 16..31
    return codes[..., 0::2] | (codes[..., 1::2] << 4), blk[..., 0]


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    out = np.empty((gate.shape[0], 2 * gate.shape[1], *gate.shape[2:]), gate.dtype)
    out[:, 0::2], out[:, 1::2] = gate, up
    return out


def test_mxfp4_experts_are_repacked_bit_for_bit(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """Random blocks (every E2M1 code, -0 included) and scales: the GGUF bytes unpack to the checkpoint's."""
    d = _copy(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "ck")
    rng = np.random.default_rng(7)

    def randomize(t: dict) -> None:
        for name in [n for n in t if n.endswith(("_blocks", "_scales"))]:
            lo, hi = (0, 256) if name.endswith("_blocks") else (110, 140)
            t[name] = rng.integers(lo, hi, size=t[name].shape, dtype=np.uint8)

    _rewrite_weights(d, randomize)
    hf = _weights(d)
    reader = gguf.GGUFReader(str(convert(d, tmp_path / "m.gguf", "f16")))
    raw = {t.name: (gguf.GGMLQuantizationType(t.tensor_type), np.asarray(t.data)) for t in reader.tensors}
    for i in range(4):
        p, b = f"model.layers.{i}.mlp.experts.", f"blk.{i}."
        parts = {w: raw[f"{b}ffn_{w}_exps.weight"] for w in ("gate", "up", "down")}
        assert {q for q, _ in parts.values()} == {gguf.GGMLQuantizationType.MXFP4}
        gate, up, down = (_unrepack(data) for _, data in parts.values())
        np.testing.assert_array_equal(_interleave(gate[0], up[0]), hf[p + "gate_up_proj_blocks"])
        np.testing.assert_array_equal(_interleave(gate[1], up[1]), hf[p + "gate_up_proj_scales"])
        np.testing.assert_array_equal(down[0], hf[p + "down_proj_blocks"])
        np.testing.assert_array_equal(down[1], hf[p + "down_proj_scales"])


def test_mxfp4_experts_equal_transformers_dequantization(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """gguf-py's MXFP4 decoding of the file is transformers' convert_moe_packed_tensors of the checkpoint (the
    [E, in, out] weights transformers computes with), transposed and de-interleaved, exactly."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = _weights(checkpoints["gptoss-tiny-mxfp4"])
    got = _read(convert(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "m.gguf", "f32"))

    def dense(prefix: str) -> np.ndarray:
        blocks, scales = (torch.from_numpy(hf[f"{prefix}_{k}"]) for k in ("blocks", "scales"))
        return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).numpy()

    for i in range(4):
        p, b = f"model.layers.{i}.mlp.experts.", f"blk.{i}."
        gate_up, down = dense(p + "gate_up_proj"), dense(p + "down_proj")  # [E, H, 2F], [E, F, H]
        for name, want in (
            ("ffn_gate_exps.weight", gate_up[..., 0::2].transpose(0, 2, 1)),
            ("ffn_up_exps.weight", gate_up[..., 1::2].transpose(0, 2, 1)),
            ("ffn_down_exps.weight", down.transpose(0, 2, 1)),
        ):
            assert got[b + name][0] == "MXFP4"
            np.testing.assert_array_equal(got[b + name][1], want, err_msg=b + name)
        np.testing.assert_array_equal(got[b + "ffn_gate_exps.bias"][1], hf[p + "gate_up_proj_bias"][:, 0::2])


def test_released_config_form_gives_the_same_metadata(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """config.json as the released checkpoints write it (rope_scaling + rope_theta, transformers 4) converts to
    the keys transformers 5's rope_parameters does; keys it leaves out take GptOssConfig's defaults."""
    d = _copy(checkpoints["gptoss-tiny"], tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    for k in ("swiglu_alpha", "swiglu_limit", "attention_bias", "layer_types"):
        del cfg[k]
    (d / "config.json").write_text(json.dumps(cfg))
    a = gguf_layout(convert(checkpoints["gptoss-tiny"], tmp_path / "a.gguf", "f32"))
    b = gguf_layout(convert(d, tmp_path / "b.gguf", "f32"))
    a["metadata"].pop("general.name"), b["metadata"].pop("general.name")
    assert a == b


def test_outtypes_keep_mxfp4_experts(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """MXFP4 experts stay MXFP4 for any outtype (general.file_type MOSTLY_MXFP4_MOE for float outtypes, as
    llama.cpp sets it); routers, sinks, norms and biases stay F32; float experts take the outtype."""
    with regolith.gguf.open(convert(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "a.gguf", "f16")) as f:
        types = {name: t.type_name for name, t in f.tensors.items()}
        assert f.metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    assert types["blk.0.ffn_up_exps.weight"] == "MXFP4"
    assert types["blk.0.attn_q.weight"] == "F16"
    with regolith.gguf.open(convert(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "b.gguf", "q8_0")) as f:
        types = {name: t.type_name for name, t in f.tensors.items()}
        assert f.metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert types["blk.0.ffn_down_exps.weight"] == "MXFP4"
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == "Q8_0"
    for name in (
        "ffn_gate_inp.weight",
        "attn_sinks.weight",
        "attn_norm.weight",
        "ffn_gate_exps.bias",
        "attn_q.bias",
    ):
        assert types[f"blk.0.{name}"] == "F32", name
    with regolith.gguf.open(convert(checkpoints["gptoss-tiny"], tmp_path / "c.gguf", "q8_0")) as f:
        assert f.tensors["blk.0.ffn_gate_exps.weight"].type_name == "Q8_0"
        assert f.metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)


def _assert_no_output(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"swiglu_limit": 10.0}, "swiglu_limit is 10.0; llama.cpp's gpt-oss graph hard-codes 7.0"),
        ({"swiglu_alpha": 1.5}, "swiglu_alpha is 1.5; llama.cpp's gpt-oss graph hard-codes 1.702"),
        ({"layer_types": ["full_attention", "sliding_attention"] * 2}, "layer_types must alternate"),
        ({"layer_types": ["sliding_attention"] * 4}, "layer_types must alternate"),
        ({"attention_bias": False}, "attention_bias is false"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings is true"),
        ({"sliding_window": None}, "sliding_window must be a positive integer"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
            "RoPE scaling 'linear' is not supported",
        ),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok exceeds num_local_experts"),
        ({"quantization_config": {"quant_method": "mxfp4"}}, "holds float experts but config.json"),
    ],
)
def test_config_the_graph_does_not_compute_is_refused(
    changes: dict, message: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints["gptoss-tiny"], tmp_path / "ck")
    _edit_config(d, **changes)
    with pytest.raises(regolith.ModelFormatError, match=message):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_malformed_checkpoints_are_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["gptoss-tiny"], tmp_path / "ck")
    _rewrite_weights(d, lambda t: t.pop("model.layers.2.self_attn.sinks"))
    with pytest.raises(
        regolith.ModelFormatError, match=r"missing tensors model\.layers\.2\.self_attn\.sinks"
    ):
        convert(d, tmp_path / "o.gguf")

    d = _copy(checkpoints["gptoss-tiny"], tmp_path / "ck2")

    def wrong_shape(t: dict) -> None:
        t["model.layers.1.mlp.experts.gate_up_proj"] = np.zeros((8, 64, 32), np.float32)

    _rewrite_weights(d, wrong_shape)
    with pytest.raises(
        regolith.ModelFormatError, match=r"gate_up_proj has shape \[8, 64, 32\], expected \[8, 64, 64\]"
    ):
        convert(d, tmp_path / "o.gguf")

    m = _copy(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "ck3")
    _rewrite_weights(m, lambda t: t.pop("model.layers.3.mlp.experts.down_proj_scales"))
    with pytest.raises(
        regolith.ModelFormatError, match=r"missing tensors model\.layers\.3\.mlp\.experts\.down"
    ):
        convert(m, tmp_path / "o.gguf")

    m = _copy(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "ck4")

    def float_blocks(t: dict) -> None:
        name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
        t[name] = t[name].astype(np.float32)

    _rewrite_weights(m, float_blocks)
    with pytest.raises(regolith.ModelFormatError, match=r"gate_up_proj_blocks has dtype F32, expected U8"):
        convert(m, tmp_path / "o.gguf")

    m = _copy(checkpoints["gptoss-tiny-mxfp4"], tmp_path / "ck5")
    cfg = json.loads((m / "config.json").read_text())
    del cfg["quantization_config"]
    (m / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(regolith.ModelFormatError, match="holds MXFP4 experts but config.json"):
        convert(m, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_metadata_is_pure(checkpoints: dict[str, Path]) -> None:
    """gguf_metadata and tensor_plan need only config.json and shapes: a config object's dict works too."""
    cfg = tiny_config("gptoss").to_dict()
    keys = [k for k, _, _ in gpt_oss.gguf_metadata(cfg)]
    assert keys[:2] == ["gpt-oss.block_count", "gpt-oss.context_length"]
    assert "general.file_type" not in keys and "gpt-oss.attention.sliding_window" in keys
    assert gpt_oss.file_type(cfg, int(gguf.LlamaFileType.MOSTLY_F16)) == int(gguf.LlamaFileType.MOSTLY_F16)
    mx = {**cfg, "quantization_config": {"quant_method": "mxfp4"}}
    assert gpt_oss.file_type(mx, int(gguf.LlamaFileType.MOSTLY_BF16)) == int(
        gguf.LlamaFileType.MOSTLY_MXFP4_MOE
    )


def test_cli_converts_a_gpt_oss_checkpoint(checkpoints: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.gguf"
    assert main(["convert", str(checkpoints["gptoss-tiny-mxfp4"]), str(out), "-q"]) == 0
    with regolith.gguf.open(out) as f:
        assert f.architecture == "gpt-oss"
        assert f.metadata["gpt-oss.expert_count"] == 8
        assert f.metadata["tokenizer.ggml.pre"] == "gpt-4o"
    assert main(["convert", str(checkpoints["gptoss-tiny"]), str(tmp_path / "v.gguf"), "--mmproj", "x"]) != 0
    assert "no vision tower" in capsys.readouterr().err
