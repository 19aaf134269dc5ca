"""Prompt processing and greedy generation speed on real models: regolith against llama.cpp.

Gemma 3 270M Q4_K_M (``--qwen`` adds Qwen2.5-Coder 0.5B Q4_K_M), the same GGUF in both engines, the same
threads. The prompt is the natural text of the llama.cpp parity fixtures (tests/fixtures/llamacpp), 512
tokens, evaluated at once with the logits of its last token only; then ``--decode`` tokens are generated
greedily, one evaluation per token. llama.cpp (llama-cpp-python) runs with its defaults (f16 KV cache, no
flash attention) and one batch for the prompt. Each figure is the best of ``--repeat`` runs on a fresh
context after a warm-up (the mapping faulted in).

    python benchmarks/bench_generate.py [--qwen] [--prompt 512] [--decode 128] [--threads 2] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from regolith import _core
from regolith.models import resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llamacpp"
MODELS = {"gemma3-270m": "dense-gemma3.json", "qwen2.5-coder-0.5b": "dense-qwen2.json"}


def prompt_ids(name: str, n: int) -> np.ndarray:
    ids = json.loads((FIXTURES / MODELS[name]).read_text())["text"]["ids"]
    return np.resize(np.array(ids, dtype=np.int32), n)


def time_regolith(path: str, prompt: np.ndarray, n_decode: int, repeat: int) -> tuple[float, float]:
    """(best prefill seconds, best decode seconds)."""
    model = regolith.Model.load(path)
    model.window(len(prompt) + 8).eval(prompt, all_logits=False)  # warm-up
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        window = model.window(len(prompt) + n_decode + 8)
        t = time.perf_counter()
        tok = int(np.argmax(window.eval(prompt, all_logits=False)[0]))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n_decode):
            tok = int(np.argmax(window.eval([tok], all_logits=False)[0]))
        best = (min(best[0], prefill), min(best[1], time.perf_counter() - t))
    return best


def time_llamacpp(path: str, prompt: np.ndarray, n_decode: int, repeat: int, threads: int):
    """The same for llama.cpp, or None when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=len(prompt) + n_decode + 8, n_batch=len(prompt), n_ubatch=len(prompt),
        n_threads=threads, n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    vocab = llm.n_vocab()

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))

    llm.eval(prompt.tolist())  # warm-up
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt.tolist())
        tok = int(np.argmax(last_logits()))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([tok])
            tok = int(np.argmax(last_logits()))
        best = (min(best[0], prefill), min(best[1], time.perf_counter() - t))
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen", action="store_true", help="also Qwen2.5-Coder 0.5B")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args(argv)
    _core.set_threads(args.threads)
    names = ["gemma3-270m"] + (["qwen2.5-coder-0.5b"] if args.qwen else [])

    rows = []
    for name in names:
        path = str(resolve_model(name))
        prompt = prompt_ids(name, args.prompt)
        ours = time_regolith(path, prompt, args.decode, args.repeat)
        peer = time_llamacpp(path, prompt, args.decode, args.repeat, _core.threads())
        rates = {
            "regolith": (args.prompt / ours[0], args.decode / ours[1]),
            **({"llama.cpp": (args.prompt / peer[0], args.decode / peer[1])} if peer else {}),
        }
        rows.append((name, rates))

    head = [
        "model",
        "engine",
        f"prefill tok/s ({args.prompt} tokens)",
        f"decode tok/s ({args.decode} tokens)",
    ]
    lines = []
    for name, rates in rows:
        for engine, (pre, dec) in rates.items():
            lines.append([name, engine, f"{pre:.1f}", f"{dec:.2f}"])
        if "llama.cpp" in rates:
            (p0, d0), (p1, d1) = rates["regolith"], rates["llama.cpp"]
            lines.append([name, "ratio", f"{p0 / p1:.2f}x", f"{d0 / d1:.2f}x"])
    title = f"greedy generation, {_core.threads()} threads, kernels: {_core.isa()}"
    if args.markdown:
        print(f"{title}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    table = Table(title=title)
    for col in head:
        table.add_column(col, justify="left" if col in ("model", "engine") else "right")
    for line in lines:
        table.add_row(*line)
    console = Console()
    if not all("llama.cpp" in rates for _, rates in rows):
        console.print("llama.cpp (llama-cpp-python) is not installed: no peer rows")
    console.print(table)


if __name__ == "__main__":
    main()
