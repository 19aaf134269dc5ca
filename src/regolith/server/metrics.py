"""Server counters, rendered in the Prometheus text exposition format (version 0.0.4) for ``GET /metrics``."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..generation import Generation
    from ..prompt_cache import CacheStats

__all__ = ["Metrics"]


def _labels(**labels: str) -> str:
    def escape(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


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

    def render(self, *, queue_depth: int, busy: bool, cache: CacheStats | None = None) -> str:
        """The metrics as Prometheus text (``cache``: the prompt cache's counters, when there is one)."""
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
        metric("queue_depth", "gauge", "Requests waiting for the model.", [("", queue_depth)])
        metric("busy", "gauge", "1 while a generation runs.", [("", int(busy))])
        return "\n".join(out) + "\n"
