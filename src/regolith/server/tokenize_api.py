"""The served model's tokenizer over HTTP, in vLLM's shapes: ``POST /tokenize``, ``POST /detokenize`` and
``GET /tokenizer_info``. Evaluation tools that score token by token (lm-evaluation-harness's
``local-completions`` finds them by itself) tokenize with the model's own tokenizer this way, then send the
ids to ``/v1/completions``."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field

from .api_error import APIError
from .endpoint import ServerState, StrictBody, documented, read_body

__all__ = ["router"]

router = APIRouter()


class TokenizeRequest(StrictBody):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(StrictBody):
    tokens: list[Annotated[int, Field(ge=0)]]
    model: str | None = None


async def _read(request: Request, body: type[StrictBody]) -> tuple[ServerState, Any]:
    state: ServerState = request.app.state.server
    state.authorize(request)
    req = await read_body(request, body, state.config.max_body)
    if req.model is not None:
        state.check_model(req.model)
    return state, req


@router.post("/tokenize", openapi_extra=documented(TokenizeRequest, anthropic=False, stream=False))
async def tokenize(request: Request) -> Any:
    """The ids of ``prompt`` (special-token text such as ``<|im_start|>`` read as the special token;
    ``add_special_tokens``: BOS / EOS as the model asks)."""
    state, req = await _read(request, TokenizeRequest)
    tok = state.model.tokenizer
    ids = await asyncio.to_thread(tok.encode, req.prompt, add_special=req.add_special_tokens)
    strs = [tok.id_to_token(i) for i in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.model.n_ctx, "tokens": ids, "token_strs": strs}


@router.post("/detokenize", openapi_extra=documented(DetokenizeRequest, anthropic=False, stream=False))
async def detokenize(request: Request) -> Any:
    """The text of ``tokens`` (control tokens as their text)."""
    state, req = await _read(request, DetokenizeRequest)
    vocab = state.model.config["vocab_size"]
    bad = [t for t in req.tokens if t >= vocab]
    if bad:
        raise APIError(422, f"token {bad[0]} is outside the vocabulary of {vocab}", param="tokens")
    return {"prompt": state.model.detokenize(req.tokens)}


@router.get("/tokenizer_info", openapi_extra=documented(None, anthropic=False, stream=False))
async def tokenizer_info(request: Request) -> Any:
    """The tokenizer's special tokens, chat template and context, as vLLM's endpoint of that name."""
    state: ServerState = request.app.state.server
    state.authorize(request)
    tok = state.model.tokenizer

    def text(token: int | None) -> str | None:
        return tok.id_to_token(token) if token is not None else None

    return {
        "tokenizer_class": "regolith",
        "bos_token": text(tok.bos_id),
        "eos_token": text(tok.eos_id),
        "pad_token": text(tok.pad_id),
        "add_bos_token": tok.add_bos,
        "vocab_size": tok.vocab_size,
        "model_max_length": state.model.n_ctx,
        "chat_template": state.model.chat_template.source,
    }
