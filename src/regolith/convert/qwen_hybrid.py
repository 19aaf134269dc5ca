"""The GGUF layout pieces llama.cpp's Qwen3-Next, Qwen3.5 and qwen4exp converters share, as pure functions.

llama.cpp's ``Qwen3NextModel`` (``conversion/qwen.py``, with ``_QwenMtpMixin`` on ``Qwen2MoeModel``) is the
base of its Qwen3.5 MoE and qwen4exp converters; regolith's :mod:`regolith.convert.qwen3next`,
:mod:`regolith.convert.qwen35moe` and :mod:`regolith.convert.qwen4exp` share what they share here:

- checkpoint tensors read lazily (:class:`LazyTensor`, :func:`load_float32`), their names normalised and
  vision tensors dropped (:func:`collect_sources`);
- the Gated DeltaNet, gated attention, MoE and MTP head tensor names (``*_NAMES``) and Hugging Face shapes
  (``*_shapes``), the Gated DeltaNet's value transform (:func:`linear_attention_transform`), the routed
  experts stacked (:class:`RoutedExperts`), a plan's tensors (:class:`PlannedTensor`);
- the whole layout of the Qwen3-Next family (``hybrid_*``: config, metadata and tensor plan), into which
  Qwen3.5 MoE and Qwen3-Next pass their Gated DeltaNet projections.

Shapes are numpy order (a GGUF ``[ne0, ne1]`` tensor is ``(ne1, ne0)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFormatError

__all__ = [
    "ATTENTION_NAMES",
    "LAYER_TENSOR",
    "LINEAR_ATTENTION_NAMES",
    "MOE_NAMES",
    "MTP_HEAD_NAMES",
    "MTP_LAYER_TENSOR",
    "LazyTensor",
    "Metadata",
    "PlannedTensor",
    "RoutedExperts",
    "TensorSource",
    "attention_shapes",
    "collect_sources",
    "has_mtp",
    "head_dim",
    "hybrid_metadata",
    "hybrid_tensor_plan",
    "hybrid_text_config",
    "linear_attention_shapes",
    "linear_attention_transform",
    "load_float32",
    "moe_shapes",
    "normalize_name",
    "reorder_v_heads",
    "rope_parameters",
]


class LazyTensor(Protocol):
    """A tensor that is read only when needed: ``shape`` (numpy order) and ``load() -> np.ndarray``."""

    shape: tuple[int, ...]

    def load(self) -> np.ndarray: ...


TensorSource = np.ndarray | LazyTensor
Metadata = list[tuple[str, Any, GGUFValueType]]


def load_float32(src: TensorSource) -> np.ndarray:
    """A checkpoint tensor (an array or a :class:`LazyTensor`) as contiguous float32."""
    arr = src.load() if hasattr(src, "load") else np.asarray(src)
    return np.ascontiguousarray(arr, dtype=np.float32)


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor of a conversion plan: its name, the checkpoint tensors it is made of (normalised
    names), ``build(arrays)``, which makes it from their float32 arrays, and its shape (numpy order) where
    the planner knows it."""

    name: str
    sources: tuple[str, ...]
    build: Callable[[list[np.ndarray]], np.ndarray] | None  # None: qwen4exp's PLE table
    shape: tuple[int, ...] | None = None


# ---------------------------------------------------------------------------------------------- config


def head_dim(cfg: Mapping[str, Any]) -> int:
    """The attention head size: ``head_dim``, else hidden_size / num_attention_heads (``text_config``)."""
    return cfg["head_dim"] if cfg.get("head_dim") is not None else cfg["head_dim_implicit"]


