"""Chat templates: a model's ``tokenizer.chat_template`` rendered in jinja2's sandbox.

A GGUF's template is untrusted input, so it runs in an :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment`
with the same helpers Hugging Face templates expect (``raise_exception``, ``strftime_now``, a ``tojson`` that
keeps non-ASCII text, ``namespace``, loop controls, the ``{% generation %}`` block), so a template renders as it
does in transformers. A model without a template gets one chosen from its special tokens (Gemma turns,
ChatML, Llama 3 headers) or, failing all, a plain "User:/Assistant:" transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import RegolithError

__all__ = ["ChatTemplate", "ChatTemplateError", "Message", "fallback_template"]

Message = Mapping[str, Any]

# Templates that read these variables get them; reasoning_effort defaults to 'low' (fast answers on a laptop).
DEFAULT_REASONING_EFFORT = "low"


class ChatTemplateError(RegolithError, ValueError):
    """A chat template failed to compile or render, tried to leave the sandbox, or the messages are malformed."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; rendering keeps it."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore names, so a template cannot reach CPython internals through it."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    return env


_ENV = _environment()

_GEMMA = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

_PLAIN = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token + '\n\n' }}"
    "{% else %}{{ message['role'] | capitalize + ': ' + message['content'] + '\n\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def fallback_template(has_token: Callable[[str], bool]) -> tuple[str, str]:
    """(name, template) for a model without ``tokenizer.chat_template``, picked from its special tokens."""
    if has_token("<start_of_turn>") and has_token("<end_of_turn>"):
        return "gemma", _GEMMA
    if has_token("<|im_start|>") and has_token("<|im_end|>"):
        return "chatml", _CHATML
    if has_token("<|start_header_id|>") and has_token("<|eot_id|>"):
        return "llama3", _LLAMA3
    return "plain", _PLAIN


def _plain_data(x: Any) -> Any:
    """A copy of ``x`` made only of dicts, lists, str, numbers, bools and None, for the template to read."""
    if isinstance(x, Mapping):
        return {str(k): _plain_data(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain_data(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    raise ChatTemplateError(
        f"chat data must be JSON-like (dict, list, str, number, bool, None), got {type(x).__name__}"
    )


def _check_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"message {i} must be a dict, got {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"message {i} has no 'role' string")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatTemplateError(f"message {i}: 'content' must be a string or a list of parts")
        out.append(_plain_data(m))
    return out


class ChatTemplate:
    """A compiled chat template.

    ``source`` is jinja2 text (untrusted: it runs sandboxed); ``special`` are the variables templates read for
    special tokens (``bos_token``, ``eos_token``...).
    """

    def __init__(self, source: str, *, special: Mapping[str, str] | None = None, name: str = "model"):
        self.source = source
        self.name = name
        self.special = dict(special or {})
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"{name} chat template does not compile: {e.message} (line {e.lineno})"
            ) from None
        self.supports_reasoning_effort = "reasoning_effort" in source
        self.supports_tools = "tools" in source

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        reasoning_effort: str | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``; assistant messages may carry
        ``tool_calls``, tool results use role ``tool``), the ``tools`` JSON schemas, and extra template variables.

        ``reasoning_effort`` goes to templates that read it, defaulting to 'low'.
        Raises :class:`ChatTemplateError` when the template rejects the conversation or leaves the sandbox.
        """
        checked = _check_messages(messages)
        plain_tools = _plain_data(list(tools)) if tools else None
        variables: dict[str, Any] = dict(self.special)
        variables.update(_plain_data(kwargs))
        if self.supports_reasoning_effort:
            variables["reasoning_effort"] = reasoning_effort or DEFAULT_REASONING_EFFORT
        elif reasoning_effort is not None:
            variables["reasoning_effort"] = reasoning_effort
        try:
            return self._template.render(
                messages=checked,
                tools=plain_tools,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.SecurityError as e:
            raise ChatTemplateError(f"{self.name} chat template tried to leave the sandbox: {e}") from None
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"{self.name} chat template failed: {e}") from None
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"{self.name} chat template failed: {type(e).__name__}: {e}") from None
