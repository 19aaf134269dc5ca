"""The prompt cache: after a restart (a new Model and PromptCache on the same directory) a request prefills only
the tokens after its longest cached prefix, with the output of evaluating the same split without a cache;
deltas and shared prefixes are stored once; unreadable entries are discarded and recomputed; the size cap
holds with LRU eviction; a process killed while storing leaves a valid cache.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import PromptCache, Session
from regolith import state as rstate
from regolith.generation import prefill
from regolith.models import KNOWN_MODELS, resolve_model
from regolith.prompt_cache import chat_boundaries

OVERRIDES = {"indexer_n_heads": 8, "output_gate_type": "sigmoid", "indexer_budget": 256}
GREEDY = {"temperature": 0.0}
PROMPT = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\ndef sub(a, b):\n"
SYSTEM = "You are a careful assistant. Answer in one short sentence, and never use lists or code."
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    tmp = tmp_path_factory.mktemp("cache")
    save_tiny_model(tmp / "hf", 3, **OVERRIDES)
    return str(convert(tmp / "hf", tmp / "tiny.gguf", "f32"))


def _model(path: str, cache_dir: Path | None = None, max_bytes: int = 1 << 30) -> regolith.Model:
    """A new Model object, as after a restart."""
    model = regolith.Model.load(path, n_ctx=256)
    if cache_dir is not None:
        model.prompt_cache = PromptCache(cache_dir, max_bytes)
    return model


def _run(
    model: regolith.Model, prompt: list[int], window: regolith.Window | None = None
) -> regolith.Generation:
    gen = model.start(prompt, window=window, max_tokens=6, **GREEDY)
    list(gen)
    return gen


def test_after_a_restart_only_the_new_tokens_are_prefilled(tiny_path, tmp_path):
    first = _model(tiny_path, tmp_path)
    prompt = first.tokenize(PROMPT)
    g1 = _run(first, prompt)
    assert first.prompt_cache.stats.stores == 2  # the prompt's end (with its logits) and the reply's end

    second = _model(tiny_path, tmp_path)
    longer = prompt + second.tokenize("    return a - b\n", add_special=False)
    assert second.prompt_cache.lookup(second.window(), longer) == len(prompt)
    g2 = _run(second, longer)
    assert g2.stats.cached_tokens == len(prompt)
    assert second._window.n_evaluated == len(longer) - len(prompt) + max(len(g2.tokens) - 1, 0)
    stats = second.prompt_cache.stats
    assert (stats.hits, stats.tokens_saved) == (1, len(prompt))
    # The output of the same split (the prompt, then the rest) without a cache.
    ref = _model(tiny_path)
    w = ref.window()
    w.eval(prompt, all_logits=False)
    assert g2.tokens == _run(ref, longer, window=w).tokens

    # The same prompt again: its state and logits are cached, nothing is evaluated before decoding.
    third = _model(tiny_path, tmp_path)
    g3 = _run(third, prompt)
    assert g3.stats.cached_tokens == len(prompt) and g3.tokens == g1.tokens
    assert third._window.n_evaluated == max(len(g3.tokens) - 1, 0)
    # Again on the same window, which holds the prompt and the reply: the recurrent state is not cut back
    # (that would replay the prompt); the cached one is restored.
    g4 = _run(third, prompt)
    assert g4.stats.cached_tokens == len(prompt) and g4.tokens == g1.tokens
    assert third._window.n_evaluated == 2 * max(len(g3.tokens) - 1, 0)


def test_sessions_snapshot_the_system_prompt_and_turns(tiny_path, tmp_path):
    model = _model(tiny_path, tmp_path)
    s = Session(model, system=SYSTEM, max_tokens=5, **GREEDY)
    first = s.send("hello", stream=True)
    "".join(first)
    s.send("and then?")
    n_system = chat_boundaries(model, s.messages[:1], first.prompt)[0]
    entries = {rstate.read_header(p).n: rstate.read_header(p) for p in tmp_path.glob("*/*.rgs")}
    assert n_system in entries and entries[n_system].start == 0
    deltas = [h for h in entries.values() if h.start > 0]
    assert deltas and all(h.start in entries for h in deltas)  # each delta's parent is stored

    # A new conversation with the same system prompt, after a restart, starts from the cached system prompt.
    other = Session(_model(tiny_path, tmp_path), system=SYSTEM, max_tokens=5, **GREEDY)
    gen = other.send("a different question", stream=True)
    "".join(gen)
    assert gen.stats.cached_tokens == n_system
    assert other.window.n_evaluated == len(gen.prompt) - n_system + max(len(gen.tokens) - 1, 0)


@pytest.fixture(scope="module")
def gemma():
    if importlib.util.find_spec(KNOWN_MODELS["gemma3-270m"].package) is None:
        pytest.skip("the gemma3-270m weights package is not installed")
    return regolith.Model.load(resolve_model("gemma3-270m"), n_ctx=512)


@pytest.mark.real_weights
def test_attention_only_models_share_a_cut_prefix_once(gemma, tmp_path):
    cache = PromptCache(tmp_path, 1 << 30)
    rng = np.random.default_rng(5)
    shared = [2, *rng.integers(100, 5000, 99).tolist()]
    a = shared + rng.integers(100, 5000, 20).tolist()
    b = shared + rng.integers(100, 5000, 30).tolist()
    w = gemma.window()
    prefill(w, a, cache)
    w.reset()
    logits, reused = prefill(w, b, cache)
    assert reused == len(shared)
    # Dense attention is bit-identical under any split of a prompt: the cache changes nothing.
    np.testing.assert_array_equal(logits, gemma.window().eval(b, all_logits=False)[0])
    heads = sorted((h.start, h.n) for h in map(rstate.read_header, tmp_path.glob("*/*.rgs")))
    # The shared prefix became an entry of its own; both prompts are deltas on it.
    assert heads == [(0, len(shared)), (len(shared), len(a)), (len(shared), len(b))]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_unreadable_entries_are_discarded_and_recomputed(tiny_path, tmp_path):
    first = _model(tiny_path, tmp_path)
    prompt = first.tokenize(PROMPT)
    _run(first, prompt)
    files = {rstate.read_header(p).n: p for p in tmp_path.glob("*/*.rgs")}
    end_of_prompt = files[len(prompt)]
    part = rstate.read_header(end_of_prompt).parts[-1]
    _flip(end_of_prompt, part[2] + part[3] // 2)  # a checksum failure found only when restoring

    second = _model(tiny_path, tmp_path)
    assert second.prompt_cache.stats.discarded == 0
    longer = prompt + second.tokenize("    return a - b\n", add_special=False)
    g = _run(second, longer)
    stats = second.prompt_cache.stats
    assert g.stats.cached_tokens == 0 and stats.hits == 0
    assert stats.discarded == 2  # the entry and the reply's delta on it
    assert g.tokens == _run(_model(tiny_path), longer).tokens

    # Truncated, other-version and other-model files are dropped when the cache opens.
    files = sorted(tmp_path.glob("*/*.rgs"))
    assert len(files) >= 2
    files[0].write_bytes(files[0].read_bytes()[:5000])
    data = bytearray(files[1].read_bytes())
    data[8] = 9
    files[1].write_bytes(bytes(data))
    stranger = files[0].parent / ("0" * 32 + ".rgs")
    stranger.write_bytes(files[-1].read_bytes() if len(files) > 2 else b"junk")
    third = _model(tiny_path, tmp_path)
    assert third.prompt_cache.stats.discarded >= 3
    assert not files[0].exists() and not files[1].exists() and not stranger.exists()
    assert _run(third, longer).tokens == g.tokens


def _store(model: regolith.Model, cache: PromptCache, ids: list[int]) -> regolith.Window:
    w = model.window()
    w.eval(ids, all_logits=False)
    assert cache.store(w)
    return w


def test_the_size_cap_holds_evicting_the_least_recently_used(tiny_path, tmp_path):
    model = _model(tiny_path)
    prompts = [[t, *range(10, 40)] for t in range(100, 106)]  # no shared prefixes: six roots
    probe = PromptCache(tmp_path / "probe", 1 << 30)
    _store(model, probe, prompts[0])
    size = probe.stats.bytes
    cache = PromptCache(tmp_path / "c", int(3.5 * size))
    for i, ids in enumerate(prompts):
        _store(model, cache, ids)
        if i == 4:  # using the oldest entry makes it the most recently used
            assert cache.restore(model.window(), [*prompts[2], 1]).tokens == len(prompts[2])
        on_disk = sum(p.stat().st_size for p in (tmp_path / "c").glob("*/*.rgs"))
        assert on_disk == cache.stats.bytes <= cache.max_bytes
    kept = {int(rstate.read_header(p).tokens[0]) for p in (tmp_path / "c").glob("*/*.rgs")}
    assert kept == {102, 104, 105}
    assert cache.stats.evictions == 3
    # A smaller cap applies when the cache is opened again.
    assert PromptCache(tmp_path / "c", int(1.5 * size)).stats.entries == 1


_STORER = """
import itertools, sys, regolith
model = regolith.Model.load(sys.argv[1], n_ctx=256)
cache = regolith.PromptCache(sys.argv[2], 1 << 30)
w = model.window()
for i in itertools.count():
    if w.n_past == 0 or w.n_past > 40:
        w.reset()
        w.eval([3 + int(sys.argv[3]), 3 + i % 200, *range(10, 30)], all_logits=False)
    w.eval([3 + i % 250], all_logits=False)  # one more token: a new entry, a delta on the last one
    cache.store(w)
    if i == 0:
        print("ready", flush=True)
