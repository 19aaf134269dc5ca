"""Token sampling: :class:`SamplingParams` (what to do) and :class:`Sampler` (doing it, in C++).

The pipeline, in order (the reasons are in ``csrc/core/sampler.h``):

1. ``logit_bias`` (added; ``-inf`` bans a token) and the ids banned at this step
2. penalties over the last ``penalty_last_n`` tokens of the history: repetition (a positive logit is divided
   by ``repeat_penalty``, a negative one multiplied, as llama.cpp and CTRL do), then presence and frequency
   (OpenAI: ``logit -= frequency_penalty * count + presence_penalty * (count > 0)``)
3. ``temperature == 0``: the argmax, ties to the lowest id
4. temperature: ``logit / temperature``
5. ``top_k``: the k largest logits, ties to the lower id
6. softmax
7. ``top_p``: tokens by decreasing probability (ties: lower id first); the shortest prefix whose mass is at
   least ``top_p``
8. ``min_p``: drop tokens with ``p < min_p * max(p)``
9. renormalise and draw with the seeded xoshiro256** generator
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import _core

__all__ = ["Sampler", "SamplingParams"]

_U64 = 1 << 64
_F32_MAX = float(np.finfo(np.float32).max)


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token; the defaults sample the model's plain distribution (temperature 1).

    Attributes:
        temperature: >= 0; 0 means greedy (argmax).
        top_k: keep the k most likely tokens; 0 = off.
        top_p: keep the most likely tokens up to this cumulative probability, in (0, 1]; 1 = off.
        min_p: drop tokens less likely than min_p times the most likely one, in [0, 1]; 0 = off.
        repeat_penalty: > 0; a positive logit of a token in the recent history is divided by it, a negative
            one multiplied; 1 = off.
        presence_penalty: subtracted once from the logit of every token in the recent history.
        frequency_penalty: subtracted per occurrence in the recent history.
        penalty_last_n: how many of the latest history tokens the penalties look at; -1 = all, 0 = none.
        logit_bias: token id -> value added to its logit; ``-math.inf`` bans the token (kept as a copy; treat
            it as read-only).
        seed: seed of the random generator; None draws one from the operating system.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: Mapping[int, float] = field(default_factory=dict, hash=False)
    seed: int | None = None

    def __post_init__(self) -> None:
        reals = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
        for name in reals:
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("top_k", "penalty_last_n"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        if self.penalty_last_n < -1:
            raise ValueError(f"penalty_last_n must be >= -1 (-1 = whole history), got {self.penalty_last_n}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < _U64):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.logit_bias, Mapping):
            raise TypeError(f"logit_bias must be a mapping of token id -> bias, got {type(self.logit_bias)}")
        bias: dict[int, float] = {}
        for token, value in self.logit_bias.items():
            if not _is_int(token) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not _is_real(value) or math.isnan(value) or value == math.inf:
                raise ValueError(f"logit_bias[{token}] must be finite or -inf, got {value!r}")
            if -math.inf < value and abs(value) > _F32_MAX:
                raise ValueError(f"logit_bias[{token}] = {value} is outside the float32 range")
            bias[int(token)] = float(value)
        object.__setattr__(self, "logit_bias", bias)


def _ids(values: Sequence[int] | np.ndarray, n_vocab: int, what: str) -> np.ndarray:
    ids = np.asarray(values)
    if ids.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got shape {ids.shape}")
    if ids.size == 0:
        return np.zeros(0, dtype=np.int32)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{what} must be integer token ids, got {ids.dtype}")
    bad = (ids < 0) | (ids >= n_vocab)
    if bad.any():
        raise ValueError(f"{what} id {int(ids[bad][0])} is outside the vocabulary of {n_vocab}")
    return np.ascontiguousarray(ids, dtype=np.int32)


class Sampler:
    """Draws token ids from logits with :class:`SamplingParams`; keeps the penalty history and the random
    state. ``seed`` is the seed in use (drawn from the operating system when ``params.seed`` is None). Not
    thread-safe: use one per generation.

    Raises ValueError for a logit_bias id outside the vocabulary.
    """

    def __init__(self, params: SamplingParams, n_vocab: int):
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if not _is_int(n_vocab) or not 1 <= n_vocab < 2**31:
            raise ValueError(f"n_vocab must be an integer in [1, 2**31), got {n_vocab!r}")
        for token in params.logit_bias:
            if token >= n_vocab:
                raise ValueError(f"logit_bias id {token} is outside the vocabulary of {n_vocab}")
        self.params = params
        self.n_vocab = int(n_vocab)
        self.seed: int = params.seed if params.seed is not None else secrets.randbits(64)
        self._s = _core.Sampler(
            self.n_vocab,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p,
            repeat_penalty=params.repeat_penalty,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            penalty_last_n=params.penalty_last_n,
            logit_bias=sorted(params.logit_bias.items()),
            seed=self.seed,
        )

    def _logits(self, logits: np.ndarray) -> np.ndarray:
        x = np.asarray(logits)
        if x.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {x.shape}")
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise ValueError(f"logits must be real numbers, got {x.dtype}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def sample(self, logits: np.ndarray, banned: Sequence[int] = ()) -> int:
        """A token id drawn from ``logits`` (shape (n_vocab,), converted to float32); ``banned`` ids are
        excluded at this step only. The token is not added to the history: call :meth:`accept`.

        Raises :class:`regolith.SamplingError` when a logit is NaN or +inf or no token is left (every one
        banned or -inf), ValueError for a wrong shape or an id outside the vocabulary.
        """
        return self._s.sample(self._logits(logits), _ids(banned, self.n_vocab, "banned"))

    def probabilities(self, logits: np.ndarray, banned: Sequence[int] = ()) -> np.ndarray:
        """The float64 distribution (n_vocab,) :meth:`sample` draws from for the same arguments (one-hot when
        greedy). Same errors as :meth:`sample`; does not advance the random generator."""
        return self._s.probabilities(self._logits(logits), _ids(banned, self.n_vocab, "banned"))

    def accept(self, token: int) -> None:
        """Append ``token`` to the history the penalties look at."""
        if not _is_int(token) or not 0 <= token < self.n_vocab:
            raise ValueError(f"token id {token!r} is outside the vocabulary of {self.n_vocab}")
        self._s.accept(int(token))

    def set_history(self, ids: Sequence[int] | np.ndarray) -> None:
        """Replace the history with ``ids`` (the prompt and the tokens generated so far, e.g. after a
        rollback)."""
        self._s.set_history(_ids(ids, self.n_vocab, "history"))

    def reseed(self, seed: int) -> None:
        """Restart the random generator from ``seed``."""
        if not (_is_int(seed) and 0 <= seed < _U64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        self._s.reseed(self.seed)
