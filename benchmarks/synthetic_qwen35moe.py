"""Random GGUFs of the Qwen3-Next family at released checkpoints' real per-layer shapes (fewer layers):
Qwen3.5-35B-A3B and Qwen3.5-397B-A17B (llama.cpp's ``qwen35moe``), Qwen3-Next-80B-A3B (``qwen3next``).

``MODELS`` holds the released checkpoints' config.json fields (Qwen3.5's ``text_config``) as published and
recorded here (not read from the files, which are not downloaded); ``MODEL_ARCH`` says which layout each
takes. The metadata is what ``regolith convert`` writes for them (:mod:`regolith.convert.qwen35moe`,
:mod:`regolith.convert.qwen3next`), the tensor names, shapes and order its plan's (llama.cpp's converter's:
each layer's tensors by Hugging Face name, layers in order) for the checkpoint's tensors as transformers
holds them (:func:`checkpoint_shapes`), without the MTP head (a file as llama.cpp's ``--no-mtp`` writes).
The two differ only in the Gated DeltaNet's projections (Qwen3.5: ``in_proj_qkv``, ``in_proj_z``,
``in_proj_a``, ``in_proj_b``; Qwen3-Next: ``in_proj_qkvz``, split into ``attn_qkv`` and ``attn_gate``, and
``in_proj_ba``, kept whole as ``ssm_ba``) and in their config.json: Qwen3.5's lists ``layer_types`` and
M-RoPE sections, Qwen3-Next's has neither (``full_attention_interval`` gives the layers, as in
transformers). Layers follow the released pattern: 3 Gated DeltaNet layers, then one of full attention
(``full_attention_interval`` 4); with fewer than 4 layers the last is the attention layer (then listed in
``layer_types`` for Qwen3-Next too). Weights are random, as benchmarks/synthetic_qwen4exp.py makes them
(quantized tensors cut from pools of random blocks scaled to a standard deviation of 1 / sqrt(row length));
the vocabulary is the tiny byte-level BPE's, padded to ``vocab`` (default 32,768 instead of 248,320 or
151,936, to keep the embeddings small). Routed experts take ``--experts`` (Q4_K, Q2_K, Q8_0), the other
matrices ``--dense`` (Q8_0, F16), with the converter's rules for what stays F32 (norms, routers, the shared
expert's gate, the GDN conv kernels, ``ssm_a`` and ``ssm_dt.bias``); ``--experts Q4_K_M`` gives every tensor
llama.cpp's Q4_K_M type instead (:func:`layout`).

    python benchmarks/synthetic_qwen35moe.py OUT.gguf [--model qwen35-35b-a3b] [--layers 4] [--experts Q4_K]

:func:`write_headers` (``--headers``) writes only the headers of the full model as Q4_K_M (a sparse file: what
``regolith inspect --plan`` reads; docs/streaming.md has the plans)::

    python benchmarks/synthetic_qwen35moe.py qwen35-397b-a17b-Q4_K_M.gguf --model qwen35-397b-a17b --headers
    python benchmarks/synthetic_qwen35moe.py qwen3-next-80b-Q4_K_M.gguf --model qwen3-next-80b-a3b --headers
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks import synthetic_qwen4exp as base
from regolith.convert import qwen3next, qwen35moe
from regolith.convert.writer import tensor_type

__all__ = [
    "EXPERT_TYPES",
    "MODELS",
    "MODEL_ARCH",
    "checkpoint_shapes",
    "config",
    "converter",
    "layer_types",
    "layout",
    "write",
    "write_headers",
]

_ROPE = {
    "rope_type": "default",
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "mrope_interleaved": True,
}
# config.json of the released checkpoints (Qwen3.5's text_config; the fields the layout reads), as published
MODELS: dict[str, dict[str, Any]] = {
    "qwen35-35b-a3b": {
        "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 256, "num_experts_per_tok": 8,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "full_attention_interval": 4,
        "max_position_embeddings": 262144, "rope_parameters": _ROPE, "vocab_size": 248320,
    },
    "qwen35-397b-a17b": {
        "hidden_size": 4096, "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 2,
        "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 64, "num_experts": 512, "num_experts_per_tok": 10,
        "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024, "full_attention_interval": 4,
        "max_position_embeddings": 262144, "rope_parameters": _ROPE, "vocab_size": 248320,
    },
    "qwen3-next-80b-a3b": {
        "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "intermediate_size": 5120, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "full_attention_interval": 4,
        "partial_rotary_factor": 0.25, "rope_theta": 10000000, "max_position_embeddings": 262144,
    },
}  # fmt: skip
# model -> llama.cpp's architecture
MODEL_ARCH = {
    "qwen35-35b-a3b": "qwen35moe",
    "qwen35-397b-a17b": "qwen35moe",
    "qwen3-next-80b-a3b": "qwen3next",
}
# architecture -> config.json's architectures and model_type (a text-only checkpoint)
_HF_NAMES = {
    "qwen35moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
    "qwen3next": ("Qwen3NextForCausalLM", "qwen3_next"),
}
# expert type -> general.file_type (Q4_K_M: the whole file as llama.cpp's Q4_K_M mix)
EXPERT_TYPES: dict[str, gguf.LlamaFileType] = {
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "Q2_K": gguf.LlamaFileType.MOSTLY_Q2_K,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M,
}
# Q4_K_M's Q6_K tensors in the layers use_more_bits picks (llama.cpp's llama-quant.cpp): attention values
# (attn_qkv counts as one: a layer has one or the other) and down projections, routed and shared
_Q4_K_M_HIGHER = ("attn_v", "attn_qkv", "ffn_down_exps", "ffn_down_shexp")


def config(
    model: str = "qwen35-35b-a3b",
    n_layers: int | None = None,
    *,
    vocab: int | None = None,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json of ``model`` with ``n_layers`` layers (default: all; at least 2) and a ``vocab``-token
    vocabulary (default: the model's); ``fields`` replace the model's (a smaller model for tests). Qwen3.5's
    lists ``layer_types``; Qwen3-Next's only when ``full_attention_interval`` gives no attention layer."""
    arch = MODEL_ARCH[model]
    cfg: dict[str, Any] = {
        "architectures": [_HF_NAMES[arch][0]],
        "model_type": _HF_NAMES[arch][1],
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        **MODELS[model],
        **(fields or {}),
    }
    if vocab is not None:
        cfg["vocab_size"] = vocab
    n = cfg["num_hidden_layers"] if n_layers is None else n_layers
    if n < 2:  # a Gated DeltaNet layer and an attention layer
        raise ValueError(f"the model needs at least 2 layers, got {n}")
    cfg["num_hidden_layers"] = n
    types = layer_types(cfg)
    if "full_attention" not in types:
        types[-1] = "full_attention"
        cfg["layer_types"] = types
    elif arch == "qwen35moe":
        cfg["layer_types"] = types
    return cfg


