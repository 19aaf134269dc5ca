"""regolith convert for qwen3 and qwen3_moe: llama.cpp's layout (names, shapes, types, order, metadata, data),
fused expert checkpoints, the regolith key for norm_topk_prob, and clear errors for what the graphs do not
compute. The layout oracle is llama.cpp's converter, recorded in tests/fixtures/llamacpp/ by
tools/llamacpp_fixtures/make_qwen3_layout.py."""

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
from regolith.convert import convert, qwen3
from regolith.convert.checkpoint import Checkpoint
from tests.dense_models import save_tiny_checkpoint
from tests.llamacpp_layout import FIXTURE_DIR, QWEN3_VARIANTS, gguf_layout

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen3")
    return {
        name: save_tiny_checkpoint(arch, root / name, seed, **ov)
        for name, (arch, seed, ov) in QWEN3_VARIANTS.items()
    }


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_weights(ckpt_dir: Path, edit) -> None:
    from safetensors.numpy import save_file

    tensors = {name: t.load() for name, t in Checkpoint(ckpt_dir).tensors()}
    edit(tensors)
    for f in ckpt_dir.glob("model*.safetensors"):
        f.unlink()
    save_file(tensors, str(ckpt_dir / "model.safetensors"))


def _edit_config(ckpt_dir: Path, **changes) -> None:
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg.update(changes)
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("variant", list(QWEN3_VARIANTS))
def test_convert_f32_matches_llamacpp_layout(
    variant: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    expected = json.loads((FIXTURE_DIR / f"{variant}.json").read_text())
    got = gguf_layout(convert(checkpoints[variant], tmp_path / "m.gguf", "f32"))

    for key in qwen3.REGOLITH_EXTENSION_KEYS:
        if key in got["metadata"]:
            assert got["metadata"].pop(key)["value"] is True  # the tiny MoE checkpoints renormalise
    assert list(got["metadata"]) == list(expected["metadata"])  # same keys, same order
    for key, want in expected["metadata"].items():
        assert got["metadata"][key] == want, key
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]
    for g, want in zip(got["tensors"], expected["tensors"], strict=True):
        assert (g["shape"], g["type"], g["sha256"]) == (want["shape"], want["type"], want["sha256"]), want[
            "name"
        ]


def test_fused_experts_give_the_same_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """transformers' in-memory layout (gate_up_proj [E, 2F, H], down_proj [E, H, F]) converts to the bytes the
    per-expert checkpoint does."""
    d = _copy(checkpoints["qwen3moe-tiny"], tmp_path / "ck")
    E = QWEN3_VARIANTS["qwen3moe-tiny"][2].get("num_experts", 8)

    def fuse(t: dict) -> None:
        for layer in range(3):
            p = f"model.layers.{layer}.mlp.experts."
            gate = [t.pop(f"{p}{e}.gate_proj.weight") for e in range(E)]
            up = [t.pop(f"{p}{e}.up_proj.weight") for e in range(E)]
            down = [t.pop(f"{p}{e}.down_proj.weight") for e in range(E)]
            t[p + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up, strict=True)])
            t[p + "down_proj"] = np.stack(down)

    _rewrite_weights(d, fuse)
    a = convert(checkpoints["qwen3moe-tiny"], tmp_path / "a.gguf", "f32")
    b = convert(d, tmp_path / "b.gguf", "f32")
    with regolith.gguf.open(a) as fa, regolith.gguf.open(b) as fb:
        assert sorted(fa.tensors) == sorted(fb.tensors)
        for name in fa.tensors:
            np.testing.assert_array_equal(fa.tensor(name), fb.tensor(name), err_msg=name)


def test_norm_topk_prob_false_is_recorded(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen3moe-tiny"], tmp_path / "ck")
    _edit_config(d, norm_topk_prob=False)
    with regolith.gguf.open(convert(d, tmp_path / "m.gguf", "f32")) as f:
        assert f.metadata["qwen3moe.expert_weights_norm"] is False


def test_quantized_outtype_keeps_routers_and_norms_f32(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with regolith.gguf.open(convert(checkpoints["qwen3moe-tiny"], tmp_path / "m.gguf", "q8_0")) as f:
        types = {name: t.type_name for name, t in f.tensors.items()}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["blk.0.attn_q_norm.weight"] == "F32"
    assert types["blk.0.ffn_gate_exps.weight"] == "Q8_0"
    assert types["blk.0.attn_q.weight"] == "Q8_0"


def _assert_no_output(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mlp_only_layers": [1]}, "dense layers between sparse ones"),
        ({"decoder_sparse_step": 2}, "dense layers between sparse ones"),
        ({"attention_bias": True}, "attention_bias"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "RoPE scaling 'yarn'"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok exceeds num_experts"),
        (
            {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8.5},
            "num_experts",
        ),
        ({"num_experts": 0, "num_local_experts": 0}, "num_experts must be a positive integer"),
    ],
)
def test_config_the_graph_does_not_compute_is_refused(
    changes: dict, message: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints["qwen3moe-tiny"], tmp_path / "ck")
    _edit_config(d, **changes)
    with pytest.raises(regolith.ModelFormatError, match=message):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_missing_expert_and_wrong_shape(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen3moe-tiny"], tmp_path / "ck")
    _rewrite_weights(d, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(regolith.ModelFormatError, match="layer 2 has 23 of 24 expert tensors"):
        convert(d, tmp_path / "o.gguf")
    d2 = _copy(checkpoints["qwen3-tiny"], tmp_path / "ck2")

    def edit(t: dict) -> None:
        t["model.layers.0.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)

    _rewrite_weights(d2, edit)
    with pytest.raises(
        regolith.ModelFormatError, match=r"up_proj\.weight has shape \[95, 64\], expected \[96, 64\]"
    ):
        convert(d2, tmp_path / "o.gguf")
    d3 = _copy(checkpoints["qwen3-tiny"], tmp_path / "ck3")
    _rewrite_weights(d3, lambda t: t.pop("model.layers.1.self_attn.q_norm.weight"))
    with pytest.raises(
        regolith.ModelFormatError, match=r"missing tensors model\.layers\.1\.self_attn\.q_norm"
    ):
        convert(d3, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_cli_converts_a_qwen3moe_checkpoint(checkpoints: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.gguf"
    assert main(["convert", str(checkpoints["qwen3moe-tiny"]), str(out), "--outtype", "q4_0", "-q"]) == 0
    with regolith.gguf.open(out) as f:
        assert f.architecture == "qwen3moe"
        assert f.metadata["qwen3moe.expert_count"] == 8
    assert (
        main(["convert", str(checkpoints["qwen3moe-tiny"]), str(tmp_path / "v.gguf"), "--mmproj", "x"]) != 0
    )
    assert "no vision tower" in capsys.readouterr().err
