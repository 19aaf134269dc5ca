"""Schemathesis against the server's own ``/openapi.json``: requests that fit the documented schemas and
requests that break them, for every endpoint, bounded in examples and deterministic. No answer may be a 5xx,
and every 4xx comes in its API's error schema."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

import regolith
from regolith.models import resolve_model
from regolith.server import ServerConfig, create_app
from tests.server.conftest import LiveServer

MODEL = "demo"
EXAMPLES = int(os.environ.get("REGOLITH_FUZZ_EXAMPLES", "300"))  # per generation mode


@pytest.fixture(scope="module")
def demo_server() -> Iterator[LiveServer]:
    # the bundled demo model (fast); a short context bounds every generation the fuzzer's valid requests start
    model = regolith.Model.load(resolve_model("regolith-demo"), n_ctx=256)
    live = LiveServer(create_app(model, ServerConfig(model_name=MODEL, timeout=120)))
    yield live
    live.close()


def _check_error(path: str, body: object) -> None:
    assert isinstance(body, dict), body
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_request_gets_a_server_error(demo_server, mode):
    schema = schemathesis.openapi.from_url(demo_server.url + "/openapi.json")
    seen: dict[tuple[str, int], int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=schema.as_strategy(generation_mode=mode), served=st.booleans())
    def run(case, served):
        # half the bodies name the served model, so that requests the schema accepts reach the model (not in
        # negative mode, where the model may be the one field that breaks the schema)
        if (
            served
            and mode == GenerationMode.POSITIVE
            and isinstance(case.body, dict)
            and "model" in case.body
        ):
            case.body["model"] = MODEL
        r = case.call(base_url=demo_server.url, timeout=120)
        request = f"{case.method} {case.formatted_path} {json.dumps(case.body, default=str)[:2000]}"
        assert r.status_code < 500, f"{request} -> {r.status_code} {r.text[:400]}"
        if r.status_code >= 400:
            _check_error(case.formatted_path, r.json())
        key = (case.operation.label, r.status_code)
        seen[key] = seen.get(key, 0) + 1

    run()
    operations = {label for label, _ in seen}
    if mode == GenerationMode.POSITIVE:
        assert len(operations) == 11, seen  # every endpoint
        assert any(label.startswith("POST") and status == 200 for label, status in seen), seen
    else:  # the operations with a body (any string is a valid model name in a path): every answer a 4xx
        assert len(operations) == 6 and all(400 <= status < 500 for _, status in seen), seen
