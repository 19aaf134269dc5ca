"""Constrained decoding on llguidance: a token guide that keeps a reply inside a grammar (a JSON schema, any
JSON object), token by token, with the whole vocabulary's mask computed for each position.

llguidance (what llama.cpp and vLLM use) compiles the grammar and computes the mask of the tokens that may
follow in well under a millisecond at a 150k vocabulary; the sampler then draws from the allowed tokens
only, so a constrained reply costs no resampling and cannot leave the grammar. Once the grammar is
complete, the model's end-of-turn token is forced.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance
import numpy as np

from ..tokenizer import Tokenizer

__all__ = ["JSON_LAYOUT", "GrammarGuide", "json_grammar", "text_grammar"]

# A model's tokenizer as llguidance sees it (building it reads every token's bytes: ~0.6 s at 150k).
_LL_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[int, int], llguidance.LLTokenizer]] = (
    weakref.WeakKeyDictionary()
)


class _Tokens:
    """The attributes llguidance's TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tokenizer: Tokenizer, end: int):
        self.eos_token_id = end
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i, special=True) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_control(i)]
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


def _ll_tokenizer(tokenizer: Tokenizer, n_vocab: int, end: int) -> llguidance.LLTokenizer:
    cache = _LL_TOKENIZERS.setdefault(tokenizer, {})
    key = (n_vocab, end)
    if key not in cache:
        wrapper = llguidance.TokenizerWrapper(_Tokens(tokenizer, end))
        cache[key] = llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=end)
    return cache[key]


# JSON as json.dumps writes it ('{"a": 1, "b": [2, 3]}'): what models write unprompted, and no whitespace
# the model could loop on until max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema: Mapping[str, Any] | None) -> str:
    """The llguidance grammar of JSON that matches ``schema`` (None: any JSON object); a schema it cannot
    compile is found when :class:`GrammarGuide` is built. Raises ValueError for a schema that is not a JSON
    object."""
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            dict(schema) if schema is not None else {"type": "object"},
            defaults=JSON_LAYOUT,
        )
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"the JSON schema cannot be used: {e}") from None


def text_grammar(text: str) -> str:
    """The llguidance grammar of ``text``, a GBNF grammar (llama.cpp's format, as llama-server's ``grammar``
    field takes) or a Lark grammar (llguidance's, as vLLM's). Raises ValueError for one that does not parse;
    one that parses but cannot be compiled is found when :class:`GrammarGuide` is built."""
    try:
        return llguidance.grammar_from("grammar", text)
    except ValueError as e:
        raise ValueError(f"the grammar cannot be used: {e}") from None


class GrammarGuide:
    """A :class:`regolith.generation.TokenGuide` keeping the reply inside ``grammar`` (llguidance's
    grammar format, e.g. from :func:`json_grammar`) for a model whose tokenizer is ``tokenizer``, logits of
    ``n_vocab`` entries and end-of-turn token ``end`` (forced once the grammar is complete).

    The matcher follows the tokens generated so far, rolling back where anti-slop backtracking shortened
    them. :meth:`mask` gives the sampler the tokens that may follow. Raises ValueError for a grammar
    llguidance cannot compile.
    """

    def __init__(self, tokenizer: Tokenizer, grammar: str, *, n_vocab: int, end: int):
        self._ll = _ll_tokenizer(tokenizer, n_vocab, end)
        self._matcher = llguidance.LLMatcher(self._ll, grammar, log_level=0)
        if self._matcher.is_error():  # an unusable schema or grammar
            raise ValueError(f"the grammar cannot be used: {self._matcher.get_error()}")
        self._n_vocab = n_vocab
        self._end = end
        self._seen: list[int] = []

    def _follow(self, tokens: Sequence[int]) -> None:
        """Bring the matcher to the end of ``tokens``."""
        common = 0
        limit = min(len(tokens), len(self._seen))
        while common < limit and tokens[common] == self._seen[common]:
            common += 1
        if common < len(self._seen):
            self._matcher.rollback(len(self._seen) - common)
            del self._seen[common:]
        for t in tokens[common:]:
            if not self._matcher.consume_token(int(t)):
                raise RuntimeError(f"token {t} left the grammar: {self._matcher.get_error()}")
            self._seen.append(int(t))

    def forced(self, tokens: Sequence[int]) -> int | None:
        self._follow(tokens)
        if self._matcher.is_stopped():
            return self._end
        return None

    def mask(self, tokens: Sequence[int]) -> np.ndarray:
        """(n_vocab,) bool: the tokens that may follow ``tokens``."""
        self._follow(tokens)
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self._n_vocab].astype(bool)

    def allows(self, tokens: Sequence[int], token: int) -> bool:
        self._follow(tokens)
        return self._matcher.validate_tokens([int(token)]) == 1
