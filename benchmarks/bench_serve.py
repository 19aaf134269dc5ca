"""The server under load: N concurrent clients (the openai SDK, streaming completions) against `regolith serve`
with --parallel N, for N = 1, 2, 4, 8.

Per N: aggregate generated tokens per second (all clients' tokens over the wall time of the round), p50 / p95
time to first token and inter-token latency (between streamed chunks, per token), and for a model streaming its
experts the expert bytes read from disk per generated token (from /metrics). Every client sends `--requests`
requests, one after another, each a different prompt, greedy, after an untimed warm-up request each (all N
at once: a fresh server's first request pays one-off set-up, 0.06-0.12 s on the demo model). Each round
starts `regolith serve --parallel N` in a process of its own (the clients' threads then share no interpreter
with it).

    python benchmarks/bench_serve.py                           # the demo model through a 4 MiB arena
    python benchmarks/bench_serve.py qwen2.5-coder-0.5b        # resident (a dense model)
    python benchmarks/bench_serve.py qwen2.5-coder-0.5b --llama-server PATH   # and llama-server beside it

``--llama-server`` runs the same rounds against llama.cpp's server on the same GGUF after regolith's
(``--parallel N``, a 512-token context per slot, as many threads as ``REGOLITH_THREADS`` or the CPUs).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import openai

PROMPTS = [
    "def read_config(path):",
    "class Stack:",
    "import os\n\ndef walk(root):",
    "def parse_args(argv):",
    "class LRUCache:",
    "def merge_sorted(a, b):",
    "import json\n\ndef load(path):",
    "def fibonacci(n):",
]


def _percentile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else (xs[0] if xs else 0.0)


def _metric(url: str, name: str) -> float:
    r = httpx.get(url + "/metrics")
    m = re.search(rf"^regolith_{name} (\S+)$", r.text, re.MULTILINE) if r.status_code == 200 else None
    return float(m.group(1)) if m else 0.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _started(proc: subprocess.Popen, port: int) -> tuple[subprocess.Popen, str]:
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


def _serve(
    model: str | None, n: int, arena_gb: float, spec: bool, backend: str | None, log: str | None
) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from regolith.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["serve", *([model] if model else []), "--port", str(port), "--parallel", str(n), "--ctx", "512"]
    cmd += ["--model-name", "m", "--log-level", "warning"] + (
        ["--arena-gb", str(arena_gb)] if arena_gb else []
    )
    cmd += ([] if spec else ["--spec", "off"]) + (["--backend", backend] if backend else [])
    err = open(log, "a") if log else subprocess.DEVNULL  # noqa: SIM115 (the child holds it)
    try:
        return _started(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err), port)
    finally:
        if log:
            err.close()


def _llama_serve(binary: str, model: str | None, n: int) -> tuple[subprocess.Popen, str]:
    from regolith.models import resolve_model

    port = _free_port()
    threads = os.environ.get("REGOLITH_THREADS") or str(os.cpu_count() or 1)
    cmd = [binary, "-m", str(resolve_model(model)), "--port", str(port), "--parallel", str(n)]
    cmd += ["--ctx-size", str(512 * n), "--threads", threads, "--alias", "m"]
    return _started(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)


def run_clients(client, n: int) -> float:
    """Runs ``client(i)`` for i < n, each in a thread of its own, all at once; the wall seconds until the last
    ends."""
    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def run_round(
    model: str | None,
    arena_gb: float,
    n: int,
    requests: int,
    max_tokens: int,
    spec: bool = True,
    llama_server: str | None = None,
    backend: str | None = None,
    log: str | None = None,
) -> dict[str, float]:
    proc, url = (
        _llama_serve(llama_server, model, n)
        if llama_server
        else _serve(model, n, arena_gb, spec, backend, log)
    )
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0] * n
    lock = threading.Lock()

    def warm(i: int) -> None:  # untimed: the first request of a fresh server pays one-off set-up
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        c.completions.create(model="m", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8, temperature=0)

    def client(i: int) -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        for r in range(requests):
            prompt = PROMPTS[(i * requests + r) % len(PROMPTS)] + "  " * (i % 3)
            t0 = last = time.perf_counter()
            first = None
            stream = c.completions.create(
                model="m",
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            gaps = []
            pieces, used = 0, None
            for chunk in stream:
                now = time.perf_counter()
                if chunk.choices and chunk.choices[0].text:
                    pieces += 1
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                if chunk.usage is not None:
                    used = chunk.usage.completion_tokens
            tokens[i] += used if used is not None else pieces  # a server that sends no usage: a token a chunk
            with lock:
                if first is not None:
                    ttft.append(first)
                itl.extend(gaps)

    try:
        run_clients(warm, n)
        read0 = _metric(url, "expert_bytes_read_total")
        wall = run_clients(client, n)
        read = _metric(url, "expert_bytes_read_total") - read0
    finally:
        proc.terminate()
        proc.wait(30)
    total = sum(tokens)
    return {
        "tok_s": total / wall,
        "ttft50": _percentile(ttft, 50),
        "ttft95": _percentile(ttft, 95),
        "itl50": _percentile(itl, 50),
        "itl95": _percentile(itl, 95),
        "gaps": len(itl),
        "bytes_per_token": read / max(total, 1),
        "tokens": total,
    }


def step_rounds(
    model: str | None, arena_gb: float, clients: list[int], backend: str | None, steps: int
) -> None:
    """The server's ceiling: the bare step of N windows each decoding one token (:func:`regolith.eval_windows`,
    no sampling, detokenizing or HTTP), ``steps`` steps after a short prompt, per N."""
    import numpy as np

    import regolith

    m = regolith.Model.load(
        model, arena_gb=arena_gb or None, backend=backend, n_ctx=512, windows=max(clients)
    )
    print(
        f"\nbare steps on {backend or os.environ.get('REGOLITH_BACKEND') or 'cpu'} ({steps} steps of one token a window)"
    )
    print("| windows | ms a step | tokens/s | vs 1 window |")
    print("|---|---|---|---|")
    base = None
    for n in clients:
        wins = [m.window() for _ in range(n)]
        last = []
        for i, w in enumerate(wins):
            logits = w.eval(m.tokenize(PROMPTS[i % len(PROMPTS)]))
            last.append(int(np.argmax(logits[-1])))
        for _ in range(2):  # warm-up (graphs captured, arena filled)
            out = regolith.eval_windows(wins, [[t] for t in last], [False] * n)
            last = [int(np.argmax(o[-1])) for o in out]
        t = time.perf_counter()
        for _ in range(steps):
            out = regolith.eval_windows(wins, [[t] for t in last], [False] * n)
            last = [int(np.argmax(o[-1])) for o in out]
        ms = 1e3 * (time.perf_counter() - t) / steps
        tok_s = n * 1e3 / ms
        base = base or tok_s
        print(f"| {n} | {ms:.2f} | {tok_s:.1f} | {tok_s / base:.2f}x |", flush=True)
        del wins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="model (default: the bundled demo)")
    ap.add_argument(
        "--arena-gb",
        type=float,
        help="stream a MoE model's experts through this arena (default: 0.004 for the demo)",
    )
    ap.add_argument("--clients", default="1,2,4,8", help="client counts (default 1,2,4,8)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client (default 2)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per reply (default 32)")
    ap.add_argument(
        "--no-spec",
        action="store_true",
        help="--spec off at every N (isolates batching; above --parallel 1 only the suffix drafter drafts)",
    )
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: its rounds on the same GGUF too")
    ap.add_argument("--backend", help="regolith serve --backend (default: $REGOLITH_BACKEND or cpu)")
    ap.add_argument(
        "--server-log", help="append each regolith server's stderr to this file (default: discarded)"
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=0,
        help="also time this many bare steps of N windows (eval_windows, in this process) after the rounds",
    )
    args = ap.parse_args()
    arena = args.arena_gb if args.arena_gb is not None else (0.004 if args.model is None else 0.0)
    where = f"experts through a {arena:g} GB arena" if arena else "resident"
    backend = args.backend or os.environ.get("REGOLITH_BACKEND") or "cpu"
    print(
        f"{args.model or 'regolith-demo'} ({where}, {backend}), {args.requests} requests x {args.max_tokens} "
        "tokens per client"
    )
    print("| clients | tok/s | TTFT p50 / p95 (s) | ITL p50 / p95 (ms) | expert bytes / token |")
    print("|---|---|---|---|---|")
    engines = [("regolith", None)] + ([("llama-server", args.llama_server)] if args.llama_server else [])
    for engine, binary in engines:
        for n in (int(x) for x in args.clients.split(",")):
            r = run_round(
                args.model,
                arena,
                n,
                args.requests,
                args.max_tokens,
                not args.no_spec,
                binary,
                args.backend,
                args.server_log,
            )
            per = f"{r['bytes_per_token'] / 2**10:.0f} KiB" if r["bytes_per_token"] else "-"
            label = f"{n}" if binary is None else f"{n}, {engine}"
            # No gaps: every reply's text came in one chunk (a tokenizer whose pieces are not text alone).
            itl = f"{1e3 * r['itl50']:.0f} / {1e3 * r['itl95']:.0f}" if r["gaps"] else "-"
            print(
                f"| {label} | {r['tok_s']:.1f} | {r['ttft50']:.2f} / {r['ttft95']:.2f} | {itl} | {per} |",
                flush=True,
            )
    if args.steps:
        step_rounds(args.model, arena, [int(x) for x in args.clients.split(",")], args.backend, args.steps)


if __name__ == "__main__":
    main()
