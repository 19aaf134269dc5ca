"""What every endpoint is built from: the server's configuration and shared state, request bodies read and
validated, and replies collected or streamed as server-sent events.

Both APIs (:mod:`.openai_api`, :mod:`.anthropic_api`) read their bodies through :func:`read_body`, which
enforces the size limit, parses JSON and validates it against the endpoint's pydantic model, so every
malformed request gets a 4xx in its API's own error schema.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from .api_error import ANTHROPIC_ERROR_SCHEMA, OPENAI_ERROR_SCHEMA, APIError
from .engine import Engine, Job, Piece
from .metrics import Metrics

if TYPE_CHECKING:
    from ..generation import TokenGuide
    from ..model import Model

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ServerConfig",
    "ServerState",
    "StrictBody",
    "body_models",
    "collect",
    "documented",
    "event_stream",
    "read_body",
    "read_request",
    "sse",
]

B = TypeVar("B", bound=BaseModel)

# Tokens a reply may have when its request does not say: a reply that never ends stops here, not at the end
# of the context (fit_max_tokens also clamps it to the room the context leaves).
DEFAULT_MAX_TOKENS = 4096


class StrictBody(BaseModel):
    """A request body part: strict types (no "1" for 1); unknown fields are ignored, as clients send many
    optional ones."""

    model_config = ConfigDict(strict=True, extra="ignore")


@dataclass
class ServerConfig:
    """How the server runs.

    ``model_name`` is the id clients name the model by (``aliases`` are accepted too); ``api_key`` (None:
    no authentication) is required as ``Authorization: Bearer KEY`` or ``x-api-key: KEY``. ``max_queue``
    requests may wait; a request fails after ``timeout`` seconds, queued or running; bodies over
    ``max_body`` bytes are refused; ``default_max_tokens`` is the length of replies whose request sets none
    (``DEFAULT_MAX_TOKENS``; None: the rest of the context); ``antislop`` bans the shipped list of overused
    phrases. ``parallel`` requests are generated at once, their model evaluations batched into shared steps.
    """

    model_name: str
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_queue: int = 64
    timeout: float = 600.0
    max_body: int = 16 * 1024 * 1024
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS
    antislop: bool = False
    parallel: int = 1


@dataclass
class ServerState:
    """What the endpoints share: the model, its engine and metrics, the configuration."""

    model: Model
    engine: Engine
    metrics: Metrics
    config: ServerConfig
    started: int

    def authorize(self, request: Request) -> None:
        """Raise :class:`APIError` (401) unless the request carries the API key (when one is set)."""
        key = self.config.api_key
        if key is None:
            return
        given = []
        auth = request.headers.get("authorization")
        if auth is not None:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() == "bearer":
                given.append(token.strip())
        if "x-api-key" in request.headers:
            given.append(request.headers["x-api-key"])
        if not given:
            raise APIError(
                401,
                "no API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                kind="authentication",
                code="invalid_api_key",
            )
        if not any(hmac.compare_digest(g.encode(), key.encode()) for g in given):
            raise APIError(401, "the API key is not valid", kind="authentication", code="invalid_api_key")

    def check_model(self, name: str) -> None:
        """Raise :class:`APIError` (404) unless ``name`` is the served model (or an alias)."""
        if name != self.config.model_name and name not in self.config.aliases:
            raise APIError(
                404,
                f"the model {name!r} does not exist here; this server serves {self.config.model_name!r}",
                kind="not_found",
                param="model",
                code="model_not_found",
            )

    def submit(
        self,
        prompts: list[list[int]],
        options: dict[str, Any],
        guide: TokenGuide | None = None,
        *,
        n: int = 1,
    ) -> Job:
        """Queue ``n`` generations of each of ``prompts`` with the configured timeout."""
        return self.engine.submit(prompts, options, n=n, guide=guide, timeout=self.config.timeout)


# The request models read_request validates, by name: the components of the OpenAPI document.
_BODIES: dict[str, type[BaseModel]] = {}


def documented(body: type[BaseModel] | None, *, anthropic: bool, stream: bool) -> dict[str, Any]:
    """``openapi_extra`` for a route: its request body, a ``body`` model that the handler reads through
    :func:`read_request` (FastAPI does not see it), and its answers: JSON, or with ``stream`` also server-sent
    events, and 4xx / 5xx in the API's error schema."""
    error = ANTHROPIC_ERROR_SCHEMA if anthropic else OPENAI_ERROR_SCHEMA
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    extra: dict[str, Any] = {
        "responses": {
            "200": {
                "description": "the reply" + (" (server-sent events with stream: true)" if stream else ""),
                "content": ok,
            },
            "4XX": {
                "description": "a request this server cannot answer",
                "content": {"application/json": {"schema": error}},
            },
            "5XX": {
                "description": "overloaded, timed out, or an internal error",
                "content": {"application/json": {"schema": error}},
            },
        }
    }
    if body is not None:
        _BODIES[body.__name__] = body
        ref = {"$ref": f"#/components/schemas/{body.__name__}"}
        extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return extra


