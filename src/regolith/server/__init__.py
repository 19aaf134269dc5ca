"""``regolith serve``: one model behind OpenAI- and Anthropic-compatible HTTP APIs (FastAPI + uvicorn).

``create_app(model, ServerConfig(...))`` builds the ASGI application; :func:`serve` runs it with uvicorn.
Endpoints, parameters and examples: docs/server.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .app import create_app
from .endpoint import DEFAULT_MAX_TOKENS, ServerConfig

if TYPE_CHECKING:
    from ..model import Model

__all__ = ["DEFAULT_MAX_TOKENS", "ServerConfig", "create_app", "serve"]


def serve(
    model: Model, config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"
) -> None:
    """Serve ``model`` on ``host``:``port`` until interrupted."""
    import uvicorn

    # On Ctrl-C, streams still open after 5 s are cancelled (which cancels their generations).
    uvicorn.run(
        create_app(model, config), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5
    )
