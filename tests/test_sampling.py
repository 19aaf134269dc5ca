"""regolith.sampling against a float64 numpy reference of the pipeline, written here from its definition
(docstring of regolith/sampling.py), and against the published xoshiro256** / splitmix64 algorithms."""

from __future__ import annotations

import math
import pickle
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from regolith import SamplingError
from regolith.sampling import Sampler, SamplingParams

EPS = float(np.finfo(np.float32).eps)  # one float32 ulp at 1: twice the rounding error of one operation
TINY = float(np.finfo(np.float32).smallest_subnormal)  # the rounding error of results below the normal range


@dataclass
class Reference:
    """The reference distribution; where float32 rounding may move top_p's cut by a token or two, one
    distribution per cut it may land on."""

    alternatives: list[tuple[np.ndarray, np.ndarray]]  # (float64 probs (n,), allowed |regolith - probs|)
    ambiguous: bool  # a token order, argmax or min_p decision lies within float32 rounding of its threshold


def reference(logits: np.ndarray, params: SamplingParams, history=(), banned=()) -> Reference | None:
    """The sampling distribution in float64, or None when no token is left.

    The bounds follow regolith's float32 arithmetic: each float32 operation may be off by EPS times its
    result; exp within 1 ulp; the probabilities then by the largest relative weight error among the kept
    tokens (normalisation) plus their own.
    """
    n = len(logits)
    x = logits.astype(np.float64)
    w = x.copy()
    err = np.zeros(n)  # bound on |float32 w - w|
    bias = np.zeros(n)
    for t, b in params.logit_bias.items():
        w[t] += b
        bias[t] = b
        err[t] += EPS * (abs(b) + abs(w[t])) + TINY if np.isfinite(w[t]) else 0  # float32(b), then the add
    w[list(banned)] = -np.inf
    last = params.penalty_last_n
    window = list(history) if last == -1 else list(history)[max(0, len(history) - last) :] if last else []
    counts = Counter(window)
    for t, c in counts.items():
        if not np.isfinite(w[t]):
            continue
        rp = params.repeat_penalty
        w[t], err[t] = (w[t] / rp, err[t] / rp) if w[t] > 0 else (w[t] * rp, err[t] * rp)
        err[t] += EPS * abs(w[t]) + TINY
        sub = c * params.frequency_penalty + params.presence_penalty
        w[t] -= sub
        err[t] += (
            EPS * (2 * c * abs(params.frequency_penalty) + 2 * abs(params.presence_penalty) + abs(w[t]))
            + TINY
        )
    finite = np.isfinite(w)
    if not finite.any():
        return None
    # Tokens computed by identical float32 operations tie exactly in both; other near-equal pairs may flip.
    cnt = np.zeros(n)
    cnt[list(counts)] = list(counts.values())
    key = np.stack([x, bias, cnt, np.isin(np.arange(n), banned)], axis=1)

    def flips(kept, dropped, value: np.ndarray, bound: np.ndarray) -> bool:
        """Whether some kept token and some dropped one may swap order in float32."""
        kept, dropped = np.asarray(kept, dtype=np.int64), np.asarray(dropped, dtype=np.int64)
        if kept.size == 0 or dropped.size == 0:
            return False
        hi, lo = (value + bound)[dropped].max(), (value - bound)[kept].min()
        i = kept[(value - bound)[kept] <= hi][:, None]
        j = dropped[(value + bound)[dropped] >= lo][None, :]
        same = (key[i] == key[j]).all(axis=-1)
        return bool((~same & (np.abs(value[i] - value[j]) <= bound[i] + bound[j])).any())

    order = np.flatnonzero(finite)
    order = order[np.lexsort((order, -w[order]))]
    if params.temperature == 0:
        top = order[0]
        probs = np.zeros(n)
        probs[top] = 1
        return Reference([(probs, np.zeros(n))], flips([top], order[1:], w, err))

    t = params.temperature
    m = order[0]
    d = np.where(finite, (w - w[m]) / t, -np.inf)
    err_d = np.where(finite, (err + err[m]) / t + 2 * EPS * np.abs(np.nan_to_num(d, neginf=0)), 0)
    rel_e = err_d + EPS  # relative error bound of each weight exp(d)
    ambiguous = False
    keep = order
    if 0 < params.top_k < len(keep):
        ambiguous |= flips(keep[: params.top_k], keep[params.top_k :], d, err_d)
        keep = keep[: params.top_k]
    e = np.exp(d)
    cuts = [len(keep)]
    if params.top_p < 1:
        # Prefix lengths L whose mass reaches top_p while that of L - 1 does not, within rounding.
        cum = np.cumsum(e[keep]) / e[keep].sum()
        slack = 2 * rel_e[keep].max() * cum + 1e-12
        reaches = cum >= params.top_p - slack
        short_before = np.concatenate([[True], cum[:-1] < params.top_p + slack[:-1]])
        cuts = list(np.flatnonzero(reaches & short_before) + 1)
        ambiguous |= any(flips(keep[:cut], keep[cut:], d, err_d) for cut in cuts)
    alternatives = []
    for cut in cuts:
        kept = keep[:cut]
        if params.min_p > 0:
            ratio = e[kept]  # p / p_max: the best token has e = 1
            near = np.abs(ratio - params.min_p) <= (rel_e[kept] + EPS) * np.maximum(ratio, params.min_p)
            ambiguous |= bool(near.any())
            kept = kept[ratio >= params.min_p]
        probs = np.zeros(n)
        probs[kept] = e[kept] / e[kept].sum()
        alternatives.append((probs, probs * (rel_e + rel_e[kept].max() + 1e-12) + 1e-30))
    return Reference(alternatives, ambiguous)


