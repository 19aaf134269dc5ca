"""From an API request to what the engine runs: the prompt tokens, the generation options, the token guide
(thinking budget or JSON) and how to read the reply. Shared by the OpenAI and Anthropic endpoints, which
first bring their requests to the chat template's form: messages as ``{"role", "content", "tool_calls",
"tool_call_id", "reasoning_content"}`` dicts and tools as OpenAI function definitions.

gpt-oss's templates write OpenAI's harmony format (:func:`is_harmony`): the conversation is brought to the
fields its template reads (:func:`harmony_messages`), a forced call, JSON output and the thinking budget use
its channels, and :class:`.reply.HarmonyParser` reads the reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..chat import ChatTemplateError
from ..errors import ImageError
from ..model import SAMPLING_DEFAULTS
from ..prompt_cache import chat_boundaries
from ..sampling import SamplingParams
from ..vision import ImageSpan, render_with_images, split_images
from .api_error import APIError
from .grammar import JSON_LAYOUT, GrammarGuide, json_grammar, text_grammar
from .reply import HarmonyParser, ReplyParser
from .structured import json_instruction, parse_json_reply, schema_errors
from .thinking import ThinkingBudget, think_tags

if TYPE_CHECKING:
    from ..generation import Generation, TokenGuide
    from ..model import Model

__all__ = [
    "HARMONY_EFFORTS",
    "ChatPrompt",
    "Plan",
    "chat_prompt",
    "check_sampling",
    "fit_max_tokens",
    "grammar_guide",
    "harmony_json_grammar",
    "harmony_messages",
    "is_harmony",
    "plan_chat",
    "stop_sequence",
    "tool_call_grammar",
    "tool_call_prefix",
]

# The reasoning efforts gpt-oss knows (its system prompt's "Reasoning: ..." line).
HARMONY_EFFORTS = ("low", "medium", "high")
# A harmony reply's thinking: the analysis message, whose end a thinking budget forces.
HARMONY_ANALYSIS = ("<|channel|>analysis<|message|>", "<|end|>")
# Variables a request's chat_template_kwargs may not set: the renderer's own.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "template", "n_images"}
)


@dataclass
class ChatPrompt:
    """A rendered conversation: its token ids and how the reply will begin."""

    ids: list[int]
    tool_names: list[str] | None  # the tools the template was given, whose calls are parsed; None: none
    think_tags: tuple[str, str] | None
    thinking_open: bool  # the prompt ends inside a thinking block
    reply_prefix: str  # the forced start of a tool call, already in the prompt
    reply_grammar: str | None = None  # with reply_prefix: the rest of the call (tool_call_grammar)
    harmony: bool = False  # the template writes the harmony format (gpt-oss)
    images: list[ImageSpan] = field(default_factory=list)  # the prompt's images (Model.start's images=)
    boundaries: list[int] = field(default_factory=list)  # prompt cache snapshots (Model.start's boundaries=)


@dataclass
class Plan:
    """A chat request ready to run: the rendered ``chat``, :meth:`regolith.Model.start` ``options``
    (max_tokens included), the ``guide``, and what the reply is checked against."""

    chat: ChatPrompt
    options: dict[str, Any]
    guide: TokenGuide | None = None
    json_schema: Mapping[str, Any] | None = None
    json_mode: bool = False
    parallel_tool_calls: bool = True

    @property
    def prompt(self) -> list[int]:
        """The prompt token ids."""
        return self.chat.ids

    def json_problem(self, text: str, gen: Generation | None) -> APIError | None:
        """The error for a reply that ended at the model's end token and is not the JSON asked for, or None
        (replies cut short by max_tokens or a stop string are returned as they are)."""
        if not self.json_mode or gen is None or gen.end_token is None:
            return None
        try:
            value = parse_json_reply(text)
        except ValueError as e:
            problem = str(e)
        else:
            errors = schema_errors(value, self.json_schema) if self.json_schema is not None else []
            if not errors:
                return None
            problem = "the reply does not match the schema: " + "; ".join(errors)
        return APIError(
            500,
            f"the model's reply is not the JSON asked for ({problem}); the reply was: {text[:300]!r}",
            kind="server",
            param="response_format",
            code="invalid_model_output",
        )

    def parser(self) -> ReplyParser | HarmonyParser:
        """A parser for the reply: thinking, text and tool calls."""
        chat = self.chat
        if chat.harmony:
            return HarmonyParser(tool_names=chat.tool_names, prefix=chat.reply_prefix)
        return ReplyParser(
            think_tags=None if chat.reply_prefix else chat.think_tags,
            thinking=chat.thinking_open,
            tool_names=chat.tool_names,
            prefix=chat.reply_prefix,
        )


def check_sampling(model: Model, sampling: Mapping[str, Any]) -> None:
    """Raise :class:`APIError` (422) for sampling values :class:`regolith.SamplingParams` rejects."""
    try:
        params = SamplingParams(**{**SAMPLING_DEFAULTS, **sampling})
    except (ValueError, TypeError) as e:
        raise APIError(422, str(e)) from None
    vocab = model.config["vocab_size"]
    bad = [t for t in params.logit_bias if t >= vocab]
    if bad:
        raise APIError(
            422, f"logit_bias names token {bad[0]}, outside the vocabulary of {vocab}", param="logit_bias"
        )


def fit_max_tokens(model: Model, n_prompt: int, requested: int | None, default: int | None) -> int:
    """``requested`` (else ``default``, else the rest of the context) clamped to the room the context leaves
    after the prompt. Raises :class:`APIError` (400) when the prompt leaves no room."""
    room = model.n_ctx - n_prompt
    if room < 1:
        raise APIError(
            400,
            f"the prompt has {n_prompt} tokens; the context holds {model.n_ctx} (start the server with a "
            "larger --ctx, or shorten the conversation)",
            code="context_length_exceeded",
        )
    want = requested if requested is not None else default if default is not None else room
    return max(0, min(want, room))


def is_harmony(template_source: str) -> bool:
    """Whether a chat template writes OpenAI's harmony format (gpt-oss): messages on ``<|channel|>`` s."""
    return "<|channel|>" in template_source and "<|message|>" in template_source


