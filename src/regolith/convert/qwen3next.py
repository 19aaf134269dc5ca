"""qwen3_next (Hugging Face, Qwen3-Next) -> llama.cpp's ``qwen3next`` GGUF layout, as pure functions.

``gguf_metadata(config)`` gives the ``qwen3next.*`` keys (and ``general.file_type``) and
``tensor_plan(config, sources)`` the GGUF tensors, with the names, shapes, order and value transforms of
llama.cpp's converter (``conversion/qwen.py``: ``Qwen3NextModel``, with ``_QwenMtpMixin`` on
``Qwen2MoeModel``). Qwen3.5 MoE is the same model with the Gated DeltaNet's projections split, so all but
those is :mod:`regolith.convert.qwen_hybrid`'s ``hybrid_*`` (shared with :mod:`regolith.convert.qwen35moe`):

- tensors in the order llama.cpp walks a checkpoint (file by file, by name within a file:
  ``Checkpoint.tensors_by_name``), each layer's routed experts stacked once its last one is seen (or
  transformers' fused ``gate_up_proj`` / ``down_proj`` split where they stand);
- ``linear_attn.in_proj_qkvz`` (per key head ``[q, k, v of its value heads, z of them]``) split into
  ``attn_qkv`` (``[all q | all k | all v]``) and ``attn_gate`` (z); ``linear_attn.in_proj_ba`` (per key head
  ``[b of its value heads, a of them]``) kept whole as ``ssm_ba``; the value heads stay grouped by key head
  (HF's order, which llama.cpp's qwen3next graph reads: no reordering, unlike qwen35moe);
- ``+ 1`` on every ``*norm.weight`` but the Gated DeltaNet's ``linear_attn.norm.weight`` (transformers'
  zero-centred gammas), ``A_log`` -> ``-exp(A_log)``, ``dt_bias`` -> ``ssm_dt.bias``, the conv kernel
  squeezed;
- the MTP head (``mtp.*``) as block ``L = num_hidden_layers``: ``block_count = L + 1``,
  ``nextn_predict_layers = 1``. Qwen3-Next's config.json has no ``mtp_num_hidden_layers``: llama.cpp counts
  the MTP layers from the tensors, and so does regolith; without ``mtp.*`` tensors the file has no MTP block
  (llama.cpp asserts there, unless ``--no-mtp``, whose file this is).

Shapes are numpy order (a GGUF ``[ne0, ne1]`` tensor is ``(ne1, ne0)``). docs/formats.md has the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ModelFormatError
from .qwen_hybrid import (
    Metadata,
    PlannedTensor,
    TensorSource,
    collect_sources,
    has_mtp,
    hybrid_metadata,
    hybrid_tensor_plan,
    hybrid_text_config,
    rope_parameters,
)

__all__ = [
    "ARCH",
    "HF_ARCHITECTURES",
    "collect_sources",
    "gguf_metadata",
    "handles",
    "has_mtp",
    "linear_attention_shapes",
    "split_qkvz",
    "tensor_plan",
    "text_config",
]

ARCH = "qwen3next"
HF_ARCHITECTURES = ("Qwen3NextForCausalLM",)
_MODEL_TYPES = ("qwen3_next",)

# Gated DeltaNet tensors (without the ``model.layers.N.`` prefix) -> llama.cpp's (without ``blk.N.``);
# in_proj_qkvz gives two, attn_qkv and attn_gate (split_qkvz)
_LINEAR_NAMES = {
    "linear_attn.A_log": "ssm_a",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
_QKVZ = "linear_attn.in_proj_qkvz.weight"


# ---------------------------------------------------------------------------------------------- config


def handles(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (config.json) is a Qwen3-Next checkpoint."""
    if not isinstance(config, Mapping):
        return False
    archs = config.get("architectures") or []
    return bool(set(archs) & set(HF_ARCHITECTURES)) or config.get("model_type") in _MODEL_TYPES


