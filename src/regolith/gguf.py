"""Reading GGUF files.

Example::

    with regolith.gguf.open("model.gguf") as f:
        print(f.architecture, f.metadata["general.name"])
        w = f.tensor("token_embd.weight")  # float32, numpy order

The file is memory-mapped and validated by the C++ core when opened: anything malformed raises
:class:`regolith.GGUFError` naming the problem and its byte offset. Tensor bytes are zero-copy views of the
mapping.

A model split into shards by llama.cpp's ``gguf-split`` (``model-00001-of-00004.gguf``, ...) opens as one
model from any of its shards: the metadata is the first shard's, the tensors are every shard's. Side files
(``open(path, side_files=[...])``: a PLE table or an MTP head kept in its own GGUF) add their tensors to it.
A missing shard, one from another set or a tensor held twice raises :class:`regolith.ModelFormatError`
naming the file. Metadata strings are decoded as UTF-8 with invalid bytes replaced by U+FFFD (keys and tensor names
must be valid UTF-8, or the file is rejected).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core
from . import quant as _quant
from .errors import ModelFormatError
from .model_files import shard_of

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GGUFFile", "TensorInfo", "open", "split_paths"]

# Types read directly with numpy; everything else (F16, BF16, quantized) goes through quant.dequantize.
_PLAIN_DTYPES: dict[str, str] = {
    "F32": "<f4",
    "F64": "<f8",
    "I8": "i1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
}


@dataclass(frozen=True)
class TensorInfo:
    """Where and how a tensor is stored.

    ``shape`` is in numpy order (ggml's dims reversed, so a 2-D tensor with ne0 contiguous is
    ``(ne1, ne0)``); ``offset`` is the absolute byte offset of its data in ``path``, the file holding it.
    """

    name: str
    shape: tuple[int, ...]
    type_name: str
    type_id: int
    offset: int
    nbytes: int
    row_bytes: int
    path: str = field(compare=False)

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


def split_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The files of the model ``path`` names, in order: every shard of its set when it is named as
    gguf-split names shards (``<prefix>-00002-of-00004.gguf`` gives shards 1 to 4), else ``[path]``.

    Raises :class:`regolith.ModelFormatError` naming the first shard that is missing.
    """
    p = Path(path)
    shard = shard_of(p.name)
    if shard is None:
        return [p]
    prefix, _, count = shard
    shards = [p.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for i, shard in enumerate(shards):
        if not shard.exists():
            raise ModelFormatError(f"{shard}: missing (shard {i + 1} of {count} of the split model {p})")
    return shards


def _model_keys(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not k.startswith("split.")}


class GGUFFile:
    """An open GGUF model: one file, or a split model's shards, with any side files. Create with :func:`open`;
    usable as a context manager.

    Arrays returned by :meth:`tensor_bytes` (and :meth:`tensor` for F32 tensors) are read-only views of the
    mapping and keep it alive on their own, so they stay valid after :meth:`close`.
    """

    def __init__(
        self, path: str | os.PathLike[str], side_files: Sequence[str | os.PathLike[str]] = ()
    ) -> None:
        self.path = os.fspath(path)
        self.groups: list[list[str]] = [[os.fspath(p) for p in split_paths(f)] for f in (path, *side_files)]
        """The files, grouped: the model's shards (one path for a whole file), then each side file's."""
        self._file: _core.GGUFSet | None = _core.GGUFSet(self.groups)
        self.version: int = self._file.version
        """GGUF format version (2 or 3) of the first file."""
        self.alignment: int = self._file.alignment
        """Tensor data alignment in bytes (``general.alignment``, default 32) of the first file."""
        files = self._file.files()
        self.paths: list[str] = [p for p, _, _ in files]
        """Every file, in order: the model's shards, then the side files'."""
        self.file_sizes: list[int] = [size for _, size, _ in files]
        """The size of each of :attr:`paths` in bytes."""
        self.file_size: int = sum(self.file_sizes)
        """Size of the files in bytes, all together."""
        self._metadata: dict[str, Any] | None = None
        self._tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset, nbytes, row_bytes, index in self._file.tensors():
            self._tensors[name] = TensorInfo(
                name=name,
                shape=tuple(reversed(dims)),
                type_name=_core.type_info(type_id)[0],
                type_id=type_id,
                offset=offset,
                nbytes=nbytes,
                row_bytes=row_bytes,
                path=self.paths[index],
            )

    def _core_file(self) -> _core.GGUFSet:
        if self._file is None:
            raise ValueError(f"GGUF file {self.path!r} is closed")
        return self._file

    @property
    def metadata(self) -> dict[str, Any]:
        """Metadata key -> value, in file order (ints, floats, bools, str and nested lists). The ``split.*``
        keys, which describe how the model is stored rather than the model, are left out."""
        if self._metadata is None:
            self._metadata = _model_keys(self._core_file().metadata())
        return self._metadata

    @property
    def metadata_types(self) -> dict[str, int]:
        """Metadata key -> GGUF value type id (e.g. 4 for uint32, 9 for array), ``split.*`` left out."""
        return _model_keys(self._core_file().metadata_types())

    @property
    def metadata_array_types(self) -> dict[str, int]:
        """Array metadata key -> GGUF type id of its elements, ``split.*`` left out."""
        return _model_keys(self._core_file().metadata_array_types())

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """Tensor name -> :class:`TensorInfo`, in file order (the shards', then the side files')."""
        return self._tensors

    @property
    def architecture(self) -> str | None:
        """``general.architecture``, or None if absent."""
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def tensor_bytes(self, name: str) -> np.ndarray:
        """Zero-copy, read-only uint8 view of a tensor's data shaped ``(*shape[:-1], row_bytes)``."""
        info = self._tensors[name]
        data = self._core_file().tensor_data(name)
        return data.reshape(*info.shape[:-1], info.row_bytes)

    def tensor(self, name: str) -> np.ndarray:
        """A tensor as float32 of its numpy ``shape``, dequantized if needed.

        F32 tensors are returned as a read-only view of the mapping; other types are converted into a new
        array (quantized types through :func:`regolith.quant.dequantize`).
        """
        info = self._tensors[name]
        raw = self.tensor_bytes(name)
        dtype = _PLAIN_DTYPES.get(info.type_name)
        if dtype is not None:
            out = raw.reshape(-1).view(dtype).reshape(info.shape)
            return out if info.type_name == "F32" else out.astype(np.float32)
        return _quant.dequantize(raw, info.type_id).reshape(info.shape)

    def close(self) -> None:
        """Release this object's reference to the mapping (views already handed out keep it alive)."""
        self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"{len(self._tensors)} tensors"
        if len(self.paths) > 1:
            state += f" in {len(self.paths)} files"
        return f"<regolith.gguf.GGUFFile {self.path!r} v{self.version} {state}>"


def open(path: str | os.PathLike[str], *, side_files: Sequence[str | os.PathLike[str]] = ()) -> GGUFFile:
    """Memory-map and validate a GGUF v2/v3 file, or every shard of the split model it is a shard of, and
    ``side_files`` (each whole or split too), as one model.

    Raises :class:`regolith.GGUFError` if a file is malformed, :class:`regolith.ModelFormatError` for a split
    set that is incomplete or inconsistent (naming the file), and :class:`OSError` (e.g. FileNotFoundError)
    if a file cannot be opened.
    """
    return GGUFFile(path, side_files)
