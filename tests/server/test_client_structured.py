"""Structured output and forced tool calls through the clients people use, against a live server of the bundled
demo model (a model never trained to write JSON, so only the grammar keeps its replies valid): the OpenAI SDK's
``parse`` with a pydantic model, and langchain's ``with_structured_output`` (json_mode, json_schema,
function_calling) and ``bind_tools``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")

from pydantic import BaseModel

import regolith
from regolith.models import resolve_model
from regolith.server import ServerConfig, create_app
from tests.server.conftest import LiveServer

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


def test_openai_sdk_parse(demo_server):
    client = openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    r = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Alice is 30. Who is she?"}],
        response_format=Person,
        temperature=0,
        max_tokens=200,
    )
    assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, Person)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("method", ["json_mode", "json_schema", "function_calling"])
def test_langchain_structured_output(demo_server, method):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=demo_server.url + "/v1",
        api_key="x",
        model=MODEL,
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


def test_langchain_bind_tools_any(demo_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=demo_server.url + "/v1",
        api_key="x",
        model=MODEL,
        temperature=0,
        max_retries=0,
        max_tokens=200,
    )
    reply = llm.bind_tools([get_weather], tool_choice="any").invoke("hello")
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
