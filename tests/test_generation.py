"""The decoding loop on a tiny random qwen4_exp: greedy decoding equals transformers' ``generate`` and token
log-probabilities its log-softmax; stop strings, max_tokens, context limits, streaming, prefix reuse, shared
prompts, sessions and cancellation behave as documented.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import ContextOverflowError, Session

torch.set_num_threads(1)

OVERRIDES = {"indexer_n_heads": 8, "output_gate_type": "sigmoid", "indexer_budget": 256}
GREEDY = {"temperature": 0.0}
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model, tiny_model

    tmp = tmp_path_factory.mktemp("gen")
    save_tiny_model(tmp / "hf", 3, **OVERRIDES)
    # the f32 cache computes what transformers computes (the default i8: tests/model/test_kv_cache_types.py)
    model = regolith.Model.load(convert(tmp / "hf", tmp / "tiny.gguf", "f32"), n_ctx=256, kv_type="f32")
    return model, tiny_model(3, **OVERRIDES)


def test_greedy_equals_transformers_generate(tiny):
    model, ref = tiny
    ids = model.tokenize(PROMPT)
    gen = model.generate(ids, 24, stream=True, **GREEDY)
    text = "".join(gen)
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([ids]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=sorted(model.tokenizer.eog_ids),
        )[0, len(ids) :].tolist()
    eog = model.tokenizer.eog_ids
    want = out[: next((i for i, t in enumerate(out) if t in eog), len(out))]
    assert gen.tokens == want
    assert text == model.detokenize(want)
    assert gen.finish_reason == ("stop" if len(want) < 24 else "length")
    assert gen.stats.generated_tokens == len(want) and gen.stats.prompt_tokens == len(ids)


def test_stream_pieces_join_to_the_text(tiny):
    model, _ = tiny
    whole = model.generate(PROMPT, 30, **GREEDY)
    gen = model.generate(PROMPT, 30, stream=True, **GREEDY)
    pieces = list(gen)
    assert "".join(pieces) == whole == gen.text
    assert all(pieces)


def test_stop_strings_cut_before_the_stop(tiny):
    model, _ = tiny
    full = model.generate(PROMPT, 40, **GREEDY)
    assert len(full) > 12
    stop = full[6:10]
    cut = full[: full.index(stop)]
    gen = model.generate(PROMPT, 40, stop=[stop, "\x00never"], stream=True, **GREEDY)
    pieces = list(gen)
    assert "".join(pieces) == cut and gen.finish_reason == "stop"
    assert not any(stop in p for p in pieces)


def test_max_tokens_and_context_limits(tiny):
    model, _ = tiny
    gen = model.generate(PROMPT, 5, stream=True, **GREEDY)
    list(gen)
    assert len(gen.tokens) <= 5
    if len(gen.tokens) == 5:
        assert gen.finish_reason == "length"
    assert model.generate(PROMPT, 0, **GREEDY) == ""

    ids = model.tokenize(PROMPT)
    w = model.window(len(ids) + 3)
    gen = model.start(ids, window=w, max_tokens=50, **GREEDY)
    list(gen)
    assert len(ids) + len(gen.tokens) <= len(ids) + 3
    with pytest.raises(ContextOverflowError):
        list(model.start(ids, window=model.window(len(ids)), max_tokens=4, **GREEDY))
    with pytest.raises(ValueError, match="max_tokens"):
        model.generate(PROMPT, -1)
    with pytest.raises(ValueError, match="empty"):
        model.generate([], 4)


def test_seeded_sampling_is_reproducible(tiny):
    model, _ = tiny
    a = model.generate(PROMPT, 20, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=11)
    b = model.generate(PROMPT, 20, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=11)
    assert a == b


def test_prefix_reuse_evaluates_only_new_tokens(tiny):
    model, _ = tiny
    w = model.window()
    first = model.tokenize(PROMPT)
    g1 = model.start(first, window=w, max_tokens=4, **GREEDY)
    list(g1)
    before = w.n_evaluated
    second = first + g1.tokens + model.tokenize(" x = 1", add_special=False)
    g2 = model.start(second, window=w, max_tokens=4, **GREEDY)
    list(g2)
    # The window held the first prompt and every generated token but the last (never evaluated).
    held = len(first) + len(g1.tokens) - 1
    assert g2.stats.cached_tokens == held
    assert w.n_evaluated - before == (len(second) - held) + max(len(g2.tokens) - 1, 0)


def test_a_prompt_that_leaves_the_window_is_evaluated_as_on_a_new_window(tiny):
    """A prompt sharing only its first tokens with a recurrent window cannot cut the window back without
    replaying them; it is evaluated from its start, so its logits do not depend on what the window held."""
    from regolith.generation import prefill

    model, _ = tiny
    held = model.tokenize(PROMPT)
    prompt = held[:3] + model.tokenize(" x = [1, 2]", add_special=False)
    w = model.window()
    w.eval(held[:2])
    for t in held[2:]:
        w.eval([t])
    before = w.n_evaluated
    logits, reused = prefill(w, prompt)
    want, _ = prefill(model.window(), prompt)
    assert reused == 0 and w.n_evaluated - before == len(prompt) and w.tokens == prompt
    np.testing.assert_array_equal(logits, want)


def test_truncate_without_kv_history_replays(tiny):
    model, _ = tiny
    ids = model.tokenize(PROMPT)
    w = model.window()
    w.eval(ids)
    w.truncate(3)  # qwen4exp's recurrent state cannot be cut: the window replays the kept tokens
    assert w.tokens == ids[:3]
    fresh = model.window()
    fresh.eval(ids[:3])
    np.testing.assert_array_equal(w.eval(ids[3:]), fresh.eval(ids[3:]))
    with pytest.raises(ValueError, match="truncate"):
        w.truncate(len(ids) + 1)


def test_session_prefills_only_each_turns_new_tokens(tiny):
    model, _ = tiny
    s = Session(model, system="be brief", max_tokens=6, **GREEDY)
    first = s.send("hello", stream=True)
    "".join(first)
    held = s.window.tokens
    # The window holds the first prompt and the reply's tokens but the last (sampled, never evaluated).
    assert held == first.prompt + first.tokens[:-1]
    n1 = s.window.n_evaluated
    second = s.send("more", stream=True)
    reply2 = "".join(second)
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert s.messages[-1]["content"] == reply2
    # Turn 2's prompt continues the exact tokens of turn 1, so all the window held is reused ...
    assert second.prompt[: len(held)] == held and second.stats.cached_tokens == len(held)
    # ... and it evaluated only the rest of its prompt, then each generated token but the last.
    assert s.window.n_evaluated - n1 == len(second.prompt) - len(held) + max(len(second.tokens) - 1, 0)
    # The prompt is the chat template's text of the conversation.
    assert model.detokenize(second.prompt) == model.chat_template.render(s.messages[:-1])


def test_cancel_records_the_partial_reply(tiny):
    model, _ = tiny
    s = Session(model, max_tokens=30, **GREEDY)
    gen = s.send("hi", stream=True)
    first = next(gen, "")
    gen.close()
    assert gen.finish_reason in ("cancelled", "stop", "length")
    assert s.messages[-1] == {"role": "assistant", "content": gen.text}
    assert gen.text.startswith(first)


def test_logprobs_match_transformers(tiny):
    """Generated and prompt tokens' log-probabilities are the log-softmax of the model's raw logits at their
    positions (sampled with a temperature and the end tokens banned by logit_bias, neither of which they
    see): transformers' float64 log-softmax of its own logits."""
    model, ref = tiny
    ids = model.tokenize(PROMPT)
    no_end = {t: -math.inf for t in model.tokenizer.eog_ids}
    gen = model.start(
        ids,
        window=model.window(),
        max_tokens=12,
        temperature=1.5,
        seed=3,
        logit_bias=no_end,
        logprobs=3,
        prompt_logprobs=2,
    )
    "".join(gen)
    seq = ids + gen.tokens
    with torch.no_grad():
        logits = ref(torch.tensor([seq])).logits[0].double()
    want = torch.log_softmax(logits, dim=-1).numpy()
    assert gen.prompt_logprobs[0] is None and len(gen.prompt_logprobs) == len(ids)
    assert len(gen.logprobs) == len(gen.tokens) == 12
    entries = [*gen.prompt_logprobs[1:], *gen.logprobs]
    for pos, e in enumerate(entries):  # entry pos is token pos + 1, predicted by the logits at pos
        assert e.token == seq[pos + 1]
        assert abs(e.logprob - want[pos, e.token]) < 1e-5
        k = 2 if pos < len(ids) - 1 else 3
        assert len(e.top) == k and [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)
        np.testing.assert_allclose([lp for _, lp in e.top], np.sort(want[pos])[::-1][:k], atol=1e-5)
    assert any(e.token != e.top[0][0] for e in gen.logprobs)  # sampled, not greedy


