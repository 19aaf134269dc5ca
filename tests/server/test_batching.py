"""Continuous batching under concurrent clients (the openai SDK against live servers on 127.0.0.1), on the
demo model resident and streamed through a 4 MiB arena.

The oracle is the same request served alone: each request is first sent by itself to a ``--parallel 1``
server (speculative decoding on, as a lone request gets it), then all of them at once to a ``--parallel 4``
server whose steps batch them (its sequences speculating with the suffix drafter, each verification a window's
tokens in a shared step). Every reply (greedy and seeded sampling, with stop strings and log-probabilities)
must be identical; a client that goes away mid-stream must not change anyone else's reply; /metrics must show
steps that carried several sequences.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import regolith
from regolith.server import ServerConfig, create_app
from tests.server.conftest import LiveServer

PROMPTS = [
    ("class Stack:", {"temperature": 0}),
    ("import os\n\ndef walk(path):", {"temperature": 0, "stop": ["\n\n"]}),
    ("def read_config(path):", {"temperature": 0.8, "seed": 11}),
    ('"""Utilities for', {"temperature": 1.0, "top_p": 0.9, "seed": 5}),
    ("for i in range(10):", {"temperature": 0, "logprobs": 2}),
    ("# " + "the quick brown fox jumps over the lazy dog " * 12, {"temperature": 0.7, "seed": 3}),
]


def _ask(url: str, prompt: str, options: dict) -> tuple[str, str, list | None]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120)
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=40, **options)
    c = r.choices[0]
    return c.text, c.finish_reason, c.logprobs.token_logprobs if c.logprobs else None


@pytest.fixture(scope="module", params=[None, 0.004], ids=["resident", "streamed"])
def servers(request):
    model = regolith.Model.load(arena_gb=request.param, n_ctx=512)
    lone = LiveServer(create_app(model, ServerConfig(model_name="demo", api_key="k", timeout=120)))
    batched = LiveServer(
        create_app(model, ServerConfig(model_name="demo", api_key="k", timeout=120, parallel=4))
    )
    yield lone, batched
    lone.close()
    batched.close()


def _batch_sizes(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": "Bearer k"}).text
    total = float(re.search(r"^regolith_batch_size_sum (\S+)$", text, re.MULTILINE).group(1))
    count = float(re.search(r"^regolith_batch_size_count (\S+)$", text, re.MULTILINE).group(1))
    return total, count


def test_concurrent_requests_match_each_served_alone(servers):
    lone, batched = servers
    want = [_ask(lone.url, p, o) for p, o in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda po: _ask(batched.url, *po), PROMPTS))
    assert got == want
    total, count = _batch_sizes(batched.url)
    assert total / count > 1.5, "the steps did not batch the sequences"
    metrics = httpx.get(batched.url + "/metrics", headers={"Authorization": "Bearer k"}).text
    read = re.search(r"^regolith_expert_bytes_read_total (\S+)$", metrics, re.MULTILINE)
    assert (read is not None and float(read.group(1)) > 0) == batched.app.state.server.model.plan.streaming
    # batched sequences speculate too (suffix drafts, verified in shared steps): the repeated line's drafts
    accepted = re.search(r"^regolith_draft_tokens_accepted_total (\S+)$", metrics, re.MULTILINE)
    assert accepted is not None and float(accepted.group(1)) > 0
    assert batched.engine.running == 0 and batched.engine.queue_depth == 0
    windows = batched.engine._idle
    assert len(windows) == 4 and all(w.tokens and len(w.tokens) == w.n_past for w in windows)


def test_a_cancelled_stream_does_not_disturb_the_others(servers):
    lone, batched = servers
    want = [_ask(lone.url, p, o) for p, o in PROMPTS[:3]]
    read_some = threading.Event()

    def abandon() -> None:
        client = openai.OpenAI(base_url=batched.url + "/v1", api_key="k", max_retries=0, timeout=120)
        stream = client.completions.create(
            model="demo", prompt="def main():", max_tokens=400, temperature=0.9, seed=1, stream=True
        )
        for i, _ in enumerate(stream):
            if i == 3:
                read_some.set()
                break
        stream.close()

    with ThreadPoolExecutor(4) as pool:
        gone = pool.submit(abandon)
        assert read_some.wait(60)
        got = list(pool.map(lambda po: _ask(batched.url, *po), PROMPTS[:3]))
        gone.result()
    assert got == want
    metrics = httpx.get(batched.url + "/metrics", headers={"Authorization": "Bearer k"}).text
    assert re.search(r'^regolith_generations_total\{finish_reason="cancelled"\} [1-9]', metrics, re.MULTILINE)
    for name in ("queue_wait_seconds", "time_to_first_token_seconds", "inter_token_latency_seconds"):
        assert re.search(rf'^regolith_{name}_bucket\{{le="\+Inf"\}} [1-9]', metrics, re.MULTILINE), name


@pytest.mark.real_weights
def test_concurrent_requests_on_qwen_match_the_library():
    """Qwen2.5-Coder-0.5B (a dense model; its own chat template): three chat requests at once on a
    ``--parallel 3`` server each get what the library generates for the prompt alone (speculation on)."""
    from tests.server.conftest import _model

    model = _model()
    asks = [
        ("Write a haiku about rust.", {"temperature": 0}),
        ("Name three sorting algorithms.", {"temperature": 0.7, "seed": 4}),
        ("What does `git rebase` do?", {"temperature": 0}),
    ]
    want = []
    for text, options in asks:
        prompt = model.chat_prompt([{"role": "user", "content": text}])
        gen = model.start(prompt, window=model.window(), max_tokens=12, **options)
        want.append("".join(gen))
    live = LiveServer(create_app(model, ServerConfig(model_name="q", api_key="k", timeout=120, parallel=3)))
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="k", max_retries=0, timeout=120)

        def chat(ask: tuple[str, dict]) -> str:
            messages = [{"role": "user", "content": ask[0]}]
            r = client.chat.completions.create(model="q", messages=messages, max_tokens=12, **ask[1])
            return r.choices[0].message.content

        with ThreadPoolExecutor(len(asks)) as pool:
            got = list(pool.map(chat, asks))
    finally:
        live.close()
    assert got == want


def test_the_idle_window_that_reuses_most_of_the_prompt_serves_it():
    # Window a holds head + body, window b head + other. The prompt head + other[:20] + body shares the longer
    # prefix with b, but with suffix cache reuse a's body moves too: a reuses 10 + 190 tokens, b 30.
    from regolith.server.engine import Engine
    from regolith.server.metrics import Metrics

    model = regolith.Model.load(n_ctx=512)
    ids = model.tokenize("def f(x):\n    return x * 2\n" * 40, add_special=False)
    head, body, other = ids[:10], ids[10:200], [t + 1 for t in ids[200:250]]
    engine = Engine(model, Metrics(), parallel=2)
    a, b = model.window(), model.window()
    a.eval(head + body)
    b.eval(head + other)
    prompt = head + other[:20] + body
    for scr, want in [(False, b), (True, a)]:
        model.scr = scr
        engine._idle, engine._n_windows = [a, b], 2
        assert engine._window_for(prompt) is want
    assert engine._window_for(ids[300:310]) is b  # no window reuses any of it and no new one may be made
