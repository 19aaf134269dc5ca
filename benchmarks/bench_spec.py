"""Speculative decoding: decode speed with and without it, over workloads, on real and tiny models.

Workloads: ``code-edit`` (a function followed by the instruction to repeat it with one change: long copies),
``code`` (a file of similar functions continued), ``prose`` (free text, sampled at T = 0.8 with a fixed
seed) and ``chat`` (a question through the chat template, sampled). Sampling is seeded, and speculation never
changes the output, so both modes generate the same tokens and the comparison is like for like.

Modes: ``plain`` (``speculative=False``), ``gated`` (the default: suffix and MTP drafters behind the cost
gate) and ``forced`` (always draft up to 7, no gate: what the gate protects against). Each figure is the best
of ``--repeat`` runs, the modes taking turns, after one warm-up run per mode (which also teaches the gate).

    python benchmarks/bench_spec.py [--models gemma3-270m qwen2.5-coder-0.5b tiny-qwen4exp] [--tokens 128]
        [--repeat 3] [--load arena_gb=8] [--markdown]

``--load KEY=VALUE`` (repeatable) passes extra keyword arguments to ``regolith.Model.load`` (values are Python
literals), e.g. an SSD arena size.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith
from regolith.models import resolve_model
from regolith.speculative import Speculation

FUNCTION = '''def parse_config(path, defaults=None):
    """Read a key = value file into a dict, with defaults for missing keys."""
    result = dict(defaults or {})
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}:{number}: expected key = value")
            key, value = (part.strip() for part in line.split("=", 1))
            result[key] = value
    return result
'''

WORKLOADS = {
    "code-edit": (
        FUNCTION
        + "\n\n# The same function, renamed to load_config (nothing else changes):\n\ndef load_config(",
        {"temperature": 0.0},
    ),
    "code": (
        (
            "class Vector:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
            "    def __add__(self, other):\n        return Vector(self.x + other.x, self.y + other.y)\n\n"
            "    def __sub__(self, other):\n        return Vector(self.x - other.x, self.y - other.y)\n\n"
            "    def __mul__(self, k):\n"
        ),
        {"temperature": 0.0},
    ),
    "prose": (
        "The old lighthouse keeper looked out over the grey sea. For forty years he had climbed the stairs",
        {"temperature": 0.8, "seed": 7},
    ),
    "chat": (None, {"temperature": 0.8, "seed": 11}),
}
CHAT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
MODES = {"plain": False, "gated": True, "forced": Speculation(gate=False)}


def tiny_qwen4exp(directory: Path) -> str:
    """A tiny random qwen4_exp with an MTP head (tests/qwen4exp_models.py), converted to f32."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model, save_tiny_mtp, tiny_model, tiny_mtp_weights

    overrides = {"indexer_n_heads": 8, "output_gate_type": "sigmoid", "max_position_embeddings": 2048}
    weights = tiny_mtp_weights(tiny_model(1, **overrides).config, seed=2)
    save_tiny_mtp(save_tiny_model(directory / "hf", 1, **overrides), weights)
    return str(convert(directory / "hf", directory / "tiny-qwen4exp.gguf", "f32"))


def run(model: regolith.Model, workload: str, mode: str, n: int) -> regolith.Generation:
    text, sampling = WORKLOADS[workload]
    spec = MODES[mode]
    if text is None:
        g = model.chat(CHAT, n, stream=True, speculative=spec, **sampling)
    else:
        g = model.generate(text, n, stream=True, speculative=spec, **sampling)
    for _ in g:
        pass
    return g


def bench(model: regolith.Model, workload: str, n: int, repeat: int) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    tokens: dict[str, list[int]] = {}
    for mode in MODES:
        run(model, workload, mode, n)  # warm-up; the gate learns the costs
    for _ in range(repeat):
        for mode in MODES:
            g = run(model, workload, mode, n)
            st = g.stats
            tokens.setdefault(mode, g.tokens)
            assert g.tokens == tokens["plain" if "plain" in tokens else mode], f"{mode} changed the output"
            row = {
                "tps": st.decode_tokens_per_second,
                "tokens": st.generated_tokens,
                "acceptance": st.acceptance_rate,
                "per_round": st.tokens_per_round,
                "drafted": st.drafted_tokens,
            }
            if mode not in best or row["tps"] > best[mode]["tps"]:
                best[mode] = row
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "qwen2.5-coder-0.5b", "tiny-qwen4exp"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--load", action="append", default=[], metavar="KEY=VALUE", help="Model.load keyword")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    load_kw = {}
    for item in args.load:
        key, _, value = item.partition("=")
        load_kw[key] = ast.literal_eval(value)

    console = Console()
    table = Table(
        title=f"speculative decoding, {args.tokens} tokens, threads {os.environ.get('REGOLITH_THREADS', 'all')}"
    )
    for col in (
        "model",
        "workload",
        "plain tok/s",
        "gated tok/s",
        "gated x",
        "forced tok/s",
        "forced x",
        "accept (forced)",
        "tok/round gated",
        "tok/round forced",
    ):
        table.add_column(col, justify="left" if col in ("model", "workload") else "right")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = tiny_qwen4exp(Path(tmp)) if name == "tiny-qwen4exp" else str(resolve_model(name))
            model = regolith.Model.load(path, n_ctx=2048, **load_kw)
            for workload in args.workloads:
                t0 = time.perf_counter()
                r = bench(model, workload, args.tokens, args.repeat)
                plain = r["plain"]["tps"]
                row = [
                    name,
                    workload,
                    f"{plain:.1f}",
                    f"{r['gated']['tps']:.1f}",
                    f"{r['gated']['tps'] / plain:.2f}",
                    f"{r['forced']['tps']:.1f}",
                    f"{r['forced']['tps'] / plain:.2f}",
                    f"{r['forced']['acceptance']:.2f}",
                    f"{r['gated']['per_round']:.2f}",
                    f"{r['forced']['per_round']:.2f}",
                ]
                rows.append(row)
                table.add_row(*row)
                console.print(f"[dim]{name} {workload}: {time.perf_counter() - t0:.0f} s[/dim]")
    console.print(table)
    if args.markdown:
        print("| " + " | ".join(c.header for c in table.columns) + " |")
        print("|" + "---|" * len(table.columns))
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
