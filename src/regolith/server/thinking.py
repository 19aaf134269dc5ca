"""Thinking: which models think, and a hard budget on how long they may.

A model thinks when its chat template knows a thinking block (``<think>`` ... ``</think>``, as Qwen3, QwQ
and DeepSeek-R1 write it). :class:`ThinkingBudget` is a token guide that counts the tokens inside the block
and, when the budget is spent, forces the closing tag so the model goes on to the answer.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..chat import ChatTemplate
from ..tokenizer import Tokenizer

__all__ = ["THINK_TAGS", "ThinkingBudget", "think_tags", "thinking_budget"]

THINK_TAGS = ("<think>", "</think>")


def think_tags(template: ChatTemplate) -> tuple[str, str] | None:
    """The (open, close) thinking tags the template uses, or None if its model does not think."""
    return THINK_TAGS if THINK_TAGS[1] in template.source else None


def thinking_budget(budget: int, max_tokens: int, close_len: int) -> int:
    """The most thinking tokens allowed: ``budget``, and no more than leaves the closing tag's ``close_len``
    tokens plus a quarter of ``max_tokens`` (at least one token) for the answer."""
    reserve = max(1, -(-max_tokens // 4))
    return max(0, min(budget, max_tokens - close_len - reserve))


class ThinkingBudget:
    """A :class:`regolith.generation.TokenGuide` that ends the thinking block of a reply of at most
    ``max_tokens`` after ``budget`` tokens (fewer where the answer needs room: :func:`thinking_budget`).

    The block opens with ``tags[0]`` at the start of the reply, or is already open when ``open_at_start``
    (the prompt ended with the tag). Once :attr:`budget` tokens lie inside it and the model has not closed
    it, the tokens of ``closing`` (by default ``tags[1]`` and a blank line) are forced. Counts come from the
    reply's text, so the tag may be one special token (that renders as its text) or several ordinary ones.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        budget: int,
        *,
        max_tokens: int,
        tags: tuple[str, str],
        open_at_start: bool,
        closing: str | None = None,
    ):
        if budget < 0:
            raise ValueError(f"the thinking budget must be >= 0, got {budget}")
        self._tok = tokenizer
        self._open, self._close = (t.encode() for t in tags)
        self.closing = tokenizer.encode(tags[1] + "\n\n" if closing is None else closing, add_special=False)
        self.budget = thinking_budget(budget, max_tokens, len(self.closing))
        """The most tokens the thinking block may hold."""
        self._open_at_start = open_at_start
        self._tokens: list[int] = []
        self._text = b""
        self._ends: list[int] = []  # _ends[k]: length of _text after the first k + 1 tokens

    def _sync(self, tokens: Sequence[int]) -> None:
        k = 0
        limit = min(len(tokens), len(self._tokens))
        while k < limit and tokens[k] == self._tokens[k]:
            k += 1
        if k < len(self._tokens):  # anti-slop backtracking shortened the reply
            del self._tokens[k:], self._ends[k:]
            self._text = self._text[: self._ends[-1]] if self._ends else b""
        for t in tokens[k:]:
            self._tokens.append(t)
            self._text += self._tok.token_bytes(t, special=False)
            self._ends.append(len(self._text))

    def _block(self) -> tuple[int, bool] | None:
        """(index of the first token inside the thinking block, whether it is closed), or None if the reply
        does not think."""
        if self._open_at_start:
            return 0, self._close in self._text
        head = self._text.lstrip()
        if not head.startswith(self._open):
            return None
        start = len(self._text) - len(head) + len(self._open)  # first byte inside the block
        return bisect.bisect_left(self._ends, start) + 1, self._close in self._text[start:]

    def forced(self, tokens: Sequence[int]) -> int | None:
        self._sync(tokens)
        block = self._block()
        if block is None:
            return None
        first, closed = block
        start = first + self.budget  # where a forced closing begins
        n = len(tokens) - start
        if 0 < n < len(self.closing) and list(tokens[start:]) == self.closing[:n]:
            return self.closing[n]  # the rest of the forced closing
        if n == 0 and not closed:
            return self.closing[0]
        return None

    def allows(self, tokens: Sequence[int], token: int) -> bool:
        return True
