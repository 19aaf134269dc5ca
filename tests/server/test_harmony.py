"""gpt-oss's harmony format without weights: the reply parser (channels, calls, malformed calls; streamed
however the pieces are cut, always what the whole reply parses to), gpt-oss's real chat template
(tests/fixtures/templates/openai-gpt-oss-120b.jinja, from llama.cpp) rendered from API-shaped conversations
(oracle: transformers' renderer), and the plans' guides (forced call, JSON answer, thinking budget) on a
byte-level vocabulary with harmony's special tokens."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regolith.chat import ChatTemplate
from regolith.server.api_error import APIError
from regolith.server.grammar import GrammarGuide
from regolith.server.plan import chat_prompt, harmony_messages, is_harmony, plan_chat
from regolith.server.reply import HarmonyParser
from regolith.server.thinking import ThinkingBudget
from regolith.tokenizer import Tokenizer
from tests.server.conftest import THINKING_TEMPLATE

TEMPLATE = (Path(__file__).parents[1] / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja").read_text(
    encoding="utf-8"
)
NAMES = {"get_weather", "search"}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEARCH_TOOL = {  # no description: the template prints one, so the server supplies ""
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
}
CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'


# -- a byte-level vocabulary with harmony's special tokens, and a stand-in model --------------------------

_SPECIALS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
]


def _byte_chars() -> list[str]:
    """GPT-2's byte -> character map, as byte-level BPE vocabularies spell bytes."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def harmony_tokenizer() -> Tokenizer:
    """One token per byte, and gpt-oss's special tokens (control in the file, as in gpt-oss's GGUF: the
    tokenizer renders <|channel|>, <|message|>, <|start|>, <|constrain|> and <|end|>, and ends generation at
    <|return|> and <|call|>)."""
    tokens = _byte_chars() + _SPECIALS
    return Tokenizer.from_gguf(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * 256 + [3] * len(_SPECIALS),
            "tokenizer.ggml.merges": [],
            "tokenizer.ggml.bos_token_id": tokens.index("<|startoftext|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|return|>"),
        }
    )


class HarmonyModel:
    """What the planner reads of a gpt-oss model: the vocabulary above and gpt-oss's chat template."""

    n_ctx = 16384
    prompt_cache = None
    plan = None
    scr = False

    def __init__(self) -> None:
        self.tokenizer = harmony_tokenizer()
        self.config = {"vocab_size": self.tokenizer.vocab_size}
        special = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}
        self.chat_template = ChatTemplate(TEMPLATE, special=special)

    def tokenize_chat(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)


@pytest.fixture(scope="module")
def model() -> HarmonyModel:
    return HarmonyModel()


def _prompt_text(model: HarmonyModel, messages, **kwargs) -> str:
    return model.tokenizer.decode(chat_prompt(model, messages, **kwargs).ids)


# -- the reply parser ----------------------------------------------------------------------------------


def _parse(reply: str, pieces: list[str] | None = None, tools=NAMES, prefix: str = ""):
    parser = HarmonyParser(tool_names=tools, prefix=prefix)
    events = []
    for piece in [reply] if pieces is None else pieces:
        events += parser.feed(piece)
    events += parser.finish()
    calls = [(c.name, c.arguments) for c in parser.calls]
    return parser.thinking, parser.text, calls, events


