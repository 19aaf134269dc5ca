"""A conversation that keeps its own window, so each turn prefills only its new tokens."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import state as _state
from ._atomic import atomic_path
from .chat import Message
from .errors import SessionError
from .prompt_cache import chat_boundaries

if TYPE_CHECKING:
    from .generation import Generation
    from .model import Model

__all__ = ["Session"]


class Session:
    """A conversation with a model.

    Each :meth:`send` renders the whole conversation through the chat template; the session's window already
    holds the earlier turns, so only the tokens after the longest shared prefix are evaluated (the new user
    message and the template's framing). ``defaults`` are keywords for :meth:`regolith.Model.generate`
    (temperature, max_tokens, antislop, ...) used by every turn unless a turn overrides them.
    """

    def __init__(
        self,
        model: Model,
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_ctx: int | None = None,
        **defaults: Any,
    ):
        self.model = model
        self.window = model.window(max_ctx)
        self.tools = list(tools) if tools else None
        self.defaults = defaults
        self.messages: list[dict[str, Any]] = []
        self._system = system
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.messages = [{"role": "system", "content": self._system}] if self._system else []
        self._transcript: list[int] = []  # the tokens the model has seen and written, end token included

    def send(self, content: str, *, stream: bool = False, **kwargs: Any) -> str | Generation:
        """Add a user message and reply to it. Returns the reply, or a :class:`regolith.Generation` of text
        pieces with ``stream=True``; the reply joins the conversation when it ends (also if cancelled)."""
        if not isinstance(content, str):
            raise TypeError(f"content must be a string, got {type(content).__name__}")
        return self._reply({"role": "user", "content": content}, stream=stream, **kwargs)

    def _prompt(self, conversation: list[dict[str, Any]], reasoning_effort: str | None) -> list[int]:
        """The conversation's prompt tokens. Where the rendered chat begins with the text of the tokens seen so
        far (the usual case: templates append turns), those exact tokens are kept and only the rest is
        tokenized, so the window reuses all it holds even when the reply would tokenize differently as text."""
        model = self.model
        text = model.chat_template.render(conversation, tools=self.tools, reasoning_effort=reasoning_effort)
        if self._transcript:
            seen = model.detokenize(self._transcript)
            if text.startswith(seen):
                return self._transcript + model.tokenize(text[len(seen) :], add_special=False)
        return model.tokenize_chat(text)

    def _reply(self, message: Message, *, stream: bool, **kwargs: Any) -> str | Generation:
        options = {**self.defaults, **kwargs}
        conversation = [*self.messages, dict(message)]
        effort = options.pop("reasoning_effort", None)
        prompt = self._prompt(conversation, effort)

        def record(gen: Generation) -> None:
            self.messages = [*conversation, {"role": "assistant", "content": gen.text}]
            # A stop string cut the text short of the tokens: the next turn retokenizes the whole chat.
            exact = gen.text == self.model.detokenize(gen.tokens)
            end = [gen.end_token] if gen.end_token is not None else []
            self._transcript = [*gen.prompt, *gen.tokens, *end] if exact else []

        gen = self.model.start(
            prompt,
            window=self.window,
            on_finish=record,
            boundaries=self._boundaries(prompt, effort),
            **options,
        )
        return gen if stream else "".join(gen)

    def _boundaries(self, prompt: list[int], reasoning_effort: str | None) -> list[int]:
        """Where a prompt cache should snapshot this turn's prompt (rendered with ``reasoning_effort``): the end
        of the system prompt and of the previous turn."""
        if self.model.prompt_cache is None:
            return []
        marks = (
            chat_boundaries(
                self.model, self.messages[:1], prompt, tools=self.tools, reasoning_effort=reasoning_effort
            )
            if self._system
            else []
        )
        n = len(self._transcript)
        if n and prompt[:n] == self._transcript:
            marks.append(n)
        return marks

    def save(self, path: str | os.PathLike[str]) -> _state.IoStats:
        """Write the conversation (system prompt, tools, messages, exact tokens) and the window's state to one
        file, atomically; :meth:`load` continues it where it stopped. Returns the bytes written and the time."""
        meta = {
            "regolith_session": 1,
            "system": self._system,
            "tools": self.tools,
            "messages": self.messages,
            "transcript": self._transcript,
        }
        return _state.save_window(self.window, path, meta=json.dumps(meta, ensure_ascii=False).encode())

    @classmethod
    def load(
        cls, model: Model, path: str | os.PathLike[str], *, max_ctx: int | None = None, **defaults: Any
    ) -> Session:
        """A session continuing the one :meth:`save` wrote to ``path``, on ``model`` (the same model file).
        ``max_ctx`` and ``defaults`` are as for :class:`Session`.

        Raises :class:`regolith.SessionError` for a file that is not a saved session of this model, or is
        truncated or corrupt."""
        head = _state.read_header(path)
        try:
            meta = json.loads(head.meta.decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("regolith_session") != 1:
                raise ValueError("no session record")
            system, tools, messages = meta["system"], meta["tools"], meta["messages"]
            transcript = [int(t) for t in meta["transcript"]]
        except (ValueError, KeyError, TypeError) as err:
            raise SessionError(f"{os.fspath(path)} is a window state, not a saved session ({err})") from None
        session = cls(model, system=system, tools=tools, max_ctx=max_ctx, **defaults)
        _state.load_window(session.window, path, header=head)
        session.messages = messages
        session._transcript = transcript
        return session

    def save_transcript(self, path: str | os.PathLike[str]) -> None:
        """Write the conversation as JSON (``{"messages": [...]}``), atomically."""
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            json.dump({"messages": self.messages}, f, ensure_ascii=False, indent=2)
