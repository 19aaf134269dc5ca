"""Tokenizers built from a GGUF file's ``tokenizer.ggml.*`` metadata, id for id what llama.cpp does.

Example::

    tok = Tokenizer.from_file("model.gguf")
    ids = tok.encode("Hello, world!")          # BOS added if the model asks for it
    text = tok.decode(ids, skip_special=True)
    stream = tok.stream_decoder()
    for i in ids:
        print(stream.push(i), end="")
    print(stream.flush())

The vocabulary (``tokenizer.ggml.model``) is either ``llama`` (SentencePiece-style: llama.cpp's SPM
tokenizer merges the adjacent pair whose concatenation is the best-scoring token, with ``<0xXX>`` byte
fallback) or ``gpt2`` (byte-level BPE with ranked merges after the pre-tokenizer regex that
``tokenizer.ggml.pre`` names). Both run on a ``tokenizers`` BPE model; special tokens, the
end-of-generation set, BOS/EOS handling and detokenization follow llama.cpp's ``llama-vocab.cpp``
(docs/tokenizer.md lists the details and the few places where they cannot be followed exactly).
"""

from __future__ import annotations

import codecs
import operator
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress, repeat
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as _HfTokenizer

from .errors import ModelFormatError

__all__ = ["StreamDecoder", "Tokenizer"]

# llama.cpp's token attributes (LLAMA_TOKEN_ATTR_*) and the tokenizer.ggml.token_type values
# (LLAMA_TOKEN_TYPE_*: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) they come from;
# any other type gets no attribute (the token then detokenizes to nothing).
_UNKNOWN, _UNUSED, _NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 4, 8, 16, 32
_TYPE_ATTR = {1: _NORMAL, 2: _UNKNOWN, 3: _CONTROL, 4: _USER_DEFINED, 5: _UNUSED, 6: _BYTE}

# Token texts llama.cpp takes for these roles when the metadata names no id (llama_vocab::impl::load).
_ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "eot": (
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
        "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
# Tokens that end generation whatever the metadata says.
_EOG_NAMES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)  # fmt: skip
# gpt-oss: always rendered (llama.cpp makes them user-defined)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
# metadata key suffix (tokenizer.ggml.<key>) -> role; later keys overwrite earlier ones, as in llama.cpp
_ID_KEYS = (
    ("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"), ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"), ("padding_token_id", "pad"), ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"), ("fim_mid_token_id", "fim_mid"), ("fim_pad_token_id", "fim_pad"),
    ("fim_rep_token_id", "fim_rep"), ("fim_sep_token_id", "fim_sep"), ("prefix_token_id", "fim_pre"),
    ("suffix_token_id", "fim_suf"), ("middle_token_id", "fim_mid"),
)  # fmt: skip

# Pre-tokenizer regexes, as llama.cpp writes them (llm_tokenizer_bpe; case-insensitive contractions
# spelled out, which is what its hand-written splitters implement).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (GPT-4o, gpt-oss) as llama.cpp spells it: its upper/lower-case letter classes become letters not in
# a-z / not in A-Z
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")


@dataclass(frozen=True)
class _Pre:
    """A llama.cpp BPE pre-tokenizer: regexes applied in turn, and the settings its name implies."""

    regexes: tuple[str, ...]
    clean_spaces: bool = True  # detokenize drops the space in " ?", " 's" etc.
    ignore_merges: bool = False  # a word that is a token is taken whole
    add_bos: bool = False  # default when the metadata does not say


_LLAMA3_PRE = _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
_PRE: dict[str, _Pre] = {
    "default": _Pre(_DEFAULT),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "exaone4"), _Pre((_GPT2,))),
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _LLAMA3_PRE,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _Pre((_LLAMA3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), _Pre((_QWEN2,), clean_spaces=False)),
    **dict.fromkeys(("megrez", "stablelm2"), _Pre((_QWEN2,))),
    "qwen35": _Pre((_QWEN35,), clean_spaces=False),
    **dict.fromkeys(
        ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _Pre((_GPT4O,), clean_spaces=False)
    ),
}

