"""Anti-slop phrase matching: finds overused phrases ("slop") in generated prose so that generation can back
up to the token where one began, ban that token there and resample (the antislop approach,
arXiv 2510.15061).

- :class:`SlopList`: the banned phrases (the shipped default list, or your own).
- :class:`ProseFilter`: which parts of the text are prose; code fences, inline code and tool calls are not.
- :class:`SlopMatcher`: :meth:`~SlopMatcher.find_violation` (the earliest banned phrase in prose) and
  :meth:`~SlopMatcher.pending_prefix` (how much of a growing text must be held back because it may still
  turn into a banned phrase).

Matching is case-insensitive, on word boundaries (a phrase that begins or ends with a letter, digit or
underscore needs a non-word character or the end of the prose on that side: "tapestry" does not match
"tapestryx"), treats curly and straight apostrophes alike, and lets a space in a phrase match any run of
whitespace.

Streaming use, with ``emitted`` the number of characters already shown to the user::

    v = matcher.find_violation(text, start=emitted, partial=True)
    if v: back up to the token containing v.start_char, ban it there, resample
    else: show text[emitted:matcher.pending_prefix(text)]; emitted = matcher.pending_prefix(text)

and once generation has ended, ``find_violation(text, start=emitted)`` with ``partial=False``. Everything
before ``pending_prefix(text)`` is final: no continuation of the text can put a violation there.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = [
    "DEFAULT_JSON_TOOL_KEYS",
    "DEFAULT_TOOL_MARKERS",
    "ProseFilter",
    "ProseScan",
    "SlopList",
    "SlopMatcher",
    "Violation",
]

_APOSTROPHES = "'\u2019\u2018\u02bc\uff07"  # ' ’ ‘ ʼ ＇
_APOSTROPHE_CLASS = "[" + re.escape(_APOSTROPHES) + "]"
_TO_STRAIGHT = str.maketrans({c: "'" for c in _APOSTROPHES})
_WORD = re.compile(r"\w")
_SPACE = re.compile(r"\s")
_SPACE_RUN = re.compile(r"\s+")


def _is_word(c: str) -> bool:
    return _WORD.match(c) is not None


def _fold(c: str) -> str:
    """One character, lowercased (when that keeps it one character) with apostrophes made straight."""
    low = c.lower()
    return (low if len(low) == 1 else c).translate(_TO_STRAIGHT)


def _normalize_phrase(raw: str) -> str:
    return _SPACE_RUN.sub(" ", raw.strip()).lower().translate(_TO_STRAIGHT)


class SlopList:
    """An immutable set of banned phrases, normalised (lowercase, straight apostrophes, single spaces).

    Raises ValueError for a phrase without any letter, digit or underscore, or for an empty list.
    """

    def __init__(self, phrases: Iterable[str]):
        if isinstance(phrases, str):
            raise TypeError("phrases must be an iterable of strings, not one string")
        normalized: set[str] = set()
        for raw in phrases:
            if not isinstance(raw, str):
                raise TypeError(f"phrases must be strings, got {raw!r}")
            phrase = _normalize_phrase(raw)
            if not _WORD.search(phrase):
                raise ValueError(f"phrase {raw!r} has no letter, digit or underscore to match on")
            normalized.add(phrase)
        self.phrases: tuple[str, ...] = tuple(sorted(normalized))
        self._set = frozenset(normalized)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SlopList:
        """Read a list file: UTF-8, one phrase per line; blank lines and lines starting with ``#`` are
        skipped. Raises OSError when it cannot be read and ValueError naming the file (and line) when it is
        not UTF-8 text, holds no phrase or holds a phrase with nothing to match on."""
        with open(path, "rb") as f:
            data = f.read()
        return cls._parse(data, os.fspath(path))

    @classmethod
    def default(cls) -> SlopList:
        """regolith's shipped list (``regolith/data/slop_phrases.txt``) of widely overused phrases."""
        return _default_list()

    @classmethod
    def _parse(cls, data: bytes, name: str) -> SlopList:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}: not UTF-8 text (byte {e.start})") from None
        phrases = []
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if not _WORD.search(stripped):
                raise ValueError(f"{name}:{number}: phrase {stripped!r} has no letter, digit or underscore")
            phrases.append(stripped)
        if not phrases:
            raise ValueError(f"{name}: no phrases (only blank lines and # comments)")
        return cls(phrases)

    def __len__(self) -> int:
        return len(self.phrases)

    def __iter__(self) -> Iterator[str]:
        return iter(self.phrases)

    def __contains__(self, phrase: object) -> bool:
        return isinstance(phrase, str) and _normalize_phrase(phrase) in self._set

    def __repr__(self) -> str:
        return f"SlopList({len(self.phrases)} phrases)"


