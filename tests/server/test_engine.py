"""The engine on a scripted stand-in model (no weights): first come first served, one generation at a time,
cancellation of running and queued jobs, the queue limit, timeouts and failures that leave the worker alive."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from regolith.server.api_error import APIError
from regolith.server.engine import Engine, Job, Outbox, Piece
from regolith.server.metrics import Metrics


class _Stats:
    def __init__(self, n_prompt: int):
        self.prompt_tokens, self.cached_tokens, self.generated_tokens = n_prompt, 0, 0
        self.prefill_seconds = self.decode_seconds = 0.001
        self.prefill_tokens_per_second = self.decode_tokens_per_second = 1.0
        self.decode_rounds = self.drafted_tokens = self.accepted_tokens = 0


class FakeGeneration:
    """Yields ``max_tokens`` pieces 'p0', 'p1'..., sleeping ``delay`` seconds per piece; ``close`` cancels."""

    def __init__(self, model, prompt, max_tokens, delay):
        self.model, self.prompt, self.tokens = model, prompt, []
        self.finish_reason = None
        self.logprobs = None
        self.stats = _Stats(len(prompt))
        self._steps = self._run(max_tokens, delay)

    def _run(self, max_tokens, delay):
        with self.model.lock:
            assert not self.model.running, "two generations ran at once"
            self.model.running = True
        try:
            for i in range(max_tokens):
                time.sleep(delay)
                if self.model.fail_at == i:
                    raise RuntimeError("the model broke")
                self.tokens.append(i)
                self.stats.generated_tokens += 1
                yield f"p{i}"
            self.finish_reason = "length"
        finally:
            self.model.running = False

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._steps)

    def close(self):
        self._steps.close()
        if self.finish_reason is None:
            self.finish_reason = "cancelled"


class FakeWindow:
    stepped = False  # FakeGeneration never evaluates through the engine's scheduler

    def __init__(self):
        self.tokens: list[int] = []
        self.stepper = None


class FakeModel:
    def window(self):
        return FakeWindow()

    scr = False  # Model.scr and Model.speculative, which the engine reads
    speculative = False

    def __init__(self, delay=0.0):
        self.delay, self.fail_at, self.running = delay, None, False
        self.lock = threading.Lock()
        self.started: list[list[int]] = []
        self.options: list[dict] = []

    def start(self, prompt, *, guide=None, max_tokens, window=None, **options):
        self.started.append(list(prompt))
        self.options.append(options)
        return FakeGeneration(self, prompt, max_tokens, self.delay)


def _run(coro):
    return asyncio.run(coro)


async def _text(job):
    return "".join([p async for p in job.pieces()])


def test_jobs_run_one_at_a_time_in_arrival_order():
    model = FakeModel(delay=0.002)
    engine = Engine(model, Metrics())
    engine.start()

    async def main():
        jobs = [engine.submit([[i]], {"max_tokens": 3}, timeout=10) for i in range(8)]
        assert engine.queue_depth >= 6
        return await asyncio.gather(*(_text(j) for j in jobs)), jobs

    try:
        texts, jobs = _run(main())
    finally:
        engine.stop()
    assert texts == ["p0p1p2"] * 8
    assert model.started == [[i] for i in range(8)]
    assert all(j.generation.finish_reason == "length" for j in jobs)
    assert engine.metrics.generations["length"] == 8 and engine.metrics.generated_tokens == 24


def test_choices_of_each_prompt_one_after_another_with_derived_seeds():
    model = FakeModel()
    engine = Engine(model, Metrics())
    engine.start()

    async def main():
        job = engine.submit([[1], [2]], {"max_tokens": 2, "seed": 2**64 - 1}, n=2, timeout=10)
        return [(p.index, p.text, p.done) async for p in job.events()], job

    try:
        events, job = _run(main())
    finally:
        engine.stop()
    assert events == [(i, t, d) for i in range(4) for t, d in (("p0", False), ("p1", False), ("", True))]
    assert model.started == [[1], [1], [2], [2]]
    assert [o["seed"] for o in model.options] == [2**64 - 1, 0, 2**64 - 1, 0]  # seed + choice, mod 2**64
    shared = [o["shared"] for o in model.options]
    assert shared[0] is shared[1] and shared[2] is shared[3] and shared[0] is not shared[2]
    assert len(job.generations) == 4 and engine.metrics.generated_tokens == 8


def test_cancel_stops_the_running_job_and_skips_a_queued_one():
    model = FakeModel(delay=0.01)
    engine = Engine(model, Metrics())
    engine.start()

    async def main():
        running = engine.submit([[1]], {"max_tokens": 1000}, timeout=10)
        queued = engine.submit([[2]], {"max_tokens": 5}, timeout=10)
        after = engine.submit([[3]], {"max_tokens": 2}, timeout=10)
        queued.cancel()
        pieces = running.pieces()
        assert await pieces.__anext__() == "p0"
        t0 = time.monotonic()
        running.cancel()
        rest = [p async for p in pieces]
        assert await _text(after) == "p0p1"
        return rest, time.monotonic() - t0, running

    try:
        rest, elapsed, running = _run(main())
    finally:
        engine.stop()
    assert len(rest) <= 2 and elapsed < 1.0  # stopped at the next piece, not after 1000
    assert running.generation.finish_reason == "cancelled"
    assert model.started == [[1], [3]]  # the cancelled queued job never ran


def test_queue_limit_timeout_and_failures():
    model = FakeModel(delay=0.02)
    engine = Engine(model, Metrics(), max_queue=2)
    engine.start()

    async def main():
        slow = engine.submit([[1]], {"max_tokens": 100}, timeout=0.2)  # runs: the worker takes it at once
        await asyncio.sleep(0.05)
        waiting = [engine.submit([[i]], {"max_tokens": 1}, timeout=10) for i in (2, 3)]
        with pytest.raises(APIError) as full:
            engine.submit([[4]], {"max_tokens": 1}, timeout=10)
        assert full.value.status == 503 and full.value.kind == "overloaded"
        with pytest.raises(APIError) as late:
            await _text(slow)
        assert late.value.status == 504
        assert [await _text(j) for j in waiting] == ["p0", "p0"]
        model.fail_at = 1
        broken = engine.submit([[5]], {"max_tokens": 3}, timeout=10)
        with pytest.raises(APIError, match="RuntimeError: the model broke") as failed:
            await _text(broken)
        assert failed.value.status == 500
        model.fail_at = None
        return await _text(engine.submit([[6]], {"max_tokens": 2}, timeout=10))

    try:
        assert _run(main()) == "p0p1"  # the worker survived the failure
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        (
            "/v1/chat/completions",
            503,
            {"error": {"message": "busy", "type": "server_error", "param": None, "code": None}},
        ),
        ("/v1/messages", 529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
    ],
)
def test_a_full_queue_in_each_api_schema(path, status, body):
    pytest.importorskip("fastapi")
    from regolith.server.app import error_response

    response = error_response(APIError(503, "busy", kind="overloaded"), path)
    assert response.status_code == status and json.loads(response.body) == body


def test_the_outbox_holds_pieces_for_the_next_step_in_order():
    """Mid-generation pieces of a job whose window steps wait in the outbox until a flush (the scheduler's, as
    a step starts); the last piece, the end and a job evaluating alone go at once, after what was held; every
    job's events reach its loop in the order they were sent, from any thread."""
    loop = asyncio.new_event_loop()

    def delivered(job: Job) -> list[tuple[str, object]]:
        loop.run_until_complete(asyncio.sleep(0))
        out = []
        while not job._events.empty():
            out.append(job._events.get_nowait())
        return out

    try:
        outbox = Outbox()
        stepped, alone = FakeWindow(), FakeWindow()
        stepped.stepped = True
        a, b, c = (Job([[1]], {}, guide=None, deadline=time.monotonic() + 60, loop=loop) for _ in range(3))
        for job, window in ((a, stepped), (b, stepped), (c, alone)):
            job.outbox, job._window = outbox, window
        a._send("piece", Piece(0, "a0"))
        b._send("piece", Piece(0, "b0"))
        assert delivered(a) == [] and delivered(b) == []
        outbox.flush()
        assert [p.text for _, p in delivered(a)] == ["a0"] and [p.text for _, p in delivered(b)] == ["b0"]

        a._send("piece", Piece(0, "a1"))
        a._send("piece", Piece(0, "", done=True))
        a._send("end")
        assert [(k, getattr(v, "text", None)) for k, v in delivered(a)] == [
            ("piece", "a1"),
            ("piece", ""),
            ("end", None),
        ]
        b._send("piece", Piece(0, "b1"))
        c._send("piece", Piece(0, "c0"))  # c's window evaluates alone: no step will flush for it
        assert [p.text for _, p in delivered(c)] == ["c0"] and [p.text for _, p in delivered(b)] == ["b1"]

        def send(job: Job, tag: str) -> None:
            for i in range(200):
                job._send("piece", Piece(0, f"{tag}{i}"))
                if i % 7 == 0:
                    outbox.flush()

        threads = [threading.Thread(target=send, args=(job, tag)) for job, tag in ((a, "x"), (b, "y"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outbox.flush()
        assert [p.text for _, p in delivered(a)] == [f"x{i}" for i in range(200)]
        assert [p.text for _, p in delivered(b)] == [f"y{i}" for i in range(200)]
    finally:
        loop.close()