REPLIES = [
    # reasoning, then the answer (<|end|> is rendered; <|return|> and <|call|> are not in the text)
    (
        "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
        ("The user greets.", "Hi!", []),
    ),
    # the recipient in the channel header, with <|constrain|>
    (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + CALL,
        ("Need weather.", "", [("get_weather", {"city": "Paris"})]),
    ),
    # the recipient in the role header, right after the prompt's <|start|>assistant
    (
        ' to=functions.search<|channel|>commentary json<|message|>{"q": "rust"}',
        ("", "", [("search", {"q": "rust"})]),
    ),
    (
        '<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{"q": "x"}<|call|>',
        ("", "", [("search", {"q": "x"})]),
    ),
    # a commentary preamble is shown to the user; several calls; empty arguments
    (
        "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant"
        + CALL
        + "<|start|>assistant<|channel|>commentary to=functions.search<|message|>",
        ("", "Let me look.", [("get_weather", {"city": "Paris"}), ("search", {})]),
    ),
    # messages of one kind are joined by a blank line
    (
        (
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
            "<|start|>assistant<|channel|>final<|message|>c<|return|>"
        ),
        ("a\n\nb", "c", []),
    ),
    # malformed calls are answer text, as the model wrote them: cut JSON, not an object, trailing text
    (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
        ("", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa', []),
    ),
    (
        (
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.search"
            "<|message|>[1, 2]"
        ),
        ("x", "<|start|>assistant<|channel|>commentary to=functions.search<|message|>[1, 2]", []),
    ),
    (
        '<|channel|>commentary to=functions.search<|message|>{"q": 1} and more',
        ("", '<|channel|>commentary to=functions.search<|message|>{"q": 1} and more', []),
    ),
    # a built-in tool's call (not offered) is dropped; a reply cut inside a header drops the header
    (
        '<|channel|>analysis<|message|>Browse.<|end|><|start|>assistant<|channel|>analysis to=browser.search code<|message|>{"query": "x"}',
        ("Browse.", "", []),
    ),
    ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin", ("Hm.", "", [])),
    # a reply outside the format is the answer; so is a final message without its <|channel|>
    ("  Plain text, <not a marker>.", ("", "Plain text, <not a marker>.", [])),
    ("<|start|>assistant<|message|>No channel.", ("", "No channel.", [])),
    ("<|chan", ("", "<|chan", [])),
    ("", ("", "", [])),
]


@pytest.mark.parametrize(("reply", "want"), REPLIES)
def test_channels_and_calls(reply, want):
    assert _parse(reply)[:3] == want


@pytest.mark.parametrize(("reply", "want"), REPLIES)
def test_every_split_point_parses_as_the_whole(reply, want):
    """Two pieces cut at every point, and one character at a time: the same thinking, text and calls, and
    the released pieces join to them."""
    cuts = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)] + [list(reply)]
    for pieces in cuts:
        thinking, text, calls, events = _parse(reply, pieces)
        assert (thinking, text, calls) == want, pieces
        assert "".join(t for k, t in events if k == "thinking") == thinking
        assert "".join(t for k, t in events if k == "text") == text


def test_answer_streams_before_the_reply_ends_and_calls_are_held():
    parser = HarmonyParser(tool_names=NAMES)
    assert parser.feed("<|channel|>analysis<|message|>Thin") == [("thinking", "Thin")]
    assert parser.feed("king<|e") == [("thinking", "king")]  # "<|e" may begin <|end|>
    assert parser.feed("nd|><|start|>assistant<|channel|>final<|message|>Hel") == [("text", "Hel")]
    assert parser.feed("lo") == [("text", "lo")]
    parser = HarmonyParser(tool_names=NAMES)
    assert parser.feed(CALL) == [] and parser.calls == []
    assert parser.finish() == [] and [c.name for c in parser.calls] == ["get_weather"]


def test_calls_without_tools_are_dropped():
    assert _parse("<|channel|>analysis<|message|>x<|end|><|start|>assistant" + CALL, tools=None)[:3] == (
        "x",
        "",
        [],
    )


def test_forced_prefix_is_parsed_but_not_released():
    prefix = "<|channel|>commentary to=functions."
    assert _parse('get_weather <|constrain|>json<|message|>{"city": "Oslo"}', prefix=prefix)[2:] == (
        [("get_weather", {"city": "Oslo"})],
        [],
    )
    # a malformed forced call: the model's own text only
    assert _parse("search<|message|>{oops", prefix=prefix)[1] == "search<|message|>{oops"


fragments = st.lists(
    st.sampled_from(
        [
            "<|channel|>",
            "analysis",
            "final",
            "commentary",
            " to=functions.search",
            " to=browser.open",
            " <|constrain|>json",
            "<|message|>",
            "<|end|>",
            "<|start|>assistant",
            "<|call|>",
            '{"q": "a"}',
            "{",
            "Hello",
            " ",
            "\n",
            "<",
            "|",
        ]
    ),
    max_size=16,
)


@settings(max_examples=300, deadline=None)
@given(pieces=fragments, split=st.integers(1, 7), tools=st.booleans())
def test_streaming_equals_parsing_the_whole_reply(pieces, split, tools):
    reply = "".join(pieces)
    names = NAMES if tools else None
    chunks = [reply[i : i + split] for i in range(0, len(reply), split)]
    streamed, whole = _parse(reply, chunks, tools=names), _parse(reply, tools=names)
    assert streamed[:3] == whole[:3]
    for kind, value in (("thinking", whole[0]), ("text", whole[1])):
        assert "".join(t for k, t in streamed[3] if k == kind) == value


# -- the request: gpt-oss's template -------------------------------------------------------------------


def test_harmony_templates_are_recognised(model):
    assert is_harmony(model.chat_template.source)
    assert not is_harmony("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}")


