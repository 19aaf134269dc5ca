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

gpt-oss writes OpenAI's harmony format instead, a run of messages on channels, which
:class:`HarmonyParser` reads:
``<|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER`` (the
prompt ends with ``<|start|>assistant``); a call is a message to ``functions.NAME``,
``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}`` (the
recipient may also stand before ``<|channel|>``). ``<|return|>`` and ``<|call|>`` end the reply and are
not in its text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HarmonyParser", "ReplyParser", "ToolCall", "parse_tool_calls"]

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


# harmony: what ends a message, what may begin a message's header (``to=`` where the recipient follows the
# prompt's ``<|start|>assistant``), what ends a message's body (``<|start|>`` is left to begin the next
# message), what ends text outside any message, and every marker that may stand between messages
_HARMONY_STOPS = ("<|end|>", "<|return|>", "<|call|>")
_HARMONY_HEADS = ("<|start|>", "<|channel|>", "to=")
_HARMONY_ENDS = (*_HARMONY_STOPS, "<|start|>")
_HARMONY_STRAY_ENDS = (*_HARMONY_ENDS, "<|channel|>")
_HARMONY_MARKERS = (*_HARMONY_STRAY_ENDS, "to=")
_HARMONY_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
_HARMONY_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")


def _harmony_arguments(body: str) -> dict[str, Any] | None:
    """A call's arguments: a JSON object and nothing else (an empty body is no arguments); None if not."""
    body = body.strip()
    if not body:
        return {}
    try:
        value, end = _DECODER.raw_decode(body)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and not body[end:].strip() else None