def layer_types(cfg: Mapping[str, Any]) -> list[str]:
    """``cfg``'s layer types: its ``layer_types``, else every ``full_attention_interval``-th layer full
    attention and the rest Gated DeltaNet (transformers' rule)."""
    if cfg.get("layer_types") is not None:
        return list(cfg["layer_types"])
    interval = cfg["full_attention_interval"]
    n = cfg["num_hidden_layers"]
    return ["full_attention" if i % interval == interval - 1 else "linear_attention" for i in range(n)]


def checkpoint_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors (transformers' names, each layer's routed experts fused into ``gate_up_proj``
    [E, 2F, H] and ``down_proj`` [E, H, F]) and their shapes: each layer's by name, layers in order. The
    Gated DeltaNet's projections are Qwen3.5's or, for a ``qwen3_next`` config, Qwen3-Next's (per key head
    ``in_proj_qkvz``: q, k, then v and z of its value heads; ``in_proj_ba``: b, then a)."""
    H, V, E, F = cfg["hidden_size"], cfg["vocab_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
    nv, dv, K = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    S, conv = cfg["shared_expert_intermediate_size"], 2 * nk * dk + nv * dv
    common = {
        "input_layernorm.weight": (H,),
        "post_attention_layernorm.weight": (H,),
        "mlp.gate.weight": (E, H),
        "mlp.experts.gate_up_proj": (E, 2 * F, H),
        "mlp.experts.down_proj": (E, H, F),
        "mlp.shared_expert.gate_proj.weight": (S, H),
        "mlp.shared_expert.up_proj.weight": (S, H),
        "mlp.shared_expert.down_proj.weight": (H, S),
        "mlp.shared_expert_gate.weight": (1, H),
    }
    linear = {
        "linear_attn.A_log": (nv,),
        "linear_attn.conv1d.weight": (conv, 1, K),
        "linear_attn.dt_bias": (nv,),
        "linear_attn.norm.weight": (dv,),
        "linear_attn.out_proj.weight": (H, nv * dv),
    }
    if qwen3next.handles(cfg):
        linear["linear_attn.in_proj_ba.weight"] = (2 * nv, H)
        linear["linear_attn.in_proj_qkvz.weight"] = (conv + nv * dv, H)
    else:
        linear["linear_attn.in_proj_a.weight"] = (nv, H)
        linear["linear_attn.in_proj_b.weight"] = (nv, H)
        linear["linear_attn.in_proj_qkv.weight"] = (conv, H)
        linear["linear_attn.in_proj_z.weight"] = (nv * dv, H)
    attention = {  # q_proj holds each head's query and output gate
        "self_attn.q_proj.weight": (2 * nh * hd, H),
        "self_attn.k_proj.weight": (nkv * hd, H),
        "self_attn.v_proj.weight": (nkv * hd, H),
        "self_attn.o_proj.weight": (H, nh * hd),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
    }
    out = {"lm_head.weight": (V, H), "model.embed_tokens.weight": (V, H)}
    for i, kind in enumerate(layer_types(cfg)):
        block = {**common, **(linear if kind == "linear_attention" else attention)}
        out.update({f"model.layers.{i}.{k}": block[k] for k in sorted(block)})
    out["model.norm.weight"] = (H,)
    return out


class _Shape(NamedTuple):  # a checkpoint tensor as the converter's plan sees it: its shape only
    shape: tuple[int, ...]


def _use_more_bits(layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def converter(cfg: Mapping[str, Any]) -> ModuleType:
    """regolith's converter for ``cfg`` (config.json): :mod:`regolith.convert.qwen3next` or
    :mod:`regolith.convert.qwen35moe`."""
    return qwen3next if qwen3next.handles(cfg) else qwen35moe


def layout(cfg: dict[str, Any], expert_type: str = "Q4_K", dense_type: str = "Q8_0") -> list[base.TensorSpec]:
    """The GGUF tensors of ``cfg`` in its converter's order. ``expert_type`` "Q4_K_M" gives llama.cpp's Q4_K_M
    mix (``dense_type`` unused): Q4_K, with Q6_K for the output and, in the layers use_more_bits picks, the
    attention values (``attn_v``, or the GDN's ``attn_qkv``) and the routed and shared down projections; what
    its quantizer leaves alone stays F32 (the converter's rules)."""
    if expert_type not in EXPERT_TYPES:
        raise ValueError(f"expert type {expert_type!r}: choose one of {', '.join(EXPERT_TYPES)}")
    if dense_type not in base.DENSE_TYPES:
        raise ValueError(f"dense type {dense_type!r}: choose one of {', '.join(base.DENSE_TYPES)}")
    n_layers = cfg["num_hidden_layers"]
    sources = {name: _Shape(shape) for name, shape in checkpoint_shapes(cfg).items()}
    specs = []
    for name, shape, _ in converter(cfg).tensor_plan(cfg, sources):
        shape = tuple(int(s) for s in shape)
        if expert_type == "Q4_K_M":
            parts = name.split(".")
            higher = name == "output.weight" or (
                parts[0] == "blk" and parts[2] in _Q4_K_M_HIGHER and _use_more_bits(int(parts[1]), n_layers)
            )
            qtype = tensor_type(name, shape, "q6_k" if higher else "q4_k")
        elif name.endswith("_exps.weight"):
            qtype = expert_type
        else:
            qtype = tensor_type(name, shape, base.DENSE_TYPES[dense_type])
        specs.append(base.TensorSpec(name, shape, qtype))
    return specs


def _writer(
    cfg: dict[str, Any], name: str, file_type: gguf.LlamaFileType, tokenizer: bool
) -> gguf.GGUFWriter:
    """The metadata in ``regolith convert``'s order: type and name, the architecture's keys, the
    quantization version, the tokenizer (``tokenizer``)."""
    convert = converter(cfg)
    md = convert.gguf_metadata(cfg, file_type=int(file_type))
    return base.model_writer(convert.ARCH, name, md, cfg["vocab_size"] if tokenizer else None)


def write(
    path: str | os.PathLike[str],
    n_layers: int,
    *,
    model: str = "qwen35-35b-a3b",
    vocab: int = 32768,
    expert_type: str = "Q4_K",
    dense_type: str = "Q8_0",
    seed: int = 0,
    fields: Mapping[str, Any] | None = None,
) -> list[base.TensorSpec]:
    """Write a random ``model`` of ``n_layers`` layers to ``path`` (atomically; ``fields`` replace config.json
    fields, :func:`config`); returns its tensors. Raises OSError before writing anything when less than
    10 GiB of disk would remain."""
    cfg = config(model, n_layers, vocab=vocab, fields=fields)
    specs = layout(cfg, expert_type, dense_type)
    writer = _writer(cfg, f"synthetic {model} {n_layers}L {expert_type}", EXPERT_TYPES[expert_type], True)
    base.add_tensor_infos(writer, specs)
    base.write_tensors(path, writer, specs, seed=seed)
    return specs


def write_headers(path: str | os.PathLike[str], model: str) -> list[base.TensorSpec]:
    """The headers of the full ``model`` as a Q4_K_M file at ``path`` (sparse: the tensor data is a hole)."""
    cfg = config(model)
    specs = layout(cfg, "Q4_K_M")
    writer = _writer(cfg, f"synthetic {model} Q4_K_M", gguf.LlamaFileType.MOSTLY_Q4_K_M, False)
    base.write_headers(Path(path), writer, specs)
    return specs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--model", choices=list(MODELS), default="qwen35-35b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", choices=list(EXPERT_TYPES), default="Q4_K")
    ap.add_argument("--dense", choices=list(base.DENSE_TYPES), default="Q8_0")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--headers", action="store_true", help="the full model's headers only, as Q4_K_M")
    args = ap.parse_args(argv)
    if args.headers:
        specs = write_headers(args.out, args.model)
    else:
        specs = write(
            args.out, args.layers, model=args.model, vocab=args.vocab, expert_type=args.experts,
            dense_type=args.dense, seed=args.seed,
        )  # fmt: skip
    print(f"{args.out}: {sum(s.nbytes for s in specs) / 2**30:.2f} GiB, {len(specs)} tensors")


if __name__ == "__main__":
    main()
