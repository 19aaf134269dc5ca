"""regolith convert for Qwen3.5 MoE (qwen3_5_moe): llama.cpp's qwen35moe layout (names, shapes, types, order,
metadata, data) with and without the MTP head, the ForConditionalGeneration nesting, fused experts, and clear
errors for what llama.cpp's graph does not compute. The layout oracle is llama.cpp's converter, recorded in
tests/fixtures/llamacpp/ by tools/llamacpp_fixtures/make_qwen3_layout.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith.cli import main
from regolith.convert import convert, qwen35moe
from regolith.convert.checkpoint import Checkpoint
from tests.dense_models import save_tiny_checkpoint
from tests.llamacpp_layout import FIXTURE_DIR, QWEN35MOE_VARIANTS, gguf_layout

os.environ.setdefault("OMP_NUM_THREADS", "1")

_DELETE = object()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen35moe")
    return {
        name: save_tiny_checkpoint(arch, root / name, seed, **ov)
        for name, (arch, seed, ov) in QWEN35MOE_VARIANTS.items()
    }


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_files(ckpt_dir: Path, edit) -> None:
    """``edit(file_name, tensors)`` on every safetensors file of the checkpoint, each saved back in place."""
    from safetensors.numpy import save_file

    for f in sorted(ckpt_dir.glob("model*.safetensors")):
        tensors = {name: t.load() for name, t in Checkpoint(ckpt_dir).tensors() if t.path == f}
        edit(f.name, tensors)
        f.unlink()
        save_file(tensors, str(f))


def _edit_config(ckpt_dir: Path, **changes) -> None:
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is _DELETE:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))


def _assert_no_output(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


@pytest.mark.parametrize("variant", list(QWEN35MOE_VARIANTS))
def test_convert_f32_matches_llamacpp_layout(
    variant: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    expected = json.loads((FIXTURE_DIR / f"{variant}.json").read_text())
    got = gguf_layout(convert(checkpoints[variant], tmp_path / "m.gguf", "f32"))

    assert list(got["metadata"]) == list(expected["metadata"])  # same keys, same order: no regolith keys
    for key, want in expected["metadata"].items():
        assert got["metadata"][key] == want, key
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]
    for g, want in zip(got["tensors"], expected["tensors"], strict=True):
        assert (g["shape"], g["type"], g["sha256"]) == (want["shape"], want["type"], want["sha256"]), want[
            "name"
        ]


def test_conditional_generation_gives_the_same_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """Qwen3_5MoeForConditionalGeneration: text_config nested, the text model under model.language_model,
    a vision tower beside it (dropped), the MTP head at the top level."""
    name = "qwen35moe-tiny-mtp"
    d = _copy(checkpoints[name], tmp_path / "vl" / name)
    flat = json.loads((d / "config.json").read_text())
    text = {k: v for k, v in flat.items() if k not in ("architectures", "tie_word_embeddings")}
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64},
        "tie_word_embeddings": False,
        "image_token_id": 5,
    }
    (d / "config.json").write_text(json.dumps(config))

    def nest(file: str, t: dict) -> None:
        for k in [k for k in t if k.startswith("model.")]:
            t["model.language_model." + k[len("model.") :]] = t.pop(k)
        if file == "model.safetensors":
            t["model.visual.blocks.0.attn.qkv.weight"] = np.ones((96, 32), np.float32)
            t["model.visual.merger.linear_fc1.weight"] = np.ones((64, 128), np.float32)

    _rewrite_files(d, nest)
    assert "model.language_model.layers.0.linear_attn.A_log" in dict(Checkpoint(d).tensors())
    a = gguf_layout(convert(checkpoints[name], tmp_path / "a.gguf", "f32"))
    b = gguf_layout(convert(d, tmp_path / "b.gguf", "f32"))
    assert b == a


def test_fused_experts_give_the_same_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """transformers' in-memory layout (gate_up_proj [E, 2F, H], down_proj [E, H, F]) converts to the file the
    per-expert checkpoint does; the MTP variant's fused MTP experts, split per expert, too."""
    name = "qwen35moe-tiny"
    d = _copy(checkpoints[name], tmp_path / "fused" / name)
    E = 8

    def fuse(_file: str, t: dict) -> None:
        for layer in range(4):
            p = f"model.layers.{layer}.mlp.experts."
            gate = [t.pop(f"{p}{e}.gate_proj.weight") for e in range(E)]
            up = [t.pop(f"{p}{e}.up_proj.weight") for e in range(E)]
            down = [t.pop(f"{p}{e}.down_proj.weight") for e in range(E)]
            t[p + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up, strict=True)])
            t[p + "down_proj"] = np.stack(down)

    _rewrite_files(d, fuse)
    assert "model.layers.0.mlp.experts.gate_up_proj" in dict(Checkpoint(d).tensors())
    a = gguf_layout(convert(checkpoints[name], tmp_path / "a.gguf", "f32"))
    assert gguf_layout(convert(d, tmp_path / "b.gguf", "f32")) == a

    name = "qwen35moe-tiny-mtp"
    d = _copy(checkpoints[name], tmp_path / "split" / name)

    def split(file: str, t: dict) -> None:
        if file != "model-mtp.safetensors":
            return
        p = "mtp.layers.0.mlp.experts."
        gate_up, down = t.pop(p + "gate_up_proj"), t.pop(p + "down_proj")
        for e in range(E):
            t[f"{p}{e}.gate_proj.weight"] = gate_up[e, :32]
            t[f"{p}{e}.up_proj.weight"] = gate_up[e, 32:]
            t[f"{p}{e}.down_proj.weight"] = down[e]

    _rewrite_files(d, split)
    assert "mtp.layers.0.mlp.experts.7.down_proj.weight" in dict(Checkpoint(d).tensors())
    a = gguf_layout(convert(checkpoints[name], tmp_path / "c.gguf", "f32"))
    assert gguf_layout(convert(d, tmp_path / "d.gguf", "f32")) == a


