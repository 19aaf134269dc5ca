"""CPU kernel throughput at Qwen3.8-Flash-Next shapes, against this machine's memory bandwidth.

For each hot weight type and shape it times y = W x for ntok = 1, 4, 8 (decode / speculative verify) and a
512-token prefill, cycling through a pool of distinct matrices larger than the caches (as decode does when
it visits experts), and reports the weight bytes streamed per second next to the read bandwidth measured
in the same run by reading a 1 GiB buffer on the same threads.

    python benchmarks/bench_kernels.py [--types IQ2_XS Q4_K] [--pool-mb 512] [--seconds 0.4]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from regolith import _core
from regolith.quant import TYPE_IDS, type_size
from tests.quant_data import random_blocks

HOT_TYPES = [
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_S",
    "IQ4_NL",
    "IQ4_XS",
    "Q4_K",
    "Q6_K",
    "Q8_0",
    "BF16",
    "Q2_0",
]
# (label, rows = output features, cols = input features)
SHAPES = [
    ("expert gate/up 2048->512", 512, 2048),
    ("expert down 512->2048", 2048, 512),
    ("attn q+gate 2048->8192", 8192, 2048),
    ("attn out 4096->2048", 2048, 4096),
    ("lm head 2048->248320", 248320, 2048),
]
NTOKS = [1, 4, 8, 512]


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    buf = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    _core.read_all(buf)
    best = min(_timed(lambda: _core.read_all(buf)) for _ in range(repeats))
    return nbytes / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def weight_pool(name: str, nbytes: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks of a type, flat; any block-aligned slice is a valid matrix."""
    if name == "BF16":
        n = nbytes // 2
        vals = rng.standard_normal(n).astype(np.float32)
        return (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    _, bs = type_size(name)
    return random_blocks(name, nbytes // bs, rng).reshape(-1)


def bench_one(name: str, pool: np.ndarray, rows: int, cols: int, ntok: int, seconds: float) -> float:
    """Seconds per matmul."""
    tid = TYPE_IDS[name]
    if name == "BF16":
        row_bytes = cols * 2
    else:
        qk, bs = type_size(name)
        row_bytes = cols // qk * bs
    n_rows = pool.nbytes // row_bytes
    if n_rows < rows:
        raise SystemExit(f"pool too small for {name} {rows}x{cols}")
    mats = pool[: n_rows * row_bytes].reshape(n_rows, row_bytes)
    x = np.random.default_rng(1).standard_normal((ntok, cols)).astype(np.float32)
    once = _core.time_matmul(tid, mats, rows, cols, x, 1)
    iters = max(2, min(20000, int(seconds / max(once, 1e-6))))
    return _core.time_matmul(tid, mats, rows, cols, x, iters) / iters


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=HOT_TYPES)
    ap.add_argument("--pool-mb", type=int, default=512, help="distinct weight bytes cycled through per type")
    ap.add_argument("--seconds", type=float, default=0.4, help="time per measurement")
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (0: all cores)")
    ap.add_argument("--no-lm-head", action="store_true", help="skip the 248320-row LM head")
    ap.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (for docs/benchmarks.md)"
    )
    args = ap.parse_args(argv)

    _core.set_threads(args.threads)
    console = Console()
    bw = read_bandwidth()
    console.print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, kernels: {_core.isa()}, "
        f"threads: {_core.threads()}; memory read bandwidth: [bold]{bw / 1e9:.1f} GB/s[/bold]"
    )
    table = Table(title="y = W x: weight GB/s streamed (ratio to memory bandwidth)")
    table.add_column("type")
    table.add_column("shape")
    for ntok in NTOKS:
        table.add_column(f"ntok={ntok}", justify="right")
    rng = np.random.default_rng(0)
    shapes = [s for s in SHAPES if not (args.no_lm_head and s[1] == 248320)]
    for name in args.types:
        lm_rows = max(s[1] for s in shapes)
        need = args.pool_mb << 20
        if name == "BF16":
            need = max(need, lm_rows * 2048 * 2)
        else:
            qk, bs = type_size(name)
            need = max(need, lm_rows * 2048 // qk * bs)
        pool = weight_pool(name, need, rng)
        for label, rows, cols in shapes:
            cells = []
            wbytes = rows * (cols * 2 if name == "BF16" else cols // type_size(name)[0] * type_size(name)[1])
            for ntok in NTOKS:
                if ntok > 8 and rows == 248320:
                    cells.append("-")  # prefill computes the LM head for the last token only
                    continue
                sec = bench_one(name, pool, rows, cols, ntok, args.seconds)
                gbs = wbytes / sec
                cell = f"{gbs / 1e9:.1f} ({gbs / bw:.0%})"
                if ntok == 512:
                    cell = f"{rows * cols * ntok / sec / 1e9:.0f} GMAC/s"
                cells.append(cell)
            table.add_row(name, label, *cells)
        del pool
    bw_end = read_bandwidth()
    console.print(
        f"memory read bandwidth at the end: {bw_end / 1e9:.1f} GB/s (ratios use the start-of-run figure; "
        "this machine's bandwidth varies between runs)"
    )
    if args.markdown:
        print("| " + " | ".join(str(c.header) for c in table.columns) + " |")
        print("|" + "---|" * len(table.columns))
        for i in range(table.row_count):
            print("| " + " | ".join(str(c._cells[i]) for c in table.columns) + " |")
    else:
        console.print(table)
    console.print(
        "prefill (ntok=512) is compute-bound, so it is reported in multiply-accumulates per second."
    )


if __name__ == "__main__":
    main()
