"""A bounded soak of the batching server: 16 clients for REGOLITH_SOAK_SECONDS (5 by default, so CI stays
cheap; 300 for the issue's few minutes) against ``--parallel 4`` on the demo model streamed through a 4 MiB
arena, each looping over random requests: whole replies (checked), streams abandoned part way (cancellation)
and malformed requests (each must get its 4xx). No request may be lost or fail otherwise, the server must
end idle, and its memory must stay flat once warm."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")

import regolith
from regolith.memory_plan import process_rss
from regolith.server import ServerConfig, create_app
from tests.server.conftest import LiveServer

SECONDS = float(os.environ.get("REGOLITH_SOAK_SECONDS", "5"))
CLIENTS = 16
AUTH = {"Authorization": "Bearer k"}
BAD = [
    ({"model": "demo", "prompt": "x", "max_tokens": -1}, 422),
    ({"model": "demo", "prompt": "x", "temperature": "hot"}, 422),
    ({"model": "nope", "prompt": "x"}, 404),
    ({"prompt": 3}, 422),
]


def _client(url: str, seed: int, until: float, counts: dict, errors: list) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
        while time.monotonic() < until:
            kind = rng.choice(["whole", "whole", "abandon", "bad"])
            try:
                if kind == "whole":
                    body = {
                        "model": "demo",
                        "prompt": rng.choice(["def f(x):", "class A:", "import re\n"]),
                        "max_tokens": rng.randint(1, 24),
                        "temperature": rng.choice([0, 0.8]),
                        "seed": seed,
                    }
                    r = http.post("/v1/completions", json=body)
                    c = r.json()["choices"][0]
                    ok = (
                        r.status_code == 200
                        and isinstance(c["text"], str)
                        and c["finish_reason"] in ("stop", "length")
                    )
                    ok = ok and 0 < r.json()["usage"]["completion_tokens"] <= body["max_tokens"]
                elif kind == "abandon":
                    body = {"model": "demo", "prompt": "def main():", "max_tokens": 200, "stream": True}
                    with http.stream("POST", "/v1/completions", json=body) as r:
                        ok = r.status_code == 200
                        for i, _ in enumerate(r.iter_lines()):
                            if i >= rng.randint(1, 6):
                                break
                else:
                    body, status = rng.choice(BAD)
                    if rng.random() < 0.2:
                        r, status = http.post("/v1/completions", content=b"{not json"), 400
                    else:
                        r = http.post("/v1/completions", json=body)
                    ok = r.status_code == status and "error" in r.json()
            except Exception as e:  # noqa: BLE001 - every failure is collected and reported by the test
                errors.append(f"{kind}: {type(e).__name__}: {e}")
                continue
            counts[kind] = counts.get(kind, 0) + 1
            if not ok:
                errors.append(f"{kind}: an invalid reply")


def test_soak_with_cancellations_and_malformed_requests():
    model = regolith.Model.load(arena_gb=0.004, n_ctx=512)
    live = LiveServer(
        create_app(model, ServerConfig(model_name="demo", api_key="k", timeout=120, parallel=4))
    )
    try:
        rss = []
        counts: dict[str, int] = {}
        errors: list[str] = []
        start = time.monotonic()
        for phase in (min(2.0, SECONDS / 4), SECONDS):  # a warm-up, then the soak proper
            until = time.monotonic() + phase
            threads = [
                threading.Thread(target=_client, args=(live.url, 100 * len(rss) + i, until, counts, errors))
                for i in range(CLIENTS)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rss.append(process_rss())
        assert errors == []
        assert min(counts.get(k, 0) for k in ("whole", "abandon", "bad")) > 0, counts
        deadline = time.monotonic() + 30
        while (live.engine.running or live.engine.queue_depth) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.engine.running == 0 and live.engine.queue_depth == 0
        growth = rss[1] - rss[0]
        assert growth < 64 * 2**20, (
            f"RSS grew by {growth / 2**20:.0f} MiB over {time.monotonic() - start:.0f} s"
        )
    finally:
        live.close()
