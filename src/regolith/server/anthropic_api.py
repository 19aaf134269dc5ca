"""The Anthropic-compatible endpoints: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from .api_error import APIError, anthropic_body
from .endpoint import ServerState, StrictBody, collect, documented, event_stream, read_request, sse
from .engine import Job
from .plan import ChatPrompt, Plan, chat_prompt, plan_chat, stop_sequence
from .reply import ToolCall

if TYPE_CHECKING:
    from ..generation import Generation
    from ..model import Model

__all__ = ["router"]

router = APIRouter()


class TextBlock(StrictBody):
    type: Literal["text"]
    text: str


class ToolUseBlock(StrictBody):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ImageSource(StrictBody):
    type: Literal["base64", "url", "file"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    file_id: str | None = None


class ImageBlock(StrictBody):
    type: Literal["image"]
    source: ImageSource
    cache_control: dict[str, Any] | None = None


class UnsupportedBlock(StrictBody):
    type: Literal[
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    ]


class ToolResultBlock(StrictBody):
    type: Literal["tool_result"]
    tool_use_id: str
    content: (
        str | list[Annotated[TextBlock | ImageBlock | UnsupportedBlock, Field(discriminator="type")]] | None
    ) = None
    is_error: bool | None = None


class ThinkingBlock(StrictBody):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(StrictBody):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock
    | ImageBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | UnsupportedBlock,
    Field(discriminator="type"),
]


class Message(StrictBody):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(StrictBody):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None


class ToolChoice(StrictBody):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(StrictBody):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(StrictBody):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictBody):
    effort: str | None = None
    format: OutputFormat | None = None


class CountTokensRequest(StrictBody):
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None

    def json_schema(self) -> dict[str, Any] | None:
        fmt = self.output_config.format if self.output_config is not None else None
        return fmt.schema_ if fmt is not None else None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: dict[str, Any] | None = None


def _unsupported(what: str, param: str) -> APIError:
    return APIError(400, f"{param}: {what} is not supported by this server", param=param)


def _image_part(block: ImageBlock, where: str) -> dict[str, Any]:
    """An image block as a chat content part: base64 data only (this server downloads nothing)."""
    src = block.source
    if src.type != "base64" or src.data is None:
        raise APIError(
            400,
            f"image source {src.type!r} is not supported: send the image inline "
            '({"type": "base64", "media_type": "image/png", "data": ...}); this server does not download images',
            param=f"{where}.source",
        )
    media = src.media_type or "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{src.data}"}}


def _result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        parts = []
        for i, part in enumerate(block.content):
            if not isinstance(part, TextBlock):
                raise _unsupported(f"{part.type} content in a tool result", f"{where}.content[{i}]")
            parts.append(part.text)
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def _conversation(req: CountTokensRequest) -> tuple[list[dict[str, Any]], str]:
    """The request as chat-template messages, and the prefill (the text of a trailing assistant message)."""
    out: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "\n\n".join(b.text for b in req.system)
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name
    prefill = ""
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        texts, calls, thinking, parts = [], [], [], []
        for j, b in enumerate(blocks):
            if isinstance(b, UnsupportedBlock):
                raise _unsupported(f"{b.type} blocks", f"{where}.content[{j}]")
            if isinstance(b, ImageBlock):
                if m.role != "user":
                    raise APIError(400, "image blocks belong in user messages", param=f"{where}.content[{j}]")
                parts.append(_image_part(b, f"{where}.content[{j}]"))
            elif isinstance(b, TextBlock):
                texts.append(b.text)
                parts.append({"type": "text", "text": b.text})
            elif isinstance(b, ToolUseBlock):
                if m.role != "assistant":
                    raise APIError(
                        400, "tool_use blocks belong in assistant messages", param=f"{where}.content[{j}]"
                    )
                names[b.id] = b.name
                calls.append(
                    {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                )
            elif isinstance(b, ToolResultBlock):
                if m.role != "user":
                    raise APIError(
                        400, "tool_result blocks belong in user messages", param=f"{where}.content[{j}]"
                    )
                result = {
                    "role": "tool",
                    "tool_call_id": b.tool_use_id,
                    "content": _result_text(b, f"{where}.content[{j}]"),
                }
                if b.tool_use_id in names:
                    result["name"] = names[b.tool_use_id]
                out.append(result)
            elif isinstance(b, ThinkingBlock):
                thinking.append(b.thinking)
        text = "".join(texts) if m.role == "assistant" else "\n\n".join(texts)
        if m.role == "user" and len(parts) > len(texts):  # with images: the blocks as content parts
            if out and out[-1]["role"] == "user":
                prev = out[-1]["content"]
                head = prev if isinstance(prev, list) else [{"type": "text", "text": prev}]
                out[-1]["content"] = [*head, {"type": "text", "text": "\n\n"}, *parts]
            else:
                out.append({"role": "user", "content": parts})
        elif m.role == "user":
            if texts:
                if out and out[-1]["role"] == "user":  # consecutive user turns are one turn
                    prev = out[-1]["content"]
                    out[-1]["content"] = (
                        prev + "\n\n" + text
                        if isinstance(prev, str)
                        else [*prev, {"type": "text", "text": "\n\n" + text}]
                    )
                else:
                    out.append({"role": "user", "content": text})
        elif i == len(req.messages) - 1 and not calls:
            prefill = text
        else:
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            out.append(msg)
    return out, prefill


def _tools(req: CountTokensRequest) -> tuple[list[dict[str, Any]] | None, str | None, bool]:
    """(tools as OpenAI function definitions, tool_choice for the planner, parallel calls allowed)."""
    tools = None
    if req.tools:
        tools = []
        for i, t in enumerate(req.tools):
            if t.type not in (None, "custom"):
                raise _unsupported(f"server tools such as {t.type!r}", f"tools[{i}]")
            function = {"name": t.name, "description": t.description or "", "parameters": t.input_schema}
            tools.append({"type": "function", "function": function})
    tc = req.tool_choice
    if tc is None:
        return tools, None, True
    if tc.type == "tool" and not tc.name:
        raise APIError(422, "tool_choice of type 'tool' needs the tool's name", param="tool_choice.name")
    choice = {"auto": "auto", "any": "required", "none": "none", "tool": tc.name}[tc.type]
    return tools, choice, not tc.disable_parallel_tool_use


def _prompt(state: ServerState, req: CountTokensRequest) -> ChatPrompt:
    messages, prefill = _conversation(req)
    tools, choice, _ = _tools(req)
    thinking = None if req.thinking is None else req.thinking.type != "disabled"
    schema = req.json_schema()
    return chat_prompt(
        state.model,
        messages,
        tools=tools,
        tool_choice=choice,
        json_schema=schema,
        json_mode=schema is not None,
        thinking=thinking,
        reasoning_effort=req.output_config.effort if req.output_config is not None else None,
        prefill=prefill,
    )


@router.post(
    "/v1/messages/count_tokens", openapi_extra=documented(CountTokensRequest, anthropic=True, stream=False)
)
async def count_tokens(request: Request) -> Any:
    state, req = await read_request(request, CountTokensRequest)
    prompt = await asyncio.to_thread(_prompt, state, req)
    return {"input_tokens": len(prompt.ids)}


def _stop_reason(
    gen: Generation | None, calls: list[ToolCall], stops: list[str], model: Model
) -> tuple[str, str | None]:
    if calls:
        return "tool_use", None
    if gen is not None and gen.finish_reason == "length":
        return "max_tokens", None
    seq = stop_sequence(model, gen, stops) if gen is not None else None
    return ("stop_sequence", seq) if seq is not None else ("end_turn", None)


def _usage(plan: Plan, job: Job) -> dict[str, int]:
    gen = job.generation
    cached = gen.stats.cached_tokens if gen is not None else 0
    return {
        "input_tokens": len(plan.prompt) - cached,
        "output_tokens": len(gen.tokens) if gen is not None else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


@router.post("/v1/messages", openapi_extra=documented(MessagesRequest, anthropic=True, stream=True))
async def messages(request: Request) -> Any:
    state, req = await read_request(request, MessagesRequest)
    budget = None
    if req.thinking is not None and req.thinking.type == "enabled":
        if req.thinking.budget_tokens is None:
            raise APIError(
                422, "thinking of type 'enabled' needs budget_tokens", param="thinking.budget_tokens"
            )
        if req.thinking.budget_tokens >= req.max_tokens:
            raise APIError(
                400, "thinking.budget_tokens must be less than max_tokens", param="thinking.budget_tokens"
            )
        budget = req.thinking.budget_tokens
    prompt = await asyncio.to_thread(_prompt, state, req)
    _, _, parallel = _tools(req)
    sampling = {k: getattr(req, k) for k in ("temperature", "top_p", "top_k") if getattr(req, k) is not None}
    stops = list(req.stop_sequences or [])
    schema = req.json_schema()
    plan = await asyncio.to_thread(  # a grammar's compilation may take a while
        plan_chat,
        state.model,
        prompt,
        response_format="json_schema" if schema is not None else None,
        json_schema=schema,
        thinking_budget=budget,
        parallel_tool_calls=parallel,
        max_tokens=req.max_tokens,
        stop=stops,
        sampling=sampling,
        antislop=state.config.antislop,
    )
    job = state.submit([plan.prompt], plan.options, plan.guide)
    message = {
        "id": "msg_" + secrets.token_hex(12),
        "type": "message",
        "role": "assistant",
        "model": req.model,
    }
    omit = req.thinking is not None and req.thinking.display == "omitted"
    if req.stream:
        return event_stream(_stream(state, job, plan, message, stops, omit))

    parser = plan.parser()
    for piece in await collect(job, request):
        parser.feed(piece.text)
    parser.finish()
    calls = parser.calls if plan.parallel_tool_calls else parser.calls[:1]
    stop_reason, seq = _stop_reason(job.generation, calls, stops, state.model)
    problem = None if calls else plan.json_problem(parser.text, job.generation)
    if problem is not None:
        raise problem
    content: list[dict[str, Any]] = []
    if parser.thinking:
        content.append({"type": "thinking", "thinking": "" if omit else parser.thinking, "signature": ""})
    if parser.text:
        content.append({"type": "text", "text": parser.text})
    content += [
        {"type": "tool_use", "id": "toolu_" + c.id, "name": c.name, "input": c.arguments} for c in calls
    ]
    return {
        **message,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": seq,
        "usage": _usage(plan, job),
    }


async def _stream(
    state: ServerState, job: Job, plan: Plan, message: dict[str, Any], stops: list[str], omit_thinking: bool
) -> AsyncIterator[str]:
    """The Messages streaming events: message_start, ping, content blocks (start, deltas, stop) for thinking,
    text and tool_use, message_delta (stop reason, usage) and message_stop; an error event if it fails."""
    parser = plan.parser()
    index = -1
    open_kind: str | None = None

    def block_events(kind: str, text: str) -> list[str]:
        nonlocal index, open_kind
        events = []
        if kind != open_kind:
            events += close_block()
            index += 1
            open_kind = kind
            start = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            events.append(
                sse(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
        if kind == "thinking" and omit_thinking:
            return events
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if kind == "thinking"
            else {"type": "text_delta", "text": text}
        )
        events.append(
            sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
        )
        return events

    def close_block() -> list[str]:
        nonlocal open_kind
        if open_kind is None:
            return []
        events = []
        if open_kind == "thinking":
            delta = {"type": "signature_delta", "signature": ""}
            events.append(
                sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
            )
        events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        open_kind = None
        return events

    usage = {"input_tokens": len(plan.prompt), "output_tokens": 0}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    try:
        yield sse({"type": "message_start", "message": start}, "message_start")
        yield sse({"type": "ping"}, "ping")
        async for piece in job.pieces():
            for kind, text in parser.feed(piece):
                for event in block_events(kind, text):
                    yield event
        for kind, text in parser.finish():
            for event in block_events(kind, text):
                yield event
        for event in close_block():
            yield event
        calls = parser.calls if plan.parallel_tool_calls else parser.calls[:1]
        for c in calls:
            index += 1
            block = {"type": "tool_use", "id": "toolu_" + c.id, "name": c.name, "input": {}}
            yield sse(
                {"type": "content_block_start", "index": index, "content_block": block}, "content_block_start"
            )
            delta = {"type": "input_json_delta", "partial_json": c.arguments_json}
            yield sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
            yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
        stop_reason, seq = _stop_reason(job.generation, calls, stops, state.model)
        problem = None if calls else plan.json_problem(parser.text, job.generation)
        if problem is not None:
            raise problem
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": seq},
            "usage": _usage(plan, job),
        }
        yield sse(delta, "message_delta")
        yield sse({"type": "message_stop"}, "message_stop")
    except APIError as e:
        yield sse(anthropic_body(e), "error")
    finally:
        job.cancel()
