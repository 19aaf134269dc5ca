"""regolith convert for qwen4_exp: llama.cpp's layout (names, shapes, types, metadata, data), outtypes,
errors, atomic output and the CLI. The layout oracle is llama.cpp's converter, recorded in
tests/fixtures/llamacpp/ by tools/llamacpp_fixtures/make_qwen4exp_layout.py."""

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
from regolith.convert import convert, qwen4exp, qwen_hybrid
from regolith.convert.checkpoint import Checkpoint
from tests.llamacpp_layout import FIXTURE_DIR, QWEN4EXP_VARIANTS, gguf_layout
from tests.qwen4exp_models import save_tiny_model

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen4exp")
    return {name: save_tiny_model(root / name, seed, **ov) for name, (seed, ov) in QWEN4EXP_VARIANTS.items()}


@pytest.fixture(scope="session")
def quant_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows of 256, so the K-quants apply to the big matrices (and fall back on the small ones)."""
    root = tmp_path_factory.mktemp("qwen4exp-q")
    overrides = {"hidden_size": 256, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256}
    return save_tiny_model(
        root / "q", 3, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, **overrides
    )


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("variant", list(QWEN4EXP_VARIANTS))
def test_convert_f32_matches_llamacpp_layout(
    variant: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    expected = json.loads((FIXTURE_DIR / f"{variant}.json").read_text())
    out = convert(checkpoints[variant], tmp_path / "m.gguf", "f32")
    got = gguf_layout(out)

    for key in qwen4exp.REGOLITH_EXTENSION_KEYS:  # regolith's additions (docs/qwen4exp.md)
        got["metadata"].pop(key)
    assert list(got["metadata"]) == list(expected["metadata"])  # same keys, same order
    for key, want in expected["metadata"].items():
        if key == "qwen4exp.ple.eos_token_id":
            # deliberate: llama.cpp writes the last id of an eos list, transformers' PLE resets on the first
            eos = QWEN4EXP_VARIANTS[variant][1].get("eos_token_id", 2)
            want = {**want, "value": eos[0] if isinstance(eos, list) else eos}
        assert got["metadata"][key] == want, key
    assert [t["name"] for t in got["tensors"]] == [t["name"] for t in expected["tensors"]]
    for g, want in zip(got["tensors"], expected["tensors"], strict=True):
        assert (g["shape"], g["type"]) == (want["shape"], want["type"]), want["name"]
        if g["sha256"] != want["sha256"]:
            # ssm_a = -exp(A_log): numpy's and torch's float32 exp may differ in the last bit
            assert "values" in want, f"{want['name']}: data differs from llama.cpp's"
            np.testing.assert_allclose(g["values"], want["values"], rtol=1e-6, err_msg=want["name"])


def test_gguf_tensors_from_plain_arrays_match_the_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = Checkpoint(checkpoints["qwen4exp-tiny-a"])
    arrays = [(name, t.load()) for name, t in ckpt.tensors()]  # eager numpy arrays
    out = convert(ckpt.path, tmp_path / "m.gguf", "f32")
    with regolith.gguf.open(out) as f:
        names = []
        for name, arr in qwen4exp.gguf_tensors(ckpt.config, arrays):
            names.append(name)
            np.testing.assert_array_equal(np.asarray(arr), f.tensor(name), err_msg=name)
        assert names == list(f.tensors)


def test_ple_hash_constants_match_transformers_buffers(checkpoints: dict[str, Path]) -> None:
    for name in ("qwen4exp-tiny-a", "qwen4exp-tiny-b"):
        ckpt = Checkpoint(checkpoints[name])
        stored = qwen4exp.ple_constants_from(qwen_hybrid.collect_sources(ckpt.tensors()))
        assert stored == qwen4exp.ple_hash_constants(ckpt.config)


def test_metadata_types_and_compress_ratios() -> None:
    from tests.qwen4exp_models import tiny_text_config

    md = {k: (v, t) for k, v, t in qwen4exp.gguf_metadata(tiny_text_config().to_dict())}
    # ratio on the QSA layers: llama.cpp reads "full_attention", transformers writes "indexed_attention"
    assert md["qwen4exp.attention.compress_ratios"][0] == [0, 4, 0, 4]
    assert md["qwen4exp.attention.recurrent_layers"][0] == [True, False, True, False]
    assert "general.file_type" not in md


def test_ple_table_streams_shard_by_shard(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def whole(*_a: object, **_k: object) -> None:
        raise AssertionError("the PLE table was materialised whole")

    chunks = []
    real = qwen4exp.PleTable.chunks

    def counting(self: qwen4exp.PleTable):
        for c in real(self):
            chunks.append(c.shape)
            yield c

    monkeypatch.setattr(qwen4exp.PleTable, "__array__", whole)
    monkeypatch.setattr(qwen4exp.PleTable, "chunks", counting)
    convert(checkpoints["qwen4exp-tiny-a"], tmp_path / "m.gguf", "f16")
    assert chunks == [(128, 16)] * 4


# (type of the big matrices, bound on the relative RMS error of a Gaussian-ish weight after a round trip).
# Bounds are ~1.5x the expected error of each format on N(0, s) rows: F16 2^-11 relative rounding; BF16
# 2^-8; Q8_0 absmax/127 steps (~1.7% of s at a block max of ~2.2 s, /sqrt(12)); Q6_K ~4x Q8_0's step;
# 4-bit formats absmax/8 steps (~8% of s). Measured maxima: 2e-4, 1.7e-3, 5.6e-3, 1.8e-2, 8.8e-2, 7.3e-2, 7.7e-2.
OUTTYPE_CASES = {
    "f16": ("F16", 5e-4),
    "bf16": ("BF16", 3e-3),
    "q8_0": ("Q8_0", 8e-3),
    "q6_k": ("Q6_K", 3e-2),
    "q4_0": ("Q4_0", 0.12),
    "q4_k": ("Q4_K", 0.11),
    "iq4_nl": ("IQ4_NL", 0.11),
}
FALLBACK_ERR = {"F16": 5e-4, "Q8_0": 8e-3, "Q5_0": 6e-2}  # measured: 2e-4, 5.5e-3, 4.3e-2


@pytest.mark.parametrize("outtype", list(OUTTYPE_CASES))
def test_outtype_types_and_round_trip(outtype: str, quant_checkpoint: Path, tmp_path: Path) -> None:
    qtype, bound = OUTTYPE_CASES[outtype]
    ref_path = tmp_path / "f32.gguf"
    convert(quant_checkpoint, ref_path, "f32")
    out = convert(quant_checkpoint, tmp_path / f"{outtype}.gguf", outtype)
    with regolith.gguf.open(ref_path) as ref, regolith.gguf.open(out) as f:
        assert list(f.tensors) == list(ref.tensors)
        seen = set()
        for name, info in f.tensors.items():
            row = info.shape[-1]
            keep_f32 = (
                len(info.shape) == 1
                or name.endswith(
                    ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")
                )
                or not name.endswith(".weight")
            )
            if keep_f32:
                assert info.type_name == "F32", name
                continue
            if row % regolith.quant.type_size(qtype)[0] == 0:
                assert info.type_name == qtype, name
            else:  # llama.cpp's fallback for a row the block does not divide
                assert info.type_name != qtype and row % regolith.quant.type_size(info.type_name)[0] == 0, (
                    name
                )
            seen.add(info.type_name)
            want, got = ref.tensor(name), f.tensor(name)
            err = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
            assert err < max(bound, FALLBACK_ERR.get(info.type_name, 0) if info.type_name != qtype else 0), (
                name,
                info.type_name,
                err,
            )
        assert qtype in seen
        assert f.metadata["general.file_type"] == int(regolith.convert.OUTTYPES[outtype][1])


def _rewrite_weights(ckpt_dir: Path, edit) -> None:
    from safetensors.numpy import save_file

    path = ckpt_dir / "model.safetensors"
    tensors = {name: t.load() for name, t in Checkpoint(ckpt_dir).tensors()}
    edit(tensors)
    save_file(tensors, str(path))


def _assert_no_output(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


def test_unsupported_architecture(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen4exp-tiny-nople"], tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(regolith.ModelFormatError, match="unsupported architecture"):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_missing_tensor(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen4exp-tiny-nople"], tmp_path / "ck")
    _rewrite_weights(d, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(
        regolith.ModelFormatError, match=r"missing tensors model\.layers\.1\.self_attn\.k_norm"
    ):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_missing_expert(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen4exp-tiny-nople"], tmp_path / "ck")
    _rewrite_weights(d, lambda t: t.pop("model.layers.0.mlp.experts.3.up_proj.weight"))
    with pytest.raises(regolith.ModelFormatError, match="layer 0 has 47 of 48 expert tensors"):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_wrong_shape(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen4exp-tiny-nople"], tmp_path / "ck")

    def edit(t: dict) -> None:
        t["model.layers.0.linear_attn.out_proj.weight"] = np.zeros((64, 32), np.float32)

    _rewrite_weights(d, edit)
    with pytest.raises(
        regolith.ModelFormatError, match=r"out_proj\.weight has shape \[64, 32\], expected \[64, 64\]"
    ):
        convert(d, tmp_path / "o.gguf")
    _assert_no_output(tmp_path / "o.gguf")


def test_bad_config(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(checkpoints["qwen4exp-tiny-nople"], tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["linear_attention"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(regolith.ModelFormatError, match="layer_types must list 2"):
        convert(d, tmp_path / "o.gguf")
    (d / "config.json").write_text("{not json")
    with pytest.raises(regolith.ModelFormatError, match="not valid JSON"):
        convert(d, tmp_path / "o.gguf")


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_failure_mid_write_leaves_no_file(
    exc: type[BaseException], checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regolith.convert import writer

    calls = []
    real = writer._encode

    def failing(arr: np.ndarray, qtype: str) -> np.ndarray:
        calls.append(qtype)
        if len(calls) == 20:
            raise exc("disk on fire")
        return real(arr, qtype)

    out = tmp_path / "o.gguf"
    out.write_bytes(b"previous")
    monkeypatch.setattr(writer, "_encode", failing)
    with pytest.raises(exc):
        convert(checkpoints["qwen4exp-tiny-nople"], out, "f16")
    assert out.read_bytes() == b"previous"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.gguf"]


def test_cli_convert(checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "m.gguf"
    assert main(["convert", str(checkpoints["qwen4exp-tiny-a"]), str(out), "--outtype", "q8_0"]) == 0
    assert "wrote" in capsys.readouterr().out
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not the temporary file's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no temporary left behind
    with regolith.gguf.open(out) as f:
        assert f.architecture == "qwen4exp"
        assert f.tensors["blk.0.ffn_gate_exps.weight"].type_name == "Q8_0"
        assert f.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
        assert f.tensors["per_layer_token_embd.weight"].type_name == "F16"  # rows of 16: Q8_0 cannot

    assert main(["convert", str(tmp_path), str(tmp_path / "x.gguf"), "-q"]) == 2
    assert "has no config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", "a", "b", "--outtype", "q3_k"])


def test_inverse_of_convert_gives_back_the_checkpoint(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """tools/reference_fixtures/qwen4exp_from_gguf.py (the float64 reference of a qwen4exp GGUF) against the
    checkpoint the GGUF was converted from: every tensor back (A_log through -exp and log, the zero-centred
    norm gammas as the GGUF's 1 + w)."""
    from safetensors.numpy import load_file

    from tools.reference_fixtures.qwen4exp_from_gguf import state_dict

    ckpt = checkpoints["qwen4exp-tiny-a"]
    out = convert(ckpt, tmp_path / "m.gguf", "f32")
    _, got = state_dict(json.loads((ckpt / "config.json").read_text()), out)
    want = load_file(str(ckpt / "model.safetensors"))
    got = {n: t.numpy() for n, t in got.items()}
    for name in [n for n in got if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        fused = got.pop(name)  # [E][2F or H][H or F]; the checkpoint has one tensor per expert
        prefix, f = name.rsplit(".", 1)[0], fused.shape[1] // 2
        for e, x in enumerate(fused):
            if name.endswith("down_proj"):
                got[f"{prefix}.{e}.down_proj.weight"] = x
            else:
                got[f"{prefix}.{e}.gate_proj.weight"], got[f"{prefix}.{e}.up_proj.weight"] = x[:f], x[f:]
    shards = sorted(
        (n for n in want if ".ngram_embedding.shard_" in n), key=lambda n: int(n.split("_")[-1][:-7])
    )
    if shards:  # saved in parts, one table in the model (and the GGUF)
        want[shards[0].split(".shard_")[0] + ".weight"] = np.concatenate([want.pop(n) for n in shards])
    assert set(got) >= set(want)
    for name, w in want.items():
        g = got[name]
        if name.endswith("A_log"):
            np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name)
        elif "norm" in name.split(".")[-2] and not np.array_equal(g.astype(w.dtype), w):
            # zero-centred gammas: the GGUF holds float32(1 + w), which the inverse gives back exactly
            assert np.array_equal((1 + g).astype(np.float32), np.float32(1) + w), name
        else:
            assert np.array_equal(g.astype(w.dtype), w), name
