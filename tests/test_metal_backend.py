"""The Metal backend under whole models, without a Mac: the model tests on "metal-emu", the Metal backend's
own host code and kernels with the GPU emulated (docs/metal.md).

They run in a subprocess with REGOLITH_BACKEND=metal-emu, which every model, window and vision tower then
uses: the tiny qwen4exp configs (with MTP), gemma3, qwen2 and the vision tower against transformers; streamed
output equal to resident output bit for bit at any arena size (the arena reading straight into unified
memory while the emulated GPU may still be reading the slot: Backend::wait_submitted); saved and restored
states (in place: Backend::synchronize); speculation's rollback; the bundled demo model. Left out: the
statistical test of speculative sampling (thousands of draws of the demo model: minutes on the emulator,
and what it tests, the sampler, is host code the CPU run covers) and the CPU-only fixture replay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SUITE = [
    "tests/model",
    "tests/test_streaming.py",
    "tests/test_session_state.py",
    "tests/test_speculative.py",
    "tests/test_vision.py",
    "tests/test_demo_model.py",
    "tests/test_generation.py",
    "tests/test_prompt_cache.py",
]


@pytest.mark.skipif(bool(os.environ.get("REGOLITH_BACKEND")), reason="already running on a chosen backend")
def test_model_suite_passes_on_the_emulated_metal_backend():
    env = {**os.environ, "REGOLITH_BACKEND": "metal-emu"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::RuntimeWarning",
    ]
    cmd += ["-k", "not keeps_the_joint_distribution", *SUITE]
    run = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]
