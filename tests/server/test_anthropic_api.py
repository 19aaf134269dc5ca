"""The Anthropic Messages endpoints through the official ``anthropic`` SDK against a live server on the real
Qwen2.5-Coder-0.5B: messages (streamed and not, with the full event sequence), tool_use / tool_result, stop
sequences, count_tokens, authentication, and a hard thinking budget on a chat template that thinks."""

from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic")

from tests.server.conftest import API_KEY, MODEL

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
THINK_SYSTEM = "Think step by step, then give the answer after </think>."
# This SDK has no sampling arguments (newer Claude models fix them); the server still reads them from the body.
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is 17 + 25? Answer with the number."}]


def _client(live):
    return anthropic.Anthropic(base_url=live.url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    return _client(server)


def _model(live):
    return live.app.state.server.model


def test_messages_streamed_and_not(client, server):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hello in three words."}]}]
    kw = {
        "model": MODEL,
        "max_tokens": 8,
        "extra_body": GREEDY,
        "system": "You are terse.",
        "messages": messages,
    }
    m = client.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    prompt = _model(server).chat_prompt(
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello in three words."},
        ]
    )
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == len(prompt)
    assert 0 < m.usage.output_tokens <= 8

    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [
        e.type
        for e in events
        if e.type
        in (
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        )
    ]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert final.content[0].text == m.content[0].text  # greedy: the same reply
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_tool_use_round_trip(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(
        model=MODEL, max_tokens=40, extra_body=GREEDY, tools=[WEATHER_TOOL], messages=messages
    )
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")

    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C, sunny"}],
        },
    ]
    m2 = client.messages.create(
        model=MODEL, max_tokens=8, extra_body=GREEDY, tools=[WEATHER_TOOL], messages=messages
    )
    assert m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = client.messages.count_tokens(model=MODEL, tools=[WEATHER_TOOL], messages=messages)
    as_template = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "name": "get_weather", "content": "21 C, sunny"},
    ]
    openai_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER_TOOL["description"],
            "parameters": WEATHER_TOOL["input_schema"],
        },
    }
    assert counted.input_tokens == len(_model(server).chat_prompt(as_template, tools=[openai_tool]))
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == counted.input_tokens

    with client.messages.stream(
        model=MODEL, max_tokens=40, extra_body=GREEDY, tools=[WEATHER_TOOL], messages=messages[:1]
    ) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [
        ("tool_use", "get_weather", {"city": "Paris"})
    ]
    assert final.stop_reason == "tool_use"


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_use_matches_the_input_schema(client, choice):
    """tool_choice any / tool on a request that does not call for a tool: a tool_use block whose input the
    jsonschema package accepts."""
    jsonschema = pytest.importorskip("jsonschema")
    m = client.messages.create(
        model=MODEL,
        max_tokens=60,
        tools=[WEATHER_TOOL],
        tool_choice=choice,
        messages=[{"role": "user", "content": "Tell me a joke."}],
        extra_body=GREEDY,
    )
    assert m.stop_reason == "tool_use", m.content
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER_TOOL["input_schema"])


def test_stop_sequences_and_authentication(client, server):
    kw = {
        "model": MODEL,
        "max_tokens": 8,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "Count: 1, 2, 3,"}],
    }
    text = client.messages.create(**kw).content[0].text
    stop = text.strip()[1:3]
    m = client.messages.create(**kw, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[: text.index(stop)]
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(**kw)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"


def _thinking_tokens(live, thinking: str) -> int:
    return len(_model(live).tokenize(thinking, add_special=False))


def test_thinking_budget_is_a_hard_cap(thinking_server):
    budget = 6
    client = _client(thinking_server)
    m = client.messages.create(
        model=MODEL,
        max_tokens=24,
        extra_body=GREEDY,
        system=THINK_SYSTEM,
        thinking={"type": "enabled", "budget_tokens": budget},
        messages=QUESTION,
    )
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert 0 < _thinking_tokens(thinking_server, m.content[0].thinking) <= budget
    assert m.content[1].text.strip() and m.stop_reason in ("end_turn", "max_tokens")  # the answer came after

    with client.messages.stream(
        model=MODEL,
        max_tokens=24,
        extra_body=GREEDY,
        system=THINK_SYSTEM,
        thinking={"type": "enabled", "budget_tokens": budget},
        messages=QUESTION,
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content
    ]
    assert deltas[0] == "thinking_delta" and "signature_delta" in deltas and deltas[-1] == "text_delta"


def test_thinking_disabled_and_budget_checks(thinking_server):
    client = _client(thinking_server)
    m = client.messages.create(
        model=MODEL, max_tokens=12, extra_body=GREEDY, thinking={"type": "disabled"}, messages=QUESTION
    )
    assert [b.type for b in m.content] == ["text"]  # the template wrote an empty thinking block
    with pytest.raises(anthropic.BadRequestError, match="less than max_tokens"):
        client.messages.create(
            model=MODEL, max_tokens=8, thinking={"type": "enabled", "budget_tokens": 8}, messages=QUESTION
        )