def test_released_tokens_cover_the_text_yielded(tiny):
    model, _ = tiny
    tok = model.tokenizer
    gen = model.start(
        model.tokenize(PROMPT), max_tokens=40, temperature=1.0, seed=5, stop=["\n\n"], logprobs=0
    )
    text = ""
    for piece in gen:
        text += piece
        covered = b"".join(tok.token_bytes(t, special=False) for t in gen.tokens[: gen.released_tokens])
        assert text.startswith(covered.decode("utf-8", "replace"))
    assert gen.released_tokens == len(gen.tokens) == len(gen.logprobs)


def test_shared_prompt_is_evaluated_once_for_several_generations(tiny):
    """Choices restore the first one's state of the prompt (qwen4exp's recurrent state cannot be cut back) and
    are what independent generations on fresh windows are."""
    from regolith.generation import SharedPrompt

    model, _ = tiny
    ids = model.tokenize(PROMPT)
    w, shared = model.window(), SharedPrompt()
    got = []
    for seed in (1, 2, 3):
        before = w.n_evaluated
        g = model.start(ids, window=w, max_tokens=10, temperature=1.0, seed=seed, shared=shared, logprobs=1)
        got.append(("".join(g), g.tokens, g.logprobs, g.stats.cached_tokens))
        prompt_evals = w.n_evaluated - before - max(len(g.tokens) - 1, 0)
        assert prompt_evals == (len(ids) if seed == 1 else 0)
    for seed, (text, tokens, logprobs, cached) in zip((1, 2, 3), got, strict=True):
        g = model.start(ids, window=model.window(), max_tokens=10, temperature=1.0, seed=seed, logprobs=1)
        assert ("".join(g), g.tokens, g.logprobs) == (text, tokens, logprobs)
        assert cached == (0 if seed == 1 else len(ids))


