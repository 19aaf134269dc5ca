"""Window state files: a window's whole decoding state on disk, restored bit for bit.

A file holds the model's fingerprint, the token ids the state has seen and one part per layer (attention
keys and values, recurrent states, PLE history), each with a CRC32C; the format is in docs/formats.md.
:meth:`regolith.Window.save` / :meth:`regolith.Window.load` and :meth:`regolith.Session.save` /
:meth:`regolith.Session.load` are built on :func:`save_window` and :func:`load_window`; the prompt cache
(:mod:`regolith.prompt_cache`) stores deltas with ``start > 0``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from . import _core
from . import gguf as _gguf
from ._atomic import atomic_path
from .errors import SessionError

__all__ = [
    "FORMAT_VERSION",
    "IoStats",
    "ModelInfo",
    "StateHeader",
    "StateWindow",
    "check_model",
    "load_window",
    "model_fingerprint",
    "read_header",
    "save_window",
]

FORMAT_VERSION = 3
StateHeader = _core.StateHeader
# Bytes read from the middle of every tensor for the fingerprint.
_SAMPLE = 64
_IO_THREADS = 4


class ModelInfo(Protocol):
    """What windows, their state files and the prompt cache know of a model (:class:`regolith.Model` is one):
    its configuration (``architecture``, ``vocab_size``, ``hidden_size``, ``layer_types``...) and the
    fingerprint (:func:`model_fingerprint`) that ties a saved state to it."""

    config: dict[str, Any]

    @property
    def fingerprint(self) -> bytes: ...


class StateWindow(Protocol):
    """The window a state is saved from or restored to (:class:`regolith.Window` is one). State files are the
    window's persistence, so they see its insides: the model, the core window whose parts are written
    (``_core.ModelWindow``) and the token ids it holds, which a restore replaces."""

    _model: ModelInfo
    _w: Any
    _tokens: list[int]

    @property
    def max_ctx(self) -> int: ...

    def note_end_logits(self, logits: np.ndarray) -> None: ...


@dataclass(frozen=True)
class IoStats:
    """What one save or restore moved: file bytes, wall seconds (a save's temporary file, writes, fsync,
    rename and directory fsync; a restore's header and parts), whether it used O_DIRECT, and the I/O
    threads."""

    bytes: int
    seconds: float
    direct: bool
    threads: int

    @property
    def gb_per_second(self) -> float:
        """Throughput in GB/s (10^9 bytes)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def model_fingerprint(
    path: str | os.PathLike[str], *, side_files: Sequence[str | os.PathLike[str]] = ()
) -> bytes:
    """A 32-byte BLAKE2b digest identifying a GGUF model, cheap to compute (milliseconds).

    For one file it covers the file's length, its whole header byte for byte (every metadata key and value,
    every tensor's name, type, shape and offset) and 64 bytes from the middle of every tensor's data, so files
    that differ in architecture, shapes, quantization or trained weights get different fingerprints. The weights
    are not hashed whole: two files equal in all of that but different elsewhere in their data would collide.
    A model in several files (a split model's shards, then ``side_files``, each whole or split) gets the BLAKE2b
    of those digests of each file in that order, so it differs from its single-file twin.
    """
    digests = []
    for group in (path, *side_files):
        with _gguf.open(group) as f:
            for file_path, size in zip(f.paths, f.file_sizes, strict=True):
                digest = hashlib.blake2b(digest_size=32, person=b"regolith-model")
                tensors = sorted(
                    (t for t in f.tensors.values() if t.path == file_path), key=lambda t: t.offset
                )
                digest.update(size.to_bytes(8, "little"))
                data_start = tensors[0].offset if tensors else size
                with open(file_path, "rb") as raw:
                    digest.update(raw.read(data_start))
                for t in tensors:
                    data = f.tensor_bytes(t.name).reshape(-1)
                    mid = max(0, data.size // 2 - _SAMPLE // 2)
                    digest.update(data[mid : mid + _SAMPLE].tobytes())
                digests.append(digest.digest())
    if len(digests) == 1:
        return digests[0]
    return hashlib.blake2b(b"".join(digests), digest_size=32, person=b"regolith-model").digest()


def read_header(path: str | os.PathLike[str]) -> StateHeader:
    """The checked header of a state file (version, fingerprint, architecture, tokens, start, meta, parts).

    Raises :class:`regolith.SessionError` for a file that is not a state file, of another version, truncated
    or with a corrupt header; OSError when it cannot be read.
    """
    return _core.read_state_header(os.fspath(path))


def _stats(d: dict, seconds: float) -> IoStats:
    return IoStats(int(d["bytes"]), seconds, bool(d["direct"]), int(d["threads"]))


def save_window(
    window: StateWindow,
    path: str | os.PathLike[str],
    *,
    start: int = 0,
    meta: bytes = b"",
    logits: np.ndarray | None = None,
    direct: bool = True,
) -> IoStats:
    """Write ``window``'s state to ``path`` atomically (a temporary file beside it, fsynced, renamed over it).

    ``start > 0`` stores the attention rows of tokens ``start..n`` only (a delta on the state of the first
    ``start`` tokens, for :mod:`regolith.prompt_cache`); recurrent states are always stored whole. ``meta``
    is kept opaque in the header; ``logits`` (the logits after the last token) are stored when given.
    ``direct=False`` disables O_DIRECT (for measuring what it gains).
    """
    model = window._model
    tokens = np.asarray(window._tokens, dtype=np.int32)
    if logits is not None:
        logits = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
    t0 = time.perf_counter()
    with atomic_path(path) as tmp:
        written = window._w.save_state(
            str(tmp),
            model.fingerprint,
            model.config["architecture"],
            tokens,
            start,
            meta,
            logits,
            _IO_THREADS,
            direct,
        )
    return _stats(written, time.perf_counter() - t0)


def check_model(window: StateWindow, head: StateHeader, path: str | os.PathLike[str]) -> None:
    """Raise :class:`regolith.SessionError` unless ``head`` is a state of ``window``'s model that fits in it."""
    model = window._model
    if head.fingerprint != model.fingerprint:
        raise SessionError(
            f"{os.fspath(path)} holds a state of another model ({head.architecture}, fingerprint "
            f"{head.fingerprint.hex()[:16]}); this is {model.config['architecture']} {model.fingerprint.hex()[:16]}"
        )
    if head.n > window.max_ctx:
        raise SessionError(
            f"{os.fspath(path)} holds {head.n} tokens; the window holds at most {window.max_ctx}"
        )


def load_window(
    window: StateWindow,
    path: str | os.PathLike[str],
    *,
    header: StateHeader | None = None,
    whole: bool = True,
    direct: bool = True,
) -> tuple[IoStats, np.ndarray | None]:
    """Restore the state in ``path`` onto ``window``, which must hold exactly the first ``header.start`` of its
    tokens (none for a file written with ``start=0``). Returns the I/O statistics and the stored logits (or
    None).

    ``whole=False`` skips the recurrent states and the logits: the window is then only a base for restoring
    a delta saved on top of this state (:mod:`regolith.prompt_cache` restores chains this way).
    Raises :class:`regolith.SessionError` when the file is not a state of this model continuing the window's
    tokens (the window is then unchanged), or is truncated or corrupt (the window is then reset).
    """
    t0 = time.perf_counter()
    head = read_header(path) if header is None else header
    check_model(window, head, path)
    if head.start != len(window._tokens) or head.tokens[: head.start].tolist() != window._tokens:
        raise SessionError(
            f"{os.fspath(path)} continues a state of its first {head.start} tokens, which the window does not hold"
        )
    try:
        read, logits = window._w.load_state(os.fspath(path), head, whole, _IO_THREADS, direct)
    except BaseException:
        window._keep_held()  # a failed restore leaves the window unchanged or reset
        raise
    window._tokens = head.tokens.tolist()
    if logits is not None:
        window.note_end_logits(logits)
    return _stats(read, time.perf_counter() - t0), logits
