"""Runs another regolith build in its own process, for benchmarks that compare two builds in one run.

    PYTHONPATH=BUILD python benchmarks/baseline_worker.py MODEL PROMPT_IDS.npy N_DECODE THREADS [LOAD_KWARGS]

BUILD is a directory holding an installed regolith (e.g. ``pip install --no-deps --target BUILD dist/*.whl``
of an earlier commit). The worker loads MODEL ("" for the default model) with the keyword arguments of the
JSON object LOAD_KWARGS, warms it up, prints ``ready``, then answers each ``run`` line
on stdin with one JSON line: the prefill and decode seconds of a fresh window (the prompt at once with the
last token's logits, then N_DECODE greedy single-token evaluations), as the benchmarks time their own build.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    import regolith
    from regolith import _core

    path, ids_file, n_decode, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    kwargs = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    _core.set_threads(threads)
    prompt = np.load(ids_file).astype(np.int32)
    model = regolith.Model.load(path or None, **kwargs)
    model.window(len(prompt) + 8).eval(prompt, all_logits=False)  # warm-up: fault the mapping in
    print(json.dumps({"ready": True, "file": regolith.__file__}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        window = model.window(len(prompt) + n_decode + 8)
        t = time.perf_counter()
        tok = int(np.argmax(window.eval(prompt, all_logits=False)[0]))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n_decode):
            tok = int(np.argmax(window.eval([tok], all_logits=False)[0]))
        print(json.dumps({"prefill": prefill, "decode": time.perf_counter() - t}), flush=True)


if __name__ == "__main__":
    main()
