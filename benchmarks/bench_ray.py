"""regolith on Ray Serve (`regolith serve --ray`, docs/scaling.md) on this machine, against one `regolith serve`.

Two tables, every server started as its own `regolith serve` process (the Ray rows start a local Ray cluster):

- Throughput: ``--clients`` concurrent clients (the openai SDK, streaming completions, greedy, ``--requests``
  each) against one `regolith serve` (``--parallel`` = clients, as many threads as the machine has CPUs) and
  against Ray Serve with 1 and with 2 replicas of half the CPUs each (as many threads; a replica given every
  CPU starves Ray's own processes, which carry each streamed chunk, of the cores its threads spin on). Aggregate generated tokens per second, p50 / p95 time to first token, and the ratio to the one
  server measured in the same run.
- Prefix affinity: ``--conversations`` clients each hold a multi-turn chat (a system prompt of its own, then
  ``--turns`` user turns, each request the whole conversation so far) against 2 replicas with a prompt cache
  each, routed by prefix and by load alone (``--no-affinity``), and against 1 replica (which holds every
  conversation: the most routing can reach). The prompt tokens the replicas reused
  (``usage.prompt_tokens_details.cached_tokens``) over all prompt tokens, and the mean reply latency.

    python benchmarks/bench_ray.py [MODEL] [--arena-gb 0.004] [--clients 4] [--requests 4] [--max-tokens 32]
        [--conversations 4] [--turns 4]

Needs ``pip install "regolith[ray]"``. MODEL defaults to the bundled demo model, streamed through a
``--arena-gb`` arena (0: resident).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import openai
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.bench_serve import PROMPTS, _free_port, _percentile, _started, run_clients

CPUS = os.cpu_count() or 1


def _server(model: str | None, extra: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from regolith.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["serve", *([model] if model else []), "--port", str(port), "--model-name", "m", "--spec", "off"]
    cmd += ["--ctx", "2048", "--log-level", "warning", *extra]
    env = {**os.environ, "REGOLITH_THREADS": str(threads), "RAY_USAGE_STATS_ENABLED": "0"}
    return _started(
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env), port
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def throughput(url: str, clients: int, requests: int, max_tokens: int) -> dict[str, float]:
    """Aggregate generated tokens/s and time to first token of ``clients`` streaming clients."""
    tokens = [0] * clients
    ttft: list[float] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        for r in range(requests):
            t0 = time.perf_counter()
            first = None
            stream = c.completions.create(
                model="m",
                prompt=PROMPTS[(i * requests + r) % len(PROMPTS)] + " " * i,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - t0
                if chunk.usage is not None:
                    tokens[i] += chunk.usage.completion_tokens
            with lock:
                ttft.append(first or 0.0)

    wall = run_clients(client, clients)
    return {"tok_s": sum(tokens) / wall, "ttft50": _percentile(ttft, 50), "ttft95": _percentile(ttft, 95)}


def conversations(url: str, n: int, turns: int, max_tokens: int) -> dict[str, float]:
    """``n`` concurrent multi-turn chats: the share of prompt tokens reused and the mean reply latency."""
    prompt_tokens = [0] * n
    cached = [0] * n
    latency: list[float] = []
    lock = threading.Lock()

    def chat(i: int) -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        system = f"You are reviewer {i}. " + "Read the code, name one problem and one fix, in one line. " * 8
        messages = [{"role": "system", "content": system}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"Review this:\n{PROMPTS[(i + t) % len(PROMPTS)]}"})
            t0 = time.perf_counter()
            reply = c.chat.completions.create(
                model="m", messages=messages, max_tokens=max_tokens, temperature=0
            )
            with lock:
                latency.append(time.perf_counter() - t0)
            prompt_tokens[i] += reply.usage.prompt_tokens
            cached[i] += reply.usage.prompt_tokens_details.cached_tokens
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})

    run_clients(chat, n)
    return {"reused": sum(cached) / sum(prompt_tokens), "latency": statistics.mean(latency)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="model (default: the bundled demo)")
    ap.add_argument("--arena-gb", type=float, default=0.004, help="expert arena (default 0.004; 0: resident)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args()
    console = Console()
    memory = ["--arena-gb", str(args.arena_gb)] if args.arena_gb else []
    per_replica = max(1, CPUS // 2)

    rows = []
    configs = [  # (server, replicas x threads, arguments, threads of `regolith serve` itself)
        ("regolith serve", f"1 x {CPUS}", [*memory, "--parallel", str(args.clients)], CPUS),
        ("Ray Serve", f"1 x {per_replica}", [*memory, "--ray", "--replica-cpus", str(per_replica)], 1),
        (
            "Ray Serve",
            f"2 x {per_replica}",
            [*memory, "--ray", "--replicas", "2", "--replica-cpus", str(per_replica)],
            1,
        ),
    ]
    for name, layout, extra, threads in configs:  # (--replica-cpus sets a replica's threads)
        proc, url = _server(args.model, extra, threads)
        try:
            rows.append((name, layout, throughput(url, args.clients, args.requests, args.max_tokens)))
        finally:
            _stop(proc)
        console.print(f"{name} {layout}: {rows[-1][2]['tok_s']:.1f} tok/s")
    base = rows[0][2]["tok_s"]
    table = Table(
        title=f"throughput: {args.clients} clients x {args.requests} requests of {args.max_tokens} tokens, "
        f"{CPUS} CPUs"
    )
    for col in ("server", "replicas x threads", "tok/s", "vs regolith serve", "TTFT p50 ms", "TTFT p95 ms"):
        table.add_column(col, justify="left" if col == "server" else "right")
    for name, layout, r in rows:
        table.add_row(
            name,
            layout,
            f"{r['tok_s']:.1f}",
            f"{r['tok_s'] / base:.2f}x",
            f"{r['ttft50'] * 1e3:.0f}",
            f"{r['ttft95'] * 1e3:.0f}",
        )
    console.print(table)

    table = Table(
        title=f"prefix affinity: {args.conversations} chats x {args.turns} turns, a prompt cache per replica"
    )
    for col in ("replicas and routing", "prompt tokens reused", "mean latency ms"):
        table.add_column(col, justify="left" if col == "replicas and routing" else "right")
    cases = [  # one replica holds every conversation: what routing can reach at most
        ("2 replicas, by prefix", ["--replicas", "2"]),
        ("2 replicas, by load alone", ["--replicas", "2", "--no-affinity"]),
        ("1 replica (the ceiling)", []),
    ]
    for name, flag in cases:
        with tempfile.TemporaryDirectory() as cache:
            extra = [*memory, "--ray", "--replica-cpus", str(per_replica), "--cache-dir", cache]
            proc, url = _server(args.model, extra + flag, 1)
            try:
                r = conversations(url, args.conversations, args.turns, args.max_tokens)
            finally:
                _stop(proc)
        table.add_row(name, f"{r['reused']:.1%}", f"{r['latency'] * 1e3:.0f}")
    console.print(table)


if __name__ == "__main__":
    main()
