"""One inference context, :class:`Window`: token ids in, logits out, continuing from the tokens it holds."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from . import _core
from . import state as _state
from .errors import ContextOverflowError, RegolithError, SessionError
from .vision import ImageSpan, mrope_positions

__all__ = ["Stepper", "Window", "WindowSnapshot", "eval_windows"]


# token ids a move or a cut tells the window about: the n-gram context of PLE layers (ModelWindow::kRecentTokens)
_RECENT = 16


@dataclass(frozen=True)
class WindowSnapshot:
    """A copy of a window's whole state in host memory (:meth:`Window.snapshot`): the tokens it had seen,
    their images, and the state's bytes (``nbytes``)."""

    tokens: tuple[int, ...]
    images: tuple[ImageSpan, ...]
    _state: Any
    moved_from: int | None = None
    """The first token whose state was moved rather than evaluated (:attr:`Window.moved_from`)."""
    end_logits: np.ndarray | None = None
    """The logits after its last token, where the window knew them (:meth:`Window.end_logits`)."""

    @property
    def nbytes(self) -> int:
        """Host memory the copy takes."""
        return int(self._state.bytes)


class Stepper(Protocol):
    """Runs windows' evaluations as parts of steps over several windows (a server's scheduler batching the
    sequences it serves): :meth:`eval` returns what :func:`eval_windows` gives ``window`` for ``ids``, once
    steps have carried them, through :func:`eval_windows` (which keeps the window's token list)."""

    def eval(self, window: Window, ids: np.ndarray, all_logits: bool) -> np.ndarray: ...


