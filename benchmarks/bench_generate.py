"""Prompt processing and greedy generation speed on real models: regolith against llama.cpp.

Gemma 3 270M Q4_K_M (``--qwen`` adds Qwen2.5-Coder 0.5B Q4_K_M), the same GGUF in both engines, the same
threads. The prompt is the natural text of the llama.cpp parity fixtures (tests/fixtures/llamacpp), 512
tokens, evaluated at once with the logits of its last token only; then ``--decode`` tokens are generated
greedily, one evaluation per token. llama.cpp (llama-cpp-python) runs with its defaults (f16 KV cache, no
flash attention) and one batch for the prompt. Each figure is the best of ``--repeat`` runs on a fresh
context after a warm-up (the mapping faulted in), the two engines taking turns.

    python benchmarks/bench_generate.py [--qwen] [--prompt 512] [--decode 128] [--threads 2] [--markdown]
                                        [--baseline DIR]

``--baseline DIR`` adds another regolith build (installed in DIR with ``pip install --no-deps --target``), run
in its own process and taking turns with this one, and the ratio of this build to it.
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
from benchmarks.engines import Baseline, Regolith
from regolith import _core
from regolith.models import resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llamacpp"
MODELS = {"gemma3-270m": "dense-gemma3.json", "qwen2.5-coder-0.5b": "dense-qwen2.json"}


def prompt_ids(name: str, n: int) -> np.ndarray:
    ids = json.loads((FIXTURES / MODELS[name]).read_text())["text"]["ids"]
    return np.resize(np.array(ids, dtype=np.int32), n)


class LlamaCpp:
    """The same for llama.cpp (llama-cpp-python)."""

    def __init__(self, path: str, prompt: np.ndarray, n_decode: int, threads: int):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=path, n_ctx=len(prompt) + n_decode + 8, n_batch=len(prompt), n_ubatch=len(prompt),
            n_threads=threads, n_threads_batch=threads, verbose=False,
        )  # fmt: skip
        self.prompt, self.n_decode, self.vocab = prompt.tolist(), n_decode, self.llm.n_vocab()
        self.llm.eval(self.prompt)  # warm-up

    def last_logits(self) -> np.ndarray:
        logits = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self.vocab,))

    def run(self) -> tuple[float, float]:
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(self.prompt)
        tok = int(np.argmax(self.last_logits()))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(self.n_decode):
            self.llm.eval([tok])
            tok = int(np.argmax(self.last_logits()))
        return prefill, time.perf_counter() - t


def best_rates(engines: dict, repeat: int, n_prompt: int, n_decode: int) -> dict[str, tuple[float, float]]:
    """Best prefill and decode tokens/s of each engine; the engines take turns, so a busy spell on a shared
    machine slows every engine rather than one."""
    best = {name: (float("inf"), float("inf")) for name in engines}
    for _ in range(repeat):
        for name, engine in engines.items():
            pre, dec = engine.run()
            best[name] = (min(best[name][0], pre), min(best[name][1], dec))
    return {name: (n_prompt / pre, n_decode / dec) for name, (pre, dec) in best.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen", action="store_true", help="also Qwen2.5-Coder 0.5B")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--baseline", help="a directory holding another regolith build to compare with")
    args = ap.parse_args(argv)
    _core.set_threads(args.threads)
    names = ["gemma3-270m"] + (["qwen2.5-coder-0.5b"] if args.qwen else [])

    try:
        import llama_cpp  # noqa: F401

        have_peer = True
    except ImportError:
        have_peer = False
    rows = []
    for name in names:
        path = str(resolve_model(name))
        prompt = prompt_ids(name, args.prompt)
        engines = {"regolith": Regolith(path, prompt, args.decode)}
        if args.baseline:
            engines["baseline"] = Baseline(args.baseline, path, prompt, args.decode, _core.threads())
        if have_peer:
            engines["llama.cpp"] = LlamaCpp(path, prompt, args.decode, _core.threads())
        rows.append((name, best_rates(engines, args.repeat, args.prompt, args.decode)))
        for engine in engines.values():
            if hasattr(engine, "close"):
                engine.close()

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
        for peer in ("baseline", "llama.cpp"):
            if peer in rates:
                (p0, d0), (p1, d1) = rates["regolith"], rates[peer]
                lines.append([name, f"regolith / {peer}", f"{p0 / p1:.3f}x", f"{d0 / d1:.3f}x"])
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
    if not have_peer:
        console.print("llama.cpp (llama-cpp-python) is not installed: no peer rows")
    console.print(table)


if __name__ == "__main__":
    main()
