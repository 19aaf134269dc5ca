"""qwen3_5_moe (Hugging Face, Qwen3.5 MoE) -> llama.cpp's ``qwen35moe`` GGUF layout, as pure functions.

``gguf_metadata(config)`` gives the ``qwen35moe.*`` keys (and ``general.file_type``) and
``tensor_plan(config, sources)`` the GGUF tensors, with the names, shapes, order and value transforms of
llama.cpp's converter (``conversion/qwen.py``: ``Qwen3_5MoeTextModel`` on ``Qwen3NextModel`` and
``Qwen2MoeModel``). Qwen3.5 MoE is qwen4_exp without hyper-connections, indexer and PLE, so the Gated
DeltaNet, gated attention, MoE and MTP handling is :mod:`regolith.convert.qwen4exp`'s:

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

import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFormatError
from .qwen4exp import (
    ATTENTION_NAMES,
    LAYER_TENSOR,
    LINEAR_ATTENTION_NAMES,
    MOE_NAMES,
    MTP_HEAD_NAMES,
    MTP_LAYER_TENSOR,
    Metadata,
    PlannedTensor,
    RoutedExperts,
    TensorSource,
    attention_shapes,
    head_dim,
    linear_attention_shapes,
    linear_attention_transform,
    load_float32,
    moe_shapes,
    normalize_name,
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
_LAYER_TYPES = ("linear_attention", "full_attention")
# llama.cpp's default M-RoPE sections, written when the checkpoint gives none (its loader requires the key)
_DEFAULT_MROPE_SECTIONS = [11, 11, 10, 0]

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    **LINEAR_ATTENTION_NAMES,
    **ATTENTION_NAMES,
    **MOE_NAMES,
}
_MTP_LAYER_ANY = re.compile(r"^mtp\.layers\.(\d+)\.")


# ---------------------------------------------------------------------------------------------- config


def handles(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (config.json) is a Qwen3.5 MoE checkpoint (text-only or with its vision tower)."""
    if not isinstance(config, Mapping):
        return False
    archs = config.get("architectures") or []
    return bool(set(archs) & set(HF_ARCHITECTURES)) or config.get("model_type") in _MODEL_TYPES


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's hyper-parameters from a config.json dict (``text_config`` merged over the top level,
    as llama.cpp does), validated. Raises ModelFormatError for another architecture or for what llama.cpp's
    ``qwen35moe`` graph does not compute: attention biases, RoPE scaling, unknown layer types, value heads
    that are no multiple of the key heads, key and value head sizes that differ."""
    if not handles(config):
        raise ModelFormatError("config.json is not a qwen3_5_moe checkpoint")
    cfg = dict(config)
    if isinstance(config.get("text_config"), Mapping):
        cfg.update(config["text_config"])
    for k in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ):
        if not _positive_int(cfg.get(k)):
            raise ModelFormatError(f"config.json: {k} must be a positive integer, got {cfg.get(k)!r}")
    for k in ("head_dim", "max_position_embeddings", "full_attention_interval"):
        if cfg.get(k) is not None and not _positive_int(cfg[k]):
            raise ModelFormatError(f"config.json: {k} must be a positive integer, got {cfg[k]!r}")
    eps = cfg.get("rms_norm_eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        raise ModelFormatError(f"config.json: rms_norm_eps must be a positive number, got {eps!r}")
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != n:
        raise ModelFormatError(f"config.json: layer_types must list {n} layer types, got {types!r}")
    bad = sorted({repr(t) for t in types if t not in _LAYER_TYPES})
    if bad:
        raise ModelFormatError(
            f"config.json: unknown layer types {', '.join(bad)} in layer_types "
            f"(expected {' or '.join(_LAYER_TYPES)})"
        )
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ModelFormatError("config.json: num_key_value_heads must divide num_attention_heads")
    if cfg["num_experts_per_tok"] > cfg["num_experts"]:
        raise ModelFormatError("config.json: num_experts_per_tok exceeds num_experts")
    if cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"]:
        raise ModelFormatError(
            "config.json: linear_num_value_heads must be a multiple of linear_num_key_heads"
        )
    if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
        raise ModelFormatError(
            "config.json: linear_key_head_dim and linear_value_head_dim differ; llama.cpp's qwen35moe layout "
            "has one Gated DeltaNet head size (ssm.state_size)"
        )
    if cfg.get("attention_bias"):
        raise ModelFormatError("config.json: attention_bias is not part of llama.cpp's qwen35moe graph")
    if cfg.get("is_causal") is False:
        raise ModelFormatError("config.json: is_causal false (bidirectional attention) is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelFormatError(
            f"config.json: hidden_act {cfg['hidden_act']!r}: the experts' activation is SiLU"
        )
    rope = cfg.get("rope_parameters", cfg.get("rope_scaling"))
    if rope is not None and not isinstance(rope, Mapping):
        raise ModelFormatError(f"config.json: rope_parameters must be an object, got {rope!r}")
    rope = rope_parameters(cfg)
    sections = rope.get("mrope_section")
    if sections is not None and (
        not isinstance(sections, list) or len(sections) > 4 or not all(isinstance(s, int) for s in sections)
    ):
        raise ModelFormatError(f"config.json: mrope_section must list up to 4 integers, got {sections!r}")
    mtp = cfg.get("mtp_num_hidden_layers")
    if mtp is not None and (not isinstance(mtp, int) or isinstance(mtp, bool) or mtp not in (0, 1)):
        raise ModelFormatError(
            f"config.json: mtp_num_hidden_layers must be 0 or 1 (one MTP layer), got {mtp!r}"
        )
    if cfg.get("mtp_use_dedicated_embeddings"):
        raise ModelFormatError(
            "config.json: mtp_use_dedicated_embeddings: an MTP head with its own embeddings is not part of "
            "llama.cpp's qwen35moe layout"
        )
    if cfg.get("head_dim") is None:
        cfg["head_dim_implicit"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


# -------------------------------------------------------------------------------------------- metadata


def gguf_metadata(config: Mapping[str, Any], *, file_type: int | None = None, mtp: bool = False) -> Metadata:
    """The architecture's GGUF keys in llama.cpp's order: ``(key, value, type)``; a list value is an array
    of ``type`` elements. ``general.file_type`` is included (at llama.cpp's position) when ``file_type`` is
    given; ``mtp``: the checkpoint has the MTP head (:func:`has_mtp`), written as one more block."""
    cfg = text_config(config)
    u32, i32, f32, boolean = (
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.FLOAT32,
        GGUFValueType.BOOL,
    )
    p = f"{ARCH}."
    n = cfg["num_hidden_layers"]
    rope = rope_parameters(cfg)
    md: Metadata = [(p + "block_count", n + int(mtp), u32)]
    for key, names in (
        (
            "context_length",
            (
                "max_position_embeddings",
                "n_ctx",
                "n_positions",
                "max_length",
                "max_sequence_length",
                "model_max_length",
            ),
        ),
        ("embedding_length", ("hidden_size",)),
        (
            "feed_forward_length",
            ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size"),
        ),
        ("attention.head_count", ("num_attention_heads",)),
        ("attention.head_count_kv", ("num_key_value_heads",)),
    ):
        value = next((cfg[k] for k in names if cfg.get(k) is not None), None)
        if value is not None:
            md.append((p + key, int(value), u32))
    if "mrope_section" in rope:
        sections = (list(rope["mrope_section"]) + [0, 0, 0, 0])[:4]
        md.append((p + "rope.dimension_sections", sections, i32))
    if rope.get("rope_theta") is not None:
        md.append((p + "rope.freq_base", float(rope["rope_theta"]), f32))
    md.append((p + "attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]), f32))
    for k in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if cfg.get(k) is not None:
            md.append((p + "attention.layer_norm_epsilon", float(cfg[k]), f32))
            break
    md.append((p + "expert_count", cfg["num_experts"], u32))
    md.append((p + "expert_used_count", cfg["num_experts_per_tok"], u32))
    if cfg.get("head_dim") is not None:
        md.append((p + "attention.key_length", cfg["head_dim"], u32))
        md.append((p + "attention.value_length", cfg["head_dim"], u32))
    if file_type is not None:
        md.append(("general.file_type", int(file_type), u32))
    md += [
        (p + "expert_feed_forward_length", cfg["moe_intermediate_size"], u32),
        (p + "expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"], u32),
    ]
    if mtp:
        md.append((p + "nextn_predict_layers", 1, u32))
    md += [
        (p + "ssm.conv_kernel", cfg["linear_conv_kernel_dim"], u32),
        (p + "ssm.state_size", cfg["linear_key_head_dim"], u32),
        (p + "ssm.group_count", cfg["linear_num_key_heads"], u32),
        (p + "ssm.time_step_rank", cfg["linear_num_value_heads"], u32),
        (p + "ssm.inner_size", cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"], u32),
        (
            p + "attention.recurrent_layers",
            [t == "linear_attention" for t in cfg["layer_types"]] + [False] * int(mtp),
            boolean,
        ),
        (p + "full_attention_interval", int(cfg.get("full_attention_interval") or 4), u32),
        (p + "rope.dimension_count", int(head_dim(cfg) * rope.get("partial_rotary_factor", 0.25)), u32),
    ]
    if "mrope_section" not in rope:
        md.append((p + "rope.dimension_sections", list(_DEFAULT_MROPE_SECTIONS), i32))
    return md


# --------------------------------------------------------------------------------------------- tensors


def collect_sources(named_tensors: Iterable[tuple[str, TensorSource]]) -> dict[str, TensorSource]:
    """Normalised name (``language_model.`` stripped, ``model.mtp.`` -> ``mtp.``) -> source, in the given
    order (pass ``Checkpoint.tensors_by_name()`` for llama.cpp's), without the vision tower's tensors."""
    out: dict[str, TensorSource] = {}
    for name, src in named_tensors:
        norm = normalize_name(name)
        if norm is None:
            continue
        if norm in out:
            raise ModelFormatError(f"checkpoint: tensor {norm} appears twice")
        out[norm] = src
    return out


def has_mtp(sources: Mapping[str, TensorSource]) -> bool:
    """Whether the checkpoint (normalised names, :func:`collect_sources`) holds the MTP head."""
    return any(name.startswith("mtp.") for name in sources)


def _expected_shapes(cfg: Mapping[str, Any], mtp: bool) -> dict[str, tuple[int, ...]]:
    """Every HF tensor but the routed experts (normalised name) and its shape; lm_head even when tied."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (V, H),
        "model.norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    norms = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,)}
    linear = {**norms, **linear_attention_shapes(cfg), **moe_shapes(cfg)}
    full = {**norms, **attention_shapes(cfg), **moe_shapes(cfg)}
    for i, kind in enumerate(cfg["layer_types"]):
        layer = linear if kind == "linear_attention" else full
        out.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
    if mtp:
        out.update(
            {
                "mtp.fc.weight": (H, 2 * H),
                "mtp.pre_fc_norm_embedding.weight": (H,),
                "mtp.pre_fc_norm_hidden.weight": (H,),
                "mtp.norm.weight": (H,),
            }
        )
        out.update({f"mtp.layers.0.{k}": v for k, v in full.items()})
    return out


def _block_transform(cfg: Mapping[str, Any], key: str, x: np.ndarray) -> np.ndarray:
    """llama.cpp's value transform of a block tensor (``key`` without the layer prefix)."""
    if key.startswith("linear_attn."):
        return linear_attention_transform(cfg, key, x)
    return x + np.float32(1.0) if key.endswith("norm.weight") else x


def _plus_one(x: np.ndarray) -> np.ndarray:
    return x + np.float32(1.0)


def _plan(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> list[PlannedTensor]:
    n_layers = cfg["num_hidden_layers"]
    mtp = has_mtp(shapes)
    tied = bool(cfg.get("tie_word_embeddings", False))
    expected = _expected_shapes(cfg, mtp)
    experts = RoutedExperts(cfg)
    plan: list[PlannedTensor] = []

    def err(msg: str) -> ModelFormatError:
        return ModelFormatError(f"checkpoint: {msg}")

    for name, shape in shapes.items():
        want = expected.get(name)
        if want is not None and shape != want:
            raise err(f"tensor {name} has shape {list(shape)}, expected {list(want)} from config.json")
        if name in _GLOBAL:  # lm_head of a tied checkpoint too, as llama.cpp writes it
            build = _plus_one if name == "model.norm.weight" else (lambda x: x)
            plan.append(PlannedTensor(_GLOBAL[name], (name,), lambda xs, f=build: f(xs[0]), shape))
            continue
        if name in MTP_HEAD_NAMES:
            build = (lambda x: x) if name == "mtp.fc.weight" else _plus_one
            out = f"blk.{n_layers}.nextn.{MTP_HEAD_NAMES[name]}"
            plan.append(PlannedTensor(out, (name,), lambda xs, f=build: f(xs[0]), shape))
            continue
        m, mm = LAYER_TENSOR.match(name), MTP_LAYER_TENSOR.match(name)
        if m is not None:
            bid, key = int(m.group(1)), m.group(2)
            if bid >= n_layers:
                raise err(f"tensor {name} is beyond num_hidden_layers ({n_layers})")
        elif mm is not None:
            bid, key = n_layers, mm.group(1)
        elif (extra := _MTP_LAYER_ANY.match(name)) is not None:
            raise err(
                f"tensor {name}: MTP layer {extra.group(1)}; llama.cpp's qwen35moe graph has one MTP layer"
            )
        else:
            raise err(f"unexpected tensor {name}")
        if key in _BLOCK:
            if want is None:
                kind = cfg["layer_types"][bid] if bid < n_layers else "the MTP layer (full_attention)"
                raise err(f"unexpected tensor {name} (layer {bid} is {kind})")
            out_shape = (shape[0], shape[-1]) if key == "linear_attn.conv1d.weight" else shape
            plan.append(
                PlannedTensor(
                    f"blk.{bid}.{_BLOCK[key]}",
                    (name,),
                    lambda xs, k=key: _block_transform(cfg, k, xs[0]),
                    out_shape,
                )
            )
            continue
        outs = experts.take(bid, key, name, shape)
        if outs is None:
            raise err(f"unexpected tensor {name}")
        plan += outs

    missing = sorted(k for k in expected if k not in shapes and not (k == "lm_head.weight" and tied))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise err(f"missing tensors {', '.join(missing[:5])}{more}")
    experts.check_complete(n_layers + int(mtp))
    return plan


def tensor_plan(
    config: Mapping[str, Any], sources: Mapping[str, TensorSource]
) -> list[tuple[str, tuple[int, ...], Any]]:
    """``(gguf_name, numpy_shape, build)`` for every output tensor in llama.cpp's order, from shapes only
    (nothing is read); ``build()`` returns the float32 array. ``sources``: :func:`collect_sources`'s
    normalised names, in the checkpoint's order. Validates names and shapes (ModelFormatError)."""
    cfg = text_config(config)
    shapes = {name: tuple(int(d) for d in src.shape) for name, src in sources.items()}
    return [
        (
            o.name,
            o.shape,
            lambda o=o: o.build([load_float32(sources[s]) for s in o.sources]),
        )
        for o in _plan(cfg, shapes)
    ]
