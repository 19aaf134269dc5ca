"""Reading a Hugging Face checkpoint directory: config.json and its safetensors files, lazily.

Tensors are read straight from the safetensors format (an 8-byte header length, a JSON header of
``{name: {dtype, shape, data_offsets}}``, then the data) through ``np.memmap``: numpy has no bfloat16, so
the ``safetensors`` package's numpy API cannot return the BF16 tensors real checkpoints hold, and a
memory map lets the ~100 GB PLE table stream shard by shard. Nothing here needs torch.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError

__all__ = ["Checkpoint", "SafetensorsTensor"]

_DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


@dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor of a safetensors file; ``load()`` reads it (float tensors as float32)."""

    path: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data
    nbytes: int

    def load(self) -> np.ndarray:
        n = int(np.prod(self.shape, dtype=np.int64))
        raw = np.memmap(self.path, dtype=_DTYPES[self.dtype], mode="r", offset=self.offset, shape=(n,))
        if self.dtype == "BF16":
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        elif self.dtype in ("F16", "F64"):
            out = raw.astype(np.float32)
        else:
            out = np.array(raw)
        return out.reshape(self.shape)


def _read_header(path: Path) -> list[SafetensorsTensor]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ModelFormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise ModelFormatError(f"{path}: safetensors header length {n} exceeds the file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFormatError(f"{path}: safetensors header is not valid JSON ({e})") from None
    base = 8 + n
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = (
                info["dtype"],
                tuple(int(d) for d in info["shape"]),
                info["data_offsets"],
            )
        except (KeyError, TypeError, ValueError):
            raise ModelFormatError(f"{path}: malformed safetensors entry for {name!r}") from None
        if dtype not in _DTYPES:
            raise ModelFormatError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if end - start != want or base + end > size or start < 0:
            raise ModelFormatError(f"{path}: tensor {name} data is truncated or mis-sized")
        tensors.append(SafetensorsTensor(path, name, dtype, shape, base + start, end - start))
    tensors.sort(key=lambda t: t.offset)  # file order: sequential reads
    return tensors


class Checkpoint:
    """A Hugging Face model directory: ``config`` (config.json) and ``tensors()`` (lazy, file order)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise ModelFormatError(
                f"{self.path} is not a directory (expected a Hugging Face model directory)"
            )
        cfg = self.path / "config.json"
        if not cfg.is_file():
            raise ModelFormatError(f"{self.path} has no config.json")
        try:
            self.config: dict[str, Any] = json.loads(cfg.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFormatError(f"{cfg}: not valid JSON ({e})") from None
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelFormatError(f"{index}: no weight_map")
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.path.glob("model*.safetensors"))
        if not files:
            raise ModelFormatError(f"{self.path} has no model*.safetensors files")
        missing = [f for f in files if not (self.path / f).is_file()]
        if missing:
            raise ModelFormatError(f"{self.path}: missing checkpoint files {', '.join(missing)}")
        self.files = [self.path / f for f in files]

    def tensors(self) -> Iterator[tuple[str, SafetensorsTensor]]:
        """(name, lazy tensor) for every tensor, file by file in file order."""
        for f in self.files:
            for t in _read_header(f):
                yield t.name, t

    def tensors_by_name(self) -> Iterator[tuple[str, SafetensorsTensor]]:
        """(name, lazy tensor) file by file, by name within a file: the order llama.cpp's converter walks a
        checkpoint in (its tensors keep that order in the GGUF)."""
        for f in self.files:
            for t in sorted(_read_header(f), key=lambda t: t.name):
                yield t.name, t