@lru_cache(maxsize=1)
def _default_list() -> SlopList:
    data = resources.files("regolith").joinpath("data", "slop_phrases.txt").read_bytes()
    return SlopList._parse(data, "regolith/data/slop_phrases.txt")


# (opener, closer) of tool-call markup; closer None: the call runs to the end of the text.
DEFAULT_TOOL_MARKERS: tuple[tuple[str, str | None], ...] = (
    ("<tool_call>", "</tool_call>"),  # Hermes, Qwen 2.5 / 3
    ("<|tool_call|>", "<|/tool_call|>"),  # Phi-4-mini
    ("<|tool_call>", "<tool_call|>"),  # Gemma 4
    ("<function=", "</function>"),  # Qwen3-Coder
    ("<|python_tag|>", None),  # Llama 3.1 / 3.2
    ("[TOOL_CALLS]", None),  # Mistral
)
# A JSON object at the start of a line whose first key is one of these is a tool call (Llama 3.x style).
DEFAULT_JSON_TOOL_KEYS: tuple[str, ...] = ("name", "type", "function", "tool", "tool_name")

_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_PARAGRAPH_END = re.compile(r"\n[ \t]*\n")
_PARTIAL_FENCE = re.compile(r" {0,3}(?:`{1,2}|~{1,2})")


@dataclass(frozen=True)
class ProseScan:
    """The prose parts of a text: ``ranges`` are sorted, disjoint ``(start, end)`` character ranges.
    ``settled``: the classification of ``text[:settled]`` cannot change whatever is appended; it is
    ``len(text)`` unless the scan was partial and the text ends in an inline code span, a JSON object or a
    marker that is not yet decided (that tail is then left out of ``ranges``)."""

    ranges: tuple[tuple[int, int], ...]
    settled: int


