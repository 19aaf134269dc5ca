"""The model tests a GPU backend must pass, and how they are run on one: in a subprocess with REGOLITH_BACKEND
set, which every model, window and vision tower then uses (tests/test_metal_backend.py, test_cuda_backend.py; test_opaque_backend.py runs every test so).

The suite: the tiny qwen4exp configs (with MTP), gemma3, qwen2 and the vision tower against transformers;
streamed output equal to resident output bit for bit at any arena size; saved and restored states;
speculation's rollback; generation, the prompt cache and the bundled demo model. Left out: the CPU engine's
replay of its pre-refactor outputs (tests/test_engine_fixtures.py: CPU bits by definition)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SUITE = (
    "tests/model",
    "tests/test_streaming.py",
    "tests/test_session_state.py",
    "tests/test_speculative.py",
    "tests/test_vision.py",
    "tests/test_demo_model.py",
    "tests/test_generation.py",
    "tests/test_prompt_cache.py",
)


def run_suite(
    backend: str, *pytest_args: str, paths: tuple[str, ...] = SUITE, workers: int = 2, timeout: float = 2400
) -> None:
    """Runs the tests in `paths` (SUITE by default) with REGOLITH_BACKEND=backend, stopping at the first failure,
    and asserts that they passed. The test files are spread over `workers` pytest-xdist processes (at most one
    per core): the calling pytest only waits meanwhile, and an emulated backend computes on one core."""
    env = {**os.environ, "REGOLITH_BACKEND": backend}
    n = min(workers, os.cpu_count() or 1)
    if n > 1:
        pytest_args = ("-n", str(n), "--dist", "loadfile", *pytest_args)
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
        [*cmd, *pytest_args, *paths],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]
