"""The automatic prompt cache: window states of earlier prompts on disk, so a new request evaluates only
the tokens after the longest prefix any earlier request shared with it, across conversations and restarts.

Policy (docs/cache.md):

- **What is stored.** Generation stores the state at the end of each prompt (with the logits after its last
  token, so the same prompt again evaluates nothing), at the boundaries the caller names while prefilling
  (end of the system prompt, end of the previous turn: :func:`chat_boundaries`), and after the reply. States
  shorter than ``min_tokens`` are not stored.
- **Deltas.** An entry whose tokens extend a stored entry's tokens is saved as a child: it holds only the
  attention rows of its own tokens; restoring it restores its ancestors first. Recurrent states (qwen4exp's
  Gated DeltaNet and PLE) cannot be composed, so every entry holds them whole (ancestors are read without
  them). Chains are at most :data:`MAX_CHAIN` entries deep.
- **Reuse.** Attention-only models (gemma3, qwen2) can use any entry sharing a prefix with the prompt: the
  restored state is truncated to the shared prefix, and when that cuts an entry the shared prefix becomes an
  entry of its own (the cut entry is re-saved as its child), so long shared prefixes are stored once.
  Recurrent models cannot truncate, so an entry is usable only when the prompt starts with all of its
  tokens: those models rely on the boundaries.
- **Eviction.** Least recently used first (restoring an entry uses its ancestors too), descendants with
  their ancestor, until the files fit ``max_bytes``. The use time is the file's mtime, so it survives
  restarts.
- **Suffix cache reuse.** With ``scr`` a prompt may also reuse an entry's tokens after an edit
  (:meth:`PromptCache.restore_moved`): the entry, among the most recently used that no other entry
  extends, whose tokens :func:`regolith.scr.plan_reuse` reuses most of is restored whole, and prefill moves
  its runs. On recurrent models any entry may be, and one whose recurrent state fits the plan
  (:func:`regolith.scr.fits_recurrent`: an earlier version of the prompt, stored at its end with its
  logits) ranks first.
- **Failures.** An entry that cannot be read back (truncated, corrupt, another format version or model) is
  deleted with its descendants and the prompt is evaluated instead: a broken cache costs time, never output.

Entries live in ``cache_dir/<fingerprint>/<key>.rgs`` (:mod:`regolith.state` files; the fingerprint is mixed
with the attention cache type unless that is f32 for qwen4exp or f16 for the dense models, the types every
window had before cache types existed, so a model loaded with another ``kv_type`` keeps entries of its own).
One process should own a cache directory; files are written atomically, so a process killed mid-save leaves the cache valid
(its temporary file is removed by a later :class:`PromptCache` once it is a minute old).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import state as _state
from .errors import SessionError
from .scr import Run, fits_recurrent, plan_reuse, reused_tokens

if TYPE_CHECKING:
    from .chat import ChatTemplate
    from .window import Window

__all__ = [
    "MAX_CHAIN",
    "MOVED_CANDIDATES",
    "CacheHit",
    "CacheStats",
    "ChatModel",
    "PromptCache",
    "chat_boundaries",
]

# Entries in one restore chain at most: a longer chain reads more files than a whole state would.
MAX_CHAIN = 8
_SUFFIX = ".rgs"
# Entries suffix cache reuse plans against (the most recently used that no other entry extends; any entry on
# models with recurrent layers): each plan is about linear in the two token lists.
MOVED_CANDIDATES = 16
# Temporary files older than this are left over from a killed save.
_STALE_TMP_SECONDS = 60.0


@dataclass(frozen=True)
class CacheHit:
    """A restore: the window now holds the prompt's first ``tokens`` tokens; ``logits`` are those after the
    last of them when the whole prompt was cached (nothing left to evaluate), else None."""

    tokens: int
    logits: np.ndarray | None


@dataclass
class CacheStats:
    """Counters since the cache was opened, and its size now."""

    hits: int = 0  # restores from disk
    misses: int = 0  # restores that found nothing better than what the window held
    tokens_saved: int = 0  # prompt tokens restored instead of evaluated
    stores: int = 0  # files written
    evictions: int = 0  # entries removed for the size cap
    discarded: int = 0  # entries removed because they could not be read back
    write_errors: int = 0  # stores that failed (disk full, permissions): generation goes on without them
    bytes_written: int = 0
    bytes_read: int = 0
    entries: int = 0
    bytes: int = 0  # on disk now


@dataclass
class _Entry:
    path: Path
    fingerprint: (
        bytes  # the cache id (_cache_id): the model's fingerprint, or it with a non-default cache type
    )
    tokens: np.ndarray  # int32 [n]
    start: int  # attention rows stored from this token on (0: a root)
    header: _state.StateHeader
    size: int
    used: int  # the LRU clock: mtime in ns
    children: set[str] = field(default_factory=set)

    @property
    def n(self) -> int:
        return int(self.tokens.size)

    @property
    def key(self) -> str:
        return self.path.stem

    @property
    def parent_key(self) -> str | None:
        return _key(self.fingerprint, self.tokens[: self.start]) if self.start else None


class _Unreadable(Exception):
    def __init__(self, key: str):
        self.key = key


def _cache_id(fingerprint: bytes, architecture: str, kv_type: str | None) -> bytes:
    """What entries are filed and keyed by: the model's fingerprint, mixed with the attention cache type where
    that is not the type every window had before cache types existed (f32 for qwen4exp, f16 otherwise: their
    entries keep their keys) — a state restores only into a window of its cache type."""
    if kv_type is None or kv_type == ("f32" if architecture == "qwen4exp" else "f16"):
        return fingerprint
    return hashlib.blake2b(fingerprint + kv_type.encode(), digest_size=32).digest()


def _model_id(model: Any) -> bytes:
    return _cache_id(model.fingerprint, model.config["architecture"], model.kv_type)


def _key(fingerprint: bytes, tokens: np.ndarray) -> str:
    data = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    return hashlib.blake2b(data, digest_size=16, key=fingerprint).hexdigest()


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):  # gone already, or not ours to delete: the index forgets it anyway
        path.unlink()


class PromptCache:
    """Window states of earlier prompts in ``cache_dir``, at most ``max_bytes`` of files (see the module doc
    for the policy). Set it as :attr:`regolith.Model.prompt_cache` and generation uses it: :meth:`restore`
    before prefilling, :meth:`store` at boundaries, at the prompt's end and after the reply. Safe to share
    between threads (calls are serialised); one process per directory.
    """

    def __init__(self, cache_dir: str | os.PathLike[str], max_bytes: int, *, min_tokens: int = 16):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {min_tokens}")
        self.dir = Path(cache_dir)
        self.max_bytes = int(max_bytes)
        self.min_tokens = int(min_tokens)
        self.stats = CacheStats()
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._scan()
            self._evict(set())

    # ---- the index -------------------------------------------------------------------------------------------

    def _scan(self) -> None:
        now = time.time()
        for model_dir in (d for d in self.dir.iterdir() if d.is_dir()):
            for p in model_dir.iterdir():
                if p.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if now - p.stat().st_mtime > _STALE_TMP_SECONDS:
                            p.unlink()
                elif p.suffix == _SUFFIX:
                    entry = self._read_entry(p)
                    if entry is None:
                        self.stats.discarded += 1
                        _unlink(p)
                    else:
                        self._entries[entry.key] = entry
        orphans = []
        for e in self._entries.values():
            if e.parent_key in self._entries:
                self._entries[e.parent_key].children.add(e.key)
            elif e.parent_key:
                orphans.append(e.key)  # its parent is gone, so the delta is useless
        for key in orphans:
            self.stats.discarded += self._discard(key)
        self._refresh_totals()

    def _read_entry(self, path: Path) -> _Entry | None:
        try:
            head = _state.read_header(path)
            st = path.stat()
        except (SessionError, OSError):
            return None
        tokens = head.tokens
        cid = _cache_id(head.fingerprint, head.architecture, head.kv_type)
        if path.parent.name != cid.hex()[:32] or path.stem != _key(cid, tokens):
            return None
        return _Entry(path, cid, tokens, head.start, head, st.st_size, st.st_mtime_ns)

    def _register(self, entry: _Entry) -> None:
        self._entries[entry.key] = entry
        if entry.parent_key:
            self._entries[entry.parent_key].children.add(entry.key)

    def _refresh_totals(self) -> None:
        self.stats.entries = len(self._entries)
        self.stats.bytes = sum(e.size for e in self._entries.values())

    def _discard(self, key: str) -> int:
        """Delete an entry and its descendants; returns how many."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return 0
        _unlink(entry.path)
        if entry.parent_key in self._entries:
            self._entries[entry.parent_key].children.discard(key)
        return 1 + sum(self._discard(child) for child in list(entry.children))

    def _chain(self, entry: _Entry) -> list[_Entry]:
        """The entry's ancestors, root first, then the entry."""
        chain = [entry]
        while chain[-1].parent_key:
            chain.append(self._entries[chain[-1].parent_key])
        return chain[::-1]

    def _touch(self, chain: list[_Entry]) -> None:
        # Ancestors count as used at least as recently as their descendants, so LRU evicts leaves first.
        now = time.time_ns()
        for e in reversed(chain):
            e.used = now = max(now, e.used + 1)
            with contextlib.suppress(OSError):
                os.utime(e.path, ns=(e.used, e.used))

    def _evict(self, protect: set[str]) -> None:
        total = sum(e.size for e in self._entries.values())
        while total > self.max_bytes:
            victims = [e for k, e in self._entries.items() if k not in protect]
            if not victims:
                break
            victim = min(victims, key=lambda e: (e.used, -e.n))
            self.stats.evictions += self._discard(victim.key)
            total = sum(e.size for e in self._entries.values())
        self._refresh_totals()

    # ---- lookup and restore -----------------------------------------------------------------------------------

    def lookup(self, window: Window, prompt: Sequence[int]) -> int:
        """How many of ``prompt``'s tokens :meth:`restore` could give ``window`` (reading no state)."""
        with self._lock:
            return self._best(window, np.asarray(prompt, dtype=np.int32))[0]

    def _best(self, window: Window, prompt: np.ndarray) -> tuple[int, _Entry | None]:
        model = window._model
        fingerprint, recurrent, limit = _model_id(model), window.recurrent, int(prompt.size)
        best: tuple[int, _Entry | None] = (0, None)
        for e in self._entries.values():
            if e.fingerprint != fingerprint or e.n > window.max_ctx:
                continue
            usable = _common_prefix(e.tokens, prompt)
            if recurrent and usable < e.n:
                continue  # a recurrent state cannot be cut back
            if usable == limit and not (e.n == limit and e.header.has_logits):
                usable = 0 if recurrent else limit - 1  # the last prompt token's logits are still needed
            if usable > best[0]:
                best = (usable, e)
        return best

    def restore(self, window: Window, prompt: Sequence[int]) -> CacheHit | None:
        """Bring ``window`` to the longest prefix of ``prompt`` the cache holds, when that saves at least
        ``min_tokens`` of evaluation over what the window already holds; returns the hit, or None (the window
        is then untouched, unless an unreadable entry was met: it is deleted, the next best tried, and the
        window may be left reset)."""
        ids = np.asarray(prompt, dtype=np.int32)
        recurrent = window.recurrent
        with self._lock:
            while True:
                held = np.asarray(window._tokens, dtype=np.int32)
                keep = min(_common_prefix(held, ids), ids.size - 1)
                if recurrent and keep < held.size:
                    keep = 0  # cutting the window back would replay the kept tokens
                usable, entry = self._best(window, ids)
                if entry is None or usable - keep < self.min_tokens:
                    self.stats.misses += 1
                    return None
                read, logits = self._read(window, entry, usable, recurrent)
                if not read:
                    continue
                self.stats.hits += 1
                self.stats.tokens_saved += usable - keep
                self._refresh_totals()
                return CacheHit(usable, logits if usable == ids.size else None)

    def restore_moved(
        self, window: Window, prompt: Sequence[int], beat: tuple[bool, int], at_least: int
    ) -> list[Run] | None:
        """Suffix cache reuse from the cache: bring ``window`` to the whole of the entry whose tokens
        :func:`regolith.scr.plan_reuse` reuses most of ``prompt`` from (the last prompt token excluded, as
        prefill evaluates it), among the :data:`MOVED_CANDIDATES` most recently used entries no other entry
        extends, when that plan moves tokens, reuses more than ``at_least`` and ranks above ``beat``, the
        window's own plan as (fits, tokens reused). On models with recurrent layers every entry is a
        candidate and a plan that :func:`regolith.scr.fits_recurrent` ranks first (an entry at the end of an
        earlier version of the prompt, stored with its logits, fits an edited resend of it); on the others
        every plan fits. Returns that plan (against the tokens the window now holds), or None where no entry
        does (the window is then untouched, unless an unreadable entry was met: it is deleted, the next best
        tried, and the window may be left reset)."""
        ids = np.asarray(prompt[:-1], dtype=np.int32)
        fingerprint, recurrent = _model_id(window._model), window.recurrent
        with self._lock:
            while True:
                best: tuple[tuple[bool, int], _Entry | None, list[Run]] = (beat, None, [])
                candidates = [
                    e
                    for e in self._entries.values()
                    if (recurrent or not e.children)
                    and e.fingerprint == fingerprint
                    and e.n <= window.max_ctx
                ]
                for e in sorted(candidates, key=lambda e: e.used, reverse=True)[:MOVED_CANDIDATES]:
                    runs = plan_reuse(e.tokens, ids)
                    fits = not recurrent or fits_recurrent(runs, e.tokens, prompt, e.header.has_logits)
                    rank = (fits, reused_tokens(runs))
                    if any(r.dst > 0 for r in runs) and rank[1] > at_least and rank > best[0]:
                        best = (rank, e, runs)
                (fits, reused), entry, plan = best
                if entry is None:
                    return None
                if not self._read(window, entry, entry.n, recurrent)[0]:
                    continue
                last = plan[-1]
                moves_last = recurrent and fits and last.src + last.length < entry.n  # with the logits stored
                self.stats.hits += 1
                self.stats.tokens_saved += reused + moves_last
                self._refresh_totals()
                return plan

    def _read(
        self, window: Window, entry: _Entry, usable: int, recurrent: bool
    ) -> tuple[bool, np.ndarray | None]:
        """(True, :meth:`_load`'s logits), or (False, None) where an entry of the chain was unreadable: it is
        deleted with its descendants and the window reset."""
        try:
            return True, self._load(window, entry, usable, recurrent)
        except _Unreadable as bad:
            self.stats.discarded += self._discard(bad.key)
            self._refresh_totals()
            window.reset()
            return False, None

    def _load(self, window: Window, entry: _Entry, usable: int, recurrent: bool) -> np.ndarray | None:
        chain = self._chain(entry)
        if not recurrent:  # the entries past the one holding token `usable` are not needed
            chain = chain[: next(i for i, e in enumerate(chain) if e.n >= usable) + 1]
        held = np.asarray(window._tokens, dtype=np.int32)
        first = 0  # chain entries the window already holds are not read again
        for i, e in enumerate(chain):
            if _common_prefix(held, e.tokens) == e.n and (e.n == held.size or not recurrent):
                first = i + 1
        if first == len(chain):
            first = 0  # the window is there already but its logits are wanted: read it all again
        if first:
            window.truncate(chain[first - 1].n)
        else:
            window.reset()
        logits = None
        for i in range(first, len(chain)):
            e = chain[i]
            try:
                stats, logits = _state.load_window(window, e.path, header=e.header, whole=i == len(chain) - 1)
            except (SessionError, OSError) as err:
                raise _Unreadable(e.key) from err
            self.stats.bytes_read += stats.bytes
        self._touch(chain)
        cut = chain[-1]
        if window.n_past > usable:
            if cut.start < usable:
                self._split(window, cut, usable, logits)
            window.truncate(usable)
            logits = None
        return logits

    def _split(self, window: Window, entry: _Entry, at: int, logits: np.ndarray | None) -> None:
        """Store the first ``at`` tokens of ``entry`` (which the window holds whole) once: the entry is re-saved
        as a delta on them, then the window, cut back to ``at``, is saved as their entry."""
        try:
            self._count(_state.save_window(window, entry.path, start=at, logits=logits))
            window.truncate(at)
            branch = self._write(window, None)
        except OSError:
            self.stats.write_errors += 1
            self.stats.discarded += self._discard(entry.key)  # its file may now be a delta without a parent
            return
        moved = self._read_entry(entry.path)
        children = entry.children
        self._entries.pop(entry.key)
        if entry.parent_key in self._entries:
            self._entries[entry.parent_key].children.discard(entry.key)
        if moved is None:
            for child in children:
                self.stats.discarded += self._discard(child)
            return
        moved.children = children
        moved.used = entry.used
        self._register(moved)
        self._touch(self._chain(moved))
        self._evict({e.key for e in self._chain(moved)} | {branch.key})

    # ---- store -----------------------------------------------------------------------------------------------

    def store(self, window: Window, *, logits: np.ndarray | None = None) -> bool:
        """Store ``window``'s state (with ``logits``, those after its last token, if given) unless it holds
        fewer than ``min_tokens`` tokens or is stored already; returns whether an entry was written. Evicts
        least recently used entries to stay within ``max_bytes``; a failed write (disk full) is counted in
        ``stats.write_errors``, not raised."""
        if window.n_past < self.min_tokens or window.moved_from is not None:
            return False  # a moved state is not what the tokens give: other prompts must not restore it
        with self._lock:
            key = _key(_model_id(window._model), np.asarray(window._tokens, dtype=np.int32))
            if key in self._entries:
                self._touch(self._chain(self._entries[key]))
                return False
            try:
                entry = self._write(window, logits)
            except OSError:
                self.stats.write_errors += 1
                return False
            chain = self._chain(entry)
            self._touch(chain)
            self._evict({e.key for e in chain})
            if entry.size > self.max_bytes:
                self.stats.evictions += self._discard(entry.key)
            self._refresh_totals()
            return entry.key in self._entries

    def _write(self, window: Window, logits: np.ndarray | None) -> _Entry:
        """Save the window as a new entry, a delta on the longest stored prefix of its tokens (unless that
        chain is full)."""
        fingerprint = _model_id(window._model)
        tokens = np.asarray(window._tokens, dtype=np.int32)
        parent = None
        for e in self._entries.values():
            if (
                e.fingerprint == fingerprint
                and e.n < tokens.size
                and (parent is None or e.n > parent.n)
                and _common_prefix(e.tokens, tokens) == e.n
                and len(self._chain(e)) < MAX_CHAIN
            ):
                parent = e
        path = self.dir / fingerprint.hex()[:32] / f"{_key(fingerprint, tokens)}{_SUFFIX}"
        self._count(_state.save_window(window, path, start=parent.n if parent else 0, logits=logits))
        entry = self._read_entry(path)
        if entry is None:
            raise OSError(f"{path} could not be read back after writing it")
        self._register(entry)
        return entry

    def _count(self, stats: _state.IoStats) -> None:
        self.stats.stores += 1
        self.stats.bytes_written += stats.bytes