class ProseFilter:
    """Decides which character ranges of generated text are prose. Not prose: fenced code blocks
    (```` ``` ```` or ``~~~`` lines, CommonMark rules; one still open runs to the end), inline code spans
    (a run of n backticks up to the next run of exactly n within the paragraph), tool-call markup
    (``tool_markers``: opener to closer, or to the end of the text when the closer is None or missing) and
    JSON tool calls (a ``{`` starting a line whose first key is in ``json_tool_keys``, to its matching
    ``}``; None disables them).
    """

    def __init__(
        self,
        *,
        tool_markers: Sequence[tuple[str, str | None]] = DEFAULT_TOOL_MARKERS,
        json_tool_keys: Sequence[str] | None = DEFAULT_JSON_TOOL_KEYS,
    ):
        for marker in tool_markers:
            if len(marker) != 2 or not isinstance(marker[0], str) or not marker[0]:
                raise ValueError(f"tool marker {marker!r} must be (non-empty opener, closer or None)")
            if marker[1] is not None and (not isinstance(marker[1], str) or not marker[1]):
                raise ValueError(f"tool marker {marker!r}: the closer must be a non-empty string or None")
        self.tool_markers = tuple((o, c) for o, c in tool_markers)
        self.json_tool_keys = tuple(json_tool_keys) if json_tool_keys else ()
        self._closers = dict(self.tool_markers)
        parts = [r"(?P<fence>^ {0,3}(?:`{3,}|~{3,}))"]
        if self.json_tool_keys:
            parts.append(r"(?P<json>^[ \t]*\{)")
            keys = "|".join(re.escape(k) for k in self.json_tool_keys)
            self._json_key = re.compile(r'\s*"(?:' + keys + r')"\s*:')
        if self.tool_markers:
            openers = sorted(self._closers, key=len, reverse=True)
            parts.append("(?P<tool>" + "|".join(re.escape(o) for o in openers) + ")")
        parts.append(r"(?P<ticks>`+)")
        self._event = re.compile("|".join(parts), re.MULTILINE)
        self._longest_opener = max([len(o) for o in self._closers] + [4])  # 4: "   {" or "```"
        self._memo: tuple[str, tuple[tuple[int, int], ...], int] | None = None

    def scan(self, text: str, *, partial: bool = False) -> ProseScan:
        """The prose ranges of ``text``. ``partial``: more text may follow, so constructs that are not
        decided yet (an inline code span without its closing run, the start of a JSON object or of a marker
        at the end) are held out of the prose and ``settled`` says where they begin.

        A partial scan of a text that extends the previous partial scan's text resumes where that one's
        classification was final, so scanning a growing text costs about what was appended."""
        n = len(text)
        memo = self._memo if partial else None
        if memo is not None and text.startswith(memo[0]):
            skipped, pos = list(memo[1]), memo[2]
        else:
            skipped, pos = [], 0
        fixed = (len(skipped), pos)  # the regions and position no continuation of the text can change
        settled = n
        while pos < n and (m := self._event.search(text, pos)) is not None:
            kind = m.lastgroup
            if kind == "fence":
                run = m.group().lstrip(" ")
                end = _fence_end(text, m.end(), run)
                kind, start = ("fence", m.start()) if end is not None else ("ticks", m.end() - len(run))
            else:
                start = m.start()
            if kind == "fence":
                skipped.append((start, end))
                pos = end
            elif kind == "ticks":
                end = _code_span_end(text, start, m.end(), partial)
                if end is not None and end < 0:
                    settled = start
                    break
                if end is None:
                    pos = m.end()  # literal backticks
                else:
                    skipped.append((start, end))
                    pos = end
            elif kind == "json":
                state = self._json_tool_call(text, m.end())
                if state == "maybe" and partial:
                    settled = m.end() - 1
                    break
                if state == "yes":
                    end = _json_object_end(text, m.end() - 1)
                    skipped.append((m.end() - 1, end))
                    pos = end
                else:
                    pos = m.end()
            else:
                closer = self._closers[m.group()]
                at = -1 if closer is None else text.find(closer, m.end())
                pos = n if at < 0 else at + len(closer)
                skipped.append((start, pos))
            if pos < n:
                fixed = (len(skipped), pos)
        if partial:
            if settled == n:
                settled = max(self._undecided_tail(text), skipped[-1][1] if skipped else 0)
            if pos < n and settled == n:
                # No event from `pos` on; one may still begin on the last line (a fence or a JSON object)
                # or in the last few characters (a marker being written).
                fixed = (len(skipped), max(pos, min(text.rfind("\n") + 1, n - self._longest_opener)))
            self._memo = (text, tuple(skipped[: fixed[0]]), fixed[1])
        ranges = []
        prev = 0
        for lo, hi in skipped:
            if lo > prev:
                ranges.append((prev, lo))
            prev = hi
        if prev < settled:
            ranges.append((prev, settled))
        return ProseScan(tuple(ranges), settled)

    def _json_tool_call(self, text: str, after: int) -> str:
        """ "yes" when the "{" before ``after`` opens a JSON tool call, "no" when it cannot, "maybe" when the
        text ends before that is decided."""
        if self._json_key.match(text, after):
            return "yes"
        rest = text[after:].lstrip()
        if not rest:
            return "maybe"
        if rest[0] != '"':
            return "no"
        body = rest[1:]
        quote = body.find('"')
        if quote < 0:
            return "maybe" if any(k.startswith(body) for k in self.json_tool_keys) else "no"
        if body[:quote] in self.json_tool_keys and not body[quote + 1 :].strip():
            return "maybe"
        return "no"

    def _undecided_tail(self, text: str) -> int:
        """Start of a tail that may still become a fence or a tool marker, or len(text)."""
        n = len(text)
        line = text.rfind("\n") + 1
        tail = line if _PARTIAL_FENCE.fullmatch(text, line) else n
        for opener in self._closers:
            for k in range(min(len(opener) - 1, n), 0, -1):
                if text.endswith(opener[:k]):
                    tail = min(tail, n - k)
                    break
        return tail


