"""Log-probabilities, n > 1 and echo through the official ``openai`` SDK against the live Qwen2.5-Coder-0.5B
server, in OpenAI's shapes, streamed and not, and the tokenizer endpoints. Oracles: the library's own
generation of the same prompt (the same tokens; its log-probabilities) and, for the echoed prompt, its
logits' float64 log-softmax computed here; choice j of a seeded request is the library's run with seed + j."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from regolith.server.engine import choice_seed
from tests.server.conftest import API_KEY, MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _model(server):
    return server.app.state.server.model


def _library(model, ids, n, **sampling):
    gen = model.start(ids, window=model.window(512), max_tokens=n, **sampling)
    return "".join(gen), gen


def _entries(content):
    return [(e.token, e.logprob, e.bytes, [(t.token, t.logprob) for t in e.top_logprobs]) for e in content]


def test_chat_logprobs_streamed_and_not(client, server):
    model = _model(server)
    tok = model.tokenizer
    text, gen = _library(model, model.chat_prompt(USER), 12, temperature=0, logprobs=3)
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = r.choices[0]
    assert choice.message.content == text
    want = [
        (
            tok.token_bytes(e.token).decode("utf-8", "replace"),
            e.logprob,
            list(tok.token_bytes(e.token)),
            [(tok.token_bytes(t).decode("utf-8", "replace"), lp) for t, lp in e.top],
        )
        for e in gen.logprobs
    ]
    got = _entries(choice.logprobs.content)
    assert got == want and len(got) == r.usage.completion_tokens == 12
    assert b"".join(bytes(e.bytes) for e in choice.logprobs.content).decode() == text
    assert all(e.top_logprobs[0].logprob == e.logprob for e in choice.logprobs.content)  # greedy: the argmax

    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3, stream=True
    )
    streamed = [e for c in stream for e in ((c.choices[0].logprobs and c.choices[0].logprobs.content) or [])]
    assert _entries(streamed) == want

    plain = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None
    no_top = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, logprobs=True)
    assert [e.top_logprobs for e in no_top.choices[0].logprobs.content] == [[], []]


def test_n_choices_are_the_seeded_runs(client, server):
    model = _model(server)
    ids = model.chat_prompt(USER)
    sampling = {"temperature": 0.9, "top_p": 0.95}
    want = [_library(model, ids, 6, seed=choice_seed(2**64 - 2, j), **sampling) for j in range(3)]
    assert len({text for text, _ in want}) > 1
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=6, n=3, seed=2**64 - 2, **sampling
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == [text for text, _ in want]
    assert r.usage.prompt_tokens == len(ids)  # the prompt counted once, the replies all
    assert r.usage.completion_tokens == sum(len(g.tokens) for _, g in want)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=6,
        n=3,
        seed=2**64 - 2,
        stream=True,
        stream_options={"include_usage": True},
        **sampling,
    )
    texts, finishes, usage = ["", "", ""], [None] * 3, None
    for c in stream:
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            finishes[ch.index] = ch.finish_reason or finishes[ch.index]
    assert texts == [text for text, _ in want] and finishes == [c.finish_reason for c in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens


def test_n_choices_under_a_grammar(client):
    """The choices of a request share its grammar's guide, which follows each choice from its start."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Bob is 41. Describe him as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        n=3,
        seed=7,
        temperature=1.0,
        max_tokens=40,
    )
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), schema)


def _prompt_logprobs(model, ids):
    """The library's log-likelihood of each prompt token after the ones before it (float64 log-softmax of its
    logits, computed here)."""
    logits = model.window(len(ids) + 1).eval(ids).astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return [float(logits[i - 1, ids[i]] - lse[i - 1]) for i in range(1, len(ids))]


def test_completions_echo_logprobs_are_the_prompt_log_likelihoods(client, server):
    model = _model(server)
    prompts = ["def reverse(s):\n    return", "import os\nprint(os.getcwd())"]
    ids = [model.tokenize(p) for p in prompts]
    r = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=3, echo=True, logprobs=2, n=2, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == sum(len(i) for i in ids)
    for c in r.choices:
        p = c.index // 2
        lp = c.logprobs
        assert c.text.startswith(prompts[p]) and len(lp.tokens) == len(ids[p]) + 3
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        np.testing.assert_allclose(
            lp.token_logprobs[1 : len(ids[p])], _prompt_logprobs(model, ids[p]), atol=1e-9
        )
        for i, (t, v) in enumerate(zip(lp.tokens, lp.token_logprobs, strict=True)):
            assert c.text[lp.text_offset[i] :].startswith(t)  # ASCII text: each token where its offset says
            if i:
                assert lp.top_logprobs[i][t] == v and len(lp.top_logprobs[i]) <= 3  # top 2 and the chosen
        assert "".join(lp.tokens) == c.text
    assert r.choices[0].text == r.choices[1].text  # greedy: the choices of a prompt agree

    stream = client.completions.create(
        model=MODEL, prompt=prompts[0], max_tokens=3, echo=True, logprobs=2, temperature=0, stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == r.choices[0].text
    joined = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    offsets = [t for c in chunks if c.logprobs for t in c.logprobs.text_offset]
    values = [t for c in chunks if c.logprobs for t in c.logprobs.token_logprobs]
    first = r.choices[0].logprobs
    assert (joined, offsets, values) == (first.tokens, first.text_offset, first.token_logprobs)


def test_scoring_without_generating(client, server):
    """max_tokens 0 with echo: the prompt's log-likelihoods alone (the classic scoring request)."""
    model = _model(server)
    ids = model.tokenize("The quick brown fox jumps over the lazy dog")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs
    assert r.usage.completion_tokens == 0 and len(lp.tokens) == len(ids)
    np.testing.assert_allclose(lp.token_logprobs[1:], _prompt_logprobs(model, ids), atol=1e-9)


def test_tokenizer_endpoints(server):
    model = _model(server)
    text = "<|im_start|>user\nhello, wörld<|im_end|>"
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        r = http.post("/tokenize", json={"model": MODEL, "prompt": text, "return_token_strs": True}).json()
        assert r["tokens"] == model.tokenize(text) and r["count"] == len(r["tokens"])
        assert r["token_strs"] == [model.tokenizer.id_to_token(t) for t in r["tokens"]]
        assert r["max_model_len"] == model.n_ctx
        assert http.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": text}
        info = http.get("/tokenizer_info").json()
        eos = model.tokenizer.eos_id
        assert http.post("/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}).json()[
            "tokens"
        ] == [eos]
        assert info["chat_template"] == model.chat_template.source
