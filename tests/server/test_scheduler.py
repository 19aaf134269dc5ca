"""The step scheduler (server/scheduler.py) on the demo model, without HTTP: a long prompt is evaluated in
pieces beside another window's decode tokens, and every window's logits are those of evaluating it alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import regolith
from regolith.server.scheduler import PIECE_ALIGN, StepScheduler, _piece


@pytest.mark.parametrize("budget", [-10, 0, 64, 100, 256])
def test_pieces_are_whole_chunks_and_never_leave_one_token(budget):
    for left in range(1, 600):
        for progress in (False, True):
            n = _piece(left, budget, progress=progress)
            assert n in (0, left) or (n % PIECE_ALIGN == 0 and left - n >= 2), (left, budget, n)
            assert n <= max(budget, 0) or n == left <= budget or (progress and n <= PIECE_ALIGN + 1), (
                left,
                n,
            )
            assert n > 0 or not progress, (left, budget)


def test_a_long_prompt_goes_in_pieces_beside_decode_tokens():
    model = regolith.Model.load(arena_gb=0.004, n_ctx=1024)
    rng = np.random.default_rng(4)
    long_prompt, short_prompt = rng.integers(3, 4000, 449), rng.integers(3, 4000, 12)
    decode = rng.integers(3, 4000, 6)
    alone_long, alone_short = model.window(512), model.window(512)
    want_long = alone_long.eval(long_prompt, all_logits=False)
    want_short = [alone_short.eval(short_prompt, all_logits=False)]
    want_short += [alone_short.eval([int(t)], all_logits=False) for t in decode]

    steps: list[tuple[int, int]] = []
    started: list[int] = []  # steps run when each step started
    scheduler = StepScheduler(
        step_tokens=128,
        on_step=lambda seqs, toks, _: steps.append((seqs, toks)),
        before_step=lambda: started.append(len(steps)),
    )
    scheduler.start()
    long_w, short_w = model.window(512), model.window(512)
    long_w.stepper = short_w.stepper = scheduler
    got: dict[str, object] = {}

    def run_long() -> None:
        got["long"] = long_w.eval(long_prompt, all_logits=False)

    def run_short() -> None:
        out = [short_w.eval(short_prompt, all_logits=False)]
        out += [short_w.eval([int(t)], all_logits=False) for t in decode]
        got["short"] = out

    try:
        scheduler.enter(), scheduler.enter()
        threads = [threading.Thread(target=run_long), threading.Thread(target=run_short)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        scheduler.stop()
    assert np.array_equal(got["long"], want_long)
    assert all(np.array_equal(a, b) for a, b in zip(got["short"], want_short, strict=True))
    assert long_w.tokens == list(long_prompt) and long_w.n_past == len(long_prompt)
    assert max(toks for _, toks in steps) <= 128 + 12  # a piece within the budget, plus short evaluations
    assert any(seqs == 2 for seqs, _ in steps)  # the prompt's pieces shared steps with the decode tokens
    assert sum(toks for _, toks in steps) == len(long_prompt) + len(short_prompt) + len(decode)
    assert started == list(range(len(steps)))  # before_step before each step, once
