"""Random gpt-oss GGUFs at gpt-oss-20b's or gpt-oss-120b's real per-layer shapes (fewer layers).

``MODELS`` holds the released checkpoints' config.json fields as published (recorded here, not read from the
files, which are not downloaded). The metadata is what ``regolith convert`` writes for them
(:mod:`regolith.convert.gpt_oss`), the tensor names, shapes and order its plan's (llama.cpp's converter's) for
the released checkpoint's tensors (:func:`checkpoint_shapes`: MXFP4 routed experts, one file walked by
name): the MXFP4 experts first, then every other tensor. Routed experts are MXFP4 (17 bytes per 32 weights),
as released; their biases, the routers, norms, attention biases and sinks F32; the other matrices
``--dense`` (Q8_0, the default, as in ggml-org's released GGUFs, whose sizes, 12.1 and 63.4 GB, are those of
Q8_0 attention and embeddings; or F16). Layers alternate sliding-window (even) and full attention. Weights
are random, as benchmarks/synthetic_qwen4exp.py makes them (quantized tensors cut from pools of random
blocks scaled to a standard deviation of 1 / sqrt(row length): for MXFP4 the power of two nearest it);
the vocabulary is the tiny byte-level BPE's, padded to ``vocab`` (default 32,768 instead of 201,088, to
keep the embeddings small).

    python benchmarks/synthetic_gptoss.py OUT.gguf [--model gpt-oss-20b] [--layers 4] [--dense Q8_0] [--check]

:func:`write_headers` (``--headers``) writes only the headers of the full model (a sparse file: what
``regolith inspect --plan`` reads; docs/streaming.md has the plans)::

    python benchmarks/synthetic_gptoss.py gpt-oss-120b-mxfp4.gguf --model gpt-oss-120b --headers
    regolith inspect gpt-oss-120b-mxfp4.gguf --plan --memory-gb 18.8 --ctx 32k,128k
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks import synthetic_qwen4exp as base
from regolith.convert import gpt_oss
from regolith.convert.writer import tensor_type

__all__ = ["EXPERT_TYPES", "MODELS", "checkpoint_shapes", "config", "layout", "write", "write_headers"]

_ROPE = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "rope_type": "yarn",
    "truncate": False,
}
# config.json of the released checkpoints (the fields the layout and metadata read), as published
MODELS: dict[str, dict[str, Any]] = {
    "gpt-oss-20b": {
        "hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "intermediate_size": 2880,
        "sliding_window": 128, "max_position_embeddings": 131072, "rope_theta": 150000, "rope_scaling": _ROPE,
        "vocab_size": 201088,
    },
    "gpt-oss-120b": {
        "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4, "intermediate_size": 2880,
        "sliding_window": 128, "max_position_embeddings": 131072, "rope_theta": 150000, "rope_scaling": _ROPE,
        "vocab_size": 201088,
    },
}  # fmt: skip
# expert type -> general.file_type (llama.cpp's for MXFP4 experts beside Q8_0 tensors: MXFP4_MOE)
EXPERT_TYPES: dict[str, gguf.LlamaFileType] = {"MXFP4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE}


def config(
    model: str = "gpt-oss-20b",
    n_layers: int | None = None,
    *,
    vocab: int | None = None,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json of ``model`` with ``n_layers`` layers (default: all), a ``vocab``-token vocabulary
    (default: the model's) and MXFP4 experts (``quantization_config``); ``fields`` replace the model's (a
    smaller model for tests)."""
    cfg: dict[str, Any] = {
        "architectures": list(gpt_oss.HF_ARCHITECTURES),
        "model_type": "gpt_oss",
        "attention_bias": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        },
        **MODELS[model],
        **(fields or {}),
    }  # fmt: skip
    if vocab is not None:
        cfg["vocab_size"] = vocab
    if n_layers is not None:
        if n_layers < 1:
            raise ValueError(f"the model needs at least 1 layer, got {n_layers}")
        cfg["num_hidden_layers"] = n_layers
    n = cfg["num_hidden_layers"]
    cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return cfg


