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
@pytest.mark.parametrize("dotprod", [False, True], ids=["armv8-a", "armv8.2-a+dotprod"])
def test_neon_kernels_match_reference_under_qemu(dotprod):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "neon_check", "run.py")] + (
        ["--dotprod"] if dotprod else []
    )
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " 0 failed" in result.stdout
