"""``regolith pack``: a GGUF with routed experts (qwen4exp, qwen3moe) laid out for streaming (docs/formats.md,
"Packed model directory").

The directory holds ``dense.gguf`` (every tensor but the routed experts and the PLE table, data aligned to
16 KiB), ``experts.bin`` (one 16 KiB-aligned, CRC32C-checked ``[gate | up | down]`` record per (layer,
expert), so one direct read fetches an expert), ``ple.bin`` (the n-gram table in 4 KiB blocks no row
straddles, each block checksummed) and ``manifest.json`` (format version, source fingerprint, files with
sizes and checksums). It is built in a temporary directory beside the target and renamed into place only
when complete, so a half-written pack never looks valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from . import _core
from . import gguf as _gguf
from .errors import ModelFormatError
from .state import model_fingerprint

__all__ = ["FORMAT_VERSION", "STREAMED_ARCHITECTURES", "PackedModel", "is_packed", "open_packed", "pack"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DENSE = "dense.gguf"
EXPERTS = "experts.bin"
PLE = "ple.bin"
RECORD_ALIGN = 16384  # experts.bin records and dense.gguf tensor data
PLE_BLOCK = 4096
# The architectures whose routed experts stream through the arena (and so pack)
STREAMED_ARCHITECTURES = ("qwen4exp", "qwen3moe", "qwen35moe", "qwen3next", "gpt-oss")

_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_PLE_TABLE = "per_layer_token_embd.weight"
_EXPERTS_MAGIC = b"RGEXPERT"
_PLE_MAGIC = b"RGPLETAB"
_CHUNK = 64 << 20  # bytes copied per write

Progress = Callable[[str, int, int], None]


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _crc(data: np.ndarray) -> int:
    """CRC32C of a byte array."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return int(_core.crc32c_blocks(raw, raw.size)[0]) if raw.size else 0


def _file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            crc = _core.crc32c(chunk, crc)
    return crc


@dataclass(frozen=True)
class PackedModel:
    """A packed model directory, its manifest checked (see :func:`open_packed`)."""

    path: Path
    manifest: dict[str, Any]

    @property
    def dense(self) -> Path:
        """The dense GGUF: every tensor but the routed experts and the PLE table."""
        return self.path / DENSE

    @property
    def experts(self) -> Path:
        """experts.bin: one aligned, checksummed record per (layer, expert)."""
        return self.path / EXPERTS

    @property
    def ple(self) -> Path | None:
        """ple.bin (the PLE n-gram table in checksummed blocks), or None for a model without PLE."""
        return self.path / PLE if PLE in self.manifest["files"] else None

    @property
    def fingerprint(self) -> bytes:
        """The source GGUF's fingerprint: a packed model computes what its source computes, bit for bit,
        so saved states move between the two."""
        return bytes.fromhex(self.manifest["source"]["fingerprint"])

    def verify(self) -> None:
        """Check every file's CRC32C against the manifest (reads the whole pack): ModelFormatError names
        the first file that differs."""
        for name, entry in self.manifest["files"].items():
            if _file_crc(self.path / name) != entry["crc32c"]:
                raise ModelFormatError(f"{self.path / name}: checksum mismatch (the file is corrupt)")


