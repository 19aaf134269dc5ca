"""Errors a request can meet, rendered in each API's own error schema.

OpenAI: ``{"error": {"message", "type", "param", "code"}}``.
Anthropic: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ANTHROPIC_ERROR_SCHEMA", "OPENAI_ERROR_SCHEMA", "APIError", "anthropic_body", "openai_body"]

# kind -> (OpenAI type, Anthropic type)
_TYPES = {
    "invalid_request": ("invalid_request_error", "invalid_request_error"),
    "authentication": ("authentication_error", "authentication_error"),
    "not_found": ("not_found_error", "not_found_error"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "overloaded": ("server_error", "overloaded_error"),
    "timeout": ("timeout_error", "api_error"),
    "server": ("server_error", "api_error"),
}


class APIError(Exception):
    """An HTTP error answer: ``status``, a message that says what is wrong and what to do, and its ``kind``
    (a key of the type table: invalid_request, authentication, not_found, too_large, overloaded, timeout,
    server). ``param`` names the request field at fault; ``code`` is OpenAI's machine-readable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request",
        param: str | None = None,
        code: str | None = None,
    ):
        if kind not in _TYPES:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code


def openai_body(e: APIError) -> dict[str, Any]:
    """``e`` in OpenAI's error schema."""
    return {"error": {"message": e.message, "type": _TYPES[e.kind][0], "param": e.param, "code": e.code}}


def anthropic_body(e: APIError) -> dict[str, Any]:
    """``e`` in Anthropic's error schema."""
    return {"type": "error", "error": {"type": _TYPES[e.kind][1], "message": e.message}}


# The two error bodies as JSON schemas (the server's OpenAPI document).
OPENAI_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
