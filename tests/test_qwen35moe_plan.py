"""`regolith inspect --plan` on full-size synthetic Qwen3.5-35B-A3B, Qwen3.5-397B-A17B (qwen35moe) and
Qwen3-Next-80B-A3B (qwen3next) GGUFs, as llama.cpp's Q4_K_M holds them: Q4_K, with Q6_K output and, in the
half of the layers its use_more_bits picks, Q6_K attention values and down projections; F32 norms, routers and
small Gated DeltaNet tensors (benchmarks/synthetic_qwen35moe.py). The files are sparse (headers only: 21, 241
and 48 GB apparent, a few MB on disk). The plan's sizes are checked against the tensor infos as the gguf
package reads them and against the shapes by hand, the table at 32k and 128k tokens against a 24 GB machine's
cap; the synthetic checkpoints' shapes against transformers' models; and a small random file of each
architecture from the same writer loads, evaluates and streams through a small arena bit-identically to
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
import synthetic_qwen35moe as synthetic

os.environ.setdefault("OMP_NUM_THREADS", "1")

CAP_GB = 18.8  # the seed's plan cap on a 24 GB machine
CTX = (32768, 131072)  # --ctx 32k,128k
MODELS = synthetic.MODELS
# bytes of a block of 256 weights (ggml's block_q4_K, block_q6_K)
Q4_K, Q6_K = 144, 210


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, list]]:
    d = tmp_path_factory.mktemp("qwen-hybrid-full")
    return {
        name: (d / f"{name}-Q4_K_M.gguf", synthetic.write_headers(d / f"{name}-Q4_K_M.gguf", name))
        for name in MODELS
    }


def _sizes(path: Path) -> model_sizes.ModelSizes:
    with regolith.gguf.open(path) as f:
        return model_sizes.sizes_from_gguf(f.tensors, f.metadata, None, "f16")


def _more_bits(layer: int, n: int) -> bool:
    """llama.cpp's use_more_bits: Q4_K_M's Q6_K layers."""
    return layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2


def _expected_state(cfg: dict) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of a window's state, from the shapes: per token the full-attention
    layers' f16 keys and values; fixed, the Gated DeltaNet layers' f32 conv history (kernel - 1 taps of the
    q, k and v channels) and recurrent state (a dk x dv matrix per value head).
    35B-A3B: 10 attention layers x 2 x 2 kv heads x 256 x 2 B = 20,480 B (20 KiB) a token, 640 MiB at 32k;
    30 GDN layers x 4 B x (3 x (2 x 16 x 128 + 32 x 128) + 32 x 128 x 128) = 65,863,680 B (62.8 MiB).
    397B-A17B: 15 x 2 x 2 x 256 x 2 = 30,720 B (30 KiB) a token, 960 MiB at 32k;
    45 x 4 x (3 x (2 x 16 x 128 + 64 x 128) + 64 x 128 x 128) = 195,379,200 B (186 MiB).
    Qwen3-Next-80B-A3B: 12 x 2 x 2 x 256 x 2 = 24,576 B (24 KiB) a token, 768 MiB at 32k;
    36 x 4 x (3 x (2 x 16 x 128 + 32 x 128) + 32 x 128 x 128) = 79,036,416 B (75.4 MiB)."""
    n_full = cfg["num_hidden_layers"] // cfg["full_attention_interval"]
    n_gdn = cfg["num_hidden_layers"] - n_full
    per_token = n_full * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    nk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
    nv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
    conv = (cfg["linear_conv_kernel_dim"] - 1) * (2 * nk * dk + nv * dv)
    return per_token, n_gdn * 4 * (conv + nv * dk * dv)