def test_tools_effort_and_the_generation_prompt(model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = _prompt_text(model, messages, tools=[WEATHER_TOOL, SEARCH_TOOL], reasoning_effort="high")
    assert "Reasoning: high\n" in text and "Current date: 20" in text
    assert "# Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {" in text
    assert "// Current weather in a city\ntype get_weather = (_: {\ncity: string,\n}) => any;" in text
    assert "type search = (_: {\nq?: string,\n}) => any;" in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert "Reasoning: low\n" in _prompt_text(model, messages)  # the server's default effort
    assert "Reasoning: medium\n" in _prompt_text(
        model, messages, template_kwargs={"reasoning_effort": "medium"}
    )
    assert "Reasoning: low\n" in _prompt_text(model, messages, thinking=False, template_kwargs={})
    with pytest.raises(APIError, match="'extreme' is not one gpt-oss knows: use one of low, medium, high"):
        chat_prompt(model, messages, reasoning_effort="extreme")
    with pytest.raises(APIError, match="chat_template_kwargs may not set messages"):
        chat_prompt(model, messages, template_kwargs={"messages": []})
    # the template's own variables pass through
    text = _prompt_text(model, messages, template_kwargs={"model_identity": "You are Rock."})
    assert text.startswith("<|start|>system<|message|>You are Rock.\n")


def test_chat_template_kwargs_switch_thinking_off_in_other_templates(model):
    """chat_template_kwargs' enable_thinking (vLLM's way to turn Qwen3's thinking off) reaches templates
    that read it, as the request's own thinking setting would."""
    qwen = HarmonyModel()
    qwen.chat_template = ChatTemplate(THINKING_TEMPLATE)
    messages = [{"role": "user", "content": "Hi"}]
    text = _prompt_text(qwen, messages, template_kwargs={"enable_thinking": False})
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    prompt = chat_prompt(qwen, messages)
    assert prompt.thinking_open and not prompt.harmony


def test_a_prefill_continues_the_final_message(model):
    """Anthropic's trailing assistant message: the reply continues it as the answer, which a reply outside
    any message is."""
    text = _prompt_text(model, [{"role": "user", "content": "Hi"}], prefill="Sure,")
    assert text.endswith(
        "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Sure,"
    )
    assert _parse(" here it is.<|return|>")[:3] == ("", "here it is.", [])


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def test_reasoning_and_calls_reach_the_fields_the_template_reads(model):
    """reasoning_content becomes the template's ``thinking`` (rendered before the call while no final
    answer follows), and each of several calls is rendered with its own result."""
    messages = [
        {"role": "user", "content": "Weather in Paris and news?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "reasoning_content": "Two tools.",
            "tool_calls": [_call("a", "get_weather", {"city": "Paris"}), _call("b", "search", {"q": "news"})],
        },
        {"role": "tool", "tool_call_id": "b", "name": "search", "content": "no news"},
        {"role": "tool", "tool_call_id": "a", "name": "get_weather", "content": '{"c": 21}'},
    ]
    text = _prompt_text(model, messages, tools=[WEATHER_TOOL, SEARCH_TOOL])
    tail = text[text.index("<|start|>user") :]
    assert tail == (
        "<|start|>user<|message|>Weather in Paris and news?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Two tools.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"c\\": 21}"<|end|>'
        "<|start|>assistant to=functions.search<|channel|>commentary json<|message|>"
        '{"q": "news"}<|call|>'
        '<|start|>functions.search to=assistant<|channel|>commentary<|message|>"no news"<|end|>'
        "<|start|>assistant"
    )
    # a later final answer: the reasoning of earlier turns is dropped, as gpt-oss was trained
    later = [*messages, {"role": "assistant", "content": "21C, no news.", "reasoning_content": "Done."}]
    later.append({"role": "user", "content": "Thanks"})
    text = _prompt_text(model, later, tools=[WEATHER_TOOL, SEARCH_TOOL])
    assert "Two tools." not in text and "Done." not in text
    assert "<|start|>assistant<|channel|>final<|message|>21C, no news.<|end|><|start|>user" in text


def test_harmony_messages_keep_what_they_do_not_need_to_change():
    plain = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert harmony_messages(plain) == plain
    call = {"role": "assistant", "content": "pre", "tool_calls": [_call("x", "search", {})]}
    assert harmony_messages([call]) == [call]  # no reasoning: the content is the call's analysis


def test_rendering_matches_transformers(model):
    """Oracle: transformers' renderer on the same template and the messages as the server passes them."""
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    messages = harmony_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Use the tool.",
                "tool_calls": [_call("a", "get_weather", {"city": "Zürich"})],
            },
            {"role": "tool", "tool_call_id": "a", "content": '{"temp_c": 3}'},
        ]
    )
    kwargs = {"tools": [WEATHER_TOOL], "reasoning_effort": "medium"}
    ours = model.chat_template.render(messages, **kwargs)
    theirs = render([messages], chat_template=TEMPLATE, add_generation_prompt=True, **kwargs)[0][0]
    assert ours == theirs


