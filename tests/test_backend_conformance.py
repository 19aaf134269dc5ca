"""The backend conformance suite (csrc/core/backend_check.cpp; ``python -m regolith.backends.check``): every
backend of this build against the CPU reference, op by op, within the per-op NMSE tolerances stated there."""

from __future__ import annotations

import subprocess
import sys

import pytest

import regolith
from regolith import backends
from regolith.backends import check
from regolith.cli import main

OTHERS = [b for b in backends.available() if b != "cpu"]


@pytest.mark.parametrize("backend", OTHERS)
def test_every_op_matches_the_cpu_reference(backend):
    results = check.check(backend)
    assert len(results) > 300
    failed = [
        f"{r['op']} {r['case']}: nmse {r['nmse']:.3g} > {r['tolerance']:g} {r['error']}"
        for r in results
        if not r["passed"]
    ]
    assert not failed, "\n".join(failed)


def test_metal_kernels_match_the_cpu_with_threads_in_the_other_order():
    """The Metal emulator runs a threadgroup's threads in increasing order between waits; in decreasing order a
    kernel that reads threadgroup memory before another thread writes it (a missing barrier) computes
    something else, so the suite runs both (docs/metal.md)."""
    from regolith import _core

    _core.metal_emu_set_order(True)
    try:
        results = check.check("metal-emu")
    finally:
        _core.metal_emu_set_order(False)
    failed = [f"{r['op']} {r['case']}: nmse {r['nmse']:.3g} {r['error']}" for r in results if not r["passed"]]
    assert len(results) > 300 and not failed, "\n".join(failed)


def test_opaque_backend_is_bit_identical_to_the_cpu():
    """cpu-opaque runs the CPU's kernels, only on memory the host cannot touch and with ops deferred: every
    output must be the same bits, so any difference is the engine reading memory it does not own."""
    results = check.check("cpu-opaque")
    assert all(r["nmse"] == 0.0 and not r["error"] for r in results)


def test_every_op_of_the_interface_has_cases():
    ops = {r["op"] for r in check.check("cpu-opaque")}
    interface = {
        "matmul", "copy", "import_host", "get_rows", "gather_rows", "top_k", "rms_norm", "rms_norm_gated", "layer_norm",
        "rope", "unary", "glu", "add", "hc_mix", "hc_write", "ssm_conv", "gdn_prepare", "gdn_scan", "qsa_pool",
        "qsa_select", "qsa_attend", "attention", "moe_route", "moe_experts", "moe_combine", "ple_gate", "ple_conv",
        "add_interpolated", "vision_qkv", "softmax_scaled", "store_rows",
    }  # fmt: skip
    assert interface <= ops, f"ops without a conformance case: {sorted(interface - ops)}"


def test_every_case_compares_outputs_that_depend_on_its_inputs():
    """With the reference's inputs drawn from another seed no case may pass: none compares constants."""
    from regolith import _core

    passed = [f"{r['op']} {r['case']}" for r in _core.check_backend("cpu-opaque", "", 1, 2) if r["passed"]]
    assert not passed, "cases that pass on unrelated inputs:\n" + "\n".join(passed)


def test_command_line_prints_a_table_and_exits_zero():
    run = subprocess.run(
        [sys.executable, "-m", "regolith.backends.check", "--backend", "cpu-opaque", "--op", "rms_norm"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "rms_norm" in run.stdout and "cases pass" in run.stdout


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'metal'.*cpu"):
        check.check("metal")
    with pytest.raises(ValueError, match="unknown backend"):
        backends.resolve("cuda-nope")


@pytest.mark.skipif("metal" in backends.available(), reason="this machine has the metal backend")
def test_metal_where_there_is_none_says_what_it_needs():
    with pytest.raises(ValueError, match="needs an Apple platform with a Metal GPU.*here there are cpu"):
        backends.resolve("metal")
    assert backends.resolve("auto") in ("cpu", "cuda")


@pytest.mark.skipif("cuda" in backends.available(), reason="this build and machine have a CUDA backend")
def test_cuda_where_there_is_none_says_what_it_needs(capsys):
    with pytest.raises(ValueError, match="nvcc was found and an NVIDIA GPU; here there are cpu"):
        backends.resolve("cuda")
    with pytest.raises(ValueError, match="nvcc"):
        regolith.Model.load(backend="cuda")
    assert backends.resolve("auto") == "cpu"
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-p", "x", "-n", "1", "--backend", "cuda"])
    assert exit_.value.code == 2
    assert "argument --backend" in capsys.readouterr().err


def test_command_line_runs_on_the_backend_it_is_given(capsys):
    args = ["run", "-p", "class Stack:", "-n", "4", "--temp", "0", "-q", "--spec", "off"]
    assert main(args + ["--backend", "cpu-opaque"]) == 0
    opaque = capsys.readouterr().out
    assert main(args + ["--backend", "cpu"]) == 0
    assert capsys.readouterr().out == opaque
    ref = regolith.Model.load().generate("class Stack:", max_tokens=4, temperature=0)
    assert ref in opaque