def test_mtp_in_config_without_mtp_tensors_writes_no_mtp_block(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A checkpoint saved by transformers (no mtp.* tensors) of a model whose config.json keeps
    mtp_num_hidden_layers gets the file llama.cpp's --no-mtp writes."""
    d = _copy(checkpoints["qwen35moe-tiny"], tmp_path / "qwen35moe-tiny")
    _edit_config(d, mtp_num_hidden_layers=1)
    expected = json.loads((FIXTURE_DIR / "qwen35moe-tiny.json").read_text())
    got = gguf_layout(convert(d, tmp_path / "m.gguf", "f32"))
    assert got["metadata"] == expected["metadata"]
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]


def test_default_mrope_sections_are_written() -> None:
    """llama.cpp's loader requires rope.dimension_sections: [11, 11, 10, 0] when the config gives none."""
    cfg = json.loads((FIXTURE_DIR / "qwen35moe-tiny.json").read_text())["source"]
    from tests.dense_models import tiny_config

    config = tiny_config("qwen35moe", **cfg["overrides"]).to_dict()
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    md = qwen35moe.gguf_metadata(config)
    assert md[-1][:2] == ("qwen35moe.rope.dimension_sections", [11, 11, 10, 0])
    assert ("qwen35moe.rope.dimension_count", 8) in [m[:2] for m in md]  # partial_rotary_factor 0.25
    assert sum(k == "qwen35moe.rope.dimension_sections" for k, _, _ in md) == 1