# -- the plans' guides ---------------------------------------------------------------------------------


def _follow(guide, tok: Tokenizer, text: str) -> list[int]:
    """The tokens of ``text``, each checked against ``guide`` as the sampler would be."""
    tokens: list[int] = []
    for t in tok.encode(text, add_special=False):
        assert guide.forced(tokens) in (None, t) and guide.allows(tokens, t), (tok.decode(tokens), t)
        tokens.append(t)
    return tokens


def test_forced_call_writes_the_name_under_the_grammar_and_ends_with_call(model):
    tok = model.tokenizer
    messages = [{"role": "user", "content": "Weather?"}]
    prompt = chat_prompt(model, messages, tools=[WEATHER_TOOL, SEARCH_TOOL], tool_choice="get_weather")
    assert tok.decode(prompt.ids).endswith("<|start|>assistant<|channel|>commentary to=functions.")
    plan = plan_chat(model, prompt, max_tokens=64)
    assert isinstance(plan.guide, GrammarGuide)
    tokens = _follow(plan.guide, tok, 'get_weather <|constrain|>json<|message|>{"city": "Oslo"}')
    assert plan.guide.forced(tokens) == tok.token_to_id("<|call|>")
    refused = tok.encode('search <|constrain|>json<|message|>{"q": "x"}', add_special=False)
    assert not plan.guide.allows([], refused[0])  # only the named tool
    parser = plan.parser()
    parser.feed(tok.decode(tokens))
    parser.finish()
    assert [(c.name, c.arguments) for c in parser.calls] == [("get_weather", {"city": "Oslo"})]


def test_json_answer_is_kept_to_the_schema_after_the_analysis(model):
    tok = model.tokenizer
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    messages = [{"role": "user", "content": "17 + 25?"}]
    prompt = chat_prompt(model, messages, json_schema=schema, json_mode=True)

    def plan():
        return plan_chat(model, prompt, response_format="json_schema", json_schema=schema, max_tokens=256)

    assert isinstance(plan().guide, GrammarGuide)
    reply = (
        "<|channel|>analysis<|message|>Add: 42. Answer as {n}.<|end|>"
        '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{"n": 42}'
    )
    first = plan()
    tokens = _follow(first.guide, tok, reply)
    assert first.guide.forced(tokens) == tok.eos_id  # <|return|>
    _follow(plan().guide, tok, '<|channel|>final<|message|>{"n": 1}')  # no analysis
    guide = plan().guide
    head = _follow(
        guide, tok, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>"
    )
    assert not guide.allows(head, tok.encode("Sure", add_special=False)[0])
    assert not plan().guide.allows([], tok.encode("{", add_special=False)[0])  # the answer is a message
    parser = first.parser()
    parser.feed(tok.decode(tokens))
    parser.finish()
    assert parser.thinking == "Add: 42. Answer as {n}." and json.loads(parser.text) == {"n": 42}
    gen = SimpleNamespace(end_token=tok.eos_id)
    assert first.json_problem(parser.text, gen) is None
    assert "does not match the schema" in str(first.json_problem('{"n": "x"}', gen))
    # with tools the model may call one instead: no grammar, the answer is checked afterwards
    prompt = chat_prompt(model, messages, tools=[WEATHER_TOOL], json_schema=schema, json_mode=True)
    assert plan_chat(model, prompt, response_format="json_schema", json_schema=schema).guide is None


@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL]])
def test_thinking_budget_closes_the_analysis_message(model, tools):
    tok = model.tokenizer
    prompt = chat_prompt(model, [{"role": "user", "content": "Think."}], tools=tools)

    def guide():
        plan = plan_chat(model, prompt, thinking_budget=5, max_tokens=200)
        assert isinstance(plan.guide, ThinkingBudget) and plan.guide.budget == 5
        return plan.guide

    budget = guide()
    tokens = _follow(budget, tok, "<|channel|>analysis<|message|>abcde")
    while (forced := budget.forced(tokens)) is not None:
        tokens.append(forced)
    closing = "<|end|><|start|>assistant" + ("<|channel|>final<|message|>" if tools is None else "")
    assert tok.decode(tokens) == "<|channel|>analysis<|message|>abcde" + closing
    # a model that ends its analysis itself is left alone
    budget = guide()
    tokens = _follow(
        budget, tok, "<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>final"
    )
    assert budget.forced(tokens) is None
