"""Another regolith build as a benchmark engine (``--baseline DIR`` of bench_model and bench_generate): it runs
in a worker process (benchmarks/baseline_worker.py) with DIR first on its path, and takes turns with the
build under test, so that both see the same machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("baseline_worker.py")


class Baseline:
    """run() -> (prefill seconds, decode seconds) of the regolith build installed in `build_dir`."""

    def __init__(self, build_dir: str, path: str, prompt: np.ndarray, n_decode: int, threads: int):
        if not (Path(build_dir) / "regolith" / "__init__.py").is_file():
            raise SystemExit(f"--baseline {build_dir}: no regolith package there (pip install --target it)")
        self._dir = tempfile.mkdtemp()
        ids = os.path.join(self._dir, "prompt.npy")
        np.save(ids, prompt)
        env = {**os.environ, "PYTHONPATH": build_dir}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), path, ids, str(n_decode), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        hello = json.loads(self._line())
        if not hello["file"].startswith(os.path.abspath(build_dir)):
            raise SystemExit(f"--baseline {build_dir}: the worker imported {hello['file']}")

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the baseline worker exited with status {self.proc.wait()}")
        return line

    def run(self) -> tuple[float, float]:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        r = json.loads(self._line())
        return r["prefill"], r["decode"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
