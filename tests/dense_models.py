"""Tiny random qwen2 / gemma3 / qwen3 / qwen3moe / qwen35moe / qwen3next / gptoss checkpoints (transformers,
fp32) and the qwen2 / gemma3 ones' GGUF files in llama.cpp's layout.

``tiny_model(arch, seed, **overrides)`` builds a seeded ``Qwen2ForCausalLM``, ``Gemma3ForCausalLM``,
``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``, ``Qwen3_5MoeForCausalLM``, ``Qwen3NextForCausalLM`` or
``GptOssForCausalLM``; ``save_tiny_checkpoint`` saves one with the tiny tokenizer
(what ``regolith convert`` and llama.cpp's converter take: the qwen3 families' and gpt-oss' GGUFs come from
regolith's converter, whose layout tests/test_convert_qwen3moe.py and tests/model/test_convert_gpt_oss.py
check against llama.cpp's). ``save_tiny_mxfp4_checkpoint`` saves a gptoss one as the released gpt-oss
checkpoints are: routed experts as MXFP4 ``*_blocks`` / ``*_scales`` (:func:`mxfp4_pack`).
``write_gguf(model, path)`` writes a qwen2 / gemma3 model with gguf-py's writer as llama.cpp's converter
(``conversion/qwen.py`` ``Qwen2Model``, ``conversion/gemma.py`` ``Gemma3Model``) would: llama.cpp tensor
names, no q/k permutation (both use NEOX RoPE), Gemma's RMSNorm gammas stored as ``1 + weight``, the
sliding window only (llama.cpp hard-codes Gemma 3's every-6th-layer-global pattern), the global RoPE
base as ``rope.freq_base`` and the local one left at llama.cpp's default 10000.

The gptoss model is gpt-oss at toy size: 4 layers alternating sliding (window 8, even layers) and full
attention, 4 heads of 16 over 2 KV heads with q/k/v/o biases and per-head attention sinks, 8 experts of
width 32 (gate_up interleaved, with biases), top 3, a router with a bias, YaRN RoPE as the released
configs have it (factor 32 over 4096 positions, beta 32 / 1, not truncated, base 150000).

Every parameter is drawn from N(0, 0.3) after ``torch.manual_seed(seed)``, so norms, biases, attention sinks
and the zero-initialised Gemma gammas all matter (a converter forgetting ``+1`` fails).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "mxfp4_pack",
    "qwen3next_mtp_weights",
    "qwen35moe_mtp_weights",
    "save_tiny_checkpoint",
    "save_tiny_mxfp4_checkpoint",
    "tiny_config",
    "tiny_model",
    "write_gguf",
]

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
    """A tiny fp32 transformers config for ``arch`` ("qwen2", "gemma3", "qwen3", "qwen3moe", "qwen35moe",
    "qwen3next" or "gptoss")."""
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
    if arch == "qwen35moe":
        from transformers import Qwen3_5MoeTextConfig

        # Qwen3.5 MoE's hybrid stack at toy size: three Gated DeltaNet layers (2 key heads, 4 value heads, so
        # the converter's value-head reordering matters) then one gated full-attention layer (a quarter of
        # head_dim 32 rotated, M-RoPE sections of its 4 pairs); 8 experts of width 32, top 3, and a shared
        # expert of width 48 behind its sigmoid gate.
        kw = {**_BASE, "num_hidden_layers": 4, "head_dim": 32, "tie_word_embeddings": False}
        del kw["intermediate_size"]
        kw.update(
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        )
        return Qwen3_5MoeTextConfig(**{**kw, **overrides})
    if arch == "qwen3next":
        from transformers import Qwen3NextConfig

        # Qwen3-Next's hybrid stack at qwen35moe's toy size: three Gated DeltaNet layers (2 key heads, 4 value
        # heads, so in_proj_qkvz's per-key-head grouping matters) then one gated full-attention layer (a
        # quarter of head_dim 32 rotated); a MoE block in every layer (no mlp_only_layers): 8 experts of width
        # 32, top 3 renormalised, and a shared expert of width 48 behind its sigmoid gate. intermediate_size
        # (the dense MLP's, unused) stays in config.json, as in the released ones.
        kw = {**_BASE, "num_hidden_layers": 4, "head_dim": 32, "tie_word_embeddings": False}
        kw.update(
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=True,
            mlp_only_layers=[],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        )
        return Qwen3NextConfig(**{**kw, **overrides})
    if arch == "gptoss":
        from transformers import GptOssConfig

        # gpt-oss at toy size: sliding (window 8) and full attention alternating, sliding first; 8 experts of
        # width 32, top 3; YaRN as the released configs (max_position_embeddings = 4096 * factor, so
        # transformers sees no conflicting implicit factor).
        n = overrides.get("num_hidden_layers", 4)
        kw = {**_BASE, "num_hidden_layers": n, "intermediate_size": 32, "tie_word_embeddings": False}
        kw.update(
            num_local_experts=8,
            num_experts_per_tok=3,
            sliding_window=8,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
            attention_bias=True,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 4096,
                "rope_theta": 150000.0,
            },
        )
        return GptOssConfig(**{**kw, **overrides})
    raise ValueError(f"unknown architecture {arch!r}")


# Qwen3.5's Gated DeltaNet recurrence amplifies float32 rounding: with N(0, 0.3) weights transformers' own fp32
# logits are 7.5e-5 from its float64 ones (and regolith's 7.2e-5 the other way), so its weights are smaller;
# Qwen3-Next's is the same recurrence.
_INIT_STD = {"qwen35moe": 0.2, "qwen3next": 0.2}


def tiny_model(arch: str, seed: int, **overrides: Any):
    """A seeded fp32 model of :func:`tiny_config` in eval mode."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        GptOssForCausalLM,
        Qwen2ForCausalLM,
        Qwen3_5MoeForCausalLM,
        Qwen3ForCausalLM,
        Qwen3MoeForCausalLM,
        Qwen3NextForCausalLM,
    )

    classes = {
        "qwen2": Qwen2ForCausalLM,
        "gemma3": Gemma3ForCausalLM,
        "qwen3": Qwen3ForCausalLM,
        "qwen3moe": Qwen3MoeForCausalLM,
        "qwen35moe": Qwen3_5MoeForCausalLM,
        "qwen3next": Qwen3NextForCausalLM,
        "gptoss": GptOssForCausalLM,
    }
    cls = classes[arch]
    torch.manual_seed(seed)
    model = cls(tiny_config(arch, **overrides)).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, _INIT_STD.get(arch, 0.3))
    return model


