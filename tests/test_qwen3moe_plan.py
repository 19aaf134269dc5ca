"""`regolith inspect --plan` on full-size synthetic Qwen3-30B-A3B and Qwen3-235B-A22B GGUFs (qwen3moe, as
Q4_K_M files hold them: Q4_K experts with Q6_K down projections, Q6_K output, F32 norms and routers;
benchmarks/synthetic_qwen3moe.py). The files are sparse (headers only: 18 and 142 GB apparent, a few MB on
disk). The plan's sizes are checked against the tensor infos as the gguf package reads them, and the table
against a 24 GB machine's cap."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

import regolith
from regolith import memory_plan, model_sizes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synthetic_qwen3moe as synthetic

CAP_GB = 18.8  # the seed's plan cap on a 24 GB machine
MODELS = synthetic.MODELS


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, list]]:
    d = tmp_path_factory.mktemp("qwen3moe-full")
    return {
        name: (d / f"{name}-Q4_K_M.gguf", synthetic.write_headers(d / f"{name}-Q4_K_M.gguf", name))
        for name in MODELS
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_plan_sizes_match_the_files_tensor_infos(models, name):
    path, specs = models[name]
    assert path.stat().st_blocks * 512 < 50 * 10**6  # sparse
    reader = gguf.GGUFReader(str(path))
    nbytes = {t.name: int(t.n_bytes) for t in reader.tensors}
    assert nbytes == {s.name: s.nbytes for s in specs}
    with regolith.gguf.open(path) as f:
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None, "f16")
    experts = sum(n for k, n in nbytes.items() if k.endswith("_exps.weight"))
    assert sizes.expert_bytes == experts and sizes.dense_bytes == sum(nbytes.values()) - experts
    cfg = MODELS[name]
    E, L = cfg["num_experts"], cfg["num_hidden_layers"]
    assert sizes.n_experts_total == E * L and sizes.n_used == 8
    record = sum(nbytes[f"blk.0.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")) // E
    assert sizes.expert_record_bytes == [record] * L
    # f16 keys and values of every layer and position
    assert sizes.state_per_token == L * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2


@pytest.mark.parametrize(
    ("name", "arena_gb", "ctx"), [("qwen3-30b-a3b", 6.0, 32768), ("qwen3-235b-a22b", 9.0, 16384)]
)
def test_inspect_plan_streams_what_does_not_fit_a_24gb_machine(models, name, arena_gb, ctx):
    path, _ = models[name]
    args = [
        "inspect",
        str(path),
        "--plan",
        "--memory-gb",
        str(CAP_GB),
        "--arena-gb",
        str(arena_gb),
        "--ctx",
        str(ctx),
    ]
    run = subprocess.run(
        [sys.executable, "-c", f"import sys; from regolith.cli import main; sys.exit(main({args!r}))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    *rows, total = [line for line in run.stdout.splitlines() if line.strip() and not line.startswith(" ")]
    names = [re.split(r"\s{2,}", r.strip())[0] for r in rows]
    assert names == [
        "dense weights (resident)",
        "expert arena",
        f"KV / state at {ctx} tokens",
        "scratch",
        "runtime (before load)",
    ]
    assert total.startswith("total") and total.endswith(f"of a {CAP_GB} GiB budget")
    with regolith.gguf.open(path) as f:
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None, "f16")
    plan = memory_plan.plan_memory(sizes, n_ctx=ctx, memory_gb=CAP_GB, arena_gb=arena_gb, overhead_bytes=0)
    assert (
        plan.total_bytes <= CAP_GB * 2**30 and plan.arena_slots == int(arena_gb * 2**30) // sizes.slot_bytes
    )
    # the arena holds well over one token's experts (48 or 94 layers x 8) and far fewer than all of them
    assert 8 * sizes.n_experts_total // 128 < plan.arena_slots < sizes.n_experts_total // 2
    arena = next(r for r in rows if r.startswith("expert arena"))
    assert f"{plan.arena_slots} of {sizes.n_experts_total} experts" in arena
    # at full shapes the streamed path's scratch (experts batched on the host) stays a small part of the budget
    assert plan.scratch_bytes < 2**30
    # without --arena-gb the arena takes what the budget leaves, the streamed path's scratch counted
    auto = memory_plan.plan_memory(sizes, n_ctx=ctx, overhead_bytes=0, memory_gb=CAP_GB)
    assert auto.streaming and auto.total_bytes <= CAP_GB * 2**30 < auto.total_bytes + 2 * sizes.slot_bytes
