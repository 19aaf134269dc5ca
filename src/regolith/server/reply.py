"""Reading a model's reply as the APIs need it: thinking, answer text and tool calls.

Models write tool calls in their own formats, which their chat templates teach them:

- Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen3-Coder puts
  ``<function=NAME><parameter=KEY>VALUE</parameter></function>`` inside the tags, also recognised alone);
- Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` or ``[TOOL_CALLS]NAME[ARGS]{...}``;
- Llama 3.x: ``<|python_tag|>{"name": ..., "parameters": {...}}`` (several separated by ``;``);
- a bare JSON object (or a list of them, or a ```` ```json ```` block) with ``name`` and
  ``arguments`` / ``parameters``, which small models write even when their template asks for tags; the
  reply must begin with it and the name must be one of the offered tools.

:class:`ReplyParser` takes the reply as streamed text pieces and releases thinking and answer text as soon as
nothing can change them; from the first sign of a tool call the rest is held and parsed at the end.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReplyParser", "ToolCall", "parse_tool_calls"]

# Markers that begin a tool call anywhere in a reply.
TAGGED_OPENERS = ("<tool_call>", "<function=", "[TOOL_CALLS]", "<|python_tag|>")
# Ways a reply can begin with a bare JSON tool call.
BARE_OPENERS = ("{", "[{", "```json")

_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: secrets.token_hex(12))

    @property
    def arguments_json(self) -> str:
        """The arguments as JSON text (OpenAI's ``function.arguments``)."""
        return json.dumps(self.arguments, ensure_ascii=False)


def _call_from_json(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def _json_values(text: str, pos: int = 0, sep: str = "") -> list[tuple[Any, int]]:
    """Consecutive JSON values in ``text`` from ``pos`` (whitespace, and ``sep`` between values, around
    them), each with the index where it ends."""
    values: list[tuple[Any, int]] = []
    while True:
        while pos < len(text) and (text[pos].isspace() or (sep and values and text[pos] == sep)):
            pos += 1
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return values
        values.append((value, pos))


def _leading_calls(values: list[tuple[Any, int]]) -> tuple[list[ToolCall], int]:
    """The calls the leading values spell (objects, or lists of objects) and where the last one ends."""
    calls: list[ToolCall] = []
    end = 0
    for v, v_end in values:
        found = [_call_from_json(item) for item in (v if isinstance(v, list) else [v])]
        if not found or any(c is None for c in found):
            break
        calls += [c for c in found if c is not None]
        end = v_end
    return calls, end


_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_ARGS = re.compile(r"\s*([A-Za-z0-9_.:-]+)\[ARGS\]")


def _xml_calls(text: str) -> tuple[list[ToolCall], int]:
    """``<function=NAME><parameter=KEY>VALUE</parameter>...</function>`` blocks at the start of ``text``."""
    calls: list[ToolCall] = []
    end = 0
    for m in _XML_FUNCTION.finditer(text):
        if text[end : m.start()].strip():
            break
        args: dict[str, Any] = {}
        for key, raw in _XML_PARAMETER.findall(m.group(2)):
            try:
                args[key] = json.loads(raw)
            except json.JSONDecodeError:
                args[key] = raw
        calls.append(ToolCall(m.group(1), args))
        end = m.end()
    return calls, end


def _hermes_calls(text: str) -> tuple[list[ToolCall], int]:
    """``<tool_call>...</tool_call>`` blocks at the start of ``text``, each holding JSON or XML calls."""
    calls: list[ToolCall] = []
    end = 0
    for m in _HERMES.finditer(text):
        if text[end : m.start()].strip():
            break
        body = m.group(1).strip()
        if body.startswith("<function="):
            found, used = _xml_calls(body)
        else:
            found, used = _leading_calls(_json_values(body))
        if not found or body[used:].strip():
            break
        calls += found
        end = m.end()
    return calls, end


def _mistral_calls(text: str) -> tuple[list[ToolCall], int]:
    """``[TOOL_CALLS]`` followed by a JSON list of calls, or by ``NAME[ARGS]{...}`` (repeated)."""
    pos = len("[TOOL_CALLS]")
    if _MISTRAL_ARGS.match(text, pos) is None:
        return _leading_calls(_json_values(text, pos))
    calls: list[ToolCall] = []
    end = 0
    while m := _MISTRAL_ARGS.match(text, pos):
        try:
            args, pos = _DECODER.raw_decode(text, m.end())
        except json.JSONDecodeError:
            break
        if not isinstance(args, dict):
            break
        calls.append(ToolCall(m.group(1), args))
        end = pos
        if text.startswith("[TOOL_CALLS]", pos):
            pos += len("[TOOL_CALLS]")
    return calls, end


_FORMATS = {
    "<tool_call>": _hermes_calls,
    "<function=": _xml_calls,
    "[TOOL_CALLS]": _mistral_calls,
    "<|python_tag|>": lambda text: _leading_calls(_json_values(text, len("<|python_tag|>"), sep=";")),
}


def _bare_calls(text: str, tool_names: Collection[str]) -> tuple[list[ToolCall], int]:
    """JSON calls of offered tools that begin the reply (possibly in a ```json fence), and where they end."""
    pos = len(text) - len(text.lstrip())
    fenced = text.startswith("```json", pos)
    calls, end = _leading_calls(_json_values(text, pos + len("```json") if fenced else pos))
    if not calls or any(c.name not in tool_names for c in calls):
        return [], 0
    if fenced:
        close = text.find("```", end)
        if close < 0 or text[end:close].strip():
            return [], 0
        end = close + 3
    return calls, end


def parse_tool_calls(text: str, tool_names: Collection[str]) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a complete reply: ``content`` is the text outside the calls, stripped.

    A bare JSON call must begin the reply; tagged calls may follow text. Text after the calls that is not a
    further call stays content. Markup that does not parse as calls is content too.
    """
    calls, end = _bare_calls(text, tool_names)
    if calls:
        content, more = parse_tool_calls(text[end:], tool_names)
        return content, calls + more
    starts = [(i, o) for o in TAGGED_OPENERS if (i := text.find(o)) >= 0]
    if not starts:
        return text.strip(), []
    start, opener = min(starts)
    calls, end = _FORMATS[opener](text[start:])
    if not calls:
        return text.strip(), []
    after, more = parse_tool_calls(text[start + end :], tool_names)
    return "\n".join(p for p in (text[:start].strip(), after) if p), calls + more


def _held_prefix(text: str, markers: Collection[str]) -> int:
    """Length of the longest tail of ``text`` that begins one of ``markers`` (and may still become it)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class ReplyParser:
    """Splits a streamed reply into thinking, answer text and tool calls.

    ``think_tags`` (open, close) enable thinking: a reply that begins with the open tag (or, with
    ``thinking=True``, one whose prompt already opened it) thinks until the close tag. ``tool_names`` enable
    tool-call parsing (None: none are parsed); ``prefix`` is reply text already in the prompt (a forced
    start of a tool call), parsed but not released. :meth:`feed` and :meth:`finish` return
    ``[("thinking" | "text", str), ...]``; :attr:`calls` holds the tool calls after :meth:`finish`.
    """

    def __init__(
        self,
        *,
        think_tags: tuple[str, str] | None = None,
        thinking: bool = False,
        tool_names: Collection[str] | None = None,
        prefix: str = "",
    ):
        self._tags = think_tags
        self._phase = "thinking" if (think_tags and thinking) else "start" if think_tags else "answer"
        self._think_buf = ""
        self._after_open = False  # the open tag was just read: newlines still to be dropped
        self._tools = tool_names
        self._mode = "undecided" if tool_names is not None else "text"
        self._buf = prefix  # answer text not yet released; the prefix (a tool-call opener) never is
        self._hidden = len(prefix)
        self._answer_started = False
        self.thinking = ""
        self.text = ""
        self.calls: list[ToolCall] = []

    def feed(self, piece: str) -> list[tuple[str, str]]:
        """Read the next piece of the reply; returns what can be released now."""
        out: list[tuple[str, str]] = []
        if self._phase != "answer":
            piece = self._feed_thinking(piece, out)
        if self._phase == "answer" and piece:
            self._feed_answer(piece, out, final=False)
        return out

    def finish(self) -> list[tuple[str, str]]:
        """The reply has ended: release the rest and parse the tool calls."""
        out: list[tuple[str, str]] = []
        if self._phase != "answer":
            rest = self._think_buf
            self._think_buf = ""
            if self._phase == "thinking":
                self._emit("thinking", rest, out)
            else:
                self._phase = "answer"
                self._feed_answer(rest, out, final=True)
        else:
            self._feed_answer("", out, final=True)
        return out

    def _emit(self, kind: str, text: str, out: list[tuple[str, str]]) -> None:
        if not text:
            return
        if kind == "thinking":
            self.thinking += text
        else:
            if not self._answer_started:
                text = text.lstrip()
                if not text:
                    return
                self._answer_started = True
            self.text += text
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))

    def _feed_thinking(self, piece: str, out: list[tuple[str, str]]) -> str:
        """Consume ``piece`` while the reply may think; returns what belongs to the answer."""
        assert self._tags is not None
        open_tag, close_tag = self._tags
        buf = self._think_buf + piece
        if self._phase == "start":
            head = buf.lstrip()
            if open_tag.startswith(head):
                self._think_buf = buf  # still may become the open tag
                return ""
            if not head.startswith(open_tag):
                self._phase, self._think_buf = "answer", ""
                return buf
            self._phase = "thinking"
            self._after_open = True
            buf = head[len(open_tag) :]
        if self._after_open:
            # the newlines after the open tag are not thinking, however the pieces cut them
            buf = buf.lstrip("\n")
            if not buf:
                self._think_buf = ""
                return ""
            self._after_open = False
        end = buf.find(close_tag)
        if end >= 0:
            self._emit("thinking", buf[:end], out)
            self._phase, self._think_buf = "answer", ""
            return buf[end + len(close_tag) :]
        keep = _held_prefix(buf, [close_tag])
        self._emit("thinking", buf[: len(buf) - keep], out)
        self._think_buf = buf[len(buf) - keep :]
        return ""

    def _feed_answer(self, piece: str, out: list[tuple[str, str]], *, final: bool) -> None:
        self._buf += piece
        if self._mode == "undecided":
            head = self._buf.lstrip()
            openers = (*TAGGED_OPENERS, *BARE_OPENERS)
            if any(head.startswith(o) for o in openers):
                self._mode = "calls"
            elif head and not any(o.startswith(head) for o in openers):
                self._mode = "text"
            elif final:
                self._mode = "calls"
        if self._mode == "text":
            self._release_text(out, final)
        if self._mode == "calls" and final:
            assert self._tools is not None
            content, self.calls = parse_tool_calls(self._buf, self._tools)
            self._emit("text", content if self.calls else self._buf[self._hidden :], out)
            self._buf = ""

    def _release_text(self, out: list[tuple[str, str]], final: bool) -> None:
        """Release answer text up to a tool-call marker, which switches to holding the rest for the end."""
        if self._tools is None:
            self._emit("text", self._buf, out)
            self._buf = ""
            return
        starts = [i for o in TAGGED_OPENERS if (i := self._buf.find(o)) >= 0]
        if starts:
            self._emit("text", self._buf[: min(starts)], out)
            self._buf, self._mode = self._buf[min(starts) :], "calls"
            return
        cut = len(self._buf) - (0 if final else _held_prefix(self._buf, TAGGED_OPENERS))
        self._emit("text", self._buf[:cut], out)
        self._buf = self._buf[cut:]