def save_tiny_checkpoint(
    arch: str, path: str | Path, seed: int = 0, *, mtp: bool = False, **overrides: Any
) -> Path:
    """Save ``tiny_model(arch, seed, **overrides)`` with ``save_pretrained`` and the tiny byte-level BPE
    tokenizer (tests/qwen4exp_models.py: 295 ids, within every tiny vocab) into ``path``. A qwen35moe
    checkpoint with ``mtp_num_hidden_layers=1`` also gets its MTP head (:func:`qwen35moe_mtp_weights`, in
    ``model-mtp.safetensors``), which transformers' model does not hold. ``mtp`` (qwen3next): a checkpoint
    as Qwen3-Next's releases are, its MTP head (:func:`qwen3next_mtp_weights`) in ``model-mtp.safetensors``
    and config.json without ``layer_types`` (``full_attention_interval`` instead) nor
    ``mtp_num_hidden_layers``; the layers must then follow the interval."""
    from tests.qwen4exp_models import save_tiny_mtp, save_tiny_tokenizer

    path = Path(path)
    model = tiny_model(arch, seed, **overrides)
    model.save_pretrained(path)
    if arch == "qwen35moe" and overrides.get("mtp_num_hidden_layers"):
        save_tiny_mtp(path, qwen35moe_mtp_weights(model.config, seed))
    if mtp:
        if arch != "qwen3next":
            raise ValueError("mtp=True is for qwen3next (qwen35moe: mtp_num_hidden_layers=1)")
        _save_released_qwen3next(path, model.config, seed)
    save_tiny_tokenizer(path)
    if arch == "gptoss":
        _use_o200k_pre_tokenizer(path)
    return path


