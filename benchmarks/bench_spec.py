"""Speculative decoding: decode speed with and without it, over workloads, on real and tiny models, with the
routed experts resident or streamed through a small arena.

Workloads: ``code-edit`` (a function followed by the instruction to repeat it with one change: long copies),
``code`` (a file of similar functions continued), ``prose`` (free text, sampled at T = 0.8 with a fixed
seed) and ``chat`` (a question through the chat template, sampled). Sampling is seeded, and speculation never
changes the output, so all modes generate the same tokens (asserted) and the comparison is like for like.
End-of-generation tokens are banned (a ``-inf`` logit bias, as llama-bench ignores EOS), so every run decodes
exactly ``--tokens`` tokens: a tiny random model otherwise stops after 2 tokens and its speed is noise.

Modes: ``plain`` (``speculative=False``), ``gated`` (the default: suffix and MTP drafters behind the cost
gate) and ``forced`` (always draft up to 7, no gate: what the gate protects against). After one warm-up run
per mode (which also teaches the gate) each cell runs ``--repeat`` times, the modes taking turns (in
reverse order every other repeat, so neither always runs first).
``gated x best`` is plain's fastest decode over gated's fastest (the runs least disturbed by other work on
the machine); ``median (min-max)`` is the median over repeats of plain over gated decode seconds in the same
repeat, with the lowest and highest such ratio as its spread; ``cpu x`` is the median ratio of process CPU
seconds (other tenants of a shared machine slow the wall clock more than the CPU time).

Models: names or paths ``regolith.Model.load`` takes, and ``tiny-qwen4exp`` (a random qwen4exp with an MTP
head, tests/qwen4exp_models.py) and ``flash-next-synthetic`` (Qwen3.8-Flash-Next's layer shapes, 2 layers,
IQ2_XS experts: benchmarks/synthetic_qwen4exp.py, ~1 GB written to a temporary directory). ``--streamed``
adds, for regolith-demo, the synthetic model and those given ``--arena-mib MODEL=MIB``, rows with the routed
experts streamed through an arena of that size (default: 4 MiB for regolith-demo, 15% of its experts; 64 MiB,
~7%, for the synthetic model).

    python benchmarks/bench_spec.py [--models gemma3-270m qwen2.5-coder-0.5b tiny-qwen4exp] [--tokens 128]
        [--repeat 5] [--no-forced] [--streamed] [--arena-mib MODEL=MIB] [--load KEY=VALUE] [--markdown]

``--load KEY=VALUE`` (repeatable) passes extra keyword arguments to ``regolith.Model.load`` (values are Python
literals).
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
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


def flash_next_synthetic(directory: Path) -> str:
    """Flash-Next's layer shapes (512 experts of 512, top-10), 2 layers, IQ2_XS experts, random weights."""
    sys.path.insert(0, os.path.dirname(__file__))
    import synthetic_qwen4exp

    path = directory / "flash-next-synthetic.gguf"
    synthetic_qwen4exp.write(path, 2, expert_type="IQ2_XS")
    return str(path)


MADE = {"tiny-qwen4exp": tiny_qwen4exp, "flash-next-synthetic": flash_next_synthetic}
STREAMED_MIB = {"regolith-demo": 4, "flash-next-synthetic": 64}  # default arenas of --streamed


def run(model: regolith.Model, workload: str, mode: str, n: int) -> tuple[regolith.Generation, float]:
    """One generation of exactly n tokens (end-of-generation tokens banned); returns it and its CPU seconds."""
    text, sampling = WORKLOADS[workload]
    spec = MODES[mode]
    bias = {t: float("-inf") for t in model.tokenizer.eog_ids}
    c0 = time.process_time()
    if text is None:
        g = model.chat(CHAT, n, stream=True, speculative=spec, logit_bias=bias, **sampling)
    else:
        g = model.generate(text, n, stream=True, speculative=spec, logit_bias=bias, **sampling)
    for _ in g:
        pass
    return g, time.process_time() - c0


