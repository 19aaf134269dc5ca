"""The OpenAI endpoints through the official ``openai`` SDK against a live server on the real Qwen2.5-Coder-0.5B:
chat (streamed and not), legacy completions, tool calls, tool_choice, JSON output, seeds and stops, models and
authentication. Oracles: the library's own greedy generation and chat-template prompt for the same request."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from tests.server.conftest import API_KEY, MODEL

GREEDY = {"temperature": 0}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def _model(server):
    return server.app.state.server.model


def test_chat_streamed_and_not(client, server):
    messages = [{"role": "user", "content": "Say hello in three words."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **GREEDY)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(_model(server).chat_prompt(messages))
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # greedy: the same reply
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt again: prefix reuse


def test_completions_match_the_library(client, server):
    prompt = "def fibonacci(n):"
    model = _model(server)
    want = "".join(model.start(model.tokenize(prompt), window=model.window(64), max_tokens=8, temperature=0))
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, **GREEDY)
    assert (
        r.choices[0].text == want
        and r.usage.completion_tokens == 8
        and r.choices[0].finish_reason == "length"
    )
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, stream=True, **GREEDY)
    )
    assert streamed == want
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, echo=True, **GREEDY)
    assert echoed.choices[0].text.startswith(prompt)


def test_tool_call_round_trip(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=40, **GREEDY
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    result = {
        "role": "tool",
        "tool_call_id": call.id,
        "content": json.dumps({"temperature_c": 21, "sky": "sunny"}),
    }
    messages += [choice.message.model_dump(exclude_none=True), result]
    r2 = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=8, **GREEDY
    )
    # The second turn's prompt is the template's rendering of the call and its result.
    template_messages = [
        messages[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": result["content"]},
    ]
    assert r2.usage.prompt_tokens == len(_model(server).chat_prompt(template_messages, tools=[WEATHER_TOOL]))
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")

    stream = client.chat.completions.create(
        model=MODEL, messages=messages[:1], tools=[WEATHER_TOOL], max_tokens=40, stream=True, **GREEDY
    )
    chunks = list(stream)
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_tool_choice_named_and_none(client):
    joke = [{"role": "user", "content": "Tell me a joke."}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL, messages=joke, tools=[WEATHER_TOOL], tool_choice=named, max_tokens=16, **GREEDY
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=MODEL, messages=weather, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=6, **GREEDY
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


def test_json_output(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Alice is 30 years old. Extract her name and age."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        max_tokens=40,
        **GREEDY,
    )
    assert json.loads(r.choices[0].message.content) == {"name": "Alice", "age": 30}
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        response_format={"type": "json_object"},
        max_tokens=40,
        temperature=1.0,
        seed=3,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forced_tool_calls_validate_against_their_schemas(client, seed):
    """tool_choice 'required' (and a named tool) on a request that does not call for a tool: the reply is one
    call of an offered tool whose arguments the jsonschema package accepts (the call is kept to its schema)."""
    jsonschema = pytest.importorskip("jsonschema")
    joke = [{"role": "user", "content": "Tell me a joke."}]
    tools = [WEATHER_TOOL, ADD_TOOL]
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        r = client.chat.completions.create(
            model=MODEL,
            messages=joke,
            tools=tools,
            tool_choice=choice,
            max_tokens=60,
            temperature=1.0,
            seed=seed,
        )
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        (call,) = r.choices[0].message.tool_calls
        if isinstance(choice, dict):
            assert call.function.name == "add"
        schema = next(t for t in tools if t["function"]["name"] == call.function.name)["function"][
            "parameters"
        ]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_grammar_field(client, server):
    """llama-server's ``grammar`` (GBNF; Lark too) constrains a chat reply and a completion; a grammar that
    does not parse is a 400 naming the field."""
    yes_no = 'root ::= ("yes" | "no") "."'
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        max_tokens=10,
        extra_body={"grammar": yes_no},
        temperature=1.0,
        seed=1,
    )
    assert r.choices[0].message.content in ("yes.", "no.") and r.choices[0].finish_reason == "stop"
    digits = 'start: /[0-9]{3}/ "-" /[0-9]{4}/'
    r = client.completions.create(
        model=MODEL,
        prompt="Call me at",
        max_tokens=20,
        extra_body={"grammar": digits},
        temperature=1.0,
        seed=2,
    )
    text = r.choices[0].text
    assert len(text) == 8 and text[3] == "-" and (text[:3] + text[4:]).isdigit(), text
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"grammar": "root ::= foo"}
        )
    assert e.value.body["param"] == "grammar" and "foo" in e.value.body["message"]


def test_seed_and_stop(client):
    messages = [{"role": "user", "content": "Write a short poem about rain."}]
    a, b = (
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=1.0, seed=42)
        for _ in range(2)
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **GREEDY)
    text = full.choices[0].message.content
    stop = text.split()[1]
    cut = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stop=[stop], **GREEDY)
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_models_aliases_and_authentication(client, server):
    assert [m.id for m in client.models.list()] == [MODEL, "gpt-4o-mini"]
    r = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=1, **GREEDY
    )
    assert r.model == "gpt-4o-mini"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "Hi"}])
    assert "qwen" in e.value.message
