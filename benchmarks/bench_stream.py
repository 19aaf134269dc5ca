"""Expert streaming: decode speed across expert-arena sizes, against the disk's O_DIRECT bandwidth and against
llama.cpp.

    python benchmarks/bench_stream.py [--model PATH | --synthetic flash-next --layers 4 --experts Q4_K
        --data-dir /work/bench_data] [--arena 0.125,0.25,0.5] [--prompt 16] [--decode 32]
        [--trace FILE [--replay-only]] [--json OUT]

The model is a GGUF with routed experts (qwen4exp, qwen3moe, qwen35moe, qwen3next, gpt-oss): ``--model``, or
a synthetic one at a real model's per-layer shapes with ``--layers`` layers (written once to ``--data-dir``
and reused):
``--synthetic flash-next`` (benchmarks/synthetic_qwen4exp.py), ``qwen3-30b-a3b`` or ``qwen3-235b-a22b``
(benchmarks/synthetic_qwen3moe.py), ``qwen35-35b-a3b``, ``qwen35-397b-a17b`` or ``qwen3-next-80b-a3b``
(benchmarks/synthetic_qwen35moe.py; ``--experts`` Q4_K, Q2_K, Q8_0 or Q4_K_M), ``gpt-oss-20b`` or
``gpt-oss-120b`` (benchmarks/synthetic_gptoss.py; MXFP4 experts, as released). All in one run:

1. The disk: O_DIRECT reads of one expert record (a routed expert's gate, up and down bytes, rounded up to
   4 KiB) from the file's expert region: sequential at queue depth 1, random at queue depth 1, random from
   ``--io-threads`` threads. The best of these is the bandwidth the read rates are compared with.
2. llama.cpp (llama-cpp-python's C API, when installed; as many threads as regolith): ``mmap --no-repack``
   (llama-cli's flag), which leaves every weight in the mapping; ``mmap``, its default, which copies the
   tensors it has faster CPU layouts for (Q4_0, Q4_K, IQ4_NL: routed experts included) into RAM at load;
   and ``--no-mmap`` (the file read into RAM). The last two run only when the file fits in the memory
   available. Its read MB/s is the process's storage reads (/proc/self/io read_bytes) during decode; note
   that llama.cpp's mmap load prefetches the whole file (madvise WILLNEED). OMP_WAIT_POLICY defaults to
   PASSIVE (set it to ACTIVE for llama.cpp's spinning threads, faster only on an otherwise idle machine).
3. regolith: memory-mapped without an arena (when the file fits, with the file in the page cache: the
   compute ceiling; otherwise from a cold cache, two passes as below, reading through page faults), then
   ``Model.load(path, arena_gb=...)`` with an arena of each ``--arena`` fraction of the routed experts'
   bytes: decode tok/s, the arena's hit rate, expert bytes read per second and their share of the disk
   bandwidth, the share of decode time stalled on reads, and the speed against llama.cpp's
   ``mmap --no-repack`` in the same pass.

Streaming runs (llama.cpp ``mmap --no-repack``, the regolith arenas) decode two passes in one context: cold
(right after loading) and warm (the same again, caches as the first pass left them). Every pass evaluates
the same ``--prompt`` random token ids, then ``--decode`` greedy tokens one at a time; only the decode steps
are timed. Random weights route near-uniformly, so an arena holding a fraction f of the experts hits about
f of the time; ``--trace FILE`` replays recorded routing (an .npz with ``expert_ids``: int [n_tokens,
n_moe_layers, top_k] chosen expert ids, and ``num_experts``; benchmarks/traces/demo_routing.npz is the
bundled demo model's, docs/demo_model.md) through the arena's cache policy
(``regolith._core.replay_trace``, the arena's own eviction code, as plain LRU and with its learned hot set)
for realistic hit rates at the same arena fractions. ``--pack DIR`` repeats the arena rows reading a packed
copy of the model (one read per expert instead of three); ``--moce`` measures cache-aware routing against
exact routing (hit rate and tok/s gained, next-token KL divergence and top-1 agreement on the same tokens).

The file's pages are evicted from the page cache before every load (and the file read in for the "file
cached" row). The machine's other load shows in every number: run it idle.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from benchmarks import synthetic_gptoss, synthetic_qwen3moe, synthetic_qwen4exp, synthetic_qwen35moe
from regolith import _core
from regolith import gguf as rgguf

ALIGN = 4096  # O_DIRECT offset and size alignment
GiB = 2**30
MIN_SPARE_RAM = 2 * GiB  # "fits in memory": file size + this <= MemAvailable


# ------------------------------------------------------------------------------------------ the file


def expert_layout(path: str | os.PathLike[str]) -> dict[str, int]:
    """The routed experts in a GGUF (qwen4exp, qwen3moe, qwen35moe, qwen3next, gpt-oss): ``record`` (bytes of
    one expert's gate + up + down), ``n_experts``, ``n_layers``, ``total`` bytes, and the file span ``start``
    .. ``end`` holding them."""
    with rgguf.open(path) as f:
        exps = [t for t in f.tensors.values() if t.name.endswith("_exps.weight")]
        n_experts = int(f.metadata[f"{f.architecture}.expert_count"])
    if not exps:
        raise ValueError(f"{path}: no routed expert tensors (*_exps.weight)")
    layers = {t.name.split(".")[1] for t in exps}
    total = sum(t.nbytes for t in exps)
    return {
        "record": total // len(layers) // n_experts,
        "n_experts": n_experts,
        "n_layers": len(layers),
        "total": total,
        "start": min(t.offset for t in exps),
        "end": max(t.offset + t.nbytes for t in exps),
    }


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def drop_page_cache(path: str | os.PathLike[str]) -> None:
    """Evict ``path``'s pages from the page cache (posix_fadvise DONTNEED: only this file, unlike
    /proc/sys/vm/drop_caches, so the machine's other users keep theirs; pages a live mapping holds stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fill_page_cache(path: str | os.PathLike[str]) -> None:
    """Read the whole file once so its pages are cached."""
    buf = bytearray(16 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def storage_read_bytes() -> int:
    """Bytes this process has caused to be read from storage (/proc/self/io), page faults included."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise OSError("/proc/self/io has no read_bytes")


# ------------------------------------------------------------------------------------------ the disk


def disk_bandwidth(
    path: str | os.PathLike[str],
    record: int,
    span: tuple[int, int],
    *,
    threads: int = 4,
    seconds: float = 3.0,
    seed: int = 0,
) -> dict[str, float]:
    """O_DIRECT read bandwidth of ``path`` in bytes/s with requests of ``record`` bytes (rounded up to 4 KiB)
    at 4 KiB-aligned offsets in ``span`` (start, end): ``sequential`` (queue depth 1, from a random offset),
    ``random`` (queue depth 1) and ``random xN`` (``threads`` threads, each at queue depth 1)."""
    size = -(-record // ALIGN) * ALIGN
    lo = -(-span[0] // ALIGN) * ALIGN
    n_slots = (span[1] - size - lo) // ALIGN
    if n_slots <= 0:
        raise ValueError(f"{path}: the span {span} is smaller than one {size}-byte request")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:

        def reader(offsets: Iterator[int], deadline: float, done: list[int]) -> None:
            buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
            n = 0
            while time.perf_counter() < deadline:
                n += os.preadv(fd, [buf], next(offsets))
            buf.close()
            done.append(n)

        def run(offsets: Callable[[int], Iterator[int]], n_threads: int) -> float:
            done: list[int] = []
            t = time.perf_counter()
            workers = [
                threading.Thread(target=reader, args=(offsets(i), t + seconds, done))
                for i in range(n_threads)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            return sum(done) / (time.perf_counter() - t)

        def sequential(i: int) -> Iterator[int]:
            k = int(np.random.default_rng(seed).integers(n_slots))
            while True:
                yield lo + k * ALIGN
                k = (k + size // ALIGN) % n_slots

        def at_random(i: int) -> Iterator[int]:
            rng = np.random.default_rng(seed + 1 + i)
            while True:
                yield lo + int(rng.integers(n_slots)) * ALIGN

        return {
            "sequential": run(sequential, 1),
            "random": run(at_random, 1),
            f"random x{threads}": run(at_random, threads),
        }
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------ decoding


def timed_decode(
    eval_last: Callable[[list[int]], np.ndarray],
    prompt: Sequence[int],
    n: int,
    on_start: Callable[[], None] | None = None,
) -> float:
    """Evaluate ``prompt``, then ``n`` greedy tokens one at a time; returns the decode seconds.
    ``eval_last(ids)`` evaluates ids and returns the last position's logits; ``on_start()`` runs between the
    prompt and the timed decode."""
    tok = int(np.argmax(eval_last(list(prompt))))
    if on_start is not None:
        on_start()
    t = time.perf_counter()
    for _ in range(n):
        logits = eval_last([tok])
        if not np.isfinite(logits).all():
            raise RuntimeError("decode produced non-finite logits")
        tok = int(np.argmax(logits))
    return time.perf_counter() - t


class LlamaCpp:
    """llama.cpp through llama-cpp-python's C API: token ids in, the last position's logits out.

    ``mmap`` maps the file (llama.cpp's default) or reads it into RAM; ``repack`` lets llama.cpp copy the
    tensors it has faster CPU layouts for (Q4_0, Q4_K, IQ4_NL: the routed experts included) into RAM at load,
    its default; ``repack=False`` is llama-cli's ``--no-repack``, which leaves them in the mapping."""

    _silence: Any = None  # the log callback, kept alive while llama.cpp may call it

    def __init__(self, path: str, n_ctx: int, threads: int, *, mmap: bool, repack: bool) -> None:
        import llama_cpp

        self._lib = llama_cpp
        if LlamaCpp._silence is None:
            LlamaCpp._silence = llama_cpp.llama_log_callback(lambda level, text, user: None)
            llama_cpp.llama_log_set(LlamaCpp._silence, None)
            llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        params.use_extra_bufts = repack
        self._model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_threads = cparams.n_threads_batch = threads
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create a context")
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model))

    def eval_last(self, ids: list[int]) -> np.ndarray:
        """Evaluate ``ids`` after the tokens so far; the logits of the last one."""
        tokens = (self._lib.llama_token * len(ids))(*ids)
        rc = self._lib.llama_decode(self._ctx, self._lib.llama_batch_get_one(tokens, len(ids)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        logits = self._lib.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self._n_vocab,)).copy()

    def close(self) -> None:
        self._lib.llama_free(self._ctx)
        self._lib.llama_model_free(self._model)


def _passes(
    eval_last: Callable[[list[int]], np.ndarray],
    prompt: Sequence[int],
    n: int,
    passes: int,
    counters: Callable[[], dict[str, float]],
) -> list[dict[str, float]]:
    """``passes`` runs of :func:`timed_decode` in one context (the first cold, the next warm): tok/s and
    each counter's change per decode second."""
    out = []
    for _ in range(passes):
        start: list[dict[str, float]] = []
        seconds = timed_decode(eval_last, prompt, n, lambda start=start: start.append(counters()))
        end = counters()
        out.append({"tok_s": n / seconds, **{k: (end[k] - start[0][k]) / seconds for k in end}})
    return out


def llamacpp_decode(
    path: str, prompt: Sequence[int], n: int, *, threads: int, mmap: bool, repack: bool, passes: int = 1
) -> list[dict[str, float]]:
    """llama.cpp loading ``path`` and decoding: per pass, tok/s and storage reads during decode
    (``read_Bps``); the first pass also has the load seconds and the bytes read while loading."""
    read0, t = storage_read_bytes(), time.perf_counter()
    llm = LlamaCpp(path, passes * (len(prompt) + n + 1) + 8, threads, mmap=mmap, repack=repack)
    load = {"load_s": time.perf_counter() - t, "load_read_bytes": storage_read_bytes() - read0}
    try:
        out = _passes(llm.eval_last, prompt, n, passes, lambda: {"read_Bps": storage_read_bytes()})
    finally:
        llm.close()
    out[0].update(load)
    return out


def _window_eval(model: regolith.Model, n_ctx: int) -> Callable[[list[int]], np.ndarray]:
    window = model.window(n_ctx)
    return lambda ids: window.eval(ids, all_logits=False)[-1]


def regolith_mmap(path: str, prompt: Sequence[int], n: int, passes: int = 1) -> list[dict[str, float]]:
    """regolith with the whole file memory-mapped, no arena: per pass, tok/s and storage reads during decode
    (``read_Bps``); the first pass also has the load seconds."""
    t = time.perf_counter()
    model = regolith.Model.load(path)
    load_s = time.perf_counter() - t
    eval_last = _window_eval(model, passes * (len(prompt) + n + 1) + 8)
    out = _passes(eval_last, prompt, n, passes, lambda: {"read_Bps": storage_read_bytes()})
    out[0]["load_s"] = load_s
    return out


def regolith_arena(
    path: str, arena_gb: float, prompt: Sequence[int], n: int, passes: int = 1, **load: Any
) -> list[dict[str, float]]:
    """regolith streaming experts through an arena of ``arena_gb`` GiB (``path``: a GGUF, read in place, or
    a packed directory): per pass, tok/s, the decode's hit rate, expert bytes read per second (``read_Bps``;
    ``os_read_Bps``: the process's storage reads), the share of decode time stalled on reads; the first pass
    also has the load seconds and the lowest per-layer hit rate since load. ``load``: more Model.load
    options (moce, lookahead)."""
    t = time.perf_counter()
    model = regolith.Model.load(path, arena_gb=arena_gb, **load)
    load_s = time.perf_counter() - t

    def counters() -> dict[str, float]:
        st = model.stats()
        return {
            "hits": st["hits"],
            "misses": st["misses"],
            "read_Bps": st["bytes_read"],
            "os_read_Bps": storage_read_bytes(),
            "stall": st["read_stall_s"],
        }

    out = _passes(_window_eval(model, passes * (len(prompt) + n + 1) + 8), prompt, n, passes, counters)
    for r in out:  # hits and misses came back per second: their ratio is the pass's hit rate
        hits, misses = r.pop("hits"), r.pop("misses")
        r["hit_rate"] = hits / (hits + misses) if hits + misses else float("nan")
    out[0].update(load_s=load_s, layer_hit_min=min(model.stats()["per_layer_hit_rate"]))
    return out


def moce_effect(
    path: str, arena_gb: float, tokens: Sequence[int], *, bonus: float, protect: int
) -> dict[str, float]:
    """Cache-aware routing against exact routing on the same tokens (teacher-forced, one at a time after a
    16-token prefill): hit rates and decode tok/s of both, and per position the KL divergence of MoCE's
    next-token distribution from the exact one and whether their top-1 tokens agree."""
    runs = {}
    for name, moce in (("exact", False), ("moce", {"bonus": bonus, "protect": protect})):
        model = regolith.Model.load(path, arena_gb=arena_gb, moce=moce)
        window = model.window(len(tokens) + 8)
        window.eval(tokens[:16], all_logits=False)
        model.reset_stats()
        logits, t = [], time.perf_counter()
        for tok in tokens[16:]:
            logits.append(window.eval([tok])[-1].astype(np.float64))
        dt = time.perf_counter() - t
        st = model.stats()
        runs[name] = (np.stack(logits), st["hit_rate"], len(logits) / dt)
    (exact, hit0, tps0), (moce, hit1, tps1) = runs["exact"], runs["moce"]
    p = np.exp(exact - exact.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    logq = moce - moce.max(1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(1, keepdims=True))
    logp = np.log(np.maximum(p, 1e-300))
    kl = (p * (logp - logq)).sum(1)
    return {
        "hit_exact": hit0,
        "hit_moce": hit1,
        "tok_s_exact": tps0,
        "tok_s_moce": tps1,
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "top1_agree": float((exact.argmax(1) == moce.argmax(1)).mean()),
    }


# ------------------------------------------------------------------------------------------ traces


def load_trace(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """A routing trace (docs/demo_model.md): an .npz with ``expert_ids`` (int [n_tokens, n_moe_layers,
    top_k], the experts each layer chose for each token) and ``num_experts``; returns (int32 expert ids,
    the number of experts)."""
    with np.load(path) as data:
        if "expert_ids" not in data or "num_experts" not in data:
            raise ValueError(
                f"{path}: a routing trace needs 'expert_ids' [tokens, layers, top_k] and 'num_experts'"
            )
        experts = np.asarray(data["expert_ids"], dtype=np.int32)
        n_experts = int(data["num_experts"])
    if experts.ndim != 3 or experts.size == 0:
        raise ValueError(f"{path}: 'expert_ids' must be a non-empty [tokens, layers, top_k] array")
    if experts.min() < 0 or experts.max() >= n_experts:
        raise ValueError(f"{path}: expert ids outside 0 .. {n_experts - 1}")
    return experts, n_experts


POLICIES = {"lru": 0.0, "lru+hot": 0.75}  # the arena's policy with no hot set, and with its default one


def replay(experts: np.ndarray, n_experts: int, fractions: Sequence[float]) -> list[dict]:
    """Hit rates of the arena's cache policy (``_core.replay_trace``, the arena's own eviction code) on a
    trace, per arena fraction of all (layer, expert) records, for plain LRU and LRU + the learned hot set; and
    of the device-routed arena's (``_core.replay_routed_trace``: hits against the arena as each token began,
    the misses admitted between tokens by usage score) with the records it copies per token."""
    records = experts.shape[1] * n_experts
    tokens = max(experts.shape[0], 1)
    rows = []
    for frac in fractions:
        slots = max(1, round(frac * records))
        row: dict[str, Any] = {"fraction": frac, "slots": slots}
        for name, hot in POLICIES.items():
            r = _core.replay_trace(experts, n_experts, slots, hot_fraction=hot)
            row[name] = r["hits"] / max(r["hits"] + r["misses"], 1)
        r = _core.replay_routed_trace(experts, n_experts, slots)
        row["routed"] = r["hits"] / max(r["hits"] + r["misses"], 1)
        row["routed_copies"] = r["copies"] / tokens
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ the run


def _mbs(bps: float) -> str:
    return f"{bps / 1e6:.0f}"


def _show(console: Console, markdown: bool, title: str, head: list[str], rows: list[list[str]]) -> None:
    """A table on the console, or as Markdown (for docs/benchmarks.md)."""
    if markdown:
        print(f"\n{title}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    table = Table(title=title)
    for i, col in enumerate(head):
        table.add_column(col, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


PASSES = ("cold", "warm")


def show_replay(console: Console, args: argparse.Namespace, fractions: Sequence[float]) -> list[dict]:
    """The --trace table: the trace replayed through the arena's policies at each arena fraction."""
    experts, n_experts = load_trace(args.trace)
    replayed = replay(experts, n_experts, fractions)
    _show(
        console,
        args.markdown,
        f"{args.trace}: {experts.shape[0]} tokens x {experts.shape[1]} MoE layers, "
        f"top-{experts.shape[2]} of {n_experts}: hit rates of the arena policy",
        ["arena", "slots", "LRU", "LRU + hot set", "routed on the device", "its copies a token",
         "uniform routing"],
        [[f"{r['fraction']:.1%}", str(r["slots"]), f"{r['lru']:.1%}", f"{r['lru+hot']:.1%}",
          f"{r['routed']:.1%}", f"{r['routed_copies']:.1f}", f"{r['fraction']:.1%}"] for r in replayed],
    )  # fmt: skip
    return replayed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", help="a GGUF with routed experts (default: the synthetic one, written if missing)"
    )
    ap.add_argument(
        "--synthetic",
        choices=[
            "flash-next",
            *synthetic_qwen3moe.MODELS,
            *synthetic_qwen35moe.MODELS,
            *synthetic_gptoss.MODELS,
        ],
        default="flash-next",
        help="the shapes of the synthetic model",
    )
    ap.add_argument("--layers", type=int, default=4, help="layers of the synthetic model")
    ap.add_argument(
        "--experts",
        choices=list(
            dict.fromkeys(
                [
                    *synthetic_qwen4exp.EXPERT_TYPES,
                    *synthetic_qwen35moe.EXPERT_TYPES,
                    *synthetic_gptoss.EXPERT_TYPES,
                ]
            )
        ),
        help="the synthetic model's routed experts (qwen35-*, qwen3-next-*: Q4_K, Q2_K, Q8_0, Q4_K_M; "
        "gpt-oss-*: MXFP4, the default; the others: Q4_K, the default, Q4_0, Q8_0, IQ2_XS)",
    )
    ap.add_argument("--ple", action="store_true", help="give the synthetic model a PLE layer")
    ap.add_argument("--data-dir", default="/work/bench_data", help="where the synthetic model is kept")
    ap.add_argument("--arena", default="0.125,0.25,0.5", help="arena sizes, fractions of the experts' bytes")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=32, help="decoded tokens per pass")
    ap.add_argument("--threads", type=int, default=2, help="compute threads (both engines)")
    ap.add_argument("--io-threads", type=int, default=4, help="threads of the parallel disk probe")
    ap.add_argument("--disk-seconds", type=float, default=3.0, help="seconds per disk probe")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp")
    ap.add_argument("--trace", help="a routing trace (.npz) to replay through the arena policy")
    ap.add_argument("--replay-only", action="store_true", help="only replay --trace (no model runs)")
    ap.add_argument("--pack", help="also stream from this packed directory of the model (regolith pack)")
    ap.add_argument("--moce", action="store_true", help="measure cache-aware routing against exact routing")
    ap.add_argument("--moce-bonus", type=float, default=2.0, help="MoCE logit bonus (default 2)")
    ap.add_argument("--moce-protect", type=int, default=2, help="MoCE top-r experts protected (default 2)")
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    fractions = [float(f) for f in args.arena.split(",")]
    if args.synthetic in synthetic_gptoss.MODELS:
        synthetic, types = synthetic_gptoss, synthetic_gptoss.EXPERT_TYPES
    elif args.synthetic in synthetic_qwen35moe.MODELS:  # Qwen3.5 MoE or Qwen3-Next
        synthetic, types = synthetic_qwen35moe, synthetic_qwen35moe.EXPERT_TYPES
    else:
        synthetic, types = synthetic_qwen3moe, synthetic_qwen4exp.EXPERT_TYPES
    args.experts = args.experts or next(iter(types))
    if not args.model and args.experts not in types:
        ap.error(f"--experts {args.experts}: --synthetic {args.synthetic} takes {', '.join(types)}")
    console = Console(width=160)
    if args.replay_only:
        if not args.trace:
            ap.error("--replay-only needs --trace")
        show_replay(console, args, fractions)
        return

    if args.model:
        path = args.model
    elif args.synthetic == "flash-next":
        name = f"synthetic-qwen4exp-{args.layers}L-{args.experts}{'-ple' if args.ple else ''}.gguf"
        path = os.path.join(args.data_dir, name)
        if not os.path.exists(path):
            console.print(f"writing {path} ...")
            synthetic_qwen4exp.write(path, args.layers, expert_type=args.experts, ple=args.ple)
    else:
        path = os.path.join(args.data_dir, f"synthetic-{args.synthetic}-{args.layers}L-{args.experts}.gguf")
        if not os.path.exists(path):
            console.print(f"writing {path} ...")
            synthetic.write(path, args.layers, model=args.synthetic, expert_type=args.experts)
    size = os.path.getsize(path)
    exp = expert_layout(path)
    fits = size + MIN_SPARE_RAM <= mem_available()
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 259, args.prompt)]
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    console.print(
        f"{path}: {size / GiB:.2f} GiB, routed experts {exp['total'] / GiB:.2f} GiB "
        f"({exp['n_layers']} layers x {exp['n_experts']} records of {exp['record'] / 2**20:.2f} MiB); "
        f"RAM {mem_total / GiB:.1f} GiB: the file {'fits' if fits else 'does not fit'}"
    )
    results: dict[str, Any] = {
        "model": path,
        "file_bytes": size,
        "expert_bytes": exp["total"],
        "record_bytes": exp["record"],
        "mem_total": mem_total,
        "fits_in_ram": fits,
        "prompt": args.prompt,
        "decode": args.decode,
        "threads": args.threads,
    }

    disk = disk_bandwidth(
        path, exp["record"], (exp["start"], exp["end"]), threads=args.io_threads, seconds=args.disk_seconds
    )
    peak = max(disk.values())
    results["disk_Bps"] = disk
    _show(console, args.markdown, f"O_DIRECT reads of {exp['record'] / 2**20:.2f} MiB records",
          ["pattern", "MB/s"], [[k, _mbs(v)] for k, v in disk.items()])  # fmt: skip

    runs: list[dict[str, Any]] = []

    def add(engine: str, setup: str, passes: list[dict[str, float]], **extra: Any) -> None:
        for label, r in zip(PASSES if len(passes) > 1 else ("",), passes, strict=False):
            runs.append({"engine": engine, "setup": setup, "pass": label, **r, **extra})
            console.print(f"  {engine} {setup}{f' ({label})' if label else ''}: {r['tok_s']:.2f} tok/s")

    if not args.no_llamacpp:
        # llama.cpp's OpenMP threads spin between ops; on a shared machine spinning threads collapse
        # (0.8 against 17 tok/s measured with 2 threads on 2 busy cores): wait passively unless told otherwise
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        results["llamacpp_omp_wait_policy"] = os.environ["OMP_WAIT_POLICY"]
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            console.print("llama.cpp (llama-cpp-python) is not installed: no llama.cpp rows")
        else:
            # (setup, mmap, repack, passes); repacking copies the experts into RAM: only when the file fits
            setups = [
                ("mmap --no-repack", True, False, 2),
                ("mmap", True, True, 1),
                ("--no-mmap", False, True, 1),
            ]
            for setup, mmap_, repack, n_passes in setups if fits else setups[:1]:
                drop_page_cache(path)
                add("llama.cpp", setup, llamacpp_decode(
                    path, prompt, args.decode, threads=args.threads, mmap=mmap_, repack=repack,
                    passes=n_passes,
                ))  # fmt: skip
    ref = {r["pass"]: r["tok_s"] for r in runs if r["setup"] == "mmap --no-repack"}

    _core.set_threads(args.threads)
    if fits:
        fill_page_cache(path)
        add("regolith", "mmap, file cached", regolith_mmap(path, prompt, args.decode))
    else:
        drop_page_cache(path)
        add("regolith", "mmap", regolith_mmap(path, prompt, args.decode, passes=2))
    sources = [("", path)] + ([("packed ", args.pack)] if args.pack else [])
    for label, source in sources:
        for frac in fractions:
            gb = frac * exp["total"] / GiB
            drop_page_cache(path)
            add("regolith", f"{label}arena {frac:.1%}", regolith_arena(source, gb, prompt, args.decode, passes=2),
                arena_gb=gb, fraction=frac)  # fmt: skip
    results["runs"] = runs

    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else ""

    rows = []
    for r in runs:
        peer = ref.get(r["pass"] or "warm") if r["engine"] == "regolith" else None
        rows.append([
            r["engine"], r["setup"], r["pass"], cell(r, "load_s", ".1f"), cell(r, "arena_gb", ".2f"),
            f"{r['tok_s']:.2f}", cell(r, "hit_rate", ".1%"),
            _mbs(r["read_Bps"]) if "read_Bps" in r else "",
            f"{r['read_Bps'] / peak:.0%}" if "read_Bps" in r else "",
            cell(r, "stall", ".0%"), f"{r['tok_s'] / peer:.2f}x" if peer else "",
        ])  # fmt: skip
    _show(
        console,
        args.markdown,
        f"decode: {args.prompt}-token prompt, then {args.decode} tokens per pass, {args.threads} threads; "
        f"page cache dropped before each load; disk {_mbs(peak)} MB/s (best O_DIRECT pattern)",
        ["engine", "setup", "pass", "load s", "arena GiB", "tok/s", "hit rate", "read MB/s", "% of disk",
         "read stall", "vs llama.cpp mmap --no-repack"],
        rows,
    )  # fmt: skip

    if args.moce:
        tokens = [int(t) for t in np.random.default_rng(1).integers(3, 259, 16 + args.decode)]
        rows, moce_rows = [], []
        for frac in fractions:
            r = moce_effect(
                path, frac * exp["total"] / GiB, tokens, bonus=args.moce_bonus, protect=args.moce_protect
            )
            moce_rows.append({"fraction": frac, **r})
            rows.append([
                f"{frac:.1%}", f"{r['hit_exact']:.1%}", f"{r['hit_moce']:.1%}", f"{r['tok_s_exact']:.2f}",
                f"{r['tok_s_moce']:.2f}", f"{r['kl_mean']:.4f}", f"{r['kl_max']:.4f}", f"{r['top1_agree']:.1%}",
            ])  # fmt: skip
        _show(
            console,
            args.markdown,
            f"MoCE (bonus {args.moce_bonus}, protect {args.moce_protect}) against exact routing, "
            f"{args.decode} teacher-forced tokens",
            [
                "arena",
                "hit exact",
                "hit MoCE",
                "tok/s exact",
                "tok/s MoCE",
                "KL mean",
                "KL max",
                "top-1 agree",
            ],
            rows,
        )
        results["moce"] = moce_rows

    if args.trace:
        results["trace"] = {"path": args.trace, "rows": show_replay(console, args, fractions)}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