def _check_matches(logits, params, history=(), banned=()) -> Reference | None:
    ref = reference(np.asarray(logits, dtype=np.float32), params, history, banned)
    s = Sampler(params, len(logits))
    s.set_history(history)
    if ref is None:
        with pytest.raises(SamplingError, match="no token left"):
            s.probabilities(logits, banned)
        return None
    if ref.ambiguous:
        return ref
    got = s.probabilities(logits, banned)
    misses = [np.flatnonzero(np.abs(got - probs) > tol) for probs, tol in ref.alternatives]
    if all(bad.size for bad in misses):
        bad = misses[0][:8]
        raise AssertionError(f"tokens {bad}: got {got[bad]}, reference {ref.alternatives[0][0][bad]}")
    assert got[s.sample(logits, banned)] > 0
    return ref


finite32 = st.floats(-30, 30, width=32)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 40))
    values = finite32 if draw(st.booleans()) else st.sampled_from([-2.0, -0.5, 0.0, 1.0, 1.0, 3.0])
    logits = np.array(draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float32)
    for i in draw(st.lists(st.integers(0, n - 1), max_size=2)):
        logits[i] = -np.inf
    ids = st.integers(0, n - 1)
    params = SamplingParams(
        temperature=draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0.05, 3.0))),
        top_k=draw(st.integers(0, n + 2)),
        top_p=draw(st.one_of(st.just(1.0), st.floats(0.01, 1.0))),
        min_p=draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0))),
        repeat_penalty=draw(st.one_of(st.just(1.0), st.floats(0.5, 2.0))),
        presence_penalty=draw(st.one_of(st.just(0.0), st.floats(-1.0, 2.0))),
        frequency_penalty=draw(st.one_of(st.just(0.0), st.floats(-1.0, 2.0))),
        penalty_last_n=draw(st.integers(-1, 8)),
        logit_bias=draw(st.dictionaries(ids, st.one_of(st.floats(-5, 5), st.just(-math.inf)), max_size=3)),
        seed=draw(st.integers(0, 2**64 - 1)),
    )
    history = draw(st.lists(ids, max_size=12))
    banned = draw(st.lists(ids, max_size=3))
    return logits, params, history, banned


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(case=cases())
def test_distribution_matches_numpy_reference(case):
    logits, params, history, banned = case
    ref = _check_matches(logits, params, history, banned)
    assume(ref is None or not ref.ambiguous)