def checkpoint_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The released checkpoint's tensors as one safetensors file holds them, by name (the order llama.cpp's
    converter walks a file in): name -> (shape, dtype). Routed experts are MXFP4 ``*_blocks`` (U8 [E, out,
    in / 32, 16]) and ``*_scales`` (U8 [E, out, in / 32]), gate and up rows interleaved in ``gate_up_proj``;
    everything else BF16."""
    H, V, hd, F = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"], cfg["intermediate_size"]
    nh, nkv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_local_experts"]
    layer = {
        "input_layernorm.weight": ((H,), "BF16"),
        "mlp.experts.down_proj_bias": ((E, H), "BF16"),
        "mlp.experts.down_proj_blocks": ((E, H, F // 32, 16), "U8"),
        "mlp.experts.down_proj_scales": ((E, H, F // 32), "U8"),
        "mlp.experts.gate_up_proj_bias": ((E, 2 * F), "BF16"),
        "mlp.experts.gate_up_proj_blocks": ((E, 2 * F, H // 32, 16), "U8"),
        "mlp.experts.gate_up_proj_scales": ((E, 2 * F, H // 32), "U8"),
        "mlp.router.bias": ((E,), "BF16"),
        "mlp.router.weight": ((E, H), "BF16"),
        "post_attention_layernorm.weight": ((H,), "BF16"),
        "self_attn.k_proj.bias": ((nkv * hd,), "BF16"),
        "self_attn.k_proj.weight": ((nkv * hd, H), "BF16"),
        "self_attn.o_proj.bias": ((H,), "BF16"),
        "self_attn.o_proj.weight": ((H, nh * hd), "BF16"),
        "self_attn.q_proj.bias": ((nh * hd,), "BF16"),
        "self_attn.q_proj.weight": ((nh * hd, H), "BF16"),
        "self_attn.sinks": ((nh,), "BF16"),
        "self_attn.v_proj.bias": ((nkv * hd,), "BF16"),
        "self_attn.v_proj.weight": ((nkv * hd, H), "BF16"),
    }
    out = {
        "lm_head.weight": ((V, H), "BF16"),
        "model.embed_tokens.weight": ((V, H), "BF16"),
        "model.norm.weight": ((H,), "BF16"),
    }
    for i in range(cfg["num_hidden_layers"]):
        out.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
    return dict(sorted(out.items()))


class _Source(NamedTuple):  # a checkpoint tensor as the converter's plan sees it: shape and dtype only
    shape: tuple[int, ...]
    dtype: str


def layout(
    cfg: dict[str, Any], expert_type: str = "MXFP4", dense_type: str = "Q8_0"
) -> list[base.TensorSpec]:
    """The GGUF tensors of ``cfg`` in its converter's order: the routed experts as the checkpoint holds them
    (MXFP4, written first), the other tensors by the converter's rules for ``dense_type`` (Q8_0 or F16;
    1-D tensors, biases, norms and routers F32)."""
    if expert_type not in EXPERT_TYPES:
        raise ValueError(f"expert type {expert_type!r}: choose one of {', '.join(EXPERT_TYPES)}")
    if dense_type not in base.DENSE_TYPES:
        raise ValueError(f"dense type {dense_type!r}: choose one of {', '.join(base.DENSE_TYPES)}")
    sources = {name: _Source(*shape_dtype) for name, shape_dtype in checkpoint_shapes(cfg).items()}
    specs = []
    for name, shape, build in gpt_oss.tensor_plan(cfg, sources):
        shape = tuple(int(s) for s in shape)
        if isinstance(build, gpt_oss.Mxfp4Experts):
            qtype = expert_type
        else:
            qtype = tensor_type(name, shape, base.DENSE_TYPES[dense_type])
        specs.append(base.TensorSpec(name, shape, qtype))
    return specs


def _writer(cfg: dict[str, Any], name: str, expert_type: str, tokenizer: bool) -> gguf.GGUFWriter:
    md = gpt_oss.gguf_metadata(cfg, file_type=int(EXPERT_TYPES[expert_type]))
    return base.model_writer(gpt_oss.ARCH, name, md, cfg["vocab_size"] if tokenizer else None)


def write(
    path: str | os.PathLike[str],
    n_layers: int,
    *,
    model: str = "gpt-oss-20b",
    vocab: int = 32768,
    expert_type: str = "MXFP4",
    dense_type: str = "Q8_0",
    seed: int = 0,
    fields: Mapping[str, Any] | None = None,
) -> list[base.TensorSpec]:
    """Write a random ``model`` of ``n_layers`` layers to ``path`` (atomically; ``fields`` replace config.json
    fields, :func:`config`); returns its tensors. Raises OSError before writing anything when less than
    10 GiB of disk would remain."""
    cfg = config(model, n_layers, vocab=vocab, fields=fields)
    specs = layout(cfg, expert_type, dense_type)
    writer = _writer(cfg, f"synthetic {model} {n_layers}L {expert_type}", expert_type, True)
    base.add_tensor_infos(writer, specs)
    base.write_tensors(path, writer, specs, seed=seed)
    return specs


def write_headers(
    path: str | os.PathLike[str], model: str, dense_type: str = "Q8_0"
) -> list[base.TensorSpec]:
    """The headers of the full ``model`` (MXFP4 experts, ``dense_type`` matrices) at ``path`` (sparse: the
    tensor data is a hole)."""
    cfg = config(model)
    specs = layout(cfg, "MXFP4", dense_type)
    base.write_headers(Path(path), _writer(cfg, f"synthetic {model} MXFP4", "MXFP4", False), specs)
    return specs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--model", choices=list(MODELS), default="gpt-oss-20b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dense", choices=list(base.DENSE_TYPES), default="Q8_0")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--headers", action="store_true", help="the full model's headers only")
    ap.add_argument("--check", action="store_true", help="load it in regolith and llama.cpp afterwards")
    args = ap.parse_args(argv)
    if args.headers:
        specs = write_headers(args.out, args.model, args.dense)
    else:
        specs = write(
            args.out, args.layers, model=args.model, vocab=args.vocab, dense_type=args.dense, seed=args.seed
        )
    print(
        f"{args.out}: {sum(s.nbytes for s in specs) / 2**30:.2f} GiB "
        f"({base.expert_bytes(specs) / 2**30:.2f} GiB routed experts), {len(specs)} tensors"
    )
    if args.check and not args.headers:
        for engine, summary in base.check(args.out).items():
            print(f"{engine}: logits {summary}")


if __name__ == "__main__":
    main()
