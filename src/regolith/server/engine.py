"""One model, one generation at a time: requests wait in a FIFO queue and a worker thread runs them.

The asyncio side submits a :class:`Job` and iterates its text pieces; the worker thread drives the
:class:`regolith.Generation` and hands each piece to the event loop, so the loop never waits on the model.
Cancelling a job (the client went away) ends its generation at the next piece, or skips it if still queued.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from .api_error import APIError
from .metrics import Metrics

if TYPE_CHECKING:
    from ..generation import Generation, TokenGuide
    from ..model import Model

__all__ = ["Engine", "Job"]

log = logging.getLogger("regolith.server")


class Job:
    """A generation request: ``prompt`` token ids and :meth:`regolith.Model.start` keywords.

    Iterate :meth:`pieces` (on the event loop) for the text; afterwards :attr:`generation` holds the finished
    :class:`regolith.Generation`. ``deadline`` is a ``time.monotonic()`` time after which the job fails with
    a timeout, queued or running.
    """

    def __init__(
        self,
        prompt: Sequence[int],
        options: dict[str, Any],
        *,
        guide: TokenGuide | None,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
    ):
        self.prompt = list(prompt)
        self.options = options
        self.guide = guide
        self.deadline = deadline
        self.generation: Generation | None = None
        self._loop = loop
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = threading.Event()

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
        """Run the generation in the calling (worker) thread, sending its pieces to the event loop."""
        if self._stop_now():
            self._send("end")
            return
        gen = None
        try:
            gen = model.start(self.prompt, guide=self.guide, **self.options)
            self.generation = gen
            for piece in gen:
                self._send("piece", piece)
                if self._stop_now():
                    break
            gen.close()
            self._send("end")
        except Exception as e:  # reported to the client; the worker goes on with the next job
            if gen is not None:
                gen.close()
            log.exception("generation failed")
            self._send("error", e)

    async def pieces(self) -> AsyncIterator[str]:
        """The text pieces as they come. Raises :class:`APIError`: 504 when the deadline passes, 500 when the
        generation failed (the worker has logged why)."""
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
                if self.generation is None or (
                    self.generation.finish_reason == "cancelled" and not self.cancelled
                ):
                    raise APIError(504, "the request timed out (see --timeout)", kind="timeout")
                return


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
        prompt: Sequence[int],
        options: dict[str, Any],
        *,
        guide: TokenGuide | None = None,
        timeout: float,
    ) -> Job:
        """Queue a generation; must be called on the event loop that will read the job's pieces."""
        job = Job(
            prompt,
            options,
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
            if job.generation is not None:
                self.metrics.record_generation(job.generation)
