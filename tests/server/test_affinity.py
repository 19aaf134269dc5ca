"""Routing by prompt prefix (regolith.server.affinity): the text a request is routed by, and the prefix index
against a brute-force search over everything each replica was sent."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("ray.serve")

from regolith.server.affinity import BLOCK_CHARS, PrefixAffinityRouter, PrefixIndex, affinity_text


def _brute_force(sent: dict[str, list[str]], text: str, candidates: list[str]) -> tuple[int, list[str]]:
    """The longest whole-block prefix of ``text`` some text sent to a candidate starts with, and those
    candidates."""

    def shared(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n // BLOCK_CHARS * BLOCK_CHARS

    best = {r: max((shared(t, text) for t in sent.get(r, [])), default=0) for r in candidates}
    n = max(best.values(), default=0)
    return (n, sorted(r for r in candidates if best[r] == n)) if n else (0, [])


def _text(rng: random.Random, stems: list[str]) -> str:
    """A stem (shared with other texts) and a random tail: texts that share long prefixes, as prompts do."""
    stem = rng.choice(stems)
    return stem[: rng.randrange(len(stem) + 1)] + "".join(rng.choice("ab") for _ in range(rng.randrange(400)))


@pytest.mark.parametrize("seed", range(4))
def test_match_equals_brute_force(seed):
    rng = random.Random(seed)
    stems = ["".join(rng.choice("abc") for _ in range(rng.randrange(200, 900))) for _ in range(3)]
    replicas = [f"r{i}" for i in range(4)]
    index, sent = PrefixIndex(), {}
    for _ in range(60):
        text, replica = _text(rng, stems), rng.choice(replicas)
        candidates = sorted(rng.sample(replicas, rng.randrange(1, 5)))
        assert index.match(text, candidates) == _brute_force(sent, text, candidates)
        index.insert(text, replica)
        sent.setdefault(replica, []).append(text)
    gone = replicas[0]
    index.drop(gone)
    del sent[gone]
    for _ in range(20):
        text = _text(rng, stems)
        assert index.match(text, replicas) == _brute_force(sent, text, replicas)


def test_the_index_keeps_at_most_its_blocks_least_recently_used_out():
    index = PrefixIndex(max_blocks=8)
    old, new = "x" * (4 * BLOCK_CHARS), "y" * (8 * BLOCK_CHARS)
    index.insert(old, "a")
    index.insert(new, "b")
    assert len(index) == 8
    assert index.match(old, ["a", "b"]) == (0, [])
    assert index.match(new + "z", ["a", "b"]) == (8 * BLOCK_CHARS, ["b"])


def test_the_affinity_text_of_each_api():
    system = {"role": "system", "content": "Be brief."}
    turn = [system, {"role": "user", "content": "Hello"}]
    later = [*turn, {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Bye"}]
    first = affinity_text("/v1/chat/completions", json.dumps({"model": "m", "messages": turn}).encode())
    second = affinity_text("/v1/chat/completions", json.dumps({"model": "m", "messages": later}).encode())
    assert first and second.startswith(first), "a conversation's next request extends its text"
    anthropic = {"model": "m", "system": "Be brief.", "max_tokens": 5, "messages": turn[1:]}
    assert "Be brief." in affinity_text("/v1/messages", json.dumps(anthropic).encode())
    assert affinity_text("/v1/completions", b'{"model": "m", "prompt": "def f("}') == "def f("
    assert affinity_text("/v1/completions", b'{"model": "m", "prompt": [1, 2, 3]}') == "[1, 2, 3]"
    for path, body in [
        ("/health", b""),
        ("/v1/models", b""),
        ("/v1/chat/completions", b"not json"),
        ("/v1/chat/completions", b"[1, 2]"),
        ("/v1/completions", b'{"prompt": ""}'),
    ]:
        assert affinity_text(path, body) is None, (path, body)


class _Replica:
    def __init__(self, name: str):
        self.name = name
        self.replica_id = self

    def to_full_id_str(self) -> str:
        return self.name


def _router(**kw) -> PrefixAffinityRouter:
    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)  # Serve builds it with its own arguments
    router.initialize_state(**kw)
    return router


def test_the_router_follows_the_prefix_until_the_load_is_too_uneven():
    router = _router(imbalance=2)
    a, b = _Replica("a"), _Replica("b")
    system = "s" * (6 * BLOCK_CHARS)
    first = router.choose(system + "first question", [a, b])
    router.record("r1", first.name)
    other = b if first is a else a
    assert router.choose(system + "second question", [a, b]) is first, "the prefix's replica"
    router.record("r2", first.name)
    router.record("r3", first.name)
    assert router.choose(system + "third", [a, b]) is other, "3 in hand against 0: past the imbalance"
    assert router.index.match(system, ["a", "b"])[1] == ["a", "b"], "both hold the system prompt now"
    assert router.choose(system + "fourth", [a, b]) is other, "of the replicas holding it, the less busy"
    router.on_request_completed(first, "r2")
    alone = "t" * (6 * BLOCK_CHARS)
    router.index.insert(alone, first.name)
    assert router.choose(alone + "fifth", [a, b]) is first, "2 in hand against 0 is within the imbalance"
    assert router.choose("no shared prefix" * 20, [a, b]) is other, "no match: the less busy of two"
    assert router.choose(None, [a, b]) is other


def test_the_router_counts_each_request_once():
    router = _router()
    a, b = _Replica("a"), _Replica("b")
    router.record("r", "a")
    router.record("r", "b")  # routed again (a was unavailable): b holds it now
    assert dict(router.in_hand) == {"b": 1}
    router.on_request_completed(a, "r")  # the earlier attempt's completion changes nothing
    assert dict(router.in_hand) == {"b": 1}
    router.on_request_completed(b, "r")
    assert dict(router.in_hand) == {} and router.sent == {}