def test_windows_made_in_one_thread_evaluate_in_others(tiny):
    """The server's threads: a model loaded in one thread (the main one, which then runs nothing), a window made
    and cut back in another (a worker), evaluated by a third (the step scheduler's), then by a fourth, gives
    what one thread gives. A GPU backend must not leave a thread holding its graph capture when a call returns
    (cuda: a deadlock, first from the window calls, then from what loading recorded)."""
    import threading

    from regolith.server.scheduler import StepScheduler

    model = regolith.Model.load(tiny[0].path, n_ctx=256, kv_type="f32")
    ids = model.tokenize(PROMPT)
    scheduler = StepScheduler()
    scheduler.start()
    made: dict[str, object] = {}
    got: list[str] = []

    def alone() -> None:
        got.append("".join(model.start(ids, window=model.window(), max_tokens=8, **GREEDY)))

    def make() -> None:
        w = made["window"] = model.window()
        w.eval(ids[:3], all_logits=False)
        w.truncate(2)

    def generate() -> None:
        w = made["window"]
        w.stepper = scheduler
        scheduler.enter()
        try:
            got.append("".join(model.start(ids, window=w, max_tokens=8, **GREEDY)))
        finally:
            scheduler.leave()

    try:
        for target in (make, generate, alone, generate):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            t.join(120)
            assert not t.is_alive(), f"{target.__name__} did not finish: the threads deadlocked"
    finally:
        scheduler.stop()
    assert len(got) == 3 and got[0] == got[1] == got[2] and got[0]