# llama.cpp's detokenizer clean-up (clean_spaces), as three passes: " ?" -> "?" (also ! . ,),
# " ' " -> "'", and " 's" -> "'s" (also 'm, 're, 've).
_CLEAN_PASSES = (
    (re.compile(rb" (?=[?!.,])"), b""),
    (re.compile(rb" ' "), b"'"),
    (re.compile(rb" '(?=s|m|re|ve)"), b"'"),
)
# A clean-up pattern can span a position only if the byte before it is one of these, so text up to the
# last other byte is final (StreamDecoder).
_CLEAN_OPEN = b" 'rv"
_SURROGATE = re.compile("[\ud800-\udfff]")  # str can hold them; UTF-8 cannot


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-unicode mapping, inverted: printable character -> byte."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable}
    chars.update({chr(256 + k): b for k, b in enumerate(shifted)})
    return chars


_BYTE_LEVEL = _byte_level_alphabet()
_BYTE_LEVEL_DECODE = str.maketrans({c: chr(b) for c, b in _BYTE_LEVEL.items()})
_BYTE_LEVEL_DELETE = str.maketrans(dict.fromkeys(_BYTE_LEVEL))


def _clean_spaces(data: bytes) -> bytes:
    for pattern, repl in _CLEAN_PASSES:
        data = pattern.sub(repl, data)
    return data


def _byte_level_piece(text: str) -> bytes:
    """llama.cpp's llama_decode_text: byte-level characters back to bytes; a character outside the byte
    alphabet becomes ``[UNK_BYTE_0x<its UTF-8 in hex><the whole token>]``."""
    if not text.translate(_BYTE_LEVEL_DELETE):
        return text.translate(_BYTE_LEVEL_DECODE).encode("latin-1")
    out = bytearray()
    for ch in text:
        if ch in _BYTE_LEVEL:
            out.append(_BYTE_LEVEL[ch])
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


# Bases of the substring hash in _spm_merges: odd, so invertible mod 2^64; the next is tried if two tokens
# share a hash under one.
_HASH_BASES = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9)


