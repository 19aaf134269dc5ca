"""The names of a model's files: llama.cpp's split shards and the side files kept beside a model.

A model on disk or on the Hub is a GGUF file or a set of shards named as ``gguf-split`` names them
(``<prefix>-00001-of-00004.gguf``), optionally with side files, each whole or split too, whose names start
with their role: ``ple-*.gguf`` (the PLE n-gram table), ``mtp-*.gguf`` (the MTP head) and ``mmproj-*.gguf``
(the vision projector). Pure functions of names; nothing here opens a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["ROLES", "SIDE_ROLES", "group_sets", "role_of", "shard_of"]

# llama.cpp's llama_split_path: <prefix>-<no, from 1>-of-<count>.gguf, 5 digits each.
_SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_SIDE_NAME = re.compile(r"^(mmproj|ple|mtp)[-_.]", re.IGNORECASE)
SIDE_ROLES = ("ple", "mtp", "mmproj")
ROLES = ("model", *SIDE_ROLES)


def shard_of(name: str) -> tuple[str, int, int] | None:
    """``(prefix, number from 1, count)`` of a shard's file name, or None when ``name`` is not a shard's."""
    m = _SHARD_NAME.match(name)
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    return (m["prefix"], no, count) if 1 <= no <= count else None


def role_of(name: str) -> str:
    """``"ple"``, ``"mtp"`` or ``"mmproj"`` for a side file's name, else ``"model"``."""
    m = _SIDE_NAME.match(name.rsplit("/", 1)[-1])
    return m[1].lower() if m else "model"


def group_sets(names: Iterable[str]) -> dict[str, list[str]]:
    """The ``.gguf`` names grouped into models: a set's shards under ``<prefix>-of-<count>`` in shard order, a
    whole file under its own name. Shards missing from a set are not filled in."""
    sets: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        if not name.endswith(".gguf"):
            continue
        shard = shard_of(name.rsplit("/", 1)[-1])
        key = (
            f"{name[: len(name) - len(name.rsplit('/', 1)[-1])]}{shard[0]}-of-{shard[2]:05d}"
            if shard
            else name
        )
        sets.setdefault(key, []).append((shard[1] if shard else 1, name))
    return {k: [n for _, n in sorted(v)] for k, v in sorted(sets.items())}