def _call_format(template_source: str) -> tuple[str, str, str]:
    """(opening up to the function's name, what follows the name up to the arguments, closing) of a tool
    call in the model's format: harmony's message to ``functions.NAME``, Hermes / Qwen ``<tool_call>``,
    Mistral ``[TOOL_CALLS][...]`` or ``[TOOL_CALLS]NAME[ARGS]``, else a bare JSON object (Llama 3 names its
    arguments ``parameters``)."""
    if is_harmony(template_source):
        return "<|channel|>commentary to=functions.", " <|constrain|>json<|message|>", ""
    if "<tool_call>" in template_source:
        return '<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>"
    if "[TOOL_CALLS]" in template_source:
        if "[ARGS]" in template_source:
            return "[TOOL_CALLS]", "[ARGS]", ""
        return '[TOOL_CALLS][{"name": "', '", "arguments": ', "}]"
    key = "parameters" if '"parameters"' in template_source else "arguments"
    return '{"name": "', f'", "{key}": ', "}"


def tool_call_prefix(template_source: str) -> str:
    """The opening of a tool call in the model's format, up to the function's name: appended to the prompt
    to force a call (the rest, the name included, is :func:`tool_call_grammar`'s)."""
    return _call_format(template_source)[0]


def tool_call_grammar(template_source: str, tools: list[dict[str, Any]]) -> str:
    """The Lark grammar (llguidance's) of what follows :func:`tool_call_prefix`: the rest of one call to one
    of ``tools`` (the offered ones, or the one a tool_choice names), its arguments matching the tool's JSON
    schema, and the call's closing. The model writes the name under the grammar rather than finding it in its
    prompt: a head cut where the prompt ends tokenizes unlike what the model writes itself, and a small model
    can lose its way after it (the bundled demo model then loops inside the first string argument)."""
    _, after_name, close = _call_format(template_source)

    def call(tool: dict[str, Any]) -> str:
        fn = tool["function"]
        schema = {**(fn.get("parameters") or {"type": "object"}), "x-guidance": JSON_LAYOUT}
        head = fn["name"] + after_name
        parts = [json.dumps(head, ensure_ascii=False), "%json " + json.dumps(schema, ensure_ascii=False)]
        if close:
            parts.append(json.dumps(close))
        return " ".join(parts)

    return "start: " + " | ".join(call(t) for t in tools)


