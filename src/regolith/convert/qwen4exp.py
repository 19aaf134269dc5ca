"""qwen4_exp (Hugging Face) -> llama.cpp's ``qwen4exp`` GGUF layout, as pure functions.

``gguf_metadata(config)`` gives the ``qwen4exp.*`` (and ``general.file_type``) keys and
``gguf_tensors(config, named_tensors)`` the GGUF tensors, with exactly the names, shapes, layouts and value
transforms of llama.cpp's converter (``convert_hf_to_gguf.py``, ``conversion/qwen4exp.py`` and its Qwen3.5 /
Qwen3-Next bases). docs/qwen4exp.md has the full mapping table.

Shapes here are numpy order (a GGUF ``[ne0, ne1]`` tensor is ``(ne1, ne0)``). Vision tensors are dropped, as
llama.cpp's converter does. The MTP head (``mtp.*``, with ``"mtp_num_hidden_layers": 1`` in config.json) is
written in llama.cpp's nextn convention (its Qwen3.5 / Qwen3-Next converter): block ``L = num_hidden_layers``,
``block_count = L + 1``, ``nextn_predict_layers = 1``; without that config key ``mtp.*`` is dropped.

qwen4_exp is Qwen3.5 MoE with hyper-connections, the QSA indexer and PLE: the Gated DeltaNet, gated attention,
MoE and MTP pieces are :mod:`regolith.convert.qwen_hybrid`'s; this module adds the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFormatError
from .qwen_hybrid import (
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
    collect_sources,
    head_dim,
    linear_attention_shapes,
    linear_attention_transform,
    load_float32,
    moe_shapes,
    rope_parameters,
)

__all__ = [
    "ARCH",
    "HF_ARCHITECTURES",
    "PleTable",
    "collect_sources",  # qwen_hybrid's, as qwen35moe and qwen3next offer it
    "gguf_metadata",
    "gguf_tensors",
    "ple_hash_constants",
    "text_config",
]

ARCH = "qwen4exp"
HF_ARCHITECTURES = ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration")
_MODEL_TYPES = ("qwen4_exp", "qwen4_exp_text")
_ATTENTION = ("full_attention", "indexed_attention")
PLE_TABLE = "per_layer_token_embd.weight"


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
# Block tensor names (without the ``model.layers.N.`` prefix) -> llama.cpp's (without ``blk.N.``): the
# hyper-connections, indexer and PLE, and qwen_hybrid's Gated DeltaNet, attention and MoE ones.
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
# The MTP head's own tensors -> nextn names: qwen_hybrid's four, then qwen4_exp's output mixer.
_MTP = {
    **MTP_HEAD_NAMES,
    "mtp.hyper_connection_mixer.hc_norm.weight": "output_hc_norm.weight",
    "mtp.hyper_connection_mixer.input_mix_weight_down.weight": "output_hc_down.weight",
    "mtp.hyper_connection_mixer.input_mix_weight_up.weight": "output_hc_up.weight",
}
_MTP_NORMS = {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"}
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


def _transform(cfg: Mapping[str, Any], key: str, x: np.ndarray) -> np.ndarray:
    """The value transform of one per-layer tensor (key without the ``model.layers.N.`` prefix)."""
    if key.startswith("linear_attn."):
        return linear_attention_transform(cfg, key, x)
    if key == "ple.conv1d.weight":
        return x.reshape(x.shape[0], x.shape[-1])
    if key in _PLUS_ONE:
        return x + np.float32(1.0)
    return x


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

    ``named_tensors`` yields ``(hf_name, array)``; an array may also be a
    :class:`~regolith.convert.qwen_hybrid.LazyTensor` (``shape`` + ``load()``), read only when its output is
    built. Names and shapes are validated against the config first (ModelFormatError). The PLE table comes
    as a :class:`PleTable` (rows streamed shard by shard).
    """
    sources = collect_sources(named_tensors)
    for name, _shape, build in tensor_plan(config, sources):
        yield name, build()
