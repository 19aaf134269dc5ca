"""Speculative decoding: drafters propose tokens, the model verifies them in one evaluation, and a cost gate
decides each round how many to draft (zero included).

A round evaluates ``[token, d1 .. dk]`` at once (``k <= 7``: at most 8 tokens, the CPU kernels' decode
batch) and keeps every row's logits. Generation then samples position by position exactly as without
speculation, from those rows: while the sampled token equals the draft, the next row is already computed;
at the first difference the window is cut back (KV by truncation, recurrent and PLE states from the
window's checkpoint slots) and the next round starts from the sampled token.

Why this is exact. Every token is drawn from the target model's own distribution given the actual prefix,
so the output distribution is the target's; greedy output is token-identical, and with a seed even sampled
output is (the random generator advances once per token either way). For a deterministic drafter this *is*
speculative sampling (Leviathan et al. 2023, Chen et al. 2023) with a point-mass draft ``q = delta_d``: the
draft is accepted with probability ``min(1, p(d) / q(d)) = p(d)``, and a rejected position is resampled from
``max(0, p - q)`` normalised, which is ``p`` restricted to tokens other than ``d`` — the law of a sample from
``p`` given that it is not ``d``. All of regolith's drafters are deterministic (the suffix drafter, the MTP
head's greedy drafts).

The gate (:class:`CostGate`) keeps measured seconds per evaluation of n tokens, each drafter's seconds per
proposed token, and acceptance rates (the suffix drafter's by match length, others' by draft position), and
picks the draft length ``k`` maximising expected tokens per second
``E(k) / (T_eval(k + 1) + T_draft(k) + E(k) T_catch)`` with ``E(k) = 1 + sum_i prod_{j <= i} a_j``; ``k = 0``
is plain decoding. ``T_catch`` is a drafter's seconds per token it must take in before its next draft (the
MTP head runs over every token decoded since its last draft): a cost per decoded token while it drafts, timed
apart from drafting, so that a generation's first draft, which takes in the whole prompt, does not price the
head's drafts. On a streaming MoE model an evaluation's time is kept in two parts, computing and waiting for
expert reads (the arena's stall clock): a verification reads the union of its tokens' experts, so a length
not yet measured is assumed to wait for as many reads per extra token as one plain token did.

Acceptance depends on the text: the gate's counts over all of a model's generations (the pool) are the prior
for a generation's own record, worth ``CostGate.POOL_TRIES`` of its tries.

Declining costs next to nothing: the prompt is indexed when the speculator is made (with the prompt's
evaluation), and after the gate declines, the next 1, 2, 4, ... up to ``MAX_BACKOFF`` tokens are evaluated
without planning or timing (up to as many as keep planning within ``PLAN_SHARE`` of the decode time, where a
plain step is short; a generation starts with the backoff the model's last one reached); each only tells the
suffix drafter its token (one C++ call returning the match length), and a match whose key has earned
``WAKE_ACCEPTANCE`` ends the backoff, so a copy that starts then is drafted from its first tokens.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import _core
from ._atomic import atomic_path

if TYPE_CHECKING:
    from .window import Window

__all__ = [
    "MAX_DRAFT",
    "CostGate",
    "Drafter",
    "Record",
    "Speculation",
    "Speculator",
    "SuffixDrafter",
    "speculation",
]

# Draft tokens per round: the round evaluates 1 + MAX_DRAFT <= 8 tokens.
MAX_DRAFT = 7
# Re-measure plain decoding after this many rounds without one (costs drift as the context grows).
REMEASURE_ROUNDS = 64
# After a round the gate decides not to draft, skip planning for 1, 2, 4, ... at most this many tokens (more
# where planning is slow next to a plain step: PLAN_SHARE): on text where nothing pays, speculation then costs
# next to nothing per token.
MAX_BACKOFF = 16
# Planning a round is Python between two evaluations, tens of microseconds with the caches cold after an
# evaluation: where the plain step is short (a tiny model's quarter of a millisecond), the backoff grows past
# MAX_BACKOFF until plans cost at most this share of the decode time they cover, up to LONGEST_BACKOFF tokens.
PLAN_SHARE = 0.005
LONGEST_BACKOFF = 256
# A skipped token ends the backoff when a drafter's key for drafting now (the suffix drafter's match length)
# has at least this acceptance: a long copy that starts while the gate is backing off is drafted from its
# first tokens, not up to MAX_BACKOFF tokens later.
WAKE_ACCEPTANCE = 0.75
# A remembered gate (CostGate.remember) is saved when a generation ends, at most this often.
SAVE_SECONDS = 10.0
GATE_FORMAT = "regolith-cost-gate/1"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Speculation:
    """How generation speculates.

    Attributes:
        draft_max: most draft tokens per round, 0..7 (a round evaluates at most 8 tokens); 0 turns
            speculation off.
        drafters: who proposes: ``"suffix"`` (continuations of repeated text in the prompt and the reply),
            ``"mtp"`` (the model's MTP head, when it has one), or :class:`Drafter` objects.
        gate: True: the cost model picks each round's draft length, zero included; False: always draft as
            many tokens as the drafter proposes, up to ``draft_max`` (for measurements and tests).
        min_match: the suffix drafter proposes only from a repeated suffix of at least this many tokens.
    """

    draft_max: int = MAX_DRAFT
    drafters: tuple[str | Drafter, ...] = ("suffix", "mtp")
    gate: bool = True
    min_match: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.draft_max, int) or not 0 <= self.draft_max <= MAX_DRAFT:
            raise ValueError(f"draft_max must be an integer in [0, {MAX_DRAFT}], got {self.draft_max!r}")
        if not isinstance(self.min_match, int) or self.min_match < 1:
            raise ValueError(f"min_match must be a positive integer, got {self.min_match!r}")
        drafters = tuple(self.drafters)
        for d in drafters:
            if isinstance(d, str) and d not in ("suffix", "mtp"):
                raise ValueError(f"unknown drafter {d!r} (expected 'suffix', 'mtp' or a Drafter)")
            if not isinstance(d, str) and not hasattr(d, "propose"):
                raise ValueError(f"drafter {d!r} has no propose() method")
        object.__setattr__(self, "drafters", drafters)


def speculation(value: bool | str | Speculation | None) -> Speculation | None:
    """The :class:`Speculation` a ``speculative=`` argument means: True / None / ``"auto"`` / ``"on"`` the
    gated default, False / ``"off"`` none, ``"suffix"`` / ``"mtp"`` that drafter alone."""
    if isinstance(value, Speculation):
        return value if value.draft_max > 0 else None
    if value is None or value is True or value in ("auto", "on"):
        return Speculation()
    if value is False or value == "off":
        return None
    if value in ("suffix", "mtp"):
        return Speculation(drafters=(value,))
    raise ValueError(
        f"speculative must be a bool, 'auto', 'off', 'suffix', 'mtp' or a Speculation, got {value!r}"
    )


class Drafter(Protocol):
    """Proposes tokens to follow a sequence. ``name`` labels its statistics. A drafter may also have
    ``key_now(seq) -> key | None``: the key a draft proposed now would start with, cheap enough to be asked on
    every token the gate skips planning for (see ``WAKE_ACCEPTANCE``); and ``catch_up() -> int`` with
    ``lag() -> int``: take in the tokens decoded since its last draft before drafting (returns how many), so
    that the gate times that part apart (``CostGate.observe_catch_up``), and how many that would be now."""

    name: str

    def propose(self, seq: Sequence[int], n: int) -> tuple[list[int], list[Hashable]]:
        """Up to ``n`` tokens to follow ``seq`` (prompt and reply so far; its last token is about to be
        evaluated) and, per token, the key its acceptance rate is tracked under."""
        ...

    def rollback(self, n: int) -> None:
        """The sequence was cut back to its first ``n`` tokens."""
        ...


class SuffixDrafter:
    """Drafts what followed the latest earlier occurrence of the sequence's longest repeated suffix (a suffix
    automaton in C++, ``core/suffix_drafter.h``); keys are ``("suffix", bucket of the match length)``."""

    name = "suffix"
    keyed_by_position = False

    def __init__(self, min_match: int = 1):
        self._d = _core.SuffixDrafter()
        self._min_match = min_match

    @property
    def size(self) -> int:
        """Tokens indexed."""
        return self._d.size

    def index(self, seq: Sequence[int]) -> None:
        """Index ``seq`` (the prompt and reply so far; a prefix of it is indexed already)."""
        size = self._d.size
        if size == len(seq) - 1:
            self._d.push(seq[-1])
        elif size < len(seq):
            self._d.append(np.asarray(seq[size:], dtype=np.int32))

    def propose(self, seq: Sequence[int], n: int) -> tuple[list[int], list[Hashable]]:
        self.index(seq)
        tokens, match = self._d.propose(n, self._min_match)
        # The i-th token continues a match of match + i tokens once the ones before it are accepted.
        lo, hi = min(match, _LONG_MATCH), min(match + len(tokens), _LONG_MATCH)
        return tokens, [*_SUFFIX_KEYS[lo:hi], *[_SUFFIX_KEYS[_LONG_MATCH]] * (len(tokens) - (hi - lo))]

    def key_now(self, seq: Sequence[int]) -> Hashable | None:
        """The key a draft proposed now would start with (None: no match), without proposing."""
        d = self._d
        if d.size == len(seq) - 1:
            match = d.push(seq[-1])  # the common case: one token since the last call
        else:
            self.index(seq)
            match = d.match_len
        return _SUFFIX_KEYS[min(match, _LONG_MATCH)] if match >= self._min_match else None

    def wake_on(self, wakes: Callable[[Hashable], bool]) -> None:
        """Make :meth:`push_wakes` say, per match length, whether ``wakes`` holds for the key a draft at that
        length would start with."""
        self._d.set_wakes([m >= self._min_match and wakes(_SUFFIX_KEYS[m]) for m in range(_LONG_MATCH + 1)])

    def push_wakes(self, seq: Sequence[int]) -> bool:
        """Index ``seq``'s last token (one C++ call when the tokens before it are indexed) and say whether the
        match length now wakes the speculator (:meth:`wake_on`; never before it is called)."""
        d, n = self._d, len(seq) - 1
        woke = d.push_wakes(seq[-1], n)
        if woke < 0:  # out of step with seq: index its tokens before the last first
            if d.size > n:
                d.truncate(n)
            else:
                self.index(seq[:-1])
            woke = d.push_wakes(seq[-1], n)
        return woke > 0

    def rollback(self, n: int) -> None:
        if n < self._d.size:
            self._d.truncate(n)


def _bucket(match: int) -> int:
    """Match lengths 1, 2, 3-4, 5-8, 9-16, 17-32, 33+ -> 0..6."""
    return next((i for i, top in enumerate((1, 2, 4, 8, 16, 32)) if match <= top), 6)


# The suffix drafter's key for each match length, looked up once per planned round instead of bucketed per
# token (planning is on the per-token path); lengths from _LONG_MATCH on share the last bucket.
_LONG_MATCH = 33
_SUFFIX_KEYS = tuple(("suffix", _bucket(m)) for m in range(_LONG_MATCH + 1))


class _MtpDrafter:
    """The model's MTP head, greedy; keys are ``("mtp", depth)``."""

    name = "mtp"
    keyed_by_position = True

    def __init__(self, window: Window):
        self._window = window

    def propose(self, seq: Sequence[int], n: int) -> tuple[list[int], list[Hashable]]:
        tokens = self._window.draft(seq[-1], n)
        return tokens, [("mtp", i) for i in range(len(tokens))]

    def catch_up(self) -> int:
        return self._window.catch_up_draft_head()

    def lag(self) -> int:
        return self._window.draft_head_lag

    def rollback(self, n: int) -> None:
        pass  # the head's state lives in the window