def body_models() -> dict[str, type[BaseModel]]:
    """The request models :func:`documented` routes read, by name."""
    return dict(_BODIES)


def _field_path(loc: tuple[Any, ...]) -> str:
    """'messages[0].content' from a pydantic error location, without the labels of union members."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in item or item in ("str", "int", "float", "bool", "dict", "list", "none") or "-" in item:
            continue  # a union member's label, such as 'list[...]' or 'function-after[...]'
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _validation_error(e: ValidationError) -> APIError:
    grouped: dict[str, list[str]] = {}
    for err in e.errors(include_url=False):
        path = _field_path(tuple(err["loc"]))
        msg = err["msg"]
        if err["type"] == "missing":
            msg = "this field is required"
        if msg not in grouped.setdefault(path, []):
            grouped[path].append(msg)
    path, msgs = next(iter(grouped.items()))
    msgs = [m[0].lower() + m[1:] for m in msgs]
    lead = "input should be "
    if len(msgs) > 1 and all(m.startswith(lead) for m in msgs):  # a union: 'should be a string or a list'
        msgs = ["should be " + " or ".join(m[len(lead) :] for m in msgs)]
    message = f"{path or 'the body'}: {' or '.join(msgs)}"
    if len(grouped) > 1:
        message += f" (and {len(grouped) - 1} more problem{'s' if len(grouped) > 2 else ''})"
    return APIError(422, message, param=path or None)


async def read_request(request: Request, model: type[B]) -> tuple[ServerState, B]:
    """The server state and the request's body (a ``model`` with a ``model`` field), once the key is checked
    (401), the body read and validated (:func:`read_body`) and the model it names is this server's (404)."""
    state: ServerState = request.app.state.server
    state.authorize(request)
    body = await read_body(request, model, state.config.max_body)
    state.check_model(body.model)
    return state, body


async def read_body(request: Request, model: type[B], limit: int) -> B:
    """The request's JSON body validated against ``model``. Raises :class:`APIError`: 413 over ``limit``
    bytes, 400 for a missing or malformed body, 422 for one that does not match ``model``."""
    too_large = APIError(
        413, f"the request body is larger than {limit} bytes (see --max-body)", kind="too_large"
    )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    if not body.strip():
        raise APIError(400, "the request has no body: send a JSON object")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, not {type(data).__name__}")
    where = _lone_surrogate(data)
    if where is not None:
        raise APIError(
            400,
            f"{where or 'the body'}: the text holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
            "escape), which is not Unicode text; send each astral character as its surrogate pair",
            param=where or None,
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def _lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path ('messages[0].content') of the first string, key or value, of parsed JSON ``value`` that
    holds a lone surrogate (JSON allows ``"\\ud800"``; no tokenizer can encode it), or None."""
    if isinstance(value, str):
        return path if _has_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if _has_surrogate(key):
                return where.encode("utf-8", "backslashreplace").decode()
            found = _lone_surrogate(item, where)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


async def collect(job: Job, request: Request) -> list[Piece]:
    """All pieces of ``job``; a client that disconnects meanwhile cancels it."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return [piece async for piece in job.events()]
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """A server-sent-events response that proxies should pass on unbuffered."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event carrying ``data`` as JSON (or as is, for a str)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