@pytest.mark.parametrize("name", list(MODELS))
def test_plan_sizes_match_the_files_tensor_infos(models, name):
    path, specs = models[name]
    assert path.stat().st_blocks * 512 < 50 * 10**6  # sparse
    reader = gguf.GGUFReader(str(path))
    nbytes = {t.name: int(t.n_bytes) for t in reader.tensors}
    assert nbytes == {s.name: s.nbytes for s in specs}
    cfg = synthetic.config(name)
    E, L, F, H = (
        cfg[k] for k in ("num_experts", "num_hidden_layers", "moe_intermediate_size", "hidden_size")
    )
    # the metadata is the converter's for this config.json, a Q4_K_M file (general.file_type 15)
    convert = synthetic.converter(cfg)
    assert convert.ARCH == synthetic.MODEL_ARCH[name]
    md = convert.gguf_metadata(cfg, file_type=int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    with regolith.gguf.open(path) as f:
        assert f.architecture == convert.ARCH
        arch_keys = {k for k in f.metadata if k.startswith(f"{convert.ARCH}.")}
        assert arch_keys == {k for k, _, _ in md if k.startswith(f"{convert.ARCH}.")}
        for key, value, _ in md:
            got = f.metadata[key]
            assert (list(got) if isinstance(value, list) else got) == pytest.approx(value), key
    sizes = _sizes(path)
    experts = sum(n for k, n in nbytes.items() if k.endswith("_exps.weight"))
    assert sizes.expert_bytes == experts and sizes.dense_bytes == sum(nbytes.values()) - experts
    assert (
        sizes.n_experts_total == E * L and sizes.n_used == cfg["num_experts_per_tok"] and not sizes.mtp_bytes
    )
    records = [
        sum(nbytes[f"blk.{i}.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")) // E for i in range(L)
    ]
    assert sizes.expert_record_bytes == records
    # one expert: Q4_K gate and up [F, H], a Q4_K or (use_more_bits, half of the layers) Q6_K down [H, F].
    # 35B-A3B and 80B-A3B: 4,096 blocks each: 1,769,472 or 2,039,808 B; 397B-A17B: 16,384: 7,077,888 or
    # 8,159,232 B
    blocks = F * H // 256
    want = [blocks * (2 * Q4_K + (Q6_K if _more_bits(i, L) else Q4_K)) for i in range(L)]
    assert records == want and sum(_more_bits(i, L) for i in range(L)) == L // 2
    assert (sizes.state_per_token, sizes.state_fixed) == _expected_state(cfg)


def _expected_scratch(cfg: dict, vocab: int) -> int:
    """The plan's scratch for a streamed qwen35moe (memory_plan's hybrid estimate), from the shapes: a 512-token
    chunk's streams (6 x hidden), routed rows (top-k x (2 hidden + 2 expert width)) and two logits rows, f32,
    with the routed rows batched again in the workspace (twice over) and a first 1 MiB chunk.
    35B-A3B: 4 x (6,291,456 + 20,971,520 + 496,640) + 8 x 20,971,520 + 1 MiB = 279,859,200 B (267 MiB)."""
    t, H, k, F = 512, cfg["hidden_size"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    moe = t * k * (2 * H + 2 * F)
    return 4 * (6 * t * H + moe + 2 * vocab) + 2 * 4 * moe + (1 << 20)


def _expected_attention(cfg: dict) -> int:
    """Bytes per context token the plan's scratch adds for the full-attention layers' prefill at the end of
    the context: the CPU backend's f32 scores of 32 queries of a key head's group against every key, and one
    layer's f16 keys and values twice while its cache moves into a larger buffer.
    35B-A3B and 80B-A3B: 4 x 32 x 16 / 2 + 2 x 2 x 256 x 2 = 3,072 B (96 MiB at 32k);
    397B-A17B: 4 x 32 x 32 / 2 + 2,048 = 4,096 B (128 MiB at 32k)."""
    group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    return 4 * 32 * group + 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2


@pytest.mark.parametrize("name", list(MODELS))
def test_inspect_plan_streams_what_does_not_fit_a_24gb_machine(models, name):
    path, specs = models[name]
    args = ["inspect", str(path), "--plan", "--memory-gb", str(CAP_GB), "--ctx", "32k,128k"]
    run = subprocess.run(
        [sys.executable, "-c", f"import sys; from regolith.cli import main; sys.exit(main({args!r}))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    head, *rows, total = [line for line in run.stdout.splitlines() if line.strip()]
    assert head.split() == [f"{CTX[0]:,}", "ctx", f"{CTX[1]:,}", "ctx"]
    table = {}  # row -> (its size at 32k, at 128k, its note)
    for row in rows:
        label, size32, size128, *note = re.split(r"\s{2,}", row.strip())
        table[label] = (size32, size128, " ".join(note))
    assert list(table) == [
        "dense weights (resident)",
        "expert arena",
        "KV / state",
        "scratch",
        "runtime (before load)",
    ]
    assert total.startswith("total") and total.endswith(f"of a {CAP_GB} GiB budget")

    cfg, sizes = synthetic.config(name), _sizes(path)
    per_token, fixed = _expected_state(cfg)
    dense = sum(s.nbytes for s in specs if not s.is_expert)
    chunk = _expected_scratch(cfg, cfg["vocab_size"])
    # a slot: the largest record, each of its parts padded to 4 KiB with 4 KiB more (O_DIRECT reads);
    # 35B-A3B and 80B-A3B: 2 x (589,824 + 4,096) + 860,160 + 4,096 = 2,052,096 B (1.96 MiB)
    blocks = cfg["moe_intermediate_size"] * cfg["hidden_size"] // 256
    slot = sum(-(-(blocks * q + 4096) // 4096) * 4096 for q in (Q4_K, Q4_K, Q6_K))
    assert sizes.slot_bytes == slot
    runtime = (128 << 20) // slot  # at most this many slots go to the CLI's runtime (tens of MiB, measured)
    plans = [memory_plan.plan_memory(sizes, n_ctx=n, memory_gb=CAP_GB, overhead_bytes=0) for n in CTX]
    human = memory_plan.human_bytes
    for i, (n_ctx, plan) in enumerate(zip(CTX, plans, strict=True)):
        scratch = chunk + _expected_attention(cfg) * n_ctx
        assert plan.streaming and plan.scratch_bytes == scratch
        # the arena takes what the dense weights, the state and the scratch leave of the cap
        rest = dense + fixed + per_token * n_ctx + scratch
        assert plan.arena_slots == int(CAP_GB * 2**30 - rest) // slot
        assert plan.total_bytes <= CAP_GB * 2**30 < plan.total_bytes + slot
        assert table["dense weights (resident)"][i] == human(dense)
        assert table["KV / state"][i] == human(fixed + per_token * n_ctx)
        assert table["scratch"][i] == human(scratch)
        # the CLI's arena: the same less what its runtime takes
        arenas = {human(k * slot) for k in range(plan.arena_slots - runtime, plan.arena_slots)}
        assert table["expert arena"][i] in arenas, n_ctx
    share = plans[0].arena_slots / sizes.n_experts_total
    if name == "qwen35-35b-a3b":
        # 18.8 GiB - 1.54 (dense) - 0.69 (state) - 0.35 (scratch) = 16.2 GiB of 1.96 MiB slots: 8,487 of the
        # 10,240 experts (82.9%; all of them take 18.2 GiB)
        assert 0.8 < share < 0.85
    elif name == "qwen35-397b-a17b":
        # 18.8 - 6.10 - 1.12 - 0.76 = 10.8 GiB of 7.79 MiB slots: 1,421 of 30,720 experts (4.6%; all of them
        # take 218 GiB), 2.4 tokens' worth (60 layers x 10)
        assert 0.04 < share < 0.05
    else:
        # Qwen3-Next-80B-A3B: 18.8 - 1.56 - 0.82 - 0.41 = 16.0 GiB of 1.96 MiB slots: 8,374 of 24,576 experts
        # (34.1%; all of them take 43.6 GiB), 17.4 tokens' worth (48 layers x 10)
        assert 0.33 < share < 0.35
    # the slot count the note gives (at 32k)
    cli_slots = int(re.search(r"(\d+) of (\d+) experts", table["expert arena"][2]).group(1))
    assert plans[0].arena_slots - runtime <= cli_slots < plans[0].arena_slots
    assert table["expert arena"][0] == human(cli_slots * slot)
    assert f"of {sizes.n_experts_total} experts" in table["expert arena"][2]


# architecture -> transformers' text config and model classes
HF_CLASSES = {
    "qwen35moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_checkpoint_shapes_match_transformers(name):
    """The synthetic checkpoint (4 layers of the model, real shapes) is transformers' Qwen3_5MoeForCausalLM
    or Qwen3NextForCausalLM, built on the meta device (nothing allocated)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = synthetic.config(name, 4, vocab=512)
    config_class, model_class = (getattr(transformers, c) for c in HF_CLASSES[synthetic.MODEL_ARCH[name]])
    assert cfg["architectures"] == [model_class.__name__]
    text = config_class(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    assert text.layer_types == synthetic.layer_types(cfg) == ["linear_attention"] * 3 + ["full_attention"]
    with torch.device("meta"):
        model = model_class(text)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == synthetic.checkpoint_shapes(cfg)


# 4 layers (3 Gated DeltaNet, 1 attention) with rows of 256, so every type's blocks fit: hidden 256, 16
# experts of width 256 (top 4), GDN 2 key / 4 value heads of 64, attention 4 heads of 64 (2 KV heads);
# Qwen3.5's M-RoPE sections cover the 8 rotated pairs
TINY = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
}
_TINY_MROPE = {**MODELS["qwen35-35b-a3b"]["rope_parameters"], "mrope_section": [3, 3, 2]}
TINY_MODELS = {  # architecture -> (model, its fields)
    "qwen35moe": ("qwen35-35b-a3b", {**TINY, "rope_parameters": _TINY_MROPE}),
    "qwen3next": ("qwen3-next-80b-a3b", TINY),
}


def _run(model: regolith.Model, ids: np.ndarray) -> np.ndarray:
    """A prefill of 8 tokens, then one token at a time."""
    w = model.window(64)
    return np.concatenate([w.eval(ids[:8]), *(w.eval(ids[i : i + 1]) for i in range(8, len(ids)))])


@pytest.mark.parametrize("expert_type", list(synthetic.EXPERT_TYPES))
@pytest.mark.parametrize("arch", list(TINY_MODELS))
def test_small_synthetic_file_evaluates_and_streams_bit_identically(arch, expert_type, tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic.base, "MIN_FREE_BYTES", 0)  # a 10 MB file: the guard is for multi-GB ones
    path = tmp_path / "tiny.gguf"
    model, fields = TINY_MODELS[arch]
    specs = synthetic.write(path, 4, model=model, vocab=512, expert_type=expert_type, fields=fields)
    types = {s.qtype for s in specs if s.is_expert}
    assert types == ({"Q4_K", "Q6_K"} if expert_type == "Q4_K_M" else {expert_type})
    ids = np.random.default_rng(0).integers(3, 259, 12)
    resident = regolith.Model.load(path)
    assert resident.config["architecture"] == arch
    assert resident.config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert not resident.plan.streaming
    want = _run(resident, ids)
    assert np.isfinite(want).all() and want.std(axis=-1).min() > 0
    arena_gb = 5 * resident.plan.sizes.slot_bytes / 2**30  # 5 of 64 experts
    streamed = regolith.Model.load(path, arena_gb=arena_gb, lock_memory=False)
    assert streamed.plan.streaming and streamed._core.arena_info()["slots"] == 5
    np.testing.assert_array_equal(_run(streamed, ids), want)
    assert streamed.stats()["misses"] > 0
