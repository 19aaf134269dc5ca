"""The core never touches device memory from the host: the model test suite passes on "cpu-opaque", the CPU
backend whose buffers are PROT_NONE outside backend calls (any host access faults) and whose ops are deferred
until the core submits or reads (any dependence on an op having run shows). It runs in a subprocess with
REGOLITH_BACKEND set, which every model, window and vision tower then uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every test file that loads a model: the layer, model, streaming, state, speculation, vision and
# generation tests, and the pre-refactor fixtures (which the opaque backend must also match bit for bit).
MODEL_TESTS = [
    "tests/model",
    "tests/test_engine_fixtures.py",
    "tests/test_demo_model.py",
    "tests/test_ple.py",
    "tests/test_qsa_attention.py",
    "tests/test_streaming.py",
    "tests/test_session_state.py",
    "tests/test_prompt_cache.py",
    "tests/test_speculative.py",
    "tests/test_vision.py",
    "tests/test_generation.py",
    "tests/test_real_gemma.py",
]


@pytest.mark.skipif(bool(os.environ.get("REGOLITH_BACKEND")), reason="already running on a chosen backend")
def test_model_suite_passes_on_opaque_device_memory():
    env = {**os.environ, "REGOLITH_BACKEND": "cpu-opaque"}
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
    run = subprocess.run(
        [*cmd, *MODEL_TESTS], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400
    )
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]