def _big_logits(seed: int, n: int = 262144) -> np.ndarray:
    """A vocabulary-sized vector shaped like a language model's: a broad bulk and a few strong candidates.
    Values are on a 1/64 grid, so near-equal logits are exactly equal (ties broken by id everywhere) or far
    apart compared with float32 rounding; a continuous bulk would make top_p's cut order-ambiguous."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(-2.0, 2.5, n)
    logits[rng.choice(n, 30, replace=False)] += rng.uniform(8, 20, 30)
    return (np.round(logits * 64) / 64).astype(np.float32)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"top_p": 0.95},
        {"temperature": 0.7, "top_p": 0.9, "min_p": 0.02},
        {"temperature": 1.5, "top_p": 0.95},
        {"top_k": 40, "top_p": 0.95},
        {"min_p": 0.05},
        {"temperature": 0.0},
        {"top_k": 262144, "top_p": 0.5},
    ],
    ids=str,
)
def test_gemma_sized_vocabulary_matches_numpy_reference(kw):
    logits = _big_logits(1)
    history = list(np.argsort(logits)[-10:])
    params = SamplingParams(repeat_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.1, seed=5, **kw)
    ref = _check_matches(logits, params, history, banned=[int(np.argmax(logits))])
    assert not ref.ambiguous


def test_ties_go_to_the_lowest_ids():
    n = 262144
    flat = np.zeros(n, dtype=np.float32)
    p = Sampler(SamplingParams(top_p=0.5), n).probabilities(flat)
    np.testing.assert_array_equal(np.flatnonzero(p), np.arange(n // 2))
    assert np.all(p[: n // 2] == 1 / (n // 2))
    logits = np.array([1, 3, 3, 2, 3], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0), 5).sample(logits) == 1
    assert Sampler(SamplingParams(temperature=0), 5).sample(logits, banned=[1]) == 2
    p = Sampler(SamplingParams(top_k=2), 5).probabilities(logits)
    np.testing.assert_array_equal(p, [0, 0.5, 0.5, 0, 0])


def test_greedy_is_argmax_after_bias_and_bans():
    rng = np.random.default_rng(3)
    for _ in range(50):
        logits = rng.normal(0, 2, 1000).astype(np.float32)
        bias = {
            int(i): float(b)
            for i, b in zip(rng.choice(1000, 5, replace=False), rng.normal(0, 3, 5), strict=True)
        }
        banned = [int(i) for i in rng.choice(1000, 3, replace=False)]
        expect = logits.astype(np.float64)
        for i, b in bias.items():
            expect[i] += b
        expect[banned] = -np.inf
        s = Sampler(SamplingParams(temperature=0, logit_bias=bias), 1000)
        assert s.sample(logits, banned) == int(np.argmax(expect))


def test_penalties_as_defined():
    logits = np.array([3.0, -3.0, 1.0, 0.5, 2.0], dtype=np.float32)
    history = [0, 1, 1, 2, 4, 1, 3]
    for last_n in (-1, 0, 1, 3, 100):
        params = SamplingParams(
            repeat_penalty=1.5, presence_penalty=0.25, frequency_penalty=0.5, penalty_last_n=last_n
        )
        assert not _check_matches(logits, params, history).ambiguous
    # By hand: the window [1, 3] (last 2): token 1 (-3) -> -4.5 - 0.75, token 3 (0.5) -> 0.333 - 0.75.
    params = SamplingParams(
        repeat_penalty=1.5, presence_penalty=0.25, frequency_penalty=0.5, penalty_last_n=2
    )
    s = Sampler(params, 5)
    s.set_history(history)
    w = np.array([3.0, -4.5 - 0.75, 1.0, 0.5 / 1.5 - 0.75, 2.0])
    np.testing.assert_allclose(s.probabilities(logits), np.exp(w) / np.exp(w).sum(), rtol=1e-6)


def test_extreme_penalties_saturate():
    """A repeat penalty so small that a divided logit passes float's range saturates at its largest value
    (before, the logit became +inf and sampling failed); banned tokens stay banned."""
    logits = np.array([1.0, 2.0, -1.0, 3.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=1e-300, frequency_penalty=-2.0), 4)
    s.set_history([0, 2, 3])
    assert s.sample(logits, banned=[3]) == 0
    p = s.probabilities(logits, banned=[3])
    assert np.isfinite(p).all() and p[0] == 1.0 and p[3] == 0.0
    s = Sampler(SamplingParams(repeat_penalty=1e300, presence_penalty=1e300), 4)
    s.set_history([1])
    p = s.probabilities(logits)
    assert np.isfinite(p).all() and p[1] < 1e-30


def test_accept_extends_the_history_like_set_history():
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 1, 50).astype(np.float32)
    history = [int(i) for i in rng.integers(0, 50, 30)]
    params = SamplingParams(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=8)
    a, b = Sampler(params, 50), Sampler(params, 50)
    a.set_history(history[:10])
    for t in history[10:]:
        a.accept(t)
    b.set_history(history)
    np.testing.assert_array_equal(a.probabilities(logits), b.probabilities(logits))
    b.set_history([])
    np.testing.assert_array_equal(b.probabilities(logits), Sampler(params, 50).probabilities(logits))


def _xoshiro256ss(seed: int):
    """xoshiro256** 1.0 seeded by splitmix64, transcribed from https://prng.di.unimi.it/."""
    mask = (1 << 64) - 1

    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & mask

    s = []
    for _ in range(4):
        seed = (seed + 0x9E3779B97F4A7C15) & mask
        z = seed
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        s.append(z ^ (z >> 31))
    while True:
        result = (rotl((s[1] * 5) & mask, 7) * 9) & mask
        t = (s[1] << 17) & mask
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        yield result


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_draws_follow_xoshiro256ss(seed):
    # 2^16 equal weights: the draw is floor(u * 2^16) with u = (x >> 11) / 2^53, i.e. x >> 48.
    n = 1 << 16
    s = Sampler(SamplingParams(seed=seed), n)
    flat = np.zeros(n, dtype=np.float32)
    got = [s.sample(flat) for _ in range(200)]
    gen = _xoshiro256ss(seed)
    assert got == [next(gen) >> 48 for _ in range(200)]


