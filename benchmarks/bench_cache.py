"""Window state files and the prompt cache: save and restore throughput against the disk's own sequential
bandwidth, and time to first token for a long prompt cold versus cached.

    python benchmarks/bench_cache.py [--model gemma3-270m] [--tokens 4096] [--ttft-tokens 2048] [--dir DIR]

1. The disk: O_DIRECT writes (then fsync) and reads of --disk-mb MiB in DIR, in 8 MiB requests on 4
   concurrent sequential streams, as the state writer issues them.
2. A window holding --tokens random tokens is saved (Window.save: temporary file, O_DIRECT writes on 4
   threads, fsync, rename; and again without O_DIRECT) and restored (Window.load into a new window),
   five times each; the best run is reported, with the restored window checked bit for bit.
3. Time to first token of a --ttft-tokens prompt (wall time of a one-token generation): without a cache;
   cold with a cache (the prompt is evaluated and its state stored); after a restart (a new Model and
   PromptCache on the same directory) with the whole prompt cached; and with 32 new tokens after it.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from regolith import PromptCache
from regolith import state as rstate

CHUNK = 8 << 20


def disk_bandwidth(directory: str, size: int, threads: int) -> tuple[float, float]:
    """(write, read) bytes per second of O_DIRECT requests of CHUNK bytes, `threads` sequential streams over
    consecutive quarters of one file (as the state writer issues them), the best of two runs."""
    runs = [_disk_run(directory, size, threads) for _ in range(2)]
    return max(w for w, _ in runs), max(r for _, r in runs)


def _disk_run(directory: str, size: int, threads: int) -> tuple[float, float]:
    path = os.path.join(directory, "bench-disk.bin")
    span = size // threads // CHUNK * CHUNK
    bufs = [mmap.mmap(-1, CHUNK) for _ in range(threads)]  # page-aligned, as O_DIRECT needs
    for b in bufs:
        b.write(np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8).tobytes())

    def run(fd: int, io) -> float:
        def stream(i: int) -> None:
            for off in range(i * span, (i + 1) * span, CHUNK):
                io(fd, bufs[i], off)

        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(stream, range(threads)))
        return time.perf_counter() - t

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        t = time.perf_counter()
        run(fd, lambda fd, b, off: os.pwritev(fd, [b], off))
        os.fsync(fd)
        write = threads * span / (time.perf_counter() - t)
        os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        read = threads * span / run(fd, lambda fd, b, off: os.preadv(fd, [b], off))
        os.close(fd)
    finally:
        os.unlink(path)
    return write, read


def best(fn, runs: int = 5) -> rstate.IoStats:
    return min((fn() for _ in range(runs)), key=lambda s: s.seconds)


def ttft(model: regolith.Model, prompt: list[int]) -> tuple[float, int]:
    """(seconds to the first generated token, prompt tokens not evaluated)."""
    t = time.perf_counter()
    gen = model.start(prompt, max_tokens=1, temperature=0.0)
    list(gen)
    return time.perf_counter() - t, gen.stats.cached_tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--ttft-tokens", type=int, default=2048)
    ap.add_argument("--disk-mb", type=int, default=512)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args(argv)
    console = Console()
    rng = np.random.default_rng(0)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        disk_w, disk_r = disk_bandwidth(tmp, args.disk_mb << 20, 4)
        n_ctx = max(args.tokens, args.ttft_tokens) + 64
        model = regolith.Model.load(args.model, n_ctx=n_ctx)
        vocab = model.config["vocab_size"]
        ids = rng.integers(100, min(vocab, 50000), args.tokens).tolist()
        window = model.window()
        t = time.perf_counter()
        for start in range(0, len(ids), 512):
            window.eval(ids[start : start + 512], all_logits=False)
        prefill = time.perf_counter() - t
        path = os.path.join(tmp, "window.rgs")
        saved = best(lambda: window.save(path))
        buffered = best(lambda: rstate.save_window(window, path, direct=False))
        window.save(path)
        restored = best(lambda: model.window().load(path))
        copy = model.window()
        copy.load(path)
        assert np.array_equal(copy.eval([ids[0]]), window.eval([ids[0]])), "restore is not exact"

        table = Table(
            title=f"{args.model}: a window of {args.tokens} tokens ({saved.bytes / 1e6:.1f} MB state)"
        )
        for col in ("operation", "GB/s", "of disk", "seconds", "note"):
            table.add_column(col, justify="left" if col in ("operation", "note") else "right")
        table.add_row(
            "disk O_DIRECT write",
            f"{disk_w / 1e9:.2f}",
            "",
            "",
            f"{args.disk_mb} MiB, 8 MiB requests, 4 streams, fsync",
        )
        table.add_row("disk O_DIRECT read", f"{disk_r / 1e9:.2f}", "", "", "")
        for name, s, ref in (
            ("save (O_DIRECT)", saved, disk_w),
            ("save (buffered)", buffered, disk_w),
            ("restore (O_DIRECT)", restored, disk_r),
        ):
            note = f"{s.threads} threads" + ("" if s.direct else ", page cache + fsync")
            table.add_row(
                name, f"{s.gb_per_second:.2f}", f"{s.gb_per_second * 1e9 / ref:.0%}", f"{s.seconds:.3f}", note
            )
        table.add_row("prefill (for scale)", "", "", f"{prefill:.2f}", f"{args.tokens / prefill:.0f} tok/s")
        console.print(table)

        prompt = rng.integers(100, min(vocab, 50000), args.ttft_tokens).tolist()
        more = prompt + rng.integers(100, min(vocab, 50000), 32).tolist()
        cache_dir = os.path.join(tmp, "cache")

        def fresh(cached: bool) -> regolith.Model:
            """A new Model (as after a restart) with its tokenizer built and its fingerprint known (one-time
            costs of a process: ~1 s and ~30 ms for gemma3's 262k vocabulary)."""
            m = regolith.Model.load(args.model, n_ctx=n_ctx)
            _ = (m.tokenizer, m.fingerprint)
            if cached:
                m.prompt_cache = PromptCache(cache_dir, 8 << 30)
            return m

        plain = fresh(False)
        ttft(plain, [2, 3, 4, 5])  # warm-up: fault the weights in
        rows = [("no cache", *ttft(plain, prompt))]
        rows.append(("cold, stored in the cache", *ttft(fresh(True), prompt)))
        for name, p in (("after a restart: same prompt", prompt), ("after a restart: +32 tokens", more)):
            rows.append((name, *ttft(fresh(True), p)))
        table = Table(title=f"{args.model}: time to first token, {args.ttft_tokens}-token prompt")
        for col in ("run", "seconds", "prompt tokens reused"):
            table.add_column(col, justify="left" if col == "run" else "right")
        for name, seconds, reused in rows:
            table.add_row(name, f"{seconds:.3f}", str(reused))
        console.print(table)


if __name__ == "__main__":
    main()
