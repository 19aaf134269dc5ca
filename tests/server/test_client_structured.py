"""Structured output and forced tool calls through the clients people use, against live servers of the bundled
demo model (a model never trained to write JSON, so only the grammar keeps its replies valid) and of the real
Qwen2.5-Coder-0.5B (its own tool-call format): the OpenAI SDK's ``parse`` with a pydantic model, langchain's
``with_structured_output`` (json_mode, json_schema, function_calling) and ``bind_tools``, and the Anthropic
SDK's forced tool use (``any``, ``tool``) and ``output_config`` JSON schema."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")

from pydantic import BaseModel

import regolith
from regolith.models import resolve_model
from regolith.server import ServerConfig, create_app
from tests.server.conftest import API_KEY, LiveServer
from tests.server.conftest import MODEL as QWEN

MODEL = "demo"


class Person(BaseModel):
    name: str
    age: int


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return "sunny"


@pytest.fixture(scope="module")
def demo_server() -> Iterator[LiveServer]:
    model = regolith.Model.load(resolve_model("regolith-demo"), n_ctx=1024)
    live = LiveServer(create_app(model, ServerConfig(model_name=MODEL, timeout=120)))
    yield live
    live.close()


@pytest.fixture(scope="module", params=["demo", "qwen2.5-coder"])
def live(request) -> tuple[str, str, str]:
    """(URL, model name, API key) of the demo server or of the Qwen one (which needs its weights)."""
    if request.param == "demo":
        return request.getfixturevalue("demo_server").url, MODEL, "x"
    return request.getfixturevalue("server").url, QWEN, API_KEY


def test_openai_sdk_parse(live):
    url, model, key = live
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
    r = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Alice is 30. Who is she?"}],
        response_format=Person,
        temperature=0,
        max_tokens=200,
    )
    assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, Person)
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three colors."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("method", ["json_mode", "json_schema", "function_calling"])
def test_langchain_structured_output(live, method):
    langchain_openai = pytest.importorskip("langchain_openai")
    url, model, key = live
    llm = langchain_openai.ChatOpenAI(
        base_url=url + "/v1",
        api_key=key,
        model=model,
        temperature=0,
        max_retries=0,
        max_tokens=200,
    )
    schema = Person.model_json_schema() if method == "json_mode" else Person
    out = llm.with_structured_output(schema, method=method).invoke("Alice is 30. Extract her name and age.")
    if method == "json_mode":
        assert isinstance(out, dict)
    else:
        assert isinstance(out, Person)


@pytest.mark.parametrize("choice", ["any", "get_weather"])
def test_langchain_bind_tools_forced(live, choice):
    langchain_openai = pytest.importorskip("langchain_openai")
    url, model, key = live
    llm = langchain_openai.ChatOpenAI(
        base_url=url + "/v1",
        api_key=key,
        model=model,
        temperature=0,
        max_retries=0,
        max_tokens=200,
    )
    reply = llm.bind_tools([get_weather], tool_choice=choice).invoke("hello")
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)


def test_anthropic_sdk_forced_tool_use_and_json_output(live):
    anthropic = pytest.importorskip("anthropic")
    url, model, key = live
    greedy = {"temperature": 0}  # this SDK version has no temperature argument
    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)
    tool = {
        "name": "get_weather",
        "description": "Get the weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    hello = [{"role": "user", "content": "hello"}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = client.messages.create(
            model=model, max_tokens=100, tools=[tool], tool_choice=choice, messages=hello, extra_body=greedy
        )
        (use,) = [b for b in m.content if b.type == "tool_use"]
        assert (
            m.stop_reason == "tool_use" and use.name == "get_weather" and isinstance(use.input["city"], str)
        )
    m = client.messages.create(
        model=model,
        max_tokens=200,
        messages=[{"role": "user", "content": "Alice is 30. Who is she?"}],
        output_config={"format": {"type": "json_schema", "schema": Person.model_json_schema()}},
        extra_body=greedy,
    )
    assert m.stop_reason == "end_turn" and isinstance(Person.model_validate_json(m.content[0].text), Person)