def rope_parameters(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` (or ``rope_scaling``) with llama.cpp's fallbacks to top-level ``rope_theta`` and
    ``partial_rotary_factor``; ModelFormatError for any RoPE type but the default (unscaled)."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key not in rope and cfg.get(key) is not None:
            rope[key] = cfg[key]
    if "rope_type" not in rope and rope.get("type") is not None:
        rope["rope_type"] = rope["type"]
    if rope.get("rope_type") not in (None, "default"):
        raise ModelFormatError(f"config.json: rope_type {rope['rope_type']!r} is not supported")
    return rope


# --------------------------------------------------------------------------------------------- tensors

LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
MTP_LAYER_TENSOR = re.compile(r"^mtp\.layers\.0\.(.+)$")
# Block tensor names (without the ``model.layers.N.`` prefix) -> llama.cpp's (without ``blk.N.``), by part:
# Qwen3.5's and qwen4_exp's Gated DeltaNet (Qwen3-Next's has its own projections), attention and MoE.
LINEAR_ATTENTION_NAMES = {
    "linear_attn.A_log": "ssm_a",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
ATTENTION_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
MOE_NAMES = {
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
# The MTP head's own tensors (mtp.layers.0.* are named like a decoder layer's): HF name -> nextn name
# (``blk.L.nextn.<name>``, L = num_hidden_layers); qwen4_exp adds its output mixer.
MTP_HEAD_NAMES = {
    "mtp.fc.weight": "eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "hnorm.weight",
    "mtp.norm.weight": "shared_head_norm.weight",
}


def normalize_name(name: str) -> str | None:
    """llama.cpp's filter: strip ``language_model.``, drop vision tensors (None); ``model.mtp.`` -> ``mtp.``."""
    name = name.replace("language_model.", "")
    if name.startswith("model.mtp."):
        name = name[len("model.") :]
    if name.startswith("mlp") or "visual." in name or "vision" in name:
        return None
    return name


def linear_attention_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A Gated DeltaNet layer's tensors (names without the layer prefix) and their Hugging Face shapes."""
    H = cfg["hidden_size"]
    lk, lv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv = 2 * lk * dk + lv * dv
    return {
        "linear_attn.A_log": (lv,),
        "linear_attn.conv1d.weight": (conv, 1, K),
        "linear_attn.dt_bias": (lv,),
        "linear_attn.in_proj_a.weight": (lv, H),
        "linear_attn.in_proj_b.weight": (lv, H),
        "linear_attn.in_proj_qkv.weight": (conv, H),
        "linear_attn.in_proj_z.weight": (lv * dv, H),
        "linear_attn.norm.weight": (dv,),
        "linear_attn.out_proj.weight": (H, lv * dv),
    }


def attention_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A gated full-attention layer's tensors (q_proj holds the query and its output gate, per head)."""
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    return {
        "self_attn.q_proj.weight": (2 * nh * hd, H),
        "self_attn.k_proj.weight": (nkv * hd, H),
        "self_attn.v_proj.weight": (nkv * hd, H),
        "self_attn.o_proj.weight": (H, nh * hd),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
    }


def moe_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A MoE block's router and shared expert (the routed experts are :class:`RoutedExperts`' business)."""
    H, E, S = cfg["hidden_size"], cfg["num_experts"], cfg["shared_expert_intermediate_size"]
    return {
        "mlp.gate.weight": (E, H),
        "mlp.shared_expert.gate_proj.weight": (S, H),
        "mlp.shared_expert.up_proj.weight": (S, H),
        "mlp.shared_expert.down_proj.weight": (H, S),
        "mlp.shared_expert_gate.weight": (1, H),
    }


def reorder_v_heads(x: np.ndarray, axis: int, n_k: int, per_k: int, head_dim: int) -> np.ndarray:
    """V heads grouped by K head [G0v0, G0v1, G1v0, G1v1] -> tiled [G0v0, G1v0, G0v1, G1v1] (llama.cpp's
    order, so ggml can broadcast the K heads with a plain repeat)."""
    axis %= x.ndim
    shape = x.shape
    y = x.reshape(*shape[:axis], n_k, per_k, head_dim, *shape[axis + 1 :])
    return np.ascontiguousarray(np.swapaxes(y, axis, axis + 1)).reshape(shape)


def linear_attention_transform(cfg: Mapping[str, Any], key: str, x: np.ndarray) -> np.ndarray:
    """llama.cpp's value transform of a Gated DeltaNet tensor (``key``: ``linear_attn.*``, without the layer
    prefix): value heads reordered from grouped to tiled when there are more value heads than key heads,
    ``A_log`` -> ``-exp(A_log)``, the conv kernel squeezed to [channels, kernel]. The norm keeps its gamma."""
    lk, lv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if lk != lv:
        per_k, qk = lv // lk, 2 * lk * dk
        if key in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
            x = np.concatenate([x[:qk], reorder_v_heads(x[qk:], 0, lk, per_k, dv)], axis=0)
        elif key == "linear_attn.in_proj_z.weight":
            x = reorder_v_heads(x, 0, lk, per_k, dv)
        elif key in (
            "linear_attn.in_proj_a.weight",
            "linear_attn.in_proj_b.weight",
            "linear_attn.A_log",
            "linear_attn.dt_bias",
        ):
            x = reorder_v_heads(x, 0, lk, per_k, 1)
        elif key == "linear_attn.out_proj.weight":
            x = reorder_v_heads(x, 1, lk, per_k, dv)
    if key == "linear_attn.A_log":
        return (-np.exp(x.astype(np.float64))).astype(np.float32)  # correctly rounded, as torch
    if key == "linear_attn.conv1d.weight":
        return x.reshape(x.shape[0], x.shape[-1])
    return x


class RoutedExperts:
    """A checkpoint's routed experts, stacked as llama.cpp's converter does (``Qwen2MoeModel``): per-expert
    ``mlp.experts.<e>.{gate,up,down}_proj.weight`` become ``blk.N.ffn_{down,gate,up}_exps.weight`` [E, ...]
    once the layer's last one has been seen; transformers' fused ``mlp.experts.gate_up_proj`` [E, 2F, H]
    (gate rows first) and ``mlp.experts.down_proj`` [E, H, F] give the same tensors where they stand.
    A layer takes one form or the other."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.n_experts, self.n_ff, self.n_embd = (
            cfg["num_experts"],
            cfg["moe_intermediate_size"],
            cfg["hidden_size"],
        )
        self._per_expert: dict[int, dict[tuple[str, int], str]] = {}  # layer -> {(w, e): name}
        self._fused: dict[int, set[str]] = {}  # layer -> {"gate_up", "down"}

    def take(self, bid: int, key: str, name: str, shape: tuple[int, ...]) -> list[PlannedTensor] | None:
        """The outputs that tensor ``name`` (``key`` within block ``bid``) completes: [] while its layer's
        experts are incomplete, None when it is no routed expert tensor. ModelFormatError for a wrong
        shape or expert index."""
        E, F, H = self.n_experts, self.n_ff, self.n_embd
        m = _EXPERT.match(key)
        if m is not None:
            e, w = int(m.group(1)), m.group(2)
            want = (H, F) if w == "down" else (F, H)
            if e >= E or shape != want:
                raise ModelFormatError(
                    f"checkpoint: tensor {name} has shape {list(shape)} (expert count {E}), "
                    f"expected {list(want)}"
                )
            got = self._per_expert.setdefault(bid, {})
            got[(w, e)] = name
            if len(got) < 3 * E or self._fused.get(bid):
                return []
            return [
                PlannedTensor(
                    f"blk.{bid}.ffn_{w}_exps.weight",
                    tuple(got[(w, e)] for e in range(E)),
                    lambda xs: np.stack(xs, axis=0),
                    (E, H, F) if w == "down" else (E, F, H),
                )
                for w in ("down", "gate", "up")
            ]
        if key == "mlp.experts.down_proj":
            self._check_fused(name, shape, (E, H, F))
            self._fused.setdefault(bid, set()).add("down")
            return [PlannedTensor(f"blk.{bid}.ffn_down_exps.weight", (name,), lambda xs: xs[0], (E, H, F))]
        if key == "mlp.experts.gate_up_proj":
            self._check_fused(name, shape, (E, 2 * F, H))
            self._fused.setdefault(bid, set()).add("gate_up")
            return [
                PlannedTensor(f"blk.{bid}.ffn_gate_exps.weight", (name,), lambda xs: xs[0][:, :F], (E, F, H)),
                PlannedTensor(f"blk.{bid}.ffn_up_exps.weight", (name,), lambda xs: xs[0][:, F:], (E, F, H)),
            ]
        return None

    @staticmethod
    def _check_fused(name: str, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
        if shape != want:
            raise ModelFormatError(
                f"checkpoint: tensor {name} has shape {list(shape)}, expected {list(want)}"
            )

    def check_complete(self, n_blocks: int) -> None:
        """ModelFormatError unless each of blocks 0 .. n_blocks - 1 has all its experts in one form."""
        E = self.n_experts
        for bid in range(n_blocks):
            per, fused = len(self._per_expert.get(bid, {})), self._fused.get(bid, set())
            if (per == 3 * E and not fused) or (per == 0 and fused == {"gate_up", "down"}):
                continue
            have = per + E * (2 * ("gate_up" in fused) + ("down" in fused))
            mixed = " (per-expert and fused tensors mixed)" if per and fused else ""
            raise ModelFormatError(f"checkpoint: layer {bid} has {have} of {3 * E} expert tensors{mixed}")


def collect_sources(named_tensors: Iterable[tuple[str, TensorSource]]) -> dict[str, TensorSource]:
    """Normalised name -> source, in the given order, without vision tensors."""
    out: dict[str, TensorSource] = {}
    for name, src in named_tensors:
        norm = normalize_name(name)
        if norm is None:
            continue
        if norm in out:
            raise ModelFormatError(f"checkpoint: tensor {norm} appears twice")
        out[norm] = src
    return out


# ------------------------------------------------------------------------ the Qwen3-Next family's layout
# Qwen3.5 MoE (convert/qwen35moe.py) and Qwen3-Next (convert/qwen3next.py) are llama.cpp's Qwen3NextModel
# (conversion/qwen.py, with _QwenMtpMixin on Qwen2MoeModel): the same config, metadata and tensors but for
# the Gated DeltaNet's projections, which each passes in as ``linear_shapes`` / ``linear_tensors``.

_HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")
_MTP_LAYER_ANY = re.compile(r"^mtp\.layers\.(\d+)\.")
_HYBRID_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_HYBRID_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    **ATTENTION_NAMES,
    **MOE_NAMES,
}


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def hybrid_text_config(
    config: Mapping[str, Any], arch: str, *, layer_types_required: bool = True
) -> dict[str, Any]:
    """The text model's hyper-parameters of a Qwen3-Next-family checkpoint (``text_config`` merged over the
    top level, as llama.cpp does), validated for llama.cpp's ``arch`` graph: ModelFormatError for missing or
    ill-typed sizes, unknown layer types, value heads that are no multiple of the key heads, key and value
    head sizes that differ, attention biases, bidirectional attention, a non-SiLU ``hidden_act``, RoPE
    scaling and more than one MTP layer. Without ``layer_types`` (``layer_types_required=False``) the layers
    follow ``full_attention_interval`` (default 4) as in transformers, and ``layer_types_implicit`` is set."""
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
    if types is None and not layer_types_required:
        interval = cfg.get("full_attention_interval") or 4
        cfg["layer_types"] = [_HYBRID_LAYER_TYPES[(i + 1) % interval == 0] for i in range(n)]
        cfg["layer_types_implicit"] = True
    elif not isinstance(types, list) or len(types) != n:
        raise ModelFormatError(f"config.json: layer_types must list {n} layer types, got {types!r}")
    else:
        bad = sorted({repr(t) for t in types if t not in _HYBRID_LAYER_TYPES})
        if bad:
            raise ModelFormatError(
                f"config.json: unknown layer types {', '.join(bad)} in layer_types "
                f"(expected {' or '.join(_HYBRID_LAYER_TYPES)})"
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
            f"config.json: linear_key_head_dim and linear_value_head_dim differ; llama.cpp's {arch} layout "
            "has one Gated DeltaNet head size (ssm.state_size)"
        )
    if cfg.get("attention_bias"):
        raise ModelFormatError(f"config.json: attention_bias is not part of llama.cpp's {arch} graph")
    if cfg.get("is_causal") is False:
        raise ModelFormatError("config.json: is_causal false (bidirectional attention) is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelFormatError(
            f"config.json: hidden_act {cfg['hidden_act']!r}: the experts' activation is SiLU"
        )
    rope = cfg.get("rope_parameters", cfg.get("rope_scaling"))
    if rope is not None and not isinstance(rope, Mapping):
        raise ModelFormatError(f"config.json: rope_parameters must be an object, got {rope!r}")
    rope_parameters(cfg)  # refuses RoPE scaling
    mtp = cfg.get("mtp_num_hidden_layers")
    if mtp is not None and (not isinstance(mtp, int) or isinstance(mtp, bool) or mtp not in (0, 1)):
        raise ModelFormatError(
            f"config.json: mtp_num_hidden_layers must be 0 or 1 (one MTP layer), got {mtp!r}"
        )
    if cfg.get("head_dim") is None:
        cfg["head_dim_implicit"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


def hybrid_metadata(
    cfg: Mapping[str, Any], arch: str, *, file_type: int | None = None, mtp: bool = False
) -> Metadata:
    """llama.cpp's ``Qwen3NextModel`` keys of ``cfg`` (:func:`hybrid_text_config`'s) in its order, ``arch.``
    prefixed: ``(key, value, type)``; a list value is an array of ``type`` elements. ``general.file_type``
    is included (at llama.cpp's position) when ``file_type`` is given; ``mtp``: the checkpoint has the MTP
    head (:func:`has_mtp`), written as one more block. ``rope.dimension_sections`` only from
    ``mrope_section``; ``attention.recurrent_layers`` only when config.json lists ``layer_types``."""
    u32, i32, f32, boolean = (
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.FLOAT32,
        GGUFValueType.BOOL,
    )
    p = f"{arch}."
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
    ]
    if not cfg.get("layer_types_implicit"):
        recurrent = [t == "linear_attention" for t in cfg["layer_types"]] + [False] * int(mtp)
        md.append((p + "attention.recurrent_layers", recurrent, boolean))
    md += [
        (p + "full_attention_interval", int(cfg.get("full_attention_interval") or 4), u32),
        (p + "rope.dimension_count", int(head_dim(cfg) * rope.get("partial_rotary_factor", 0.25)), u32),
    ]
    return md


def has_mtp(sources: Mapping[str, TensorSource]) -> bool:
    """Whether the checkpoint (normalised names, :func:`collect_sources`) holds an MTP head (``mtp.*``)."""
    return any(name.startswith("mtp.") for name in sources)


def _plus_one(x: np.ndarray) -> np.ndarray:
    return x + np.float32(1.0)


def _hybrid_expected_shapes(
    cfg: Mapping[str, Any], linear_shapes: Mapping[str, tuple[int, ...]], mtp: bool
) -> dict[str, tuple[int, ...]]:
    """Every HF tensor but the routed experts (normalised name) and its shape; lm_head even when tied."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (V, H),
        "model.norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    norms = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,)}
    linear = {**norms, **linear_shapes, **moe_shapes(cfg)}
    full = {**norms, **attention_shapes(cfg), **moe_shapes(cfg)}
    for i, kind in enumerate(cfg["layer_types"]):
        layer = linear if kind == "linear_attention" else full
        out.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
    if mtp:
        out["mtp.fc.weight"] = (H, 2 * H)
        out.update({k: (H,) for k in MTP_HEAD_NAMES if k != "mtp.fc.weight"})
        out.update({f"mtp.layers.0.{k}": v for k, v in full.items()})
    return out


def hybrid_tensor_plan(
    cfg: Mapping[str, Any],
    sources: Mapping[str, TensorSource],
    arch: str,
    linear_shapes: Mapping[str, tuple[int, ...]],
    linear_tensors: Callable[[int, str, str], list[PlannedTensor]],
) -> list[tuple[str, tuple[int, ...], Any]]:
    """``(gguf_name, numpy_shape, build)`` for every output tensor in llama.cpp's order, from shapes only
    (nothing is read); ``build()`` returns the float32 array. ``cfg``: :func:`hybrid_text_config`'s;
    ``sources``: :func:`collect_sources`'s normalised names in the checkpoint's order (llama.cpp's:
    ``Checkpoint.tensors_by_name()``). A Gated DeltaNet tensor (``key`` of ``linear_shapes``, its shape
    checked) becomes ``linear_tensors(bid, key, name)``; the rest is shared: ``+ 1`` on the zero-centred
    norms, routed experts stacked (:class:`RoutedExperts`), the MTP head (``mtp.*``) as block
    ``num_hidden_layers``. Validates names and shapes (ModelFormatError)."""
    shapes = {name: tuple(int(d) for d in src.shape) for name, src in sources.items()}
    n_layers = cfg["num_hidden_layers"]
    mtp = has_mtp(shapes)
    tied = bool(cfg.get("tie_word_embeddings", False))
    expected = _hybrid_expected_shapes(cfg, linear_shapes, mtp)
    experts = RoutedExperts(cfg)
    plan: list[PlannedTensor] = []

    def err(msg: str) -> ModelFormatError:
        return ModelFormatError(f"checkpoint: {msg}")

    def keep(x: np.ndarray) -> np.ndarray:
        return x

    for name, shape in shapes.items():
        want = expected.get(name)
        if want is not None and shape != want:
            raise err(f"tensor {name} has shape {list(shape)}, expected {list(want)} from config.json")
        if name in _HYBRID_GLOBAL:  # lm_head of a tied checkpoint too, as llama.cpp writes it
            build = _plus_one if name == "model.norm.weight" else keep
            plan.append(PlannedTensor(_HYBRID_GLOBAL[name], (name,), lambda xs, f=build: f(xs[0]), shape))
            continue
        if name in MTP_HEAD_NAMES:
            build = keep if name == "mtp.fc.weight" else _plus_one
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
                f"tensor {name}: MTP layer {extra.group(1)}; llama.cpp's {arch} graph has one MTP layer"
            )
        else:
            raise err(f"unexpected tensor {name}")
        if key in _HYBRID_BLOCK or key in linear_shapes:
            if want is None:
                kind = cfg["layer_types"][bid] if bid < n_layers else "the MTP layer (full_attention)"
                raise err(f"unexpected tensor {name} (layer {bid} is {kind})")
            if key in linear_shapes:
                plan += linear_tensors(bid, key, name)
            else:
                build = _plus_one if key.endswith("norm.weight") else keep
                plan.append(
                    PlannedTensor(
                        f"blk.{bid}.{_HYBRID_BLOCK[key]}", (name,), lambda xs, f=build: f(xs[0]), shape
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
    return [
        (o.name, o.shape, lambda o=o: o.build([load_float32(sources[s]) for s in o.sources])) for o in plan
    ]
