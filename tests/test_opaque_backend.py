"""The core never touches device memory from the host: the whole test suite passes on "cpu-opaque", the CPU
backend whose buffers are PROT_NONE outside backend calls (any host access faults) and whose ops are deferred
until the core submits or reads (any dependence on an op having run shows). It runs in a subprocess with
REGOLITH_BACKEND set, which every model, window and vision tower then uses: the layer, model, streaming,
state, speculation, vision, generation and server tests, and the pre-refactor fixtures, which the opaque
backend must match bit for bit as the CPU does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
        [*cmd, "tests"], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400
    )
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]
