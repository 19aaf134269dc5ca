"""The FastAPI application: the OpenAI and Anthropic routers (:mod:`.openai_api`, :mod:`.anthropic_api`) and
the tokenizer's (:mod:`.tokenize_api`), errors answered in each API's own schema, health, metrics and request
counting.

What the endpoints share (configuration, state, reading bodies, streaming) is in :mod:`.endpoint`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from . import anthropic_api, openai_api, tokenize_api
from .api_error import APIError, anthropic_body, openai_body
from .endpoint import ServerConfig, ServerState, body_models, documented, sse
from .engine import Engine
from .metrics import Metrics

if TYPE_CHECKING:
    from ..model import Model

__all__ = ["ServerConfig", "create_app", "error_event", "error_response"]

log = logging.getLogger("regolith.server")

# Paths counted under their own name in the metrics (anything else is "other").
_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/health",
    "/metrics",
)


def _anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(e: APIError, path: str) -> JSONResponse:
    """``e`` in the error schema of the API ``path`` belongs to (Anthropic's overload status is 529)."""
    if _anthropic_path(path):
        status = 529 if e.kind == "overloaded" else e.status
        return JSONResponse(anthropic_body(e), status_code=status)
    return JSONResponse(openai_body(e), status_code=e.status)


def error_event(e: APIError, path: str) -> str:
    """``e`` as the server-sent event that ends a stream of the API ``path`` belongs to (OpenAI: a data line
    with the error body; Anthropic: an ``error`` event)."""
    if _anthropic_path(path):
        return sse(anthropic_body(e), "error")
    return sse(openai_body(e))


class _CountRequests:
    """ASGI middleware counting answered requests by path and status."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counted(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            path = scope["path"] if scope["path"] in _PATHS else "other"
            self.metrics.record_request(path, status)


_DESCRIPTION = (
    "OpenAI- and Anthropic-compatible endpoints of a regolith server (docs/server.md). Request bodies are "
    "read and validated by the server itself, against the schemas below; errors come in each API's own schema."
)


def _openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document of ``app``'s routes with the request bodies the handlers validate themselves
    (:func:`.endpoint.documented`) and the API-key schemes."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, model in body_models().items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for sub, sub_schema in schema.pop("$defs", {}).items():
            if schemas.setdefault(sub, sub_schema) != sub_schema:
                raise AssertionError(f"two request models named {sub} with different schemas")
        schemas[name] = schema
    doc["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"},
        "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }
    doc["security"] = [{"bearer": []}, {"x-api-key": []}, {}]
    return doc


class _Options:
    """ASGI middleware answering ``OPTIONS``: 204 with the ``Allow`` header of the 405 the route gives any
    method it lacks (so every route answers it; a path that is no route stays 404)."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        replaced = False

        async def answer(message: dict[str, Any]) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 405:
                replaced = True
                allow = [(k, v) for k, v in message.get("headers", []) if k.lower() == b"allow"]
                await send({"type": "http.response.start", "status": 204, "headers": allow})
                await send({"type": "http.response.body", "body": b""})
            elif not replaced:
                await send(message)

        await self.app(scope, receive, answer)


def create_app(model: Model, config: ServerConfig) -> FastAPI:
    """The server's ASGI application for ``model``. The generation worker starts and stops with the app's
    lifespan (uvicorn runs it)."""
    metrics = Metrics()
    engine = Engine(model, metrics, max_queue=config.max_queue, parallel=config.parallel)
    state = ServerState(model=model, engine=engine, metrics=metrics, config=config, started=int(time.time()))
    model.chat_template  # noqa: B018 - compiled now: a broken template fails at start, not per request

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(
        title="regolith",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.server = state
    app.add_middleware(_CountRequests, metrics=metrics)
    app.add_middleware(_Options)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return error_response(e, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            err = APIError(404, f"there is no endpoint {request.method} {request.url.path}", kind="not_found")
        elif e.status_code == 405:
            methods = [m for m in (e.headers or {}).get("Allow", "").split(", ") if m]
            allowed = ", ".join([*methods, "OPTIONS"])
            e.headers = {**(e.headers or {}), "Allow": allowed}
            err = APIError(405, f"{request.url.path} does not accept {request.method}; it accepts {allowed}")
        else:
            err = APIError(
                e.status_code, str(e.detail), kind="server" if e.status_code >= 500 else "invalid_request"
            )
        reply = error_response(err, request.url.path)
        if e.headers:
            reply.headers.update(e.headers)
        return reply

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("internal error")
        err = APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server")
        return error_response(err, request.url.path)

    # The endpoints read the state from the request, not from this function's scope: FastAPI keeps what it
    # learns of an endpoint function for the process's life, and a closure would keep the model with it.
    @app.get("/health", openapi_extra=documented(None, anthropic=False, stream=False))
    async def health(request: Request) -> dict[str, Any]:
        server: ServerState = request.app.state.server
        return {
            "status": "ok",
            "model": server.config.model_name,
            "busy": server.engine.busy,
            "queue_depth": server.engine.queue_depth,
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus(request: Request) -> Response:
        server: ServerState = request.app.state.server
        server.authorize(request)
        engine, model = server.engine, server.model
        return PlainTextResponse(
            server.metrics.render(
                queue_depth=engine.queue_depth,
                busy=engine.busy,
                running=engine.running,
                cache=model.prompt_cache.stats if model.prompt_cache is not None else None,
                experts=model.stats() if model.plan is not None and model.plan.streaming else None,
            ),
            media_type="text/plain; version=0.0.4",
        )

    app.include_router(openai_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(tokenize_api.router)
    return app
