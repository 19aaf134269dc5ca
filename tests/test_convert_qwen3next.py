"""regolith convert for Qwen3-Next (qwen3_next): llama.cpp's qwen3next layout (names, shapes, types, order,
metadata, data) with and without the MTP head, with layer_types or only full_attention_interval in config.json,
fused experts, the Gated DeltaNet projections split as transformers reads them, and clear errors for what
llama.cpp's graph does not compute. The layout oracle is llama.cpp's converter, recorded in
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
from regolith.convert import convert, qwen3next
from regolith.convert.checkpoint import Checkpoint
from tests.dense_models import save_tiny_checkpoint, tiny_model
from tests.llamacpp_layout import FIXTURE_DIR, QWEN3NEXT_VARIANTS, gguf_layout

os.environ.setdefault("OMP_NUM_THREADS", "1")

_DELETE = object()
E = 8  # the default and MTP variants' experts


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen3next")
    return {
        name: save_tiny_checkpoint(arch, root / name, seed, **ov)
        for name, (arch, seed, ov) in QWEN3NEXT_VARIANTS.items()
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


def _fixture(name: str) -> dict:
    return json.loads((FIXTURE_DIR / f"{name}.json").read_text())


@pytest.mark.parametrize("variant", list(QWEN3NEXT_VARIANTS))
def test_convert_f32_matches_llamacpp_layout(
    variant: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    expected = _fixture(variant)
    got = gguf_layout(convert(checkpoints[variant], tmp_path / "m.gguf", "f32"))

    assert list(got["metadata"]) == list(expected["metadata"])  # same keys, same order: no regolith keys
    for key, want in expected["metadata"].items():
        assert got["metadata"][key] == want, key
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]
    for g, want in zip(got["tensors"], expected["tensors"], strict=True):
        assert (g["shape"], g["type"], g["sha256"]) == (want["shape"], want["type"], want["sha256"]), want[
            "name"
        ]


def test_qkvz_and_ba_split_as_transformers_reads_them() -> None:
    """attn_qkv's rows are transformers' query, key and value heads in order (value heads grouped by key
    head, as llama.cpp's qwen3next graph reads them), attn_gate's its z; ssm_ba's rows per key head are the
    b of its value heads, then their a (Qwen3NextGatedDeltaNet.fix_query_key_value_ordering)."""
    import torch

    model = tiny_model("qwen3next", 0)
    gdn = model.model.layers[0].linear_attn
    cfg = qwen3next.text_config(model.config.to_dict())
    x = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, k, v, z, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))
    qkv_w, z_w = qwen3next.split_qkvz(cfg, gdn.in_proj_qkvz.weight.detach().numpy())
    qkv = x[0].numpy() @ qkv_w.T
    want = torch.cat([q.reshape(5, -1), k.reshape(5, -1), v.reshape(5, -1)], dim=-1).numpy()
    np.testing.assert_allclose(qkv, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x[0].numpy() @ z_w.T, z.reshape(5, -1).numpy(), rtol=1e-5, atol=1e-5)
    ba = (x[0].numpy() @ gdn.in_proj_ba.weight.detach().numpy().T).reshape(5, 2, 2, 2)  # [t][key][b|a][v]
    np.testing.assert_allclose(ba[:, :, 0].reshape(5, 4), b[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ba[:, :, 1].reshape(5, 4), a[0].numpy(), rtol=1e-5, atol=1e-5)


def test_fused_experts_give_the_same_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """transformers' in-memory layout (gate_up_proj [E, 2F, H], down_proj [E, H, F]), in the main layers and
    in the MTP layer, converts to the file the per-expert checkpoint (what save_pretrained writes, and the
    released files hold) does."""
    name = "qwen3next-tiny-mtp"
    d = _copy(checkpoints[name], tmp_path / "fused" / name)

    def fuse(_file: str, t: dict) -> None:
        for p in {k.split("experts.")[0] + "experts." for k in t if ".mlp.experts." in k}:
            gate = [t.pop(f"{p}{e}.gate_proj.weight") for e in range(E)]
            up = [t.pop(f"{p}{e}.up_proj.weight") for e in range(E)]
            down = [t.pop(f"{p}{e}.down_proj.weight") for e in range(E)]
            t[p + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up, strict=True)])
            t[p + "down_proj"] = np.stack(down)

    _rewrite_files(d, fuse)
    names = dict(Checkpoint(d).tensors())
    assert "model.layers.0.mlp.experts.gate_up_proj" in names
    assert "mtp.layers.0.mlp.experts.down_proj" in names
    assert not any(".experts.0." in n for n in names)
    a = gguf_layout(convert(checkpoints[name], tmp_path / "a.gguf", "f32"))
    assert gguf_layout(convert(d, tmp_path / "b.gguf", "f32")) == a


def test_layer_types_or_full_attention_interval(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """config.json as released (full_attention_interval, no layer_types) gives the layers the interval
    implies and no attention.recurrent_layers, as llama.cpp's converter writes (its loader then derives them
    from full_attention_interval); listing layer_types adds the key and nothing else."""
    d = _copy(checkpoints["qwen3next-tiny"], tmp_path / "qwen3next-tiny")  # general.name from the directory
    _edit_config(d, layer_types=_DELETE, full_attention_interval=4)
    expected = _fixture("qwen3next-tiny")
    got = gguf_layout(convert(d, tmp_path / "m.gguf", "f32"))
    del expected["metadata"]["qwen3next.attention.recurrent_layers"]
    assert got["metadata"] == expected["metadata"]
    assert got["tensors"] == expected["tensors"]

    _edit_config(d, full_attention_interval=2)  # layer 1 would be full attention: its tensors do not fit
    with pytest.raises(regolith.ModelFormatError, match=r"layer 1 is full_attention"):
        convert(d, tmp_path / "o.gguf")


def test_mtp_in_config_without_mtp_tensors_writes_no_mtp_block(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A checkpoint without mtp.* tensors (one re-saved by transformers, whose model drops them) gets the file
    llama.cpp's --no-mtp writes, whatever config.json says."""
    d = _copy(checkpoints["qwen3next-tiny"], tmp_path / "qwen3next-tiny")
    _edit_config(d, mtp_num_hidden_layers=1)
    expected = _fixture("qwen3next-tiny")
    got = gguf_layout(convert(d, tmp_path / "m.gguf", "f32"))
    assert got["metadata"] == expected["metadata"]
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]


