"""regolith on Ray Serve (regolith.server.ray): a local Ray cluster bound to 127.0.0.1 with two replicas of the
bundled model behind the frontend, driven by the OpenAI and Anthropic SDKs. Replies equal one server's;
conversations stay on the replica that holds their prefix; a replica killed mid-stream ends that stream with
an error event, the other serves the next request, and Serve brings the dead one back.

One cluster for the module (about 10 s to start on 2 cores); the kill test runs last."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray.serve")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import ray
from ray import serve

import regolith
from regolith.cli import ray_app
from regolith.server.ray import REPLICA_HEADER

MODEL = "regolith-demo"
ARGS = ["--arena-gb", "0.004", "--ctx", "2048", "--parallel", "2", "--spec", "off", "--max-body", "65536"]
SYSTEMS = [
    f"You are assistant number {i}. Answer in one short line, and never apologise. " * 6 for i in range(3)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cache = tmp_path_factory.mktemp("ray-prompt-cache")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # as a Serve config file would build it (import_path: regolith.cli:ray_app)
        argv = [*ARGS, "--replicas", "2", "--replica-cpus", "1", "--cache-dir", str(cache)]
        app = ray_app({"serve": shlex.join(argv)})
        serve.run(app, name="regolith", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, messages, **kw):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=kw.pop("max_tokens", 16), temperature=0, **kw
    )
    return raw.headers[REPLICA_HEADER], raw.parse()


# `regolith serve`'s application with the same arguments, asked once in a process of its own (this one keeps
# no model of its own: the cluster's processes are the ones that load it).
_ALONE = """
import json, sys
from fastapi.testclient import TestClient
from rich.console import Console
from regolith.cli import _parser, _server
from regolith.server import create_app
args, body = json.loads(sys.argv[1])
with TestClient(create_app(*_server(_parser().parse_args(["serve", *args]), Console(stderr=True)))) as c:
    r = c.post("/v1/chat/completions", json=body)
