"""A step over several windows (regolith.window.eval_windows) against each window evaluated alone.

The oracle is Window.eval on a window of its own, which the other model tests check against transformers: a
batched step must give every window's logits (and leave its state, so every later step too) bit for bit as
evaluating it alone does, for every model family, resident and streamed through a tiny arena. The schedules
put windows at different lengths, mix prompt chunks with single decode tokens and with every-row logits in
one step, and run a checkpointed (speculative) evaluation with its rollback beside plain ones.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import regolith
from regolith import ContextOverflowError, RegolithError
from regolith.window import eval_windows

# Tokens per window per step (0: the window sits the step out). Window 1 wants every row's logits.
SCHEDULE = [
    [13, 5, 0],
    [1, 20, 3],
    [1, 1, 40],
    [4, 1, 1],
    [1, 1, 1],
    [0, 9, 1],
]
ALL_LOGITS = [False, True, False]


def _run_schedule(model: regolith.Model, seed: int = 0) -> None:
    vocab = model.config["vocab_size"]
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(3, vocab, sum(step[i] for step in SCHEDULE)) for i in range(3)]
    batched = [model.window(128) for _ in range(3)]
    alone = [model.window(128) for _ in range(3)]
    done = [0, 0, 0]
    for s, step in enumerate(SCHEDULE):
        live = [i for i in range(3) if step[i]]
        toks = [seqs[i][done[i] : done[i] + step[i]] for i in live]
        out = eval_windows([batched[i] for i in live], toks, [ALL_LOGITS[i] for i in live])
        for i, t, got in zip(live, toks, out, strict=True):
            want = alone[i].eval(t, all_logits=ALL_LOGITS[i])
            assert got.shape == want.shape
            assert np.array_equal(got, want), f"step {s}, window {i}: max diff {np.abs(got - want).max()}"
            done[i] += step[i]
    for b, a in zip(batched, alone, strict=True):
        assert b.tokens == a.tokens and b.n_past == a.n_past


def _checkpoint_beside_plain(model: regolith.Model) -> None:
    """Window 0 verifies 4 draft tokens after checkpoint() in the same step as window 1's decode token, then
    rolls back to 2 of them; its next logits (and draft, with an MTP head) are those of doing it alone."""
    vocab = model.config["vocab_size"]
    ids = np.random.default_rng(3).integers(3, vocab, 40)
    b0, b1, a0, a1 = (model.window(96) for _ in range(4))
    eval_windows([b0, b1], [ids[:12], ids[20:27]], [False, False])
    a0.eval(ids[:12], all_logits=False), a1.eval(ids[20:27], all_logits=False)
    b0.checkpoint(), a0.checkpoint()
    got = eval_windows([b0, b1], [ids[12:16], ids[27:28]], [True, False])
    assert np.array_equal(got[0], a0.eval(ids[12:16]))
    assert np.array_equal(got[1], a1.eval(ids[27:28], all_logits=False))
    b0.truncate(14), a0.truncate(14)
    got = eval_windows([b1, b0], [ids[28:29], ids[30:31]], [False, False])
    assert np.array_equal(got[1], a0.eval(ids[30:31], all_logits=False))
    assert np.array_equal(got[0], a1.eval(ids[28:29], all_logits=False))
    assert b0.draft(int(ids[31]), 3) == a0.draft(int(ids[31]), 3)


@pytest.fixture(scope="module")
def dense_models(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from tests.dense_models import tiny_model, write_gguf

    out = {}
    for arch in ("qwen2", "gemma3"):
        path = write_gguf(tiny_model(arch, 7), tmp_path_factory.mktemp(arch) / "tiny.gguf")
        out[arch] = regolith.Model.load(path)
    return out


@pytest.fixture(scope="module")
def tiny_qwen4exp(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from regolith import model_sizes
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    tmp = tmp_path_factory.mktemp("qwen4exp")
    path = convert(save_tiny_model(tmp / "hf", 7, indexer_n_heads=8), tmp / "tiny.gguf", "f32")
    with regolith.gguf.open(path) as f:
        slot = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None).slot_bytes
    return regolith.Model.load(path), regolith.Model.load(path, arena_gb=6 * slot / 2**30)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_dense_batched_step_matches_each_window_alone(dense_models, arch):
    _run_schedule(dense_models[arch])
    _checkpoint_beside_plain(dense_models[arch])


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_qwen4exp_batched_step_matches_each_window_alone(tiny_qwen4exp, streamed):
    model = tiny_qwen4exp[streamed]
    assert (model.plan is not None and model.plan.streaming) == streamed
    _run_schedule(model)
    _checkpoint_beside_plain(model)


@pytest.mark.skipif(
    os.environ.get("REGOLITH_BACKEND") == "metal-emu",
    reason="minutes on the emulator; the tiny qwen4exp cases run the same ops there",
)
@pytest.mark.parametrize("arena_gb", [None, 0.004], ids=["resident", "streamed"])
def test_demo_batched_step_matches_each_window_alone(arena_gb):
    """The demo model: GDN, QSA, PLE (rows read from its table per window) and the MTP head's per-window
    hidden states; streamed, the step's windows share a 4 MiB arena."""
    model = regolith.Model.load(arena_gb=arena_gb, n_ctx=256)
    _run_schedule(model, seed=1)
    _checkpoint_beside_plain(model)


def test_streamed_step_reads_shared_experts_once():
    """Four windows evaluating the same tokens in one step route to the same experts: from a cold arena the
    step reads exactly the records one window alone reads (four single evaluations would read them again
    wherever the small arena evicted them in between)."""
    ids = np.random.default_rng(2).integers(3, 4000, 12)
    alone = regolith.Model.load(arena_gb=0.004, n_ctx=256)
    alone.window(64).eval(ids, all_logits=False)
    together = regolith.Model.load(arena_gb=0.004, n_ctx=256)
    eval_windows([together.window(64) for _ in range(4)], [ids] * 4, [False] * 4)
    assert alone.stats()["misses"] > 0
    assert together.stats()["misses"] == alone.stats()["misses"]
    assert together.stats()["bytes_read"] == alone.stats()["bytes_read"]


def test_bad_steps_raise_and_change_nothing(dense_models):
    model = dense_models["qwen2"]
    a, b = model.window(16), model.window(16)
    eval_windows([a, b], [[5, 6], [7]], [False, False])
    with pytest.raises(ValueError, match="listed twice"):
        eval_windows([a, a], [[1], [2]], [False, False])
    with pytest.raises(ContextOverflowError):
        eval_windows([a, b], [[1], list(range(3, 19))], [False, False])
    with pytest.raises(ValueError, match="out of range"):
        eval_windows([a, b], [[1], [10**6]], [False, False])
    other = dense_models["gemma3"].window(16)
    with pytest.raises(RegolithError, match="different models"):
        eval_windows([a, other], [[1], [2]], [False, False])
    assert a.tokens == [5, 6] and b.tokens == [7] and other.n_past == 0
    assert eval_windows([], [], []) == []
