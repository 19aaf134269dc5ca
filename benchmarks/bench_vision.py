"""qwen4_exp vision encoder throughput at the real Qwen4Exp vision widths, against the dense matmul kernel.

Writes a projector GGUF with random F16 weights at transformers' ``Qwen4ExpVisionConfig`` widths (hidden
1152, MLP 4304, 16 heads, patches of 16, 2x2 merge, a 48x48 position grid; ``--depth`` blocks, 27 by
default; the merger projects to ``--out-dim``) through regolith's mmproj mapping and the gguf writer, then
times per image size: preprocessing (``ImageProcessor``: resize, normalise, patchify), the encoder
(``_core.VisionEncoder.encode``: wall seconds, and the process's CPU seconds over all threads, steadier
on a shared machine), its achieved GFLOP/s (counted analytically: every matmul and the
attention products; norms and activations excluded) and the ratio to the dense matmul GFLOP/s measured in
the same run on the same weight type with the same token count (the block's four linear layers, timed
alone: the physical-ish limit of this machine's kernels).

    python benchmarks/bench_vision.py [--sizes 224 448 896] [--depth 27] [--threads 0] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from regolith import _core
from regolith.quant import TYPE_IDS
from regolith.vision import ImageProcessor

HIDDEN, FF, HEADS, PATCH, MERGE, N_POS = 1152, 4304, 16, 16, 2, 2304
PATCH_DIM = 3 * 2 * PATCH * PATCH


class _Random:
    """A lazily generated checkpoint tensor (``shape`` and ``load()``, as mmproj_tensors expects)."""

    def __init__(self, shape: tuple[int, ...], seed: int, scale: float, offset: float = 0.0):
        self.shape, self.seed, self.scale, self.offset = shape, seed, scale, offset

    def load(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return rng.standard_normal(self.shape, dtype=np.float32) * self.scale + self.offset


def write_projector(path: Path, depth: int, out_dim: int) -> None:
    """A random F16 projector GGUF at the real widths (norms and biases F32, as the converter writes)."""
    import gguf

    from regolith.convert.mmproj import mmproj_metadata, mmproj_tensors
    from regolith.convert.writer import _add_kv, _add_tensor_infos, _write_plan, mmproj_type

    config = {
        "hidden_size": out_dim,
        "vision_config": {
            "depth": depth,
            "hidden_size": HIDDEN,
            "intermediate_size": FF,
            "num_heads": HEADS,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "out_hidden_size": out_dim,
            "num_position_embeddings": N_POS,
        },
    }
    merged = HIDDEN * MERGE * MERGE
    shapes = {
        "patch_embed.proj.weight": (HIDDEN, 3, 2, PATCH, PATCH),
        "patch_embed.proj.bias": (HIDDEN,),
        "pos_embed.weight": (N_POS, HIDDEN),
        "merger.norm.weight": (HIDDEN,),
        "merger.norm.bias": (HIDDEN,),
        "merger.linear_fc1.weight": (merged, merged),
        "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (out_dim, merged),
        "merger.linear_fc2.bias": (out_dim,),
    }
    for i in range(depth):
        b = f"blocks.{i}."
        for n in ("norm1", "norm2"):
            shapes[b + n + ".weight"] = shapes[b + n + ".bias"] = (HIDDEN,)
        shapes[b + "attn.qkv.weight"], shapes[b + "attn.qkv.bias"] = (3 * HIDDEN, HIDDEN), (3 * HIDDEN,)
        shapes[b + "attn.proj.weight"], shapes[b + "attn.proj.bias"] = (HIDDEN, HIDDEN), (HIDDEN,)
        shapes[b + "mlp.linear_fc1.weight"], shapes[b + "mlp.linear_fc1.bias"] = (FF, HIDDEN), (FF,)
        shapes[b + "mlp.linear_fc2.weight"], shapes[b + "mlp.linear_fc2.bias"] = (HIDDEN, FF), (HIDDEN,)
    named = []
    for seed, (key, shape) in enumerate(shapes.items()):
        norm_weight = key.endswith(("norm.weight", "norm1.weight", "norm2.weight"))
        named.append(("model.visual." + key, _Random(shape, seed, 0.02, 1.0 if norm_weight else 0.0)))
    plan = mmproj_tensors(config, named)
    types = [mmproj_type(name, shape, "f16") for name, shape, _ in plan]
    writer = gguf.GGUFWriter(path=None, arch="clip")
    _add_tensor_infos(writer, plan, types)
    writer.add_type(gguf.GGUFType.MMPROJ)
    _add_kv(writer, mmproj_metadata(config, {}, file_type=int(gguf.LlamaFileType.MOSTLY_F16)))
    _write_plan(writer, path, plan, types)


def encoder_flops(n: int, depth: int, out_dim: int) -> float:
    """Multiply-adds x 2 of one single-frame image of n patches: patch embedding, per block the qkv / out /
    up / down projections and attention's QK^T and PV, then the merger's two linears."""
    merged, n_out = HIDDEN * MERGE * MERGE, n // (MERGE * MERGE)
    block = 2 * n * HIDDEN * (3 * HIDDEN + HIDDEN + 2 * FF) + 4 * n * n * HIDDEN
    return 2 * n * PATCH_DIM * HIDDEN + depth * block + 2 * n_out * merged * (merged + out_dim)


def dense_gflops(n: int, seconds: float) -> float:
    """GFLOP/s of the block's four F16 linear layers at n tokens (y = W x alone, no attention)."""
    rng = np.random.default_rng(0)
    total_flops = total_time = 0.0
    for rows, cols in ((3 * HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (FF, HIDDEN), (HIDDEN, FF)):
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
        pool = w.view(np.uint8).reshape(rows, cols * 2)
        x = rng.standard_normal((n, cols), dtype=np.float32)
        once = _core.time_matmul(TYPE_IDS["F16"], pool, rows, cols, x, 1)
        iters = max(1, int(seconds / max(once, 1e-6)))
        total_time += _core.time_matmul(TYPE_IDS["F16"], pool, rows, cols, x, iters) / iters
        total_flops += 2.0 * rows * cols * n
    return total_flops / total_time / 1e9


def _best(fn, repeats: int) -> tuple[float, float]:
    """(wall, process CPU) seconds of the fastest of ``repeats`` calls."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - t, time.process_time() - c))
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=int, default=[224, 448, 896], help="square image sides")
    ap.add_argument("--depth", type=int, default=27, help="ViT blocks (27 in qwen4_exp)")
    ap.add_argument("--out-dim", type=int, default=2048, help="merger output width (the text hidden size)")
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (0: all cores)")
    ap.add_argument("--repeats", type=int, default=1, help="encodings per size (the best is reported)")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per dense matmul measurement")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)
    from PIL import Image

    _core.set_threads(args.threads)
    console = Console()
    console.print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, kernels: {_core.isa()}, "
        f"threads: {_core.threads()}; {args.depth} blocks, F16 weights"
    )
    processor = ImageProcessor(PATCH, MERGE, 2, (0.5,) * 3, (0.5,) * 3, 65536, 16777216)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mmproj.gguf"
        t = time.perf_counter()
        write_projector(path, args.depth, args.out_dim)
        console.print(
            f"wrote {path.stat().st_size / 1e9:.2f} GB projector in {time.perf_counter() - t:.1f} s"
        )
        encoder = _core.VisionEncoder(str(path))
        for side in args.sizes:
            rng = np.random.default_rng(side)
            image = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
            pre, _ = _best(lambda image=image: processor(image), 3)
            pixels, grid = processor(image)
            grids = np.array([grid], np.int64)
            enc, cpu = _best(lambda pixels=pixels, grids=grids: encoder.encode(pixels, grids), args.repeats)
            n = int(np.prod(grid))
            gflops = encoder_flops(n, args.depth, args.out_dim) / enc / 1e9
            dense = dense_gflops(n, args.seconds)
            rows.append(
                [
                    f"{side}x{side}",
                    str(n),
                    str(n // (MERGE * MERGE)),
                    f"{pre * 1e3:.1f}",
                    f"{enc:.2f}",
                    f"{cpu:.2f}",
                    f"{gflops:.1f}",
                    f"{dense:.1f}",
                    f"{gflops / dense:.2f}",
                ]
            )
    header = [
        "image",
        "patches",
        "tokens",
        "preprocess ms",
        "encoder s",
        "encoder CPU s",
        "encoder GFLOP/s",
        "dense F16 GFLOP/s",
        "ratio",
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    table = Table(title="qwen4_exp vision encoder (F16 weights)")
    for h in header:
        table.add_column(h, justify="left" if h == "image" else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)


if __name__ == "__main__":
    main()