def _fence_end(text: str, after: int, run: str) -> int | None:
    """End of the fenced block whose opening run ends at ``after`` (the text's end while unclosed), or None
    when a backtick run is followed by a backtick on its line (then it is no fence)."""
    eol = text.find("\n", after)
    info = text[after : len(text) if eol < 0 else eol]
    if run[0] == "`" and "`" in info:
        return None
    if eol < 0:
        return len(text)
    closing = re.compile(r"^ {0,3}" + re.escape(run[0]) + "{" + str(len(run)) + r",}[ \t]*$", re.MULTILINE)
    c = closing.search(text, eol + 1)
    return len(text) if c is None else min(len(text), c.end() + 1)


def _code_span_end(text: str, start: int, after: int, partial: bool) -> int | None:
    """End of the inline code span whose opening run is text[start:after]; None when the run is literal (no
    closing run of the same length before the paragraph ends); -1 when that is not decided yet (partial
    text that ends in the paragraph, or in a closing run that may still grow)."""
    limit = len(text)
    for stop in (_PARAGRAPH_END.search(text, after), _FENCE_LINE.search(text, after)):
        if stop is not None:
            limit = min(limit, stop.start())
    c = re.compile(r"(?<!`)`{" + str(after - start) + r"}(?!`)").search(text, after, limit)
    if partial and limit == len(text) and (c is None or c.end() == limit):
        return -1
    return None if c is None else c.end()


