"""qwen4_exp (Hugging Face) -> llama.cpp's ``qwen4exp`` GGUF layout, as pure functions.

``gguf_metadata(config)`` gives the ``qwen4exp.*`` (and ``general.file_type``) keys and
``gguf_tensors(config, named_tensors)`` the GGUF tensors, with exactly the names, shapes, layouts and value
transforms of llama.cpp's converter (``convert_hf_to_gguf.py``, ``conversion/qwen4exp.py`` and its Qwen3.5 /
Qwen3-Next bases). docs/qwen4exp.md has the full mapping table.

Shapes here are numpy order (a GGUF ``[ne0, ne1]`` tensor is ``(ne1, ne0)``). Vision tensors are dropped, as
llama.cpp's converter does. The MTP head (``mtp.*``, with ``"mtp_num_hidden_layers": 1`` in config.json) is
written in llama.cpp's nextn convention (its Qwen3.5 / Qwen3-Next converter): block ``L = num_hidden_layers``,
``block_count = L + 1``, ``nextn_predict_layers = 1``; without that config key ``mtp.*`` is dropped.

The pieces qwen4_exp shares with Qwen3.5 MoE and Qwen3-Next (Gated DeltaNet, gated attention and MoE names and
shapes, :class:`RoutedExperts`) are public, and so is what those two share with each other (``hybrid_*``,
llama.cpp's ``Qwen3NextModel``): :mod:`regolith.convert.qwen35moe` and :mod:`regolith.convert.qwen3next`
add their Gated DeltaNet projections.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFormatError

__all__ = [
    "ARCH",
    "ATTENTION_NAMES",
    "HF_ARCHITECTURES",
    "LAYER_TENSOR",
    "LINEAR_ATTENTION_NAMES",
    "MOE_NAMES",
    "MTP_HEAD_NAMES",
    "MTP_LAYER_TENSOR",
    "LazyTensor",
    "PlannedTensor",
    "PleTable",
    "RoutedExperts",
    "attention_shapes",
    "gguf_metadata",
    "gguf_tensors",
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
    "ple_hash_constants",
    "reorder_v_heads",
    "rope_parameters",
    "text_config",
]

ARCH = "qwen4exp"
HF_ARCHITECTURES = ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration")
_MODEL_TYPES = ("qwen4_exp", "qwen4_exp_text")
_ATTENTION = ("full_attention", "indexed_attention")
PLE_TABLE = "per_layer_token_embd.weight"


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


class PleTable:
    """The PLE n-gram table (``per_layer_token_embd.weight``): its rows, one checkpoint shard at a time.

    The real table is ~100 GB, so it is never held whole: :meth:`chunks` loads one shard, converts it to
    float32 and drops it before the next. ``np.asarray(table)`` materialises everything (tests only).
    """

    def __init__(self, shards: Sequence[TensorSource]) -> None:
        self._shards = list(shards)
        rows = sum(int(s.shape[0]) for s in self._shards)
        self.shape = (rows, int(self._shards[0].shape[1]))
        self.dtype = np.dtype(np.float32)
        self.ndim = 2
        self.nbytes = rows * self.shape[1] * 4

    def chunks(self) -> Iterator[np.ndarray]:
        """float32 row blocks in table order (shard 0 first)."""
        for shard in self._shards:
            yield load_float32(shard)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.concatenate(list(self.chunks()), axis=0)
        return out if dtype is None else out.astype(dtype)


# ---------------------------------------------------------------------------------------------- config


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's hyper-parameters from a config.json dict (``text_config`` merged over the top level,
    as llama.cpp does), validated. Raises ModelFormatError for another architecture or a bad config."""
    if not isinstance(config, Mapping):
        raise ModelFormatError("config.json must hold a JSON object")
    archs = config.get("architectures") or []
    model_type = config.get("model_type")
    if not (set(archs) & set(HF_ARCHITECTURES)) and model_type not in _MODEL_TYPES:
        raise ModelFormatError(
            f"unsupported architecture {archs or model_type!r}: regolith converts qwen4_exp "
            f"({', '.join(HF_ARCHITECTURES)}), qwen3, qwen3_moe, qwen3_5_moe and qwen3_next"
        )
    cfg = dict(config)
    if isinstance(config.get("text_config"), Mapping):
        cfg.update(config["text_config"])
    required = [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "rms_norm_eps",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "hc_count",
        "hc_lowrank",
        "indexer_n_heads",
        "indexer_head_dim",
        "indexer_budget",
        "indexer_compress_ratio",
        "layer_types",
    ]
    missing = [k for k in required if cfg.get(k) is None]
    if missing:
        raise ModelFormatError(f"config.json lacks qwen4_exp fields: {', '.join(missing)}")
    for k in required[:-1]:
        if k == "rms_norm_eps":
            continue
        if not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] <= 0:
            raise ModelFormatError(f"config.json: {k} must be a positive integer, got {cfg[k]!r}")
    n = cfg["num_hidden_layers"]
    types = cfg["layer_types"]
    if not isinstance(types, list) or len(types) != n:
        raise ModelFormatError(f"config.json: layer_types must list {n} layer types, got {types!r}")
    bad = sorted({t for t in types if t not in ("linear_attention", *_ATTENTION)})
    if bad:
        raise ModelFormatError(f"config.json: unknown layer types {bad}")
    if cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"]:
        raise ModelFormatError(
            "config.json: linear_num_value_heads must be a multiple of linear_num_key_heads"
        )
    if cfg.get("indexer_kv_heads", 1) != 1:
        raise ModelFormatError("config.json: qwen4_exp QSA needs indexer_kv_heads == 1")
    if cfg.get("attention_bias"):
        raise ModelFormatError("config.json: attention_bias is not supported by the qwen4exp layout")
    ple = cfg.get("ple_layer_ids") or []
    if len(ple) > 1:
        raise ModelFormatError(
            f"config.json: PLE on {len(ple)} layers; llama.cpp's qwen4exp layout holds one n-gram table"
        )
    for i in ple:
        if not 1 <= i <= n or types[i - 1] != "linear_attention":
            raise ModelFormatError(f"config.json: ple_layer_ids entry {i} is not a linear-attention layer")
    if ple and cfg.get("eos_token_id") in (None, []):
        raise ModelFormatError("config.json: eos_token_id is required: the PLE hash resets its n-grams on it")
    if cfg.get("head_dim") is None:
        cfg["head_dim_implicit"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


def _mtp_layers(cfg: Mapping[str, Any]) -> int:
    n = cfg.get("mtp_num_hidden_layers") or 0
    if n not in (0, 1):
        raise ModelFormatError(f"config.json: mtp_num_hidden_layers must be 0 or 1, got {n!r}")
    return int(n)


def _with_mtp(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config seen block by block: the MTP head is one more indexed-attention layer (without PLE)."""
    out = dict(cfg)
    if _mtp_layers(cfg):
        out["num_hidden_layers"] = cfg["num_hidden_layers"] + 1
        out["layer_types"] = [*cfg["layer_types"], "indexed_attention"]
    return out


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


def _ple_layers(cfg: Mapping[str, Any]) -> list[int]:
    return [i - 1 for i in cfg.get("ple_layer_ids") or []]


def _ple_eos(cfg: Mapping[str, Any]) -> int:
    eos = cfg["eos_token_id"]
    # transformers' PLE hash resets on the *first* id of a list; llama.cpp's converter writes the last, which
    # hashes differently from the reference (see docs/qwen4exp.md), so regolith writes the first
    return int(eos[0]) if isinstance(eos, list) else int(eos)


def _is_prime(v: int) -> bool:
    if v < 2:
        return False
    if v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


def _splitmix64(v: int) -> int:
    m = (1 << 64) - 1
    v = (v + 0x9E3779B97F4A7C15) & m
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & m
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & m
    return (v ^ (v >> 31)) & m


def ple_hash_constants(config: Mapping[str, Any]) -> dict[str, list[int]]:
    """The PLE n-gram hash constants transformers derives from the config (and saves as int64 buffers):
    ``layer_multipliers`` (ngram_size), ``head_offsets`` and ``head_vocab_sizes`` (one per n-gram head),
    for the first PLE layer. The converter prefers the checkpoint's own buffers."""
    cfg = text_config(config)
    n_heads = (cfg.get("ngram_size", 3) - 1) * cfg.get("heads_per_ngram", 8)
    base = cfg.get("ngram_vocab_size_base", 20_000_000)
    sizes, offsets, total, prime = [], [], 0, base - 1
    for _ in range(n_heads):  # ple_layer_index 0: heads take the next primes after base - 1
        prime += 1
        while not _is_prime(prime):
            prime += 1
        sizes.append(prime)
        offsets.append(total)
        total += prime
    half = max(1, ((1 << 63) - 1) // max(cfg["vocab_size"], 1) // 2)
    seed = cfg.get("seed", 1234)
    mult = [
        2 * (_splitmix64((seed + 0x9E3779B97F4A7C15 * (i + 1)) & ((1 << 64) - 1)) % half) + 1
        for i in range(cfg.get("ngram_size", 3))
    ]
    return {"layer_multipliers": mult, "head_offsets": offsets, "head_vocab_sizes": sizes}


# -------------------------------------------------------------------------------------------- metadata


def gguf_metadata(
    config: Mapping[str, Any],
    *,
    file_type: int | None = None,
    ple_constants: Mapping[str, Sequence[int]] | None = None,
) -> Metadata:
    """The architecture's GGUF keys in llama.cpp's order: ``(key, value, type)``; a list value is an array
    of ``type`` elements. ``general.file_type`` is included (at llama.cpp's position) when ``file_type`` is
    given. ``ple_constants`` (see :func:`ple_hash_constants`) default to the values derived from the config.
    """
    cfg = _with_mtp(text_config(config))
    u32, i32, u64, f32, boolean = (
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.FLOAT32,
        GGUFValueType.BOOL,
    )
    p = f"{ARCH}."
    n = cfg["num_hidden_layers"]
    rope = rope_parameters(cfg)
    md: Metadata = [(p + "block_count", n, u32)]
    for key, names in (
        ("context_length", ("max_position_embeddings", "n_ctx", "n_positions", "max_length")),
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
        md.append((p + "rope.dimension_sections", [int(s) for s in sections], i32))
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
        (p + "ssm.conv_kernel", cfg["linear_conv_kernel_dim"], u32),
        (p + "ssm.state_size", cfg["linear_key_head_dim"], u32),
        (p + "ssm.group_count", cfg["linear_num_key_heads"], u32),
        (p + "ssm.time_step_rank", cfg["linear_num_value_heads"], u32),
        (p + "ssm.inner_size", cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"], u32),
        (p + "attention.recurrent_layers", [t == "linear_attention" for t in cfg["layer_types"]], boolean),
        (p + "full_attention_interval", int(cfg.get("full_attention_interval", 4)), u32),
        (p + "rope.dimension_count", int(head_dim(cfg) * rope.get("partial_rotary_factor", 0.25)), u32),
    ]
    if "mrope_section" not in rope:
        md.append((p + "rope.dimension_sections", [11, 11, 10, 0], i32))
    ratio = cfg["indexer_compress_ratio"]
    md += [
        (p + "hyper_connection.count", cfg["hc_count"], u32),
        (p + "hyper_connection.low_rank", cfg["hc_lowrank"], u32),
        (p + "attention.indexer.head_count", cfg["indexer_n_heads"], u32),
        (p + "attention.indexer.key_length", cfg["indexer_head_dim"], u32),
        (p + "attention.indexer.top_k", cfg["indexer_budget"], u32),
        (p + "attention.compress_ratios", [ratio if t in _ATTENTION else 0 for t in cfg["layer_types"]], i32),
    ]
    if _mtp_layers(cfg):
        md.append((p + "nextn_predict_layers", _mtp_layers(cfg), u32))
    md += _regolith_extensions(cfg)
    ple = _ple_layers(cfg)
    if not ple:
        return md
    consts = dict(ple_constants) if ple_constants is not None else ple_hash_constants(cfg)
    md += [
        (p + "ple.layers", ple, i32),
        (p + "ple.ngram_size", cfg.get("ngram_size", 3), u32),
        (p + "ple.heads_per_ngram", cfg.get("heads_per_ngram", 8), u32),
        (p + "ple.conv_kernel", cfg.get("ple_conv_kernel_size", 4), u32),
        (p + "ple.eos_token_id", _ple_eos(cfg), u32),
    ]
    if cfg.get("image_token_id") is not None:
        md.append((p + "ple.image_token_id", int(cfg["image_token_id"]), u32))
    md += [
        (p + "embedding_length_per_layer_input", _ple_row_dim(cfg), u32),
        (p + "ple.layer_multipliers", [int(v) for v in consts["layer_multipliers"]], u64),
        (p + "ple.head_offsets", [int(v) for v in consts["head_offsets"]], u64),
        (p + "ple.head_vocab_sizes", [int(v) for v in consts["head_vocab_sizes"]], u64),
    ]
    return md


# Keys regolith writes beyond llama.cpp's: facts of the checkpoint that llama.cpp's qwen4exp graph hard-codes
# (it always uses a sigmoid GDN output gate and renormalises the top-k router weights) but transformers
# reads from the config. Files without them (llama.cpp's) get llama.cpp's behaviour.
REGOLITH_EXTENSION_KEYS = (f"{ARCH}.ssm.gate_activation", f"{ARCH}.expert_weights_norm")


def _regolith_extensions(cfg: Mapping[str, Any]) -> Metadata:
    gate = cfg.get("output_gate_type") or cfg.get("hidden_act", "silu")
    if gate not in ("sigmoid", "silu"):
        raise ModelFormatError(f"unsupported Gated DeltaNet output gate {gate!r} (expected sigmoid or silu)")
    return [
        (REGOLITH_EXTENSION_KEYS[0], gate, GGUFValueType.STRING),
        (REGOLITH_EXTENSION_KEYS[1], bool(cfg.get("norm_topk_prob", True)), GGUFValueType.BOOL),
    ]


def _ple_row_dim(cfg: Mapping[str, Any]) -> int:
    n_heads = (cfg.get("ngram_size", 3) - 1) * cfg.get("heads_per_ngram", 8)
    return (cfg.get("ple_embed_dim") or cfg["hidden_size"]) // n_heads


# --------------------------------------------------------------------------------------------- tensors

LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_SHARD = re.compile(r"^ple\.ple_embedding\.ngram_embedding\.shard_(\d+)\.weight$")
_PLE_CONSTS = {
    "ple.ple_embedding.layer_multipliers": "layer_multipliers",
    "ple.ple_embedding.ngram_heads_offsets": "head_offsets",
    "ple.ple_embedding.ngram_heads_vocab_sizes": "head_vocab_sizes",
}

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "model.hyper_connection_mixer.hc_norm.weight": "output_hc_norm.weight",
    "model.hyper_connection_mixer.input_mix_weight_down.weight": "output_hc_down.weight",
    "model.hyper_connection_mixer.input_mix_weight_up.weight": "output_hc_up.weight",
}
# Block tensor names (without the ``model.layers.N.`` prefix) -> llama.cpp's (without ``blk.N.``), by part;
# Qwen3.5's qwen35moe layout (convert/qwen35moe.py) shares the Gated DeltaNet, attention, MoE and MTP ones.
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
_BLOCK = {
    "attn_hyper_connection.hc_norm.weight": "hc_attn_norm.weight",
    "attn_hyper_connection.input_mix_weight_down.weight": "hc_attn_down.weight",
    "attn_hyper_connection.input_mix_weight_up.weight": "hc_attn_up.weight",
    "attn_hyper_connection.block_inject_weight.weight": "hc_attn_inject.weight",
    "mlp_hyper_connection.hc_norm.weight": "hc_ffn_norm.weight",
    "mlp_hyper_connection.input_mix_weight_down.weight": "hc_ffn_down.weight",
    "mlp_hyper_connection.input_mix_weight_up.weight": "hc_ffn_up.weight",
    "mlp_hyper_connection.block_inject_weight.weight": "hc_ffn_inject.weight",
    **LINEAR_ATTENTION_NAMES,
    **ATTENTION_NAMES,
    "self_attn.indexer.q_layernorm.weight": "indexer.q_norm.weight",
    "self_attn.indexer.k_layernorm.weight": "indexer.k_norm.weight",
    **MOE_NAMES,
    "ple.conv1d.weight": "ple_conv1d.weight",
    "ple.key_proj.weight": "ple_key.weight",
    "ple.value_proj.weight": "ple_value.weight",
    "ple.norm_key.weight": "ple_norm_key.weight",
    "ple.norm_query.weight": "ple_norm_query.weight",
    "ple.norm_conv.weight": "ple_norm_conv.weight",
}
# The MTP head's own tensors (mtp.layers.0.* are named like a decoder layer's): HF name -> nextn name
# (``blk.L.nextn.<name>``, L = num_hidden_layers), Qwen3.5's four, then qwen4_exp's output mixer.
MTP_HEAD_NAMES = {
    "mtp.fc.weight": "eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "hnorm.weight",
    "mtp.norm.weight": "shared_head_norm.weight",
}
_MTP = {
    **MTP_HEAD_NAMES,
    "mtp.hyper_connection_mixer.hc_norm.weight": "output_hc_norm.weight",
    "mtp.hyper_connection_mixer.input_mix_weight_down.weight": "output_hc_down.weight",
    "mtp.hyper_connection_mixer.input_mix_weight_up.weight": "output_hc_up.weight",
}
_MTP_NORMS = {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"}
MTP_LAYER_TENSOR = re.compile(r"^mtp\.layers\.0\.(.+)$")
# Zero-centred RMSNorm gammas (transformers computes x_hat * (1 + w)); llama.cpp stores 1 + w.
_PLUS_ONE = {
    "attn_hyper_connection.hc_norm.weight",
    "mlp_hyper_connection.hc_norm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "self_attn.indexer.q_layernorm.weight",
    "self_attn.indexer.k_layernorm.weight",
    "ple.norm_key.weight",
    "ple.norm_query.weight",
    "ple.norm_conv.weight",
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


def _expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every required HF tensor (normalised name) and its shape; experts and PLE shards excluded."""
    H, V, hc, r = cfg["hidden_size"], cfg["vocab_size"], cfg["hc_count"], cfg["hc_lowrank"]
    hcH = hc * H
    ih, idim = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
    out = {
        "model.embed_tokens.weight": (V, H),
        "model.hyper_connection_mixer.hc_norm.weight": (hcH,),
        "model.hyper_connection_mixer.input_mix_weight_down.weight": (r, hcH),
        "model.hyper_connection_mixer.input_mix_weight_up.weight": (hcH, r),
    }
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = (V, H)
    ple = _ple_layers(cfg)
    pd = cfg.get("ple_embed_dim") or H
    n_gram = cfg.get("ngram_size", 3)
    n_ple_heads = (n_gram - 1) * cfg.get("heads_per_ngram", 8)
    for i, kind in enumerate(cfg["layer_types"]):
        blk = {}
        for hcname in ("attn_hyper_connection", "mlp_hyper_connection"):
            blk[f"{hcname}.hc_norm.weight"] = (hcH,)
            blk[f"{hcname}.input_mix_weight_down.weight"] = (r, hcH)
            blk[f"{hcname}.input_mix_weight_up.weight"] = (hcH, r)
            blk[f"{hcname}.block_inject_weight.weight"] = (hc, hcH)
        if kind == "linear_attention":
            blk.update(linear_attention_shapes(cfg))
        else:
            blk.update(attention_shapes(cfg))
            blk.update(
                {
                    "self_attn.indexer.index_qk_proj.weight": ((ih + 1) * idim, H),
                    "self_attn.indexer.q_layernorm.weight": (idim,),
                    "self_attn.indexer.k_layernorm.weight": (idim,),
                }
            )
        blk.update(moe_shapes(cfg))
        if i in ple:
            blk.update(
                {
                    "ple.conv1d.weight": (hcH, 1, cfg.get("ple_conv_kernel_size", 4)),
                    "ple.key_proj.weight": (hcH, pd),
                    "ple.value_proj.weight": (H, pd),
                    "ple.norm_key.weight": (hcH,),
                    "ple.norm_query.weight": (hcH,),
                    "ple.norm_conv.weight": (hcH,),
                    "ple.ple_embedding.layer_multipliers": (n_gram,),
                    "ple.ple_embedding.ngram_heads_offsets": (n_ple_heads,),
                    "ple.ple_embedding.ngram_heads_vocab_sizes": (n_ple_heads,),
                }
            )
        out.update({f"{_layer_prefix(cfg, i)}{k}": v for k, v in blk.items()})
    if _mtp_layers(cfg):
        out.update(
            {
                "mtp.fc.weight": (H, 2 * H),
                "mtp.pre_fc_norm_embedding.weight": (H,),
                "mtp.pre_fc_norm_hidden.weight": (H,),
                "mtp.norm.weight": (H,),
                "mtp.hyper_connection_mixer.hc_norm.weight": (hcH,),
                "mtp.hyper_connection_mixer.input_mix_weight_down.weight": (r, hcH),
                "mtp.hyper_connection_mixer.input_mix_weight_up.weight": (hcH, r),
            }
        )
    return out


def _layer_prefix(cfg: Mapping[str, Any], bid: int) -> str:
    """The HF name prefix of block ``bid`` (the MTP head's layer is block num_hidden_layers - 1 of
    :func:`_with_mtp`'s config)."""
    return (
        "mtp.layers.0."
        if _mtp_layers(cfg) and bid == cfg["num_hidden_layers"] - 1
        else f"model.layers.{bid}."
    )


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


def _transform(cfg: Mapping[str, Any], key: str, x: np.ndarray) -> np.ndarray:
    """The value transform of one per-layer tensor (key without the ``model.layers.N.`` prefix)."""
    if key.startswith("linear_attn."):
        return linear_attention_transform(cfg, key, x)
    if key == "ple.conv1d.weight":
        return x.reshape(x.shape[0], x.shape[-1])
    if key in _PLUS_ONE:
        return x + np.float32(1.0)
    return x


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor of a conversion plan: its name, the checkpoint tensors it is made of (normalised
    names), ``build(arrays)``, which makes it from their float32 arrays, and its shape (numpy order) where
    the planner knows it."""

    name: str
    sources: tuple[str, ...]
    build: Callable[[list[np.ndarray]], np.ndarray] | None  # None: the PLE table
    shape: tuple[int, ...] | None = None


def _plan(
    cfg: Mapping[str, Any], names: Sequence[str], shapes: Mapping[str, tuple[int, ...]]
) -> list[PlannedTensor]:
    main_layers = cfg["num_hidden_layers"]
    if not _mtp_layers(cfg):
        names = [n for n in names if not n.startswith("mtp.")]  # dropped, as llama.cpp does
    cfg = _with_mtp(cfg)
    ih, idim = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
    expected = _expected_shapes(cfg)
    experts = RoutedExperts(cfg)
    shards: list[tuple[int, str]] = []
    ple = _ple_layers(cfg)
    n_shards = cfg.get("split_ngram_parts")
    plan: list[PlannedTensor] = []

    def err(msg: str) -> ModelFormatError:
        return ModelFormatError(f"checkpoint: {msg}")

    for name in names:
        shape = tuple(shapes[name])
        want = expected.get(name)
        if want is not None and shape != want:
            raise err(f"tensor {name} has shape {list(shape)}, expected {list(want)} from config.json")
        if name in _GLOBAL:
            plan.append(PlannedTensor(_GLOBAL[name], (name,), lambda xs, k=name: _global_transform(k, xs[0])))
            continue
        if name in _MTP:
            plan.append(
                PlannedTensor(
                    f"blk.{main_layers}.nextn.{_MTP[name]}",
                    (name,),
                    lambda xs, k=name: _global_transform(k, xs[0]),
                )
            )
            continue
        m = LAYER_TENSOR.match(name)
        mtp = MTP_LAYER_TENSOR.match(name)
        if m is None and mtp is None:
            raise err(f"unexpected tensor {name}")
        bid, key = (int(m.group(1)), m.group(2)) if m else (main_layers, mtp.group(1))  # type: ignore[union-attr]
        if m is not None and bid >= main_layers:
            raise err(f"tensor {name} is beyond num_hidden_layers")
        if key in _PLE_CONSTS:
            continue
        if key == "self_attn.indexer.index_qk_proj.weight":
            nq = ih * idim
            plan.append(
                PlannedTensor(f"blk.{bid}.indexer.q_proj.weight", (name,), lambda xs, nq=nq: xs[0][:nq])
            )
            plan.append(
                PlannedTensor(f"blk.{bid}.indexer.k_proj.weight", (name,), lambda xs, nq=nq: xs[0][nq:])
            )
            continue
        if key in _BLOCK:
            if want is None:
                raise err(f"unexpected tensor {name} (layer {bid} is {cfg['layer_types'][bid]})")
            plan.append(
                PlannedTensor(
                    f"blk.{bid}.{_BLOCK[key]}", (name,), lambda xs, k=key: _transform(cfg, k, xs[0])
                )
            )
            continue
        outs = experts.take(bid, key, name, shape)
        if outs is not None:
            plan += outs
            continue
        sm = _SHARD.match(key)
        if sm is not None or key == "ple.ple_embedding.ngram_embedding.weight":
            if bid not in ple:
                raise err(f"unexpected PLE tensor {name}: layer {bid + 1} is not in ple_layer_ids")
            if len(shape) != 2 or shape[1] != _ple_row_dim(cfg):
                raise err(
                    f"PLE table part {name} has shape {list(shape)}, rows of {_ple_row_dim(cfg)} expected"
                )
            shards.append((int(sm.group(1)) if sm else 0, name))
            if sm is None or (n_shards is not None and len(shards) == n_shards):
                plan.append(PlannedTensor(PLE_TABLE, tuple(n for _, n in sorted(shards)), None))
            continue
        raise err(f"unexpected tensor {name}")

    present = set(names)
    missing = sorted(k for k in expected if k not in present)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise err(f"missing tensors {', '.join(missing[:5])}{more}")
    experts.check_complete(cfg["num_hidden_layers"])
    if ple and not any(o.name == PLE_TABLE for o in plan):
        raise err(
            f"the PLE n-gram table has {len(shards)} of {n_shards} shards"
            if shards
            else "the PLE n-gram table (ple.ple_embedding.ngram_embedding) is missing"
        )
    return plan


def _global_transform(key: str, x: np.ndarray) -> np.ndarray:
    """Zero-centred gammas of the final mixer and the MTP head's norms get llama.cpp's + 1."""
    return x + np.float32(1.0) if key.endswith("hc_norm.weight") or key in _MTP_NORMS else x


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


def ple_constants_from(sources: Mapping[str, TensorSource]) -> dict[str, list[int]] | None:
    """The PLE hash constants stored in the checkpoint (int64 buffers), or None without PLE."""
    found: dict[str, list[int]] = {}
    for name, src in sources.items():
        m = LAYER_TENSOR.match(name)
        if m and m.group(2) in _PLE_CONSTS:
            arr = src.load() if hasattr(src, "load") else np.asarray(src)
            found[_PLE_CONSTS[m.group(2)]] = [int(v) for v in np.asarray(arr, dtype=np.int64).reshape(-1)]
    return found if len(found) == 3 else None


def tensor_plan(
    config: Mapping[str, Any], sources: Mapping[str, TensorSource]
) -> list[tuple[str, tuple, Any]]:
    """``(gguf_name, numpy_shape, build)`` for every output tensor, from shapes only (nothing is read);
    ``build()`` returns the float32 array (or the :class:`PleTable`). Validates names and shapes."""
    cfg = text_config(config)
    names = list(sources)
    plan = _plan(cfg, names, {n: tuple(sources[n].shape) for n in names})
    out = []
    for o in plan:
        if o.build is None:
            table = PleTable([sources[s] for s in o.sources])
            out.append((o.name, table.shape, lambda t=table: t))
        else:
            shape = _out_shape(cfg, o, sources)
            out.append((o.name, shape, lambda o=o: o.build([load_float32(sources[s]) for s in o.sources])))
    return out


def _out_shape(
    cfg: Mapping[str, Any], o: PlannedTensor, sources: Mapping[str, TensorSource]
) -> tuple[int, ...]:
    if o.shape is not None:
        return o.shape
    first = tuple(sources[o.sources[0]].shape)
    if o.name.endswith(("conv1d.weight",)):
        return (first[0], first[-1])
    if ".indexer.q_proj." in o.name:
        return (cfg["indexer_n_heads"] * cfg["indexer_head_dim"], first[1])
    if ".indexer.k_proj." in o.name:
        return (first[0] - cfg["indexer_n_heads"] * cfg["indexer_head_dim"], first[1])
    return first


def gguf_tensors(
    config: Mapping[str, Any], named_tensors: Iterable[tuple[str, TensorSource]]
) -> Iterator[tuple[str, np.ndarray]]:
    """The GGUF tensors of a qwen4_exp checkpoint, in llama.cpp's order: ``(gguf_name, float32 array)``.

    ``named_tensors`` yields ``(hf_name, array)``; an array may also be a :class:`LazyTensor` (``shape`` +
    ``load()``), read only when its output is built. Names and shapes are validated against the config
    first (ModelFormatError). The PLE table comes as a :class:`PleTable` (rows streamed shard by shard).
    """
    sources = collect_sources(named_tensors)
    for name, _shape, build in tensor_plan(config, sources):
        yield name, build()


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
