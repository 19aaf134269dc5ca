"""regolith.tokenizer against llama.cpp: ids, detokenization and vocabulary facts recorded by
``tools/llamacpp_fixtures/make_tokenizer_fixtures.py`` on the corpus in ``tests/tokenizer_corpus.py``, for
Gemma 3 (SPM) and Qwen2.5-Coder (byte-level BPE) and for llama.cpp settings applied to those vocabularies
(``VARIANTS``). The small-vocabulary tests check llama.cpp's rules and the errors without any model.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import regolith
from regolith.errors import ModelFormatError
from regolith.models import KNOWN_MODELS, resolve_model
from regolith.tokenizer import Tokenizer
from tests.tokenizer_corpus import CORPUS, MODES, MULTIBYTE, UNICODE16, VARIANTS

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"


@pytest.fixture(scope="module")
def tokenizer():
    """variant name -> Tokenizer, built once per module; skips when the model's package is absent."""
    metadata: dict[str, dict] = {}
    built: dict[str, Tokenizer] = {}

    def get(variant: str) -> Tokenizer:
        if variant not in built:
            model, overrides = VARIANTS[variant]
            pytest.importorskip(KNOWN_MODELS[model].package, reason=f"the {model} package is not installed")
            if model not in metadata:
                with regolith.gguf.open(resolve_model(model)) as f:
                    metadata[model] = dict(f.metadata)
            built[variant] = Tokenizer.from_gguf({**metadata[model], **overrides})
        return built[variant]

    return get


def _fixture(variant: str) -> dict:
    data = json.loads((FIXTURES / f"tokenizer-{variant}.json").read_text(encoding="utf-8"))
    assert [c["text"] for c in data["cases"]] == CORPUS, "corpus changed: rerun make_tokenizer_fixtures.py"
    assert data["overrides"] == VARIANTS[variant][1]
    return data


def _utf8(b64: str) -> str:
    return base64.b64decode(b64).decode("utf-8", "replace")


@pytest.mark.parametrize("variant", VARIANTS)
def test_ids_match_llamacpp(tokenizer, variant):
    tok = tokenizer(variant)
    for case in _fixture(variant)["cases"]:
        for (add_special, parse_special), want in zip(MODES, case["ids"], strict=True):
            got = tok.encode(case["text"], add_special=add_special, parse_special=parse_special)
            assert got == want, (case["text"], add_special, parse_special)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_matches_llamacpp_detokenize(tokenizer, variant):
    """decode(ids, skip_special=s) is llama_detokenize(ids, remove_special=s, unparse_special=not s)."""
    tok = tokenizer(variant)
    for case in _fixture(variant)["cases"]:
        for ids, (rendered, skipped) in zip(case["ids"], case["detok"], strict=True):
            assert tok.decode(ids) == _utf8(rendered), (case["text"], ids)
            assert tok.decode(ids, skip_special=True) == _utf8(skipped), (case["text"], ids)


