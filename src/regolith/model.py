"""Loading a model and running it: :class:`Model` (weights) and :class:`Window` (one inference context)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _core
from . import gguf as _gguf
from .errors import ModelFormatError
from .models import resolve_model

__all__ = ["Model", "Window"]

_ARCHITECTURES = {
    "gemma3": _core.DenseModel,
    "qwen2": _core.DenseModel,
    "qwen4exp": _core.Qwen4ExpModel,
}


class Window:
    """One inference context: tokens in, logits out, continuing from the tokens already evaluated.

    Holds all decoding state (attention KV caches and indexer keys, Gated DeltaNet recurrent and conv
    states, PLE history). Create it with :meth:`Model.window`.
    """

    def __init__(self, model: Model, max_ctx: int):
        self._model = model
        self._w = model._core.new_window(max_ctx)

    @property
    def n_past(self) -> int:
        """Tokens evaluated so far."""
        return self._w.n_past

    @property
    def max_ctx(self) -> int:
        """The most tokens this window can hold."""
        return self._w.max_ctx

    def reset(self) -> None:
        """Forget every token: back to the state of a new window."""
        self._w.reset()

    def eval(self, tokens, *, all_logits: bool = True) -> np.ndarray:
        """Evaluate ``tokens`` after those already seen; returns float32 logits of shape (len(tokens), n_vocab),
        or (1, n_vocab) for the last token only when ``all_logits`` is False (what generation needs after a
        prompt; it skips the LM head for the other rows).

        Raises ValueError for token ids outside the vocabulary and RegolithError when the window's
        context would overflow (the window is then unchanged).
        """
        ids = np.asarray(tokens)
        if ids.ndim != 1:
            raise ValueError(f"tokens must be a 1-D sequence of ids, got shape {ids.shape}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"tokens must be integers, got {ids.dtype}")
        vocab = self._model.config["vocab_size"]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = int(ids[(ids < 0) | (ids >= vocab)][0])
            raise ValueError(f"token id {bad} is out of range for a vocabulary of {vocab}")
        return self._w.eval(np.ascontiguousarray(ids, dtype=np.int32), all_logits)


class Model:
    """A model's weights, memory-mapped from a GGUF file. Use :meth:`load`."""

    def __init__(self, core: Any, path: str):
        self._core = core
        self.path = path
        self.config: dict[str, Any] = core.config()

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Model:
        """Load a GGUF file (or a known model name; default: the default model).

        Raises :class:`regolith.GGUFError` for a malformed file and :class:`regolith.ModelFormatError` for
        an architecture regolith does not run or missing / mis-shaped tensors.
        """
        resolved = str(resolve_model(path))
        with _gguf.open(resolved) as f:
            arch = f.architecture
        if arch not in _ARCHITECTURES:
            supported = ", ".join(sorted(_ARCHITECTURES))
            raise ModelFormatError(f"architecture {arch!r} is not supported (supported: {supported})")
        return cls(_ARCHITECTURES[arch](resolved), resolved)

    def window(self, max_ctx: int | None = None) -> Window:
        """A new inference context holding up to ``max_ctx`` tokens (default: the model's context length)."""
        if max_ctx is None:
            max_ctx = self.config.get("context_length") or 4096
        if max_ctx <= 0:
            raise ValueError("max_ctx must be positive")
        return Window(self, int(max_ctx))
