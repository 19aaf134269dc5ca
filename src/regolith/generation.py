"""The decoding loop: prompt prefill with prefix reuse, sampling, stop conditions, streamed text, anti-slop.

:class:`Generation` is an iterator of text pieces. It prefills only the part of the prompt the window has not
already evaluated, samples one token at a time, and ends at an end-of-generation token, a stop string,
``max_tokens`` or a full context. Text is released only once it can no longer change: bytes of an unfinished
UTF-8 character, a tail that may still become a stop string, and (with anti-slop on) a tail that may still
become a banned phrase are held back.

Anti-slop (the antislop approach, arXiv 2510.15061): when the prose of the generated text comes to contain a
banned phrase, generation backtracks to the token where the phrase began, bans that token at that position and
samples again. End-of-generation tokens are never banned, and text inside code or tool calls is never checked.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .errors import ContextOverflowError
from .logprobs import TokenLogprob, token_logprob
from .sampling import Sampler, SamplingParams
from .scr import Run, fits_recurrent, plan_reuse, reused_tokens
from .speculative import CostGate, Speculation, Speculator

if TYPE_CHECKING:
    from .antislop import SlopMatcher, Violation
    from .prompt_cache import PromptCache
    from .tokenizer import Tokenizer
    from .window import Window, WindowSnapshot

__all__ = ["Generation", "GenerationStats", "SharedPrompt", "TokenGuide", "prefill", "score_prompt"]

# Prompt tokens evaluated per call: bounds activation memory and lets a cancelled request stop between chunks.
PREFILL_CHUNK = 512
# Prompt tokens a suffix cache reuse evaluates again at the end of a prompt on models with recurrent layers
# where the old end's state has read other text last (_prefill_moved): measured on regolith-demo, docs/cache.md.
RECURRENT_TAIL = 128
# Prompt tokens per call when every position's logits are kept (prompt log-probabilities): 128 rows of a
# 152k vocabulary are 78 MB of float32 logits.
LOGPROBS_CHUNK = 128
# Bans at one position before anti-slop gives up and lets the phrase stand (every candidate may be slop).
MAX_BANS_PER_POSITION = 16


class TokenGuide(Protocol):
    """Steers a generation token by token (a thinking budget, an output format). Both methods see the tokens
    generated so far, which anti-slop backtracking may shorten, so a guide must not assume they only grow."""

    def forced(self, tokens: Sequence[int]) -> int | None:
        """The token that must follow ``tokens`` (it is not sampled), or None to sample."""
        ...

    def allows(self, tokens: Sequence[int], token: int) -> bool:
        """Whether the sampled ``token`` may follow ``tokens``; a refused token is banned at this position and
        the position sampled again. A guide may also have ``mask(tokens)``: a bool array over the vocabulary
        of the tokens that may follow, applied to the logits before sampling (a grammar's guide)."""
        ...


@dataclass
class GenerationStats:
    """Token counts and timings of one generation (seconds; rates in tokens per second)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens not evaluated: held by the window or restored from a prompt cache
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    backtracks: int = 0  # anti-slop rollbacks
    decode_rounds: int = 0  # model evaluations while decoding (one per token without speculation)
    drafted_tokens: int = 0  # draft tokens verified
    accepted_tokens: int = 0  # draft tokens generation kept

    @property
    def tokens_per_round(self) -> float:
        return self.generated_tokens / self.decode_rounds if self.decode_rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefill(
    window: Window,
    prompt: Sequence[int],
    cache: PromptCache | None = None,
    boundaries: Sequence[int] = (),
    progress: Callable[[int, int], None] | None = None,
    scr: bool = False,
) -> tuple[np.ndarray, int]:
    """Bring ``window`` to exactly ``prompt`` and return (logits after its last token, tokens reused).

    Keeps the longest prefix the window already holds (where its state can be cut back to it: any prefix on
    attention-only models, all the window holds on recurrent ones), or restores a longer one from ``cache``, and evaluates
    only the rest (at least the last token, whose logits are needed, unless the cache held the whole prompt
    and its logits), in chunks of :data:`PREFILL_CHUNK`. With a cache, the state is stored at each of
    ``boundaries`` (token offsets) passed on the way and at the end of the prompt. ``progress(done, total)``
    is called after each chunk with the tokens evaluated so far of the ``total`` the prompt needs.

    ``scr`` (suffix cache reuse, where :attr:`Window.can_move`): the window's tokens after an edit are reused
    too where they reappear in the prompt (:func:`regolith.scr.plan_reuse`), moved to their new positions
    (:meth:`Window.append_moved`) rather than evaluated, when that reuses more than the prompt cache's prefix;
    or a cache entry's tokens, where one reuses more still (:meth:`PromptCache.restore_moved`; on models
    with recurrent layers also one that reuses fewer, where its plan fits the recurrent state,
    :func:`regolith.scr.fits_recurrent`, and the window's does not).
    Recurrent layers keep their state through the gaps and take the old end's after the last run
    (:meth:`Window.adopt_recurrent`). Not exact: moved tokens keep what they attended to before the edit.
    Without such runs (no edit, an edit at the end) it is the plain path, bit for bit. A window holding moved
    tokens is never stored in the prompt cache. The logits returned are noted on the window
    (:meth:`Window.note_end_logits`) for a later prompt's reuse.
    """
    if not prompt:
        raise ValueError("the prompt is empty: generation needs at least one token")
    if len(prompt) >= window.max_ctx:
        raise ContextOverflowError(
            f"the prompt has {len(prompt)} tokens; the context holds {window.max_ctx} (with room for one reply token)"
        )
    if scr and window.can_move and not window._images:  # image tokens do not move
        # the last prompt token is evaluated (its logits are needed), unless a recurrent plan moves it too
        runs = plan_reuse(window.tokens, prompt[:-1]) if window.n_past else []
        reused = reused_tokens(runs)
        fits = not window.recurrent or fits_recurrent(
            runs, window.tokens, prompt, window.end_logits() is not None
        )
        prefix = cache.lookup(window, prompt) if cache is not None else 0
        moved = cache.restore_moved(window, prompt, (fits, reused), prefix) if cache is not None else None
        if moved is not None:
            # the plan against the entry the window now holds (one holding images takes the plain path)
            runs = [] if window._images else moved
            reused = reused_tokens(runs)
        if any(r.dst > 0 for r in runs) and prefix < reused:
            return _prefill_moved(window, prompt, runs, progress)
    if cache is not None:
        hit = cache.restore(window, prompt)
        if hit is not None and hit.logits is not None:
            return hit.logits, len(prompt)
    keep = min(_common_prefix(window.tokens, prompt), len(prompt) - 1)
    if not window.try_truncate(keep):
        # A recurrent state cut back by replaying the kept tokens saves nothing, and the replay's chunks would
        # differ from a fresh prefill's: the prompt's logits would then depend on what the window held before.
        keep = 0
        window.truncate(0)
    logits = None
    done = keep
    stops = sorted({b for b in boundaries if keep < b < len(prompt)} if cache is not None else set())
    for end in [*stops, len(prompt)]:
        for start in range(done, end, PREFILL_CHUNK):
            chunk_end = min(start + PREFILL_CHUNK, end)
            logits = window.eval(prompt[start:chunk_end], all_logits=False)
            if progress is not None:
                progress(chunk_end - keep, len(prompt) - keep)
        done = end
        if cache is not None:
            assert logits is not None
            cache.store(window, logits=logits[0] if end == len(prompt) else None)
    assert logits is not None
    window.note_end_logits(logits[0])
    return logits[0], keep


def _prefill_moved(
    window: Window, prompt: Sequence[int], runs: Sequence[Run], progress: Callable[[int, int], None] | None
) -> tuple[np.ndarray, int]:
    """prefill's suffix cache reuse: the window cut back to the common prefix (recurrent layers keep their
    state), then each gap evaluated and each run of its old tokens moved after it. On models with recurrent
    layers, which hold only the state after all the old tokens, the last run decides what they read next
    (docs/cache.md):

    - it ends with the old tokens: they take the old end's state (:meth:`Window.adopt_recurrent`) after it,
      which has read what precedes the tokens evaluated after it;
    - it ends one short, where the prompt's last token ends the old tokens too and the logits after it are
      known (:meth:`Window.end_logits`): that token moves too, the state is taken after it, and those
      logits are the prompt's;
    - otherwise the old end's state has read something else last (a reply after the old prompt, say): it is
      taken after the run cut back to leave the prompt's last :data:`RECURRENT_TAIL` tokens, which are
      evaluated again.

    Returns (the logits after the prompt's last token, tokens reused)."""
    snapshot = window.snapshot()
    old = len(snapshot.tokens)
    head = runs[0].length if runs[0].dst == 0 else 0
    window.truncate_attention(head)
    moved = [r for r in runs if r.dst > 0]
    last, adopt, end_logits = moved[-1], None, None
    if window.recurrent:
        if last.src + last.length == old:
            adopt = last
        elif fits_recurrent(moved, snapshot.tokens, prompt, snapshot.end_logits is not None):
            end_logits = snapshot.end_logits
            adopt = Run(last.src, last.dst, last.length + 1)
        else:
            keep = min(last.length, max(0, len(prompt) - RECURRENT_TAIL - last.dst))
            adopt = Run(last.src, last.dst, keep)
        moved[-1] = adopt
    reused = head + reused_tokens(moved)
    total = len(prompt) - reused
    done = evaluated = head
    logits = None
    for run in [*moved, Run(0, len(prompt), 0)]:
        for start in range(done, run.dst, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, run.dst)
            logits = window.eval(prompt[start:end], all_logits=False)
            evaluated += end - start
            if progress is not None:
                progress(evaluated - head, total)
        if run.length:
            window.append_moved(snapshot, run.src, run.length)
        if run is adopt:
            window.adopt_recurrent(snapshot)
        done = run.dst + run.length
    first = end_logits.copy() if end_logits is not None else logits[0] if logits is not None else None
    assert first is not None  # the runs end before the prompt's last token, or it moved with its logits
    window.note_end_logits(first)
    return first, reused


def score_prompt(
    window: Window,
    prompt: Sequence[int],
    top: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, list[TokenLogprob | None]]:
    """Evaluate ``prompt`` on ``window`` from its first token (nothing the window holds is reused: every
    position's logits are needed) and return (logits after its last token, each prompt token's log-probability
    with the ``top`` most likely tokens at its position; None for the first token, which nothing predicts).
    ``progress`` is as for :func:`prefill`."""
    if not prompt:
        raise ValueError("the prompt is empty: generation needs at least one token")
    if len(prompt) >= window.max_ctx:
        raise ContextOverflowError(
            f"the prompt has {len(prompt)} tokens; the context holds {window.max_ctx} (with room for one reply token)"
        )
    window.truncate(0)
    out: list[TokenLogprob | None] = [None]
    logits = None
    for start in range(0, len(prompt), LOGPROBS_CHUNK):
        end = min(start + LOGPROBS_CHUNK, len(prompt))
        logits = window.eval(prompt[start:end], all_logits=True)
        for i in range(start, end - 1 if end == len(prompt) else end):
            out.append(token_logprob(logits[i - start], prompt[i + 1], top))
        if progress is not None:
            progress(end, len(prompt))
    assert logits is not None
    return logits[-1], out


class SharedPrompt:
    """One prompt's evaluation shared by several generations of it (a server's ``n`` choices): the first
    generation given it keeps a :meth:`regolith.Window.snapshot` of the window after the prompt, with the
    logits there and the prompt's log-probabilities; the others restore it instead of evaluating the prompt."""

    def __init__(self) -> None:
        self.prompt: list[int] | None = None
        self.snapshot: WindowSnapshot | None = None
        self.logits: np.ndarray | None = None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None

    def keep(
        self,
        window: Window,
        prompt: Sequence[int],
        logits: np.ndarray,
        logprobs: list[TokenLogprob | None] | None,
    ) -> None:
        self.prompt, self.snapshot = list(prompt), window.snapshot()
        self.logits, self.prompt_logprobs = logits, logprobs

    def restore(self, window: Window, prompt: Sequence[int], logprobs: bool) -> np.ndarray | None:
        """The logits after ``prompt`` with ``window`` brought to the state after it, or None when this
        holds no state of ``prompt`` (or lacks the prompt's log-probabilities, when ``logprobs``)."""
        if self.snapshot is None or self.prompt != list(prompt):
            return None
        if logprobs and self.prompt_logprobs is None:
            return None
        window.restore(self.snapshot)
        return self.logits


@dataclass
class _Text:
    """Generated tokens and their text, with where each token's text ends (for mapping text back to tokens)."""

    token_bytes: list[bytes] = field(default_factory=list)
    char_end: list[int] = field(default_factory=list)
    text: str = ""
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )

    def push(self, piece: bytes) -> None:
        self.token_bytes.append(piece)
        self.text += self.decoder.decode(piece)
        self.char_end.append(len(self.text))

    def finish(self) -> None:
        self.text += self.decoder.decode(b"", final=True)

    def token_at(self, char: int) -> int:
        """Index of the token whose bytes begin the character at ``char``."""
        i = next(k for k, end in enumerate(self.char_end) if end > char)
        # A character completed by token i may have begun in earlier tokens (multi-byte UTF-8 split across them).
        while i > 0 and self.token_bytes[i] and (self.token_bytes[i][0] & 0xC0) == 0x80:
            i -= 1
        return i

    def tokens_before(self, char: int) -> int:
        """How many tokens lie wholly before the character at ``char`` (all the tokens when ``char`` is the
        text's end, but those holding the bytes of a character not yet complete)."""
        if char < len(self.text):
            return self.token_at(char)
        i, pending = len(self.token_bytes), len(self.decoder.getstate()[0])
        while pending > 0 and i > 0:
            i -= 1
            pending -= len(self.token_bytes[i])
        return i

    def truncate(self, n: int) -> None:
        kept = self.token_bytes[:n]
        self.token_bytes, self.char_end, self.text = [], [], ""
        self.decoder.reset()
        for piece in kept:
            self.push(piece)


