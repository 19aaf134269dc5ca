"""qwen3_5_moe (Hugging Face, Qwen3.5 MoE) -> llama.cpp's ``qwen35moe`` GGUF layout, as pure functions.

``gguf_metadata(config)`` gives the ``qwen35moe.*`` keys (and ``general.file_type``) and
``tensor_plan(config, sources)`` the GGUF tensors, with the names, shapes, order and value transforms of
llama.cpp's converter (``conversion/qwen.py``: ``Qwen3_5MoeTextModel`` on ``Qwen3NextModel`` and
``Qwen2MoeModel``). Qwen3.5 MoE is qwen4_exp without hyper-connections, indexer and PLE, so the Gated
DeltaNet, gated attention, MoE and MTP handling is :mod:`regolith.convert.qwen_hybrid`'s (qwen4exp's too):

- tensors in the order llama.cpp walks a checkpoint (file by file, by name within a file:
  ``Checkpoint.tensors_by_name``), each layer's routed experts stacked once its last one is seen (or
  transformers' fused ``gate_up_proj`` / ``down_proj`` split where they stand);
- ``+ 1`` on every ``*norm.weight`` but the Gated DeltaNet's ``linear_attn.norm.weight`` (transformers'
  zero-centred gammas), ``A_log`` -> ``-exp(A_log)``, ``dt_bias`` -> ``ssm_dt.bias``, the conv kernel
  squeezed, value heads reordered from grouped to tiled order when there are more than key heads;
- the MTP head (``mtp.*``) as block ``L = num_hidden_layers``: ``block_count = L + 1``,
  ``nextn_predict_layers = 1``. It is written when the checkpoint has ``mtp.*`` tensors (llama.cpp counts
  them when config.json lacks ``mtp_num_hidden_layers``); without them the file has no MTP block, as
  llama.cpp's ``--no-mtp`` writes, whatever config.json says.

``Qwen3_5MoeForConditionalGeneration`` checkpoints (``text_config`` nested, ``model.language_model.*``)
convert to the same file; their vision tensors are dropped. Shapes are numpy order (a GGUF
``[ne0, ne1]`` tensor is ``(ne1, ne0)``). docs/formats.md has the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gguf import GGUFValueType

from ..errors import ModelFormatError
from .qwen_hybrid import (
    LINEAR_ATTENTION_NAMES,
    Metadata,
    PlannedTensor,
    TensorSource,
    collect_sources,
    has_mtp,
    hybrid_metadata,
    hybrid_tensor_plan,
    hybrid_text_config,
    linear_attention_shapes,
    linear_attention_transform,
    rope_parameters,
)

__all__ = [
    "ARCH",
    "HF_ARCHITECTURES",
    "collect_sources",
    "gguf_metadata",
    "handles",
    "has_mtp",
    "tensor_plan",
    "text_config",
]

ARCH = "qwen35moe"
HF_ARCHITECTURES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
# llama.cpp's default M-RoPE sections, written when the checkpoint gives none (its loader requires the key)
_DEFAULT_MROPE_SECTIONS = [11, 11, 10, 0]


# ---------------------------------------------------------------------------------------------- config


def handles(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (config.json) is a Qwen3.5 MoE checkpoint (text-only or with its vision tower)."""
    if not isinstance(config, Mapping):
        return False
    archs = config.get("architectures") or []
    return bool(set(archs) & set(HF_ARCHITECTURES)) or config.get("model_type") in _MODEL_TYPES


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's hyper-parameters from a config.json dict (``text_config`` merged over the top level,
    as llama.cpp does), validated. Raises ModelFormatError for another architecture or for what llama.cpp's
    ``qwen35moe`` graph does not compute: attention biases, RoPE scaling, unknown layer types, value heads
    that are no multiple of the key heads, key and value head sizes that differ
    (:func:`~regolith.convert.qwen_hybrid.hybrid_text_config`), malformed M-RoPE sections, an MTP head with
    embeddings of its own."""
    if not handles(config):
        raise ModelFormatError("config.json is not a qwen3_5_moe checkpoint")
    cfg = hybrid_text_config(config, ARCH)
    sections = rope_parameters(cfg).get("mrope_section")
    if sections is not None and (
        not isinstance(sections, list) or len(sections) > 4 or not all(isinstance(s, int) for s in sections)
    ):
        raise ModelFormatError(f"config.json: mrope_section must list up to 4 integers, got {sections!r}")
    if cfg.get("mtp_use_dedicated_embeddings"):
        raise ModelFormatError(
            "config.json: mtp_use_dedicated_embeddings: an MTP head with its own embeddings is not part of "
            "llama.cpp's qwen35moe layout"
        )
    return cfg


# -------------------------------------------------------------------------------------------- metadata


def gguf_metadata(config: Mapping[str, Any], *, file_type: int | None = None, mtp: bool = False) -> Metadata:
    """The architecture's GGUF keys in llama.cpp's order: ``(key, value, type)``; a list value is an array
    of ``type`` elements. ``general.file_type`` is included (at llama.cpp's position) when ``file_type`` is
    given; ``mtp``: the checkpoint has the MTP head (:func:`has_mtp`), written as one more block."""
    cfg = text_config(config)
    md = hybrid_metadata(cfg, ARCH, file_type=file_type, mtp=mtp)
    if "mrope_section" not in rope_parameters(cfg):
        md.append((f"{ARCH}.rope.dimension_sections", list(_DEFAULT_MROPE_SECTIONS), GGUFValueType.INT32))
    return md


# --------------------------------------------------------------------------------------------- tensors


def _linear_tensors(cfg: Mapping[str, Any], bid: int, key: str, name: str) -> list[PlannedTensor]:
    """One Gated DeltaNet tensor: llama.cpp's name, value heads tiled (``linear_attention_transform``)."""
    lk, dk, lv, dv = (
        cfg["linear_num_key_heads"],
        cfg["linear_key_head_dim"],
        cfg["linear_num_value_heads"],
        cfg["linear_value_head_dim"],
    )
    shape = linear_attention_shapes(cfg)[key]
    if key == "linear_attn.conv1d.weight":
        shape = (2 * lk * dk + lv * dv, cfg["linear_conv_kernel_dim"])
    return [
        PlannedTensor(
            f"blk.{bid}.{LINEAR_ATTENTION_NAMES[key]}",
            (name,),
            lambda xs: linear_attention_transform(cfg, key, xs[0]),
            shape,
        )
    ]


def tensor_plan(
    config: Mapping[str, Any], sources: Mapping[str, TensorSource]
) -> list[tuple[str, tuple[int, ...], Any]]:
    """``(gguf_name, numpy_shape, build)`` for every output tensor in llama.cpp's order, from shapes only
    (nothing is read); ``build()`` returns the float32 array. ``sources``: :func:`collect_sources`'s
    normalised names, in the checkpoint's order. Validates names and shapes (ModelFormatError)."""
    cfg = text_config(config)
    return hybrid_tensor_plan(
        cfg,
        sources,
        ARCH,
        linear_attention_shapes(cfg),
        lambda bid, key, name: _linear_tensors(cfg, bid, key, name),
    )