@pytest.mark.parametrize("variant", VARIANTS)
def test_vocabulary_matches_llamacpp(tokenizer, variant):
    tok = tokenizer(variant)
    want = _fixture(variant)["vocab"]
    assert tok.vocab_size == want["n_tokens"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (
        want["bos"],
        want["eos"],
        want["add_bos"],
        want["add_eos"],
    )
    assert tok.eog_ids == frozenset(want["eog"])
    control = {i for start, stop in want["control_runs"] for i in range(start, stop)}
    assert {i for i in range(tok.vocab_size) if tok.is_control(i)} == control
    for i, piece in want["pieces"].items():
        assert tok.token_bytes(int(i)) == base64.b64decode(piece), i


def test_unicode16_letters_split_like_transformers_not_llamacpp(tokenizer):
    """The one known difference from llama.cpp: characters new in Unicode 16.0 are letters to the regex
    engine of Hugging Face tokenizers and unassigned to llama.cpp's older tables, so the BPE pre-tokenizer
    splits around them differently. regolith gives the ids of transformers' own tokenizer for the GGUF."""
    tok = tokenizer("qwen2")
    cases = _fixture("qwen2")["unicode16"]
    assert [c["text"] for c in cases] == UNICODE16
    for case in cases:
        ids = tok.encode(case["text"], add_special=False)
        assert ids == case["transformers"]
        assert ids != case["llama_cpp"]


def _streamed(tok: Tokenizer, ids: list[int], skip_special: bool) -> list[str]:
    stream = tok.stream_decoder(skip_special=skip_special)
    return [stream.push(i) for i in ids] + [stream.flush()]


@pytest.mark.parametrize("variant", VARIANTS)
def test_stream_decoder_concatenates_to_decode(tokenizer, variant):
    tok = tokenizer(variant)
    for text in [*CORPUS, *MULTIBYTE]:
        for add_special, parse_special in MODES:
            ids = tok.encode(text, add_special=add_special, parse_special=parse_special)
            for skip in (False, True):
                assert "".join(_streamed(tok, ids, skip)) == tok.decode(ids, skip_special=skip), (text, skip)


@pytest.mark.parametrize("variant", ["gemma3", "qwen2"])
def test_stream_decoder_never_splits_a_character(tokenizer, variant):
    """Characters made of several tokens (Gemma's byte fallback, Qwen's byte-level pieces) come out whole:
    every chunk is valid text, and the chunks so far are always a prefix of the full decode."""
    tok = tokenizer(variant)
    for text in MULTIBYTE:
        ids = tok.encode(text, add_special=False)
        assert any(not _is_utf8(tok.token_bytes(i)) for i in ids), f"{text!r} has no partial-character token"
        chunks = _streamed(tok, ids, skip_special=False)
        assert "".join(chunks) == text
        assert all("\ufffd" not in chunk for chunk in chunks)
        for k in range(len(chunks)):
            assert text.startswith("".join(chunks[: k + 1]))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("variant", ["gemma3", "qwen2"])
def test_stream_decoder_replaces_invalid_utf8_like_decode(tokenizer, variant):
    tok = tokenizer(variant)
    lone = [i for i in range(tok.vocab_size) if tok.token_bytes(i) in (b"\xf0", b"\x9f", b"\x80")]
    assert lone, "the vocabulary has no single-byte pieces"
    ids = [*lone, tok.encode("a", add_special=False)[0], *lone]
    assert "".join(_streamed(tok, ids, skip_special=False)) == tok.decode(ids)
    assert "\ufffd" in tok.decode(ids)


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)


@pytest.mark.parametrize(("variant", "lost"), [("gemma3", "\u2581"), ("qwen2", "")])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_TEXT)
@example(text="\u2581x \u2581")
def test_round_trip(tokenizer, variant, lost, text):
    """Without a space prefix (Gemma 3 sets add_space_prefix false) or space clean-up (qwen2), llama.cpp's
    tokenizer is lossless on any text, and so is this one, but for SPM's space marker: ``▁`` in the text
    is the token text of a space, so it decodes as one."""
    tok = tokenizer(variant)
    expected = text.replace(lost, " ") if lost else text
    assert tok.decode(tok.encode(text, add_special=False, parse_special=False)) == expected