class Generation(Iterator[str]):
    """One generation, iterated as text pieces; afterwards :attr:`text`, :attr:`tokens`, :attr:`finish_reason`
    ('stop' at an end-of-generation token or stop string, 'length' at ``max_tokens`` or a full context,
    'cancelled' when closed early) and :attr:`stats`. ``on_finish(generation)`` is called once it has ended,
    whichever way. A ``guide`` (:class:`TokenGuide`) may force tokens and refuse sampled ones. With
    ``speculation`` (:class:`regolith.speculative.Speculation`) drafts are verified several tokens per model
    evaluation; the output is exactly what it would be without (see :mod:`regolith.speculative`); ``gate`` is
    the cost model to use (and teach), by default a new one.

    With ``logprobs`` (a count of alternatives, 0 for none), :attr:`logprobs` holds each generated token's
    log-probability (:class:`regolith.logprobs.TokenLogprob`: the log-softmax of the model's raw logits at its
    position) and the ``logprobs`` most likely tokens there; with ``prompt_logprobs`` :attr:`prompt_logprobs`
    holds the prompt's (the whole prompt is then evaluated: no prefix is reused). ``shared``
    (:class:`SharedPrompt`) lets several generations of one prompt evaluate it once.

    Created by :meth:`regolith.Model.generate` and friends; :meth:`close` cancels it (a server does this when
    the client disconnects). Iteration runs the model; the window must not be used by anyone else meanwhile.
    """

    def __init__(
        self,
        window: Window,
        tokenizer: Tokenizer,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingParams,
        stop: Sequence[str] = (),
        slop: SlopMatcher | None = None,
        on_finish: Callable[[Generation], None] | None = None,
        guide: TokenGuide | None = None,
        cache: PromptCache | None = None,
        boundaries: Sequence[int] = (),
        speculation: Speculation | None = None,
        gate: CostGate | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        shared: SharedPrompt | None = None,
        scr: bool = False,
    ):
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if isinstance(stop, str):
            stop = [stop]
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError("stop strings must be non-empty strings")
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be None or an integer >= 0, got {value!r}")
        self.prompt = list(prompt)
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.end_token: int | None = None  # the end-of-generation token that ended the reply, if one did
        self.logprobs: list[TokenLogprob] | None = [] if logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.released_tokens = 0
        """How many of :attr:`tokens` the text yielded so far covers whole (all of them once it has ended)."""
        self.stats = GenerationStats(prompt_tokens=len(self.prompt))
        self._window = window
        self._tokenizer = tokenizer
        self._on_prefill = on_prefill
        self._max_tokens = max_tokens
        self._sampling = sampling
        self._stop = list(stop)
        self._slop = slop
        self._lead = ""  # the prompt's unfinished code block or tool call, which the reply continues
        self._on_finish = on_finish
        self._guide = guide
        self._cache = cache
        self._boundaries = list(boundaries)
        self._speculation = speculation
        self._gate = gate if gate is not None else CostGate()
        self._spec: Speculator | None = None
        self._top = logprobs or 0
        self._prompt_top = prompt_logprobs
        self._shared = shared
        self._scr = scr
        self._steps = self._run()

    def __next__(self) -> str:
        return next(self._steps)

    def close(self) -> None:
        """Stop generating (finish_reason 'cancelled' unless it had already finished)."""
        self._steps.close()
        if self.finish_reason is None:
            self._finished("cancelled")

    def _finished(self, reason: str) -> None:
        self.finish_reason = reason
        if self._on_finish is not None:
            self._on_finish(self)

    def _held_for_stop(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is the start of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _run(self) -> Iterator[str]:
        window, tok = self._window, self._tokenizer
        t0 = time.perf_counter()
        logits = self._prefill()
        if self._speculation is not None:  # indexes the prompt for drafting: part of processing the prompt
            self._spec = Speculator(window, self.prompt, self._speculation, self._gate)
        t1 = time.perf_counter()
        self.stats.prefill_seconds = t1 - t0

        eog = tok.eog_ids
        if self._slop is not None:
            self._lead = self._open_construct(tok.decode(self.prompt))
        sampler = Sampler(self._sampling, logits.shape[-1])
        sampler.set_history(self.prompt)
        out = _Text()
        bans: dict[int, set[int]] = {}
        emitted = 0  # characters of out.text already yielded
        slop_from = 0  # anti-slop ignores phrases starting before this (allowed after MAX_BANS_PER_POSITION)
        finish = "length"
        final: str | None = None  # the reply's text when a stop string cut it
        try:
            while True:
                token = None
                if len(out.token_bytes) < self._max_tokens:
                    token = self._next_token(sampler, logits, bans.get(len(out.token_bytes), set()))
                if token is None or token in eog:
                    # The reply is complete (max_tokens or an end-of-generation token): phrases that waited for
                    # their last word to end are checked now, and may still send generation back.
                    v = self._violation(out.text, emitted, slop_from, partial=False)
                    rolled = self._backtrack(out, sampler, bans, v) if v is not None else None
                    if rolled is not None:
                        logits = rolled
                        continue
                    finish = "length" if token is None else "stop"
                    self.end_token = token
                    break
                self.tokens.append(token)
                if self.logprobs is not None:
                    self.logprobs.append(token_logprob(logits, token, self._top))
                sampler.accept(token)
                out.push(tok.token_bytes(token, special=False))
                text = out.text

                # Held-back text starts at `emitted`, so a stop string cannot begin before it.
                hits = [i for s in self._stop if (i := text.find(s, emitted)) >= 0]
                if hits:
                    final, finish = text[: min(hits)], "stop"
                    break

                v = self._violation(text, emitted, slop_from, partial=True)
                if v is not None:
                    rolled = self._backtrack(out, sampler, bans, v)
                    if rolled is not None:
                        logits = rolled
                        continue
                    slop_from = v.end_char + 1  # banned too often at this position: the phrase stands

                if len(self.prompt) + len(self.tokens) >= window.max_ctx:
                    break  # no room to evaluate the token just sampled: the reply ends with it
                if len(self.tokens) < self._max_tokens:  # the last token's logits would go unused
                    if self._spec is not None:
                        logits = self._spec.advance(token, self._max_tokens - len(self.tokens))
                    else:
                        logits = window.eval([token], all_logits=False)[0]
                        self.stats.decode_rounds += 1

                safe = len(text) - self._held_for_stop(text)
                if self._slop is not None:
                    safe = min(safe, self._slop.pending_prefix(self._lead + text) - len(self._lead))
                if safe > emitted:
                    piece, emitted = text[emitted:safe], safe
                    self.text += piece
                    self.released_tokens = out.tokens_before(emitted)
                    yield piece
            if final is None:
                out.finish()
                final = out.text
            self.released_tokens = len(self.tokens)
            if len(final) > emitted:
                self.text += final[emitted:]
                yield final[emitted:]
            if self._spec is not None:
                self._spec.finish()
            if self._cache is not None:
                self._cache.store(window)  # the reply's end: where the conversation's next prompt continues
            self._finished(finish)
        finally:
            if self._spec is not None:
                self._spec.finish()
                self.stats.decode_rounds += self._spec.rounds
                self.stats.drafted_tokens = self._spec.drafted
                self.stats.accepted_tokens = self._spec.accepted
                self._gate.checkpoint()
            self.stats.generated_tokens = len(self.tokens)
            self.stats.decode_seconds = time.perf_counter() - t1

    def _prefill(self) -> np.ndarray:
        """Bring the window to the prompt (restoring the shared prompt's state, or evaluating what it does
        not hold) and return the logits after it; fills :attr:`prompt_logprobs` when asked to."""
        window, shared, top = self._window, self._shared, self._prompt_top
        if shared is not None:
            logits = shared.restore(window, self.prompt, top is not None)
            if logits is not None:
                self.stats.cached_tokens = len(self.prompt)
                if top is not None:
                    self.prompt_logprobs = shared.prompt_logprobs
                return logits
        if top is not None:
            logits, self.prompt_logprobs = score_prompt(window, self.prompt, top, self._on_prefill)
        else:
            logits, self.stats.cached_tokens = prefill(
                window, self.prompt, self._cache, self._boundaries, self._on_prefill, self._scr
            )
        if shared is not None:
            shared.keep(window, self.prompt, logits, self.prompt_logprobs)
        return logits

    def _next_token(self, sampler: Sampler, logits: np.ndarray, banned: set[int]) -> int:
        """The next token: the guide's forced one, else a sample the guide allows (refused ones are banned)."""
        if self._guide is None:
            return sampler.sample(logits, sorted(banned))
        forced = self._guide.forced(self.tokens)
        if forced is not None:
            return forced
        mask = getattr(self._guide, "mask", None)
        if mask is not None:
            logits = np.where(mask(self.tokens), logits, np.float32(-np.inf)).astype(logits.dtype, copy=False)
        refused = set(banned)
        while True:
            token = sampler.sample(logits, sorted(refused))
            if self._guide.allows(self.tokens, token):
                return token
            refused.add(token)

    def _open_construct(self, prompt_text: str) -> str:
        """The tail of the prompt that is not prose at its end (an open code fence or tool call), or ''."""
        assert self._slop is not None
        scan = self._slop.prose.scan(prompt_text)
        prose_end = scan.ranges[-1][1] if scan.ranges else 0
        return prompt_text[prose_end:] if prose_end < len(prompt_text) else ""

    def _violation(self, text: str, emitted: int, slop_from: int, *, partial: bool) -> Violation | None:
        """The first banned phrase in unreleased prose, if anti-slop is on, in ``text``'s coordinates.

        The reply is scanned after the prompt's open construct, so a reply that continues a code block the
        prompt opened is known to be code."""
        if self._slop is None:
            return None
        lead, start = len(self._lead), max(emitted, slop_from)
        v = self._slop.find_violation(self._lead + text, lead + start, partial=partial)
        # A phrase reaching back into released text cannot be retracted (holding back prevents this).
        if v is None or v.start_char < lead + start:
            return None
        return replace(v, start_char=v.start_char - lead, end_char=v.end_char - lead)

    def _backtrack(
        self, out: _Text, sampler: Sampler, bans: dict[int, set[int]], v: Violation
    ) -> np.ndarray | None:
        """Ban the token that began phrase ``v`` at its position and roll back to it; returns the logits to
        sample that position again, or None when it has been banned too often (the phrase then stands)."""
        start = out.token_at(v.start_char)
        banned = bans.setdefault(start, set())
        if len(banned) >= MAX_BANS_PER_POSITION:
            return None
        banned.add(self.tokens[start])
        for p in [p for p in bans if p > start]:
            del bans[p]
        self.stats.backtracks += 1
        return self._rollback(out, sampler, start)

    def _rollback(self, out: _Text, sampler: Sampler, start: int) -> np.ndarray:
        """Forget generated tokens from ``start`` on; returns the logits for sampling position ``start`` again."""
        del self.tokens[start:]
        if self.logprobs is not None:
            del self.logprobs[start:]
        out.truncate(start)
        history = self.prompt + self.tokens
        sampler.set_history(history)
        if self._spec is not None:
            self._spec.rollback(len(history))
        # The window holds the prompt and the evaluated generated tokens; re-evaluate the token before ``start``.
        self._window.truncate(len(history) - 1)
        return self._window.eval(history[-1:], all_logits=False)[0]
