"""A GGUF file's layout as plain JSON data: every metadata key (type and value) and every tensor (name,
ggml shape, ggml type, sha256 of its float32 data, and the values of small tensors).

``tools/llamacpp_fixtures/make_qwen4exp_layout.py`` records llama.cpp's converter output with it into
``tests/fixtures/llamacpp/``; the converter tests record regolith's output the same way and compare.
Read with gguf-py's ``GGUFReader`` (the reference reader), not regolith's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

FIXTURE_DIR = Path(__file__).parent / "fixtures" / "llamacpp"
# Tensors up to this many elements also record their values (1-D norms, ssm_a, dt bias, ...).
SMALL_TENSOR = 64

# The tiny checkpoints the fixtures were made from: name -> (seed, tiny_text_config overrides).
QWEN4EXP_VARIANTS: dict[str, tuple[int, dict[str, Any]]] = {
    # hc 3, PLE on layer 1, GQA 2, partial rotary 0.5, GDN 2 k-heads / 4 v-heads, 16 experts top-4
    "qwen4exp-tiny-a": (0, {}),
    # hc 4, PLE on layer 3, GQA 4, rotary 0.25, 3 v-heads per k-head, 8 experts top-2, eos list
    "qwen4exp-tiny-b": (
        1,
        {
            "hc_count": 4,
            "hc_lowrank": 12,
            "ple_layer_ids": [3],
            "num_key_value_heads": 1,
            "partial_rotary": 0.25,
            "linear_num_value_heads": 6,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
            "eos_token_id": [2, 0],
            "indexer_budget": 12,
            "indexer_compress_ratio": 3,
        },
    ),
    # no PLE at all: no n-gram table, no ple.* keys
    "qwen4exp-tiny-nople": (2, {"ple_layer_ids": [], "num_hidden_layers": 2}),
}


# The qwen3 family's tiny checkpoints (tests/dense_models.py): name -> (architecture, seed, overrides).
# make_qwen3_layout.py records llama.cpp's converter output for them.
QWEN3_VARIANTS: dict[str, tuple[str, int, dict[str, Any]]] = {
    # 8 experts of width 32, top 3, untied output
    "qwen3moe-tiny": ("qwen3moe", 0, {}),
    # 6 experts top 2, tied embeddings, GQA 4:1, head_dim 32
    "qwen3moe-tiny-b": (
        "qwen3moe",
        1,
        {
            "num_experts": 6,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": True,
            "num_key_value_heads": 1,
            "head_dim": 32,
        },
    ),
    "qwen3-tiny": ("qwen3", 2, {}),
}

# Qwen3.5 MoE's tiny checkpoints (tests/dense_models.py), as QWEN3_VARIANTS; make_qwen3_layout.py records
# llama.cpp's converter output for them.
QWEN35MOE_VARIANTS: dict[str, tuple[str, int, dict[str, Any]]] = {
    # layers L,L,L,F; GDN 2 key heads / 4 value heads (reordered); GQA 2; 8 experts top 3; untied output
    "qwen35moe-tiny": ("qwen35moe", 0, {}),
    # tied embeddings, GDN 2 / 2 heads (no reordering), GQA 4:1 with head_dim 16, layers L,F,L,L,F,
    # 10 experts (expert 10 sorts before expert 2) top 2, half of head_dim rotated, other M-RoPE sections
    "qwen35moe-tiny-b": (
        "qwen35moe",
        1,
        {
            "tie_word_embeddings": True,
            "linear_num_value_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_hidden_layers": 5,
            "layer_types": [
                "linear_attention",
                "full_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
            "num_experts": 10,
            "num_experts_per_tok": 2,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [1, 2, 1],
                "mrope_interleaved": True,
            },
        },
    ),
    # the MTP head: block 4 (one full-attention layer with its MoE, routed experts fused) and blk.4.nextn.*
    "qwen35moe-tiny-mtp": ("qwen35moe", 2, {"mtp_num_hidden_layers": 1}),
}

# Qwen3-Next's tiny checkpoints (tests/dense_models.py), as QWEN3_VARIANTS; make_qwen3_layout.py records
# llama.cpp's converter output for them. ``"mtp": True`` is save_tiny_checkpoint's, not a config override.
QWEN3NEXT_VARIANTS: dict[str, tuple[str, int, dict[str, Any]]] = {
    # layers L,L,L,F; GDN 2 key heads / 4 value heads (in_proj_qkvz grouped per key head); GQA 2; 8 experts
    # top 3; untied output
    "qwen3next-tiny": ("qwen3next", 0, {}),
    # tied embeddings, GDN 2 / 2 heads, GQA 4:1 with head_dim 16, layers L,F,L,L,F, 10 experts (expert 10
    # sorts before expert 2) top 2, half of head_dim rotated, another RoPE base
    "qwen3next-tiny-b": (
        "qwen3next",
        1,
        {
            "tie_word_embeddings": True,
            "linear_num_value_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_hidden_layers": 5,
            "layer_types": [
                "linear_attention",
                "full_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
            "num_experts": 10,
            "num_experts_per_tok": 2,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "partial_rotary_factor": 0.5,
            },
        },
    ),
    # as the released checkpoints: the MTP head (block 4, one full-attention layer with its MoE, experts per
    # expert, and blk.4.nextn.*) in its own file, config.json without layer_types (full_attention_interval 4)
    # and without mtp_num_hidden_layers (llama.cpp counts the MTP layers from the tensors)
    "qwen3next-tiny-mtp": ("qwen3next", 2, {"mtp": True}),
}

# gpt-oss' tiny checkpoints (tests/dense_models.py): name -> (experts as "float" or "mxfp4", seed, overrides).
# make_gptoss_layout.py records llama.cpp's converter output for them.
GPTOSS_VARIANTS: dict[str, tuple[str, int, dict[str, Any]]] = {
    # 4 layers sliding/full, GQA 2, 8 experts of width 32 top 3, float experts (gate_up interleaved)
    "gptoss-tiny": ("float", 0, {}),
    # 2 layers, GQA 4:1, 6 experts top 2, another sliding window
    "gptoss-tiny-b": (
        "float",
        1,
        {
            "num_hidden_layers": 2,
            "num_key_value_heads": 1,
            "num_local_experts": 6,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
        },
    ),
    # as the released checkpoints: routed experts in MXFP4 blocks / scales, quantization_config mxfp4
    "gptoss-tiny-mxfp4": ("mxfp4", 2, {}),
}


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return value


def _field_value(field: Any, vt: Any) -> Any:
    types = list(field.types)
    if types[0] == vt.ARRAY:
        sub = types[1] if len(types) > 1 else None
        items = [field.parts[i] for i in field.data]
        if sub == vt.STRING:
            return [bytes(p).decode("utf-8") for p in items]
        return [_plain(p[0]) for p in items]
    part = field.parts[field.data[0]]
    if types[0] == vt.STRING:
        return bytes(part).decode("utf-8")
    if types[0] == vt.BOOL:
        return bool(part[0])
    return _plain(part[0])


def gguf_layout(path: str | Path) -> dict[str, Any]:
    """{"metadata": {key: {"type", ["item_type"], "value"}}, "tensors": [{"name", "shape", "type",
    "sha256", ["values"]}]} of a GGUF file; shapes in ggml order (ne0 first)."""
    import gguf

    vt = gguf.GGUFValueType
    reader = gguf.GGUFReader(str(path))
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        entry: dict[str, Any] = {"type": vt(field.types[0]).name}
        if field.types[0] == vt.ARRAY:
            entry["item_type"] = vt(field.types[1]).name if len(field.types) > 1 else None
        entry["value"] = _field_value(field, vt)
        metadata[key] = entry
    tensors = []
    for t in reader.tensors:
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        shape = [int(n) for n in t.shape]  # ggml order
        data = np.asarray(t.data)
        if qtype in (gguf.GGMLQuantizationType.F32,):
            values = data.astype("<f4", copy=False)
        else:
            values = gguf.quants.dequantize(data, qtype).astype("<f4")
        values = np.ascontiguousarray(values).reshape(-1)
        rec: dict[str, Any] = {
            "name": t.name,
            "shape": shape,
            "type": qtype.name,
            "sha256": hashlib.sha256(values.tobytes()).hexdigest(),
        }
        if values.size <= SMALL_TENSOR:
            rec["values"] = [float(v) for v in values]
        tensors.append(rec)
    return {"metadata": metadata, "tensors": tensors}
