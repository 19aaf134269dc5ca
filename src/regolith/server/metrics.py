"""Server counters, rendered in the Prometheus text exposition format (version 0.0.4) for ``GET /metrics``."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..generation import Generation
    from ..prompt_cache import CacheStats

__all__ = ["Histogram", "Metrics"]

# Bucket bounds (upper, inclusive) of the latency histograms in seconds, and of the step batch sizes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


def _labels(**labels: str) -> str:
    def escape(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


class Histogram:
    """Observations counted in cumulative buckets (Prometheus' histogram: ``le`` bounds, ``_sum``, ``_count``)."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def samples(self) -> list[tuple[str, str, float]]:
        """(name suffix, labels, value) of every line."""
        out, total = [], 0
        for bound, n in zip([*map(_number, self.bounds), "+Inf"], self.counts, strict=True):
            total += n
            out.append(("_bucket", _labels(le=bound), float(total)))
        return [*out, ("_sum", "", self.sum), ("_count", "", float(self.count))]


def _number(x: float) -> str:
    return f"{x:g}"


class Metrics:
    """Request and generation counters; safe to update from the worker and the event loop at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()  # (path, HTTP status) -> count
        self.generations: Counter[str] = Counter()  # finish reason -> count
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated_tokens = 0
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.decode_rounds = 0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.last_prefill_tps = 0.0
        self.last_decode_tps = 0.0
        self.steps = 0
        self.step_tokens = 0
        self.step_seconds = 0.0
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.queue_wait = Histogram(LATENCY_BUCKETS)
        self.first_token = Histogram(LATENCY_BUCKETS)
        self.token_gap = Histogram(LATENCY_BUCKETS)

    def record_step(self, sequences: int, tokens: int, seconds: float) -> None:
        """Count a batched model step over ``sequences`` sequences evaluating ``tokens`` tokens."""
        with self._lock:
            self.steps += 1
            self.step_tokens += tokens
            self.step_seconds += seconds
            self.batch_size.observe(sequences)

    def record_queue_wait(self, seconds: float) -> None:
        """A request waited ``seconds`` in the queue before a worker took it."""
        with self._lock:
            self.queue_wait.observe(seconds)

    def record_first_token(self, seconds: float) -> None:
        """A request's first generated token came ``seconds`` after it was submitted."""
        with self._lock:
            self.first_token.observe(seconds)

    def record_token_gap(self, seconds: float) -> None:
        """A generated token came ``seconds`` after the one before it."""
        with self._lock:
            self.token_gap.observe(seconds)

    def record_request(self, path: str, status: int) -> None:
        """Count an answered HTTP request."""
        with self._lock:
            self.requests[(path, status)] += 1

    def record_generation(self, gen: Generation) -> None:
        """Add a finished (or cancelled) generation's tokens and timings."""
        st = gen.stats
        with self._lock:
            self.generations[gen.finish_reason or "cancelled"] += 1
            self.prompt_tokens += st.prompt_tokens
            self.cached_tokens += st.cached_tokens
            self.generated_tokens += st.generated_tokens
            self.prefill_seconds += st.prefill_seconds
            self.decode_seconds += st.decode_seconds
            self.decode_rounds += st.decode_rounds
            self.drafted_tokens += st.drafted_tokens
            self.accepted_tokens += st.accepted_tokens
            if st.prompt_tokens > st.cached_tokens and st.prefill_seconds > 0:
                self.last_prefill_tps = st.prefill_tokens_per_second
            if st.generated_tokens and st.decode_seconds > 0:
                self.last_decode_tps = st.decode_tokens_per_second

    def render(
        self,
        *,
        queue_depth: int,
        busy: bool,
        running: int = 0,
        cache: CacheStats | None = None,
        experts: dict[str, Any] | None = None,
    ) -> str:
        """The metrics as Prometheus text (``running``: the requests being generated; ``cache``: the prompt
        cache's counters, when there is one; ``experts``: :meth:`regolith.Model.stats` of a model streaming
        its experts)."""
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP regolith_{name} {help_}")
            out.append(f"# TYPE regolith_{name} {kind}")
            out.extend(f"regolith_{name}{labels} {value:g}" for labels, value in samples)

        with self._lock:
            requests = sorted(self.requests.items())
            metric(
                "requests_total",
                "counter",
                "HTTP requests answered, by path and status.",
                [(_labels(path=p, status=str(s)), n) for (p, s), n in requests],
            )
            metric(
                "generations_total",
                "counter",
                "Generations run, by finish reason (stop, length, cancelled).",
                [(_labels(finish_reason=r), n) for r, n in sorted(self.generations.items())],
            )
            metric(
                "prompt_tokens_total",
                "counter",
                "Prompt tokens of all generations.",
                [("", self.prompt_tokens)],
            )
            metric(
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from the context instead of evaluated (prefix reuse).",
                [("", self.cached_tokens)],
            )
            metric("generated_tokens_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
            metric(
                "prefill_seconds_total",
                "counter",
                "Seconds spent evaluating prompts.",
                [("", self.prefill_seconds)],
            )
            metric(
                "decode_seconds_total",
                "counter",
                "Seconds spent generating tokens.",
                [("", self.decode_seconds)],
            )
            metric(
                "decode_rounds_total",
                "counter",
                "Model evaluations while generating (generated_tokens_total / this = tokens per round).",
                [("", self.decode_rounds)],
            )
            metric(
                "draft_tokens_total",
                "counter",
                "Speculative draft tokens verified.",
                [("", self.drafted_tokens)],
            )
            metric(
                "draft_tokens_accepted_total",
                "counter",
                "Speculative draft tokens accepted.",
                [("", self.accepted_tokens)],
            )
            metric(
                "prefill_tokens_per_second",
                "gauge",
                "Prompt evaluation speed of the latest generation that evaluated prompt tokens.",
                [("", self.last_prefill_tps)],
            )
            metric(
                "decode_tokens_per_second",
                "gauge",
                "Generation speed of the latest generation.",
                [("", self.last_decode_tps)],
            )
            metric("steps_total", "counter", "Batched model steps run.", [("", self.steps)])
            metric(
                "step_tokens_total",
                "counter",
                "Tokens the batched steps evaluated (prompt pieces and generated tokens of every sequence).",
                [("", self.step_tokens)],
            )
            metric(
                "step_seconds_total", "counter", "Seconds spent in batched steps.", [("", self.step_seconds)]
            )
            for name, help_, h in (
                ("batch_size", "Sequences per batched model step.", self.batch_size),
                (
                    "queue_wait_seconds",
                    "Time requests waited in the queue for a free sequence slot.",
                    self.queue_wait,
                ),
                (
                    "time_to_first_token_seconds",
                    "Time from a request's arrival to its first generated token.",
                    self.first_token,
                ),
                (
                    "inter_token_latency_seconds",
                    "Time between consecutive generated tokens of a request.",
                    self.token_gap,
                ),
            ):
                out.append(f"# HELP regolith_{name} {help_}")
                out.append(f"# TYPE regolith_{name} histogram")
                out.extend(
                    f"regolith_{name}{suffix}{labels} {value:g}" for suffix, labels, value in h.samples()
                )
        if cache is not None:
            metric(
                "prompt_cache_hits_total",
                "counter",
                "Prompts that restored state from the prompt cache.",
                [("", cache.hits)],
            )
            metric(
                "prompt_cache_misses_total",
                "counter",
                "Prompts the prompt cache had nothing for.",
                [("", cache.misses)],
            )
            metric(
                "prompt_cache_tokens_saved_total",
                "counter",
                "Prompt tokens restored from the prompt cache instead of evaluated.",
                [("", cache.tokens_saved)],
            )
            metric(
                "prompt_cache_entries", "gauge", "States stored in the prompt cache.", [("", cache.entries)]
            )
            metric(
                "prompt_cache_bytes", "gauge", "Bytes the prompt cache holds on disk.", [("", cache.bytes)]
            )
        if experts is not None and "bytes_read" in experts:
            metric(
                "expert_hits_total", "counter", "Expert uses the arena held already.", [("", experts["hits"])]
            )
            metric("expert_misses_total", "counter", "Expert uses read from disk.", [("", experts["misses"])])
            metric(
                "expert_bytes_read_total",
                "counter",
                "Bytes of expert records read from disk.",
                [("", experts["bytes_read"])],
            )
        metric("queue_depth", "gauge", "Requests waiting for the model.", [("", queue_depth)])
        metric("busy", "gauge", "1 while a generation runs.", [("", int(busy))])
        metric(
            "running_requests", "gauge", "Requests being generated now (at most --parallel).", [("", running)]
        )
        return "\n".join(out) + "\n"
