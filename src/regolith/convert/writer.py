"""Writing a converted model: tensor types per llama.cpp's rules, quantization, an atomic GGUF file."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .. import gguf as _gguf
from .. import quant
from .._atomic import atomic_path
from ..errors import ModelFormatError, RegolithError
from ..gguf_split import write_merged, write_split
from . import gpt_oss, qwen3, qwen3next, qwen4exp, qwen35moe, qwen_hybrid
from . import mmproj as _mmproj
from .checkpoint import Checkpoint
from .tokenizer import gpt2_tokenizer_metadata

__all__ = ["OUTTYPES", "convert", "convert_mmproj", "mmproj_type", "tensor_type"]

# --outtype -> (ggml type of the quantizable tensors, general.file_type). q4_k / q6_k / iq4_nl files are
# "pure": every quantizable tensor gets the type (llama.cpp's Q4_K_M and friends mix in higher types).
OUTTYPES: dict[str, tuple[str, gguf.LlamaFileType]] = {
    "f32": ("F32", gguf.LlamaFileType.ALL_F32),
    "f16": ("F16", gguf.LlamaFileType.MOSTLY_F16),
    "bf16": ("BF16", gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": ("Q8_0", gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": ("Q4_0", gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_k": ("Q4_K", gguf.LlamaFileType.MOSTLY_Q4_K_M),
    "q6_k": ("Q6_K", gguf.LlamaFileType.MOSTLY_Q6_K),
    "iq4_nl": ("IQ4_NL", gguf.LlamaFileType.MOSTLY_IQ4_NL),
}
# llama-quant.cpp tensor_type_fallback: a row length the block size does not divide demotes the type
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q2_0": "Q4_0"}
# llama.cpp's converter keeps these in F32 whatever the outtype (routers, conv kernels)
_ALWAYS_F32 = re.compile(r"^blk\.\d+\.(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d)\.weight$")


def tensor_type(name: str, shape: Sequence[int], outtype: str) -> str:
    """The ggml type a tensor gets for ``--outtype``: F32 for 1-D tensors, ``*_norm.weight``, routers,
    conv kernels and non-``.weight`` tensors (llama.cpp's converter rules); otherwise the outtype's type,
    demoted as llama.cpp's quantizer does when the row length is not a multiple of the block size (then
    F16 if even that does not fit). ``shape`` is numpy order (the row is the last dim)."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return "F32"
    if _ALWAYS_F32.match(name):
        return "F32"
    qtype = OUTTYPES[outtype][0]
    row = int(shape[-1])
    block = quant.type_size(qtype)[0]
    if row % block:
        qtype = _FALLBACK.get(qtype, qtype)
        if row % quant.type_size(qtype)[0]:
            qtype = "F16"
    return qtype


def _nbytes(shape: Sequence[int], qtype: str) -> int:
    block, size = quant.type_size(qtype)
    n = int(np.prod(shape, dtype=np.int64))
    return n // block * size


def _encode(arr: np.ndarray, qtype: str) -> np.ndarray:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise ModelFormatError("checkpoint: a tensor holds inf or NaN values")
    return arr if qtype == "F32" else quant.quantize(arr, qtype)


def _add_kv(writer: gguf.GGUFWriter, items: Sequence[tuple[str, Any, gguf.GGUFValueType]]) -> None:
    for key, value, vtype in items:
        if isinstance(value, list):
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)


def _add_tensor_infos(
    writer: gguf.GGUFWriter, plan: Sequence[tuple[str, Any, Any]], types: Sequence[str]
) -> None:
    """Declare each planned tensor ``(name, numpy shape, build)`` with its ggml type, before any data."""
    for (name, shape, _), qtype in zip(plan, types, strict=True):
        writer.add_tensor_info(
            name,
            shape,
            np.dtype(np.float32),
            _nbytes(shape, qtype),
            raw_dtype=gguf.GGMLQuantizationType[qtype],
        )