def is_packed(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory that claims to be a packed model (has a manifest)."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST).is_file()


def open_packed(path: str | os.PathLike[str], *, verify_dense: bool = True) -> PackedModel:
    """Read and check a packed model directory's manifest: format and version, every listed file present
    with its recorded size, and (``verify_dense``) the dense GGUF's checksum, since its weights are read
    through the page cache with no per-block check. The experts' records and the PLE table's blocks carry
    their own checksums, checked on every read.

    Raises ModelFormatError for anything missing, truncated or corrupt.
    """
    root = Path(path)
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise ModelFormatError(f"{root}: not a packed model (no {MANIFEST})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFormatError(f"{root / MANIFEST}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "regolith-pack":
        raise ModelFormatError(f"{root / MANIFEST}: not a regolith pack manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise ModelFormatError(
            f"{root}: pack format version {manifest.get('version')!r} (this regolith reads {FORMAT_VERSION})"
        )
    files = manifest.get("files")
    source = manifest.get("source")
    if (
        not isinstance(files, dict)
        or DENSE not in files
        or EXPERTS not in files
        or not isinstance(source, dict)
    ):
        raise ModelFormatError(f"{root / MANIFEST}: incomplete manifest")
    try:
        bytes.fromhex(source["fingerprint"])
        for name, entry in files.items():
            if name not in (DENSE, EXPERTS, PLE) or not isinstance(entry["bytes"], int):
                raise ModelFormatError(f"{root / MANIFEST}: unexpected file entry {name!r}")
            size = (root / name).stat().st_size
            if size != entry["bytes"]:
                raise ModelFormatError(
                    f"{root / name}: {size} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
                )
            int(entry["crc32c"])
        experts = manifest["experts"]
        if not all(isinstance(r, int) and r > 0 for r in experts["record_bytes"]) or len(
            experts["record_bytes"]
        ) != int(experts["layers"]):
            raise ModelFormatError(f"{root / MANIFEST}: malformed experts entry")
        if PLE in files:
            [int(manifest["ple"][k]) for k in ("rows", "head_dim", "row_bytes", "blocks")]
    except FileNotFoundError as e:
        raise ModelFormatError(f"{root}: missing {Path(e.filename).name}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFormatError(f"{root / MANIFEST}: malformed manifest ({e!r})") from None
    packed = PackedModel(root, manifest)
    if verify_dense and _file_crc(packed.dense) != files[DENSE]["crc32c"]:
        raise ModelFormatError(f"{packed.dense}: checksum mismatch (the file is corrupt)")
    return packed


def _gguf_value_type(type_id: int) -> gguf.GGUFValueType:
    return gguf.GGUFValueType(type_id)


def _write_dense(src: _gguf.GGUFFile, skip: set[str], out: Path, progress: Progress | None) -> None:
    arch = src.architecture
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_custom_alignment(RECORD_ALIGN)
    types = src.metadata_types
    array_types = src.metadata_array_types
    for key, value in src.metadata.items():
        if key in ("general.architecture", "general.alignment"):
            continue
        vtype = _gguf_value_type(types[key])
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = _gguf_value_type(array_types[key])
            if sub == gguf.GGUFValueType.ARRAY:
                raise ModelFormatError(f"metadata key {key!r}: nested arrays are not supported by pack")
            writer.add_key_value(key, value, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, value, vtype)
    tensors = [t for t in src.tensors.values() if t.name not in skip]
    for t in tensors:
        byte_shape = (*t.shape[:-1], t.row_bytes)  # gguf converts a uint8 shape to elements by the type
        writer.add_tensor_info(
            t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=gguf.GGMLQuantizationType(t.type_id)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, t in enumerate(tensors):
        writer.write_tensor_data(src.tensor_bytes(t.name).reshape(-1))
        if progress:
            progress(DENSE, i + 1, len(tensors))
    writer.close()


def _write_experts(
    src: _gguf.GGUFFile, n_layer: int, n_expert: int, out: Path, progress: Progress | None
) -> None:
    # Header: magic, version, n_layer, n_expert, record alignment, index offset, data offset, file bytes,
    # header CRC, reserved (56 bytes); then per layer and part {type u32, pad u32, rows u64, cols u64, bytes
    # u64}; then the index {offset u64, crc u32, pad u32} per (layer, expert); records from data offset on.
    parts = []
    for layer in range(n_layer):
        row = []
        for part in ("gate", "up", "down"):
            info = src.tensors.get(f"blk.{layer}.ffn_{part}_exps.weight")
            if info is None or len(info.shape) != 3 or info.shape[0] != n_expert:
                raise ModelFormatError(
                    f"blk.{layer}.ffn_{part}_exps.weight: missing or not [n_expert, rows, cols]"
                )
            row.append(info)
        parts.append(row)
    table_end = 56 + n_layer * 3 * 32
    index_off = _align(table_end, 16)
    data_off = _align(index_off + n_layer * n_expert * 16, RECORD_ALIGN)
    record = [sum(p.nbytes // n_expert for p in row) for row in parts]
    stride = [_align(r, RECORD_ALIGN) for r in record]
    file_bytes = data_off + sum(s * n_expert for s in stride)

    table = bytearray()
    for row in parts:
        for p in row:
            table += struct.pack("<IIQQQ", p.type_id, 0, p.shape[1], p.shape[2], p.nbytes // n_expert)
    index = np.zeros((n_layer * n_expert, 2), dtype="<u8")
    with open(out, "wb") as f:
        f.truncate(file_bytes)
        at = data_off
        for layer, row in enumerate(parts):
            views = [src.tensor_bytes(p.name).reshape(n_expert, -1) for p in row]
            buf = np.zeros(stride[layer], dtype=np.uint8)
            for e in range(n_expert):
                n = 0
                for v in views:
                    buf[n : n + v.shape[1]] = v[e]
                    n += v.shape[1]
                index[layer * n_expert + e] = (at, _crc(buf[: record[layer]]))
                f.seek(at)
                f.write(memoryview(buf))
                at += stride[layer]
            if progress:
                progress(EXPERTS, layer + 1, n_layer)
        meta = bytes(table) + b"\0" * (index_off - table_end) + index.tobytes()
        head = struct.pack(
            "<8sIIIIQQQ", _EXPERTS_MAGIC, 1, n_layer, n_expert, RECORD_ALIGN, index_off, data_off, file_bytes
        )
        crc = _core.crc32c(meta, _core.crc32c(head, 0))
        f.seek(0)
        f.write(head + struct.pack("<II", crc, 0) + meta)


def _write_ple(src: _gguf.GGUFFile, out: Path, progress: Progress | None) -> None:
    # Header (96 bytes): magic, version, type, rows, head_dim, row_bytes, rows_per_block, block_bytes,
    # n_blocks, checksum table offset, data offset, file bytes, header CRC; the block CRCs at 4096; the blocks
    # from the data offset on, rows_per_block rows each, zero-padded.
    info = src.tensors[_PLE_TABLE]
    rows, head_dim = info.shape
    row_bytes = info.row_bytes
    block = max(PLE_BLOCK, _align(row_bytes, PLE_BLOCK))
    per_block = block // row_bytes
    n_blocks = (rows + per_block - 1) // per_block
    crc_off = PLE_BLOCK
    data_off = _align(crc_off + 4 * n_blocks, PLE_BLOCK)
    file_bytes = data_off + n_blocks * block
    table = src.tensor_bytes(_PLE_TABLE)
    crcs = np.zeros(n_blocks, dtype="<u4")
    step = max(1, _CHUNK // block)
    with open(out, "wb") as f:
        f.truncate(file_bytes)
        f.seek(data_off)
        for b0 in range(0, n_blocks, step):
            b1 = min(n_blocks, b0 + step)
            chunk = np.zeros((b1 - b0, block), dtype=np.uint8)
            r0, r1 = b0 * per_block, min(rows, b1 * per_block)
            flat = np.zeros(((b1 - b0) * per_block, row_bytes), dtype=np.uint8)
            flat[: r1 - r0] = table[r0:r1]
            chunk[:, : per_block * row_bytes] = flat.reshape(b1 - b0, per_block * row_bytes)
            crcs[b0:b1] = _core.crc32c_blocks(chunk.reshape(-1), block)
            f.write(memoryview(chunk).cast("B"))
            if progress:
                progress(PLE, b1, n_blocks)
        head = struct.pack(
            "<8sIIQQQQQQQQQ",
            _PLE_MAGIC,
            1,
            info.type_id,
            rows,
            head_dim,
            row_bytes,
            per_block,
            block,
            n_blocks,
            crc_off,
            data_off,
            file_bytes,
        )
        crc = _core.crc32c(crcs.tobytes(), _core.crc32c(head, 0))
        f.seek(0)
        f.write(head + struct.pack("<II", crc, 0))
        f.seek(crc_off)
        f.write(crcs.tobytes())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pack(
    model: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    side_files: Sequence[str | os.PathLike[str]] = (),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Pack the GGUF ``model`` of an architecture with routed experts (qwen4exp, qwen3moe; a file, or any shard
    of a split model) and its ``side_files`` (qwen4exp's PLE table and MTP head kept apart, as
    :meth:`regolith.Model.load` takes them) into the directory ``out_dir``
    (see the module docstring). The manifest's source fingerprint is theirs together.

    ``progress(file, done, total)`` is called as each file advances. The directory appears only when
    complete (built beside it and renamed); with ``overwrite`` an existing pack there is replaced, else
    FileExistsError. Raises ModelFormatError for a file without routed experts to stream.
    """
    src_path = Path(model)
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists (pass overwrite=True / --force to replace it)")
    with _gguf.open(src_path, side_files=side_files) as src:
        arch = src.architecture
        md = src.metadata
        experts = {n for n in src.tensors if _EXPERT_TENSOR.match(n)}
        if arch not in STREAMED_ARCHITECTURES or not experts:
            raise ModelFormatError(
                f"pack needs a model with routed experts ({', '.join(STREAMED_ARCHITECTURES)}); "
                f"{src_path} is {arch!r}"
            )
        n_layer = int(md[f"{arch}.block_count"])
        nextn = int(md.get(f"{arch}.nextn_predict_layers", 0))
        if nextn and f"blk.{n_layer - nextn}.nextn.eh_proj.weight" not in src.tensors:
            n_layer -= nextn  # the MTP head is in a side file not given: packed without it
        n_expert = int(md[f"{arch}.expert_count"])
        has_ple = _PLE_TABLE in src.tensors
        skip = experts | ({_PLE_TABLE} if has_ple else set())

        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
        try:
            _write_dense(src, skip, tmp / DENSE, progress)
            _write_experts(src, n_layer, n_expert, tmp / EXPERTS, progress)
            if has_ple:
                _write_ple(src, tmp / PLE, progress)
            names = [DENSE, EXPERTS] + ([PLE] if has_ple else [])
            files = {}
            for name in names:
                _fsync(tmp / name)
                files[name] = {"bytes": (tmp / name).stat().st_size, "crc32c": _file_crc(tmp / name)}
            manifest = {
                "format": "regolith-pack",
                "version": FORMAT_VERSION,
                "architecture": arch,
                "source": {
                    "name": src_path.name,
                    "bytes": src.file_size,
                    "fingerprint": model_fingerprint(src_path, side_files=side_files).hex(),
                },
                "experts": {
                    "layers": n_layer,
                    "experts": n_expert,
                    "record_align": RECORD_ALIGN,
                    "record_bytes": [
                        sum(
                            src.tensors[f"blk.{layer}.ffn_{k}_exps.weight"].nbytes // n_expert
                            for k in ("gate", "up", "down")
                        )
                        for layer in range(n_layer)
                    ],
                },
                "files": files,
            }
            if has_ple:
                t = src.tensors[_PLE_TABLE]
                per_block = max(PLE_BLOCK, _align(t.row_bytes, PLE_BLOCK)) // t.row_bytes
                manifest["ple"] = {
                    "rows": t.shape[0],
                    "head_dim": t.shape[1],
                    "row_bytes": t.row_bytes,
                    "blocks": (t.shape[0] + per_block - 1) // per_block,
                }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            _fsync(tmp / MANIFEST)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it private
            _fsync(tmp)
            if out.exists():
                old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
                os.replace(out, old / "pack")
                os.replace(tmp, out)
                shutil.rmtree(old)
            else:
                os.replace(tmp, out)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
            raise
    with contextlib.suppress(OSError):
        _fsync(out.parent)
    return out