def test_same_seed_same_tokens_and_reseed():
    logits = _big_logits(2, 5000)
    params = SamplingParams(temperature=1.2, top_p=0.98, seed=42)
    a, b = Sampler(params, 5000), Sampler(params, 5000)
    first = [a.sample(logits) for _ in range(300)]
    assert first == [b.sample(logits) for _ in range(300)]
    c = Sampler(SamplingParams(temperature=1.2, top_p=0.98, seed=43), 5000)
    assert first != [c.sample(logits) for _ in range(300)]
    a.reseed(42)
    assert first == [a.sample(logits) for _ in range(300)]
    assert len(set(first)) > 5
    assert pickle.loads(pickle.dumps(params)) == params
    unseeded = Sampler(SamplingParams(), 10)
    assert 0 <= unseeded.seed < 2**64


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    torch = pytest.importorskip("torch")
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


@pytest.mark.parametrize(
    "n, kw",
    [
        (40, {"temperature": 0.9, "top_p": 0.9, "min_p": 0.03}),
        (300, {"temperature": 2.0}),
        (60, {"top_k": 25}),
    ],
    ids=["truncated", "dense", "top_k"],
)
def test_draws_follow_the_distribution(n, kw):
    """25k draws with a fixed seed against the reported distribution; threshold fixed beforehand."""
    rng = np.random.default_rng(n)
    logits = rng.uniform(0, 3, n).astype(np.float32)
    s = Sampler(SamplingParams(seed=7, **kw), n)
    probs = s.probabilities(logits)
    draws = np.array([s.sample(logits) for _ in range(25_000)])
    counts = np.bincount(draws, minlength=n)
    kept = probs > 0
    assert counts[~kept].sum() == 0
    assert (probs[kept] * len(draws)).min() >= 5  # the chi-square approximation holds
    assert _chi_square_p(counts[kept].astype(np.float64), probs[kept]) > 1e-6


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"presence_penalty": math.nan}, "presence_penalty"),
        ({"frequency_penalty": math.inf}, "frequency_penalty"),
        ({"penalty_last_n": -2}, "penalty_last_n"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {3: math.inf}}, "logit_bias"),
        ({"logit_bias": {3: math.nan}}, "logit_bias"),
        ({"logit_bias": {3: 1e39}}, "float32"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
    ],
    ids=str,
)
def test_invalid_params(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_errors():
    s = Sampler(SamplingParams(), 4)
    ok = np.zeros(4, dtype=np.float32)
    with pytest.raises(SamplingError, match="token 2 is NaN"):
        s.sample(np.array([0, 1, np.nan, 0], dtype=np.float32))
    with pytest.raises(SamplingError, match=r"token 1 is \+inf"):
        s.probabilities(np.array([0, np.inf, 0, 0], dtype=np.float32))
    with pytest.raises(SamplingError, match="no token left"):
        s.sample(ok, banned=[0, 1, 2, 3])
    with pytest.raises(SamplingError, match="no token left"):
        s.sample(np.full(4, -np.inf, dtype=np.float32))
    with pytest.raises(SamplingError, match="no token left"):
        Sampler(SamplingParams(temperature=0, logit_bias={0: -math.inf}), 1).sample(np.zeros(1))
    with pytest.raises(ValueError, match="shape"):
        s.sample(np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="banned id 4"):
        s.sample(ok, banned=[4])
    with pytest.raises(ValueError, match="history id -1"):
        s.set_history([1, -1])
    with pytest.raises(ValueError, match="token id 9"):
        s.accept(9)
    with pytest.raises(ValueError, match="logit_bias id 4"):
        Sampler(SamplingParams(logit_bias={4: 1.0}), 4)
    with pytest.raises(ValueError, match="n_vocab"):
        Sampler(SamplingParams(), 0)
    assert s.sample(ok.astype(np.float64)) in range(4)
