"""Routing by prompt prefix for regolith's Ray Serve replicas (:mod:`regolith.server.ray`).

A request's :func:`affinity_text` is the text whose prefix a replica's windows and prompt cache would hold;
:class:`PrefixIndex` remembers which replica was sent which prefixes; :class:`PrefixAffinityRouter` is the
Serve request router that uses them. Serve ships the router's module to the processes that route by
value (cloudpickle), so this module holds only the routing: the router reads a request's ``prompt``
attribute, whatever class carries it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, OrderedDict
from collections.abc import Sequence

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

__all__ = ["BLOCK_CHARS", "PrefixAffinityRouter", "PrefixIndex", "affinity_text"]

# Characters per block of the prefix index: a prompt's prefix is matched block by block.
BLOCK_CHARS = 128
# Blocks the index keeps, least recently used dropped first: 16M characters of prompts, about 50 MiB.
MAX_BLOCKS = 1 << 17
# A replica must have served at least this share of a prompt for the prompt to follow it.
MATCH_THRESHOLD = 0.1
# Requests the affine replica may have beyond the least busy one before load decides instead.
IMBALANCE = 4


def affinity_text(path: str, body: bytes) -> str | None:
    """The text of a request whose prefix decides its replica, or None for requests without a prompt.

    Chat requests (``/v1/chat/completions``, ``/v1/messages``, ``/v1/messages/count_tokens``): the JSON of
    their tools, system prompt and messages, in the order the chat template renders them, so a conversation's
    next request extends its previous one. Completions: the prompt. A body that is not a JSON object has
    none (the replica answers it with the error)."""
    if not path.startswith("/v1/"):
        return None
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(req, dict):
        return None
    if "messages" in req:
        parts = [req.get("tools"), req.get("system"), req["messages"]]
        text = "".join(json.dumps(p, ensure_ascii=False, sort_keys=True) for p in parts)
        return text.removesuffix("]")  # the list's end, so that one more message extends the text
    prompt = req.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt:
        return json.dumps(prompt)
    return None


def _blocks(text: str) -> list[bytes]:
    """Keys of ``text``'s whole blocks: block i's key digests every character up to its end."""
    keys = []
    h = hashlib.blake2b(digest_size=16)
    for end in range(BLOCK_CHARS, len(text) + 1, BLOCK_CHARS):
        h.update(text[end - BLOCK_CHARS : end].encode("utf-8", "surrogatepass"))
        keys.append(h.copy().digest())
    return keys


class PrefixIndex:
    """Which replicas were sent which prompt prefixes, in blocks of :data:`BLOCK_CHARS` characters.

    :meth:`match` answers the replicas among the candidates that were sent the longest prefix of a text and
    its length in characters; :meth:`insert` records a text sent to a replica. At most ``max_blocks`` block
    keys are kept, least recently used first out."""

    def __init__(self, max_blocks: int = MAX_BLOCKS):
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, set[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, text: str, candidates: Sequence[str]) -> tuple[int, list[str]]:
        """(characters matched, the candidates holding that many) for ``text``; (0, []) without a match."""
        alive = set(candidates)
        best: list[str] = []
        n = 0
        for key in _blocks(text):
            holders = self._blocks.get(key)
            if holders is None or not (holders & alive):
                break
            alive &= holders
            best, n = sorted(alive), n + BLOCK_CHARS
            self._blocks.move_to_end(key)
        return n, best

    def insert(self, text: str, replica: str) -> None:
        """Record that ``replica`` was sent ``text``."""
        for key in _blocks(text):
            self._blocks.setdefault(key, set()).add(replica)
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)

    def drop(self, replica: str) -> None:
        """Forget ``replica`` (it died or left)."""
        for key in [k for k, holders in self._blocks.items() if replica in holders]:
            holders = self._blocks[key]
            holders.discard(replica)
            if not holders:
                del self._blocks[key]


class PrefixAffinityRouter(RequestRouter):
    """Serve's request router for the replicas (in the frontend's process): a request goes to the replica
    that was sent the longest prefix of its :func:`affinity_text` (at least ``match_threshold`` of it), unless
    that replica has ``imbalance`` more requests in hand than the least busy one; otherwise to the less busy
    of two random replicas (power of two choices), which is also where requests without a prompt go.

    The router picks one replica itself and counts the requests each has in hand from where it sent them and
    :meth:`on_request_completed`: Serve reports neither where a request went nor the replicas' queues to a
    router unless it enforces ``max_ongoing_requests`` strictly."""

    def initialize_state(
        self,
        match_threshold: float = MATCH_THRESHOLD,
        imbalance: int = IMBALANCE,
        max_blocks: int = MAX_BLOCKS,
    ) -> None:
        self.match_threshold = match_threshold
        self.imbalance = imbalance
        self.index = PrefixIndex(max_blocks)
        self.in_hand: Counter[str] = Counter()  # replica -> requests sent and not completed
        self.sent: dict[str, str] = {}  # request -> the replica it was last sent to

    def _load(self, replica: RunningReplica) -> int:
        return self.in_hand[replica.replica_id.to_full_id_str()]

    def choose(self, text: str | None, replicas: Sequence[RunningReplica]) -> RunningReplica:
        """The replica for a request with prompt ``text`` (None: none) among ``replicas``; the prompt is
        recorded as sent there."""
        by_id = {r.replica_id.to_full_id_str(): r for r in replicas}
        chosen = None
        if text:
            matched, holders = self.index.match(text, list(by_id))
            if holders and matched >= self.match_threshold * len(text):
                least = min(self._load(r) for r in replicas)
                near = [by_id[h] for h in holders if self._load(by_id[h]) - least <= self.imbalance]
                chosen = min(near, key=self._load, default=None)
        if chosen is None:
            chosen = min(random.sample(list(replicas), min(2, len(replicas))), key=self._load)
        if text:
            self.index.insert(text, chosen.replica_id.to_full_id_str())
        return chosen

    def record(self, request: str, replica: str) -> None:
        """Count ``request`` as in ``replica``'s hands (and no longer in those of one it was sent to before)."""
        before = self.sent.get(request)
        if before is not None:
            self._release(before)
        self.sent[request] = replica
        self.in_hand[replica] += 1

    def _release(self, replica: str) -> None:
        self.in_hand[replica] -= 1
        if self.in_hand[replica] <= 0:
            del self.in_hand[replica]

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        replicas = self.select_available_replicas(candidate_replicas) or candidate_replicas
        if pending_request is None:
            return [random.sample(replicas, min(2, len(replicas)))]
        first = pending_request.args[0] if pending_request.args else None
        text = getattr(first, "prompt", None)
        chosen = self.choose(text if isinstance(text, str) else None, replicas)
        self.record(pending_request.metadata.internal_request_id, chosen.replica_id.to_full_id_str())
        return [[chosen]]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        replica = replica_id.to_full_id_str()
        if self.sent.get(internal_request_id) == replica:  # not an earlier attempt's completion
            del self.sent[internal_request_id]
            self._release(replica)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        replica = replica_id.to_full_id_str()
        self.index.drop(replica)
        self.in_hand.pop(replica, None)
        self.sent = {r: to for r, to in self.sent.items() if to != replica}
