"""qwen4exp on an NVIDIA GPU: regolith's CUDA backend beside llama.cpp's, at Qwen3.8-Flash-Next's shapes.

The model is benchmarks/synthetic_qwen4exp.py's (48 layers, IQ2_XS routed experts, Q8_0 dense matrices, the
full 248,320-token vocabulary: 24.25 GiB) unless ``--model`` names a GGUF. Rows of the table:

- ``resident``: every weight in VRAM; 512-token prefill and greedy decode, regolith and llama.cpp
  (``llama-bench -ngl 99``).
- ``host``: regolith with a VRAM arena of ``--arena-fraction`` of the routed experts and a host-RAM tier
  holding every expert, routed on the device (``device_routing=True``: every expert read into mapped RAM at
  load, each layer's experts computed with no host round trip, from the arena where it holds them and over
  the bus otherwise, the arena refilled between tokens); ``host (on demand)``: the same memory without it
  (each layer's routing brought to the host, misses copied from RAM into the arena before they run); llama.cpp with every expert in RAM and computed by the CPU (``-ncmoe`` all layers), its
  way of running a model larger than VRAM.
- ``disk``: the same VRAM arena with no host tier: every miss is an O_DIRECT read from disk.

The roofline is measured in the same run: HBM bandwidth (a device-to-device copy, read + write), pinned
host-to-device bandwidth, and the disk's O_DIRECT bandwidth at the expert record size; each regolith row
says what share of the bound for its path it reached (resident decode: the weight bytes one token reads
over HBM bandwidth; host: the expert bytes copied from RAM over the host-to-device bandwidth; disk: the
expert bytes read over the disk's bandwidth).

    python benchmarks/bench_cuda.py [--model PATH] [--dir DIR] [--llama-bench PATH] [--prompt 512]
        [--decode 64] [--arena-fraction 0.25] [--skip ROW ...] [--record FILE]

Needs a regolith build with the CUDA backend and an NVIDIA GPU; torch (for the bandwidth probes) when
present. ``--llama-bench`` is the llama-bench binary of a llama.cpp CUDA build (``../shared/tools/
llamacpp-slim-source`` says how to build one); without it the table has no llama.cpp column.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from benchmarks import synthetic_qwen4exp
from benchmarks.bench_stream import disk_bandwidth, drop_page_cache, expert_layout
from regolith import gguf as rgguf
from regolith import model_sizes

GiB = 2**30


def gpu_bandwidth() -> dict[str, float] | None:
    """HBM (device-to-device copy, read + write bytes / s) and pinned host-to-device bandwidth, via torch;
    None where torch has no CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def timed(fn, reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    hbm = 2 * src.numel() / timed(lambda: dst.copy_(src), 20)
    h2d = host.numel() / timed(lambda: dst.copy_(host, non_blocking=True), 10)
    src = dst = host = None
    torch.cuda.empty_cache()
    return {"hbm": hbm, "h2d": h2d}


def decode_bytes(path: str) -> tuple[int, int]:
    """(weight bytes one decode token reads with every expert resident, routed-expert bytes of one token):
    every tensor but the token embedding and the routed experts, plus top-k of n experts of each layer."""
    with rgguf.open(path) as f:
        k = int(f.metadata["qwen4exp.expert_used_count"])
        n = int(f.metadata["qwen4exp.expert_count"])
        dense = sum(
            t.nbytes for t in f.tensors.values() if "_exps." not in t.name and t.name != "token_embd.weight"
        )
        experts = sum(t.nbytes for t in f.tensors.values() if "_exps." in t.name) * k // n
    return dense + experts, experts


def regolith_run(path: str, prompt: np.ndarray, n_decode: int, **load) -> dict[str, float]:
    """Load, prefill and decode seconds (greedy) and the arena's counters over the decode."""
    t = time.perf_counter()
    model = regolith.Model.load(path, backend="cuda", **load)
    loaded = time.perf_counter() - t
    model.window(len(prompt) + 8).eval(prompt, all_logits=False)  # warm-up: kernels loaded, arena filled
    window = model.window(len(prompt) + n_decode + 8)
    t = time.perf_counter()
    tok = int(np.argmax(window.eval(prompt, all_logits=False)[0]))
    prefill = time.perf_counter() - t
    before = model.stats()
    t = time.perf_counter()
    for _ in range(n_decode):
        tok = int(np.argmax(window.eval([tok], all_logits=False)[0]))
    decode = time.perf_counter() - t
    after = model.stats()
    out = {"load": loaded, "prefill": prefill, "decode": decode}
    if "hits" in after:
        out["bytes_read"] = after["bytes_read"] - before["bytes_read"]
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        out["hit_rate"] = hits / (hits + misses) if hits + misses else float("nan")
        out["host_hits"] = after["host_hits"] - before["host_hits"]
        out["misses"] = misses
    return out


def llamacpp_run(binary: str, path: str, n_prompt: int, n_decode: int, *extra: str) -> dict[str, float]:
    """llama-bench's mean tokens/s for pp{n_prompt} and tg{n_decode} (JSON output)."""
    cmd = [binary, "-m", path, "-p", str(n_prompt), "-n", str(n_decode), "-r", "2", "-o", "json", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    rows = json.loads(res.stdout)
    rate = {}
    for r in rows:
        rate["prefill" if r["n_prompt"] > 0 else "decode"] = float(r["avg_ts"])
    return rate


def profile_decode(path: str, n_tokens: int, console: Console) -> None:
    """Print each CUDA kernel's launches and GPU time per token over ``n_tokens`` resident decode steps (torch's
    profiler, which sees every kernel of the process, the graph-launched ones included), beside the wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = regolith.Model.load(path, backend="cuda")
    window = model.window(64 + n_tokens)
    tok = int(np.argmax(window.eval(list(range(3, 35)), all_logits=False)[0]))
    for _ in range(4):  # warm-up: graphs instantiated
        tok = int(np.argmax(window.eval([tok], all_logits=False)[0]))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(n_tokens):
            tok = int(np.argmax(window.eval([tok], all_logits=False)[0]))
        wall = (time.perf_counter() - t) / n_tokens
    torch.cuda.synchronize()
    # Kernels launched with programmatic dependent launch start before their predecessor ends and wait at
    # pdl_begin, so a kernel's own span overlaps the one before: each kernel's time here is its span past the
    # latest end before it ("own"), and the spans' gaps are time the GPU ran no kernel.
    spans = sorted(
        (ev.time_range.start, ev.time_range.end, ev.name)
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA
    )
    per: dict[str, list[float]] = {}
    idle, last_end = 0.0, None
    for start, end, name in spans:
        own = end - start if last_end is None else max(0.0, end - max(start, last_end))
        if last_end is not None and start > last_end:
            idle += start - last_end
        last_end = end if last_end is None else max(last_end, end)
        e = per.setdefault(name, [0, 0.0, 0.0])
        e[0] += 1
        e[1] += end - start
        e[2] += own
    table = Table(title=f"resident decode, {n_tokens} tokens: {wall * 1e3:.2f} ms a token (wall)")
    for col in ("kernel", "launches/token", "span us/token", "own us/token", "own mean us"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for name, (n, span, own) in sorted(per.items(), key=lambda kv: -kv[1][2]):
        table.add_row(
            name[:100],
            f"{n / n_tokens:.1f}",
            f"{span / n_tokens:.1f}",
            f"{own / n_tokens:.1f}",
            f"{own / n:.2f}",
        )
    console.print(table)
    launches = sum(v[0] for v in per.values()) / n_tokens
    own_ms = sum(v[2] for v in per.values()) / n_tokens / 1e3
    console.print(
        f"kernels: {launches:.0f} a token, {own_ms:.2f} ms of their own GPU time and {idle / n_tokens / 1e3:.2f} ms "
        f"with no kernel running, against {wall * 1e3:.2f} ms wall"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a qwen4exp GGUF (default: write the synthetic Flash-Next model)")
    ap.add_argument("--dir", help="where to write the synthetic model (default: a temporary directory)")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--llama-bench", help="llama-bench of a llama.cpp CUDA build")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--arena-fraction", type=float, default=0.25, help="of the routed experts, in VRAM")
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["resident", "host", "disk"], help="rows to leave out"
    )
    ap.add_argument("--record", help="a JSON file keeping the rows measured (a rerun measures the rest)")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="TOKENS",
        help="only profile TOKENS resident decode steps (torch's profiler): the kernels' time per token",
    )
    args = ap.parse_args(argv)
    if "cuda" not in regolith.backends.available():
        raise SystemExit(
            f"this regolith build has no usable CUDA backend ({', '.join(regolith.backends.available())})"
        )
    console = Console()
    tmp = None
    path = args.model
    if path is None:
        tmp = tempfile.TemporaryDirectory(dir=args.dir)
        path = os.path.join(tmp.name, "flash-next-synthetic.gguf")
        t = time.perf_counter()
        synthetic_qwen4exp.write(path, args.layers, vocab=248320, expert_type="IQ2_XS", dense_type="Q8_0")
        console.print(
            f"wrote {path} ({os.path.getsize(path) / GiB:.2f} GiB) in {time.perf_counter() - t:.0f} s"
        )
    if args.profile:
        profile_decode(path, args.profile, console)
        return
    size = os.path.getsize(path)
    per_token, expert_per_token = decode_bytes(path)
    lay = expert_layout(path)
    bw = gpu_bandwidth()
    disk = disk_bandwidth(path, lay["record"], (lay["start"], lay["end"]))["random x4"]
    prompt = np.random.default_rng(0).integers(3, 259, args.prompt).astype(np.int32)

    # (row, engine, prefill tok/s, decode tok/s, note); with --record, the rows measured so far are kept in that
    # JSON file and a rerun with the same arguments measures only the rest (a lent machine's calls are short)
    rows: list[tuple[str, str, float, float, str]] = []
    key = {"model": os.path.basename(path), "size": size, "prompt": args.prompt, "decode": args.decode}
    done: dict[str, list] = {}
    if args.record and os.path.exists(args.record):
        with open(args.record) as f:
            saved = json.load(f)
        done = saved["rows"] if saved.get("key") == key else {}

    def measure(row: str, engine: str, fn) -> None:
        name = f"{row} / {engine}"
        if name not in done:
            pre, dec, note = fn()
            done[name] = [row, engine, pre, dec, note]
            if args.record:
                with open(args.record, "w") as f:
                    json.dump({"key": key, "rows": done}, f)
        rows.append(tuple(done[name]))
        r = rows[-1]
        console.print(f"{r[0]} {r[1]}: pp{args.prompt} {r[2]:.1f} tok/s, decode {r[3]:.2f} tok/s  {r[4]}")

    arena_gb = args.arena_fraction * lay["total"] / GiB
    arena = f"arena {arena_gb:.1f} GiB ({args.arena_fraction:.0%} of experts)"
    with rgguf.open(path) as f:  # a host tier of every record, as the arena lays them out (slots)
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None)
    tier = 1.001 * sizes.slot_bytes * sizes.n_experts_total / GiB

    def resident():
        r = regolith_run(path, prompt, args.decode)
        rate = args.decode / r["decode"]
        note = f"{per_token * rate / bw['hbm']:.1%} of HBM ({per_token / 1e9:.2f} GB/token)" if bw else ""
        return args.prompt / r["prefill"], rate, note

    def host_routed():
        r = regolith_run(
            path, prompt, args.decode, arena_gb=arena_gb, host_cache_gb=tier, device_routing=True
        )
        rate = args.decode / r["decode"]
        # over the bus: the misses' records read in place, and the records copied into the arena between tokens
        bus_bps = (r["misses"] + r["host_hits"]) * lay["record"] / r["decode"]
        note = (
            f"{arena}, routed on the GPU: hit rate {r['hit_rate']:.1%}, {r['misses']} experts read from RAM in "
            f"place, {r['host_hits']} copied into the arena; loaded in {r['load']:.0f} s"
        )
        if bw:
            note += f"; bus {bus_bps / 1e9:.2f} GB/s = {bus_bps / bw['h2d']:.0%} of host-to-device"
        return args.prompt / r["prefill"], rate, note

    def host_on_demand():
        r = regolith_run(
            path, prompt, args.decode, arena_gb=arena_gb, host_cache_gb=tier, device_routing=False
        )
        rate = args.decode / r["decode"]
        copy_bps = r["host_hits"] * lay["record"] / r["decode"]
        note = (
            f"{arena}, hit rate {r['hit_rate']:.1%} ({r['misses']} misses), {r['host_hits']} slots filled from RAM "
            "(misses and prefetches)"
        )
        if bw:
            note += f", copies {copy_bps / 1e9:.2f} GB/s = {copy_bps / bw['h2d']:.0%} of host-to-device"
        return args.prompt / r["prefill"], rate, note

    def disk_row():
        drop_page_cache(path)
        r = regolith_run(path, prompt, args.decode, arena_gb=arena_gb)
        rate = args.decode / r["decode"]
        read_bps = r["bytes_read"] / r["decode"]
        note = f"{arena}, hit rate {r['hit_rate']:.1%}, reads {read_bps / 1e9:.2f} GB/s = {read_bps / disk:.0%} of the disk"
        return args.prompt / r["prefill"], rate, note

    def llama(*extra: str):
        def run():
            p = llamacpp_run(args.llama_bench, path, args.prompt, args.decode, "-ngl", "99", *extra)
            return (
                p["prefill"],
                p["decode"],
                " ".join(["-ngl 99", *extra]) + (": experts on the CPU" if extra else ""),
            )

        return run

    if "resident" not in args.skip:
        measure("resident", "regolith", resident)
    if "host" not in args.skip:
        measure("host", "regolith", host_routed)
        measure("host (on demand)", "regolith", host_on_demand)
    if "disk" not in args.skip:
        measure("disk", "regolith", disk_row)
    # llama.cpp's rows last: its build may still be running beside the first ones
    if args.llama_bench and "resident" not in args.skip:
        measure("resident", "llama.cpp", llama())
    if args.llama_bench and "host" not in args.skip:
        measure("host", "llama.cpp", llama("-ncmoe", str(lay["n_layers"])))

    roof = f"disk O_DIRECT {disk / 1e9:.2f} GB/s"
    if bw:
        roof = f"HBM {bw['hbm'] / 1e9:.0f} GB/s, pinned host-to-device {bw['h2d'] / 1e9:.1f} GB/s, " + roof
    table = Table(
        title=f"qwen4exp at Flash-Next shapes, {lay['n_layers']} layers ({size / GiB:.2f} GiB); {roof}"
    )
    for col in ("row", "engine", f"pp{args.prompt} tok/s", "decode tok/s", "vs llama.cpp", "note"):
        table.add_column(col, justify="right" if "tok/s" in col or col == "vs llama.cpp" else "left")
    peers = {row: (pre, dec) for row, eng, pre, dec, _ in rows if eng == "llama.cpp"}
    for row, eng, pre, dec, note in rows:
        ratio = ""
        peer = peers.get(row.split(" (")[0])
        if eng == "regolith" and peer:
            ratio = f"prefill {pre / peer[0]:.2f}x, decode {dec / peer[1]:.2f}x"
        table.add_row(row, eng, f"{pre:.1f}", f"{dec:.2f}", ratio, note)
    console.print(table)
    console.print(f"routed-expert bytes per decode token: {expert_per_token / 1e6:.1f} MB")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
