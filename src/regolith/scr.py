"""Suffix cache reuse (issue 25), its plan step: which runs of a new prompt a window's cached tokens already
hold, so that only the gaps between them need evaluating.

A coding agent resends its conversation with a file edited in the middle or an earlier ``<think>`` block
stripped: everything after the first changed token differs in position, not in content. :func:`plan_reuse`
finds the longest common prefix (reused as it is) and then up to ``max_runs`` further runs of the prompt
that equal runs of the cached tokens, in order in both. Moving a run's attention keys to their new positions
and carrying the recurrent state across the gaps are the relocation step's; this module is pure.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_RUNS", "MIN_RUN", "Run", "fits_recurrent", "plan_reuse", "reused_tokens"]

# Tokens a run must have beyond the prefix: a shorter match saves less than relocating it costs, and short
# matches are mostly accidental (a repeated line).
MIN_RUN = 32
# Runs after the prefix a plan takes at most.
MAX_RUNS = 8
# Occurrences of a prompt position's first MIN_RUN tokens in the cached list that are tried at most: keeps
# the plan's time linear in the prompt on repetitive text.
MAX_CANDIDATES = 64


@dataclass(frozen=True)
class Run:
    """``prompt[dst : dst + length] == cached[src : src + length]``."""

    src: int
    dst: int
    length: int


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, compared in growing blocks (a long match
    costs its length, a short one little)."""
    n, done, step = min(len(a), len(b)), 0, 64
    while done < n:
        end = min(n, done + step)
        diff = np.flatnonzero(a[done:end] != b[done:end])
        if diff.size:
            return done + int(diff[0])
        done, step = end, step * 2
    return n


def plan_reuse(
    cached: Sequence[int],
    prompt: Sequence[int],
    *,
    max_runs: int = MAX_RUNS,
    min_run: int = MIN_RUN,
    max_candidates: int = MAX_CANDIDATES,
) -> list[Run]:
    """The runs of ``prompt`` that ``cached`` holds, in increasing order in both and not overlapping:

    1. the longest common prefix, ``Run(0, 0, n)``, when ``n > 0``;
    2. then, scanning the prompt from the end of the last run, the first position at which at least
       ``min_run`` tokens equal tokens of ``cached`` at or after the end of the last run there; at that
       position the longest such match (the earliest in ``cached`` among equally long ones), of the first
       ``max_candidates`` places after that end where its first ``min_run`` tokens occur. Up to ``max_runs``
       such runs.

    Time: about linear in the two lengths (each prompt position looks its first ``min_run`` tokens up in a
    hash index of ``cached``; matches are compared with numpy).
    """
    if min_run < 1 or max_runs < 0 or max_candidates < 1:
        raise ValueError("min_run and max_candidates must be >= 1 and max_runs >= 0")
    c = np.asarray(cached, dtype=np.int64).ravel()
    p = np.asarray(prompt, dtype=np.int64).ravel()
    runs: list[Run] = []
    head = _common(c, p)
    if head:
        runs.append(Run(0, 0, head))
    if max_runs == 0 or len(c) - head < min_run or len(p) - head < min_run:
        return runs
    grams = np.lib.stride_tricks.sliding_window_view(c[head:], min_run)
    where: dict[bytes, list[int]] = {}
    for j, gram in enumerate(grams, start=head):
        where.setdefault(gram.tobytes(), []).append(j)
    src, i = head, head
    while i + min_run <= len(p) and len(runs) < max_runs + (head > 0):
        places = where.get(p[i : i + min_run].tobytes())
        if places:
            first = bisect.bisect_left(places, src)
            best_len, best_j = 0, -1
            for j in places[first : first + max_candidates]:
                n = min_run + _common(c[j + min_run :], p[i + min_run :])
                if n > best_len:
                    best_len, best_j = n, j
            if best_len:
                runs.append(Run(best_j, i, best_len))
                src, i = best_j + best_len, i + best_len
                continue
        i += 1
    return runs


def reused_tokens(runs: Sequence[Run]) -> int:
    """Prompt tokens a plan reuses."""
    return sum(r.length for r in runs)


def fits_recurrent(
    runs: Sequence[Run], cached: Sequence[int], prompt: Sequence[int], end_known: bool
) -> bool:
    """Whether a plan of ``prompt[:-1]`` against ``cached`` suits a recurrent state (Gated DeltaNet), whose
    only state is the one after all of ``cached``: true when its last moved run ends where ``cached`` ends (the
    state has then last read what precedes the tokens evaluated after the run), or one token short of that
    where the prompt's last token is ``cached``'s last and the logits after it are known (``end_known``): that
    token then moves too and its logits are those known. Otherwise the tokens after the last run would be
    read by a state that has read other text last."""
    moved = [r for r in runs if r.dst > 0]
    if not moved:
        return False
    last = moved[-1]
    end = last.src + last.length
    if end == len(cached):
        return True
    return bool(
        end_known
        and end == len(cached) - 1
        and last.dst + last.length == len(prompt) - 1
        and prompt[-1] == cached[-1]
    )