@pytest.mark.parametrize("variant", ["gemma3-space-prefix", "qwen2-pre-gpt2"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stream_decoder_on_any_ids(tokenizer, variant, data):
    """Any ids, with BOS/EOS, spaces, apostrophes, punctuation and partial characters mixed in: the stream
    still concatenates to decode (leading-space strip, dropped BOS/EOS and space clean-up included)."""
    tok = tokenizer(variant)
    mixed_in = [
        tok.bos_id,
        tok.eos_id,
        *tok.encode(" ' ' ?s 're 've . , ! \U0001f301 \u4e02", add_special=False),
    ]
    token = st.one_of(st.integers(0, tok.vocab_size - 1), st.sampled_from(mixed_in))
    ids = data.draw(st.lists(token, max_size=30))
    skip = data.draw(st.booleans())
    assert "".join(_streamed(tok, ids, skip)) == tok.decode(ids, skip_special=skip)


def test_from_file_reads_the_gguf(tokenizer):
    tok = tokenizer("qwen2")
    from_file = Tokenizer.from_file(resolve_model("qwen2.5-coder-0.5b"))
    text = "<|im_start|>user\nhello<|im_end|>"
    assert from_file.encode(text) == tok.encode(text)
    assert from_file.eog_ids == tok.eog_ids


# -- small vocabularies: llama.cpp's rules and the errors ----------------------------------------------

_BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _spm(tokens: list[str], scores: list[float], types: list[int] | None = None, **extra) -> dict:
    head = ["<unk>", "<s>", "</s>"]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": head + _BYTES + tokens,
        "tokenizer.ggml.scores": [0.0] * (3 + 256) + scores,
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + (types or [1] * len(tokens)),
        **extra,
    }


def _bpe(tokens: list[str], merges: list[str], **extra) -> dict:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * len(tokens),
        "tokenizer.ggml.merges": merges,
        **extra,
    }


def test_spm_merges_the_best_scoring_pair_first():
    """llama.cpp's SPM: the adjacent pair whose concatenation scores best merges first; a character with
    no token falls back to its UTF-8 bytes; BOS is added by default and no space prefix when told so."""
    tok = Tokenizer.from_gguf(
        _spm(["a", "b", "c", "ab", "bc"], [-1, -1, -1, -3, -2], **{"tokenizer.ggml.add_space_prefix": False})
    )
    a, ab, bc = (tok.token_to_id(t) for t in ("a", "ab", "bc"))
    assert tok.encode("abc") == [1, a, bc]
    assert tok.encode("abab", add_special=False) == [ab, ab]
    assert tok.encode("é", add_special=False) == [3 + 0xC3, 3 + 0xA9]
    assert tok.decode([1, a, bc, 3 + 0xC3, 3 + 0xA9], skip_special=True) == "abcé"
    assert tok.decode([3 + 0xC3]) == "\ufffd"


def test_spm_space_prefix_and_user_defined_tokens():
    """A space is prefixed to text at the start and after special tokens, spaces become ▁, and
    user-defined tokens are matched whole even when special tokens are not parsed."""
    tok = Tokenizer.from_gguf(_spm(["▁", "x", "▁x", "<ud>", "<ctl>"], [-1, -2, -1.5, 0, 0], [1, 1, 1, 4, 3]))
    sp, spx, ud, ctl = (tok.token_to_id(t) for t in ("▁", "▁x", "<ud>", "<ctl>"))
    assert tok.encode("x<ud>x", add_special=False, parse_special=False) == [spx, ud, spx]
    assert tok.encode("<ctl>x", add_special=False) == [ctl, spx]
    assert ctl not in tok.encode("<ctl>x", add_special=False, parse_special=False)
    assert tok.decode([spx, ud, spx]) == "x<ud> x"
    assert tok.decode([ctl, spx], skip_special=True) == " x"
    assert tok.decode([ctl, spx]) == "<ctl> x"
    assert tok.encode(" ", add_special=False) == [sp, sp]


def test_longer_special_tokens_are_cut_first():
    """llama.cpp cuts special tokens longest first over the whole text, so a longer token wins over a
    shorter one that starts earlier and overlaps it (leftmost-longest matching would pick "<a")."""
    tok = Tokenizer.from_gguf(
        _spm(["x", "<a", "a>>"], [-1, 0, 0], [1, 4, 4], **{"tokenizer.ggml.add_space_prefix": False})
    )
    x, lt_a, a_gt_gt = (tok.token_to_id(t) for t in ("x", "<a", "a>>"))
    assert tok.encode("<a>>", add_special=False) == [3 + ord("<"), a_gt_gt]
    assert tok.encode("<a<a>>x", add_special=False) == [lt_a, 3 + ord("<"), a_gt_gt, x]


