"""Token log-probabilities: what a model's logits say of the tokens that follow, as the OpenAI API's
``logprobs`` report them.

A token's log-probability is the log-softmax of the model's raw logits at its position: before the sampler's
logit bias, penalties, temperature, top-k / top-p / min-p, bans and grammar masks (vLLM's default,
``raw_logprobs``), so it says what the model thinks of the token whatever the request's sampling did. It is
computed in float64 over the whole vocabulary, stably (the largest logit subtracted before ``exp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TokenLogprob", "log_softmax", "token_logprob"]


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability at its position, and the ``top`` most likely tokens there: ``(id, logprob)``
    pairs, most likely first (ties: lower id first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax of ``logits`` over its last axis (the vocabulary)."""
    x = np.asarray(logits, dtype=np.float64)
    return x - _logsumexp(x)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis of float64 ``x``, kept as an axis; the largest value subtracted
    first, so that no exp overflows."""
    top = x.max(axis=-1, keepdims=True)
    shifted = x - top
    np.exp(shifted, out=shifted)
    return top + np.log(shifted.sum(axis=-1, keepdims=True))


def token_logprob(logits: np.ndarray, token: int, top: int = 0) -> TokenLogprob:
    """The log-probability of ``token`` under ``logits`` (one position's, shape (n_vocab,)) and the ``top``
    most likely tokens."""
    x = np.asarray(logits)
    lse = float(_logsumexp(x.astype(np.float64))[0])
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:  # the order of the logits is the order of the log-probabilities
        k = min(top, x.size)
        kth = np.partition(x, x.size - k)[x.size - k]  # the k-th largest value
        above = np.flatnonzero(x > kth)
        ids = np.concatenate([above, np.flatnonzero(x == kth)[: k - above.size]])
        ids = ids[np.lexsort((ids, -x[ids]))]
        best = tuple((int(i), float(x[i]) - lse) for i in ids)
    return TokenLogprob(int(token), float(x[token]) - lse, best)