@dataclass
class Record:
    """Accepted and tried draft tokens per acceptance key: a model's over all its generations (``CostGate.pool``)
    or one generation's."""

    hits: dict[Hashable, float] = field(default_factory=dict)
    tries: dict[Hashable, float] = field(default_factory=dict)

    def record(self, key: Hashable, accepted: bool) -> None:
        self.tries[key] = self.tries.get(key, 0.0) + 1.0
        self.hits[key] = self.hits.get(key, 0.0) + float(accepted)


class CostGate:
    """The online cost model: exponential moving averages of evaluation seconds per token count (split into
    computing and waiting for expert reads when the model streams its experts) and of each drafter's seconds
    per drafted token, and acceptance counts per key. Shared by a model's generations.

    ``stall_clock``: the seconds the model has waited for expert reads so far (a streaming MoE model's
    :meth:`regolith.Model` arena), read around each timed evaluation; None when nothing streams."""

    EMA = 0.2
    # A generation's acceptance estimate: its own record, with the model's record over all generations (the
    # pool) worth this many tries of its own. Acceptance depends on the text (a match of 5-8 tokens continues
    # a code copy ~100% of the time, a chat reply's ~50%): the pool alone kept drafting a chat reply at the
    # rate code copies had earned.
    POOL_TRIES = 4.0
    # A draft whose first key has fewer tries than this is verified one token long even where the prior says
    # no: without it a model whose verification costs much more than a plain step (Gemma 3's 262k-row LM head)
    # never learns that a long repeated suffix is accepted 90% of the time. 3 failures bring a key to 1/5.
    EXPLORE_TRIES = 3
    # Until measured, computing n tokens is assumed to cost 1 + 0.1 (n - 1) single-token evaluations (the
    # CPU kernels decode each weight block once for up to 8 tokens); measurements replace it at once.
    PRIOR_SLOPE = 0.1

    def __init__(self, stall_clock: Callable[[], float] | None = None) -> None:
        self.stall_clock = stall_clock
        self.eval_seconds: dict[int, float] = {}
        self.stall_seconds: dict[int, float] = {}  # the part of eval_seconds spent waiting for expert reads
        self.eval_weight: dict[int, float] = {}  # measurements behind each eval_seconds, at most 1 / EMA
        self._fitted: dict[int, float] | None = None  # eval_seconds made non-decreasing in n
        self._costs: list[float] | None = None  # eval_cost(n) for n <= MAX_DRAFT + 1, until a measurement
        self.draft_seconds: dict[str, float] = {}
        self.catch_up_seconds: dict[str, float] = {}  # per token a drafter takes in before drafting
        self.pool = Record()  # acceptance over all the model's generations
        self.rounds_since_plain = 0
        self.plan_seconds: float | None = None  # per planned round, drafters' catch-up excluded
        self.backoff = 0  # the planning backoff the latest generation reached: where the next one starts
        self.path: Path | None = None  # the file :meth:`remember` keeps the gate in
        self._setting: dict[str, Any] = {}
        self._saved_at: float | None = None

    def state(self) -> dict[str, Any]:
        """What the gate has learned, as JSON-ready data (:meth:`restore` takes it back): per evaluated token
        count its seconds, stall seconds and weight; per drafter its seconds per drafted and per caught-up
        token; the pool's hits and tries per key. Keys that are not (name, integer) pairs (a custom
        drafter's) are left out."""
        return {
            "eval": [
                [n, t, self.stall_seconds.get(n, 0.0), self.eval_weight.get(n, 1.0)]
                for n, t in sorted(self.eval_seconds.items())
            ],
            "draft": dict(self.draft_seconds),
            "catch_up": dict(self.catch_up_seconds),
            "pool": [
                [key[0], key[1], self.pool.hits.get(key, 0.0), tries]
                for key, tries in list(self.pool.tries.items())
                if isinstance(key, tuple)
                and len(key) == 2
                and isinstance(key[0], str)
                and type(key[1]) is int
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace what the gate has learned with ``state`` (from :meth:`state`); ValueError, with the gate
        unchanged, if it is not such data."""

        def number(x: Any) -> float:
            if type(x) not in (int, float) or not math.isfinite(x) or x < 0:
                raise ValueError(f"{x!r} is not a non-negative number")
            return float(x)

        def count(x: Any) -> int:
            if type(x) is not int or x < 0:
                raise ValueError(f"{x!r} is not a count")
            return x

        def name(x: Any) -> str:
            if not isinstance(x, str):
                raise TypeError(f"{x!r} is not a drafter's name")
            return x

        def seconds(table: Any) -> dict[str, float]:
            if not isinstance(table, dict):
                raise TypeError("a drafter table is not an object")
            return {name(d): number(t) for d, t in table.items()}

        try:
            evals = {count(n): (number(t), number(s), number(w)) for n, t, s, w in state["eval"]}
            pool = {(name(d), count(i)): (number(h), number(n)) for d, i, h, n in state["pool"]}
            draft, catch_up = seconds(state["draft"]), seconds(state["catch_up"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a cost gate's state: {e}") from None
        if 0 in evals or any(not 0 < w <= 1.0 / self.EMA for _t, _s, w in evals.values()):
            raise ValueError("not a cost gate's state: an evaluation of 0 tokens or a weight out of range")
        if any(h > n for h, n in pool.values()):
            raise ValueError("not a cost gate's state: more hits than tries")
        self.eval_seconds = {n: t for n, (t, _s, _w) in evals.items()}
        self.stall_seconds = {n: s for n, (_t, s, _w) in evals.items()}
        self.eval_weight = {n: w for n, (_t, _s, w) in evals.items()}
        self._fitted = self._costs = None
        self.draft_seconds, self.catch_up_seconds = draft, catch_up
        self.pool = Record({k: h for k, (h, _n) in pool.items()}, {k: n for k, (_h, n) in pool.items()})

    def remember(self, path: str | os.PathLike[str], setting: Mapping[str, Any]) -> bool:
        """Keep the gate in the JSON file ``path`` across processes: take back what it holds if it was saved
        for the same ``setting`` (what the costs depend on: model, backend, device, threads, arena; JSON
        scalars), and save the gate when generations end (:meth:`checkpoint`). A file that cannot be read,
        or holds another setting, is logged and replaced at the next save: it costs exploration, never
        output. True if the gate was restored."""
        self.path, self._setting, self._saved_at = Path(path), dict(setting), None
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as e:
            _log.warning("%s: unreadable (%s); the speculation cost gate starts afresh", path, e)
            return False
        if (
            not isinstance(data, dict)
            or data.get("format") != GATE_FORMAT
            or data.get("setting") != self._setting
        ):
            _log.warning(
                "%s: saved for another format or setting; the speculation cost gate starts afresh", path
            )
            return False
        try:
            self.restore(data.get("state", {}))
        except ValueError as e:
            _log.warning("%s: %s; the speculation cost gate starts afresh", path, e)
            return False
        return True

    def checkpoint(self, *, force: bool = False) -> None:
        """Save the gate to its :meth:`remember` file, if it has one, unless it was saved less than
        ``SAVE_SECONDS`` ago (``force``: whenever). Written atomically; a save that fails (a full disk, a
        read-only directory) is logged and leaves the file as it was."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_SECONDS:
            return
        self._saved_at = now
        text = json.dumps({"format": GATE_FORMAT, "setting": self._setting, "state": self.state()})
        try:
            with atomic_path(self.path) as tmp:
                tmp.write_text(text, encoding="utf-8")
        except OSError as e:
            _log.warning("could not save the speculation cost gate to %s: %s", self.path, e)

    def _moved(self, old: float | None, value: float) -> float:
        """The moving average ``old`` moved toward ``value`` (the first value as it is)."""
        return value if old is None else old + self.EMA * (value - old)

    def _average(self, table: dict, key: Hashable, value: float) -> None:
        """Moves ``table[key]``, the moving average, toward ``value``."""
        table[key] = self._moved(table.get(key), value)

    def observe_eval(self, n: int, seconds: float, stall: float = 0.0) -> None:
        """An evaluation of ``n`` tokens took ``seconds``, ``stall`` of them waiting for expert reads."""
        self._average(self.eval_seconds, n, seconds)
        self.eval_weight[n] = min(self.eval_weight.get(n, 0.0) + 1.0, 1.0 / self.EMA)
        self._fitted = self._costs = None
        self._average(self.stall_seconds, n, stall)
        self.rounds_since_plain = 0 if n == 1 else self.rounds_since_plain + 1

    def observe_draft(self, name: str, n: int, seconds: float) -> None:
        self._average(self.draft_seconds, name, seconds / max(n, 1))

    def observe_catch_up(self, name: str, n: int, seconds: float) -> None:
        """Drafter ``name`` took ``seconds`` to take in ``n`` tokens decoded since its last draft."""
        self._average(self.catch_up_seconds, name, seconds / n)

    def observe_plan(self, seconds: float) -> None:
        """Planning a round (asking the drafters and the cost model, a catch-up excluded) took ``seconds``."""
        self.plan_seconds = self._moved(self.plan_seconds, seconds)

    def longest_backoff(self) -> int:
        """The most tokens to skip planning for after declined rounds: ``MAX_BACKOFF``, or as many as keep
        planning under ``PLAN_SHARE`` of the plain decode time they cover (at most ``LONGEST_BACKOFF``)."""
        t1 = self.eval_cost(1)
        if self.plan_seconds is None or t1 <= 0:
            return MAX_BACKOFF
        return min(max(MAX_BACKOFF, math.ceil(self.plan_seconds / (PLAN_SHARE * t1))), LONGEST_BACKOFF)

    def record(self, key: Hashable, accepted: bool) -> None:
        self.pool.record(key, accepted)

    def acceptance(self, key: Hashable, own: Record | None = None) -> float:
        """The pool's posterior mean acceptance rate under a uniform prior; with ``own`` (a generation's
        record), the posterior mean of its own counts under the pool's rate as a prior worth ``POOL_TRIES``
        tries."""
        pool = (self.pool.hits.get(key, 0.0) + 1.0) / (self.pool.tries.get(key, 0.0) + 2.0)
        if own is None:
            return pool
        return (own.hits.get(key, 0.0) + self.POOL_TRIES * pool) / (own.tries.get(key, 0.0) + self.POOL_TRIES)

    def _monotone(self) -> dict[int, float]:
        """The measured seconds per token count, made non-decreasing in the count by a weighted isotonic fit
        (pool adjacent violators): evaluating more tokens never costs less, and a count measured once at a
        busy moment (3 tokens at 19 ms between 2 at 8 and 4 at 12) would otherwise keep the lengths it prices
        out from being tried again."""
        if self._fitted is None:
            blocks: list[list[float]] = []  # [seconds, weight, how many counts]
            for n in sorted(self.eval_seconds):
                blocks.append([self.eval_seconds[n], self.eval_weight.get(n, 1.0), 1])
                while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                    (t1, w1, c1), (t2, w2, c2) = blocks.pop(-2), blocks.pop()
                    blocks.append([(t1 * w1 + t2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
            values = [t for t, _w, c in blocks for _ in range(c)]
            self._fitted = dict(zip(sorted(self.eval_seconds), values, strict=True))
        return self._fitted

    def eval_cost(self, n: int) -> float:
        """Estimated seconds to evaluate n tokens: measured (made non-decreasing in n), else interpolated
        between measured counts, else extrapolated from the nearest measured count: computing by the prior
        slope, and (streaming) waiting for as many expert reads per extra token as a plain token waits for
        (an upper bound: a round reads the union of its tokens' experts). The counts a round can evaluate
        are estimated together once per measurement: a plan asks for them a dozen times or more."""
        costs = self._costs
        if costs is None:
            costs = self._costs = [self._estimate(m) for m in range(MAX_DRAFT + 2)]
        return costs[n] if 0 <= n < len(costs) else self._estimate(n)

    def _estimate(self, n: int) -> float:
        known = self._monotone()
        if n in known:
            return known[n]
        lo = max((m for m in known if m < n), default=None)
        hi = min((m for m in known if m > n), default=None)
        if lo is not None and hi is not None:
            return known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
        ref = lo if lo is not None else hi if hi is not None else None
        if ref is None:
            return 0.0
        stall = self.stall_seconds[ref]
        compute = (
            max(known[ref] - stall, 0.0)
            * (1 + self.PRIOR_SLOPE * (n - 1))
            / (1 + self.PRIOR_SLOPE * (ref - 1))
        )
        if lo is not None:
            stall += (n - lo) * self.stall_seconds.get(1, 0.0)
        else:
            stall *= n / ref
        return compute + stall

    def round_seconds(self, name: str, k: int, expected: float) -> float:
        """Estimated seconds of a round verifying ``k`` tokens drafted by ``name`` that is expected to decode
        ``expected`` tokens: the evaluation, the drafting and the catch-up those tokens will need."""
        return (
            self.eval_cost(k + 1)
            + self.draft_seconds.get(name, 0.0) * k
            + self.catch_up_seconds.get(name, 0.0) * expected
        )

    def catch_up_pays(self, name: str, lag: int, rate: float, room: int) -> bool:
        """Whether drafter ``name``, expected to make ``rate`` tokens a second (where plain decoding makes
        ``1 / T(1)``), is worth taking in the ``lag`` tokens it has not seen (a generation's first draft: the
        whole prompt): what it saves over the ``room`` tokens generation may still want, drafting from now on,
        must exceed what taking them in costs. Always while its first draft position is being explored or its
        catch-up was never timed."""
        per = self.catch_up_seconds.get(name)
        if per is None or self.pool.tries.get((name, 0), 0.0) < self.EXPLORE_TRIES:
            return True
        saved = room * (self.eval_cost(1) - 1.0 / rate) if rate > 0 else 0.0
        return saved > lag * per

    def may_pay(self, name: str, first_key: Hashable, n: int, own: Record | None = None) -> bool:
        """Whether a draft of up to ``n`` tokens whose first key is ``first_key`` can beat plain decoding, or is
        to be explored (its key has fewer than ``EXPLORE_TRIES`` tries); False until plain decoding is
        measured (and when it is due to be again). Expected tokens ``E(k) <= 1 + a_1 k``, and every round costs
        at least ``T(2) + T_draft + E(k) T_catch``: often nothing can win, and this says so without a draft."""
        if 1 not in self.eval_seconds or self.rounds_since_plain >= REMEASURE_ROUNDS:
            return False
        if self.pool.tries.get(first_key, 0.0) < self.EXPLORE_TRIES:
            return True
        most = 1.0 + self.acceptance(first_key, own) * n
        return most * (self.eval_cost(1) - self.catch_up_seconds.get(name, 0.0)) > self.eval_cost(2) + (
            self.draft_seconds.get(name, 0.0)
        )

    def best_length(self, name: str, keys: Sequence[Hashable], limit: int, own: Record | None = None) -> int:
        """The draft length (0..min(limit, len(keys))) with the most expected tokens per second (acceptance as
        :meth:`acceptance` with ``own``); at least 1 while the first key has fewer than ``EXPLORE_TRIES``
        tries in the pool."""
        n = min(limit, len(keys))
        if n == 0 or not self.may_pay(name, keys[0], n, own):
            return 0
        explore = int(self.pool.tries.get(keys[0], 0.0) < self.EXPLORE_TRIES)
        t1 = self.eval_cost(1)
        best, best_rate = 0, 1.0 / t1 if t1 > 0 else 0.0
        expected, survive = 1.0, 1.0
        for k in range(1, n + 1):
            survive *= self.acceptance(keys[k - 1], own)
            expected += survive
            seconds = self.round_seconds(name, k, expected)
            if seconds > 0 and expected / seconds > best_rate:
                best, best_rate = k, expected / seconds
        return max(best, explore)


@dataclass
class _Pending:
    token: int
    row: np.ndarray
    key: Hashable


class Speculator:
    """The window side of speculative generation; :class:`regolith.generation.Generation` calls
    :meth:`advance` where it would evaluate one token. Counts ``drafted``, ``accepted`` and ``rounds``
    (evaluations while decoding)."""

    def __init__(self, window: Window, prompt: Sequence[int], config: Speculation, gate: CostGate):
        self._window = window
        self._config = config
        self._gate = gate
        self._seq = list(prompt)
        self._drafters: list[Drafter] = []
        for d in config.drafters:
            if d == "suffix":
                self._drafters.append(SuffixDrafter(config.min_match))
            elif d == "mtp":
                if window.has_draft_head:
                    self._drafters.append(_MtpDrafter(window))
            else:
                self._drafters.append(d)  # type: ignore[arg-type]
        for d in self._drafters:
            index = getattr(d, "index", None)
            if index is not None:
                index(self._seq)  # with the prompt's evaluation, not the first decode step
        # Skipped tokens ask the built-in suffix drafter through its wake table, in one C++ call made from
        # advance (Python frames on the per-token path cost microseconds with the caches cold after an
        # evaluation), and other drafters through key_now.
        self._suffix = next((d for d in self._drafters if type(d) is SuffixDrafter), None)
        self._push_wakes = self._suffix._d.push_wakes if self._suffix is not None else None
        self._wakers = [d for d in self._drafters if hasattr(d, "key_now") and d is not self._suffix]
        self._wakes_stale = True  # the suffix drafter's wake table is to be set (again: records changed)
        self._own = Record()  # this generation's acceptance record
        self._wake_keys: dict[Hashable, bool] = {}  # per key: whether it wakes; cleared when records change
        self._pending: list[_Pending] = []
        # Rounds left without planning. Text where nothing paid is likely to go on so: a generation starts where
        # the model's last one left off, its first plan after that backoff (a copy still wakes it at once).
        self._backoff = self._skip = gate.backoff if config.gate else 0
        if self._skip:
            self._arm_wakes()
        self._caught_up = False  # whether the latest plan had a drafter catch up (not timed as planning)
        self.drafted = 0
        self.accepted = 0
        self.rounds = 0

    def advance(self, token: int, room: int) -> np.ndarray:
        """The logits after ``token``, the token just accepted; ``room``: how many more tokens generation may
        still want after it (drafts beyond that are useless)."""
        self._seq.append(token)
        if self._pending:
            head = self._pending.pop(0)
            self._gate.record(head.key, head.token == token)
            self._own.record(head.key, head.token == token)
            self._wake_keys.clear()
            self._wakes_stale = True
            if head.token == token:
                self.accepted += 1
                return head.row
            self._pending.clear()
            self._window.truncate(len(self._seq) - 1)
        if self._skip > 0:  # declined earlier: no planning, no timing, unless a drafter's key now wakes it
            self._skip -= 1
            push = self._push_wakes
            woke = push(token, len(self._seq) - 1) if push is not None else 0
            if woke < 0:  # the suffix drafter is out of step with the sequence
                woke = self._suffix.push_wakes(self._seq)  # type: ignore[union-attr]
            if not woke and not (self._wakers and self._wakes()):
                self.rounds += 1
                return self._window.eval([token], all_logits=False)[0]
            self._skip = 0
        window, gate = self._window, self._gate
        t0 = time.perf_counter()
        k, drafts, keys = self._plan(room)
        if not self._caught_up:
            gate.observe_plan(time.perf_counter() - t0)
        if k == 0 and self._config.gate:
            self._backoff = min(max(1, 2 * self._backoff), gate.longest_backoff())
            self._skip = self._backoff
            self._arm_wakes()
        else:
            self._backoff = 0
        if self._config.gate:
            gate.backoff = self._backoff
        self.rounds += 1
        clock = gate.stall_clock
        s0 = clock() if clock is not None else 0.0
        t0 = time.perf_counter()
        if k == 0:
            logits = window.eval([token], all_logits=False)[0]
            gate.observe_eval(1, time.perf_counter() - t0, (clock() - s0) if clock is not None else 0.0)
            return logits
        window.checkpoint()
        rows = window.eval([token, *drafts[:k]], all_logits=True)
        gate.observe_eval(k + 1, time.perf_counter() - t0, (clock() - s0) if clock is not None else 0.0)
        self.drafted += k
        self._pending = [_Pending(drafts[i], rows[i + 1], keys[i]) for i in range(k)]
        return rows[0]

    def _plan(self, room: int) -> tuple[int, list[int], list[Hashable]]:
        """(draft length, draft tokens, their keys): the gate's best over the drafters."""
        cfg, gate = self._config, self._gate
        limit = min(cfg.draft_max, room, self._window.max_ctx - len(self._seq))
        best: tuple[int, list[int], list[Hashable]] = (0, [], [])
        self._caught_up = False
        if limit <= 0:
            return best
        best_rate = 0.0
        for d in self._drafters:
            n = limit
            key_now = getattr(d, "key_now", None) if cfg.gate else None
            if key_now is not None:
                # The key a draft would start with says, without the draft, whether any length can pay.
                key = key_now(self._seq)
                if key is None or not gate.may_pay(d.name, key, limit, self._own):
                    continue
            elif cfg.gate and getattr(d, "keyed_by_position", True):
                # Drafting costs: ask only for what the drafter's track record by position justifies.
                positions = [(d.name, i) for i in range(limit)]
                n = gate.best_length(d.name, positions, limit, self._own)
                if n == 0:
                    continue
                lag = getattr(d, "lag", None)
                if lag is not None:
                    # Taking in the tokens since its last draft comes first: not when an earlier drafter's
                    # draft is better, nor when the rest of the generation cannot pay for a long lag.
                    rate = self._rate(d.name, positions[:n])
                    if rate <= best_rate or not gate.catch_up_pays(d.name, lag(), rate, room):
                        continue
            catch_up = getattr(d, "catch_up", None)
            if catch_up is not None:
                t0 = time.perf_counter()
                taken = catch_up()
                if taken:
                    gate.observe_catch_up(d.name, taken, time.perf_counter() - t0)
                    self._caught_up = True
            t0 = time.perf_counter()
            tokens, keys = d.propose(self._seq, n)
            tokens, keys = list(tokens)[:n], list(keys)[:n]
            if tokens:
                gate.observe_draft(d.name, len(tokens), time.perf_counter() - t0)
            if not tokens:
                continue
            k = gate.best_length(d.name, keys, len(tokens), self._own) if cfg.gate else len(tokens)
            if k == 0:
                continue
            rate = self._rate(d.name, keys[:k]) if cfg.gate else float(k)
            if rate > best_rate:
                best, best_rate = (k, tokens, keys), rate
        return best

    def _arm_wakes(self) -> None:
        """Set the suffix drafter's wake table, if records changed since it was set (before skipping)."""
        if self._wakes_stale and self._suffix is not None:
            self._suffix.wake_on(self._key_wakes)
            self._wakes_stale = False

    def _wakes(self) -> bool:
        """Whether a drafter other than the built-in suffix drafter (which advance asks through its wake
        table) has a key for drafting now that has earned ``WAKE_ACCEPTANCE`` (checked on skipped tokens)."""
        for d in self._wakers:
            key = d.key_now(self._seq)
            if key is not None and self._key_wakes(key):
                return True
        return False

    def _key_wakes(self, key: Hashable) -> bool:
        wakes = self._wake_keys.get(key)
        if wakes is None:
            wakes = self._wake_keys[key] = self._gate.acceptance(key, self._own) >= WAKE_ACCEPTANCE
        return wakes

    def _rate(self, name: str, keys: Sequence[Hashable]) -> float:
        gate = self._gate
        expected, survive = 1.0, 1.0
        for key in keys:
            survive *= gate.acceptance(key, self._own)
            expected += survive
        seconds = gate.round_seconds(name, len(keys), expected)
        return expected / seconds if seconds > 0 else 0.0

    def rollback(self, n: int) -> None:
        """The sequence (prompt + reply) was cut back to ``n`` tokens (anti-slop); the caller re-evaluates."""
        self._pending.clear()
        del self._seq[n:]
        for d in self._drafters:
            d.rollback(n)

    def finish(self) -> None:
        """Drop verified drafts generation did not use, so the window holds only the prompt and the reply."""
        self._pending.clear()
        keep = len(self._seq)
        if len(self._window.tokens) > keep:
            self._window.truncate(keep)