def _json_object_end(text: str, brace: int) -> int:
    """Index after the "}" closing the JSON object that opens at text[brace] (strings and escapes
    respected), or len(text) while it is open."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(brace, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


@dataclass(frozen=True)
class Violation:
    """A banned phrase in prose: ``text[start_char:end_char]`` matches ``phrase`` (as listed, normalised)."""

    start_char: int
    end_char: int
    phrase: str


class SlopMatcher:
    """Finds banned phrases in the prose of generated text.

    ``phrases``: a :class:`SlopList` or phrases (default: :meth:`SlopList.default`); ``prose``: what counts
    as prose (default: :class:`ProseFilter` with its defaults).
    """

    def __init__(self, phrases: SlopList | Iterable[str] | None = None, prose: ProseFilter | None = None):
        if phrases is None:
            phrases = SlopList.default()
        elif not isinstance(phrases, SlopList):
            phrases = SlopList(phrases)
        self.phrases = phrases
        self.prose = prose if prose is not None else ProseFilter()
        self._sorted = phrases.phrases
        self._max_len = max((len(p) for p in self._sorted), default=0)
        self._trie: dict = {}
        for phrase in self._sorted:
            node = self._trie
            for ch in phrase:
                node = node.setdefault(ch, {})
            node[""] = phrase  # "" is never a character key: it marks a phrase's end
        self._regex = _trie_regex(self._trie)

    def find_violation(self, text: str, start: int = 0, *, partial: bool = False) -> Violation | None:
        """The earliest-starting banned phrase (the longest of those starting there) that lies wholly in
        prose and ends at or after ``start``, or None.

        ``partial``: ``text`` is still growing, so a match that ends with a word character at the very end
        is not reported yet (the word may go on: "tapestry" could become "tapestryx"), and undecided
        constructs at the end are not prose yet (see :meth:`ProseFilter.scan`).
        """
        if not 0 <= start <= len(text):
            raise ValueError(f"start {start} is outside the text (length {len(text)})")
        scan = self.prose.scan(text, partial=partial)
        begin = self._rewind(text, start)
        for lo, hi in scan.ranges:
            if hi < start:
                continue
            pos = max(lo, begin)
            while (m := self._regex.search(text, pos, hi)) is not None:
                for end, phrase in self._matches_at(text, m.start(), hi):
                    if end < start:
                        break
                    if partial and end == len(text) and _is_word(text[end - 1]):
                        continue
                    return Violation(m.start(), end, phrase)
                pos = m.start() + 1
        return None

    def pending_prefix(self, text: str) -> int:
        """Where ``text`` (still growing) must be held back from: the start of its longest suffix that, in
        prose and starting at a word boundary, is a prefix of a banned phrase (whitespace runs as one space),
        or the start of an undecided construct at the end (:attr:`ProseScan.settled`); len(text) when
        neither."""
        scan = self.prose.scan(text, partial=True)
        n = len(text)
        if not scan.ranges or scan.ranges[-1][1] != n:
            return scan.settled
        lo = max(scan.ranges[-1][0], self._rewind(text, n))
        folded = "".join(_fold(c) for c in text[lo:n])
        for s in range(lo, n):
            c = text[s]
            if _SPACE.match(c) or (_is_word(c) and s > 0 and _is_word(text[s - 1])):
                continue
            if self._begins_phrase(_SPACE_RUN.sub(" ", folded[s - lo :])):
                return s
        return n

    def _rewind(self, text: str, pos: int) -> int:
        """The earliest index a match reaching ``pos`` can start at: no phrase is longer than _max_len
        normalised characters, and a whitespace run normalises to one."""
        i, units = pos, 0
        while i > 0 and units <= self._max_len:
            if _SPACE.match(text[i - 1]):
                while i > 0 and _SPACE.match(text[i - 1]):
                    i -= 1
            else:
                i -= 1
            units += 1
        return i

    def _matches_at(self, text: str, p: int, hi: int) -> list[tuple[int, str]]:
        """(end, phrase) of every phrase matching text[p:hi] from p, longest first."""
        node = self._trie
        i = p
        out = []
        while i < hi:
            if _SPACE.match(text[i]):
                key = " "
                while i < hi and _SPACE.match(text[i]):
                    i += 1
            else:
                key = _fold(text[i])
                i += 1
            node = node.get(key)
            if node is None:
                break
            phrase = node.get("")
            if phrase is not None and (not _is_word(key) or i == hi or not _is_word(text[i])):
                out.append((i, phrase))
        return out[::-1]

    def _begins_phrase(self, q: str) -> bool:
        """Whether the normalised string q is the beginning of some phrase."""
        if len(q) > self._max_len:
            return False
        i = bisect.bisect_left(self._sorted, q)
        return i < len(self._sorted) and self._sorted[i].startswith(q)


def _trie_regex(trie: dict) -> re.Pattern[str]:
    """One regex matching any phrase of the trie, shaped like the trie so that each position costs one
    branch per character instead of one try per phrase; longer phrases are preferred."""

    def piece(ch: str) -> str:
        return r"\s+" if ch == " " else _APOSTROPHE_CLASS if ch == "'" else re.escape(ch)

    def below(node: dict, ch: str) -> str:
        branches = [piece(c) + below(child, c) for c, child in sorted(node.items()) if c]
        if "" in node:
            branches.append(r"(?!\w)" if _is_word(ch) else "")
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    word = [piece(c) + below(child, c) for c, child in sorted(trie.items()) if _is_word(c)]
    other = [piece(c) + below(child, c) for c, child in sorted(trie.items()) if not _is_word(c)]
    # One lookbehind for all word-initial phrases: a lookbehind per branch makes the search ~6x slower.
    parts = ([r"(?<!\w)(?:" + "|".join(word) + ")"] if word else []) + other
    return re.compile("|".join(parts) if parts else "(?!)", re.IGNORECASE)  # (?!) never matches
