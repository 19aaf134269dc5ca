"""JSON output (``response_format``): a token guide that keeps the reply valid JSON, a check of the finished
reply against the basic structure of a JSON schema, and the system-prompt text that asks for it.

:class:`JsonGuide` runs a byte-level JSON automaton (RFC 8259 without top-level scalars) over the reply: a
sampled token that cannot continue a valid JSON prefix is refused and the position sampled again, and the
end-of-turn token is forced as soon as the top-level value closes. It constrains syntax only; the schema is
asked for in the prompt and checked afterwards by :func:`schema_errors`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..tokenizer import Tokenizer

__all__ = ["JsonGuide", "JsonPrefix", "json_instruction", "parse_json_reply", "schema_errors"]

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
# Number states: after '-', a leading 0, integer digits, '.', fraction digits, 'e', the exponent's sign, its
# digits. A number may end in the _NUMBER_ENDS ones (the byte after it is read in the state after the value).
_NUMBER_MODES = frozenset({"n-", "n0", "nI", "n.", "nF", "ne", "nS", "nE"})
_NUMBER_ENDS = frozenset({"n0", "nI", "nF", "nE"})

# A state is (mode, stack, aux): stack holds the open containers ('o' object, 'a' array), aux is mode data.
State = tuple[str, str, Any]


def _after_value(stack: str) -> State:
    return ("done", "", None) if not stack else ("next", stack, None)


def _value(byte: int, stack: str) -> State | None:
    """The state after ``byte`` begins a value inside containers ``stack``."""
    if byte == ord("{"):
        return ("key_or_close", stack + "o", None)
    if byte == ord("["):
        return ("value_or_close", stack + "a", None)
    if byte == ord('"'):
        return ("string", stack, False)
    if byte == ord("-"):
        return ("n-", stack, None)
    if byte == ord("0"):
        return ("n0", stack, None)
    if byte in _DIGITS:
        return ("nI", stack, None)
    if byte in _LITERALS:
        return ("literal", stack, _LITERALS[byte])
    return None


def _number(mode: str, byte: int, stack: str) -> State | None:
    """The state after ``byte`` in number mode ``mode``; None when the byte does not continue the number."""
    digit = byte in _DIGITS
    if mode == "n-":
        return ("n0", stack, None) if byte == ord("0") else ("nI", stack, None) if digit else None
    if mode in ("n0", "nI"):
        if digit and mode == "nI":
            return ("nI", stack, None)
        if byte == ord("."):
            return ("n.", stack, None)
        if byte in b"eE":
            return ("ne", stack, None)
        return None
    if mode in ("n.", "nF"):
        if digit:
            return ("nF", stack, None)
        return ("ne", stack, None) if mode == "nF" and byte in b"eE" else None
    if mode == "ne":
        return ("nS", stack, None) if byte in b"+-" else ("nE", stack, None) if digit else None
    if mode in ("nS", "nE"):
        return ("nE", stack, None) if digit else None
    raise AssertionError(mode)


def step(state: State, byte: int) -> State | None:
    """The automaton state after ``byte``, or None when no valid JSON text continues this way."""
    mode, stack, aux = state
    if mode == "string":
        if byte == ord('"'):
            return ("colon", stack, None) if aux else _after_value(stack)
        if byte == ord("\\"):
            return ("escape", stack, aux)
        return None if byte < 0x20 else state
    if mode == "escape":
        if byte == ord("u"):
            return ("unicode", stack, (aux, 4))
        return ("string", stack, aux) if byte in _ESCAPES else None
    if mode == "unicode":
        if byte not in _HEX:
            return None
        is_key, left = aux
        return ("string", stack, is_key) if left == 1 else ("unicode", stack, (is_key, left - 1))
    if mode == "literal":
        if byte != aux[0]:
            return None
        return _after_value(stack) if len(aux) == 1 else ("literal", stack, aux[1:])
    if mode in _NUMBER_MODES:
        nxt = _number(mode, byte, stack)
        if nxt is not None:
            return nxt
        if mode not in _NUMBER_ENDS:
            return None
        return step(_after_value(stack), byte)
    if byte in _WS:
        return state
    if mode == "start":
        return _value(byte, stack) if byte in aux else None
    if mode == "value":
        return _value(byte, stack)
    if mode == "value_or_close":
        return _after_value(stack[:-1]) if byte == ord("]") else _value(byte, stack)
    if mode == "key_or_close":
        if byte == ord("}"):
            return _after_value(stack[:-1])
        return ("string", stack, True) if byte == ord('"') else None
    if mode == "key":
        return ("string", stack, True) if byte == ord('"') else None
    if mode == "colon":
        return ("value", stack, None) if byte == ord(":") else None
    if mode == "next":
        top = stack[-1]
        if byte == ord(","):
            return ("key", stack, None) if top == "o" else ("value", stack, None)
        if byte == ord("}" if top == "o" else "]"):
            return _after_value(stack[:-1])
        return None
    if mode == "done":
        return None
    raise AssertionError(mode)


class JsonPrefix:
    """Whether a byte string is the beginning of (or all of) one JSON object or array.

    ``feed(data)`` returns False and leaves the state unchanged when ``data`` cannot continue the text;
    ``complete`` says whether the text read so far is a whole value (trailing whitespace allowed).
    """

    def __init__(self, top: bytes = b"{["):
        self.state: State = ("start", "", frozenset(top))

    @staticmethod
    def advance(state: State, data: bytes) -> State | None:
        """The state after ``data``, or None when it does not continue a valid prefix."""
        for byte in data:
            nxt = step(state, byte)
            if nxt is None:
                return None
            state = nxt
        return state

    def feed(self, data: bytes) -> bool:
        """Read ``data``; False (and no change) when it cannot continue the text."""
        nxt = self.advance(self.state, data)
        if nxt is None:
            return False
        self.state = nxt
        return True

    @property
    def complete(self) -> bool:
        """Whether the text read so far is one whole value."""
        return self.state[0] == "done"


class JsonGuide:
    """A :class:`regolith.generation.TokenGuide` that keeps the reply one valid JSON object (or array, with
    ``top=b"{["``): tokens that break JSON syntax and early end tokens are refused, and ``end_token`` is
    forced once the value is complete. Leading whitespace is allowed; tokens without text are refused."""

    def __init__(self, tokenizer: Tokenizer, end_token: int, *, top: bytes = b"{"):
        self._tok = tokenizer
        self._end = end_token
        self._eog = tokenizer.eog_ids
        self._tokens: list[int] = []
        self._states: list[State] = [JsonPrefix(top).state]  # _states[k]: after the first k tokens

    def _state(self, tokens: Sequence[int]) -> State | None:
        """The state after ``tokens`` (None if they are not valid JSON; the guide never lets that happen)."""
        k = 0
        limit = min(len(tokens), len(self._tokens))
        while k < limit and tokens[k] == self._tokens[k]:
            k += 1
        del self._tokens[k:], self._states[k + 1 :]  # anti-slop backtracking may have shortened the reply
        for t in tokens[k:]:
            nxt = JsonPrefix.advance(self._states[-1], self._tok.token_bytes(t, special=False))
            if nxt is None:
                return None
            self._tokens.append(t)
            self._states.append(nxt)
        return self._states[-1]

    def forced(self, tokens: Sequence[int]) -> int | None:
        state = self._state(tokens)
        return self._end if state is not None and state[0] == "done" else None

    def allows(self, tokens: Sequence[int], token: int) -> bool:
        state = self._state(tokens)
        if state is None or token in self._eog:
            return False
        piece = self._tok.token_bytes(token, special=False)
        return bool(piece) and JsonPrefix.advance(state, piece) is not None


def json_instruction(schema: Mapping[str, Any] | None) -> str:
    """The system-prompt text asking for JSON (matching ``schema`` when given)."""
    if schema is None:
        return "Respond with one JSON object and nothing else."
    return (
        "Respond with one JSON value and nothing else. It must conform to this JSON schema:\n"
        + json.dumps(schema, ensure_ascii=False)
    )


def parse_json_reply(text: str) -> Any:
    """The JSON value of a reply; a Markdown code fence around it is allowed. Raises ValueError."""
    body = text.strip()
    if body.startswith("```"):
        _, _, rest = body.partition("\n")
        if rest.rstrip().endswith("```"):
            body = rest.rstrip()[:-3].strip()
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"the reply is not valid JSON ({e.msg} at character {e.pos})") from None


def _reject_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is_type(value: Any, name: str) -> bool:
    if name not in _TYPES:
        return True  # an unknown type name constrains nothing we check
    if isinstance(value, bool) and name in ("number", "integer"):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _resolve(schema: Any, root: Mapping[str, Any]) -> Any:
    ref = schema.get("$ref") if isinstance(schema, Mapping) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return {}
        node = node[part]
    return node


def schema_errors(value: Any, schema: Mapping[str, Any], *, limit: int = 5) -> list[str]:
    """Where ``value`` breaks the basic structure of JSON ``schema``: type, enum, const, required,
    properties, additionalProperties false, items, anyOf / oneOf / allOf and local ``$ref``. Other keywords
    (patterns, bounds, formats) are not checked. Returns at most ``limit`` messages; [] when it conforms."""

    def check(v: Any, s: Any, path: str, depth: int, errors: list[str]) -> None:
        s = _resolve(s, schema)
        if not isinstance(s, Mapping) or len(errors) >= limit or depth > 64:
            return
        where = path or "the value"
        t = s.get("type")
        names = [t] if isinstance(t, str) else t if isinstance(t, list) else None
        if names is not None and not any(_is_type(v, n) for n in names):
            errors.append(f"{where} should be of type {' or '.join(map(str, names))}")
            return
        if isinstance(s.get("enum"), list) and v not in s["enum"]:
            errors.append(f"{where} should be one of {json.dumps(s['enum'])}")
        if "const" in s and v != s["const"]:
            errors.append(f"{where} should be {json.dumps(s['const'])}")
        for key in ("anyOf", "oneOf"):
            options = s.get(key)
            if isinstance(options, list) and options and not any(_conforms(v, o, depth) for o in options):
                errors.append(f"{where} matches none of the {key} schemas")
        for sub in s.get("allOf") if isinstance(s.get("allOf"), list) else ():
            check(v, sub, path, depth + 1, errors)
        if isinstance(v, dict):
            props = s.get("properties") if isinstance(s.get("properties"), Mapping) else {}
            for name in s.get("required") if isinstance(s.get("required"), list) else ():
                if name not in v:
                    errors.append(f"{where} lacks the required property {name!r}")
            extra = s.get("additionalProperties", True)
            for name, item in v.items():
                sub_path = f"{path}.{name}" if path else name
                if name in props:
                    check(item, props[name], sub_path, depth + 1, errors)
                elif extra is False:
                    errors.append(f"{where} has the property {name!r}, which the schema does not allow")
                elif isinstance(extra, Mapping):
                    check(item, extra, sub_path, depth + 1, errors)
        if isinstance(v, list) and isinstance(s.get("items"), Mapping):
            for i, item in enumerate(v):
                check(item, s["items"], f"{path}[{i}]", depth + 1, errors)

    def _conforms(v: Any, s: Any, depth: int) -> bool:
        found: list[str] = []
        check(v, s, "", depth + 1, found)
        return not found

    errors: list[str] = []
    check(value, schema, "", 0, errors)
    return errors[:limit]