def harmony_json_grammar(schema: Mapping[str, Any] | None) -> str:
    """The Lark grammar (llguidance's) of a harmony reply whose answer is JSON matching ``schema`` (None: any
    JSON object): an analysis message, if the model thinks, then the final message's JSON."""
    body = {**(schema if schema is not None else {"type": "object"}), "x-guidance": JSON_LAYOUT}
    return (
        "start: analysis? final\n"
        'analysis: "<|channel|>analysis<|message|>" reasoning "<|start|>assistant"\n'
        'reasoning[stop="<|end|>"]: /(?s:.*)/\n'
        'final: "<|channel|>final" (" " "<|constrain|>"? "json")? "<|message|>" %json '
        + json.dumps(body, ensure_ascii=False)
    )


def harmony_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as gpt-oss's template reads it: an assistant message's ``reasoning_content`` as
    ``thinking`` (the template refuses both content and thinking beside a tool call: the content is dropped,
    as llama.cpp does), and one tool call per assistant message, each followed by its result (the template
    renders only a message's first call and names each result after the latest call)."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m["role"] != "assistant":
            out.append(m)
            continue
        m = dict(m)
        if "reasoning_content" in m:
            reasoning = m.pop("reasoning_content")
            if reasoning and "thinking" not in m:
                m["thinking"] = reasoning
        calls = m.get("tool_calls") or []
        if not calls:
            out.append(m)
            continue
        if m.get("thinking"):
            m["content"] = ""
        results = []
        while i < len(messages) and messages[i]["role"] == "tool":
            results.append(messages[i])
            i += 1
        for k, call in enumerate(calls):
            out.append(
                {**m, "tool_calls": [call]}
                if k == 0
                else {"role": "assistant", "content": "", "tool_calls": [call]}
            )
            out += [r for r in results if r.get("tool_call_id") == call.get("id")]
            results = [r for r in results if r.get("tool_call_id") != call.get("id")]
        out += results  # results of no call of the message: after its last call
    return out


def _harmony_request(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    thinking: bool | None,
    reasoning_effort: str | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str | None]:
    """(messages, tools, reasoning effort) for gpt-oss's template. The model always reasons: no thinking
    asks for the least ('low'); an effort it does not know is a 400. Tools without a description get an
    empty one (the template prints it)."""
    if reasoning_effort is None and thinking is False:
        reasoning_effort = "low"
    if reasoning_effort is not None and reasoning_effort not in HARMONY_EFFORTS:
        raise APIError(
            400,
            f"reasoning effort {reasoning_effort!r} is not one gpt-oss knows: use one of "
            + ", ".join(HARMONY_EFFORTS),
            param="reasoning_effort",
        )
    if tools is not None:
        tools = [{**t, "function": {"description": "", **t["function"]}} for t in tools]
    return harmony_messages(messages), tools, reasoning_effort


def _template_variables(
    template_kwargs: Mapping[str, Any] | None, thinking: bool | None, reasoning_effort: str | None
) -> tuple[dict[str, Any], bool | None, str | None]:
    """(extra template variables, thinking, reasoning effort) from a request's ``chat_template_kwargs``,
    whose ``enable_thinking`` and ``reasoning_effort`` stand in for the request's own when it sets none."""
    variables = dict(template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(variables))
    if reserved:
        raise APIError(
            400, f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs"
        )
    effort = variables.pop("reasoning_effort", None)
    if reasoning_effort is None and effort is not None:
        if not isinstance(effort, str):
            raise APIError(
                400, "chat_template_kwargs.reasoning_effort must be a string", param="chat_template_kwargs"
            )
        reasoning_effort = effort
    enable = variables.pop("enable_thinking", None)
    if thinking is None and isinstance(enable, bool):
        thinking = enable
    return variables, thinking, reasoning_effort


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = (first.get("content") or "") + "\n\n" + text
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def chat_prompt(
    model: Model,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | None = None,
    json_schema: Mapping[str, Any] | None = None,
    json_mode: bool = False,
    thinking: bool | None = None,
    reasoning_effort: str | None = None,
    prefill: str = "",
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """Render and tokenize a conversation.

    ``tool_choice``: 'auto' (default), 'none', 'required', or a tool's name; 'required' and a name force the
    reply to begin a tool call in the model's format. ``json_mode`` asks for JSON (matching ``json_schema``)
    in the system prompt. ``thinking``: ask the template to think or not (None: its default). ``prefill`` is
    the start of the reply (Anthropic's trailing assistant message). ``template_kwargs`` are more template
    variables (a request's ``chat_template_kwargs``). Image content parts (``image`` or ``image_url``) become
    the model's image tokens. Raises :class:`APIError` (400 for an unusable image or a model without vision
    support, a harmony template's unknown reasoning effort, or a reserved template variable).
    """
    template = model.chat_template
    harmony = is_harmony(template.source)
    variables, thinking, reasoning_effort = _template_variables(template_kwargs, thinking, reasoning_effort)
    choice = tool_choice or "auto"
    offered = [t["function"]["name"] for t in tools or []]
    if choice not in ("auto", "none", "required") and choice not in offered:
        raise APIError(
            400, f"tool_choice names the tool {choice!r}, which is not among the tools", param="tool_choice"
        )
    if choice == "none" or not tools:
        tools = None
    elif choice not in ("auto", "required"):
        tools = [t for t in tools if t["function"]["name"] == choice]
    if json_mode:
        messages = _with_system_text(messages, json_instruction(json_schema))
    if harmony:
        messages, tools, reasoning_effort = _harmony_request(messages, tools, thinking, reasoning_effort)
    if thinking is not None and "enable_thinking" in template.source:
        variables["enable_thinking"] = thinking
    messages, sources = split_images(messages)
    try:
        text = render_with_images(
            template, messages, len(sources), tools=tools, reasoning_effort=reasoning_effort, **variables
        )
    except ChatTemplateError as e:
        raise APIError(
            400, f"the conversation does not fit the model's chat template: {e}", param="messages"
        ) from None
    tags = None if harmony else think_tags(template)
    reply_prefix, reply_grammar = "", None
    if tools is not None and choice != "auto":  # tools: the named one alone, when a name is forced
        reply_prefix = tool_call_prefix(template.source)
        reply_grammar = tool_call_grammar(template.source, tools)
    if harmony and prefill:  # the reply continues the answer: a final message (the analysis is skipped)
        prefill = (
            "<|channel|>final<|message|>" + prefill + ("<|end|><|start|>assistant" if reply_prefix else "")
        )
    text += prefill + reply_prefix
    names = None if tools is None else [t["function"]["name"] for t in tools]
    images: list[ImageSpan] = []
    if sources:
        try:
            ids, images = model.image_prompt(text, sources)
        except ImageError as e:
            raise APIError(400, str(e), param="messages") from None
    else:
        ids = model.tokenize_chat(text)
    # Where a prompt cache keeps states: the end of the system prompt and of the turns before the last, so
    # requests that share a system prompt, or the next turn of a conversation, evaluate only the rest.
    boundaries = (
        []
        if model.prompt_cache is None or sources
        else chat_boundaries(
            model, messages, ids, tools=tools, reasoning_effort=reasoning_effort, **variables
        )
    )
    return ChatPrompt(
        ids=ids,
        tool_names=names,
        think_tags=tags,
        thinking_open=tags is not None and not reply_prefix and text.rstrip().endswith(tags[0]),
        reply_prefix=reply_prefix,
        reply_grammar=reply_grammar,
        harmony=harmony,
        images=images,
        boundaries=boundaries,
    )


def plan_chat(
    model: Model,
    prompt: ChatPrompt,
    *,
    response_format: str | None = None,
    json_schema: Mapping[str, Any] | None = None,
    thinking_budget: int | None = None,
    parallel_tool_calls: bool = True,
    max_tokens: int | None = None,
    default_max_tokens: int | None = None,
    stop: Sequence[str] = (),
    sampling: Mapping[str, Any] | None = None,
    antislop: bool = False,
    grammar: str | None = None,
) -> Plan:
    """Plan the reply to ``prompt``.

    ``response_format``: None, 'json_object' or 'json_schema' (with ``json_schema``); the reply is kept to a
    JSON object (matching the schema) token by token (:class:`.grammar.GrammarGuide`) when the model neither
    thinks in ``<think>`` tags nor may call tools (a harmony reply's final message is kept to it, after the
    analysis). ``thinking_budget`` caps the thinking block (harmony: the analysis message). ``grammar`` (GBNF
    or Lark) constrains the whole reply instead. ``sampling`` are :class:`regolith.SamplingParams` fields.
    Raises :class:`APIError`.
    """
    sampling = dict(sampling or {})
    check_sampling(model, sampling)
    if thinking_budget is not None and prompt.reply_prefix:
        raise APIError(
            400, "thinking cannot be combined with a tool_choice that forces a tool call", param="tool_choice"
        )
    n_max = fit_max_tokens(model, len(prompt.ids), max_tokens, default_max_tokens)
    json_mode = response_format in ("json_object", "json_schema")
    tags = prompt.think_tags
    guide: TokenGuide | None = None
    if grammar is not None:
        if json_mode or prompt.reply_prefix or thinking_budget is not None:
            raise APIError(
                400,
                "grammar cannot be combined with response_format, a forced tool_choice or a thinking budget",
                param="grammar",
            )
        guide = grammar_guide(model, grammar)
    elif prompt.reply_grammar is not None:
        reply_grammar = prompt.reply_grammar
        # a harmony call ends with <|call|>, which ends the reply too
        end = model.tokenizer.token_to_id("<|call|>") if prompt.harmony else None
        guide = _guided(model, lambda: text_grammar(reply_grammar), "tools", end=end)
    elif thinking_budget is not None and prompt.harmony:
        # the analysis message ends, and the final one begins (with tools: a message the model may address
        # to a tool)
        closing = "<|end|><|start|>assistant" + ("" if prompt.tool_names else "<|channel|>final<|message|>")
        guide = ThinkingBudget(
            model.tokenizer,
            thinking_budget,
            max_tokens=n_max,
            tags=HARMONY_ANALYSIS,
            open_at_start=False,
            closing=closing,
        )
    elif thinking_budget is not None and tags is not None:
        guide = ThinkingBudget(
            model.tokenizer, thinking_budget, max_tokens=n_max, tags=tags, open_at_start=prompt.thinking_open
        )
    elif json_mode and prompt.tool_names is None and prompt.harmony:
        guide = _guided(model, lambda: text_grammar(harmony_json_grammar(json_schema)), "response_format")
    elif json_mode and prompt.tool_names is None and tags is None:
        guide = _guided(model, lambda: json_grammar(json_schema), "response_format")
    return Plan(
        chat=prompt,
        options={
            "max_tokens": n_max,
            "stop": list(stop),
            "antislop": antislop,
            **({"images": prompt.images} if prompt.images else {}),
            **({"boundaries": prompt.boundaries} if prompt.boundaries else {}),
            **sampling,
        },
        guide=guide,
        json_schema=json_schema,
        json_mode=json_mode,
        parallel_tool_calls=parallel_tool_calls,
    )


def _guided(model: Model, grammar: Callable[[], str], param: str, *, end: int | None = None) -> GrammarGuide:
    """A guide for the grammar ``grammar()`` makes, ending the reply with ``end`` (None: the model's end
    token); a grammar that cannot be used is a 400 for the request field ``param``."""
    tok = model.tokenizer
    if end is None:
        end = tok.eos_id if tok.eos_id in tok.eog_ids else min(tok.eog_ids)
    try:
        return GrammarGuide(tok, grammar(), n_vocab=model.config["vocab_size"], end=end)
    except ValueError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def grammar_guide(model: Model, grammar: str) -> TokenGuide:
    """The guide that keeps a reply inside ``grammar`` (a request's GBNF or Lark ``grammar`` field). Raises
    :class:`APIError` (400) for a grammar that cannot be used."""
    return _guided(model, lambda: text_grammar(grammar), "grammar")


def stop_sequence(model: Model, gen: Generation, stops: Sequence[str]) -> str | None:
    """The stop string that ended ``gen``, or None if none did."""
    if gen.finish_reason != "stop" or gen.end_token is not None or not stops:
        return None
    tok = model.tokenizer
    raw = b"".join(tok.token_bytes(t, special=False) for t in gen.tokens).decode("utf-8", "replace")
    rest = raw[len(gen.text) :]
    return next((s for s in stops if rest.startswith(s)), None)