"""


def test_kill_9_while_storing_leaves_a_valid_cache(tiny_path, tmp_path):
    # Kill as soon as a save's temporary file shows up, until one kill has landed before its rename (the
    # file is left). Watching for the file, not a timer, keeps this independent of how long evaluation
    # takes beside the saves (the Metal emulator's is slow, a loaded machine's too).
    for attempt in range(40):
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_STORER), tiny_path, str(tmp_path), str(attempt)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not any(tmp_path.glob("*/.*.tmp")):
            pass
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        leftovers = list(tmp_path.glob("*/.*.tmp"))
        if leftovers:
            break
    assert leftovers
    model = _model(tiny_path)
    cache = PromptCache(tmp_path, 1 << 30)
    assert cache.stats.discarded == 0 and cache.stats.entries >= 1
    assert all(p.exists() for p in leftovers)  # too young to be known dead: a writer may still own them
    for k, path in enumerate(sorted(tmp_path.glob("*/*.rgs"))):
        ids = rstate.read_header(path).tokens.tolist()
        w = model.window()
        assert cache.restore(w, [*ids, 7]).tokens == len(ids)
        if k % 4:
            continue
        ref = model.window()  # evaluated as the storer did: 22 tokens at once, then one at a time
        ref.eval(ids[:22], all_logits=False)
        for t in ids[22:]:
            ref.eval([t], all_logits=False)
        np.testing.assert_array_equal(w.eval([7]), ref.eval([7]))
    old = time.time() - 3600
    for p in leftovers:
        os.utime(p, (old, old))
    PromptCache(tmp_path, 1 << 30)
    assert not any(p.exists() for p in leftovers)


class _CharModel:
    """A chat model for chat_boundaries: a template, and one token per character of the rendered text."""

    def __init__(self, template: str):
        from regolith.chat import ChatTemplate

        self.chat_template = ChatTemplate(template)

    def tokenize_chat(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_boundaries_render_with_the_prompts_reasoning_effort():
    """gpt-oss's system prompt names the reasoning effort: rendered at another effort, the conversation's
    prefixes would part from the prompt within the system prompt and no snapshot would be worth its bytes."""
    template = (Path(__file__).parent / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja").read_text(
        encoding="utf-8"
    )
    model = _CharModel(template)
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    for effort in ("low", "high"):
        text = model.chat_template.render(messages, reasoning_effort=effort)
        marks = chat_boundaries(model, messages, model.tokenize_chat(text), reasoning_effort=effort)
        # the end of the developer message, and of the turns before the last (less the final token, which
        # ends a conversation's last assistant message as <|return|> and an earlier one as <|end|>)
        assert text[: marks[0]].endswith("Answer briefly.\n\n<|end|>")
        assert text[: marks[1]].endswith("<|channel|>final<|message|>4<|")