print(json.dumps([r.status_code, r.json()]))
"""


def test_replies_equal_one_server(client):
    """A greedy reply through the frontend and a replica is the reply of `regolith serve` with the same
    arguments, text and usage."""
    messages = [{"role": "user", "content": "Write a function that reverses a list."}]
    _, through_ray = _chat(client, messages, max_tokens=24)
    body = {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0}
    env = {**os.environ, "REGOLITH_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _ALONE, json.dumps([ARGS, body])],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    status, alone = json.loads(out.stdout.splitlines()[-1])
    assert status == 200, alone
    assert through_ray.choices[0].message.content == alone["choices"][0]["message"]["content"]
    assert through_ray.choices[0].finish_reason == alone["choices"][0]["finish_reason"]
    assert through_ray.usage.prompt_tokens == alone["usage"]["prompt_tokens"]
    assert through_ray.usage.completion_tokens == alone["usage"]["completion_tokens"]


def test_the_apis_through_the_frontend(url, client):
    messages = [{"role": "user", "content": "Name a colour."}]
    _, whole = _chat(client, messages)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        == whole.choices[0].message.content
    )

    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    with claude.messages.stream(
        model=MODEL, max_tokens=16, messages=messages, extra_body={"temperature": 0}
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.choices[0].message.content
    assert final.usage.output_tokens == whole.usage.completion_tokens

    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    missing = httpx.get(url + "/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    bad = httpx.post(url + "/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    big = httpx.post(url + "/v1/chat/completions", content=b" " * 70_000)
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"


def test_conversations_stay_with_the_replica_that_holds_them(client):
    """Requests are interleaved across three system prompts: each system prompt's requests go to one
    replica, whose prompt cache then holds it (cached tokens from the second request on)."""
    where: dict[int, set[str]] = {i: set() for i in range(len(SYSTEMS))}
    cached: dict[int, list[int]] = {i: [] for i in range(len(SYSTEMS))}
    for q in range(3):
        for i, system in enumerate(SYSTEMS):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Question {q}?"}]
            replica, reply = _chat(client, messages, max_tokens=4)
            where[i].add(replica)
            cached[i].append(reply.usage.prompt_tokens_details.cached_tokens)
    assert all(len(replicas) == 1 for replicas in where.values()), where
    for i, counts in cached.items():
        assert counts[0] == 0 and min(counts[1:]) > 0, (i, counts)


def _endless(client, content: str):
    """A streamed chat reply that cannot end before max_tokens (the end tokens banned), and its replica."""
    eog = regolith.Model.load(MODEL, arena_gb=0.004).tokenizer.eog_ids
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=1900,
        temperature=0,
        stream=True,
        logit_bias={str(t): -100 for t in eog},
    )
    return raw.headers[REPLICA_HEADER], raw.parse()


def test_a_client_that_goes_away_cancels_its_generation(url, client):
    """Closing a stream mid-reply reaches the replica: its engine goes idle long before its 1,900 tokens (at least 5 s here)."""
    replica, chunks = _endless(client, "Count to a thousand, slowly.")
    next(iter(chunks))
    chunks.close()
    idle: set[str] = set()
    deadline = time.monotonic() + 3
    while replica not in idle:
        assert time.monotonic() < deadline, "the replica kept generating after its client went away"
        r = httpx.get(url + "/health")
        if not r.json()["busy"]:
            idle.add(r.headers[REPLICA_HEADER])
        time.sleep(0.05)


def test_a_replica_killed_mid_stream(url, client):
    """The stream it served ends with an error event (the SDK raises it); the next requests are answered by
    the other replica; Serve starts a new one."""
    victim, chunks = _endless(client, "Count to a thousand.")
    next(iter(chunks))
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    with pytest.raises(openai.APIError, match="died"):
        for _ in chunks:
            pass

    for q in range(3):
        replica, reply = _chat(client, [{"role": "user", "content": f"After the crash {q}"}], max_tokens=4)
        assert replica != victim and reply.choices[0].message.content is not None

    deadline = time.monotonic() + 120
    while True:
        states = serve.status().applications["regolith"].deployments["Replica"].replica_states
        if states.get("RUNNING", 0) == 2:
            break
        assert time.monotonic() < deadline, f"Serve did not bring the replica back: {json.dumps(states)}"
        time.sleep(1)


def test_the_command_line_maps_onto_the_application(monkeypatch):
    import regolith.server.ray as ray_server

    seen = {}
    monkeypatch.setattr(ray_server, "application", lambda load, **kw: seen.update(kw, load=load) or "app")
    argv = ["--autoscale", "1:3", "--replica-cpus", "2", "--replica-gpus", "0.5", "--memory-gb", "3"]
    assert ray_app({"serve": [*argv, "--no-affinity", "--cache-dir", "/c", "--cache-size-gb", "2"]}) == "app"
    assert seen["autoscale"] == (1, 3) and seen["replica_cpus"] == 2 and seen["replica_gpus"] == 0.5
    assert seen["replica_memory_gb"] == 3 and seen["affinity"] is False
    assert seen["cache_dir"] == "/c" and seen["cache_gb"] == 2
    assert seen["max_ongoing"] == 64 + 4, "the replica's queue and its batch"
    assert seen["load"].args[0].memory_gb == 3, "each replica loads with the same arguments"
    for bad in ["3:1", "0:0", "2", "a:b"]:
        with pytest.raises(SystemExit):
            ray_app({"serve": ["--autoscale", bad]})


def test_regolith_serve_ray_runs_until_sigterm(tmp_path):
    """`regolith serve --ray` starts a cluster of its own, serves, and on SIGTERM deletes the application,
    stops the cluster and exits 0. (Run while the module's cluster is up: a second cluster beside it.)"""
    port = _free_port()
    cmd = [sys.executable, "-m", "regolith.cli", "serve", *ARGS, "--ray", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        assert c.completions.create(model=MODEL, prompt="def f(", max_tokens=4).usage.completion_tokens > 0
        proc.terminate()
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health")


def test_the_config_file_in_the_docs_is_one_serve_accepts(monkeypatch):
    """docs/scaling.md's Serve config file validates against Serve's schema, and its application builds."""
    import pathlib
    import re

    import yaml
    from ray.serve.schema import ServeDeploySchema

    import regolith.cli
    import regolith.server.ray as ray_server

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "scaling.md").read_text()
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", doc, re.DOTALL).group(1))
    schema = ServeDeploySchema.model_validate(config)
    (app,) = schema.applications
    module, _, name = app.import_path.partition(":")
    assert module == "regolith.cli" and name == "ray_app"
    seen = {}
    monkeypatch.setattr(ray_server, "application", lambda load, **kw: seen.update(kw) or "app")
    assert getattr(regolith.cli, name)(app.args) == "app"
    assert seen["replicas"] == 2 and seen["replica_cpus"] == 4 and seen["replica_memory_gb"] == 8


def test_each_replica_takes_a_prompt_cache_directory_of_its_own(tmp_path):
    """The first replica-K whose lock is free; a dead replica's lock goes with its process (here: its
    descriptor), and the next replica takes its directory up."""
    from regolith.server.ray import replica_cache_dir

    first, fd = replica_cache_dir(str(tmp_path))
    second, fd2 = replica_cache_dir(str(tmp_path))
    assert (os.path.basename(first), os.path.basename(second)) == ("replica-0", "replica-1")
    os.close(fd)
    again, fd3 = replica_cache_dir(str(tmp_path))
    assert again == first
    os.close(fd2)
    os.close(fd3)
