"""Downloading a model from the Hugging Face Hub (``regolith pull ORG/REPO[:QUANT]``, ``Model.load("hf://...")``).

A repository holds one or more models (a quantization each, whole or split into gguf-split shards) and side
files (:mod:`regolith.model_files`). :func:`pull` picks the model of the quantization asked for (any of its
shards' names containing the tag, e.g. ``Q4_K_M``; without one the repository's only model, else ``Q4_K_M``
as llama.cpp's ``-hf`` does) and one side file of each role, checks that the disk has room for what is not
cached yet, downloads through ``huggingface_hub`` into its cache (resumable, with its progress bars) and
checks each new file's sha256 against the one the Hub lists. ``HF_ENDPOINT`` and ``HF_HUB_CACHE`` apply.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from .errors import HubError
from .model_files import SIDE_ROLES, group_sets, role_of, shard_of

__all__ = ["DEFAULT_QUANT", "HF_SCHEME", "describe", "parse_repo", "pull"]

HF_SCHEME = "hf://"
DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default
_REPO = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")
_FILE = re.compile(r"\.gguf(:|$)", re.IGNORECASE)
_CHUNK = 16 << 20


def parse_repo(spec: str) -> tuple[str, str | None] | None:
    """``(repo id, quantization or None)`` of ``ORG/REPO[:QUANT]`` (with or without ``hf://``), or None when
    ``spec`` is not of that form (a name ending in ``.gguf`` without ``hf://`` is a path, not a repository)."""
    if not spec.startswith(HF_SCHEME) and _FILE.search(spec):
        return None
    m = _REPO.match(spec.removeprefix(HF_SCHEME))
    return (m["repo"], m["quant"]) if m else None


def _has_tag(name: str, tag: str) -> bool:
    """Whether file name ``name`` carries quantization ``tag`` as a whole word (``q4_k_m`` in ``M-Q4_K_M.gguf``,
    not in ``M-Q4_K_M_L.gguf``)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])", name, re.IGNORECASE) is not None


def _choose(
    sets: dict[str, list[str]], quant: str | None, what: str, repo: str, required: bool
) -> list[str] | None:
    """The one set of ``sets`` for ``quant``: the only one, else the one whose name has the tag."""
    if not sets:
        if required:
            raise HubError(f"{repo} has no GGUF model file")
        return None
    if len(sets) == 1 and (quant is None or not required):
        return next(iter(sets.values()))
    tag = quant or (DEFAULT_QUANT if required else None)
    picked = [files for files in sets.values() if tag and _has_tag(files[0].rsplit("/", 1)[-1], tag)]
    if len(picked) == 1:
        return picked[0]
    listed = ", ".join(files[0] for files in sets.values())
    if quant and not picked:
        raise HubError(f"{repo} has no {what} for {quant!r}; it has: {listed}")
    raise HubError(f"{repo} has several {what}s ({listed}); name one with {repo}:QUANT")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _free_bytes(directory: Path) -> int:
    d = directory
    while not d.exists():
        d = d.parent
    return shutil.disk_usage(d).free


def pull(repo_id: str, quant: str | None = None, *, revision: str | None = None) -> dict[str, list[Path]]:
    """Download a model of the Hub repository ``repo_id`` and its side files (see the module docstring) into
    the Hub's cache; returns role (``"model"``, ``"ple"``, ``"mtp"``, ``"mmproj"``) -> the local paths of its
    files (a split model's shards in order), for the roles present.

    Files already cached are not downloaded again; an interrupted download resumes where it stopped. When the
    Hub cannot be reached (or ``HF_HUB_OFFLINE`` is set), the files are chosen the same way among those of the
    cached snapshot. Raises :class:`regolith.HubError` when the repository or quantization is not there (nor
    cached), the disk is too small or a downloaded file's sha256 is not the one the Hub lists (the file is
    removed).
    """
    import httpx2  # huggingface_hub's HTTP client (2.x): its errors are connection failures and HTTP statuses
    from huggingface_hub import HfApi, constants, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import LocalEntryNotFoundError

    failures = (httpx2.HTTPError, LocalEntryNotFoundError, OSError)

    try:
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except failures as e:
        cached = _cached(repo_id, quant, revision)
        if cached is None:
            raise HubError(f"cannot read {repo_id} on the Hub: {e}") from None
        return cached
    commit = info.sha
    siblings = {s.rfilename: s for s in info.siblings or ()}
    chosen = _chosen(list(siblings), quant, repo_id)

    names = [n for files in chosen.values() for n in files]
    missing = [n for n in names if not isinstance(try_to_load_from_cache(repo_id, n, revision=commit), str)]
    for n in names:
        lfs = siblings[n].lfs
        if lfs is None or not lfs.sha256:
            raise HubError(f"{repo_id}/{n}: the Hub lists no sha256 for it (not an LFS file)")
    cache = Path(constants.HF_HUB_CACHE)
    need = sum(int(siblings[n].lfs.size) for n in missing)  # type: ignore[union-attr]
    free = _free_bytes(cache)
    if need > free:
        raise HubError(
            f"{repo_id}: {len(missing)} files of {need / 1e9:.2f} GB to download, {free / 1e9:.2f} GB free "
            f"in {cache}"
        )
    local: dict[str, list[Path]] = {}
    for role, files in chosen.items():
        paths = []
        for n in files:
            try:
                # by the revision asked for (main), so the cache records the ref for offline use
                path = Path(hf_hub_download(repo_id, n, revision=revision))
            except failures as e:
                raise HubError(f"downloading {repo_id}/{n}: {e}") from None
            if n in missing:
                _verify(path, siblings[n].lfs.sha256, f"{repo_id}/{n}")  # type: ignore[union-attr]
            paths.append(path)
        local[role] = paths
    return local


def _chosen(names: list[str], quant: str | None, repo_id: str) -> dict[str, list[str]]:
    """Role -> the files of the set chosen for it among a repository's file ``names``."""
    by_role: dict[str, dict[str, list[str]]] = {role: {} for role in ("model", *SIDE_ROLES)}
    for key, files in group_sets(names).items():
        by_role[role_of(files[0])][key] = files
    chosen: dict[str, list[str]] = {}
    for role, sets in by_role.items():
        files = _choose(sets, quant, "model" if role == "model" else f"{role} file", repo_id, role == "model")
        if files is not None:
            chosen[role] = files
    for files in chosen.values():
        shard = shard_of(files[0].rsplit("/", 1)[-1])
        if shard is not None and shard[2] != len(files):
            raise HubError(f"{repo_id}: {files[0]} is one of {shard[2]} shards; there are {len(files)}")
    return chosen


def _cached(repo_id: str, quant: str | None, revision: str | None) -> dict[str, list[Path]] | None:
    """:func:`pull`'s choice among the files of the cached snapshot of ``repo_id``, or None when none is cached
    (files there were checked when they were downloaded)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        root = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    names = [str(p.relative_to(root)) for p in root.rglob("*.gguf")]
    try:
        chosen = _chosen(names, quant, repo_id)
    except HubError:
        return None
    return {role: [root / n for n in files] for role, files in chosen.items()}


def _verify(path: Path, expected: str, what: str) -> None:
    """Check a downloaded file's sha256; a mismatch removes it (blob and snapshot link) and raises HubError."""
    got = _sha256(path)
    if got != expected:
        blob = Path(os.path.realpath(path))
        for p in (path, blob):
            if p.is_symlink() or p.exists():
                p.unlink()
        raise HubError(
            f"{what}: downloaded sha256 {got}, the Hub lists {expected} (corrupt download, removed)"
        )


def describe(files: dict[str, Sequence[Path]]) -> list[str]:
    """One line per role of :func:`pull`'s result: role, file names and total size."""
    lines = []
    for role, paths in files.items():
        size = sum(p.stat().st_size for p in paths)
        names = paths[0].name if len(paths) == 1 else f"{paths[0].name} (+{len(paths) - 1} shards)"
        lines.append(f"{role}: {names}, {size / 1e9:.2f} GB")
    return lines
