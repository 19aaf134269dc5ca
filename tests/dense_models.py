"""Tiny random qwen2 / gemma3 / qwen3 / qwen3moe checkpoints (transformers, fp32) and their GGUF files in
llama.cpp's layout.

``tiny_model(arch, seed, **overrides)`` builds a seeded ``Qwen2ForCausalLM``, ``Gemma3ForCausalLM``,
``Qwen3ForCausalLM`` or ``Qwen3MoeForCausalLM``; ``save_tiny_checkpoint`` saves one with the tiny tokenizer
(what ``regolith convert`` and llama.cpp's converter take: the qwen3 families' GGUFs come from regolith's
converter, whose layout tests/test_convert_qwen3moe.py checks against llama.cpp's).
``write_gguf(model, path)`` writes a qwen2 / gemma3 model with gguf-py's writer as llama.cpp's converter
(``conversion/qwen.py`` ``Qwen2Model``, ``conversion/gemma.py`` ``Gemma3Model``) would: llama.cpp tensor
names, no q/k permutation (both use NEOX RoPE), Gemma's RMSNorm gammas stored as ``1 + weight``, the
sliding window only (llama.cpp hard-codes Gemma 3's every-6th-layer-global pattern), the global RoPE
base as ``rope.freq_base`` and the local one left at llama.cpp's default 10000.

Every parameter is drawn from N(0, 0.3) after ``torch.manual_seed(seed)``, so norms, biases and the
zero-initialised Gemma gammas all matter (a converter forgetting ``+1`` fails).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["save_tiny_checkpoint", "tiny_config", "tiny_model", "write_gguf"]

_BASE = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}


def tiny_config(arch: str, **overrides: Any):
    """A tiny fp32 transformers config for ``arch`` ("qwen2", "gemma3", "qwen3" or "qwen3moe")."""
    if arch == "qwen2":
        from transformers import Qwen2Config

        kw = {**_BASE, "num_hidden_layers": 3, "tie_word_embeddings": False}
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        return Qwen2Config(**{**kw, **overrides})
    if arch == "gemma3":
        from transformers import Gemma3TextConfig

        # 7 layers: the 6th is global, the others slide over 8 tokens, so a 40-token prompt reaches well
        # past the window.
        kw = {**_BASE, "num_hidden_layers": 7, "sliding_window": 8, "query_pre_attn_scalar": 16}
        kw["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(7)]
        kw["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
        }
        return Gemma3TextConfig(**{**kw, **overrides})
    if arch in ("qwen3", "qwen3moe"):
        from transformers import Qwen3Config, Qwen3MoeConfig

        kw = {**_BASE, "num_hidden_layers": 3, "tie_word_embeddings": False}
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        if arch == "qwen3":
            return Qwen3Config(**{**kw, **overrides})
        # 8 experts of width 32, top 3, renormalised (as every released Qwen3 MoE checkpoint)
        kw.update(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True)
        return Qwen3MoeConfig(**{**kw, **overrides})
    raise ValueError(f"unknown architecture {arch!r}")


def tiny_model(arch: str, seed: int, **overrides: Any):
    """A seeded fp32 model of :func:`tiny_config` in eval mode."""
    import torch
    from transformers import Gemma3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM

    classes = {
        "qwen2": Qwen2ForCausalLM,
        "gemma3": Gemma3ForCausalLM,
        "qwen3": Qwen3ForCausalLM,
        "qwen3moe": Qwen3MoeForCausalLM,
    }
    cls = classes[arch]
    torch.manual_seed(seed)
    model = cls(tiny_config(arch, **overrides)).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def save_tiny_checkpoint(arch: str, path: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Save ``tiny_model(arch, seed, **overrides)`` with ``save_pretrained`` and the tiny byte-level BPE
    tokenizer (tests/qwen4exp_models.py: 295 ids, within every tiny vocab) into ``path``."""
    from tests.qwen4exp_models import save_tiny_tokenizer

    path = Path(path)
    tiny_model(arch, seed, **overrides).save_pretrained(path)
    save_tiny_tokenizer(path)
    return path


_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# post_attention_layernorm is the FFN's input norm in qwen2 and the attention output norm in gemma3
_QWEN2_NAMES = {**_LAYER_NAMES, "post_attention_layernorm": "ffn_norm"}
_GEMMA3_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def _gguf_name(name: str, layer_names: dict[str, str]) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")  # model.layers.<i>.<module...>.<weight|bias>
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{layer_names[module]}.{parts[-1]}"


def write_gguf(model, path: str | Path, drop: str | None = None) -> Path:
    """Write ``model`` as an f32 GGUF in llama.cpp's layout (without tensor ``drop``, to make a broken file)."""
    import gguf

    cfg = model.config
    arch = "gemma3" if cfg.model_type.startswith("gemma3") else "qwen2"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "gemma3":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
        w.add_sliding_window(cfg.sliding_window)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        names = _GEMMA3_NAMES
    else:
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        names = _QWEN2_NAMES
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        out = _gguf_name(name, names)
        data = tensor.detach().float().numpy()
        if arch == "gemma3" and out.endswith("norm.weight"):
            data = data + 1.0
        if out != drop:
            w.add_tensor(out, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
