"""regolith.antislop: phrase matching on word boundaries in prose only, against hand-written cases and a
brute-force reference (one regex per phrase)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regolith.antislop import ProseFilter, SlopList, SlopMatcher, Violation

PHRASES = [
    "tapestry",
    "a testament to",
    "testament",
    "shivers down her spine",
    "delve into",
    "it's important",
]


@pytest.fixture(scope="module")
def matcher() -> SlopMatcher:
    return SlopMatcher(PHRASES)


def found(m: SlopMatcher, text: str, **kw) -> str | None:
    v = m.find_violation(text, **kw)
    return None if v is None else text[v.start_char : v.end_char]


def test_default_list_loads_and_is_substantial():
    slop = SlopList.default()
    assert len(slop) >= 150
    for phrase in ["tapestry", "delve into", "a testament to", "shivers down her spine"]:
        assert phrase in slop
    assert "It’s important to note that" in slop
    assert "In today's fast-paced  world" in slop
    for phrase in slop:
        assert phrase == phrase.lower().strip() and "  " not in phrase and "’" not in phrase
    assert SlopMatcher().find_violation("Her work is a testament to patience.") is not None


@pytest.mark.parametrize(
    "text, hit",
    [
        ("a tapestry.", "tapestry"),
        ("(Tapestry)", "Tapestry"),
        ("TAPESTRY-like", "TAPESTRY"),
        ("tapestryx", None),
        ("xtapestry", None),
        ("tapestry_x", None),
        ("tapestry2", None),
        ("tapestries", None),
        ("Delve Into it", "Delve Into"),
        ("delve\n   into", "delve\n   into"),
        ("delveinto", None),
        ("It’s important", "It’s important"),
        ("itʼs important", "itʼs important"),
        ("its important", None),
    ],
)
def test_case_boundaries_apostrophes_whitespace(matcher, text, hit):
    assert found(matcher, text) == hit


def test_earliest_then_longest(matcher):
    text = "This is a testament to that."
    assert matcher.find_violation(text) == Violation(8, 22, "a testament to")
    # Nothing ends before `start`: the overlapping later phrase is the one reported.
    m = SlopMatcher(["a testament", "testament to"])
    assert m.find_violation("a testament to", start=12) == Violation(2, 14, "testament to")
    assert m.find_violation("a testament to", start=0) == Violation(0, 11, "a testament")
    assert matcher.find_violation("tapestry and more", start=9) is None
    with pytest.raises(ValueError, match="start"):
        matcher.find_violation("abc", start=4)


def test_partial_text_waits_for_the_word_to_end(matcher):
    assert found(matcher, "a tapestry", partial=True) is None
    assert found(matcher, "a tapestry", partial=False) == "tapestry"
    assert found(matcher, "a tapestry,", partial=True) == "tapestry"
    # A longer phrase still open at the end does not hide a shorter one already complete.
    m = SlopMatcher(["rich", "rich tapestry"])
    assert found(m, "a rich tapestry", partial=True) == "rich"


@pytest.mark.parametrize(
    "text",
    [
        "```\na tapestry\n```",
        "```python\nx = 'tapestry'\n```\n",
        "~~~\ntapestry\n~~~",
        "   ```\ntapestry\n   ```",
        "````\n```\ntapestry\n````",
        "```\ntapestry",  # still open
        "use `tapestry` here",
        "use ``a ` tapestry`` here",
        '<tool_call>\n{"q": "tapestry"}\n</tool_call>',
        '<|tool_call|>{"q": "tapestry"}<|/tool_call|>',
        '<|tool_call>call:f{q:"tapestry"}<tool_call|>',
        "<|python_tag|>search(tapestry)",
        '[TOOL_CALLS][{"q": "tapestry"}]',
        "<tool_call>tapestry",  # still open
        '{"name": "f", "arguments": {"q": "tapestry"}}',
        'Sure.\n  {"type": "function", "q": "tapestry"',  # still open
    ],
)
def test_not_prose(matcher, text):
    assert matcher.find_violation(text) is None
    assert matcher.find_violation(text, partial=True) is None


@pytest.mark.parametrize(
    "text, hit_at",
    [
        ("```\ncode\n```\na tapestry", 15),
        ("~~~\ncode\n~~~~\ntapestry", 14),
        ("````\n```\n````\ntapestry", 14),
        ("`code` tapestry", 7),
        ("a `tapestry", 3),  # an unclosed backtick is literal once the text is complete
        ("``tapestry` x", 2),
        ('<tool_call>{"a": 1}</tool_call> tapestry', 32),
        ('{"name": "f", "arguments": {"s": "}"}} tapestry', 39),
        ('{"colour": "tapestry"}', 12),  # not a tool call: its first key is not a tool key
        ('say {"name": "tapestry"}', 14),  # not at the start of a line
    ],
)
def test_prose_around_code_and_tool_calls(matcher, text, hit_at):
    v = matcher.find_violation(text)
    assert v is not None and v.start_char == hit_at


def test_phrase_starting_with_punctuation_needs_no_boundary_before_it():
    m = SlopMatcher(["#blessed"])
    assert found(m, "so#blessed today") == "#blessed"
    assert found(m, "so #blesseds") is None


def test_configurable_markers():
    m = SlopMatcher(
        ["tapestry"], ProseFilter(tool_markers=[("<<", ">>"), ("CALL:", None)], json_tool_keys=None)
    )
    assert m.find_violation("<<tapestry>>") is None
    assert m.find_violation("x CALL: tapestry") is None
    assert found(m, "<<x>> tapestry") == "tapestry"
    assert found(m, "<tool_call>tapestry</tool_call>") == "tapestry"
    assert found(m, '{"name": "tapestry"}') == "tapestry"
    with pytest.raises(ValueError, match="tool marker"):
        ProseFilter(tool_markers=[("", ">>")])


def test_scan_partial_holds_undecided_tails():
    prose = ProseFilter()
    assert prose.scan("ab `cd").settled == 6
    assert prose.scan("ab `cd", partial=True).settled == 3
    assert prose.scan("ab `cd` e", partial=True).ranges == ((0, 3), (7, 9))
    assert prose.scan("ab `cd`", partial=True).settled == 3  # the closing run may still grow
    assert prose.scan("ab `cd\n\nef", partial=True).ranges == ((0, 10),)
    assert prose.scan("ok\n{", partial=True).settled == 3
    assert prose.scan('ok\n{"na', partial=True).settled == 3
    assert prose.scan('ok\n{"nb', partial=True).settled == 7
    assert prose.scan("ok <tool_c", partial=True).settled == 3
    assert prose.scan("ok\n~~", partial=True).settled == 3
    assert prose.scan("```\ncode", partial=True) == prose.scan("```\ncode")


@pytest.mark.parametrize(
    "text, held",
    [
        ("It sent shivers down", 8),
        ("It sent shivers  down\n her", 8),
        ("It sent shivers up", 18),
        ("the tapes", 4),
        ("the xtapes", 10),
        ("the tapestry", 4),
        ("a testament t", 0),
        ("the Delve", 4),
        ("it’", 0),
        ("no slop here ", 13),
        ("```\nthe tapes", 13),
        ("x `foo", 2),
        ("x <tool_ca", 2),
        ('x\n{"na', 2),
    ],
)
def test_pending_prefix(matcher, text, held):
    assert matcher.pending_prefix(text) == held


def test_user_lists(tmp_path):
    slop = SlopList(["Foo  Bar", "foo bar", "baz’s thing"])
    assert slop.phrases == ("baz's thing", "foo bar")
    path = tmp_path / "mine.txt"
    path.write_bytes("\ufeff# my list\r\n\r\nDelve   Into\r\n  tapestry  \r\n".encode())
    loaded = SlopList.load(path)
    assert loaded.phrases == ("delve into", "tapestry")
    assert found(SlopMatcher(loaded), "we DELVE into it") == "DELVE into"


def test_bad_lists(tmp_path):
    with pytest.raises(OSError):
        SlopList.load(tmp_path / "missing.txt")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt: not UTF-8"):
        SlopList.load(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match=r"empty\.txt: no phrases"):
        SlopList.load(empty)
    punct = tmp_path / "punct.txt"
    punct.write_text("fine\n...\n")
    with pytest.raises(ValueError, match=r"punct\.txt:2: phrase '\.\.\.'"):
        SlopList.load(punct)
    with pytest.raises(TypeError):
        SlopList([1])
    with pytest.raises(TypeError, match="not one string"):
        SlopMatcher("tapestry")


def _brute_force(phrases: list[str], text: str, ranges, start: int) -> tuple[int, int] | None:
    """Earliest-starting, then longest, occurrence of any phrase in one prose range ending at or after
    start, by one regex per phrase."""
    best = None
    for phrase in phrases:
        words = [re.escape(w).replace("'", "['’‘ʼ＇]") for w in phrase.split()]
        pattern = re.compile(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)", re.IGNORECASE)
        for lo, hi in ranges:
            for pos in range(lo, hi):
                m = pattern.match(text, pos, hi)
                if m and m.end() >= start and (best is None or (m.start(), -m.end()) < (best[0], -best[1])):
                    best = (m.start(), m.end())
    return best


fragments = st.sampled_from(
    ["a", "testament", "to", "Tapestry", "tapestryx", "delve", "into", "it’s", "important", "`", "```\n",
     "\n", " ", "  ", ",", "shivers", "down", "her", "spine", "<tool_call>", "</tool_call>", "x"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(fragments, max_size=30), data=st.data())
def test_matches_brute_force(matcher, parts, data):
    text = "".join(parts)
    start = data.draw(st.integers(0, len(text)))
    ranges = matcher.prose.scan(text).ranges
    v = matcher.find_violation(text, start)
    expect = _brute_force(PHRASES, text, ranges, start)
    assert (None if v is None else (v.start_char, v.end_char)) == expect


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(fragments, max_size=20))
def test_pending_prefix_matches_brute_force(matcher, parts):
    text = "".join(parts)
    scan = matcher.prose.scan(text, partial=True)
    expect = scan.settled
    if scan.ranges and scan.ranges[-1][1] == len(text):
        lo = scan.ranges[-1][0]
        for s in range(lo, len(text)):
            boundary = s == 0 or not re.match(r"\w", text[s - 1]) or not re.match(r"\w", text[s])
            tail = re.sub(r"\s+", " ", text[s:].lower().replace("’", "'"))
            if boundary and not text[s].isspace() and any(p.startswith(tail) for p in PHRASES):
                expect = s
                break
    assert matcher.pending_prefix(text) == expect


markup = st.sampled_from(
    ["x", " ", "\n", "\n\n", "`", "``", "```", "~~~", "{", '"name"', ":", "}", '"', "<tool_call>",
     "</tool_call>", "<tool_", "<|python_tag|>", "   "]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(markup, max_size=25))
def test_scanning_a_growing_text_resumes_exactly(parts):
    """Partial scans of successive prefixes (which resume from the previous scan) equal fresh scans."""
    text = "".join(parts)
    growing = ProseFilter()
    for k in range(len(text) + 1):
        assert growing.scan(text[:k], partial=True) == ProseFilter().scan(text[:k], partial=True)
    assert growing.scan(text) == ProseFilter().scan(text)


def test_an_empty_list_matches_nothing():
    m = SlopMatcher(SlopList([]))
    text = "a rich tapestry, a testament to delving"
    assert m.find_violation(text) is None and m.find_violation(text, partial=True) is None
    assert m.pending_prefix(text) == len(text)