def _dense_layers(cfg: Mapping[str, Any]) -> list[int]:
    """The layers transformers gives a dense MLP instead of the MoE block (``mlp_only_layers``, and those
    ``decoder_sparse_step`` skips)."""
    only, step = cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step", 1)
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ModelFormatError(f"config.json: mlp_only_layers must list layer indices, got {only!r}")
    if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
        raise ModelFormatError(f"config.json: decoder_sparse_step must be a positive integer, got {step!r}")
    return [i for i in range(cfg["num_hidden_layers"]) if i in only or (i + 1) % step]


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's hyper-parameters from a config.json dict, validated. Raises ModelFormatError for
    another architecture or for what llama.cpp's ``qwen3next`` graph does not compute: dense MLP layers
    (``mlp_only_layers``, ``decoder_sparse_step``: its graph has a MoE block in every layer), top-k weights
    left unnormalised (``norm_topk_prob: false``: its graph always renormalises), M-RoPE sections, and
    :func:`~regolith.convert.qwen_hybrid.hybrid_text_config`'s refusals (attention biases, RoPE scaling,
    unknown layer types, value heads that are no multiple of the key heads, key and value head sizes that
    differ, ...). Without ``layer_types`` (the released config.json files) the layers follow
    ``full_attention_interval``, as in transformers."""
    if not handles(config):
        raise ModelFormatError("config.json is not a qwen3_next checkpoint")
    cfg = hybrid_text_config(config, ARCH, layer_types_required=False)
    if "mrope_section" in rope_parameters(cfg):
        raise ModelFormatError(
            "config.json: mrope_section: Qwen3-Next rotates by text position only (no M-RoPE sections in "
            "llama.cpp's qwen3next graph)"
        )
    dense = _dense_layers(cfg)
    if dense:
        raise ModelFormatError(
            f"config.json: layers {dense} are dense MLP layers (mlp_only_layers / decoder_sparse_step); "
            "llama.cpp's qwen3next graph has a MoE block in every layer"
        )
    if cfg.get("norm_topk_prob", True) is not True:
        raise ModelFormatError(
            f"config.json: norm_topk_prob {cfg['norm_topk_prob']!r}: llama.cpp's qwen3next graph always "
            "renormalises the top-k expert weights"
        )
    return cfg


# -------------------------------------------------------------------------------------------- metadata


def gguf_metadata(config: Mapping[str, Any], *, file_type: int | None = None, mtp: bool = False) -> Metadata:
    """The architecture's GGUF keys in llama.cpp's order: ``(key, value, type)``; a list value is an array
    of ``type`` elements. ``general.file_type`` is included (at llama.cpp's position) when ``file_type`` is
    given; ``mtp``: the checkpoint has the MTP head (:func:`has_mtp`), written as one more block.
    ``attention.recurrent_layers`` is written when config.json lists ``layer_types``."""
    return hybrid_metadata(text_config(config), ARCH, file_type=file_type, mtp=mtp)


# --------------------------------------------------------------------------------------------- tensors


def linear_attention_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A Qwen3-Next Gated DeltaNet layer's tensors (names without the layer prefix), Hugging Face shapes."""
    H = cfg["hidden_size"]
    lk, lv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    return {
        "linear_attn.A_log": (lv,),
        "linear_attn.conv1d.weight": (2 * lk * dk + lv * dv, 1, K),
        "linear_attn.dt_bias": (lv,),
        "linear_attn.in_proj_ba.weight": (2 * lv, H),
        _QKVZ: (2 * lk * dk + 2 * lv * dv, H),
        "linear_attn.norm.weight": (dv,),
        "linear_attn.out_proj.weight": (H, lv * dv),
    }


def split_qkvz(cfg: Mapping[str, Any], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``in_proj_qkvz`` [lk * (2 dk + 2 r dv), H] (per key head: q, k, then v and z of its r value heads)
    -> (``attn_qkv`` [2 lk dk + lv dv, H]: all q, all k, all v; ``attn_gate`` [lv dv, H]: all z), value
    heads grouped by key head in both, as llama.cpp's converter splits it."""
    lk, lv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    rv, H = lv // lk * dv, x.shape[-1]
    heads = x.reshape(lk, 2 * dk + 2 * rv, H)  # [key head][q k v z rows][H]
    q, k, v, z = np.split(heads, [dk, 2 * dk, 2 * dk + rv], axis=1)
    qkv = np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)], axis=0)
    return qkv, np.ascontiguousarray(z.reshape(-1, H))


def _linear_transform(key: str, x: np.ndarray) -> np.ndarray:
    """llama.cpp's value transform of a Gated DeltaNet tensor but ``in_proj_qkvz``: ``A_log`` ->
    ``-exp(A_log)``, the conv kernel squeezed to [channels, kernel], the rest (the norm too) as is."""
    if key == "linear_attn.A_log":
        return (-np.exp(x.astype(np.float64))).astype(np.float32)  # correctly rounded, as torch
    if key == "linear_attn.conv1d.weight":
        return x.reshape(x.shape[0], x.shape[-1])
    return x


def _linear_tensors(cfg: Mapping[str, Any], bid: int, key: str, name: str) -> list[PlannedTensor]:
    """The GGUF tensors of one Gated DeltaNet tensor: ``in_proj_qkvz`` split (:func:`split_qkvz`), the
    rest renamed and transformed (:func:`_linear_transform`)."""
    if key == _QKVZ:
        H, lk, dk = cfg["hidden_size"], cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
        value_dim = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
        return [
            PlannedTensor(
                f"blk.{bid}.attn_qkv.weight",
                (name,),
                lambda xs: split_qkvz(cfg, xs[0])[0],
                (2 * lk * dk + value_dim, H),
            ),
            PlannedTensor(
                f"blk.{bid}.attn_gate.weight", (name,), lambda xs: split_qkvz(cfg, xs[0])[1], (value_dim, H)
            ),
        ]
    shape = linear_attention_shapes(cfg)[key]
    if key == "linear_attn.conv1d.weight":
        shape = (shape[0], shape[-1])
    return [
        PlannedTensor(
            f"blk.{bid}.{_LINEAR_NAMES[key]}", (name,), lambda xs: _linear_transform(key, xs[0]), shape
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