def _write_plan(
    writer: gguf.GGUFWriter, path: Path, plan: Sequence[tuple[str, Any, Any]], types: Sequence[str]
) -> None:
    """Write a writer whose tensors _add_tensor_infos declared to ``path``: header, metadata, tensor infos, then
    each planned tensor built, encoded and written in turn."""
    try:
        writer.write_header_to_file(path=path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for (_name, _shape, load), qtype in zip(plan, types, strict=True):
            writer.write_tensor_data(_encode(load(), qtype))
    finally:
        writer.close()


def _write_chunked(writer: gguf.GGUFWriter, name: str, chunks: Any, qtype: str) -> None:
    """write_tensor_data for a tensor that arrives in row blocks (the PLE table)."""
    fout = writer.fout[0]
    info = writer.tensors[0].pop(name)
    writer.write_padding(fout, fout.tell())
    written = 0
    for chunk in chunks:
        data = _encode(chunk, qtype)
        data.tofile(fout)
        written += data.nbytes
    if written != info.nbytes:
        raise RegolithError(f"{name}: wrote {written} bytes, expected {info.nbytes}")
    writer.write_padding(fout, written)
    writer.state = gguf.WriterState.WEIGHTS


def convert(
    hf_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    outtype: str | None = None,
    *,
    tokenizer_pre: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    mmproj: str | os.PathLike[str] | None = None,
    split_max_size: int | None = None,
    split_max_tensors: int | None = None,
) -> Path:
    """Convert a Hugging Face directory (qwen4_exp, qwen3, qwen3_moe, qwen3_5_moe, qwen3_next or gpt_oss) to a
    GGUF file in llama.cpp's layout for it (``qwen4exp``, ``qwen3``, ``qwen3moe``, ``qwen35moe``, ``qwen3next``,
    ``gpt-oss``; ``outtype``, default f16; a gpt-oss checkpoint's MXFP4 experts stay MXFP4 whatever it is);
    returns its path (split: the first shard's).

    Everything is validated (config, tensor names and shapes, tokenizer) before the output is created; the
    file is written to a temporary file beside ``out_path``, fsynced and renamed, so an error or an
    interrupt leaves no partial output. ``progress(name, index, count)`` is called after each tensor.
    ``mmproj``: also write the vision tower of a qwen4_exp or qwen3_5_moe checkpoint to this path (:func:`convert_mmproj`).
    ``split_max_size`` (bytes) or ``split_max_tensors``: write shards in llama.cpp's gguf-split layout
    (:func:`regolith.gguf_split.write_split`) instead of one file. ``hf_dir`` may also be a GGUF file (any
    shard of a split model): it is re-split, or merged into one file, with its tensors as they are.
    Raises ModelFormatError for an unsupported architecture or a malformed checkpoint.
    """
    out_path = Path(out_path)
    split = split_max_size is not None or split_max_tensors is not None
    if Path(hf_dir).is_file():
        if outtype is not None or mmproj is not None:
            raise RegolithError(
                "a GGUF source keeps its tensors as they are: --outtype and --mmproj apply to "
                "Hugging Face checkpoints"
            )
        with _gguf.open(hf_dir) as src:
            if split:
                return write_split(
                    src, out_path, max_size=split_max_size, max_tensors=split_max_tensors, progress=progress
                )[0]
            return write_merged(src, out_path, progress=progress)
    outtype = outtype or "f16"
    if outtype not in OUTTYPES:
        raise RegolithError(f"unknown outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    if split:
        # Converted whole beside the output first, then split (the converter streams tensors into one file).
        with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=f".{out_path.name}.") as tmp:
            whole = convert(
                hf_dir,
                Path(tmp) / out_path.name,
                outtype,
                tokenizer_pre=tokenizer_pre,
                progress=progress,
                mmproj=mmproj,
            )
            with _gguf.open(whole) as src:
                return write_split(src, out_path, max_size=split_max_size, max_tensors=split_max_tensors)[0]
    ckpt = Checkpoint(hf_dir)
    file_type = OUTTYPES[outtype][1]
    if qwen3.handles(ckpt.config):
        if mmproj is not None:
            raise RegolithError("--mmproj: a qwen3 checkpoint has no vision tower")
        cfg = qwen3.text_config(ckpt.config)
        sources: dict[str, Any] = {}
        for name, src in ckpt.tensors():
            if name in sources:
                raise ModelFormatError(f"checkpoint: tensor {name} appears twice")
            sources[name] = src
        plan = qwen3.tensor_plan(ckpt.config, sources)
        arch, arch_md = cfg["arch"], qwen3.gguf_metadata(ckpt.config, file_type=int(file_type))
    elif qwen35moe.handles(ckpt.config):
        if mmproj is not None:
            convert_mmproj(hf_dir, mmproj, outtype)
        cfg = qwen35moe.text_config(ckpt.config)
        sources = qwen_hybrid.collect_sources(ckpt.tensors_by_name())
        plan = qwen35moe.tensor_plan(ckpt.config, sources)
        arch, arch_md = (
            qwen35moe.ARCH,
            qwen35moe.gguf_metadata(ckpt.config, file_type=int(file_type), mtp=qwen35moe.has_mtp(sources)),
        )
    elif gpt_oss.handles(ckpt.config):
        if mmproj is not None:
            raise RegolithError("--mmproj: a gpt_oss checkpoint has no vision tower")
        cfg = gpt_oss.text_config(ckpt.config)
        sources = {}
        for name, src in ckpt.tensors_by_name():
            if name in sources:
                raise ModelFormatError(f"checkpoint: tensor {name} appears twice")
            sources[name] = src
        plan = gpt_oss.tensor_plan(ckpt.config, sources)
        arch, arch_md = (
            gpt_oss.ARCH,
            gpt_oss.gguf_metadata(ckpt.config, file_type=gpt_oss.file_type(ckpt.config, file_type)),
        )
    elif qwen3next.handles(ckpt.config):
        if mmproj is not None:
            raise RegolithError("--mmproj: a qwen3_next checkpoint has no vision tower")
        cfg = qwen3next.text_config(ckpt.config)
        sources = qwen_hybrid.collect_sources(ckpt.tensors_by_name())
        plan = qwen3next.tensor_plan(ckpt.config, sources)
        arch, arch_md = (
            qwen3next.ARCH,
            qwen3next.gguf_metadata(ckpt.config, file_type=int(file_type), mtp=qwen3next.has_mtp(sources)),
        )
    else:
        if mmproj is not None:
            convert_mmproj(hf_dir, mmproj, outtype)
        cfg = qwen4exp.text_config(ckpt.config)
        sources = qwen_hybrid.collect_sources(ckpt.tensors())
        plan = qwen4exp.tensor_plan(ckpt.config, sources)
        arch, arch_md = (
            qwen4exp.ARCH,
            qwen4exp.gguf_metadata(
                ckpt.config, file_type=int(file_type), ple_constants=qwen4exp.ple_constants_from(sources)
            ),
        )
    tok_md = gpt2_tokenizer_metadata(ckpt.path, cfg["vocab_size"], pre=tokenizer_pre)

    writer = gguf.GGUFWriter(path=None, arch=arch)
    types = [
        "MXFP4" if isinstance(build, gpt_oss.Mxfp4Experts) else tensor_type(name, shape, outtype)
        for name, shape, build in plan
    ]
    _add_tensor_infos(writer, plan, types)
    writer.add_type(gguf.GGUFType.MODEL)
    total, shared, expert, n_expert = writer.get_total_parameter_count()
    meta = gguf.Metadata.load(None, ckpt.path, None, total)
    if meta.name is None:
        meta.name = ckpt.path.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    meta.set_gguf_meta_model(writer)
    _add_kv(writer, arch_md)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if tok_md:
        _add_kv(writer, tok_md)

    with atomic_path(out_path) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for i, ((name, _shape, build), qtype) in enumerate(zip(plan, types, strict=True)):
                data = build()
                if isinstance(data, qwen4exp.PleTable):
                    _write_chunked(writer, name, data.chunks(), qtype)
                elif isinstance(build, gpt_oss.Mxfp4Experts):
                    writer.write_tensor_data(data)  # GGUF MXFP4 blocks already
                else:
                    writer.write_tensor_data(_encode(data, qtype))
                del data
                if progress is not None:
                    progress(name, i, len(plan))
        finally:
            writer.close()
    return out_path


def mmproj_type(name: str, shape: Sequence[int], outtype: str) -> str:
    """llama.cpp's mmproj types: F32 for 1-D tensors and biases, else F32 or F16 (quantized outtypes too)."""
    if len(shape) <= 1 or not name.endswith((".weight", ".weight.1")):
        return "F32"
    return "F32" if outtype == "f32" else "F16"


def convert_mmproj(
    hf_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], outtype: str = "f16"
) -> Path:
    """Write the vision tower of a qwen4_exp or qwen3_5_moe checkpoint as a projector GGUF in llama.cpp's layout
    (:mod:`regolith.convert.mmproj`), atomically. 2-D weights are F16 (F32 with ``outtype='f32'``), norms
    and biases F32. Raises ModelFormatError when the checkpoint has no (or a malformed) vision tower."""
    if outtype not in OUTTYPES:
        raise RegolithError(f"unknown outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    ckpt = Checkpoint(hf_dir)
    pre_path = ckpt.path / "preprocessor_config.json"
    preprocessor = json.loads(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else {}
    plan = _mmproj.mmproj_tensors(ckpt.config, ckpt.tensors())
    file_type = gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    md = _mmproj.mmproj_metadata(ckpt.config, preprocessor, file_type=int(file_type))
    writer = gguf.GGUFWriter(path=None, arch="clip")
    types = [mmproj_type(name, shape, outtype) for name, shape, _ in plan]
    _add_tensor_infos(writer, plan, types)
    writer.add_type(gguf.GGUFType.MMPROJ)
    meta = gguf.Metadata.load(None, ckpt.path, None, 0)
    meta.name = meta.name or ckpt.path.name
    meta.set_gguf_meta_model(writer)
    _add_kv(writer, md)
    with atomic_path(Path(out_path)) as tmp:
        _write_plan(writer, tmp, plan, types)
    return Path(out_path)
