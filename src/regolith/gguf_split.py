"""Writing a model as shards in the layout of llama.cpp's ``gguf-split`` (``regolith convert --split-max-size``).

gguf-split's layout (``tools/gguf-split/gguf-split.cpp``): shard ``i`` of ``n`` is named
``<prefix>-<i>-of-<n>.gguf`` (5 digits each, from 1); every shard is a GGUF v3 file with tensor data aligned to
32 bytes; the first holds every metadata key of the model followed by ``split.no`` (u16, from 0),
``split.tensors.count`` (i32, the tensors of all shards) and ``split.count`` (u16), the others those three keys
only. Tensors keep the model's order and their ggml dims (trailing dims of 1 dropped, as ggml counts them); a
new shard starts when the next tensor (its size padded to 32 bytes, metadata not counted) would take the
current one past the size limit, or after every ``max_tensors`` tensors. Merging (``--merge``) writes the same
without the split keys.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import gguf
import numpy as np

from . import gguf as _gguf
from ._atomic import atomic_path
from .errors import ModelFormatError, RegolithError

__all__ = ["copy_metadata", "parse_size", "plan_shards", "shard_path", "write_merged", "write_split"]

_ALIGN = 32  # GGUF_DEFAULT_ALIGNMENT: gguf-split pads every tensor to it
_SPLIT_KEYS = (
    gguf.Keys.Split.LLM_KV_SPLIT_NO,
    gguf.Keys.Split.LLM_KV_SPLIT_COUNT,
    gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT,
)

Progress = Callable[[str, int, int], None]


def parse_size(text: str) -> int:
    """Bytes of a size as gguf-split's ``--split-max-size`` takes it: a positive integer followed by ``M``
    (10^6 bytes) or ``G`` (10^9 bytes). Raises ValueError otherwise."""
    units = {"M": 1000**2, "G": 1000**3}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{text!r}: a size is a positive integer followed by M or G (e.g. 500M, 48G)")
    return int(number) * units[unit]


def shard_path(out: str | os.PathLike[str], index: int, count: int) -> Path:
    """Shard ``index`` (from 0) of ``count`` for the output ``out`` (``model.gguf`` or the prefix ``model``):
    ``model-00001-of-00004.gguf`` as llama.cpp names it."""
    p = Path(out)
    stem = p.name.removesuffix(".gguf")
    return p.with_name(f"{stem}-{index + 1:05d}-of-{count:05d}.gguf")


def plan_shards(
    sizes: list[int], *, max_size: int | None = None, max_tensors: int | None = None
) -> list[list[int]]:
    """Tensor indices of each shard, as gguf-split plans them for tensors of ``sizes`` bytes (in order).

    By size, a tensor larger than ``max_size`` gets a shard of its own (gguf-split refuses such a model).
    """
    if (max_size is None) == (max_tensors is None):
        raise ValueError("give exactly one of max_size and max_tensors")
    if (max_size is not None and max_size <= 0) or (max_tensors is not None and max_tensors <= 0):
        raise ValueError("the split limit must be positive")
    shards: list[list[int]] = [[]]
    used = 0
    for i, size in enumerate(sizes):
        padded = (size + _ALIGN - 1) // _ALIGN * _ALIGN
        if max_size is not None:
            new = bool(shards[-1]) and used + padded > max_size
        else:
            new = i > 0 and i % max_tensors == 0  # type: ignore[operator]
        if new:
            shards.append([])
            used = 0
        shards[-1].append(i)
        used += padded
    return shards


def copy_metadata(src: _gguf.GGUFFile, writer: gguf.GGUFWriter, skip: set[str]) -> None:
    """Every metadata key of ``src`` but ``skip``, in file order, with its GGUF value type, into ``writer`` (whose
    own keys are replaced, so ``general.architecture`` keeps its place)."""
    writer.kv_data[0].clear()
    types = src.metadata_types
    array_types = src.metadata_array_types
    for key, value in src.metadata.items():
        if key in skip:
            continue
        vtype = gguf.GGUFValueType(types[key])
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(array_types[key])
            if sub == gguf.GGUFValueType.ARRAY:
                raise ModelFormatError(f"metadata key {key!r}: nested arrays cannot be copied")
            writer.add_key_value(key, value, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, value, vtype)


def _write_shard(
    src: _gguf.GGUFFile,
    names: list[str],
    path: Path,
    index: int,
    count: int,
    total: int,
    progress: Progress | None,
    label: str,
    metadata: bool,
) -> None:
    """Shard ``index`` of ``count`` (of ``total`` tensors in all) holding tensors ``names`` to ``path``; ``count``
    0: one whole file, no ``split.*`` keys. ``metadata`` False: the first shard gets ``general.architecture``
    only (a side file)."""
    writer = gguf.GGUFWriter(None, src.architecture or "")
    if index == 0 and metadata:
        copy_metadata(src, writer, {"general.alignment", *_SPLIT_KEYS})
    elif index > 0:
        writer.kv_data[0].clear()
    if count:  # in gguf-split's order: it sets split.count last (its placeholder is replaced at the end)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, index)
        writer.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, total)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, count)
    infos = [src.tensors[n] for n in names]
    for t in infos:
        # ggml's dims as gguf-split writes them, trailing dims of 1 dropped (ggml_n_dims); numpy order here
        shape = t.shape[next((i for i, d in enumerate(t.shape) if d != 1), len(t.shape) - 1) :]
        byte_shape = (
            *shape[:-1],
            t.row_bytes,
        )  # the gguf writer turns a uint8 shape into elements by the type
        writer.add_tensor_info(
            t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=gguf.GGMLQuantizationType(t.type_id)
        )
    try:
        writer.write_header_to_file(path=path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, t in enumerate(infos):
            writer.write_tensor_data(src.tensor_bytes(t.name).reshape(-1))
            if progress:
                progress(label, i, len(infos))
    finally:
        writer.close()


def write_split(
    src: _gguf.GGUFFile,
    out: str | os.PathLike[str],
    *,
    max_size: int | None = None,
    max_tensors: int | None = None,
    tensors: Sequence[str] | None = None,
    metadata: bool = True,
    progress: Progress | None = None,
) -> list[Path]:
    """Write the model ``src`` as gguf-split shards named after ``out`` (:func:`shard_path`), split by
    ``max_size`` bytes or ``max_tensors`` tensors per shard; returns their paths. ``tensors`` (names, in
    order) writes those only, and ``metadata=False`` gives the first shard ``general.architecture`` alone:
    together they write a side file, e.g. the PLE table apart from a model written without it.

    Each shard is written under a temporary name beside it and fsynced; they are renamed into place only when
    all are written, the first shard last, so an interrupted write leaves no set that opens.
    ``progress(shard name, index of the tensor written, tensors of the shard)`` follows the writing.
    """
    names = list(src.tensors if tensors is None else tensors)
    if not names:
        raise RegolithError("a model without tensors cannot be split")
    if unknown := [n for n in names if n not in src.tensors]:
        raise RegolithError(f"no tensor {unknown[0]!r} in the model")
    plan = plan_shards([src.tensors[n].nbytes for n in names], max_size=max_size, max_tensors=max_tensors)
    targets = [shard_path(out, i, len(plan)) for i in range(len(plan))]
    if any(os.path.realpath(t) in map(os.path.realpath, src.paths) for t in targets):
        raise RegolithError(f"the shards of {out} would overwrite the model being split")
    temps: list[Path] = []
    try:
        for i, (target, shard) in enumerate(zip(targets, plan, strict=True)):
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            os.close(fd)
            temps.append(Path(name))
            _write_shard(
                src,
                [names[j] for j in shard],
                temps[-1],
                i,
                len(plan),
                len(names),
                progress,
                target.name,
                metadata,
            )
            with open(temps[-1], "rb+") as f:
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        for tmp, target in reversed(list(zip(temps, targets, strict=True))):
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, target)
    except BaseException:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    with contextlib.suppress(OSError):
        fd = os.open(targets[0].parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return targets


def write_merged(
    src: _gguf.GGUFFile,
    out: str | os.PathLike[str],
    *,
    tensors: Sequence[str] | None = None,
    metadata: bool = True,
    progress: Progress | None = None,
) -> Path:
    """Write the model ``src`` (a split model's shards, say) as one whole GGUF file at ``out``, atomically, as
    ``gguf-split --merge`` does (no ``split.*`` keys). ``tensors`` and ``metadata`` as for :func:`write_split`."""
    out = Path(out)
    if os.path.realpath(out) in map(os.path.realpath, src.paths):
        raise RegolithError(f"{out} is one of the files being merged")
    names = list(src.tensors if tensors is None else tensors)
    with atomic_path(out) as tmp:
        _write_shard(src, names, tmp, 0, 0, len(names), progress, out.name, metadata)
    return out
