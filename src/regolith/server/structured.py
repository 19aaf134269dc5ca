"""JSON output (``response_format``): the system-prompt text that asks for it, reading the finished reply,
and a check of it against the basic structure of a JSON schema (the safety net behind the grammar that
:mod:`.grammar` enforces token by token).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["json_instruction", "parse_json_reply", "schema_errors"]


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
