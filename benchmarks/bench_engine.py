"""The device engine's own costs on the CPU: the host round trip of a streamed MoE layer, and what the
opaque test backend costs.

The bundled demo model (8 layers, 64 experts top-4) decodes greedily with its experts resident, where a
MoE layer runs on the backend without a host round trip (``Backend::moe_experts``), and through an arena
holding every expert (no misses after warm-up, no lookahead), where each MoE layer reads its routing ids back
to the host, which pins the experts and forms the batch. Both give the same logits; the difference per MoE
layer is the cost of the round trip and the host's part of streaming. Then the same decode on "cpu-opaque"
(ops deferred, memory protected outside backend calls), the price of the CI mode. With ``--baseline DIR``
(another build, installed with ``pip install --no-deps --target DIR``) its resident and arena paths run in
worker processes beside these. Best of ``--repeat`` interleaved runs.

    python benchmarks/bench_engine.py [--decode 64] [--repeat 7] [--threads 2] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from benchmarks.engines import Baseline, Regolith
from regolith import _core

PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n"


ARENA = {"arena_gb": 1.0, "lookahead": False}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", help="a directory holding another regolith build to compare with")
    args = ap.parse_args(argv)
    _core.set_threads(args.threads)
    ids = np.array(regolith.Model.load().tokenize(PROMPT), np.int32)
    n = args.decode
    engines = {
        "resident experts (no round trip)": Regolith(None, ids, n),
        "arena of every expert (a round trip per MoE layer)": Regolith(None, ids, n, **ARENA),
        "resident experts on cpu-opaque": Regolith(None, ids, n, backend="cpu-opaque"),
    }
    if args.baseline:
        engines["baseline: resident experts"] = Baseline(args.baseline, "", ids, n, _core.threads())
        engines["baseline: arena of every expert"] = Baseline(
            args.baseline, "", ids, n, _core.threads(), ARENA
        )
    best = dict.fromkeys(engines, float("inf"))
    for _ in range(args.repeat):
        for name, engine in engines.items():
            best[name] = min(best[name], engine.run()[1])
    for engine in engines.values():
        engine.close()
    n_moe = engines["resident experts (no round trip)"].model.config["n_layer"]
    base = best["resident experts (no round trip)"]
    table = Table(title=f"demo model decode, {n} tokens, {_core.threads()} threads, kernels: {_core.isa()}")
    for col in ("path", "ms / token", "vs resident", "per MoE layer"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for name, s in best.items():
        extra = (s - base) / n / n_moe
        table.add_row(name, f"{1e3 * s / n:.3f}", f"{s / base:.3f}x", f"{1e6 * extra:+.1f} us")
    stats = engines["arena of every expert (a round trip per MoE layer)"].model.stats()
    Console().print(table)
    Console().print(f"arena: {stats['misses']} misses, hit rate {stats['hit_rate']:.3f} (warm-up included)")


if __name__ == "__main__":
    main()
