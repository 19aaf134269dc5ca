"""Suffix cache reuse's plan step (regolith.scr.plan_reuse) against a brute-force search with the same rule,
on token lists that share long stretches (edits, deletions, insertions, repeats)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regolith.scr import Run, fits_recurrent, plan_reuse, reused_tokens


def _brute_force(cached, prompt, max_runs, min_run, max_candidates):
    """The rule of plan_reuse's docstring, by comparing every pair of positions."""

    def common(a, b):
        n = 0
        while n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        return n

    runs = []
    head = common(cached, prompt)
    if head:
        runs.append(Run(0, 0, head))
    src, i, found = head, head, 0
    while i + min_run <= len(prompt) and found < max_runs:
        gram = prompt[i : i + min_run]
        places = [j for j in range(src, len(cached) - min_run + 1) if cached[j : j + min_run] == gram]
        best = (0, -1)
        for j in places[:max_candidates]:
            n = common(cached[j:], prompt[i:])
            if n > best[0]:
                best = (n, j)
        if best[0]:
            runs.append(Run(best[1], i, best[0]))
            src, i, found = best[1] + best[0], i + best[0], found + 1
        else:
            i += 1
    return runs


def _valid(cached, prompt, runs, min_run):
    dst_end = src_end = 0
    for k, r in enumerate(runs):
        assert r.length > 0 and r.src >= src_end and r.dst >= dst_end
        assert list(prompt[r.dst : r.dst + r.length]) == list(cached[r.src : r.src + r.length])
        if k or r.dst:  # a run after the prefix
            assert r.length >= min_run
        src_end, dst_end = r.src + r.length, r.dst + r.length


def _edited(rng: random.Random, cached: list[int], vocab: int) -> list[int]:
    """``cached`` with a few edits: replaced, deleted, inserted and duplicated stretches."""
    out = list(cached)
    for _ in range(rng.randrange(1, 5)):
        at = rng.randrange(len(out) + 1)
        n = rng.randrange(1, 12)
        kind = rng.randrange(4)
        if kind == 0:
            out[at : at + n] = [rng.randrange(vocab) for _ in range(n)]
        elif kind == 1:
            del out[at : at + n]
        elif kind == 2:
            out[at:at] = [rng.randrange(vocab) for _ in range(n)]
        else:
            src = rng.randrange(len(out) + 1)
            out[at:at] = out[src : src + n]
    return out


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 12),
    n=st.integers(0, 120),
    min_run=st.integers(1, 6),
    max_runs=st.integers(0, 5),
    max_candidates=st.sampled_from([1, 2, 1000]),
)
def test_plan_equals_brute_force(seed, vocab, n, min_run, max_runs, max_candidates):
    rng = random.Random(seed)
    cached = [rng.randrange(vocab) for _ in range(n)]
    prompt = _edited(rng, cached, vocab) if rng.random() < 0.8 else [rng.randrange(vocab) for _ in range(n)]
    got = plan_reuse(cached, prompt, max_runs=max_runs, min_run=min_run, max_candidates=max_candidates)
    assert got == _brute_force(cached, prompt, max_runs, min_run, max_candidates)
    _valid(cached, prompt, got, min_run)


def test_an_edit_in_the_middle_of_a_long_prompt():
    """An agent's context with one function edited mid-way and a think block stripped: the prefix up to
    the edit and everything after it are reused; only the edited and inserted tokens are not."""
    rng = np.random.default_rng(0)
    cached = rng.integers(0, 151_000, 131_072).tolist()
    prompt = cached[:50_000] + [7, 8, 9] * 20 + cached[50_010:90_000] + cached[94_000:]  # stripped 4,000
    runs = plan_reuse(cached, prompt)
    assert runs == [Run(0, 0, 50_000), Run(50_010, 50_060, 39_990), Run(94_000, 90_050, 37_072)]
    assert reused_tokens(runs) == len(prompt) - 60


def test_identical_and_unrelated_prompts():
    tokens = list(range(1000))
    assert plan_reuse(tokens, tokens) == [Run(0, 0, 1000)]
    assert plan_reuse(tokens, tokens[:300]) == [Run(0, 0, 300)]
    assert plan_reuse(tokens, [5000 + t for t in tokens]) == []
    assert plan_reuse([], tokens) == [] and plan_reuse(tokens, []) == []


def test_repetitive_text_tries_a_bounded_number_of_places():
    """The same token 20,000 times: every prompt position matches everywhere; the plan still takes the
    longest match among the first candidates and is valid."""
    cached = [1] * 20_000
    prompt = [2] * 100 + [1] * 20_000
    runs = plan_reuse(cached, prompt, max_candidates=4)
    assert runs == [Run(0, 100, 20_000)]


def test_bad_arguments():
    for kw in ({"min_run": 0}, {"max_runs": -1}, {"max_candidates": 0}):
        with pytest.raises(ValueError):
            plan_reuse([1], [1], **kw)


def test_which_plans_fit_a_recurrent_state():
    """fits_recurrent: the last moved run must end where the cached tokens end (the recurrent state is the one
    after them), or one token short where the prompt's last token is the cached last one and its logits are
    known (that token then moves too)."""
    cached = list(range(100))
    edited = cached[:20] + [900, 901] + cached[20:]  # an insertion: the prompt ends as the cached tokens do
    runs = plan_reuse(cached, edited[:-1], min_run=8)
    assert runs[-1].src + runs[-1].length == len(cached) - 1
    assert fits_recurrent(runs, cached, edited, end_known=True)
    assert not fits_recurrent(runs, cached, edited, end_known=False)
    longer = edited + [902, 903]  # the prompt goes on past the cached tokens: the run ends with them
    runs = plan_reuse(cached, longer[:-1], min_run=8)
    assert runs[-1].src + runs[-1].length == len(cached)
    assert fits_recurrent(runs, cached, longer, end_known=False)
    replied = cached + [950] * 10  # cached: the prompt and a reply; the edited prompt ends before the reply
    runs = plan_reuse(replied, edited[:-1], min_run=8)
    assert not fits_recurrent(runs, replied, edited, end_known=True)
    assert not fits_recurrent(
        plan_reuse(cached, cached[:50], min_run=8), cached, cached[:51], True
    )  # no move