def test_quantized_outtype_keeps_routers_norms_and_conv_f32(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    with regolith.gguf.open(convert(checkpoints["qwen3next-tiny"], tmp_path / "m.gguf", "q8_0")) as f:
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
        "blk.0.attn_gate.weight",
        "blk.0.ssm_ba.weight",
        "blk.3.attn_q.weight",
        "output.weight",
    ):
        assert types[name] == "Q8_0", name


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mlp_only_layers": [2]}, r"layers \[2\] are dense MLP layers"),
        ({"decoder_sparse_step": 2}, r"layers \[0, 2\] are dense MLP layers"),
        ({"mlp_only_layers": "2"}, "mlp_only_layers must list layer indices"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer"),
        ({"norm_topk_prob": False}, "norm_topk_prob False: llama.cpp's qwen3next graph always renormalises"),
        ({"attention_bias": True}, "attention_bias is not part of llama.cpp's qwen3next graph"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "rope_type 'yarn'"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}},
            "mrope_section",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 4 layer types"),
        (
            {"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
            "unknown layer types 'sliding_attention'",
        ),
        ({"full_attention_interval": 0}, "full_attention_interval must be a positive integer"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads must be a multiple of linear_num_key_heads"),
        ({"linear_value_head_dim": 8}, "linear_key_head_dim and linear_value_head_dim differ"),
        ({"num_experts": _DELETE}, "num_experts must be a positive integer, got None"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok exceeds num_experts"),
        ({"mtp_num_hidden_layers": 2}, "mtp_num_hidden_layers must be 0 or 1"),
        ({"is_causal": False}, "bidirectional attention"),
    ],
)
def test_config_the_graph_does_not_compute_is_refused(
    changes: dict, message: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints["qwen3next-tiny"], tmp_path / "ck")
    _edit_config(d, **changes)
    with pytest.raises(regolith.ModelFormatError, match=message):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


@pytest.mark.parametrize(
    ("variant", "edit", "message"),
    [
        (
            "qwen3next-tiny",
            lambda f, t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"),
            "layer 2 has 23 of 24 expert tensors",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.update(
                {"model.layers.1.mlp.experts.down_proj": np.zeros((E, 64, 32), np.float32)}
            ),
            r"layer 1 has 32 of 24 expert tensors \(per-expert and fused tensors mixed\)",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.update(
                {"model.layers.1.linear_attn.in_proj_qkvz.weight": np.zeros((128, 64), np.float32)}
            ),
            r"in_proj_qkvz\.weight has shape \[128, 64\], expected \[192, 64\]",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.update(
                {"model.layers.1.linear_attn.in_proj_ba.weight": np.zeros((4, 64), np.float32)}
            ),
            r"in_proj_ba\.weight has shape \[4, 64\], expected \[8, 64\]",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.update(
                {
                    "model.layers.0.linear_attn.in_proj_qkv.weight": t.pop(
                        "model.layers.0.linear_attn.in_proj_qkvz.weight"
                    )
                }
            ),
            r"unexpected tensor model\.layers\.0\.linear_attn\.in_proj_qkv\.weight",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.pop("model.layers.3.self_attn.q_norm.weight"),
            r"missing tensors model\.layers\.3\.self_attn\.q_norm\.weight",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.update({"model.layers.3.linear_attn.A_log": np.zeros(4, np.float32)}),
            r"unexpected tensor model\.layers\.3\.linear_attn\.A_log \(layer 3 is full_attention\)",
        ),
        (
            "qwen3next-tiny",
            lambda f, t: t.update({"model.layers.4.input_layernorm.weight": np.zeros(64, np.float32)}),
            "beyond num_hidden_layers",
        ),
        (
            "qwen3next-tiny-mtp",
            lambda f, t: f == "model-mtp.safetensors" and t.pop("mtp.pre_fc_norm_hidden.weight"),
            r"missing tensors mtp\.pre_fc_norm_hidden\.weight",
        ),
        (
            "qwen3next-tiny-mtp",
            lambda f, t: (
                f == "model-mtp.safetensors"
                and t.update({"mtp.layers.1.input_layernorm.weight": np.zeros(64, np.float32)})
            ),
            "MTP layer 1; llama.cpp's qwen3next graph has one MTP layer",
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


def test_cli_converts_a_qwen3next_checkpoint(checkpoints: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.gguf"
    assert main(["convert", str(checkpoints["qwen3next-tiny-mtp"]), str(out), "--outtype", "q4_0", "-q"]) == 0
    with regolith.gguf.open(out) as f:
        assert f.architecture == "qwen3next"
        assert f.metadata["qwen3next.block_count"] == 5
        assert f.metadata["qwen3next.nextn_predict_layers"] == 1
    assert (
        main(["convert", str(checkpoints["qwen3next-tiny"]), str(tmp_path / "v.gguf"), "--mmproj", "x"]) != 0
    )
    assert "has no vision tower" in capsys.readouterr().err