def test_quantized_outtype_keeps_routers_norms_and_conv_f32(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    with regolith.gguf.open(convert(checkpoints["qwen35moe-tiny"], tmp_path / "m.gguf", "q8_0")) as f:
        types = {name: t.type_name for name, t in f.tensors.items()}
    for name in (
        "blk.0.ffn_gate_inp.weight",
        "blk.0.ffn_gate_inp_shexp.weight",
        "blk.0.ssm_conv1d.weight",
        "blk.0.ssm_a",
        "blk.0.ssm_dt.bias",
        "blk.0.ssm_norm.weight",
        "blk.0.post_attention_norm.weight",
        "blk.3.attn_q_norm.weight",
    ):
        assert types[name] == "F32", name
    for name in (
        "blk.0.ffn_gate_exps.weight",
        "blk.0.attn_qkv.weight",
        "blk.3.attn_q.weight",
        "output.weight",
    ):
        assert types[name] == "Q8_0", name


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "rope_type 'yarn'"),
        ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 4 layer types"),
        (
            {"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
            "unknown layer types 'sliding_attention'",
        ),
        ({"layer_types": _DELETE}, "layer_types must list 4 layer types, got None"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads must be a multiple of linear_num_key_heads"),
        ({"linear_value_head_dim": 8}, "linear_key_head_dim and linear_value_head_dim differ"),
        ({"num_experts": _DELETE}, "num_experts must be a positive integer, got None"),
        ({"hidden_size": "64"}, "hidden_size must be a positive integer, got '64'"),
        (
            {"shared_expert_intermediate_size": 0},
            "shared_expert_intermediate_size must be a positive integer",
        ),
        ({"rms_norm_eps": "1e-6"}, "rms_norm_eps must be a positive number"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok exceeds num_experts"),
        ({"mtp_num_hidden_layers": 2}, "mtp_num_hidden_layers must be 0 or 1"),
        ({"mtp_use_dedicated_embeddings": True}, "mtp_use_dedicated_embeddings"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_config_the_graph_does_not_compute_is_refused(
    changes: dict, message: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints["qwen35moe-tiny"], tmp_path / "ck")
    _edit_config(d, **changes)
    with pytest.raises(regolith.ModelFormatError, match=message):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


@pytest.mark.parametrize(
    ("variant", "edit", "message"),
    [
        (
            "qwen35moe-tiny",
            lambda f, t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"),
            "layer 2 has 23 of 24 expert tensors",
        ),
        (
            "qwen35moe-tiny",
            lambda f, t: t.update(
                {"model.layers.1.linear_attn.in_proj_z.weight": np.zeros((63, 64), np.float32)}
            ),
            r"in_proj_z\.weight has shape \[63, 64\], expected \[64, 64\]",
        ),
        (
            "qwen35moe-tiny",
            lambda f, t: t.pop("model.layers.3.self_attn.q_norm.weight"),
            r"missing tensors model\.layers\.3\.self_attn\.q_norm\.weight",
        ),
        (
            "qwen35moe-tiny",
            lambda f, t: t.update({"model.layers.3.linear_attn.A_log": np.zeros(4, np.float32)}),
            r"unexpected tensor model\.layers\.3\.linear_attn\.A_log \(layer 3 is full_attention\)",
        ),
        (
            "qwen35moe-tiny",
            lambda f, t: t.update({"model.layers.4.input_layernorm.weight": np.zeros(64, np.float32)}),
            "beyond num_hidden_layers",
        ),
        (
            "qwen35moe-tiny-mtp",
            lambda f, t: f == "model-mtp.safetensors" and t.pop("mtp.pre_fc_norm_hidden.weight"),
            r"missing tensors mtp\.pre_fc_norm_hidden\.weight",
        ),
        (
            "qwen35moe-tiny-mtp",
            lambda f, t: (
                f == "model-mtp.safetensors"
                and t.update({"mtp.layers.1.input_layernorm.weight": np.zeros(64, np.float32)})
            ),
            "MTP layer 1; llama.cpp's qwen35moe graph has one MTP layer",
        ),
    ],
)
def test_malformed_checkpoint_is_refused(
    variant: str, edit, message: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints[variant], tmp_path / "ck")
    _rewrite_files(d, edit)
    with pytest.raises(regolith.ModelFormatError, match=message):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_cli_converts_a_qwen35moe_checkpoint(checkpoints: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.gguf"
    assert main(["convert", str(checkpoints["qwen35moe-tiny-mtp"]), str(out), "--outtype", "q4_0", "-q"]) == 0
    with regolith.gguf.open(out) as f:
        assert f.architecture == "qwen35moe"
        assert f.metadata["qwen35moe.block_count"] == 5
        assert f.metadata["qwen35moe.nextn_predict_layers"] == 1
    assert (
        main(["convert", str(checkpoints["qwen35moe-tiny"]), str(tmp_path / "v.gguf"), "--mmproj", "x"]) != 0
    )
    assert "has no vision tower" in capsys.readouterr().err  # a text-only checkpoint (CausalLM)
