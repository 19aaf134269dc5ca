"""Continuous batching: the evaluations of every sequence the server runs, gathered into steps over several
windows (:func:`regolith.window.eval_windows`).

Each running request drives its own :class:`regolith.Generation` on its own window in its own worker thread;
the window's :attr:`regolith.Window.stepper` is the :class:`StepScheduler`, so each model evaluation the
generation asks for waits here until a step carries it. The scheduler's thread runs a step as soon as every
active sequence is waiting (or after ``linger`` seconds with some waiting): decode tokens of all of them, plus
prompt chunks within ``step_tokens``, in one forward pass, so each weight and each streamed expert is read once
for the whole batch. A long prompt is cut into pieces of whole multiples of 64 tokens (the Gated DeltaNet scan's
chunk, so the pieces compute exactly what the whole call would) and advances one piece per step beside the
others' decode tokens. Every sequence's logits are those of evaluating it alone, bit for bit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..window import eval_windows

if TYPE_CHECKING:
    from ..window import Window

__all__ = ["STEP_TOKENS", "StepScheduler"]

# Tokens one step evaluates at most (decode tokens always go; prompt pieces share the rest): a step of a
# 256-token prompt piece is near the GEMM path's full speed and keeps the others' inter-token latency bounded.
STEP_TOKENS = 256
# A prompt piece is a multiple of this many tokens (the Gated DeltaNet chunk: pieces then scan exactly as the
# whole call would).
PIECE_ALIGN = 64


@dataclass
class _Request:
    window: Window
    ids: np.ndarray
    all_logits: bool
    done_tokens: int = 0
    logits: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def left(self) -> int:
        return int(self.ids.size) - self.done_tokens


def _piece(left: int, budget: int, *, progress: bool = False) -> int:
    """Tokens of a prompt with ``left`` to go that the next step takes with ``budget`` to spare: all of it when
    it fits, else whole multiples of PIECE_ALIGN that leave more than one token (a lone last token would take
    the recurrent path where the whole call took the chunked scan); 0 when nothing can go this step, unless
    ``progress`` asks for at least one piece (then PIECE_ALIGN tokens, or all of a prompt of PIECE_ALIGN + 1)."""
    if left <= budget:
        return left
    piece = budget // PIECE_ALIGN * PIECE_ALIGN
    if left - piece == 1:
        piece -= PIECE_ALIGN
    if piece <= 0 and progress:
        piece = PIECE_ALIGN if left - PIECE_ALIGN >= 2 else left
    return max(piece, 0)


class StepScheduler:
    """Gathers windows' evaluations into batched steps (the :class:`regolith.window.Stepper` of the server's
    windows). ``before_step()`` is called as each step starts (its sequences all waiting), ``on_step(sequences,
    tokens, seconds)`` once it has run."""

    def __init__(
        self,
        *,
        step_tokens: int = STEP_TOKENS,
        linger: float = 0.002,
        on_step: Callable[[int, int, float], None] | None = None,
        before_step: Callable[[], None] | None = None,
    ):
        if step_tokens < PIECE_ALIGN:
            raise ValueError(f"step_tokens must be at least {PIECE_ALIGN}, got {step_tokens}")
        self.step_tokens = step_tokens
        self.linger = linger
        self._on_step = on_step
        self._before_step = before_step
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._active = 0  # sequences running (each either waiting here or computing on the host)
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="regolith-steps", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the step thread; evaluations still waiting fail with RuntimeError."""
        if self._thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._thread = None

    def enter(self) -> None:
        """A sequence starts running (the scheduler waits for it before stepping, up to ``linger``)."""
        with self._cond:
            self._active += 1

    def leave(self) -> None:
        """A sequence has ended."""
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def eval(self, window: Window, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        """``window``'s logits for ``ids`` once steps have carried them (:func:`eval_windows` keeps the window's
        bookkeeping); raises what the step raised."""
        req = _Request(window, ids, all_logits)
        with self._cond:
            if self._stopping or self._thread is None:
                raise RuntimeError("the step scheduler is not running")
            self._pending.append(req)
            self._cond.notify_all()
        req.finished.wait()
        if req.error is not None:
            raise req.error
        return req.logits[0] if len(req.logits) == 1 else np.concatenate(req.logits)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    for req in self._pending:
                        req.error = RuntimeError("the server is stopping")
                        req.finished.set()
                    self._pending.clear()
                    return
                # Wait (briefly) for the sequences still computing on the host to ask for their next tokens.
                deadline = time.monotonic() + self.linger
                while len(self._pending) < self._active and not self._stopping:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch = self._take()
            if self._before_step is not None:
                self._before_step()
            self._run(batch)

    def _take(self) -> list[tuple[_Request, int]]:
        """The next step: every waiting decode (short) evaluation whole, then prompt pieces oldest first within
        the token budget (the oldest always gets a piece)."""
        short = [r for r in self._pending if r.left <= PIECE_ALIGN]
        long = [r for r in self._pending if r.left > PIECE_ALIGN]
        batch = [(r, r.left) for r in short]
        budget = self.step_tokens - sum(n for _, n in batch)
        for r in long:
            n = _piece(r.left, budget, progress=r is long[0])
            if n > 0:
                batch.append((r, n))
                budget -= n
        return batch

    def _run(self, batch: list[tuple[_Request, int]]) -> None:
        t0 = time.perf_counter()
        windows = [r.window for r, _ in batch]
        tokens = [r.ids[r.done_tokens : r.done_tokens + n] for r, n in batch]
        # A piece before the last needs logits only when every row's are wanted; the last row's come last.
        wants = [r.all_logits for r, _ in batch]
        error: BaseException | None = None
        try:
            out = eval_windows(windows, tokens, wants)
        except Exception as e:  # noqa: BLE001 - handed to every sequence of the step, which raises it
            error, out = e, []
        seconds = time.perf_counter() - t0
        with self._cond:
            for i, (r, n) in enumerate(batch):
                r.done_tokens += n
                if error is not None:
                    r.error = error
                elif r.all_logits or r.left == 0:
                    r.logits.append(out[i])
                if error is not None or r.left == 0:
                    self._pending.remove(r)
                    r.finished.set()
        if self._on_step is not None:
            self._on_step(len(batch), sum(n for _, n in batch), seconds)