class HarmonyParser:
    """Splits a streamed harmony reply (gpt-oss) into thinking, answer text and tool calls.

    Each message's header (up to ``<|message|>``) says what its body is: the ``analysis`` channel is
    thinking; ``final``, and ``commentary`` without a recipient (a preamble shown to the user), are answer
    text; a message to ``functions.NAME`` is a call of NAME whose body is its JSON arguments (with
    ``tool_names`` None no tools were offered and calls are dropped, as are messages to other recipients,
    such as the built-in ``browser`` and ``python`` tools). A body ends at ``<|end|>`` or the next
    ``<|start|>`` (or ``<|return|>`` / ``<|call|>``, where a tokenizer renders them), else with the reply.
    Text outside any message (a reply that does not use the format) is answer text. A call whose arguments
    are not a JSON object is answer text too, written as the model wrote it. Messages of one kind are
    joined by a blank line.

    Thinking and answer text are released as they come, held only where a piece may end in the start of a
    marker; headers and calls are held until complete. ``prefix`` is reply text already in the prompt (the
    forced start of a call's header), parsed but not released. :meth:`feed` and :meth:`finish` return
    ``[("thinking" | "text", str), ...]``; :attr:`calls` holds the tool calls after :meth:`finish`.
    """

    def __init__(self, *, tool_names: Collection[str] | None = None, prefix: str = ""):
        self._tools = tool_names
        self._state = "between"  # between messages, in a "header" or in a "body"
        self._kind = ""  # the body's: "thinking", "text", "call" or "drop"
        self._ends: tuple[str, ...] = _HARMONY_ENDS
        self._hidden = len(prefix)  # the prefix's length, within the first header
        self._header = ""  # the current call's header (the model's own text of it), its arguments and name
        self._args = ""
        self._name = ""
        self._joined = {"thinking": False, "text": False}  # a message of the kind began after text of it
        self.thinking = ""
        self.text = ""
        self.calls: list[ToolCall] = []
        self._buf = prefix
        self._run([], final=False)

    def feed(self, piece: str) -> list[tuple[str, str]]:
        """Read the next piece of the reply; returns what can be released now."""
        out: list[tuple[str, str]] = []
        self._buf += piece
        self._run(out, final=False)
        return out

    def finish(self) -> list[tuple[str, str]]:
        """The reply has ended: release the rest and parse the last call."""
        out: list[tuple[str, str]] = []
        self._run(out, final=True)
        return out

    def _run(self, out: list[tuple[str, str]], *, final: bool) -> None:
        while True:
            if self._state == "between":
                head = self._buf.lstrip()
                end = next((m for m in _HARMONY_STOPS if head.startswith(m)), None)
                if end is not None:  # a stray end marker
                    self._buf = head[len(end) :]
                elif head.startswith(_HARMONY_HEADS):
                    self._state, self._buf = "header", head
                elif not head or (not final and any(m.startswith(head) for m in _HARMONY_MARKERS)):
                    if final:
                        self._buf = ""
                    return  # nothing yet, or a marker may be beginning
                else:  # text outside any message
                    self._open("text", _HARMONY_STRAY_ENDS)
            elif self._state == "header":
                i = self._buf.find("<|message|>")
                restart = self._buf.find("<|start|>", 1)
                if restart >= 0 and (i < 0 or restart < i):  # a header that never got its body
                    self._hidden = 0
                    self._buf = self._buf[restart:]
                    continue
                if i < 0:
                    if final:  # a reply cut inside a header: the header is dropped
                        self._buf = ""
                    return
                header, self._buf = self._buf[:i], self._buf[i + len("<|message|>") :]
                self._open_header(header)
            else:
                hits = [(i, m) for m in self._ends if (i := self._buf.find(m)) >= 0]
                if hits:
                    i, marker = min(hits)
                    self._body(self._buf[:i], out)
                    self._close(out)
                    self._buf = self._buf[i if marker in _HARMONY_HEADS else i + len(marker) :]
                    self._state = "between"
                    continue
                keep = 0 if final else _held_prefix(self._buf, self._ends)
                self._body(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                if final:
                    self._close(out)
                    self._state = "between"
                return

    def _open(self, kind: str, ends: tuple[str, ...] = _HARMONY_ENDS) -> None:
        self._state, self._kind, self._ends = "body", kind, ends
        self._begin(kind)

    def _begin(self, kind: str) -> None:
        """A message of ``kind`` begins: its text will follow the text of earlier ones after a blank line."""
        if kind in self._joined:
            self._joined[kind] = bool(self.thinking if kind == "thinking" else self.text)

    def _open_header(self, header: str) -> None:
        """Begin the body of the message ``header`` announces."""
        recipient = _HARMONY_RECIPIENT.search(header)
        channel = _HARMONY_CHANNEL.search(header)
        if recipient is not None:
            to = recipient.group(1)
            if self._tools is not None and to.startswith("functions."):
                self._name = to[len("functions.") :]
                self._header = (header + "<|message|>")[self._hidden :]
                self._args = ""
                self._open("call")
            else:
                self._open("drop")
        elif channel is not None and channel.group(1) == "analysis":
            self._open("thinking")
        else:
            self._open("text")
        self._hidden = 0

    def _body(self, text: str, out: list[tuple[str, str]]) -> None:
        if self._kind == "call":
            self._args += text
        elif self._kind in ("thinking", "text"):
            self._emit(self._kind, text, out)

    def _close(self, out: list[tuple[str, str]]) -> None:
        """The body has ended: a call is parsed (not one: its text becomes answer text)."""
        if self._kind == "call":
            args = _harmony_arguments(self._args)
            if args is not None and self._name:
                self.calls.append(ToolCall(self._name, args))
            else:
                self._begin("text")
                self._emit("text", self._header + self._args, out)
        self._kind = ""

    def _emit(self, kind: str, text: str, out: list[tuple[str, str]]) -> None:
        if kind == "text" and not self.text:
            text = text.lstrip()
        if not text:
            return
        if self._joined[kind]:
            text = "\n\n" + text
            self._joined[kind] = False
        if kind == "thinking":
            self.thinking += text
        else:
            self.text += text
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
