"""qwen3 / qwen3_moe (Hugging Face) -> llama.cpp's ``qwen3`` / ``qwen3moe`` GGUF layouts, as pure functions.

``gguf_metadata(config)`` gives the architecture's keys (and ``general.file_type``) and
``tensor_plan(config, sources)`` the GGUF tensors, with the names, shapes and order of llama.cpp's converter
(``conversion/qwen.py``: ``Qwen3Model``, ``Qwen3MoeModel`` on ``Qwen2MoeModel``): tensors in the order of
their Hugging Face names, each layer's routed experts stacked into ``ffn_{down,gate,up}_exps`` once the
layer's last expert tensor has been seen. Checkpoints with the experts fused (transformers' in-memory
``mlp.experts.gate_up_proj`` / ``down_proj``) are taken too. No value is transformed (qwen3's norms are
plain RMSNorm gammas, RoPE is NEOX, so q and k are not permuted).

Shapes are numpy order (a GGUF ``[ne0, ne1]`` tensor is ``(ne1, ne0)``). docs/formats.md has the mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFormatError

__all__ = ["ARCHES", "REGOLITH_EXTENSION_KEYS", "gguf_metadata", "tensor_plan", "text_config"]

# Hugging Face model_type -> llama.cpp architecture
ARCHES = {"qwen3": "qwen3", "qwen3_moe": "qwen3moe"}
_HF_ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_BLOCK = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "mlp.gate.weight": "ffn_gate_inp",
}
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")

Metadata = list[tuple[str, Any, GGUFValueType]]


def _load(src: Any) -> np.ndarray:
    """A checkpoint tensor (lazy, with ``load()``, or an array) as contiguous float32."""
    return np.ascontiguousarray(src.load() if hasattr(src, "load") else src, dtype=np.float32)


def _model_type(config: Mapping[str, Any]) -> str | None:
    archs = config.get("architectures") or []
    for a in archs:
        if a in _HF_ARCHITECTURES:
            return _HF_ARCHITECTURES[a]
    model_type = config.get("model_type")
    return model_type if model_type in ARCHES else None


def handles(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (config.json) is a qwen3 or qwen3_moe checkpoint."""
    return isinstance(config, Mapping) and _model_type(config) is not None


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameters from a config.json dict, validated; ``arch`` is the llama.cpp architecture.
    Raises ModelFormatError for another architecture or for what llama.cpp's graphs (and regolith's) do
    not compute: biases, sliding windows, RoPE scaling, dense layers between sparse ones."""
    if not handles(config):
        raise ModelFormatError("config.json is not a qwen3 or qwen3_moe checkpoint")
    cfg = dict(config)
    moe = _model_type(config) == "qwen3_moe"
    cfg["arch"] = ARCHES[_model_type(config)]
    if moe and cfg.get("num_experts") is None:  # transformers 5 writes num_local_experts
        cfg["num_experts"] = cfg.get("num_local_experts")
    required = [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    ]
    required += (
        ["num_experts", "num_experts_per_tok", "moe_intermediate_size"] if moe else ["intermediate_size"]
    )
    for k in required:
        v = cfg.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelFormatError(f"config.json: {k} must be a positive integer, got {v!r}")
    if not isinstance(cfg.get("rms_norm_eps"), (int, float)):
        raise ModelFormatError("config.json: rms_norm_eps must be a number")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ModelFormatError("config.json: num_key_value_heads must divide num_attention_heads")
    if moe and cfg["num_experts_per_tok"] > cfg["num_experts"]:
        raise ModelFormatError("config.json: num_experts_per_tok exceeds num_experts")
    if cfg.get("attention_bias"):
        raise ModelFormatError("config.json: attention_bias is not part of llama.cpp's qwen3 graphs")
    if cfg.get("use_sliding_window"):
        raise ModelFormatError("config.json: use_sliding_window is not part of llama.cpp's qwen3 graphs")
    if moe and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        raise ModelFormatError(
            "config.json: dense layers between sparse ones (mlp_only_layers, decoder_sparse_step) are not "
            "part of llama.cpp's qwen3moe graph"
        )
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
    if kind != "default":
        raise ModelFormatError(f"config.json: RoPE scaling {kind!r} is not supported (only unscaled RoPE)")
    theta = rope.get("rope_theta") if isinstance(rope, Mapping) else None
    cfg["rope_theta_value"] = float(theta if theta is not None else cfg.get("rope_theta", 10000.0))
    cfg["head_dim_value"] = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    return cfg


# Keys regolith writes beyond llama.cpp's: llama.cpp's qwen3moe graph always renormalises the top-k router
# weights, transformers reads norm_topk_prob (every released Qwen3 MoE checkpoint sets it true).
REGOLITH_EXTENSION_KEYS = ("qwen3moe.expert_weights_norm",)


def gguf_metadata(config: Mapping[str, Any], *, file_type: int | None = None) -> Metadata:
    """The architecture's GGUF keys in llama.cpp's order: ``(key, value, type)``; ``general.file_type`` at
    llama.cpp's position when ``file_type`` is given."""
    cfg = text_config(config)
    u32, f32, boolean = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL
    p = cfg["arch"] + "."
    md: Metadata = [(p + "block_count", cfg["num_hidden_layers"], u32)]
    ctx = cfg.get("max_position_embeddings")
    if ctx is not None:
        md.append((p + "context_length", int(ctx), u32))
    md.append((p + "embedding_length", cfg["hidden_size"], u32))
    if cfg.get("intermediate_size") is not None:
        md.append((p + "feed_forward_length", int(cfg["intermediate_size"]), u32))
    md += [
        (p + "attention.head_count", cfg["num_attention_heads"], u32),
        (p + "attention.head_count_kv", cfg["num_key_value_heads"], u32),
        (p + "rope.freq_base", cfg["rope_theta_value"], f32),
        (p + "attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]), f32),
    ]
    moe = cfg["arch"] == "qwen3moe"
    if moe:
        md.append((p + "expert_count", cfg["num_experts"], u32))
        md.append((p + "expert_used_count", cfg["num_experts_per_tok"], u32))
    if cfg.get("head_dim") is not None:
        md.append((p + "attention.key_length", int(cfg["head_dim"]), u32))
        md.append((p + "attention.value_length", int(cfg["head_dim"]), u32))
    if file_type is not None:
        md.append(("general.file_type", int(file_type), u32))
    if moe:
        md.append((p + "expert_feed_forward_length", cfg["moe_intermediate_size"], u32))
        md.append((p + "expert_weights_norm", bool(cfg.get("norm_topk_prob", False)), boolean))
    return md


def _expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every required HF tensor but the routed experts and its shape (lm_head only when untied)."""
    H, V, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim_value"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layer = {
            "input_layernorm.weight": (H,),
            "post_attention_layernorm.weight": (H,),
            "self_attn.q_proj.weight": (nh * hd, H),
            "self_attn.k_proj.weight": (nkv * hd, H),
            "self_attn.v_proj.weight": (nkv * hd, H),
            "self_attn.o_proj.weight": (H, nh * hd),
            "self_attn.q_norm.weight": (hd,),
            "self_attn.k_norm.weight": (hd,),
        }
        if cfg["arch"] == "qwen3moe":
            layer["mlp.gate.weight"] = (cfg["num_experts"], H)
        else:
            F = cfg["intermediate_size"]
            layer.update(
                {"mlp.gate_proj.weight": (F, H), "mlp.up_proj.weight": (F, H), "mlp.down_proj.weight": (H, F)}
            )
        out.update({p + k: v for k, v in layer.items()})
    return out


def tensor_plan(config: Mapping[str, Any], sources: Mapping[str, Any]) -> list[tuple[str, tuple, Any]]:
    """``(gguf_name, numpy_shape, build)`` for every output tensor, from shapes only (nothing is read);
    ``build()`` returns the float32 array. Validates names and shapes (ModelFormatError)."""
    cfg = text_config(config)
    expected = _expected_shapes(cfg)
    moe = cfg["arch"] == "qwen3moe"
    E = cfg.get("num_experts", 0) if moe else 0
    H, F = cfg["hidden_size"], cfg.get("moe_intermediate_size", 0)
    experts: dict[int, dict[str, str]] = {}  # layer -> {"<e>.<w>": hf name}
    plan: list[tuple[str, tuple, Any]] = []

    def err(msg: str) -> ModelFormatError:
        return ModelFormatError(f"checkpoint: {msg}")

    def one(out: str, name: str, shape: tuple[int, ...]) -> None:
        plan.append((out, shape, lambda n=name: _load(sources[n])))

    def stacked(bid: int, w: str) -> None:
        names = [experts[bid][f"{e}.{w}"] for e in range(E)]
        shape = (H, F) if w == "down" else (F, H)
        plan.append(
            (
                f"blk.{bid}.ffn_{w}_exps.weight",
                (E, *shape),
                lambda ns=names: np.stack([_load(sources[n]) for n in ns]),
            )
        )

    for name in sorted(sources):  # llama.cpp walks a checkpoint's tensors by name
        shape = tuple(int(d) for d in sources[name].shape)
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings", False):
            continue  # tied: llama.cpp writes no output.weight
        want = expected.get(name)
        if want is not None and shape != want:
            raise err(f"tensor {name} has shape {list(shape)}, expected {list(want)} from config.json")
        if name in _GLOBAL:
            one(_GLOBAL[name], name, shape)
            continue
        m = _LAYER.match(name)
        if m is None:
            raise err(f"unexpected tensor {name}")
        bid, key = int(m.group(1)), m.group(2)
        if bid >= cfg["num_hidden_layers"]:
            raise err(f"tensor {name} is beyond num_hidden_layers")
        if key in _BLOCK and want is not None:
            one(f"blk.{bid}.{_BLOCK[key]}.weight", name, shape)
            continue
        em = _EXPERT.match(key) if moe else None
        if em is not None:
            e, w = int(em.group(1)), em.group(2)
            want = (H, F) if w == "down" else (F, H)
            if e >= E or shape != want:
                raise err(f"tensor {name} has shape {list(shape)} (expert count {E}), expected {list(want)}")
            got = experts.setdefault(bid, {})
            got[f"{e}.{w}"] = name
            if len(got) == 3 * E:
                for w2 in ("down", "gate", "up"):
                    stacked(bid, w2)
            continue
        if moe and key == "mlp.experts.down_proj":
            if shape != (E, H, F):
                raise err(f"tensor {name} has shape {list(shape)}, expected {[E, H, F]}")
            one(f"blk.{bid}.ffn_down_exps.weight", name, shape)
            experts.setdefault(bid, {}).update({f"{e}.down": name for e in range(E)})
            continue
        if moe and key == "mlp.experts.gate_up_proj":
            if shape != (E, 2 * F, H):
                raise err(f"tensor {name} has shape {list(shape)}, expected {[E, 2 * F, H]}")
            plan.append(
                (f"blk.{bid}.ffn_gate_exps.weight", (E, F, H), lambda n=name: _load(sources[n])[:, :F])
            )
            plan.append((f"blk.{bid}.ffn_up_exps.weight", (E, F, H), lambda n=name: _load(sources[n])[:, F:]))
            experts.setdefault(bid, {}).update({f"{e}.{w}": name for e in range(E) for w in ("gate", "up")})
            continue
        raise err(f"unexpected tensor {name}")

    missing = sorted(k for k in expected if k not in sources)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise err(f"missing tensors {', '.join(missing[:5])}{more}")
    for bid in range(cfg["num_hidden_layers"] if moe else 0):
        if len(experts.get(bid, ())) != 3 * E:
            raise err(f"layer {bid} has {len(experts.get(bid, ()))} of {3 * E} expert tensors")
    return plan
