"""The arm64 NEON kernels, cross-compiled and run under qemu (tools/neon_check/run.py).

Needs Debian's g++-aarch64-linux-gnu and qemu-user, which .ci/run installs; skipped where they are absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")),
    reason="needs g++-aarch64-linux-gnu and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user)",
)
def test_neon_kernels_match_reference_under_qemu():
    """Scalar, NEON and NEON dot-product kernels against the float64 reference, and the dot-product set
    left out on a CPU without it (tools/neon_check/run.py)."""
    cmd = [sys.executable, os.path.join(ROOT, "tools", "neon_check", "run.py")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " 0 failed" in result.stdout


@pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")),
    reason="needs g++-aarch64-linux-gnu and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user)",
)
def test_metal_emulator_runs_on_arm64_under_qemu():
    """The emulator switches fibers in assembly per architecture: its arm64 path (Apple silicon's) runs the
    self-test kernels right in both thread orders."""
    cmd = [sys.executable, os.path.join(ROOT, "tools", "neon_check", "run.py"), "--emulator"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "emulator: 10 passed, 0 failed" in result.stdout