def bench(
    model: regolith.Model, workload: str, n: int, repeat: int, modes: Sequence[str] = tuple(MODES)
) -> dict[str, dict[str, float]]:
    """Per mode: median tok/s, the ratio of plain's fastest decode to the mode's fastest, the median / lowest /
    highest ratio of decode seconds to plain's in the same repeat, the median CPU-seconds ratio, and the last
    run's acceptance and tokens per round."""
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    last: dict[str, regolith.Generation] = {}
    reference = None
    for mode in modes:
        g, _c = run(model, workload, mode, n)  # warm-up; the gate learns the costs
        reference = reference or g.tokens
    for i in range(repeat):
        for mode in modes if i % 2 == 0 else modes[::-1]:  # taking turns in both orders
            g, c = run(model, workload, mode, n)
            assert g.tokens == reference, f"{mode} changed the output"
            last[mode] = g
            seconds[mode].append(g.stats.decode_seconds)
            cpu[mode].append(c)
    out = {}
    for mode in modes:
        ratios = [p / s for p, s in zip(seconds["plain"], seconds[mode], strict=True)]
        st = last[mode].stats
        out[mode] = {
            "tps": n / statistics.median(seconds[mode]),
            "best_x": min(seconds["plain"]) / min(seconds[mode]),
            "x": statistics.median(ratios),
            "lo": min(ratios),
            "hi": max(ratios),
            "cpu_x": statistics.median(p / s for p, s in zip(cpu["plain"], cpu[mode], strict=True)),
            "acceptance": st.acceptance_rate,
            "per_round": st.tokens_per_round,
        }
    return out


COLUMNS = (
    "model",
    "experts",
    "workload",
    "plain tok/s",
    "gated tok/s",
    "gated x best",
    "gated x median (min-max)",
    "gated cpu x",
    "forced x",
    "accept (forced)",
    "tok/round gated",
    "tok/round forced",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "qwen2.5-coder-0.5b", "tiny-qwen4exp"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-forced", action="store_true", help="plain and gated only (half the time)")
    ap.add_argument("--streamed", action="store_true", help="also stream the routed experts (MoE models)")
    ap.add_argument("--resident", action=argparse.BooleanOptionalAction, default=True, help="resident rows")
    ap.add_argument("--arena-mib", action="append", default=[], metavar="MODEL=MIB", help="--streamed arena")
    ap.add_argument("--load", action="append", default=[], metavar="KEY=VALUE", help="Model.load keyword")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    load_kw = {}
    for item in args.load:
        key, _, value = item.partition("=")
        load_kw[key] = ast.literal_eval(value)
    arenas = dict(STREAMED_MIB)
    for item in args.arena_mib:
        key, _, value = item.partition("=")
        arenas[key] = float(value)

    console = Console()
    table = Table(
        title=f"speculative decoding, {args.tokens} tokens, threads {os.environ.get('REGOLITH_THREADS', 'all')}, "
        f"median of {args.repeat}"
    )
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("model", "experts", "workload") else "right")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = MADE[name](Path(tmp)) if name in MADE else str(resolve_model(name))
            setups = [("resident", {})] if args.resident else []
            if args.streamed and name in arenas:
                setups.append((f"arena {arenas[name]:g} MiB", {"arena_gb": arenas[name] / 1024}))
            for label, extra in setups:
                model = regolith.Model.load(path, n_ctx=2048, **{**load_kw, **extra})
                for workload in args.workloads:
                    t0 = time.perf_counter()
                    modes = ("plain", "gated") if args.no_forced else tuple(MODES)
                    r = bench(model, workload, args.tokens, args.repeat, modes)
                    g, f = r["gated"], r.get("forced")
                    row = [
                        name,
                        label,
                        workload,
                        f"{r['plain']['tps']:.1f}",
                        f"{g['tps']:.1f}",
                        f"{g['best_x']:.2f}",
                        f"{g['x']:.2f} ({g['lo']:.2f}-{g['hi']:.2f})",
                        f"{g['cpu_x']:.2f}",
                        f"{f['x']:.2f}" if f else "-",
                        f"{f['acceptance']:.2f}" if f else "-",
                        f"{g['per_round']:.2f}",
                        f"{f['per_round']:.2f}" if f else "-",
                    ]
                    rows.append(row)
                    table.add_row(*row)
                    console.print(f"[dim]{name} {label} {workload}: {time.perf_counter() - t0:.0f} s[/dim]")
    console.print(table)
    if args.markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
