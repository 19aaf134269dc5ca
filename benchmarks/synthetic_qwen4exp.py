"""A random qwen4exp GGUF at Qwen3.8-Flash-Next's real shapes, written fast enough for multi-GB files.

The shapes are transformers' ``Qwen4ExpTextConfig()`` defaults: hidden 2048, QSA 16 heads of 256 (2 KV heads;
indexer 16 heads of 128), Gated DeltaNet 16 key / 32 value heads of 128 (conv 4), 512 routed experts of width
512 (top-10) plus a shared expert of 512, 4 hyper-connection streams of rank 320, with 3 GDN layers to each
QSA layer. What differs from the real model: the number of layers (chosen), the vocabulary (32,768 by
default instead of 248,320, to keep the two embedding tables small; a byte-level BPE of 295 tokens, the
rest unused, so llama.cpp and regolith can tokenize text) and, optionally, one PLE layer with a small n-gram
table (a ~16k-row table instead of ~320M rows).

Tensor names, shapes, order and metadata come from regolith's converter (``regolith.convert.qwen4exp``) run
on the shapes of a transformers model built on the meta device, so the file is what ``regolith convert``
would write for such a checkpoint. Weights are never quantized: quantized tensors are random bytes with
their fp16 scale fields set so each weight has standard deviation ``1 / sqrt(row length)`` (embeddings: 1)
and mean ~0, cut from a pre-generated pool of random blocks at random offsets, and streamed to disk. Routed
experts take ``--experts`` (Q4_K, Q4_0, Q8_0, IQ2_XS); dense matrices ``--dense`` (Q8_0 or F16) with
llama.cpp's converter rules (norms, routers and conv kernels stay F32).

    python benchmarks/synthetic_qwen4exp.py OUT.gguf [--layers 4] [--experts Q4_K] [--dense Q8_0]
        [--vocab 32768] [--ple] [--seed 0] [--check]

``--check`` loads the result in regolith and in llama.cpp and checks the logits are finite and not constant.

``--bundle`` writes OUT as a directory laid out as Flash-Next is published: the model in gguf-split shards
(``--split-max-size``) without its PLE table and MTP head, the table as ``ple-<type>.gguf`` (``--ple full``:
the real ~320M-row table, ``--ple-type``) and the head as ``mtp-<type>.gguf`` (``--mtp``, its experts
``--mtp-experts``). Only the headers are written: each file has its full length but its tensor data is a hole
(a sparse file, a few MB on disk), which is what ``regolith inspect DIR --plan`` reads::

    python benchmarks/synthetic_qwen4exp.py flash-next --bundle --layers 48 --experts IQ2_XS --vocab 248320 \
        --ple full --mtp
    regolith inspect flash-next --plan --memory-gb 18.8 --arena-gb 6.5 --ctx 32k,128k
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from regolith import gguf_split, quant
from regolith._atomic import atomic_path
from regolith.convert import mmproj, qwen4exp
from regolith.convert.tokenizer import gpt2_tokenizer_metadata
from regolith.convert.writer import _add_kv, mmproj_type, tensor_type

__all__ = [
    "DENSE_TYPES",
    "EXPERT_TYPES",
    "TensorSpec",
    "add_tensor_infos",
    "check",
    "config",
    "expert_bytes",
    "layout",
    "model_writer",
    "tokenizer_metadata",
    "write",
    "write_bundle",
    "write_headers",
    "write_tensors",
]

# expert type -> general.file_type
EXPERT_TYPES: dict[str, gguf.LlamaFileType] = {
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "IQ2_XS": gguf.LlamaFileType.MOSTLY_IQ2_XS,
}
DENSE_TYPES = {"Q8_0": "q8_0", "F16": "f16"}  # -> regolith.convert.writer outtype
# Byte offsets of each block's fp16 scale fields and their values relative to d. Q4_K's dmin is set to
# E[scale * q] / E[min] = 7.5 d so that the weights' mean is ~0 (6-bit scales and mins, 4-bit q); Q2_K's to
# 1.5 d (4-bit scales and mins, 2-bit q). Q6_K's signed scales and q - 32 have a mean of ~0 already.
_SCALE_FIELDS: dict[str, tuple[tuple[int, float], ...]] = {
    "Q4_K": ((0, 1.0), (2, 7.5)),
    "Q2_K": ((80, 1.0), (82, 1.5)),
    "Q6_K": ((208, 1.0),),
    "Q4_0": ((0, 1.0),),
    "Q8_0": ((0, 1.0),),
    "IQ2_XS": ((0, 1.0),),
}
# Byte offsets of the blocks' power-of-two scales (E8M0: 2^(byte - 127)), set to the power of two nearest d
_E8M0_SCALE_FIELDS: dict[str, int] = {"MXFP4": 0}
_POOL_BYTES = 32 << 20  # random blocks generated per (type, scale); tensors are cut from them
_PIECE_BYTES = 4 << 20  # at most this many consecutive pool bytes go to the file at once
MIN_FREE_BYTES = 10 << 30  # write refuses to leave less free disk space than this


@dataclass(frozen=True)
class TensorSpec:
    """One GGUF tensor: ``name``, ``shape`` (numpy order: the row is the last dim), ggml ``qtype``."""

    name: str
    shape: tuple[int, ...]
    qtype: str

    @property
    def nbytes(self) -> int:
        block, size = quant.type_size(self.qtype)  # regolith's: gguf-py 0.19 has no Q2_0
        return int(np.prod(self.shape, dtype=np.int64)) // block * size

    @property
    def is_expert(self) -> bool:
        return self.name.endswith("_exps.weight")


def config(
    n_layers: int, *, vocab: int = 32768, ple: bool | str = False, mtp: bool = False
) -> dict[str, Any]:
    """The config.json dict: ``Qwen4ExpTextConfig()`` defaults with ``n_layers`` layers (at least 2; every
    4th QSA, the last one when there are fewer than 4), the vocabulary ``vocab``, the QSA indexer and rope
    of the real checkpoint, with ``ple`` one PLE layer (the first) with a ~16k-row n-gram table (``"full"``:
    the default config's ~320M rows), and with ``mtp`` an MTP head (``mtp_num_hidden_layers`` 1)."""
    from transformers import Qwen4ExpTextConfig

    if n_layers < 2:  # transformers wants a QSA layer, llama.cpp a GDN layer (its recurrent state)
        raise ValueError(f"the model needs at least 2 layers (GDN, QSA), got {n_layers}")
    types = ["indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n_layers)]
    types[-1] = "indexed_attention" if "indexed_attention" not in types else types[-1]
    cfg = Qwen4ExpTextConfig(
        vocab_size=vocab,
        num_hidden_layers=n_layers,
        layer_types=types,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        indexer_n_heads=16,
        indexer_kv_heads=1,
        indexer_head_dim=128,
        indexer_budget=2048,
        indexer_compress_ratio=64,
        ple_layer_ids=[1] if ple else [],
        **({} if ple == "full" else {"ngram_vocab_size_base": 1000, "split_ngram_parts": 4}),
        output_gate_type="sigmoid",  # llama.cpp's qwen4exp graph always uses a sigmoid GDN gate
        eos_token_id=2,
        tie_word_embeddings=False,
    ).to_dict()
    cfg["architectures"] = ["Qwen4ExpForCausalLM"]
    if mtp:
        cfg["mtp_num_hidden_layers"] = 1
    return cfg


def _mtp_sources(hf_cfg: Any) -> list[tuple[str, Any]]:
    """``mtp.*`` tensors on the meta device for ``hf_cfg`` (regolith's MTP spec, docs/qwen4exp.md#mtp)."""
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import (
        Qwen4ExpTextDecoderLayer,
        Qwen4ExpTextGatedResidual,
    )

    from tests.qwen4exp_models import with_mtp_layer

    H = hf_cfg.hidden_size
    with torch.device("meta"):
        layer = Qwen4ExpTextDecoderLayer(with_mtp_layer(hf_cfg), hf_cfg.num_hidden_layers)
        mixer = Qwen4ExpTextGatedResidual(hf_cfg, use_combine=False)
        out = [(f"mtp.layers.0.{k}", v) for k, v in layer.state_dict().items()]
        out += [(f"mtp.hyper_connection_mixer.{k}", v) for k, v in mixer.state_dict().items()]
        out.append(("mtp.fc.weight", torch.empty(H, 2 * H)))
        out += [
            (f"mtp.{k}.weight", torch.empty(H))
            for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
        ]
    return out


def layout(
    cfg: dict[str, Any],
    expert_type: str = "Q4_K",
    dense_type: str = "Q8_0",
    *,
    ple_type: str | None = None,
    mtp_expert_type: str | None = None,
) -> list[TensorSpec]:
    """The GGUF tensors in file order, from regolith's converter plan over the shapes of a transformers
    model built on the meta device (nothing is allocated). ``ple_type`` / ``mtp_expert_type``: the PLE
    table's type and the MTP head's experts' (default: as the other tensors)."""
    import torch
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    if expert_type not in EXPERT_TYPES:
        raise ValueError(f"expert type {expert_type!r}: choose one of {', '.join(EXPERT_TYPES)}")
    if dense_type not in DENSE_TYPES:
        raise ValueError(f"dense type {dense_type!r}: choose one of {', '.join(DENSE_TYPES)}")
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")}
    text_cfg = Qwen4ExpTextConfig(**{k: v for k, v in hf_cfg.items() if k != "mtp_num_hidden_layers"})
    with torch.device("meta"):
        model = Qwen4ExpForCausalLM(text_cfg)
    items = list(model.state_dict().items())
    if cfg.get("mtp_num_hidden_layers"):
        items += _mtp_sources(text_cfg)
    sources = qwen4exp.collect_sources(items)
    head = f"blk.{cfg['num_hidden_layers']}."
    out = []
    for name, shape, _ in qwen4exp.tensor_plan(cfg, sources):
        shape = tuple(int(s) for s in shape)
        if name.endswith("_exps.weight"):
            qtype = mtp_expert_type if mtp_expert_type and name.startswith(head) else expert_type
        elif name == qwen4exp.PLE_TABLE and ple_type:
            qtype = ple_type
        else:
            qtype = tensor_type(name, shape, DENSE_TYPES[dense_type])
        out.append(TensorSpec(name, shape, qtype))
    return out


def expert_bytes(specs: list[TensorSpec]) -> int:
    """Bytes of the routed experts' tensors."""
    return sum(s.nbytes for s in specs if s.is_expert)


class _BlockPool:
    """Random valid quant blocks of one type whose weights have standard deviation ``std``."""

    def __init__(self, qtype: str, std: float, rng: np.random.Generator) -> None:
        self.size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][1]
        n = _POOL_BYTES // self.size
        self.blocks = rng.integers(0, 256, (n, self.size), dtype=np.uint8)
        self._set_scales(qtype, 1.0)
        unit = gguf.quants.dequantize(self.blocks[:256], gguf.GGMLQuantizationType[qtype]).std()
        self._set_scales(qtype, std / unit)
        self.rng = rng

    def _set_scales(self, qtype: str, d: float) -> None:
        if qtype in _E8M0_SCALE_FIELDS:
            self.blocks[:, _E8M0_SCALE_FIELDS[qtype]] = 127 + int(np.rint(np.log2(d)))
            return
        for off, rel in _SCALE_FIELDS[qtype]:
            self.blocks[:, off : off + 2] = np.frombuffer(np.float16(d * rel).tobytes(), np.uint8)

    def pieces(self, nbytes: int) -> Iterator[np.ndarray]:
        """Consecutive pool runs of whole blocks from random offsets, ``nbytes`` in all."""
        left = nbytes // self.size
        per_piece = max(1, _PIECE_BYTES // self.size)
        while left:
            start = int(self.rng.integers(len(self.blocks)))
            n = min(left, per_piece, len(self.blocks) - start)
            yield self.blocks[start : start + n]
            left -= n


def _float_values(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Plausible float32 values for an F32 / F16 tensor, by what it is."""
    name, shape = spec.name, spec.shape
    if name.endswith("ssm_a"):  # A = -exp(A_log), decay rates in [-16, -1]
        return -np.exp(rng.uniform(0.0, np.log(16.0), shape)).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if "_norm" in name:  # llama.cpp stores the multiplier (1 + w for zero-centred norms)
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("conv1d.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) * _std(spec)).astype(np.float32)


def _std(spec: TensorSpec) -> float:
    """Embedding rows have unit scale; a matrix's weights 1 / sqrt(row length), so x @ W.T keeps x's scale."""
    if spec.name in ("token_embd.weight", qwen4exp.PLE_TABLE):
        return 1.0
    return 1.0 / np.sqrt(spec.shape[-1])


def tokenizer_metadata(vocab: int) -> list[tuple[str, Any, gguf.GGUFValueType]]:
    from tests.qwen4exp_models import save_tiny_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_tokenizer(tmp)
        md = gpt2_tokenizer_metadata(tmp, vocab)
    assert md is not None
    return md


def model_writer(
    arch: str, name: str, metadata: list[tuple[str, Any, gguf.GGUFValueType]], vocab: int | None
) -> gguf.GGUFWriter:
    """A writer holding a synthetic model's metadata in ``regolith convert``'s order: type and name, the
    architecture's keys (``metadata``, a converter's ``gguf_metadata``), the quantization version and, with
    ``vocab``, the tiny tokenizer padded to that many tokens (:func:`tokenizer_metadata`)."""
    writer = gguf.GGUFWriter(path=None, arch=arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    _add_kv(writer, metadata)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if vocab is not None:
        _add_kv(writer, tokenizer_metadata(vocab))
    return writer


def _write_raw(writer: gguf.GGUFWriter, spec: TensorSpec, pieces: Iterator[np.ndarray]) -> None:
    """GGUFWriter.write_tensor_data for a tensor that arrives in pieces."""
    fout = writer.fout[0]
    info = writer.tensors[0].pop(spec.name)
    writer.write_padding(fout, fout.tell())
    written = 0
    for piece in pieces:
        piece.tofile(fout)
        written += piece.nbytes
    if written != info.nbytes:
        raise RuntimeError(f"{spec.name}: wrote {written} bytes, expected {info.nbytes}")
    writer.write_padding(fout, written)
    writer.state = gguf.WriterState.WEIGHTS


def write(
    path: str | os.PathLike[str],
    n_layers: int,
    *,
    vocab: int = 32768,
    expert_type: str = "Q4_K",
    dense_type: str = "Q8_0",
    ple: bool = False,
    seed: int = 0,
    progress: Callable[[TensorSpec, int, int], None] | None = None,
) -> list[TensorSpec]:
    """Write the synthetic GGUF to ``path`` (via a temporary file beside it, renamed when complete) and
    return its tensors. Raises OSError before writing anything when less than 10 GiB of disk would remain.
    ``progress(spec, bytes_done, bytes_total)`` is called after each tensor."""
    cfg = config(n_layers, vocab=vocab, ple=ple)
    specs = layout(cfg, expert_type, dense_type)
    writer = gguf.GGUFWriter(path=None, arch=qwen4exp.ARCH)
    add_tensor_infos(writer, specs)
    _add_model_metadata(writer, cfg, expert_type, vocab)
    write_tensors(path, writer, specs, seed=seed, progress=progress)
    return specs


def write_tensors(
    path: str | os.PathLike[str],
    writer: gguf.GGUFWriter,
    specs: list[TensorSpec],
    *,
    seed: int = 0,
    progress: Callable[[TensorSpec, int, int], None] | None = None,
) -> None:
    """Write ``writer`` (its metadata and the tensor infos of ``specs`` added) to ``path`` atomically, with
    random weights: F32 / F16 tensors by :func:`_float_values`, quantized ones cut from random block pools.
    Raises OSError before writing anything when less than 10 GiB of disk would remain."""
    path = Path(path)
    total = sum(s.nbytes for s in specs)
    free = shutil.disk_usage(path.parent).free
    if free - total < MIN_FREE_BYTES:
        raise OSError(
            f"{path}: {total / 2**30:.1f} GiB would leave {(free - total) / 2**30:.1f} GiB free on the disk "
            f"(at least {MIN_FREE_BYTES / 2**30:.0f} GiB must remain); use fewer layers or a smaller type"
        )
    rng = np.random.default_rng(seed)
    pools: dict[tuple[str, float], _BlockPool] = {}
    done = 0
    with atomic_path(path) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for s in specs:
                if s.qtype in ("F32", "F16"):
                    values = _float_values(s, rng).astype(np.float16 if s.qtype == "F16" else np.float32)
                    writer.write_tensor_data(values)
                else:
                    key = (s.qtype, _std(s))
                    if key not in pools:
                        pools[key] = _BlockPool(s.qtype, key[1], rng)
                    _write_raw(writer, s, pools[key].pieces(s.nbytes))
                done += s.nbytes
                if progress is not None:
                    progress(s, done, total)
        finally:
            writer.close()


def add_tensor_infos(writer: gguf.GGUFWriter, specs: list[TensorSpec]) -> None:
    """Declare ``specs`` in ``writer`` (type ids as regolith numbers them)."""
    for s in specs:
        # the type id as an int: gguf-py 0.19's enum has no Q2_0
        raw = quant.TYPE_IDS[s.qtype]
        writer.add_tensor_info(s.name, s.shape, np.dtype(np.float32), s.nbytes, raw_dtype=raw)  # type: ignore[arg-type]


def _add_model_metadata(writer: gguf.GGUFWriter, cfg: dict[str, Any], expert_type: str, vocab: int) -> None:
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"synthetic qwen4exp {cfg['num_hidden_layers']}L {expert_type}")
    for key, value, vtype in qwen4exp.gguf_metadata(cfg, file_type=int(EXPERT_TYPES[expert_type])) + (
        tokenizer_metadata(vocab)
    ):
        if isinstance(value, list):
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_headers(path: Path, writer: gguf.GGUFWriter, specs: list[TensorSpec]) -> None:
    """``writer``'s header, metadata and tensor infos to ``path`` (atomically), the file extended to its full
    length with the tensor data left a hole."""
    add_tensor_infos(writer, specs)
    with atomic_path(path) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
        finally:
            writer.close()
        data = sum((s.nbytes + 31) // 32 * 32 for s in specs)
        os.truncate(tmp, (os.path.getsize(tmp) + 31) // 32 * 32 + data)


def write_bundle(
    out_dir: str | os.PathLike[str],
    n_layers: int,
    *,
    vocab: int = 32768,
    expert_type: str = "Q4_K",
    dense_type: str = "Q8_0",
    ple: bool | str = "full",
    ple_type: str = "IQ4_NL",
    mtp: bool = True,
    mtp_expert_type: str = "Q2_0",
    split_max_size: int = 48 * 10**9,
    vision: bool = False,
) -> list[Path]:
    """Write the headers of a synthetic model laid out as Flash-Next is published (module docstring,
    ``--bundle``) into ``out_dir``: the model's gguf-split shards of at most ``split_max_size`` bytes,
    ``ple-<ple_type>.gguf``, ``mtp-<mtp_expert_type>.gguf`` and with ``vision`` ``mmproj-f16.gguf`` (the
    vision tower of ``Qwen4ExpVisionConfig()`` defaults, as ``regolith convert --mmproj`` writes it); returns
    the files, the first shard first."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config(n_layers, vocab=vocab, ple=ple, mtp=mtp)
    specs = layout(cfg, expert_type, dense_type, ple_type=ple_type, mtp_expert_type=mtp_expert_type)
    head = f"blk.{n_layers}."
    side = {
        f"ple-{ple_type.lower()}.gguf": [s for s in specs if s.name == qwen4exp.PLE_TABLE],
        f"mtp-{mtp_expert_type.lower()}.gguf": [s for s in specs if s.name.startswith(head)],
    }
    main = [s for s in specs if not any(s in group for group in side.values())]
    plan = gguf_split.plan_shards([s.nbytes for s in main], max_size=split_max_size)
    written = []
    for i, shard in enumerate(plan):
        writer = gguf.GGUFWriter(path=None, arch=qwen4exp.ARCH)
        if i == 0:
            _add_model_metadata(writer, cfg, expert_type, vocab)
        else:
            writer.kv_data[0].clear()
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, i)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, len(plan))
        writer.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, len(main))
        path = gguf_split.shard_path(out / f"flash-next-{expert_type}.gguf", i, len(plan))
        write_headers(path, writer, [main[j] for j in shard])
        written.append(path)
    for name, group in side.items():
        if group:
            write_headers(out / name, gguf.GGUFWriter(path=None, arch=qwen4exp.ARCH), group)
            written.append(out / name)
    if vision:
        writer = gguf.GGUFWriter(path=None, arch="clip")
        writer.add_type(gguf.GGUFType.MMPROJ)
        md, specs = projector(int(cfg["hidden_size"]))
        _add_kv(writer, md)
        write_headers(out / "mmproj-f16.gguf", writer, specs)
        written.append(out / "mmproj-f16.gguf")
    return written


