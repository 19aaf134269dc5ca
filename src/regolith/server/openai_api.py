"""The OpenAI-compatible endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from .api_error import APIError, openai_body
from .endpoint import ServerState, StrictBody, collect, documented, event_stream, read_request, sse
from .engine import Job, Piece
from .logprobs import CompletionLogprobs, chat_logprobs, merge
from .plan import Plan, chat_prompt, check_sampling, fit_max_tokens, grammar_guide, plan_chat
from .reply import HarmonyParser, ReplyParser, ToolCall

if TYPE_CHECKING:
    from ..generation import Generation
    from ..logprobs import TokenLogprob

__all__ = ["router"]

router = APIRouter()

# The most choices a request may ask for (n, times the prompts of a completions request): they are generated
# one after another.
MAX_CHOICES = 16
# The most alternatives per token that top_logprobs (chat) and logprobs (completions) may ask for (vLLM's
# default limit; OpenAI's are 20 and 5).
MAX_TOP_LOGPROBS = 20


class ImageUrl(StrictBody):
    url: str
    detail: str | None = None


class ContentPart(StrictBody):
    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


Content = str | list[ContentPart]


class FunctionCall(StrictBody):
    name: str
    arguments: str | dict[str, Any]


class ToolCallIn(StrictBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(StrictBody):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(StrictBody):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(StrictBody):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(StrictBody):
    name: str


class NamedToolChoice(StrictBody):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(StrictBody):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictBody):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(StrictBody):
    include_usage: bool | None = None


Probability = Annotated[float, Field(gt=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]


class _Sampling(StrictBody):
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)]
        | None
    ) = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    user: str | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None  # llama-server's: GBNF (or Lark)

    def sampling(self) -> dict[str, Any]:
        """:class:`regolith.SamplingParams` fields the request sets (the server's defaults fill the rest)."""
        out = {
            k: getattr(self, k)
            for k in (
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "repeat_penalty",
                "presence_penalty",
                "frequency_penalty",
                "seed",
            )
            if getattr(self, k) is not None
        }
        if self.logit_bias:
            bias = {}
            for key, value in self.logit_bias.items():
                if not key.isdigit():
                    raise APIError(422, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
                bias[int(key)] = value
            out["logit_bias"] = bias
        return out

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(_Sampling):
    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's and llama-server's: more template variables
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None


class CompletionRequest(_Sampling):
    model: str
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | list[int]
        | Annotated[list[list[int]], Field(min_length=1)]
    )
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    suffix: str | None = None
    best_of: int | None = None


def _unsupported(what: str, param: str) -> APIError:
    return APIError(400, f"{what} is not supported by this server", param=param)


def _text(content: Content | None, where: str) -> str | list[dict[str, Any]]:
    """The text of a message's content (text parts joined), or with images its parts (text and
    ``image_url`` with a data URL); other part types are not supported."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if part.type == "image_url" and part.image_url is not None:
            if not part.image_url.url.startswith("data:"):
                raise APIError(
                    400,
                    "image_url must be a data URL (data:image/png;base64,...); this server does not download "
                    "images",
                    param=f"{where}[{i}].image_url.url",
                )
            parts.append({"type": "image_url", "image_url": {"url": part.image_url.url}})
        elif part.type == "text" and part.text is not None:
            parts.append({"type": "text", "text": part.text})
        else:
            raise _unsupported(f"content of type {part.type!r}", f"{where}[{i}]")
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _arguments(call: ToolCallIn, where: str) -> dict[str, Any]:
    args = call.function.arguments
    if isinstance(args, dict):
        return args
    try:
        parsed = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError:
        raise APIError(422, "tool call arguments must be a JSON object", param=where) from None
    if not isinstance(parsed, dict):
        raise APIError(422, "tool call arguments must be a JSON object", param=where)
    return parsed


def _messages(req: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages in the chat template's form."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        content = _text(m.content, f"{where}.content")
        if not isinstance(content, str) and m.role != "user":
            raise APIError(400, "images belong in user messages", param=f"{where}.content")
        if m.role == "function":
            raise _unsupported("the 'function' role (deprecated; use 'tool')", f"{where}.role")
        if m.role in ("system", "developer"):
            out.append({"role": "system", "content": content})
        elif m.role == "user":
            out.append({"role": "user", "content": content})
        elif m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if m.tool_calls:
                msg["tool_calls"] = []
                for j, call in enumerate(m.tool_calls):
                    call_id = call.id or f"call_{i}_{j}"
                    names[call_id] = call.function.name
                    args = _arguments(call, f"{where}.tool_calls[{j}].function.arguments")
                    msg["tool_calls"].append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": args},
                        }
                    )
            if m.reasoning_content:
                msg["reasoning_content"] = m.reasoning_content
            out.append(msg)
        else:
            if m.tool_call_id is None:
                raise APIError(
                    422, "a tool message needs the tool_call_id it answers", param=f"{where}.tool_call_id"
                )
            msg = {"role": "tool", "tool_call_id": m.tool_call_id, "content": content}
            name = m.name or names.get(m.tool_call_id)
            if name is not None:
                msg["name"] = name
            out.append(msg)
    return out


def _usage(n_prompt: int, gens: list[Generation]) -> dict[str, Any]:
    """OpenAI's usage: each prompt counted once, the tokens of every choice, the first choice's cached
    prompt tokens (the other choices of a prompt restore its state)."""
    completion = sum(len(g.tokens) for g in gens)
    cached = gens[0].stats.cached_tokens if gens else 0
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": completion,
        "total_tokens": n_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _finish(gen: Generation | None) -> str:
    return "length" if gen is not None and gen.finish_reason == "length" else "stop"


def _tool_calls(calls: list[ToolCall], *, streamed: bool) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        call: dict[str, Any] = {
            "id": "call_" + c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_json},
        }
        out.append({"index": i, **call} if streamed else call)
    return out


def _response_format(req: ChatRequest) -> tuple[str | None, dict[str, Any] | None]:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None, None
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise APIError(
                422, "response_format json_schema needs json_schema.schema", param="response_format"
            )
        return "json_schema", fmt.json_schema.schema_
    return "json_object", None


def _check_chat_supported(req: ChatRequest) -> None:
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    for name in ("audio", "prediction", "web_search_options"):
        if getattr(req, name) is not None:
            raise _unsupported(name, name)
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise _unsupported("output modalities other than text", "modalities")
    if req.functions is not None or req.function_call is not None:
        raise _unsupported("functions / function_call (deprecated; use tools / tool_choice)", "functions")


def _chunk(
    base: dict[str, Any],
    delta: dict[str, Any],
    finish: str | None = None,
    *,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> str:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return sse({**base, "choices": [choice]})


def _by_choice(pieces: list[Piece], n: int) -> list[list[Piece]]:
    out: list[list[Piece]] = [[] for _ in range(n)]
    for piece in pieces:
        out[piece.index].append(piece)
    return out


class _ChatChoice:
    """One chat choice as its pieces come: the reply parser and the log-probabilities not yet sent."""

    def __init__(self, plan: Plan, gen: Generation | None):
        self.plan, self.gen = plan, gen
        self.parser: ReplyParser | HarmonyParser = plan.parser()
        self.pending: list[TokenLogprob] = []

    def end(self) -> tuple[list[ToolCall], str, APIError | None]:
        """The tool calls, finish reason and JSON problem once the reply is complete (after parser.finish)."""
        parser, plan = self.parser, self.plan
        calls = parser.calls if plan.parallel_tool_calls else parser.calls[:1]
        finish = "tool_calls" if calls else _finish(self.gen)
        return calls, finish, None if calls else plan.json_problem(parser.text, self.gen)


@router.post("/v1/chat/completions", openapi_extra=documented(ChatRequest, anthropic=False, stream=True))
async def chat_completions(request: Request) -> Any:
    state, req = await read_request(request, ChatRequest)
    _check_chat_supported(req)
    fmt, schema = _response_format(req)
    choice = (
        req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else req.tool_choice
    )
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    prompt = await asyncio.to_thread(
        chat_prompt,
        state.model,
        _messages(req),
        tools=tools,
        tool_choice=choice,
        json_schema=schema,
        json_mode=fmt is not None,
        reasoning_effort=req.reasoning_effort,
        template_kwargs=req.chat_template_kwargs,
    )
    plan = await asyncio.to_thread(  # a grammar's compilation may take a while
        plan_chat,
        state.model,
        prompt,
        response_format=fmt,
        json_schema=schema,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        default_max_tokens=state.config.default_max_tokens,
        stop=req.stops(),
        sampling=req.sampling(),
        antislop=state.config.antislop,
        grammar=req.grammar,
    )
    if req.logprobs:
        plan.options["logprobs"] = req.top_logprobs or 0
    n = req.n or 1
    job = state.submit([plan.prompt], plan.options, plan.guide, n=n)
    base = {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": "regolith",
    }
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return event_stream(_stream_chat(state, job, plan, base, include_usage, bool(req.logprobs)))

    choices = []
    pieces_by_choice = _by_choice(await collect(job, request), n)
    for i, pieces in enumerate(pieces_by_choice):
        out = _ChatChoice(plan, job.generations[i] if i < len(job.generations) else None)
        for piece in pieces:
            out.parser.feed(piece.text)
            out.pending += piece.logprobs
        out.parser.finish()
        calls, finish, problem = out.end()
        if problem is not None:
            raise problem
        parser = out.parser
        message: dict[str, Any] = {"role": "assistant", "content": parser.text or (None if calls else "")}
        if parser.thinking:
            message["reasoning_content"] = parser.thinking
        if calls:
            message["tool_calls"] = _tool_calls(calls, streamed=False)
        logprobs = chat_logprobs(state.model.tokenizer, out.pending) if req.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
    return {**base, "choices": choices, "usage": _usage(len(plan.prompt), job.generations)}


async def _stream_chat(
    state: ServerState, job: Job, plan: Plan, base: dict[str, Any], include_usage: bool, logprobs: bool
) -> AsyncIterator[str]:
    base = {**base, "object": "chat.completion.chunk"}
    keys = {"thinking": "reasoning_content", "text": "content"}
    tok = state.model.tokenizer
    choices: dict[int, _ChatChoice] = {}

    def chunk(i: int, delta: dict[str, Any], finish: str | None = None) -> str:
        out = choices[i]
        lp = chat_logprobs(tok, out.pending) if logprobs and out.pending else None
        out.pending = []
        return _chunk(base, delta, finish, index=i, logprobs=lp)

    try:
        async for piece in job.events():
            i = piece.index
            if i not in choices:
                choices[i] = _ChatChoice(plan, job.generations[i])
                yield _chunk(base, {"role": "assistant", "content": ""}, index=i)
            out = choices[i]
            out.pending += piece.logprobs
            for kind, text in out.parser.feed(piece.text):
                yield chunk(i, {keys[kind]: text})
            if not piece.done:
                continue
            for kind, text in out.parser.finish():
                yield chunk(i, {keys[kind]: text})
            calls, finish, problem = out.end()
            if calls:
                yield chunk(i, {"tool_calls": _tool_calls(calls, streamed=True)})
            if problem is not None:
                yield sse(openai_body(problem))
                break
            yield chunk(i, {}, finish)
        else:
            if include_usage:
                yield sse({**base, "choices": [], "usage": _usage(len(plan.prompt), job.generations)})
    except APIError as e:
        yield sse(openai_body(e))
    finally:
        job.cancel()
    yield "data: [DONE]\n\n"


def _completion_prompts(state: ServerState, req: CompletionRequest) -> list[list[int]]:
    """The request's prompts as token ids (a string is tokenized with BOS as the model asks)."""
    p = req.prompt
    prompts = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
    vocab = state.model.config["vocab_size"]
    out = []
    for k, prompt in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        ids = state.model.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(422, f"prompt token {bad[0]} is outside the vocabulary of {vocab}", param=where)
        if not ids:
            raise APIError(400, "the prompt is empty", param=where)
        out.append(ids)
    return out


@router.post("/v1/completions", openapi_extra=documented(CompletionRequest, anthropic=False, stream=True))
async def completions(request: Request) -> Any:
    state, req = await read_request(request, CompletionRequest)
    if req.suffix:
        raise _unsupported("suffix (fill-in-the-middle)", "suffix")
    if req.best_of is not None and req.best_of > 1:
        raise _unsupported("best_of > 1", "best_of")
    prompts = await asyncio.to_thread(_completion_prompts, state, req)
    n = req.n or 1
    if len(prompts) * n > MAX_CHOICES:
        raise APIError(
            400,
            f"{len(prompts)} prompts times n = {n} make {len(prompts) * n} choices; at most {MAX_CHOICES} per "
            "request",
            param="n",
        )
    sampling = req.sampling()
    check_sampling(state.model, sampling)
    # A reply also ends where the context is full, so the longest prompt's room does not cut the others'.
    n_max = max(
        fit_max_tokens(state.model, len(p), req.max_tokens, state.config.default_max_tokens) for p in prompts
    )
    options = {"max_tokens": n_max, "stop": req.stops(), "antislop": state.config.antislop, **sampling}
    if req.logprobs is not None:
        options["logprobs"] = req.logprobs
        if req.echo:
            options["prompt_logprobs"] = req.logprobs
    guide = (
        await asyncio.to_thread(grammar_guide, state.model, req.grammar) if req.grammar is not None else None
    )
    job = state.submit(prompts, options, guide, n=n)
    base = {
        "id": "cmpl-" + secrets.token_hex(12),
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": "regolith",
    }
    n_prompt = sum(len(p) for p in prompts)
    out = _Completions(state, req, prompts, n, job)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return event_stream(_stream_completion(job, out, base, n_prompt, include_usage))
    choices = []
    for i, pieces in enumerate(_by_choice(await collect(job, request), len(prompts) * n)):
        text, logprobs = out.start(i)
        for piece in pieces:
            text += piece.text
            logprobs += out.generated(i, piece.logprobs)
        lp = merge(logprobs) if req.logprobs is not None else None
        choices.append({"text": text, "index": i, "logprobs": lp, "finish_reason": _finish(out.gen(i))})
    return {**base, "choices": choices, "usage": _usage(n_prompt, job.generations)}


class _Completions:
    """The choices of a completions request as their pieces come: each one's echoed prompt and the
    log-probabilities of its tokens (with ``logprobs``), its offsets counted in its own text."""

    def __init__(
        self, state: ServerState, req: CompletionRequest, prompts: list[list[int]], n: int, job: Job
    ):
        self._tok = state.model.tokenizer
        self._req, self._prompts, self._n, self._job = req, prompts, n, job
        self._logprobs: dict[int, CompletionLogprobs] = {}

    def gen(self, i: int) -> Generation | None:
        gens = self._job.generations
        return gens[i] if i < len(gens) else None

    def start(self, i: int) -> tuple[str, list[dict[str, Any]]]:
        """Choice ``i``'s echo (or ''), and its prompt's logprobs lists when asked for (once the choice's
        prompt is evaluated: at its first piece)."""
        self._logprobs[i] = CompletionLogprobs(self._tok)
        if not self._req.echo:
            return "", []
        prompt = self._prompts[i // self._n]
        echo = self._tok.decode(prompt, skip_special=True)
        gen = self.gen(i)
        if self._req.logprobs is None or gen is None or gen.prompt_logprobs is None:
            return echo, []
        return echo, [self._logprobs[i].prompt(prompt, gen.prompt_logprobs)]

    def generated(self, i: int, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
        """The logprobs lists of choice ``i``'s next generated tokens (none without ``logprobs``)."""
        if self._req.logprobs is None or not entries:
            return []
        return [self._logprobs[i].generated(entries)]


async def _stream_completion(
    job: Job, out: _Completions, base: dict[str, Any], n_prompt: int, include_usage: bool
) -> AsyncIterator[str]:
    def chunk(i: int, text: str, logprobs: list[dict[str, Any]], finish: str | None = None) -> str:
        lp = merge(logprobs) if logprobs else None
        return sse({**base, "choices": [{"text": text, "index": i, "logprobs": lp, "finish_reason": finish}]})

    started: set[int] = set()
    try:
        async for piece in job.events():
            i = piece.index
            if i not in started:
                started.add(i)
                echo, logprobs = out.start(i)
                if echo or logprobs:
                    yield chunk(i, echo, logprobs)
            logprobs = out.generated(i, piece.logprobs)
            if piece.text or logprobs:
                yield chunk(i, piece.text, logprobs)
            if piece.done:
                yield chunk(i, "", [], _finish(out.gen(i)))
        if include_usage:
            yield sse({**base, "choices": [], "usage": _usage(n_prompt, job.generations)})
    except APIError as e:
        yield sse(openai_body(e))
    finally:
        job.cancel()
    yield "data: [DONE]\n\n"


def _model_card(state: ServerState, name: str, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.started))
        return {"type": "model", "id": name, "display_name": name, "created_at": created}
    return {"id": name, "object": "model", "created": state.started, "owned_by": "regolith"}


@router.get("/v1/models", openapi_extra=documented(None, anthropic=False, stream=False))
async def models(request: Request) -> Any:
    """The served model (in Anthropic's list format when the request has an ``anthropic-version`` header)."""
    state: ServerState = request.app.state.server
    state.authorize(request)
    names = [state.config.model_name, *state.config.aliases]
    if "anthropic-version" in request.headers:
        data = [_model_card(state, n, True) for n in names]
        return {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    return {"object": "list", "data": [_model_card(state, n, False) for n in names]}


@router.get("/v1/models/{name:path}", openapi_extra=documented(None, anthropic=False, stream=False))
async def model(name: str, request: Request) -> Any:
    state: ServerState = request.app.state.server
    state.authorize(request)
    state.check_model(name)
    return _model_card(state, name, "anthropic-version" in request.headers)