def _spm_merges(tokens: list[str], scores: np.ndarray) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, best-scoring result first.

    llama.cpp's SPM tokenizer merges any adjacent pair of symbols whose concatenation is a token, the
    highest-scoring token first. The splits are found in numpy: a polynomial hash (mod 2^64) of every
    proper prefix and suffix of every token is looked up among the hashes of the tokens (one to one on the
    tokens, so no split is missed), and each match is confirmed on the strings (so none is wrong).
    """
    n = len(tokens)
    lens = np.fromiter(map(len, tokens), dtype=np.int64, count=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    cps = np.frombuffer("".join(tokens).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    splits = np.maximum(lens - 1, 0)  # token i splits after 1..len-1 characters
    owner = np.repeat(np.arange(n), splits)
    cut = np.arange(len(owner)) - np.repeat(np.cumsum(splits) - splits, splits) + 1
    for base in _HASH_BASES:
        powers = np.full(len(cps) + 1, base, dtype=np.uint64)
        powers[0] = 1
        np.cumprod(powers, out=powers)
        inverse = np.full(len(cps) + 1, pow(base, -1, 1 << 64), dtype=np.uint64)
        inverse[0] = 1
        np.cumprod(inverse, out=inverse)
        prefix = np.zeros(len(cps) + 1, dtype=np.uint64)
        np.cumsum(cps * powers[:-1], out=prefix[1:])
        token_hash = (prefix[starts[1:]] - prefix[starts[:-1]]) * inverse[starts[:-1]]
        by_hash = np.argsort(token_hash)
        known = token_hash[by_hash]
        if not np.any(known[1:] == known[:-1]):  # hash -> token is one to one
            break
    else:
        raise ModelFormatError("tokenizer.ggml.tokens: no hash base separates all tokens; report this file")

    mid = starts[owner] + cut
    left_hash = (prefix[mid] - prefix[starts[owner]]) * inverse[starts[owner]]
    right_hash = (prefix[starts[owner + 1]] - prefix[mid]) * inverse[mid]
    bits = np.uint64((1 << 24) - 1)  # a 16 MiB table of low hash bits screens out most splits cheaply
    table = np.zeros(1 << 24, dtype=bool)
    table[token_hash & bits] = True
    hit = table[left_hash & bits] & table[right_hash & bits]
    owner, cut, left_hash, right_hash = owner[hit], cut[hit], left_hash[hit], right_hash[hit]
    left = by_hash[np.minimum(np.searchsorted(known, left_hash), n - 1)]
    right = by_hash[np.minimum(np.searchsorted(known, right_hash), n - 1)]
    hit = (token_hash[left] == left_hash) & (token_hash[right] == right_hash)
    hit &= (lens[left] == cut) & (lens[right] == lens[owner] - cut)
    order = np.argsort(-scores[owner[hit]], kind="stable")  # ties: token id, then split position
    owners = list(map(tokens.__getitem__, owner[hit][order].tolist()))
    lefts = list(map(tokens.__getitem__, left[hit][order].tolist()))
    rights = list(map(tokens.__getitem__, right[hit][order].tolist()))
    exact = map(operator.and_, map(str.startswith, owners, lefts), map(str.endswith, owners, rights))
    return list(compress(zip(lefts, rights, strict=True), exact))


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` that starts at a position (branches share prefixes, so a
    match costs its length, not the number of words)."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + pattern(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        if len(branches) == 1 and "" not in node:
            return branches[0]
        return "(?:" + "|".join(branches) + ")" + ("?" if "" in node else "")

    return pattern(trie)


class _SpecialSplitter:
    """llama.cpp's special-token partition (tokenizer_st_partition): the special tokens, longest (in UTF-8
    bytes) first, are each cut out of every remaining stretch of text wherever they occur, left to right.

    The special tokens present are found first (the longest at every position, and the special tokens
    that are prefixes of those); then each, in llama.cpp's order, is cut out of the text with
    ``str.split`` (the same left-to-right, non-overlapping search) after the stretches already cut have
    been blanked with a character no special token contains, so no match can straddle them.
    """

    def __init__(self, specials: list[tuple[str, int]]) -> None:
        self._order = {text: (rank, tid) for rank, (text, tid) in enumerate(specials)}
        self._find = re.compile("(?=(" + _trie_pattern(self._order) + "))") if specials else None
        chars = {c for text in self._order for c in text}
        self._blank = next(chr(c) for c in range(len(chars) + 1) if chr(c) not in chars)

    def split(self, text: str) -> list[str | int]:
        """``text`` as a list of raw-text fragments (str) and special token ids (int)."""
        found = {m.group(1) for m in self._find.finditer(text)} if self._find else ()
        if not found:
            return [text]
        present = {t[:k] for t in found for k in range(1, len(t) + 1) if t[:k] in self._order}
        blanked = text
        cuts = []  # (start, end, id)
        for special in sorted(present, key=self._order.__getitem__):
            pieces = blanked.split(special)
            if len(pieces) > 1:
                tid, pos = self._order[special][1], 0
                for piece in pieces[:-1]:
                    pos += len(piece)
                    cuts.append((pos, pos + len(special), tid))
                    pos += len(special)
                blanked = (self._blank * len(special)).join(pieces)
        cuts.sort()
        parts: list[str | int] = []
        pos = 0
        for start, end, tid in cuts:
            if start > pos:
                parts.append(text[pos:start])
            parts.append(tid)
            pos = end
        if pos < len(text):
            parts.append(text[pos:])
        return parts


def _token_list(metadata: Mapping[str, Any]) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFormatError("the GGUF has no tokenizer.ggml.tokens: it carries no vocabulary")
    if not isinstance(tokens, (list, tuple)) or not tokens or set(map(type, tokens)) != {str}:
        raise ModelFormatError("tokenizer.ggml.tokens must be a non-empty array of strings")
    # llama.cpp renames empty tokens so that every text is distinct
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    return tokens


def _numeric_array(metadata: Mapping[str, Any], key: str, n: int, dtype: type) -> np.ndarray | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not set(map(type, value)) <= {int, float}:
        raise ModelFormatError(f"{key} must be an array of numbers")
    if len(value) != n:
        raise ModelFormatError(f"{key} has {len(value)} entries but tokenizer.ggml.tokens has {n}")
    try:
        return np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        raise ModelFormatError(f"{key} must be an array of numbers") from None


def _flag(metadata: Mapping[str, Any], name: str, default: bool) -> bool:
    key = f"tokenizer.ggml.{name}"
    value = metadata.get(key, default)
    if not isinstance(value, bool):
        raise ModelFormatError(f"{key} must be a boolean, not {value!r}")
    return value


def _special_ids(metadata: Mapping[str, Any], spm: bool, n: int) -> dict[str, int | None]:
    """Role -> token id, llama.cpp's per-vocabulary defaults overridden by the metadata; ids outside the
    vocabulary are ignored with a warning (defaults outside it are dropped), as llama.cpp does."""
    default = {"bos": 1, "eos": 2, "unk": 0} if spm else {"bos": 11, "eos": 11}
    ids: dict[str, int | None] = {role: None for _, role in _ID_KEYS}
    ids.update({role: (i if i < n else None) for role, i in default.items()})
    for name, role in _ID_KEYS:
        key = f"tokenizer.ggml.{name}"
        if key not in metadata:
            continue
        value = metadata[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelFormatError(f"{key} must be an integer, not {value!r}")
        if 0 <= value < n:
            ids[role] = value
        else:
            warnings.warn(f"{key} = {value} is outside the vocabulary of {n} tokens; ignored", stacklevel=4)
    return ids


def _bpe_pre(metadata: Mapping[str, Any]) -> _Pre:
    name = metadata.get("tokenizer.ggml.pre")
    if not name:
        warnings.warn(
            "tokenizer.ggml.pre is missing: using llama.cpp's 'default' pre-tokenizer", stacklevel=4
        )
        return _PRE["default"]
    if name not in _PRE:
        warnings.warn(
            f"tokenizer.ggml.pre {name!r} is not one regolith knows; splitting with the GPT-2 regex, so "
            "ids may differ from the model's own tokenizer",
            stacklevel=4,
        )
        return _PRE["gpt-2"]
    return _PRE[name]


def _merge_pairs(metadata: Mapping[str, Any], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise ModelFormatError("a gpt2 vocabulary needs tokenizer.ggml.merges, and the GGUF has none")
    if not isinstance(merges, (list, tuple)) or (merges and set(map(type, merges)) != {str}):
        raise ModelFormatError("tokenizer.ggml.merges must be an array of strings")
    spaces = list(map(str.find, merges, repeat(" "), repeat(1)))
    lefts = list(map(operator.getitem, merges, map(slice, repeat(None), spaces)))
    rights = list(
        map(operator.getitem, merges, map(slice, map(operator.add, spaces, repeat(1)), repeat(None)))
    )
    known = map(vocab.__contains__, map(operator.add, lefts, rights))
    fits = list(
        map(all, zip(map(vocab.__contains__, lefts), map(vocab.__contains__, rights), known, strict=True))
    )
    for merge, space, ok in zip(merges, spaces, fits, strict=True):
        if space < 0 or not ok:
            raise ModelFormatError(
                f"tokenizer.ggml.merges entry {merge!r} is not two tokens whose concatenation is a token"
            )
    return list(zip(lefts, rights, strict=True))


class Tokenizer:
    """A GGUF model's tokenizer. Build it with :meth:`from_gguf` or :meth:`from_file`."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        """Same as :meth:`from_gguf`."""
        model = metadata.get("tokenizer.ggml.model")
        if model is None:
            raise ModelFormatError("the GGUF has no tokenizer.ggml.model: it carries no tokenizer")
        if model not in ("llama", "gpt2"):
            raise ModelFormatError(
                f"tokenizer.ggml.model {model!r} is not supported; regolith reads 'llama' "
                "(SentencePiece-style) and 'gpt2' (byte-level BPE) vocabularies"
            )
        spm = model == "llama"
        tokens = _token_list(metadata)
        n = len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != n:
            seen: set[str] = set()
            dup = next(t for t in tokens if t in seen or seen.add(t))
            raise ModelFormatError(f"tokenizer.ggml.tokens lists {dup!r} more than once")
        types = _numeric_array(metadata, "tokenizer.ggml.token_type", n, np.int64)
        attrs = [_NORMAL] * n if types is None else list(map(_TYPE_ATTR.get, types.tolist(), repeat(0)))
        ids = _special_ids(metadata, spm, n)

        # llama.cpp finds unnamed roles by token text (its hash-map order picks among several candidates;
        # here the lowest id) and makes those tokens control tokens.
        for role, names in _ROLE_NAMES.items():
            if ids[role] is None:
                found = [vocab[name] for name in names if name in vocab]
                if found:
                    ids[role] = min(found)
                    attrs[ids[role]] |= _CONTROL
        eog = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep") if ids[r] is not None}
        for name in _EOG_NAMES:
            if name in vocab:
                eog.add(vocab[name])
                attrs[vocab[name]] |= _CONTROL
        for name in _ALWAYS_RENDERED:
            if name in vocab:
                attrs[vocab[name]] = _USER_DEFINED
        eog |= {ids[r] for r in ("eos", "eot", "eom") if ids[r] is not None}
        eog_texts = {tokens[i] for i in eog}
        has_call = "<|call|>" in eog_texts or "<|calls|>" in eog_texts
        if "<|end|>" in eog_texts and has_call and ("<|return|>" in eog_texts or "<|flush|>" in eog_texts):
            eog.discard(vocab["<|end|>"])  # harmony / solar-open: <|end|> ends a message, not generation
            attrs[vocab["<|end|>"]] = _USER_DEFINED
        if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
            eog.discard(vocab["</s>"])
            attrs[vocab["</s>"]] = _NORMAL

        self._spm = spm
        self._tokens = tokens
        self._vocab = vocab
        self._attrs = attrs
        self._ids = ids
        self._eog = frozenset(eog)
        self._pieces: list[bytes | None] = [None] * n
        self._add_space_prefix = _flag(metadata, "add_space_prefix", spm)
        if spm:
            scores = _numeric_array(metadata, "tokenizer.ggml.scores", n, np.float32)
            merges = _spm_merges(tokens, np.zeros(n, np.float32) if scores is None else scores)
            unk = ids["unk"]
            model_ = models.BPE(
                vocab, merges, byte_fallback=True, unk_token=None if unk is None else tokens[unk]
            )
            self._hf = _HfTokenizer(model_)
            self._clean = False
            add_bos = True
        else:
            pre = _bpe_pre(metadata)
            model_ = models.BPE(vocab, _merge_pairs(metadata, vocab), ignore_merges=pre.ignore_merges)
            self._hf = _HfTokenizer(model_)
            self._hf.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            self._clean = pre.clean_spaces
            add_bos = pre.add_bos
        self._add_bos = _flag(metadata, "add_bos_token", add_bos)
        self._add_eos = _flag(metadata, "add_eos_token", False)
        for role, flag in (("bos", self._add_bos), ("eos", self._add_eos)):
            if flag and ids[role] is None:
                raise ModelFormatError(
                    f"tokenizer.ggml.add_{role}_token is set but the vocabulary has no {role}"
                )

        # special tokens in llama.cpp's partition order: longest UTF-8 text first (its std::sort leaves ties
        # unordered; here the lower id goes first)
        self._special_order = sorted(
            (i for i, a in enumerate(attrs) if a & (_CONTROL | _USER_DEFINED | _UNKNOWN)),
            key=lambda i: (-len(tokens[i].encode("utf-8")), i),
        )
        self._splitters: dict[bool, _SpecialSplitter] = {}  # by parse_special, built on first use

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """The tokenizer described by ``metadata`` (``regolith.gguf.open(path).metadata``).

        Raises :class:`regolith.ModelFormatError` when the tokenizer keys are missing, malformed,
        inconsistent in length, or name an unsupported ``tokenizer.ggml.model``.
        """
        return cls(metadata)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of the GGUF file at ``path``."""
        from . import gguf

        with gguf.open(path) as f:
            return cls(f.metadata)

    # -- vocabulary ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of tokens."""
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence token (None when the vocabulary has none)."""
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        """End-of-sequence token."""
        return self._ids["eos"]

    @property
    def unk_id(self) -> int | None:
        """Unknown token."""
        return self._ids["unk"]

    @property
    def pad_id(self) -> int | None:
        """Padding token."""
        return self._ids["pad"]

    @property
    def eog_ids(self) -> frozenset[int]:
        """Tokens that end generation, as llama.cpp derives them: EOS, EOT/EOM, the FIM pad/repo/separator
        tokens, and tokens whose text is a known end marker (``<end_of_turn>``, ``<|im_end|>``,
        ``<|endoftext|>``, ``<|eot_id|>``, ``</s>`` ...)."""
        return self._eog

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(..., add_special=True)`` starts with BOS."""
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        """Whether ``encode(..., add_special=True)`` ends with EOS."""
        return self._add_eos

    def _check(self, token_id: int) -> int:
        i = operator.index(token_id)
        if not 0 <= i < len(self._tokens):
            raise ValueError(f"token id {i} is outside the vocabulary (0..{len(self._tokens) - 1})")
        return i

    def id_to_token(self, token_id: int) -> str:
        """The token's text as the vocabulary stores it (``▁`` for spaces, byte-level characters, ...)."""
        return self._tokens[self._check(token_id)]

    def token_to_id(self, token: str) -> int | None:
        """The id of the token whose stored text is ``token``, or None."""
        return self._vocab.get(token)

    def is_control(self, token_id: int) -> bool:
        """Whether the token is a control token (after llama.cpp's adjustments: end markers are control)."""
        return bool(self._attrs[self._check(token_id)] & _CONTROL)

    def token_bytes(self, token_id: int, *, special: bool = True) -> bytes:
        """The bytes the token contributes to detokenized text (llama.cpp's ``token_to_piece(id, special)``):
        with ``special=False`` control tokens contribute nothing, as in generated text."""
        return self._visible_piece(self._check(token_id), special)

    def _piece(self, i: int) -> bytes:
        piece = self._pieces[i]
        if piece is None:
            text, attr = self._tokens[i], self._attrs[i]
            if attr & (_CONTROL | _UNKNOWN | _USER_DEFINED):
                piece = text.encode("utf-8")
            elif attr & _NORMAL:
                piece = text.replace("▁", " ").encode("utf-8") if self._spm else _byte_level_piece(text)
            elif attr & _BYTE:
                try:
                    piece = bytes([int(text[3:5], 16)])
                except ValueError:
                    raise ModelFormatError(f"byte token {i} is {text!r}, not <0xXX>") from None
            else:
                piece = b""  # unused and undefined tokens
            self._pieces[i] = piece
        return piece

    def _visible_piece(self, i: int, render_special: bool) -> bytes:
        if not render_special and self._attrs[i] & (_CONTROL | _UNKNOWN):
            return b""
        return self._piece(i)

    # -- text -> ids --------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``, as llama.cpp's ``llama_tokenize``.

        ``add_special``: add BOS/EOS as the model asks (:attr:`add_bos`, :attr:`add_eos`).
        ``parse_special``: control tokens written in the text (``<start_of_turn>``, ``<|im_start|>``)
        become their ids; otherwise they are tokenized as text. User-defined tokens are always matched
        whole, as in llama.cpp.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, not {type(text).__name__}")
        if _SURROGATE.search(text):
            raise ValueError("text contains a lone surrogate code point, which has no UTF-8 encoding")
        ids: list[int] = []
        if add_special and self._add_bos:
            ids.append(self._ids["bos"])
        parts = self._splitter(parse_special).split(text) if text else []
        after_special = True  # SPM: a space is prefixed to text at the start and after a special token
        for part in parts:
            if isinstance(part, int):
                ids.append(part)
                after_special = True
                continue
            if self._spm:
                if self._add_space_prefix and after_special:
                    part = " " + part
                part = part.replace(" ", "▁")
            ids += self._hf.encode(part, add_special_tokens=False).ids
            after_special = False
        if add_special and self._add_eos:
            ids.append(self._ids["eos"])
        return ids

    def _splitter(self, parse_special: bool) -> _SpecialSplitter:
        splitter = self._splitters.get(parse_special)
        if splitter is None:
            # without parse_special, control and unknown tokens are plain text; user-defined ones still split
            hidden = 0 if parse_special else _CONTROL | _UNKNOWN
            specials = [(self._tokens[i], i) for i in self._special_order if not self._attrs[i] & hidden]
            splitter = self._splitters[parse_special] = _SpecialSplitter(specials)
        return splitter

    # -- ids -> text --------------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ``ids``, as llama.cpp's ``llama_detokenize`` (with ``remove_special=skip_special``,
        ``unparse_special=not skip_special``), invalid UTF-8 replaced by U+FFFD.

        ``skip_special``: control tokens render as nothing and a leading BOS / trailing EOS that the
        model adds is dropped; otherwise control tokens render as their text.
        """
        ids = [self._check(i) for i in ids]
        first_strip = self._add_space_prefix
        if skip_special and self._add_bos and ids and ids[0] == self._ids["bos"]:
            ids = ids[1:]
            first_strip = False
        if skip_special and self._add_eos and ids and ids[-1] == self._ids["eos"]:
            ids = ids[:-1]
        pieces = [self._visible_piece(i, not skip_special) for i in ids]
        if first_strip and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        data = b"".join(pieces)
        if self._clean:
            data = _clean_spaces(data)
        return data.decode("utf-8", "replace")

    def stream_decoder(self, *, skip_special: bool = False) -> StreamDecoder:
        """A decoder that takes ids one at a time; its outputs concatenate to ``decode(ids, skip_special=...)``."""
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Incremental detokenization: :meth:`push` returns the text that each new id completes.

    Bytes of an incomplete UTF-8 character are held back until the character is complete (or known to be
    invalid, then U+FFFD), as is text that llama.cpp's space clean-up could still change and, when the
    trailing EOS would be dropped, an EOS piece. The outputs of every :meth:`push` and the final
    :meth:`flush` concatenate to ``Tokenizer.decode`` of all the ids.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._first = True
        self._pending = b""  # detokenized bytes not yet final under the space clean-up
        self._held_eos = b""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """Add one id; returns the newly completed text (possibly empty)."""
        tok = self._tok
        i = tok._check(token_id)
        piece = tok._visible_piece(i, not self._skip)
        if self._first:
            self._first = False
            if self._skip and tok._add_bos and i == tok._ids["bos"]:
                return ""
            if tok._add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
        self._pending += self._held_eos
        self._held_eos = b""
        if self._skip and tok._add_eos and i == tok._ids["eos"]:
            self._held_eos = piece  # dropped if it turns out to be the last id
        else:
            self._pending += piece
        data = self._pending
        if tok._clean:
            final = len(data.rstrip(_CLEAN_OPEN))
            data, self._pending = _clean_spaces(data[:final]), data[final:]
        else:
            self._pending = b""
        return self._utf8.decode(data)

    def flush(self) -> str:
        """End of the stream: the text still held back (an incomplete UTF-8 tail becomes U+FFFD)."""
        data, self._pending, self._held_eos = self._pending, b"", b""
        if self._tok._clean:
            data = _clean_spaces(data)
        return self._utf8.decode(data, final=True)