def projector(hidden: int) -> tuple[list[tuple[str, Any, Any]], list[TensorSpec]]:
    """The metadata and tensors (in file order) of the projector GGUF regolith's converter writes for the
    vision tower of ``Qwen4ExpVisionConfig()`` defaults projecting to ``hidden``-wide embeddings, from the
    shapes of a transformers vision model built on the meta device."""
    import torch
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpVisionConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpVisionModel

    vision_cfg = Qwen4ExpVisionConfig(out_hidden_size=hidden)
    with torch.device("meta"):
        model = Qwen4ExpVisionModel(vision_cfg)
    config = {"hidden_size": hidden, "vision_config": vision_cfg.to_dict()}
    plan = mmproj.mmproj_tensors(config, [("model.visual." + n, t) for n, t in model.state_dict().items()])
    specs = [
        TensorSpec(name, tuple(int(s) for s in shape), mmproj_type(name, shape, "f16"))
        for name, shape, _ in plan
    ]
    return mmproj.mmproj_metadata(config, {}, file_type=int(gguf.LlamaFileType.MOSTLY_F16)), specs


def _logit_summary(logits: np.ndarray) -> str:
    if not np.isfinite(logits).all():
        raise RuntimeError("logits hold inf or NaN values")
    if float(logits.std(axis=-1).min()) == 0.0:
        raise RuntimeError("the logits of a position are constant")
    return f"finite, std {logits.std():.3g}, range [{logits.min():.3g}, {logits.max():.3g}]"