class Window:
    """One inference context: tokens in, logits out, continuing from the tokens already evaluated.

    Holds all decoding state (attention KV caches and indexer keys, Gated DeltaNet recurrent and conv
    states, PLE history) and the ids of the tokens it has seen. Create it with :meth:`regolith.Model.window`.
    A window is not safe to share between threads. With :attr:`stepper` set, its text-only evaluations go
    through the stepper, which batches them with other windows' (the logits are the same bit for bit).
    """

    def __init__(self, model: _state.ModelInfo, core: Any, *, on_eval: Callable[[int], None] | None = None):
        """``core`` is the model's new ``_core.ModelWindow``; ``on_eval(n)`` is told of every ``n`` tokens
        evaluated (the model counts them for its stats)."""
        self._model = model
        self._w = core
        self._on_eval = on_eval
        self._tokens: list[int] = []
        self._images: list[ImageSpan] = []  # the images among the tokens held or about to be evaluated
        self.n_evaluated = 0
        """Tokens evaluated over the window's life (prefix reuse shows as this growing by less than a prompt)."""
        self.stepper: Stepper | None = None
        """Where :meth:`eval` sends text-only evaluations (:class:`Stepper`); None: evaluated at once, alone."""
        self.moved_from: int | None = None
        """The first of the held tokens whose state :meth:`append_moved` put there (suffix cache reuse): from
        it on the state is not what evaluating the tokens gives, and the prompt cache does not store it. None
        when every held token was evaluated."""
        self._end: tuple[np.ndarray, np.ndarray] | None = None  # (tokens, the logits after the last of them)

    @property
    def n_past(self) -> int:
        """Tokens the window holds."""
        return self._w.n_past

    @property
    def max_ctx(self) -> int:
        """The most tokens this window can hold."""
        return self._w.max_ctx

    @property
    def tokens(self) -> list[int]:
        """A copy of the ids of the tokens the window holds, oldest first."""
        return list(self._tokens)

    def reset(self) -> None:
        """Forget every token: back to the state of a new window."""
        self._w.reset()
        self._tokens.clear()
        self._images = []
        self.moved_from = None
        self._end = None

    def attach_images(self, images: Sequence[ImageSpan]) -> None:
        """Declare the images of the token sequence this window is about to be brought to (a prompt's
        :class:`regolith.vision.ImageSpan` list; empty for text only). Tokens held from the first image that
        differs on are dropped, so prefix reuse never mixes up two images with the same token ids; the
        tokens of these spans then evaluate as their image embeddings with M-RoPE positions."""
        new = sorted(images, key=lambda sp: sp.start)
        cut = len(self._tokens)
        for old_sp, new_sp in itertools.zip_longest(self._images, new):
            if (
                old_sp is None
                or new_sp is None
                or (old_sp.start, old_sp.image.digest)
                != (
                    new_sp.start,
                    new_sp.image.digest,
                )
            ):
                cut = min(sp.start for sp in (old_sp, new_sp) if sp is not None)
                break
        self._images = new
        if cut < len(self._tokens):
            self.truncate(cut)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens and forget the rest.

        Attention-only models cut their KV cache; models with recurrent state (qwen4exp's Gated DeltaNet)
        keep no history, so the window is reset and the kept tokens evaluated again, unless ``n`` lies within
        the last evaluation after :meth:`checkpoint`.
        """
        if self.try_truncate(n):
            return
        kept, images = self._tokens[:n], self._images
        self.reset()
        self._images = images
        for start in range(0, n, 512):
            self.eval(kept[start : start + 512], all_logits=False)

    def try_truncate(self, n: int) -> bool:
        """Keep the first ``n`` tokens when the state can be cut back there without evaluating anything again
        (any ``n`` on attention-only models; within the last evaluation after :meth:`checkpoint` on recurrent
        ones); False, the window unchanged, otherwise."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot truncate a window of {len(self._tokens)} tokens to {n}")
        if n == len(self._tokens) or self._w.truncate(n):
            del self._tokens[n:]
            if self.moved_from is not None and self.moved_from >= n:
                self.moved_from = None
            return True
        return False

    def snapshot(self) -> WindowSnapshot:
        """A copy of the window's whole state (every layer's state and the token ids) in host memory, which
        :meth:`restore` puts back: several continuations of one prompt (a server's ``n`` choices) evaluate
        the prompt once, also on models whose recurrent state cannot be cut back."""
        return WindowSnapshot(
            tuple(self._tokens), tuple(self._images), self._w.snapshot(), self.moved_from, self.end_logits()
        )

    def restore(self, snapshot: WindowSnapshot) -> None:
        """Replace the window's state with ``snapshot`` (taken from a window of the same model): it then holds
        the snapshot's tokens, and evaluating gives the logits the snapshotted window would have given, bit
        for bit. Raises :class:`regolith.SessionError` for a snapshot of another model or one longer than the
        window (the window is then reset)."""
        try:
            self._w.restore(snapshot._state)
        except BaseException:
            self._tokens, self._images, self.moved_from, self._end = [], [], None, None
            raise
        self._tokens, self._images = list(snapshot.tokens), list(snapshot.images)
        self.moved_from = snapshot.moved_from
        self._end = None
        if snapshot.end_logits is not None:
            self.note_end_logits(snapshot.end_logits)

    def note_end_logits(self, logits: np.ndarray) -> None:
        """Remember ``logits`` as those after the window's last token (a copy): :func:`regolith.generation.prefill`
        notes them after each prompt, the prompt cache with an entry that stored them. Suffix cache reuse on
        models with recurrent layers then moves a prompt's last token too where it ends the window's tokens,
        instead of evaluating it with a state that has already read it (:meth:`end_logits`)."""
        row = np.array(logits, dtype=np.float32, copy=True)
        row.flags.writeable = False
        self._end = (np.asarray(self._tokens, dtype=np.int32), row)

    def end_logits(self) -> np.ndarray | None:
        """The logits :meth:`note_end_logits` remembered (read-only), while the window still holds exactly the
        tokens it held then (None otherwise): another evaluation, a cut or a reset makes them stale."""
        if self._end is None:
            return None
        tokens, logits = self._end
        if len(tokens) != len(self._tokens) or not np.array_equal(tokens, self._tokens):
            return None
        return logits

    @property
    def recurrent(self) -> bool:
        """Whether the model has recurrent layers (Gated DeltaNet: qwen4exp, qwen35moe, qwen3next), whose state
        keeps no history: it cannot be cut back to a prefix, nor can a moved token's be recomputed."""
        return "linear_attention" in self._model.config.get("layer_types", ())

    @property
    def can_move(self) -> bool:
        """Whether :meth:`append_moved` works for this model (suffix cache reuse): every architecture
        regolith runs."""
        return bool(self._w.can_move)

    def append_moved(self, snapshot: WindowSnapshot, src: int, n: int) -> None:
        """Suffix cache reuse: append tokens ``[src, src + n)`` of ``snapshot`` (of a window of this model) at
        the window's next positions without evaluating them: their attention keys and values as computed in
        their old context, each key's RoPE turned to its new position (QSA's indexer keys too, its block keys
        pooled again). Not exact (the tokens attended to what
        preceded them then); :func:`regolith.generation.prefill` does it for ``scr=True``. Raises
        :class:`regolith.RegolithError` for a model that cannot (:attr:`can_move`), bad ranges, an overflow
        or images among the moved tokens."""
        if not 0 <= src <= src + n <= len(snapshot.tokens):
            raise ValueError(f"cannot move tokens [{src}, {src + n}) of a snapshot of {len(snapshot.tokens)}")
        if any(sp.start < src + n and src < sp.start + sp.n_tokens for sp in snapshot.images):
            raise RegolithError("suffix cache reuse does not move image tokens")
        at = len(self._tokens)
        recent = [*self._tokens[-_RECENT:], *snapshot.tokens[src : src + n]][-_RECENT:]
        try:
            self._w.append_moved(snapshot._state, src, n, recent)
        except BaseException:
            self._keep_held()
            raise
        self._tokens.extend(snapshot.tokens[src : src + n])
        if n and self.moved_from is None:
            self.moved_from = at

    def truncate_attention(self, n: int) -> None:
        """Suffix cache reuse's cut: keep the first ``n`` tokens' attention rows and, on models with recurrent
        layers (qwen4exp, qwen35moe, qwen3next), their recurrent states (Gated DeltaNet, PLE's conv history)
        as they are, the state after every token held (so the window's state from ``n`` on is not what its
        tokens give: :attr:`moved_from`). Attention-only models just truncate. Raises
        :class:`regolith.RegolithError` where :attr:`can_move` is False."""
        if self.try_truncate(n):
            return
        self._w.truncate_attention(n, self._tokens[max(0, n - _RECENT) : n])
        del self._tokens[n:]
        self.moved_from = n if self.moved_from is None else min(self.moved_from, n)

    def adopt_recurrent(self, snapshot: WindowSnapshot) -> None:
        """Suffix cache reuse's end on models with recurrent layers: take ``snapshot``'s recurrent states
        (Gated DeltaNet, PLE's conv history: the state after its tokens) as the window's, its tokens
        unchanged; nothing on attention-only models. :func:`regolith.generation.prefill` does it when the last
        moved run ends where the snapshot's tokens end, so the recurrent layers have last read what the
        window's last tokens are."""
        self._end = None
        self._w.adopt_recurrent(snapshot._state, self._tokens[-_RECENT:])

    def _keep_held(self) -> None:
        """After a failed call, which leaves the window unchanged or reset: drop the ids of the tokens past
        those the window holds."""
        del self._tokens[self._w.n_past :]
        if self.moved_from is not None and self.moved_from >= len(self._tokens):
            self.moved_from = None

    def checkpoint(self) -> None:
        """Make the next :meth:`eval` (of at most 16 tokens) keep per-token states, so that :meth:`truncate`
        to any length within it is a cheap rollback, also on recurrent models (speculative verification)."""
        self._w.checkpoint()

    @property
    def has_draft_head(self) -> bool:
        """Whether the model has its own draft head (qwen4exp's MTP) for :meth:`draft`."""
        return self._w.has_draft_head

    def draft(self, next_token: int, n: int) -> list[int]:
        """Up to ``n`` greedy tokens the model's draft head predicts after the window's tokens and
        ``next_token`` (the token to be evaluated next); [] without a draft head."""
        vocab = self._model.config["vocab_size"]
        if not 0 <= next_token < vocab:
            raise ValueError(f"token id {next_token} is out of range for a vocabulary of {vocab}")
        return self._w.draft(int(next_token), int(n))

    def catch_up_draft_head(self) -> int:
        """Let the draft head take in the window's tokens it has not seen yet, all but the last (whose pair
        needs the next token): the part of a :meth:`draft` that depends on the held tokens alone, so that it
        can be timed apart from drafting. Returns how many tokens it took in; 0 without a draft head."""
        return self._w.catch_up_draft_head()

    @property
    def draft_head_lag(self) -> int:
        """How many tokens :meth:`catch_up_draft_head` would take in now (0 without a draft head)."""
        return self._w.draft_head_lag

    @property
    def stepped(self) -> bool:
        """Whether its text evaluations go through :attr:`stepper` now (one is set and no image is held:
        windows holding images evaluate alone)."""
        return self.stepper is not None and not self._images

    def eval(self, tokens, *, all_logits: bool = True) -> np.ndarray:
        """Evaluate ``tokens`` after those already seen; returns float32 logits of shape (len(tokens), n_vocab),
        or (1, n_vocab) for the last token only when ``all_logits`` is False (what generation needs after a
        prompt; it skips the LM head for the other rows).

        Raises ValueError for token ids outside the vocabulary and :class:`regolith.ContextOverflowError` when
        the window's context would overflow (the window is then unchanged). With a ``stepper`` (see
        :class:`Window`), a text-only evaluation runs through it, as part of a step over several windows.
        """
        ids = self._checked(tokens)
        if self.stepped and ids.size:
            return self.stepper.eval(self, ids, all_logits)  # through eval_windows, which keeps the books
        try:
            logits = self._eval(ids, all_logits)
        except BaseException:
            self._keep_held()
            raise
        self._evaluated(ids)
        return logits

    def _checked(self, tokens) -> np.ndarray:
        """``tokens`` as contiguous int32 ids, checked against the vocabulary and the room left."""
        ids = np.asarray(tokens)
        if ids.ndim != 1:
            raise ValueError(f"tokens must be a 1-D sequence of ids, got shape {ids.shape}")
        if ids.size and ids.dtype.kind not in "iu":
            raise ValueError(f"tokens must be integers, got {ids.dtype}")
        vocab = self._model.config["vocab_size"]
        # a decode step's single id by a comparison: numpy's reductions cost microseconds a token
        if ids.size == 1:
            in_range = 0 <= int(ids[0]) < vocab
        else:
            in_range = not ids.size or (ids.min() >= 0 and ids.max() < vocab)
        if not in_range:
            bad = int(ids[(ids < 0) | (ids >= vocab)][0])
            raise ValueError(f"token id {bad} is out of range for a vocabulary of {vocab}")
        if len(self._tokens) + ids.size > self.max_ctx:
            raise ContextOverflowError(
                f"context overflow: {ids.size} more tokens do not fit; the window holds {len(self._tokens)} of {self.max_ctx}"
            )
        return np.ascontiguousarray(ids, dtype=np.int32)

    def _evaluated(self, ids: np.ndarray) -> None:
        self._tokens.extend(int(t) for t in ids)
        self.n_evaluated += int(ids.size)
        if self._on_eval is not None:
            self._on_eval(int(ids.size))

    def _eval(self, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        if not self._images:
            return self._w.eval(ids, all_logits)
        start, n = len(self._tokens), ids.size
        rows, embd = [], []
        for sp in self._images:
            lo, hi = max(sp.start, start), min(sp.end, start + n)
            if lo < hi:
                rows.append(np.arange(lo - start, hi - start, dtype=np.int64))
                embd.append(sp.image.embeddings[lo - sp.start : hi - sp.start])
        hidden = self._model.config["hidden_size"]
        return _core.eval_multimodal(
            self._w,
            ids,
            np.ascontiguousarray(np.concatenate(embd) if embd else np.zeros((0, hidden)), dtype=np.float32),
            np.concatenate(rows) if rows else np.zeros(0, np.int64),
            mrope_positions(self._images, start, n),
            all_logits,
        )

    def save(self, path: str | os.PathLike[str]) -> _state.IoStats:
        """Write the window's whole state (every layer's state and the token ids) to ``path``, atomically.

        The file (docs/formats.md) is tied to the model by a fingerprint; :meth:`load` restores it exactly, so
        evaluating after a load gives the logits evaluation would have given without saving, bit for bit.
        Returns the bytes written and the time taken (fsync included). Raises :class:`regolith.SessionError`
        for a window holding images (their positions are not part of the format).
        """
        if self._images:
            raise SessionError("a window holding images cannot be saved: state files hold text prompts only")
        return _state.save_window(self, path)

    def load(self, path: str | os.PathLike[str]) -> _state.IoStats:
        """Replace the window's state with the one :meth:`save` wrote to ``path``; returns the bytes read and
        the time taken.

        Raises :class:`regolith.SessionError` for a file that is not a state file, of another format version
        or model, too long for this window (the window is then unchanged), truncated or corrupt (the window is
        then reset).
        """
        head = _state.read_header(path)
        _state.check_model(self, head, path)
        self._end = None
        if head.start == 0:
            self.reset()
        stats, _ = _state.load_window(self, path, header=head)
        return stats


def eval_windows(
    windows: Sequence[Window], tokens: Sequence[Sequence[int]], all_logits: Sequence[bool]
) -> list[np.ndarray]:
    """Evaluate ``tokens[i]`` on ``windows[i]`` for every i in one forward pass over all of them: every weight
    (and every streamed expert some window routes to) is read once for the step. Returns each window's logits
    as :meth:`Window.eval` with ``all_logits[i]`` would, bit for bit; a step may mix prompt chunks with single
    decode tokens. The windows must be distinct windows of one model, without images.

    Raises ValueError (bad ids, a window listed twice, windows of different models, images) or
    :class:`regolith.ContextOverflowError` with every window unchanged; if evaluation itself fails, every
    window of the step is reset.
    """
    if not len(windows) == len(tokens) == len(all_logits):
        raise ValueError("eval_windows: windows, tokens and all_logits must have the same length")
    if len({id(w) for w in windows}) != len(windows):
        raise ValueError("eval_windows: a window is listed twice")
    if any(w._images for w in windows):
        raise ValueError("eval_windows: windows holding images are evaluated alone (Window.eval)")
    ids = [w._checked(t) for w, t in zip(windows, tokens, strict=True)]
    try:
        out = _core.eval_windows([w._w for w in windows], ids, [bool(a) for a in all_logits])
    except BaseException:
        for w in windows:
            w._keep_held()
        raise
    for w, i in zip(windows, ids, strict=True):
        w._evaluated(i)
    return out
