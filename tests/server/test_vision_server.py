"""Images through the server (OpenAI ``image_url`` data URLs, Anthropic base64 image blocks) on a tiny random
qwen4_exp with a projector; bad images, remote URLs and a model without a projector are 400s."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
httpx = pytest.importorskip("httpx")

import regolith
from regolith.server import ServerConfig, create_app
from tests.server.conftest import LiveServer

HEADERS = {"Authorization": "Bearer k"}


def _png(h: int = 20, w: int = 36) -> str:
    img = Image.fromarray(np.random.default_rng(h * w).integers(0, 255, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from regolith.convert import convert
    from tests.qwen4exp_vision_models import save_tiny_vl_model

    tmp = tmp_path_factory.mktemp("vl_server")
    save_tiny_vl_model(tmp / "hf", 4)
    convert(tmp / "hf", tmp / "m.gguf", "f32", mmproj=tmp / "mmproj.gguf")
    config = ServerConfig(model_name="tiny", api_key="k", timeout=60)
    vision = LiveServer(
        create_app(regolith.Model.load(tmp / "m.gguf", mmproj=tmp / "mmproj.gguf", n_ctx=256), config)
    )
    text = LiveServer(create_app(regolith.Model.load(tmp / "m.gguf", n_ctx=256), config))
    yield vision, text
    vision.close()
    text.close()


def _openai(url: str, image_url: str) -> httpx.Response:
    body = {
        "model": "tiny",
        "max_tokens": 3,
        "temperature": 0,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what?"},
                    {"type": "image_url", "image_url": {"url": image_url}},
                ],
            }
        ],
    }
    return httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=60)


def _anthropic(url: str, source: dict) -> httpx.Response:
    body = {
        "model": "tiny",
        "max_tokens": 3,
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "?"}]}
        ],
    }
    return httpx.post(url + "/v1/messages", json=body, headers=HEADERS, timeout=60)


def test_openai_data_url_image(servers):
    vision, _ = servers
    r = _openai(vision.url, "data:image/png;base64," + _png())
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 3 * 5 and usage["completion_tokens"] >= 1


def test_anthropic_base64_image(servers):
    vision, _ = servers
    r = _anthropic(vision.url, {"type": "base64", "media_type": "image/png", "data": _png()})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > 15


@pytest.mark.parametrize(
    ("image_url", "message"),
    [
        ("https://example.com/cat.png", "image_url must be a data URL"),
        ("data:image/png;base64," + base64.b64encode(b"garbage").decode(), "cannot decode the image"),
        ("data:image/png;base64,!!", "invalid base64"),
    ],
)
def test_openai_bad_images_are_400(servers, image_url, message):
    vision, _ = servers
    r = _openai(vision.url, image_url)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_anthropic_url_source_is_400(servers):
    vision, _ = servers
    r = _anthropic(vision.url, {"type": "url", "url": "https://example.com/cat.png"})
    assert r.status_code == 400 and "does not download images" in r.json()["error"]["message"], r.text


def test_model_without_projector_is_400(servers):
    _, text = servers
    r = _openai(text.url, "data:image/png;base64," + _png())
    assert r.status_code == 400 and "model has no vision support" in r.json()["error"]["message"], r.text
    r = _anthropic(text.url, {"type": "base64", "media_type": "image/png", "data": _png()})
    assert r.status_code == 400 and "model has no vision support" in r.json()["error"]["message"], r.text