class ChatModel(Protocol):
    """What :func:`chat_boundaries` needs of a model (:class:`regolith.Model` is one): its chat template and
    the tokenization of a rendered chat."""

    @property
    def chat_template(self) -> ChatTemplate: ...

    def tokenize_chat(self, text: str) -> list[int]: ...


def chat_boundaries(
    model: ChatModel,
    messages: Sequence[Mapping[str, Any]],
    prompt: Sequence[int],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """Token offsets in ``prompt`` (the rendered ``messages``) worth a cache snapshot: the end of the system
    prompt and the end of the conversation before its last message, where later requests of the same
    conversation will still agree with this one. ``template_kwargs`` are the variables ``prompt`` was rendered
    with (``reasoning_effort``...: gpt-oss's system prompt names it)."""
    prefixes = []
    if messages and messages[0].get("role") == "system":
        prefixes.append(messages[:1])
    if len(messages) > 1:
        prefixes.append(messages[:-1])
    ids = np.asarray(prompt, dtype=np.int32)
    out = set()
    for prefix in prefixes:
        text = model.chat_template.render(prefix, tools=tools, add_generation_prompt=False, **template_kwargs)
        out.add(_common_prefix(np.asarray(model.tokenize_chat(text), dtype=np.int32), ids))
    return sorted(out)
