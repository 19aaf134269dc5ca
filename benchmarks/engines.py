"""regolith as a benchmark engine: this build (Regolith), or another one (Baseline, ``--baseline DIR`` of
bench_model, bench_generate and bench_engine), which runs in a worker process (benchmarks/baseline_worker.py)
with DIR first on its path and takes turns with this one, so that both see the same machine. run() gives
(prompt seconds, decode seconds) on a fresh window: the prompt at once with the last token's logits, then
greedy single-token evaluations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("baseline_worker.py")


class Regolith:
    """This build on the model at `path` (None: the default model) loaded with `load`."""

    def __init__(self, path: str | None, prompt: np.ndarray, n_decode: int, **load):
        import regolith

        self.model = regolith.Model.load(path, **load)
        self.prompt, self.n_decode = prompt, n_decode
        # warm-up on another window: fault the mapping in (and fill an arena), so the timing is of compute
        self.model.window(len(prompt) + 8).eval(prompt, all_logits=False)

    def run(self) -> tuple[float, float]:
        window = self.model.window(len(self.prompt) + self.n_decode + 8)
        t = time.perf_counter()
        tok = int(np.argmax(window.eval(self.prompt, all_logits=False)[0]))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(self.n_decode):
            tok = int(np.argmax(window.eval([tok], all_logits=False)[0]))
        return prefill, time.perf_counter() - t

    def close(self) -> None:
        pass


class Baseline:
    """run() -> (prefill seconds, decode seconds) of the regolith build installed in `build_dir` on the model
    at `path` ("" for the default model) loaded with `load_kwargs`."""

    def __init__(
        self,
        build_dir: str,
        path: str,
        prompt: np.ndarray,
        n_decode: int,
        threads: int,
        load_kwargs: dict | None = None,
    ):
        if not (Path(build_dir) / "regolith" / "__init__.py").is_file():
            raise SystemExit(f"--baseline {build_dir}: no regolith package there (pip install --target it)")
        self._dir = tempfile.mkdtemp()
        ids = os.path.join(self._dir, "prompt.npy")
        np.save(ids, prompt)
        env = {**os.environ, "PYTHONPATH": build_dir}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), path, ids, str(n_decode), str(threads), json.dumps(load_kwargs or {})],
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
