"""Raw HTTP against a live server (httpx): a table of malformed requests, each answered with the right 4xx in
its API's error schema and a good request served after them; a client that disconnects mid-stream; eight
concurrent clients; health and metrics."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")

from tests.server.conftest import API_KEY, MAX_BODY, MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
USER = [{"role": "user", "content": "Hi"}]


def _chat(**fields):
    return {"model": MODEL, "messages": USER, **fields}


def _msg(**fields):
    return {"model": MODEL, "max_tokens": 8, "messages": USER, **fields}


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}

# (name, method, path, headers (None: AUTH), body (bytes sent as is, else JSON), status, error type)
BAD_REQUESTS = [
    ("malformed JSON", "POST", CHAT, None, b'{"model": ', 400, "invalid_request_error"),
    ("empty body", "POST", CHAT, None, b"", 400, "invalid_request_error"),
    ("array body", "POST", CHAT, None, [1, 2], 400, "invalid_request_error"),
    ("string body", "POST", CHAT, None, "hi", 400, "invalid_request_error"),
    ("not UTF-8", "POST", CHAT, None, b'{"model": "\xff"}', 400, "invalid_request_error"),
    ("no model", "POST", CHAT, None, {"messages": USER}, 422, "invalid_request_error"),
    ("no messages", "POST", CHAT, None, {"model": MODEL}, 422, "invalid_request_error"),
    ("empty messages", "POST", CHAT, None, _chat(messages=[]), 422, "invalid_request_error"),
    ("messages not a list", "POST", CHAT, None, _chat(messages="Hi"), 422, "invalid_request_error"),
    (
        "unknown role",
        "POST",
        CHAT,
        None,
        _chat(messages=[{"role": "robot", "content": "x"}]),
        422,
        "invalid_request_error",
    ),
    (
        "content a number",
        "POST",
        CHAT,
        None,
        _chat(messages=[{"role": "user", "content": 3}]),
        422,
        "invalid_request_error",
    ),
    ("max_tokens a string", "POST", CHAT, None, _chat(max_tokens="10"), 422, "invalid_request_error"),
    ("max_tokens 0", "POST", CHAT, None, _chat(max_tokens=0), 422, "invalid_request_error"),
    ("temperature 3", "POST", CHAT, None, _chat(temperature=3), 422, "invalid_request_error"),
    ("temperature a word", "POST", CHAT, None, _chat(temperature="hot"), 422, "invalid_request_error"),
    ("top_p 0", "POST", CHAT, None, _chat(top_p=0), 422, "invalid_request_error"),
    ("20 stop strings", "POST", CHAT, None, _chat(stop=["x"] * 20), 422, "invalid_request_error"),
    (
        "logit_bias key not an id",
        "POST",
        CHAT,
        None,
        _chat(logit_bias={"abc": 1}),
        422,
        "invalid_request_error",
    ),
    (
        "logit_bias id too big",
        "POST",
        CHAT,
        None,
        _chat(logit_bias={"999999999": 1}),
        422,
        "invalid_request_error",
    ),
    ("seed negative", "POST", CHAT, None, _chat(seed=-1), 422, "invalid_request_error"),
    ("stream not a bool", "POST", CHAT, None, _chat(stream="yes"), 422, "invalid_request_error"),
    ("n = 17", "POST", CHAT, None, _chat(n=17), 422, "invalid_request_error"),
    ("top_logprobs alone", "POST", CHAT, None, _chat(top_logprobs=2), 400, "invalid_request_error"),
    (
        "top_logprobs 21",
        "POST",
        CHAT,
        None,
        _chat(logprobs=True, top_logprobs=21),
        422,
        "invalid_request_error",
    ),
    (
        "image content",
        "POST",
        CHAT,
        None,
        _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "invalid_request_error",
    ),
    (
        "function role",
        "POST",
        CHAT,
        None,
        _chat(messages=[{"role": "function", "content": "x", "name": "f"}]),
        400,
        "invalid_request_error",
    ),
    (
        "tool message without id",
        "POST",
        CHAT,
        None,
        _chat(messages=[*USER, {"role": "tool", "content": "x"}]),
        422,
        "invalid_request_error",
    ),
    (
        "tool call arguments not JSON",
        "POST",
        CHAT,
        None,
        _chat(
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                    ],
                },
            ]
        ),
        422,
        "invalid_request_error",
    ),
    (
        "tools of a wrong type",
        "POST",
        CHAT,
        None,
        _chat(tools=[{"type": "retrieval"}]),
        422,
        "invalid_request_error",
    ),
    (
        "tool_choice names no tool",
        "POST",
        CHAT,
        None,
        _chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "other"}}),
        400,
        "invalid_request_error",
    ),
    (
        "response_format xml",
        "POST",
        CHAT,
        None,
        _chat(response_format={"type": "xml"}),
        422,
        "invalid_request_error",
    ),
    (
        "json_schema without schema",
        "POST",
        CHAT,
        None,
        _chat(response_format={"type": "json_schema", "json_schema": {}}),
        422,
        "invalid_request_error",
    ),
    ("unknown model", "POST", CHAT, None, {**_chat(), "model": "gpt-9"}, 404, "not_found_error"),
    (
        "context overflow",
        "POST",
        CHAT,
        None,
        _chat(messages=[{"role": "user", "content": "hello " * 1500}]),
        400,
        "invalid_request_error",
    ),
    (
        "body too large",
        "POST",
        CHAT,
        None,
        _chat(messages=[{"role": "user", "content": "x" * MAX_BODY}]),
        413,
        "invalid_request_error",
    ),
    (
        "lone surrogate in a message",
        "POST",
        CHAT,
        None,
        b'{"model": "qwen", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        400,
        "invalid_request_error",
    ),
    (
        "lone surrogate in a key",
        "POST",
        CHAT,
        None,
        b'{"model": "qwen", "messages": [{"role": "user", "content": "a"}], "\\udfff": 1}',
        400,
        "invalid_request_error",
    ),
    (
        "lone surrogate in a prompt",
        "POST",
        "/v1/completions",
        None,
        b'{"model": "qwen", "prompt": ["x\\udc00"]}',
        400,
        "invalid_request_error",
    ),
    ("empty stop string", "POST", CHAT, None, _chat(stop=""), 422, "invalid_request_error"),
    (
        "empty stop string, streamed",
        "POST",
        CHAT,
        None,
        _chat(stop="", stream=True),
        422,
        "invalid_request_error",
    ),
    ("empty stop in a list", "POST", CHAT, None, _chat(stop=["a", ""]), 422, "invalid_request_error"),
    (
        "completion: empty stop",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL, "prompt": "a", "stop": "", "stream": True},
        422,
        "invalid_request_error",
    ),
    ("no API key", "POST", CHAT, {}, _chat(), 401, "authentication_error"),
    ("wrong API key", "POST", CHAT, {"Authorization": "Bearer nope"}, _chat(), 401, "authentication_error"),
    ("wrong method", "GET", CHAT, None, None, 405, "invalid_request_error"),
    ("unknown path", "POST", "/v1/engines", None, _chat(), 404, "not_found_error"),
    (
        "completion without prompt",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL},
        422,
        "invalid_request_error",
    ),
    (
        "9 prompts times n = 2",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL, "prompt": ["a"] * 9, "n": 2},
        400,
        "invalid_request_error",
    ),
    (
        "an empty prompt among several",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL, "prompt": [[1, 2], []]},
        400,
        "invalid_request_error",
    ),
    (
        "completion logprobs 21",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL, "prompt": "a", "logprobs": 21},
        422,
        "invalid_request_error",
    ),
    (
        "tokenize without prompt",
        "POST",
        "/tokenize",
        None,
        {"model": MODEL},
        422,
        "invalid_request_error",
    ),
    (
        "detokenize an id out of range",
        "POST",
        "/detokenize",
        None,
        {"tokens": [1, 10**9]},
        422,
        "invalid_request_error",
    ),
    (
        "tokenize another model",
        "POST",
        "/tokenize",
        None,
        {"model": "x", "prompt": "a"},
        404,
        "not_found_error",
    ),
    ("tokenizer_info without key", "GET", "/tokenizer_info", {}, None, 401, "authentication_error"),
    (
        "prompt id out of range",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL, "prompt": [1, -5]},
        422,
        "invalid_request_error",
    ),
    (
        "suffix",
        "POST",
        "/v1/completions",
        None,
        {"model": MODEL, "prompt": "a", "suffix": "b"},
        400,
        "invalid_request_error",
    ),
    # Anthropic schema
    ("messages: malformed JSON", "POST", MESSAGES, None, b"{", 400, "invalid_request_error"),
    (
        "messages: lone surrogate",
        "POST",
        MESSAGES,
        None,
        (
            b'{"model": "qwen", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", '
            b'"text": "\\ud83d"}]}]}'
        ),
        400,
        "invalid_request_error",
    ),
    (
        "messages: empty stop sequence",
        "POST",
        MESSAGES,
        None,
        _msg(stop_sequences=[""], stream=True),
        422,
        "invalid_request_error",
    ),
    (
        "messages: no max_tokens",
        "POST",
        MESSAGES,
        None,
        {"model": MODEL, "messages": USER},
        422,
        "invalid_request_error",
    ),
    (
        "messages: system role",
        "POST",
        MESSAGES,
        None,
        _msg(messages=[{"role": "system", "content": "x"}]),
        422,
        "invalid_request_error",
    ),
    (
        "messages: unknown block",
        "POST",
        MESSAGES,
        None,
        _msg(messages=[{"role": "user", "content": [{"type": "hologram"}]}]),
        422,
        "invalid_request_error",
    ),
    (
        "messages: image block",
        "POST",
        MESSAGES,
        None,
        _msg(
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]
        ),
        400,
        "invalid_request_error",
    ),
    (
        "messages: tool_result from the assistant",
        "POST",
        MESSAGES,
        None,
        _msg(
            messages=[*USER, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]
        ),
        400,
        "invalid_request_error",
    ),
    (
        "messages: temperature 1.5",
        "POST",
        MESSAGES,
        None,
        _msg(temperature=1.5),
        422,
        "invalid_request_error",
    ),
    (
        "messages: budget >= max_tokens",
        "POST",
        MESSAGES,
        None,
        _msg(thinking={"type": "enabled", "budget_tokens": 8}),
        400,
        "invalid_request_error",
    ),
    (
        "messages: tool choice without a name",
        "POST",
        MESSAGES,
        None,
        _msg(tools=[{"name": "f", "input_schema": {}}], tool_choice={"type": "tool"}),
        422,
        "invalid_request_error",
    ),
    (
        "messages: server tool",
        "POST",
        MESSAGES,
        None,
        _msg(tools=[{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}]),
        400,
        "invalid_request_error",
    ),
    (
        "messages: unknown model",
        "POST",
        MESSAGES,
        None,
        {**_msg(), "model": "claude-x"},
        404,
        "not_found_error",
    ),
    (
        "messages: wrong x-api-key",
        "POST",
        MESSAGES,
        {"x-api-key": "nope"},
        _msg(),
        401,
        "authentication_error",
    ),
    ("messages: too large", "POST", MESSAGES, None, _msg(system="x" * MAX_BODY), 413, "request_too_large"),
    (
        "count_tokens: no messages",
        "POST",
        "/v1/messages/count_tokens",
        None,
        {"model": MODEL},
        422,
        "invalid_request_error",
    ),
]


def test_malformed_requests_get_the_right_4xx(server):
    assert len(BAD_REQUESTS) >= 30
    generations = sum(server.engine.metrics.generations.values())
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for name, method, path, headers, body, status, kind in BAD_REQUESTS:
            content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
            r = http.request(method, path, headers=AUTH if headers is None else headers, content=content)
            assert r.status_code == status, (name, r.text)
            err = r.json()
            if path.startswith(MESSAGES):
                assert err["type"] == "error" and err["error"]["type"] == kind, (name, err)
                message = err["error"]["message"]
            else:
                assert (
                    set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["type"] == kind
                ), name
                message = err["error"]["message"]
            assert len(message) > 10, (name, message)
        assert sum(server.engine.metrics.generations.values()) == generations  # none reached the model
        r = http.post(CHAT, headers=AUTH, json=_chat(max_tokens=2, temperature=0))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_surrogates_are_named_and_pairs_accepted(server):
    """A lone surrogate is refused with the field it is in; a surrogate pair (an astral character) is text."""
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        body = b'{"model": "qwen", "max_tokens": 1, "messages": [{"role": "user", "content": "hi \\ud800"}]}'
        e = http.post(CHAT, content=body).json()["error"]
        assert e["param"] == "messages[0].content" and "surrogate" in e["message"]
        body = body.replace(b"\\ud800", b"\\ud83d\\ude00")
        r = http.post(CHAT, content=body)
        assert r.status_code == 200, r.text


def test_methods_options_and_openapi(server):
    """405 names the allowed methods in Allow; OPTIONS answers them; /openapi.json documents every endpoint's
    request body (the models the handlers validate) and /docs serves the interactive page."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.get(CHAT, headers=AUTH)
        assert r.status_code == 405 and r.headers["allow"] == "POST, OPTIONS"
        assert "it accepts POST, OPTIONS" in r.json()["error"]["message"]
        r = http.options(CHAT)
        assert r.status_code == 204 and r.headers["allow"] == "POST, OPTIONS" and r.content == b""
        r = http.options("/v1/models")
        assert r.status_code == 204 and set(r.headers["allow"].split(", ")) == {"GET", "OPTIONS"}
        assert http.options("/v1/engines").status_code == 404
        doc = http.get("/openapi.json").json()
        page = http.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    bodies = {
        path: op["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        for path, op in doc["paths"].items()
        if "post" in op
    }
    assert bodies == {
        CHAT: "ChatRequest",
        "/v1/completions": "CompletionRequest",
        MESSAGES: "MessagesRequest",
        "/v1/messages/count_tokens": "CountTokensRequest",
        "/tokenize": "TokenizeRequest",
        "/detokenize": "DetokenizeRequest",
    }
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatRequest"]
    assert set(chat["required"]) == {"model", "messages"} and "max_tokens" in chat["properties"]
    assert schemas["MessagesRequest"]["required"] == ["model", "messages", "max_tokens"]
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert refs <= set(schemas)  # every reference resolves


def test_error_messages_name_the_problem(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        e = http.post(CHAT, json=_chat(max_tokens="10")).json()["error"]
        assert e["param"] == "max_tokens" and "integer" in e["message"]
        e = http.post(CHAT, json=_chat(messages=[{"role": "user", "content": "hello " * 1500}])).json()[
            "error"
        ]
        assert e["code"] == "context_length_exceeded" and "--ctx" in e["message"]
        e = http.post(CHAT, json={**_chat(), "model": "gpt-9"}).json()["error"]
        assert e["code"] == "model_not_found" and MODEL in e["message"]
        e = http.post(MESSAGES, json={"model": MODEL, "messages": USER}).json()["error"]
        assert e["message"].startswith("max_tokens")


def _long_stream_request():
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }


def test_disconnect_cancels_the_generation(server):
    metrics = server.engine.metrics
    cancelled, generated = metrics.generations["cancelled"], metrics.generated_tokens
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        with http.stream("POST", CHAT, json=_long_stream_request()) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    seen += 1
                    if seen == 4:
                        break
        # Leaving the block closed the connection mid-stream.
        t0 = time.monotonic()
        while metrics.generations["cancelled"] == cancelled:
            assert time.monotonic() - t0 < 10, "the generation was not cancelled"
            time.sleep(0.02)
        assert metrics.generated_tokens - generated < 100  # stopped early, not after 400 tokens
        assert not server.engine.busy
        r = http.post(CHAT, json=_chat(max_tokens=2, temperature=0))
        assert r.status_code == 200 and time.monotonic() - t0 < 10


def test_eight_concurrent_clients(server):
    model = server.app.state.server.model
    words = ["apple", "river", "stone", "cloud", "tiger", "piano", "maple", "ocean"]
    requests = [[{"role": "user", "content": f"Repeat this word once: {w}"}] for w in words]
    # The oracle: the library's greedy reply to each conversation, each on a fresh window.
    expected = []
    window = model.window(128)  # one window: the conversations share the system prompt's tokens
    for messages in requests:
        gen = model.start(model.chat_prompt(messages), window=window, max_tokens=4, temperature=0)
        expected.append("".join(gen).lstrip())

    def client(messages: list[dict[str, str]]) -> str:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as http:
            r = http.post(
                CHAT, json={"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
            )
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(len(words)) as pool:
        futures = [pool.submit(client, messages) for messages in requests]
        # Meanwhile the event loop answers at once and shows the queue.
        depths, latencies = [], []
        with httpx.Client(base_url=server.url, timeout=10) as http:
            while not all(f.done() for f in futures):
                t0 = time.monotonic()
                health = http.get("/health").json()
                latencies.append(time.monotonic() - t0)
                depths.append(health["queue_depth"])
                time.sleep(0.05)
        results = [f.result() for f in futures]
    assert results == expected, (results, expected)
    assert max(depths) >= 1 and max(latencies) < 0.5


def test_health_and_metrics(server):
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.get("/health").json() == {"status": "ok", "model": MODEL, "busy": False, "queue_depth": 0}
        assert http.get("/metrics").status_code == 401
        text = http.get("/metrics", headers=AUTH).text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if not line.startswith("#")
    }
    assert samples['regolith_requests_total{path="/v1/chat/completions",status="200"}'] >= 1
    assert samples["regolith_generated_tokens_total"] > 0 and samples["regolith_decode_tokens_per_second"] > 0
    assert samples["regolith_queue_depth"] == 0
    assert any(k.startswith("regolith_generations_total{finish_reason=") for k in samples)