def test_bpe_eog_and_control_from_token_texts():
    """End-of-generation tokens and control attributes follow llama.cpp's name lists."""
    tokens = ["a", "b", "ab", "<|im_end|>", "<|endoftext|>", "<|file_sep|>", "</s>"]
    tok = Tokenizer.from_gguf(_bpe(tokens, ["a b"], **{"tokenizer.ggml.eos_token_id": 4}))
    assert tok.eog_ids == {3, 4, 5, 6}
    assert all(tok.is_control(i) for i in (3, 4, 5, 6)) and not tok.is_control(2)
    assert (tok.bos_id, tok.add_bos, tok.add_eos) == (None, False, False)
    assert tok.encode("abab</s>") == [2, 2, 6]
    assert tok.encode("abab</s>", parse_special=False) == [2, 2] + tok.encode("</s>", parse_special=False)
    assert tok.decode([2, 6, 2], skip_special=True) == "abab"


def test_unknown_pre_tokenizer_warns_and_uses_gpt2():
    tokens = ["a", "1", "2", "12", "Ġ", "Ġa"]
    with pytest.warns(UserWarning, match="not one regolith knows"):
        tok = Tokenizer.from_gguf(_bpe(tokens, ["1 2", "Ġ a"], **{"tokenizer.ggml.pre": "no-such-pre"}))
    # the GPT-2 regex keeps digits together (qwen2's splits them)
    assert tok.encode("12 a") == [3, 5]
    assert Tokenizer.from_gguf(_bpe(tokens, ["1 2", "Ġ a"])).encode("12 a") == [1, 2, 5]


def test_out_of_range_ids_raise_value_error():
    tok = Tokenizer.from_gguf(_bpe(["a", "b"], []))
    for bad in (2, -1, 10**9):
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok.decode([0, bad])
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok.id_to_token(bad)
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok.token_bytes(bad)
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok.is_control(bad)
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok.stream_decoder().push(bad)
    assert tok.token_to_id("c") is None


def test_encode_rejects_lone_surrogates():
    tok = Tokenizer.from_gguf(_bpe(["a"], []))
    with pytest.raises(ValueError, match="surrogate"):
        tok.encode("a\ud800")


def test_out_of_range_special_id_warns():
    with pytest.warns(UserWarning, match="eos_token_id = 7 is outside"):
        tok = Tokenizer.from_gguf(_bpe(["a", "b"], [], **{"tokenizer.ggml.eos_token_id": 7}))
    assert tok.eos_id is None


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({}, "no tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}, "'bert' is not supported"),
        ({"tokenizer.ggml.model": "llama"}, "no tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []}, "non-empty array of strings"),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", 3]}, "non-empty array of strings"),
        (_spm(["a"], [0.0, 1.0]), "scores has 261 entries but tokenizer.ggml.tokens has 260"),
        ({**_spm(["a"], [0.0]), "tokenizer.ggml.token_type": [1, 1]}, "token_type has 2 entries"),
        ({**_spm(["a"], [0.0]), "tokenizer.ggml.scores": ["x"] * 260}, "scores must be an array of numbers"),
        (_spm(["a", "a"], [0.0, 0.0]), "lists 'a' more than once"),
        (_spm(["a"], [0.0], **{"tokenizer.ggml.add_bos_token": 1}), "add_bos_token must be a boolean"),
        ({**_bpe(["a", "b"], []), "tokenizer.ggml.merges": None}, "needs tokenizer.ggml.merges"),
        (_bpe(["a", "b"], ["a b"]), "entry 'a b' is not two tokens whose concatenation is a token"),
        (_bpe(["a", "b", "ab"], ["ab"]), "entry 'ab' is not two tokens"),
        (_bpe(["a"], [], **{"tokenizer.ggml.add_bos_token": True}), "add_bos_token is set but"),
        (_bpe(["a"], [], **{"tokenizer.ggml.bos_token_id": "0"}), "bos_token_id must be an integer"),
    ],
)
def test_malformed_metadata_raises_model_format_error(metadata, message):
    with pytest.raises(ModelFormatError, match=message.replace("(", r"\(")):
        Tokenizer.from_gguf(metadata)
