"""gpt-oss's harmony format through both APIs: a live server on a stand-in model (gpt-oss's real chat
template, the byte-level harmony vocabulary of test_harmony.py) whose replies the tests script, each token
checked against the request's guide (forced tokens win, as in generation). Through the official ``openai``
and ``anthropic`` SDKs: reasoning as ``reasoning_content`` / thinking blocks, answers, tool calls and
``finish_reason``, streamed and not (the streamed reply joins to the whole one), a malformed call, the next
turn's prompt, a forced call, JSON output, the thinking budget and the request errors."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from regolith.server import ServerConfig, create_app
from regolith.server.grammar import GrammarGuide
from regolith.server.thinking import ThinkingBudget
from tests.server.conftest import API_KEY, MODEL, LiveServer
from tests.server.test_harmony import CALL, WEATHER_TOOL, HarmonyModel

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|end|><|start|>assistant<|channel|>final<|message|>"
WEATHER_CALL = ANALYSIS + "Need the weather.<|end|><|start|>assistant" + CALL + "<|call|>"
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


class _Stats:
    def __init__(self, n_prompt: int):
        self.prompt_tokens, self.cached_tokens, self.generated_tokens = n_prompt, 0, 0
        self.prefill_seconds = self.decode_seconds = 0.0
        self.prefill_tokens_per_second = self.decode_tokens_per_second = 0.0
        self.decode_rounds = self.drafted_tokens = self.accepted_tokens = 0


class ScriptedGeneration:
    """A reply that writes ``script``'s tokens, unless the guide forces others: then it writes those and goes
    on after where the script has them (a budget's forced closing skips the rest of the thinking). Each
    written token must be one the guide allows. Ends at an end-of-generation token or ``max_tokens``."""

    def __init__(self, tok, prompt, script, guide, max_tokens):
        self._tok, self._guide, self._max = tok, guide, max_tokens
        self._script = tok.encode(script, add_special=False)
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.end_token: int | None = None
        self.logprobs = self.prompt_logprobs = None
        self.released_tokens = 0
        self.stats = _Stats(len(prompt))
        self._steps = self._run()

    def _next(self, pos: int, run: list[int]) -> tuple[int | None, int, list[int]]:
        """(next token or None at the end, the script position after it, the forced tokens off the script)."""
        script, guide = self._script, self._guide
        forced = guide.forced(self.tokens) if guide is not None else None
        if forced is not None:
            if not run and pos < len(script) and script[pos] == forced:
                return forced, pos + 1, run
            return forced, pos, [*run, forced]
        if run:  # back on the script, after the forced tokens
            found = [i for i in range(pos, len(script)) if script[i : i + len(run)] == run]
            pos = found[0] + len(run) if found else len(script)
        if pos >= len(script):
            return None, pos, []
        token = script[pos]
        assert guide is None or guide.allows(self.tokens, token), (self._tok.decode(self.tokens), token)
        return token, pos + 1, []

    def _run(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pos, run = 0, []
        while len(self.tokens) < self._max:
            token, pos, run = self._next(pos, run)
            if token is None:
                break
            self.tokens.append(token)
            self.released_tokens = self.stats.generated_tokens = len(self.tokens)
            if token in self._tok.eog_ids:
                self.finish_reason, self.end_token = "stop", token
                return
            piece = decoder.decode(self._tok.token_bytes(token, special=False))
            self.text += piece
            if piece:
                yield piece
        self.finish_reason = "length" if len(self.tokens) >= self._max else "stop"

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()
        if self.finish_reason is None:
            self.finish_reason = "cancelled"


class ScriptedModel(HarmonyModel):
    """The stand-in gpt-oss: each generation writes the next of :attr:`scripts`; :attr:`seen` keeps each
    one's prompt text and guide."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.seen: list[tuple[str, object]] = []

    def window(self):
        return SimpleNamespace(tokens=[], stepper=None, stepped=False)

    def start(self, prompt, *, guide=None, max_tokens, **options):
        self.seen.append((self.tokenizer.decode(prompt), guide))
        return ScriptedGeneration(self.tokenizer, prompt, self.scripts.pop(0), guide, max_tokens)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = LiveServer(
        create_app(ScriptedModel(), ServerConfig(model_name=MODEL, api_key=API_KEY, timeout=30))
    )
    yield server
    server.close()


@pytest.fixture
def model(live) -> ScriptedModel:
    model = live.app.state.server.model
    model.scripts.clear()
    model.seen.clear()
    return model


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def claude(live):
    return anthropic.Anthropic(base_url=live.url, api_key=API_KEY, max_retries=0, timeout=30)


def _chat(client, model, script, *, stream=False, **kwargs):
    """The reply to ``script`` as (reasoning, content, [(name, arguments)], finish_reason)."""
    model.scripts.append(script)
    kwargs = {"model": MODEL, "messages": QUESTION, "max_tokens": 400, **kwargs}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        reasoning = (choice.message.model_extra or {}).get("reasoning_content")
        return reasoning, choice.message.content, calls, choice.finish_reason
    reasoning, content, calls, finish = "", "", [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        calls += [(c.function.name, json.loads(c.function.arguments)) for c in delta.tool_calls or []]
        finish = chunk.choices[0].finish_reason or finish
    return reasoning or None, content or None, calls, finish


@pytest.mark.parametrize("stream", [False, True])
def test_openai_reasoning_answer_and_tool_calls(client, model, stream):
    answer = ANALYSIS + "The user asks about weather; no tool needed.\n" + FINAL + "It is sunny.<|return|>"
    assert _chat(client, model, answer, stream=stream) == (
        "The user asks about weather; no tool needed.\n",
        "It is sunny.",
        [],
        "stop",
    )
    got = _chat(client, model, WEATHER_CALL, stream=stream, tools=[WEATHER_TOOL])
    assert got == ("Need the weather.", None, [("get_weather", {"city": "Paris"})], "tool_calls")
    # a preamble on the commentary channel is content; a call with bad JSON is content as written
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" + CALL + "<|call|>"
    got = _chat(client, model, preamble, stream=stream, tools=[WEATHER_TOOL])
    assert got == (None, "Checking.", [("get_weather", {"city": "Paris"})], "tool_calls")
    bad = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Paris}<|call|>"
    got = _chat(client, model, bad, stream=stream, tools=[WEATHER_TOOL])
    assert got == (None, bad.removesuffix("<|call|>"), [], "stop")


def test_next_turn_renders_the_reasoning_and_the_call(client, model):
    model.scripts.append(WEATHER_CALL)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=400)
    message = r.choices[0].message.model_dump(exclude_none=True)
    call_id = message["tool_calls"][0]["id"]
    result = {"role": "tool", "tool_call_id": call_id, "content": '{"temp_c": 21}'}
    turn = [*QUESTION, message, result]
    assert _chat(client, model, ANALYSIS + "Got it." + FINAL + "21C.", messages=turn)[1:] == (
        "21C.",
        [],
        "stop",
    )
    prompt, _ = model.seen[-1]
    assert prompt.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temp_c\\": 21}"<|end|>'
        "<|start|>assistant"
    )