def check(path: str | os.PathLike[str], n_tokens: int = 8) -> dict[str, str]:
    """Load ``path`` in regolith and in llama.cpp (when installed), evaluate ``n_tokens`` token ids and
    summarise the logits; raises RuntimeError when they are not finite or a position's are constant."""
    import regolith

    ids = [int(t) for t in np.random.default_rng(1).integers(3, 259, n_tokens)]
    model = regolith.Model.load(path)
    out = {"regolith": _logit_summary(np.asarray(model.window(64).eval(ids)))}
    try:
        import llama_cpp
    except ImportError:
        return out
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    out["llama.cpp"] = _logit_summary(np.asarray(llm.scores[: len(ids)]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", choices=list(EXPERT_TYPES), default="Q4_K")
    ap.add_argument("--dense", choices=list(DENSE_TYPES), default="Q8_0")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument(
        "--ple",
        nargs="?",
        const=True,
        choices=[True, "full"],
        help="make the first layer a PLE layer (full: with the real ~320M-row table)",
    )
    ap.add_argument("--ple-type", default="IQ4_NL", help="--bundle: the PLE table's type")
    ap.add_argument("--mtp", action="store_true", help="--bundle: with an MTP head")
    ap.add_argument("--vision", action="store_true", help="--bundle: with the vision tower's projector")
    ap.add_argument("--mtp-experts", default="Q2_0", help="--bundle: the MTP head's experts' type")
    ap.add_argument(
        "--bundle", action="store_true", help="write OUT as a sparse, headers-only model directory"
    )
    ap.add_argument(
        "--split-max-size", default="48G", help="--bundle: the largest shard (gguf-split's N(M|G))"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="load it in regolith and llama.cpp afterwards")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.bundle:
        files = write_bundle(
            args.out,
            args.layers,
            vocab=args.vocab,
            expert_type=args.experts,
            dense_type=args.dense,
            ple=args.ple or False,
            ple_type=args.ple_type,
            mtp=args.mtp,
            mtp_expert_type=args.mtp_experts,
            split_max_size=gguf_split.parse_size(args.split_max_size),
            vision=args.vision,
        )
        for f in files:
            print(f"{f}: {f.stat().st_size / 1e9:.2f} GB ({f.stat().st_blocks * 512 / 1e6:.1f} MB on disk)")
        return

    def progress(spec: TensorSpec, done: int, total: int) -> None:
        if spec.name.endswith("ffn_down_exps.weight"):  # once per layer
            rate = done / (time.perf_counter() - t0) / 1e6
            print(f"{spec.name[: spec.name.index('.', 4)]}: {done / 2**30:.2f} / {total / 2**30:.2f} GiB, "
                  f"{rate:.0f} MB/s", flush=True)  # fmt: skip

    specs = write(
        args.out,
        args.layers,
        vocab=args.vocab,
        expert_type=args.experts,
        dense_type=args.dense,
        ple=args.ple,
        seed=args.seed,
        progress=progress,
    )
    size = os.path.getsize(args.out)
    print(
        f"{args.out}: {size / 2**30:.2f} GiB ({expert_bytes(specs) / 2**30:.2f} GiB routed experts) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    if args.check:
        for engine, summary in check(args.out).items():
            print(f"{engine}: logits {summary}")


if __name__ == "__main__":
    main()
