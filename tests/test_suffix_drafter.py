"""The suffix-automaton drafter (csrc/core/suffix_drafter.h) against a brute-force search written here."""

from __future__ import annotations

import numpy as np
import pytest

from regolith import _core


def longest_repeated_suffix(text: list[int]) -> int:
    """Length of the longest suffix of text that also ends at an earlier position (brute force)."""
    n = len(text)
    for length in range(n - 1, 0, -1):
        suffix = text[n - length :]
        if any(text[e - length + 1 : e + 1] == suffix for e in range(length - 1, n - 1)):
            return length
    return 0


def check(text: list[int], drafter, max_tokens: int = 5) -> None:
    tokens, match = drafter.propose(max_tokens)
    want = longest_repeated_suffix(text)
    assert match == want
    if want == 0:
        assert tokens == []
        return
    # the draft continues some earlier occurrence of the matched suffix
    n = len(text)
    suffix = text[n - want :]
    ends = [e for e in range(want - 1, n - 1) if text[e - want + 1 : e + 1] == suffix]
    assert any(tokens == text[e + 1 : e + 1 + max_tokens] for e in ends)
    assert 1 <= len(tokens) <= max_tokens


@pytest.mark.parametrize("alphabet", [2, 3, 7])
def test_match_length_and_continuation_match_brute_force(alphabet):
    rng = np.random.default_rng(alphabet)
    for _ in range(20):
        text = [int(t) for t in rng.integers(0, alphabet, rng.integers(1, 60))]
        d = _core.SuffixDrafter()
        for i, t in enumerate(text):
            match = d.push(t)  # push returns the match a draft proposed now continues, as match_len does
            assert match == d.match_len == d.propose(5)[1]
            check(text[: i + 1], d)


def test_prefers_the_latest_occurrence():
    # "1 2" was followed by 3 and then by 4: the draft follows the later one (the latest version of the text)
    d = _core.SuffixDrafter()
    d.append(np.array([1, 2, 3, 8, 1, 2, 4, 9, 1, 2], dtype=np.int32))
    assert d.propose(2) == ([4, 9], 2)


def test_min_match_and_limits():
    d = _core.SuffixDrafter()
    d.append(np.array([5, 6, 7, 8, 5, 6], dtype=np.int32))
    assert d.propose(10) == ([7, 8, 5, 6], 2)  # stops at the end of the text
    assert d.propose(10, min_match=3) == ([], 0)
    assert d.propose(0) == ([], 0)
    assert _core.SuffixDrafter().propose(3) == ([], 0)


def test_truncate_equals_a_fresh_build():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 4, 80).astype(np.int32)
    d = _core.SuffixDrafter()
    d.append(text)
    for n in (79, 50, 13, 0):
        d.truncate(n)
        fresh = _core.SuffixDrafter()
        fresh.append(text[:n])
        assert d.size == n and d.text == list(text[:n])
        assert d.propose(6) == fresh.propose(6)
    with pytest.raises(ValueError):
        d.truncate(1)


def test_large_vocabulary_ids_and_long_text():
    rng = np.random.default_rng(1)
    block = rng.integers(0, 262144, 300).astype(np.int32)
    d = _core.SuffixDrafter()
    d.append(np.concatenate([block, rng.integers(0, 262144, 1000).astype(np.int32), block[:50]]))
    tokens, match = d.propose(7)
    assert match == 50 and tokens == list(block[50:57])


def test_push_wakes_looks_the_new_match_length_up_in_the_wake_table():
    rng = np.random.default_rng(2)
    text = [int(t) for t in rng.integers(0, 3, 120)]
    d = _core.SuffixDrafter()
    assert d.push_wakes(text[0], 0) == 0  # no table yet: nothing wakes
    wakes = [False, False, True, False, True]  # lengths 2 and 4 and longer wake
    d.set_wakes(wakes)
    for i in range(1, len(text)):
        assert d.push_wakes(text[i], i - 1) == -1 and d.size == i  # out of step: nothing appended
        want = longest_repeated_suffix(text[: i + 1])
        assert d.push_wakes(text[i], i) == int(wakes[min(want, len(wakes) - 1)])
        assert d.match_len == want


def test_the_python_drafter_catches_up_before_a_pushed_token():
    from regolith.speculative import SuffixDrafter

    text = [7, 8, 9, 7, 8, 9, 7, 8]
    drafter = SuffixDrafter()
    drafter.wake_on(lambda key: key[1] >= 2)  # matches of 3 tokens and more
    assert drafter.push_wakes(text[:3]) is False and drafter.size == 3  # the first two indexed first
    assert drafter.push_wakes(text) is True and drafter.size == len(text)  # a match of 5
    assert drafter.push_wakes([7, 8, 9, 1]) is False and drafter.size == 4  # ahead of seq: cut back to it
