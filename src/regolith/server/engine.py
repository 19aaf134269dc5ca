"""One model, one generation at a time: requests wait in a FIFO queue and a worker thread runs them.

The asyncio side submits a :class:`Job` and iterates its pieces; the worker thread drives the job's
:class:`regolith.Generation` s (one per choice: ``n`` per prompt, one prompt after another, each prompt's
evaluated once) and hands each piece to the event loop, so the loop never waits on the model. Cancelling a
job (the client went away) ends its generation at the next piece, or skips it if still queued.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..generation import SharedPrompt
from .api_error import APIError
from .metrics import Metrics

if TYPE_CHECKING:
    from ..generation import Generation, TokenGuide
    from ..logprobs import TokenLogprob
    from ..model import Model

__all__ = ["Engine", "Job", "Piece", "choice_seed"]

log = logging.getLogger("regolith.server")


def choice_seed(seed: int, choice: int) -> int:
    """The seed of choice ``choice`` (0-based) of a request seeded with ``seed``: ``seed + choice`` modulo
    2**64, as vLLM seeds the n samples of a request."""
    return (seed + choice) % 2**64


@dataclass
class Piece:
    """Text of choice ``index`` as it comes, with the log-probabilities of the tokens whose text it completes
    (when the job's options ask for ``logprobs``). ``done`` marks the choice's last piece (its text may be
    empty; its ``logprobs`` are those of the tokens no earlier piece covered)."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    done: bool = False


class Job:
    """A generation request: ``prompts`` (lists of token ids), ``n`` choices for each, and
    :meth:`regolith.Model.start` keywords (a ``seed`` seeds choice ``j`` of each prompt with
    :func:`choice_seed`). Choice ``p * n + j`` is the ``j``-th of prompt ``p``.

    Iterate :meth:`events` (or :meth:`pieces` for the text of a single choice) on the event loop; afterwards
    :attr:`generations` holds the finished :class:`regolith.Generation` s by choice. ``deadline`` is a
    ``time.monotonic()`` time after which the job fails with a timeout, queued or running.
    """

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        options: dict[str, Any],
        *,
        n: int = 1,
        guide: TokenGuide | None,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
    ):
        self.prompts = [list(p) for p in prompts]
        self.n = n
        self.options = options
        self.guide = guide
        self.deadline = deadline
        self.generations: list[Generation] = []
        self._loop = loop
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = threading.Event()

    @property
    def generation(self) -> Generation | None:
        """The first choice's generation, once started."""
        return self.generations[0] if self.generations else None

    def cancel(self) -> None:
        """Stop the generation at its next piece (or never start it). Safe from any thread."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _send(self, kind: str, value: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed: nobody is listening
            self.cancel()

    def _stop_now(self) -> bool:
        return self._cancelled.is_set() or time.monotonic() > self.deadline

    def run(self, model: Model) -> None:
        """Run the generations in the calling (worker) thread, sending their pieces to the event loop."""
        gen = None
        try:
            for p, prompt in enumerate(self.prompts):
                shared = SharedPrompt() if self.n > 1 else None
                for j in range(self.n):
                    if self._stop_now():
                        self._send("end")
                        return
                    options = self.options
                    if j > 0 and options.get("seed") is not None:
                        options = {**options, "seed": choice_seed(options["seed"], j)}
                    gen = model.start(prompt, guide=self.guide, shared=shared, **options)
                    self.generations.append(gen)
                    self._run_choice(gen, p * self.n + j)
                    gen = None
            self._send("end")
        except Exception as e:  # reported to the client; the worker goes on with the next job
            if gen is not None:
                gen.close()
            log.exception("generation failed")
            self._send("error", e)

    def _run_choice(self, gen: Generation, index: int) -> None:
        sent = 0  # tokens whose log-probabilities have been sent
        for text in gen:
            logprobs = []
            if gen.logprobs is not None:
                logprobs, sent = gen.logprobs[sent : gen.released_tokens], max(sent, gen.released_tokens)
            self._send("piece", Piece(index, text, logprobs))
            if self._stop_now():
                break
        gen.close()
        self._send("piece", Piece(index, "", gen.logprobs[sent:] if gen.logprobs is not None else [], True))

    async def events(self) -> AsyncIterator[Piece]:
        """The pieces of every choice as they come, choice after choice. Raises :class:`APIError`: 504 when
        the deadline passes, 500 when a generation failed (the worker has logged why)."""
        while True:
            remaining = self.deadline - time.monotonic()
            try:
                kind, value = await asyncio.wait_for(self._events.get(), max(remaining, 0.0))
            except asyncio.TimeoutError:
                self.cancel()
                raise APIError(504, "the request timed out (see --timeout)", kind="timeout") from None
            if kind == "piece":
                yield value
            elif kind == "error":
                message = f"generation failed: {type(value).__name__}: {value}"
                raise APIError(500, message, kind="server") from value
            else:
                unfinished = len(self.generations) < len(self.prompts) * self.n or any(
                    g.finish_reason == "cancelled" for g in self.generations
                )
                if unfinished and not self.cancelled:
                    raise APIError(504, "the request timed out (see --timeout)", kind="timeout")
                return

    async def pieces(self) -> AsyncIterator[str]:
        """The text pieces of a single-choice job as they come; raises as :meth:`events` does."""
        async for piece in self.events():
            if piece.text:
                yield piece.text


class Engine:
    """Runs :class:`Job` s on ``model`` one at a time, first come first served, in a worker thread.

    At most ``max_queue`` jobs wait; :meth:`submit` raises :class:`APIError` (503) beyond that.
    """

    def __init__(self, model: Model, metrics: Metrics, *, max_queue: int = 64):
        self.model = model
        self.metrics = metrics
        self.max_queue = max_queue
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._running: Job | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="regolith-generation", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Cancel the running job and stop the worker once queued jobs are skipped or done."""
        if self._thread is None:
            return
        with self._queue.mutex:
            for job in self._queue.queue:
                if job is not None:
                    job.cancel()
        with self._lock:
            if self._running is not None:
                self._running.cancel()
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for the model (the running one not included)."""
        return self._waiting

    @property
    def busy(self) -> bool:
        """Whether a generation is running."""
        return self._running is not None

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        options: dict[str, Any],
        *,
        n: int = 1,
        guide: TokenGuide | None = None,
        timeout: float,
    ) -> Job:
        """Queue the generations of a :class:`Job`; must be called on the event loop that will read its
        pieces."""
        job = Job(
            prompts,
            options,
            n=n,
            guide=guide,
            deadline=time.monotonic() + timeout,
            loop=asyncio.get_running_loop(),
        )
        with self._lock:
            if self._waiting >= self.max_queue:
                raise APIError(
                    503, f"the server is busy: {self._waiting} requests are waiting", kind="overloaded"
                )
            self._waiting += 1
        self._queue.put(job)
        return job

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._running = job
            try:
                job.run(self.model)
            finally:
                with self._lock:
                    self._running = None
            for gen in job.generations:
                self.metrics.record_generation(gen)
