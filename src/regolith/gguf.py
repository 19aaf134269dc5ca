"""Reading GGUF files.

Example::

    with regolith.gguf.open("model.gguf") as f:
        print(f.architecture, f.metadata["general.name"])
        w = f.tensor("token_embd.weight")  # float32, numpy order

The file is memory-mapped and validated by the C++ core when opened: anything malformed raises
:class:`regolith.GGUFError` naming the problem and its byte offset. Tensor bytes are zero-copy views of the
mapping. Metadata strings are decoded as UTF-8 with invalid bytes replaced by U+FFFD (keys and tensor names
must be valid UTF-8, or the file is rejected).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core
from . import quant as _quant

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GGUFFile", "TensorInfo", "open"]

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
    ``(ne1, ne0)``); ``offset`` is the absolute byte offset of its data in the file.
    """

    name: str
    shape: tuple[int, ...]
    type_name: str
    type_id: int
    offset: int
    nbytes: int
    row_bytes: int

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


class GGUFFile:
    """An open GGUF file. Create with :func:`open`; usable as a context manager.

    Arrays returned by :meth:`tensor_bytes` (and :meth:`tensor` for F32 tensors) are read-only views of the
    mapping and keep it alive on their own, so they stay valid after :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file: _core.GGUFFile | None = _core.GGUFFile(self.path)
        self.version: int = self._file.version
        """GGUF format version (2 or 3)."""
        self.alignment: int = self._file.alignment
        """Tensor data alignment in bytes (``general.alignment``, default 32)."""
        self.file_size: int = self._file.file_size
        """Size of the file in bytes."""
        self._metadata: dict[str, Any] | None = None
        self._tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset, nbytes, row_bytes in self._file.tensors():
            self._tensors[name] = TensorInfo(
                name=name,
                shape=tuple(reversed(dims)),
                type_name=_core.type_info(type_id)[0],
                type_id=type_id,
                offset=offset,
                nbytes=nbytes,
                row_bytes=row_bytes,
            )

    def _core_file(self) -> _core.GGUFFile:
        if self._file is None:
            raise ValueError(f"GGUF file {self.path!r} is closed")
        return self._file

    @property
    def metadata(self) -> dict[str, Any]:
        """Metadata key -> value, in file order (ints, floats, bools, str and nested lists)."""
        if self._metadata is None:
            self._metadata = self._core_file().metadata()
        return self._metadata

    @property
    def metadata_types(self) -> dict[str, int]:
        """Metadata key -> GGUF value type id (e.g. 4 for uint32, 9 for array)."""
        return self._core_file().metadata_types()

    @property
    def metadata_array_types(self) -> dict[str, int]:
        """Array metadata key -> GGUF type id of its elements."""
        return self._core_file().metadata_array_types()

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """Tensor name -> :class:`TensorInfo`, in file order."""
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
        return f"<regolith.gguf.GGUFFile {self.path!r} v{self.version} {state}>"


def open(path: str | os.PathLike[str]) -> GGUFFile:
    """Memory-map and validate a GGUF v2/v3 file.

    Raises :class:`regolith.GGUFError` if the file is malformed and :class:`OSError` (e.g.
    FileNotFoundError) if it cannot be opened.
    """
    return GGUFFile(path)