# The o200k pre-tokenizer regex of gpt-oss' (and GPT-4o's) tokenizer.json: llama.cpp's "gpt-4o"
O200K_PRE_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _use_o200k_pre_tokenizer(path: Path) -> None:
    """Give a saved tiny tokenizer gpt-oss' pre-tokenizer regex (its merges stay valid BPE merges)."""
    import json

    tok_file = path / "tokenizer.json"
    tok = json.loads(tok_file.read_text(encoding="utf-8"))
    splits = [p for p in tok["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
    splits[0]["pattern"] = {"Regex": O200K_PRE_REGEX}
    tok_file.write_text(json.dumps(tok, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


# transformers' FP4 (E2M1) code values (integrations/mxfp4.py FP4_VALUES): code i is FP4_VALUES[i]
_FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def mxfp4_pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w`` [..., rows, cols] (cols a multiple of 32) to MXFP4 as gpt-oss checkpoints store it:
    ``blocks`` uint8 [..., rows, cols / 32, 16] (element 2j of a 32-block in the low nibble of byte j, 2j + 1
    in the high one) and ``scales`` uint8 [..., rows, cols / 32] (E8M0: the block's scale is 2^(s - 127)),
    what transformers' ``convert_moe_packed_tensors`` reads. Each block gets the smallest power-of-two scale
    that keeps its largest magnitude within 6, and each value the nearest code."""
    w = np.asarray(w, np.float32)
    *lead, cols = w.shape
    if cols % 32:
        raise ValueError(f"MXFP4 rows hold whole 32-blocks; got rows of {cols}")
    blk = w.reshape(*lead, cols // 32, 32)
    amax = np.abs(blk).max(axis=-1)
    with np.errstate(divide="ignore"):
        exp = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)), 0.0)
    scales = np.clip(exp + 127, 1, 254).astype(np.uint8)
    scaled = blk / np.exp2(scales.astype(np.float32) - 127)[..., None]
    codes = np.abs(scaled[..., None] - _FP4_VALUES).argmin(axis=-1).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(blocks), scales


def save_tiny_mxfp4_checkpoint(path: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """:func:`save_tiny_checkpoint` of ``gptoss`` rewritten as the released gpt-oss checkpoints are: each
    layer's ``mlp.experts.gate_up_proj`` / ``down_proj`` as ``*_blocks`` / ``*_scales`` (:func:`mxfp4_pack` of
    the weights transposed to [experts, out, in], so gate and up rows interleave), the biases and every other
    tensor unchanged, and config.json's ``quantization_config`` saying ``mxfp4``."""
    import json

    from safetensors.numpy import load_file, save_file

    path = save_tiny_checkpoint("gptoss", path, seed, **overrides)
    files = sorted(path.glob("model*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"expected one safetensors file in {path}, found {len(files)}")
    tensors = load_file(str(files[0]))
    for name in [n for n in tensors if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        blocks, scales = mxfp4_pack(tensors.pop(name).swapaxes(-1, -2))
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    files[0].unlink()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def _save_released_qwen3next(path: Path, config, seed: int) -> None:
    """Rewrite a saved qwen3next checkpoint as Qwen3-Next's releases are (save_tiny_checkpoint's ``mtp``),
    the MTP layer's routed experts per expert, as those files hold them."""
    import json

    from safetensors.torch import save_file

    cfg = json.loads((path / "config.json").read_text())
    interval = cfg.get("full_attention_interval", 4)
    implied = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(len(cfg["layer_types"]))
    ]
    if cfg.pop("layer_types") != implied:
        raise ValueError(f"layer_types do not follow full_attention_interval {interval}")
    cfg["full_attention_interval"] = interval
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    weights = qwen3next_mtp_weights(config, seed)
    p, F = "mtp.layers.0.mlp.experts.", config.moe_intermediate_size
    gate_up, down = weights.pop(p + "gate_up_proj"), weights.pop(p + "down_proj")
    for e in range(config.num_experts):
        weights[f"{p}{e}.gate_proj.weight"] = gate_up[e, :F].contiguous()
        weights[f"{p}{e}.up_proj.weight"] = gate_up[e, F:].contiguous()
        weights[f"{p}{e}.down_proj.weight"] = down[e].contiguous()
    save_file(weights, str(path / "model-mtp.safetensors"))


def _mtp_weights(config, layer_class, seed: int) -> dict:
    """Seeded N(0, 0.3) ``mtp.*`` tensors: ``mtp.fc`` [H, 2H], the norms ``mtp.pre_fc_norm_embedding`` /
    ``pre_fc_norm_hidden`` / ``norm`` [H] and ``mtp.layers.0.*``, the state of a ``layer_class`` decoder layer
    for a full-attention layer after the model's (routed experts fused, as transformers holds them)."""
    import torch

    n, H = config.num_hidden_layers, config.hidden_size
    ext = type(config)(
        **{
            **config.to_dict(),
            "num_hidden_layers": n + 1,
            "layer_types": [*config.layer_types, "full_attention"],
        }
    )
    shapes = {f"mtp.layers.0.{k}": tuple(v.shape) for k, v in layer_class(ext, n).state_dict().items()}
    shapes["mtp.fc.weight"] = (H, 2 * H)
    for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        shapes[f"mtp.{k}.weight"] = (H,)
    gen = torch.Generator().manual_seed(seed)
    return {k: (0.3 * torch.randn(shape, generator=gen)).contiguous() for k, shape in sorted(shapes.items())}


def qwen35moe_mtp_weights(config, seed: int = 0) -> dict:
    """Seeded ``mtp.*`` tensors for a qwen35moe ``config``, as Qwen3.5 checkpoints hold them: ``mtp.fc``
    [H, 2H], the norms ``mtp.pre_fc_norm_embedding`` / ``pre_fc_norm_hidden`` / ``norm`` [H] and
    ``mtp.layers.0.*``, the state of a ``Qwen3_5MoeDecoderLayer`` for a full-attention layer after the
    model's (routed experts fused, as transformers holds them). Every tensor is N(0, 0.3)."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

    return _mtp_weights(config, Qwen3_5MoeDecoderLayer, seed)


def qwen3next_mtp_weights(config, seed: int = 0) -> dict:
    """Seeded ``mtp.*`` tensors for a qwen3next ``config``: those of :func:`qwen35moe_mtp_weights` with a
    ``Qwen3NextDecoderLayer`` (routed experts fused, as transformers holds them; save_tiny_checkpoint's
    ``mtp`` writes them per expert, as the released files hold them). Every tensor is N(0, 0.3)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    return _mtp_weights(config, Qwen3NextDecoderLayer, seed)


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
