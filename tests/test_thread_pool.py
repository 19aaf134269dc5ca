"""The CPU kernels' thread pool under stress (tests/cpp/thread_pool_stress.cpp), built with g++ and run,
under ThreadSanitizer when the compiler has it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build(tmp: Path, sanitize: bool) -> Path | None:
    exe = tmp / ("stress_tsan" if sanitize else "stress")
    flags = ["-fsanitize=thread", "-g", "-O1"] if sanitize else ["-O2"]
    cmd = ["g++", "-std=c++17", *flags, "-pthread", f"-I{ROOT / 'csrc'}",
           str(ROOT / "tests/cpp/thread_pool_stress.cpp"), str(ROOT / "csrc/core/thread_pool.cpp"), "-o", str(exe)]  # fmt: skip
    return exe if subprocess.run(cmd, capture_output=True, check=False).returncode == 0 else None


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "tsan"])
def test_thread_pool_visits_every_index_once(tmp_path, sanitize):
    exe = _build(tmp_path, sanitize)
    if exe is None:
        if sanitize:
            pytest.skip("this g++ cannot build with -fsanitize=thread")
        raise AssertionError("the stress test does not build")
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "bad=0" in result.stdout
    assert "WARNING: ThreadSanitizer" not in result.stderr
