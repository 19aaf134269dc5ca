"""Up to ``parallel`` requests at once, batched: requests wait in a FIFO queue and worker threads run them.

The asyncio side submits a :class:`Job` and iterates its pieces; a worker thread takes the job with a window
of its own and drives the job's :class:`regolith.Generation` s (one per choice: ``n`` per prompt, one prompt
after another, each prompt's evaluated once), handing each piece to the event loop, so the loop never waits
on the model. The windows' evaluations meet in the :class:`StepScheduler`, which runs them as batched steps
(continuous batching: a request joins at the next step, its prompt prefilled in pieces beside the others'
decode tokens); each request's output is what it would be served alone. Cancelling a job (the client went
away) ends its generation at the next piece, or skips it if still queued; the others go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..generation import SharedPrompt, _common_prefix
from ..scr import plan_reuse, reused_tokens
from ..speculative import CostGate, speculation
from .api_error import APIError
from .metrics import Metrics
from .scheduler import STEP_TOKENS, StepScheduler

if TYPE_CHECKING:
    from ..generation import Generation, TokenGuide
    from ..logprobs import TokenLogprob
    from ..model import Model
    from ..window import Window

__all__ = ["Engine", "Job", "Outbox", "Piece", "choice_seed"]

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


class Outbox:
    """Jobs' events from the worker threads, handed to their event loops in batches: at each :meth:`flush`, in
    one ``call_soon_threadsafe`` per loop, in the order they were put.

    The engine flushes as each batched step starts, so while the workers of a step's sequences sample their
    next tokens (each holding the GIL in turn, the scheduler waiting for the last of them) the event loop does
    not wake to stream the pieces between them: it streams them while the step runs, whose evaluation releases
    the GIL. On a GPU, where a step of eight sequences of the demo model takes 2.6 ms, the workers' turns and
    the loop's were 2 ms between steps.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[Job, str, Any]] = []

    def put(self, job: Job, kind: str, value: Any, *, flush: bool = False) -> None:
        """Hold ``job``'s event (``flush``: then hand over every held event)."""
        with self._lock:
            self._items.append((job, kind, value))
            if flush:
                self._flush_locked()

    def flush(self) -> None:
        """Hand every held event to its job's event loop."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        # Under the lock, so that two flushes cannot reach a loop out of order.
        items, self._items = self._items, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, str, Any]]] = {}
        for item in items:
            by_loop.setdefault(item[0]._loop, []).append(item)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the event loop has closed: nobody is listening
                for job, _, _ in batch:
                    job.cancel()


def _deliver(batch: list[tuple[Job, str, Any]]) -> None:
    for job, kind, value in batch:
        job._events.put_nowait((kind, value))


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
        self.submitted = time.monotonic()
        self._loop = loop
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.outbox: Outbox | None = None  # where its events go (None: straight to the event loop)
        self._window: Window | None = None  # the window it runs on

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
        if self.outbox is not None:
            # A piece in mid-generation waits for the next step, which the generation asks for next when its
            # window's evaluations go through the scheduler; the last piece, the end and errors go at once.
            held = kind == "piece" and not value.done and self._window is not None and self._window.stepped
            self.outbox.put(self, kind, value, flush=not held)
            return
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed: nobody is listening
            self.cancel()

    def _stop_now(self) -> bool:
        return self._cancelled.is_set() or time.monotonic() > self.deadline

    def run(
        self, model: Model, window: Window | None = None, metrics: Metrics | None = None, **overrides: Any
    ) -> None:
        """Run the generations in the calling (worker) thread on ``window`` (None: the model's own), sending
        their pieces to the event loop; ``overrides`` replace options (the engine's for batched sequences:
        suffix drafting alone, with a cost gate per worker); ``metrics`` records the time to first token and
        between tokens."""
        gen = None
        self._window = window
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
                    if window is not None:
                        options = {**options, "window": window}
                    gen = model.start(prompt, guide=self.guide, shared=shared, **options, **overrides)
                    self.generations.append(gen)
                    self._run_choice(gen, p * self.n + j, metrics)
                    gen = None
            self._send("end")
        except Exception as e:  # reported to the client; the worker goes on with the next job
            if gen is not None:
                gen.close()
            log.exception("generation failed")
            self._send("error", e)

    def _run_choice(self, gen: Generation, index: int, metrics: Metrics | None) -> None:
        sent = 0  # tokens whose log-probabilities have been sent
        last, n_tokens = self.submitted, 0  # the time the latest token was seen, and the tokens seen then
        for text in gen:
            if metrics is not None and len(gen.tokens) > n_tokens:
                now = time.monotonic()
                if n_tokens == 0 and index == 0:
                    metrics.record_first_token(now - self.submitted)
                elif n_tokens:
                    metrics.record_token_gap((now - last) / (len(gen.tokens) - n_tokens))
                last, n_tokens = now, len(gen.tokens)
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
    """Runs :class:`Job` s on ``model``, first come first served, up to ``parallel`` at once on windows of their
    own (each keeping the prefix of its last prompt), their evaluations batched by a :class:`StepScheduler`
    (``step_tokens``). With ``parallel`` > 1, speculation drafts by the suffix drafter alone (the MTP head's
    own evaluations are not batched) and a verification is one more window's tokens in a step.

    At most ``max_queue`` jobs wait; :meth:`submit` raises :class:`APIError` (503) beyond that.
    """

    def __init__(
        self,
        model: Model,
        metrics: Metrics,
        *,
        max_queue: int = 64,
        parallel: int = 1,
        step_tokens: int = STEP_TOKENS,
    ):
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}")
        self.model = model
        self.metrics = metrics
        self.max_queue = max_queue
        self.parallel = parallel
        self.outbox = Outbox()
        self.scheduler = StepScheduler(
            step_tokens=step_tokens, on_step=metrics.record_step, before_step=self.outbox.flush
        )
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._running: set[Job] = set()
        self._idle: list[Window] = []  # windows no job holds
        self._n_windows = 0
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the step scheduler and the worker threads."""
        if self._threads:
            return
        self.scheduler.start()
        for i in range(self.parallel):
            t = threading.Thread(target=self._work, name=f"regolith-generation-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Cancel the running jobs and stop the workers once queued jobs are skipped or done."""
        if not self._threads:
            return
        with self._queue.mutex:
            for job in self._queue.queue:
                if job is not None:
                    job.cancel()
        with self._lock:
            for job in self._running:
                job.cancel()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        self._threads = []
        self.scheduler.stop()

    @property
    def alive(self) -> bool:
        """Whether the workers are running (started, not stopped, none ended by an error)."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for the model (the running ones not included)."""
        return self._waiting

    @property
    def running(self) -> int:
        """Jobs running now."""
        return len(self._running)

    @property
    def busy(self) -> bool:
        """Whether a generation is running."""
        return bool(self._running)

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
        job.outbox = self.outbox
        with self._lock:
            if self._waiting >= self.max_queue:
                raise APIError(
                    503, f"the server is busy: {self._waiting} requests are waiting", kind="overloaded"
                )
            self._waiting += 1
        self._queue.put(job)
        return job

    def _window_for(self, prompt: Sequence[int]) -> Window:
        """The idle window that reuses most of ``prompt`` (a new one while fewer than ``parallel`` exist and none
        reuses any of it): the longest prefix it holds, or with suffix cache reuse (``Model.scr``) every run
        of its tokens that prefill would move (:func:`regolith.scr.plan_reuse`)."""

        def reused(w: Window) -> int:
            prefix = _common_prefix(w.tokens, prompt)
            if not (self.model.scr and w.can_move and w.n_past and prompt):
                return prefix
            # prefill's own plan, of the prompt before its last token
            return max(prefix, reused_tokens(plan_reuse(w.tokens, prompt[:-1])))

        with self._lock:
            scores = [(reused(w), w) for w in self._idle]
            best_score, best = max(scores, key=lambda sw: sw[0], default=(0, None))
            if best is None or (best_score == 0 and self._n_windows < self.parallel):
                self._n_windows += 1
                window = self.model.window()
                window.stepper = self.scheduler
                return window
            self._idle.remove(best)
            return best

    def _batched_speculation(self) -> dict[str, Any]:
        """Options a worker's generations take when sequences are batched (``parallel`` > 1): the model's
        speculation with its suffix drafter alone (the MTP head's own evaluations are not batched), taught to a
        cost gate of the worker's own (a verification's cost is measured in the steps it shares, which the
        model's gate, learned alone, does not know)."""
        spec = speculation(self.model.speculative)
        if spec is None or "suffix" not in spec.drafters:
            return {"speculative": False}
        return {
            "speculative": dataclasses.replace(spec, drafters=("suffix",)),
            "gate": CostGate(self.model.spec_gate.stall_clock),
        }

    def _work(self) -> None:
        overrides = {} if self.parallel == 1 else self._batched_speculation()
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._running.add(job)
            window = self._window_for(job.prompts[0] if job.prompts else [])
            self.scheduler.enter()
            try:
                self.metrics.record_queue_wait(time.monotonic() - job.submitted)
                job.run(self.model, window, self.metrics, **overrides)
            finally:
                self.scheduler.leave()
                with self._lock:
                    self._running.discard(job)
                    self._idle.append(window)
            for gen in job.generations:
                self.metrics.record_generation(gen)
