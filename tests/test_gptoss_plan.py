"""`regolith inspect --plan` on full-size synthetic gpt-oss-20b and gpt-oss-120b GGUFs (gpt-oss), as
ggml-org's released GGUFs hold them: MXFP4 routed experts, Q8_0 attention, embeddings and output, F32 norms,
routers, biases (the experts' too) and attention sinks (benchmarks/synthetic_gptoss.py; Q8_0 because the
released files' sizes, 12.1 and 63.4 GB, are those of Q8_0, where F16 would make 13.8 and 65.1 GB). The files
are sparse (headers only: 12.1 and 63.4 GB apparent, a few MB on disk). The plan's sizes are checked against
the tensor infos as the gguf package reads them and against the shapes by hand, the table at 32k and 128k
tokens against a 24 GB machine's cap; the synthetic checkpoint's shapes against transformers' model; and a
small random file from the same writer loads, evaluates and streams through a small arena bit-identically to
resident experts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import regolith
from regolith import memory_plan, model_sizes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synthetic_gptoss as synthetic

os.environ.setdefault("OMP_NUM_THREADS", "1")

CAP_GB = 18.8  # the seed's plan cap on a 24 GB machine
CTX = (32768, 131072)  # --ctx 32k,128k
MODELS = synthetic.MODELS
# bytes of a block of 32 weights (ggml's block_mxfp4: an E8M0 scale and 16 bytes of nibbles; block_q8_0)
MXFP4, Q8_0 = 17, 34


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, list]]:
    d = tmp_path_factory.mktemp("gptoss-full")
    return {
        name: (d / f"{name}-mxfp4.gguf", synthetic.write_headers(d / f"{name}-mxfp4.gguf", name))
        for name in MODELS
    }


def _sizes(path: Path) -> model_sizes.ModelSizes:
    with regolith.gguf.open(path) as f:
        return model_sizes.sizes_from_gguf(f.tensors, f.metadata, None, "f16")


def _expected_dense(cfg: dict) -> int:
    """The resident tensors' bytes from the shapes: Q8_0 embeddings, output and attention matrices; F32 the
    rest, per layer two norms, the q / k / v / o biases, the sinks, the router and its bias and the experts'
    gate, up and down biases ([E][ff] x 2, [E][hidden]), and the output norm.
    20b: 1,907,481,600 + 36,731,136 = 1,944,212,736 B (1.81 GiB; 26.5 MB of it the experts' biases).
    120b: 2,245,893,120 + 214,357,248 = 2,460,250,368 B (2.29 GiB; 159 MB of it the experts' biases)."""
    H, V, hd, F = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"], cfg["intermediate_size"]
    nh, nkv, E, L = (
        cfg[k]
        for k in ("num_attention_heads", "num_key_value_heads", "num_local_experts", "num_hidden_layers")
    )
    matrices = 2 * V * H + L * (2 * nh * hd * H + 2 * nkv * hd * H)
    f32 = L * (2 * H + nh * hd + 2 * nkv * hd + H + nh + E * H + E + E * (2 * F + H)) + H
    return matrices // 32 * Q8_0 + 4 * f32


@pytest.mark.parametrize("name", list(MODELS))
def test_plan_sizes_match_the_files_tensor_infos(models, name):
    path, specs = models[name]
    assert path.stat().st_blocks * 512 < 50 * 10**6  # sparse
    reader = gguf.GGUFReader(str(path))
    nbytes = {t.name: int(t.n_bytes) for t in reader.tensors}
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert nbytes == {s.name: s.nbytes for s in specs}
    # the released files' sizes (ggml-org's gpt-oss-20b-mxfp4.gguf 12.1 GB, gpt-oss-120b's shards 63.4 GB)
    assert round(sum(nbytes.values()) / 1e9, 1) == {"gpt-oss-20b": 12.1, "gpt-oss-120b": 63.4}[name]
    cfg = synthetic.config(name)
    E, L, F, H = (
        cfg[k] for k in ("num_local_experts", "num_hidden_layers", "intermediate_size", "hidden_size")
    )
    # the metadata is the converter's for this config.json, an MXFP4_MOE file
    md = synthetic.gpt_oss.gguf_metadata(cfg, file_type=int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE))
    with regolith.gguf.open(path) as f:
        assert f.architecture == "gpt-oss"
        assert {k for k in f.metadata if k.startswith("gpt-oss.")} == {
            k for k, _, _ in md if k.startswith("gpt-oss.")
        }
        for key, value, _ in md:
            assert f.metadata[key] == pytest.approx(value), key
    sizes = _sizes(path)
    experts = sum(n for k, n in nbytes.items() if k.endswith("_exps.weight"))
    assert {types[k] for k in nbytes if k.endswith("_exps.weight")} == {"MXFP4"}
    # the experts' biases are F32 and resident: dense weights, not records
    biases = [k for k in nbytes if k.endswith("_exps.bias")]
    assert len(biases) == 3 * L and {types[k] for k in biases} == {"F32"}
    assert sum(nbytes[k] for k in biases) == 4 * L * E * (2 * F + H)
    assert sizes.expert_bytes == experts and sizes.dense_bytes == sum(nbytes.values()) - experts
    assert sizes.dense_bytes == _expected_dense(cfg)
    assert sizes.n_experts_total == E * L and sizes.n_used == 4 and not sizes.mtp_bytes
    # one expert: MXFP4 gate and up [F][H] and down [H][F], 17 bytes per 32 weights:
    # 3 x 2,880 x 2,880 / 32 x 17 = 13,219,200 B (12.6 MiB); all of them 768 x that = 10,152,345,600 B
    # (9.46 GiB; 20b) or 4,608 x that = 60,914,073,600 B (56.7 GiB; 120b)
    assert sizes.expert_record_bytes == [3 * F * H // 32 * MXFP4] * L == [13_219_200] * L
    assert sizes.expert_bytes == {"gpt-oss-20b": 10_152_345_600, "gpt-oss-120b": 60_914_073_600}[name]
    # f16 keys and values of every layer and position, the sliding-window layers' too:
    # 20b: 24 x 2 x 8 x 64 x 2 = 49,152 B (48 KiB) a token; 120b: 36 layers, 73,728 B (72 KiB)
    assert sizes.state_per_token == L * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    assert sizes.state_fixed == 0


def _expected_scratch(cfg: dict, streamed: bool, n_ctx: int) -> int:
    """The plan's scratch from the shapes (model_sizes._dense_scratch's account of DenseWindow::forward): per
    token of a 512-token chunk the residual, its norm and the attention output [H] x 3, queries and attention
    [heads x 64] x 2, keys and values [8 x 64] x 2, two rope tables [64], router logits [E], weights and ids
    [4], positions and token id; the largest tensor once more and the logits row, all twice over (the
    workspace's doubling chunks), and a first 1 MiB chunk. Resident experts add the backend's batch (each
    routed row's input, gate, up and output, the output [H]); streamed ones batch those in the workspace.
    20b resident: 193,559,552 B (185 MiB); 120b streamed: 312,867,840 B (298 MiB). Beside the workspace, per
    context token, the CPU attention's scores of 32 queries of a key head's group of 8 (1 KiB) and a layer's f16
    keys and values held twice while its cache grows (2 KiB): 96 MiB at 32k, 384 MiB at 128k."""
    t, H, F, V = 512, cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    ffn = 4 * (E + 2 * k) + (k * (8 + 4 * (2 * H + 2 * F)) if streamed else 0)
    largest = 4 * (k * max(H, F) if streamed else max(H, q, E))
    per_token = 4 * (3 * H + 2 * q + 2 * kv + 2 * cfg["head_dim"]) + ffn + 3 * 8 + 4
    scratch = 2 * (t * per_token + t * largest + 4 * V) + (1 << 20)
    group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    scratch += n_ctx * (4 * 32 * group + 2 * kv * 2)
    return scratch if streamed else scratch + 4 * t * (k * (2 * H + 2 * F) + H)


def _inspect(path: Path) -> list[str]:
    args = ["inspect", str(path), "--plan", "--memory-gb", str(CAP_GB), "--ctx", "32k,128k"]
    run = subprocess.run(
        [sys.executable, "-c", f"import sys; from regolith.cli import main; sys.exit(main({args!r}))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return [line for line in run.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("name", list(MODELS))
def test_inspect_plan_on_a_24gb_machine(models, name):
    """A 24 GB machine holds gpt-oss-20b whole (its 1.81 GiB of dense weights and 9.46 GiB of experts, at
    128k tokens too) and streams gpt-oss-120b's 56.7 GiB of experts through an arena beside its 2.29 GiB of
    dense weights."""
    path, _ = models[name]
    head, *rows, total = _inspect(path)
    assert head.split() == [f"{CTX[0]:,}", "ctx", f"{CTX[1]:,}", "ctx"]
    table = {}  # row -> (its size at 32k, at 128k, its note)
    for row in rows:
        label, size32, size128, *note = re.split(r"\s{2,}", row.strip())
        table[label] = (size32, size128, " ".join(note))
    assert total.startswith("total") and total.endswith(f"of a {CAP_GB} GiB budget")
    cfg, sizes = synthetic.config(name), _sizes(path)
    human = memory_plan.human_bytes
    dense = _expected_dense(cfg)
    per_token = sizes.state_per_token
    plans = [memory_plan.plan_memory(sizes, n_ctx=n, memory_gb=CAP_GB, overhead_bytes=0) for n in CTX]
    # the default cap of a 24 GiB machine (three quarters of it) plans alike
    default = [
        memory_plan.plan_memory(sizes, n_ctx=n, physical_bytes=24 << 30, overhead_bytes=0).streaming
        for n in CTX
    ]
    assert default == [p.streaming for p in plans]
    for i, (n_ctx, plan) in enumerate(zip(CTX, plans, strict=True)):
        assert table["dense weights (resident)"][i] == human(dense)
        assert table["KV / state"][i] == human(per_token * n_ctx)
        assert plan.total_bytes <= CAP_GB * 2**30
    if name == "gpt-oss-20b":
        # everything resident: 1.81 + 9.46 + 1.5 (6 at 128k) GiB of f16 KV + 185 MiB of scratch = 12.9 GiB
        # (17.4 at 128k) of the 18.8
        assert list(table) == [
            "dense weights (resident)",
            "experts (resident)",
            "KV / state",
            "scratch",
            "runtime (before load)",
        ]
        assert not any(p.streaming for p in plans)
        assert table["experts (resident)"][:2] == (human(sizes.expert_bytes),) * 2
        assert table["experts (resident)"][2] == f"all {sizes.n_experts_total}"
        assert table["scratch"][:2] == tuple(human(_expected_scratch(cfg, False, n)) for n in CTX)
        return
    assert list(table) == [
        "dense weights (resident)",
        "expert arena",
        "KV / state",
        "scratch",
        "runtime (before load)",
    ]
    # a slot: the largest record, each of its parts (4,406,400 B) padded to 4 KiB with 4 KiB more (O_DIRECT
    # reads): 3 x 4,411,392 = 13,234,176 B (12.6 MiB)
    part = cfg["intermediate_size"] * cfg["hidden_size"] // 32 * MXFP4
    slot = 3 * (-(-(part + 4096) // 4096) * 4096)
    assert part == 4_406_400 and sizes.slot_bytes == slot == 13_234_176
    runtime = (128 << 20) // slot  # at most this many slots go to the CLI's runtime (tens of MiB, measured)
    for i, (n_ctx, plan) in enumerate(zip(CTX, plans, strict=True)):
        scratch = _expected_scratch(cfg, True, n_ctx)
        assert plan.streaming and plan.scratch_bytes == scratch
        assert table["scratch"][i] == human(scratch)
        # the arena takes what the dense weights, the KV cache and the scratch leave of the cap
        rest = dense + per_token * n_ctx + scratch
        assert plan.arena_slots == int(CAP_GB * 2**30 - rest) // slot
        assert plan.total_bytes <= CAP_GB * 2**30 < plan.total_bytes + slot
        arenas = {human(k * slot) for k in range(plan.arena_slots - runtime, plan.arena_slots)}
        assert table["expert arena"][i] in arenas, n_ctx
        # more than one token's experts (36 layers x 4 = 144), far fewer than all 4,608
        assert 4 * 36 < plan.arena_slots < sizes.n_experts_total // 4
    # 18.8 GiB - 2.29 (dense) - 2.25 (KV at 32k) - 0.38 (scratch: 0.29 and 96 MiB of attention) = 13.9 GiB of
    # 12.6 MiB slots: 1,125 of the 4,608 experts (24.4%), 7.8 tokens' worth; at 128k (9 GiB of KV, 0.67 GiB of
    # scratch) 555 (12.0%), 3.9 tokens' worth
    assert [p.arena_slots for p in plans] == [1125, 555]
    # the note (of the 32k plan) says how many experts the arena holds and what the experts take on disk
    cli_slots = int(re.search(r"(\d+) of 4608 experts \(", table["expert arena"][2]).group(1))
    assert plans[0].arena_slots - runtime <= cli_slots < plans[0].arena_slots
    assert table["expert arena"][0] == human(cli_slots * slot)
    assert (
        table["expert arena"][2].endswith(f"{human(sizes.expert_bytes)} on disk")
        and "56.7 GiB" in table["expert arena"][2]
    )


def test_a_smaller_budget_streams_20b_beside_its_resident_dense_weights(models):
    """With 8 GiB (a 24 GB machine's other users taking the rest), 20b streams: the dense weights stay
    resident and the arena holds what is left beside them, still more than a token's experts (24 x 4)."""
    sizes = _sizes(models["gpt-oss-20b"][0])
    plan = memory_plan.plan_memory(sizes, n_ctx=32768, memory_gb=8.0, overhead_bytes=0)
    assert plan.streaming and plan.resident_expert_bytes == plan.arena_bytes
    assert plan.rows()[0] == ("dense weights (resident)", sizes.dense_bytes, "")
    assert 4 * 24 < plan.arena_slots < sizes.n_experts_total
    assert plan.total_bytes <= 8 * 2**30 < plan.total_bytes + sizes.slot_bytes


def test_checkpoint_shapes_match_transformers():
    """The synthetic checkpoint (4 layers of gpt-oss-20b, real shapes) is transformers' GptOssForCausalLM
    built on the meta device (nothing allocated), its experts' MXFP4 blocks and scales standing for
    ``gate_up_proj`` [E, H, 2F] and ``down_proj`` [E, F, H]."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = synthetic.config("gpt-oss-20b", 4, vocab=512)
    assert cfg["architectures"] == ["GptOssForCausalLM"]
    skip = ("architectures", "model_type", "quantization_config")
    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(
            transformers.GptOssConfig(**{k: v for k, v in cfg.items() if k not in skip})
        )
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {}
    for name, (shape, dtype) in synthetic.checkpoint_shapes(cfg).items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):  # [E, out, in / 32, 16] -> the float tensor [E, in, out]
            assert dtype == "U8"
            name, shape = name[: -len("_blocks")], (shape[0], shape[2] * 32, shape[1])
        got[name] = shape
    assert got == want


# 4 layers with rows of 256 (MXFP4 and Q8_0 blocks fit): hidden 256, 4 heads of 64 (2 KV heads), 16 experts
# of width 256 (top 4), a sliding window of 8 so the prompt passes it
TINY = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 16,
    "intermediate_size": 256,
    "sliding_window": 8,
}


def _run(model: regolith.Model, ids: np.ndarray) -> np.ndarray:
    """A prefill of 8 tokens, then one token at a time."""
    w = model.window(64)
    return np.concatenate([w.eval(ids[:8]), *(w.eval(ids[i : i + 1]) for i in range(8, len(ids)))])


def test_small_synthetic_file_evaluates_and_streams_bit_identically(tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic.base, "MIN_FREE_BYTES", 0)  # a few MB: the guard is for multi-GB files
    path = tmp_path / "tiny.gguf"
    specs = synthetic.write(path, 4, vocab=512, fields=TINY)
    assert {s.qtype for s in specs if s.is_expert} == {"MXFP4"}
    ids = np.random.default_rng(0).integers(3, 259, 20)
    resident = regolith.Model.load(path)
    assert resident.config["architecture"] == "gpt-oss" and not resident.plan.streaming
    want = _run(resident, ids)
    assert np.isfinite(want).all() and want.std(axis=-1).min() > 0.1
    arena_gb = 5 * resident.plan.sizes.slot_bytes / 2**30  # 5 of 64 experts
    streamed = regolith.Model.load(path, arena_gb=arena_gb, lock_memory=False)
    assert streamed.plan.streaming and streamed._core.arena_info()["slots"] == 5
    np.testing.assert_array_equal(_run(streamed, ids), want)
    assert streamed.stats()["misses"] > 0
