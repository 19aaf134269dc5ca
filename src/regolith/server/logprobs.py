"""Log-probabilities in the OpenAI APIs' shapes: chat completions' ``logprobs.content`` entries (token,
logprob, bytes, top_logprobs) and legacy completions' parallel lists (tokens, token_logprobs, top_logprobs,
text_offset).

The values are :class:`regolith.logprobs.TokenLogprob` s: the log-softmax of the model's raw logits. A token's
text is its bytes (control tokens as their text) decoded as UTF-8, with U+FFFD for a token holding part of a
character; chat's ``bytes`` are the exact bytes.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..logprobs import TokenLogprob
    from ..tokenizer import Tokenizer

__all__ = ["CompletionLogprobs", "chat_logprobs", "merge"]

# JSON has no -inf; vLLM reports a log-probability that underflowed as -9999.0, and so does this server.
FLOOR = -9999.0


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def _text(tokenizer: Tokenizer, token: int) -> tuple[str, bytes]:
    data = tokenizer.token_bytes(token, special=True)
    return data.decode("utf-8", "replace"), data


def _chat_entry(tokenizer: Tokenizer, token: int, logprob: float) -> dict[str, Any]:
    text, data = _text(tokenizer, token)
    return {"token": text, "logprob": _value(logprob), "bytes": list(data)}


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or stream chunk's) ``logprobs``: ``{"content": [...], "refusal": None}``, an entry per
    token with its ``top_logprobs`` (as many as the request asked for)."""
    content = []
    for e in entries:
        item = _chat_entry(tokenizer, e.token, e.logprob)
        item["top_logprobs"] = [_chat_entry(tokenizer, t, lp) for t, lp in e.top]
        content.append(item)
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """A legacy completion choice's ``logprobs``, built in order over its tokens (the echoed prompt's, then
    the generated ones), each token's ``text_offset`` counted in the choice's text: the echo is the prompt
    decoded without control tokens (``Tokenizer.decode(skip_special=True)``), the reply the generated tokens'
    text."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._offset = 0  # characters of the choice's text before the next token
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def prompt(self, ids: Sequence[int], entries: Sequence[TokenLogprob | None]) -> dict[str, Any]:
        """The lists for the echoed prompt ``ids``; ``entries[0]`` (the first token, which nothing predicts)
        is None and so are its token_logprob and top_logprobs."""
        out = self._empty()
        decoder = self._tok.stream_decoder(skip_special=True)
        for token, entry in zip(ids, entries, strict=True):
            self._add(out, token, entry)
            self._offset += len(decoder.push(token))
        self._offset += len(decoder.flush())
        return out

    def generated(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The lists for the next generated tokens."""
        out = self._empty()
        for entry in entries:
            self._add(out, entry.token, entry)
            self._offset += len(self._utf8.decode(self._tok.token_bytes(entry.token, special=False)))
        return out

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def _add(self, out: dict[str, Any], token: int, entry: TokenLogprob | None) -> None:
        out["tokens"].append(_text(self._tok, token)[0])
        out["text_offset"].append(self._offset)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            return
        out["token_logprobs"].append(_value(entry.logprob))
        top = {_text(self._tok, t)[0]: _value(lp) for t, lp in entry.top}
        top.setdefault(_text(self._tok, entry.token)[0], _value(entry.logprob))  # and the chosen token
        out["top_logprobs"].append(top)


def merge(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Completions logprobs lists joined in order (a choice's echo and reply, or its streamed pieces)."""
    out = CompletionLogprobs._empty()
    for part in parts:
        for key in out:
            out[key].extend(part[key])
    return out
