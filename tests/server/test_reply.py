"""Reading replies: tool calls in each model family's format, thinking blocks, and the streaming parser, whose
released pieces must always join to what the whole reply parses to."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from regolith.server.reply import ReplyParser, parse_tool_calls

NAMES = {"get_weather", "search"}
WEATHER = {"name": "get_weather", "arguments": {"city": "Paris"}}


def _calls(text: str, names=NAMES) -> tuple[str, list[tuple[str, dict]]]:
    content, calls = parse_tool_calls(text, names)
    return content, [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        # Hermes / Qwen2.5, with text before and a JSON-string arguments variant
        (f"<tool_call>\n{json.dumps(WEATHER)}\n</tool_call>", "", [("get_weather", {"city": "Paris"})]),
        (
            (
                'Let me look.\n<tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}\n</tool_call>'
                f"\n<tool_call>{json.dumps(WEATHER)}</tool_call>"
            ),
            "Let me look.",
            [("search", {"q": "x"}), ("get_weather", {"city": "Paris"})],
        ),
        # an unclosed final tag (generation stopped at the end-of-turn token)
        (f"<tool_call>\n{json.dumps(WEATHER)}\n", "", [("get_weather", {"city": "Paris"})]),
        # Qwen3-Coder XML, inside and outside the tags; values parse as JSON where they can
        (
            (
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
            ),
            "",
            [("get_weather", {"city": "Paris", "days": 3})],
        ),
        (
            "<function=search>\n<parameter=q>\nrust\n</parameter>\n</function>",
            "",
            [("search", {"q": "rust"})],
        ),
        # Mistral: a JSON list, and the NAME[ARGS] form
        (f"[TOOL_CALLS][{json.dumps(WEATHER)}]", "", [("get_weather", {"city": "Paris"})]),
        (
            '[TOOL_CALLS]search[ARGS]{"q": 1}[TOOL_CALLS]get_weather[ARGS]{}',
            "",
            [("search", {"q": 1}), ("get_weather", {})],
        ),
        # Llama 3.x
        (
            '<|python_tag|>{"name": "search", "parameters": {"q": "a"}}; {"name": "get_weather", "parameters": {}}',
            "",
            [("search", {"q": "a"}), ("get_weather", {})],
        ),
        # bare JSON (small models), a list of calls, a ```json block; text after the calls stays content
        (json.dumps(WEATHER), "", [("get_weather", {"city": "Paris"})]),
        (f"  {json.dumps([WEATHER, WEATHER])}", "", [("get_weather", {"city": "Paris"})] * 2),
        (f"```json\n{json.dumps(WEATHER)}\n```", "", [("get_weather", {"city": "Paris"})]),
        (f'{json.dumps(WEATHER)}\n{{"temp": 21}}', '{"temp": 21}', [("get_weather", {"city": "Paris"})]),
        # not calls: unknown tool in bare JSON, prose, JSON without a name, arguments that are not an object
        ('{"name": "other", "arguments": {}}', '{"name": "other", "arguments": {}}', []),
        ("The weather is fine.", "The weather is fine.", []),
        ('{"city": "Paris"}', '{"city": "Paris"}', []),
        (
            '<tool_call>{"name": "search", "arguments": 3}</tool_call>',
            '<tool_call>{"name": "search", "arguments": 3}</tool_call>',
            [],
        ),
        ("a <tool_call> b", "a <tool_call> b", []),
    ],
)
def test_tool_call_formats(text, content, calls):
    assert _calls(text) == (content, calls)


def _stream(parser: ReplyParser, pieces: list[str]) -> list[tuple[str, str]]:
    out = []
    for p in pieces:
        out += parser.feed(p)
    return out + parser.finish()


def _joined(events: list[tuple[str, str]], kind: str) -> str:
    return "".join(t for k, t in events if k == kind)


def test_thinking_split_and_tool_call_after_it():
    reply = '<think>\nThe user wants weather.\n</think>\n\nChecking.<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    parser = ReplyParser(think_tags=("<think>", "</think>"), tool_names=NAMES)
    events = _stream(parser, list(reply))
    assert _joined(events, "thinking") == "The user wants weather.\n" == parser.thinking
    assert _joined(events, "text") == "Checking." == parser.text
    assert [(c.name, c.arguments) for c in parser.calls] == [("get_weather", {})]
    # Nothing of the call was released as text while it streamed.
    assert all("tool_call" not in t for _, t in events)


def test_prompt_opened_thinking_and_a_reply_that_does_not_think():
    parser = ReplyParser(think_tags=("<think>", "</think>"), thinking=True)
    events = _stream(parser, ["I should add.", "</th", "ink>\n\n", "42"])
    assert (parser.thinking, parser.text) == ("I should add.", "42")
    assert events[0] == ("thinking", "I should add.")
    parser = ReplyParser(think_tags=("<think>", "</think>"))
    assert _stream(parser, ["<thi", "s is not a tag"]) == [("text", "<this is not a tag")]


def test_forced_prefix_is_parsed_but_not_released():
    prefix = '<tool_call>\n{"name": "search", "arguments": {'
    parser = ReplyParser(tool_names=NAMES, prefix=prefix)
    assert _stream(parser, ['"q": "x"}}', "\n</tool_call>"]) == []
    assert [(c.name, c.arguments) for c in parser.calls] == [("search", {"q": "x"})]
    parser = ReplyParser(tool_names=NAMES, prefix=prefix)
    assert _stream(parser, ["oops"]) == [("text", "oops")]  # not a call: the model's own text only


replies = st.lists(
    st.sampled_from(
        [
            "Hello",
            " world",
            "\n",
            "<",
            "tool",
            "_call>",
            "</tool_call>",
            json.dumps(WEATHER),
            "{",
            "}",
            "```json\n",
            "```",
            "<think>",
            "</think>",
            "[TOOL_CALLS]",
            "<|python_tag|>",
            "<function=search>",
            "</function>",
            " ",
        ]
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(pieces=replies, split=st.integers(1, 5), thinks=st.booleans())
@example(pieces=["<think>", "\n", "\n"], split=1, thinks=True)  # newlines after the tag, cut apart
def test_streaming_equals_parsing_the_whole_reply(pieces, split, thinks):
    """However a reply is cut into pieces, the released text and the calls are those of the whole reply."""
    reply = "".join(pieces)
    chunks = [reply[i : i + split] for i in range(0, len(reply), split)]
    tags = ("<think>", "</think>") if thinks else None
    streamed = ReplyParser(think_tags=tags, tool_names=NAMES)
    events = _stream(streamed, chunks)
    whole = ReplyParser(think_tags=tags, tool_names=NAMES)
    whole_events = _stream(whole, [reply])
    assert _joined(events, "text") == _joined(whole_events, "text") == streamed.text == whole.text
    assert _joined(events, "thinking") == whole.thinking
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in whole.calls]
    if not thinks:
        _, calls = parse_tool_calls(reply, NAMES)
        if calls:
            assert [(c.name, c.arguments) for c in whole.calls] == [(c.name, c.arguments) for c in calls]