def test_openai_forced_call_json_output_and_effort(client, model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    got = _chat(
        client,
        model,
        'get_weather <|constrain|>json<|message|>{"city": "Oslo"}',
        tools=[WEATHER_TOOL],
        tool_choice=named,
    )
    assert got == (None, None, [("get_weather", {"city": "Oslo"})], "tool_calls")
    prompt, guide = model.seen[-1]
    assert prompt.endswith("<|start|>assistant<|channel|>commentary to=functions.")
    assert isinstance(guide, GrammarGuide)

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    script = ANALYSIS + "17 + 25 = 42." + FINAL + '{"n": 42}'  # the grammar ends the reply
    for stream in (False, True):
        got = _chat(client, model, script, stream=stream, response_format=fmt)
        assert got == ("17 + 25 = 42.", '{"n": 42}', [], "stop")
        assert isinstance(model.seen[-1][1], GrammarGuide)

    _chat(client, model, ANALYSIS + "x" + FINAL + "y", reasoning_effort="high")
    assert "\nReasoning: high\n" in model.seen[-1][0]
    _chat(
        client,
        model,
        ANALYSIS + "x" + FINAL + "y",
        extra_body={"chat_template_kwargs": {"reasoning_effort": "medium"}},
    )
    assert "\nReasoning: medium\n" in model.seen[-1][0]
    with pytest.raises(openai.BadRequestError, match="use one of low, medium, high"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, reasoning_effort="minimal")
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs may not set tools"):
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, extra_body={"chat_template_kwargs": {"tools": []}}
        )


def _blocks(message) -> list[tuple[str, object]]:
    out = []
    for b in message.content:
        value = {"thinking": getattr(b, "thinking", None), "text": getattr(b, "text", None)}.get(b.type)
        out.append(
            (b.type, value if value is not None else (getattr(b, "name", None), getattr(b, "input", None)))
        )
    return out


def test_anthropic_thinking_text_and_tool_use(claude, model):
    answer = ANALYSIS + "Simple." + FINAL + "Sunny."
    for script, tools, want, stop in (
        (answer, [], [("thinking", "Simple."), ("text", "Sunny.")], "end_turn"),
        (
            WEATHER_CALL,
            [{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}],
            [("thinking", "Need the weather."), ("tool_use", ("get_weather", {"city": "Paris"}))],
            "tool_use",
        ),
    ):
        kwargs = {"model": MODEL, "max_tokens": 400, "messages": QUESTION, "tools": tools}
        model.scripts.append(script)
        m = claude.messages.create(**kwargs)
        assert _blocks(m) == want and m.stop_reason == stop
        model.scripts.append(script)
        with claude.messages.stream(**kwargs) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
        assert _blocks(final) == want and final.stop_reason == stop
        assert deltas[0] == "thinking_delta" and "signature_delta" in deltas


def test_anthropic_thinking_budget_and_disabled(claude, model):
    model.scripts.append(ANALYSIS + "x" * 50 + FINAL + "42")
    m = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        thinking={"type": "enabled", "budget_tokens": 10},
        messages=QUESTION,
    )
    assert _blocks(m) == [("thinking", "x" * 10), ("text", "42")]  # one token per byte: 10 tokens
    assert isinstance(model.seen[-1][1], ThinkingBudget)
    model.scripts.append(ANALYSIS + "Short." + FINAL + "Hi.")
    m = claude.messages.create(model=MODEL, max_tokens=200, thinking={"type": "disabled"}, messages=QUESTION)
    assert _blocks(m) == [("thinking", "Short."), ("text", "Hi.")]  # gpt-oss always reasons: at low effort
    assert "\nReasoning: low\n" in model.seen[-1][0]
