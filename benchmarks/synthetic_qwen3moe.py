"""A random qwen3moe GGUF at Qwen3-30B-A3B's or Qwen3-235B-A22B's real per-layer shapes (fewer layers).

The shapes are the released checkpoints' config.json (``MODELS``); the metadata is what ``regolith convert``
writes for them (:mod:`regolith.convert.qwen3`), the tensor names, shapes and order llama.cpp's. Weights
are random, as benchmarks/synthetic_qwen4exp.py makes them (quantized tensors cut from pools of random blocks
scaled to a standard deviation of 1 / sqrt(row length)); the vocabulary is the tiny byte-level BPE's, padded
to ``vocab`` (default 32,768 instead of 151,936, to keep the embeddings small). Routed experts take
``--experts`` (Q4_K, Q4_0, Q8_0), the other matrices ``--dense``; norms and routers are F32.

    python benchmarks/synthetic_qwen3moe.py OUT.gguf [--model qwen3-30b-a3b] [--layers 4] [--experts Q4_K]

:func:`write_headers` writes only the headers of a file at full size (a sparse file: what ``regolith inspect
--plan`` reads), with Q4_K_M's types (Q6_K expert down projections, attention values and output).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks import synthetic_qwen4exp as base
from regolith.convert import qwen3
from regolith.convert.writer import _add_kv

__all__ = ["MODELS", "config", "layout", "write", "write_headers"]

# config.json of the released checkpoints (the fields the layout reads)
MODELS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": {
        "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
        "intermediate_size": 6144,
    },
    "qwen3-235b-a22b": {
        "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
        "intermediate_size": 12288,
    },
}  # fmt: skip
# Q4_K_M's choices for the tensors it keeps above Q4_K (llama.cpp's llama-quant.cpp, in its simplest form)
_Q4_K_M_HIGHER = ("ffn_down_exps", "attn_v", "output")


def config(
    model: str = "qwen3-30b-a3b", n_layers: int | None = None, *, vocab: int = 151936
) -> dict[str, Any]:
    """config.json of ``model`` with ``n_layers`` layers (default: all) and a ``vocab``-token vocabulary."""
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": vocab,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "norm_topk_prob": True,
        **MODELS[model],
    }
    if n_layers is not None:
        cfg["num_hidden_layers"] = n_layers
    return cfg


def layout(cfg: dict[str, Any], expert_type: str = "Q4_K", dense_type: str = "Q8_0") -> list[base.TensorSpec]:
    """The GGUF tensors of ``cfg`` in llama.cpp's order; ``expert_type`` "Q4_K_M" gives Q4_K_M's mix."""
    H, V, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    E, F = cfg["num_experts"], cfg["moe_intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    mixed = expert_type == "Q4_K_M"

    def spec(name: str, shape: tuple[int, ...], expert: bool = False) -> base.TensorSpec:
        if len(shape) == 1 or name.endswith("ffn_gate_inp.weight"):
            qtype = "F32"
        elif mixed:
            qtype = "Q6_K" if name.split(".")[-2] in _Q4_K_M_HIGHER else "Q4_K"
        else:
            qtype = expert_type if expert else dense_type
        return base.TensorSpec(name, shape, qtype)

    specs = [spec("output.weight", (V, H)), spec("token_embd.weight", (V, H))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"blk.{i}."
        specs += [
            spec(p + "attn_norm.weight", (H,)),
            spec(p + "ffn_down_exps.weight", (E, H, F), True),
            spec(p + "ffn_gate_exps.weight", (E, F, H), True),
            spec(p + "ffn_up_exps.weight", (E, F, H), True),
            spec(p + "ffn_gate_inp.weight", (E, H)),
            spec(p + "ffn_norm.weight", (H,)),
            spec(p + "attn_k_norm.weight", (hd,)),
            spec(p + "attn_k.weight", (nkv * hd, H)),
            spec(p + "attn_output.weight", (H, nh * hd)),
            spec(p + "attn_q_norm.weight", (hd,)),
            spec(p + "attn_q.weight", (nh * hd, H)),
            spec(p + "attn_v.weight", (nkv * hd, H)),
        ]
    specs.append(spec("output_norm.weight", (H,)))
    return specs


def _writer(
    cfg: dict[str, Any], name: str, file_type: gguf.LlamaFileType, tokenizer: bool
) -> gguf.GGUFWriter:
    writer = gguf.GGUFWriter(path=None, arch="qwen3moe")
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    md = qwen3.gguf_metadata(cfg, file_type=int(file_type))
    _add_kv(writer, md + (base.tokenizer_metadata(cfg["vocab_size"]) if tokenizer else []))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return writer


def write(
    path: str | os.PathLike[str],
    n_layers: int,
    *,
    model: str = "qwen3-30b-a3b",
    vocab: int = 32768,
    expert_type: str = "Q4_K",
    dense_type: str = "Q8_0",
    seed: int = 0,
) -> list[base.TensorSpec]:
    """Write a random ``model`` of ``n_layers`` layers to ``path`` (atomically); returns its tensors."""
    cfg = config(model, n_layers, vocab=vocab)
    specs = layout(cfg, expert_type, dense_type)
    writer = _writer(
        cfg, f"synthetic {model} {n_layers}L {expert_type}", base.EXPERT_TYPES[expert_type], True
    )
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
    ap.add_argument("--model", choices=list(MODELS), default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", choices=list(base.EXPERT_TYPES), default="Q4_K")
    ap.add_argument("--dense", choices=list(base.DENSE_TYPES), default="Q8_0")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    specs = write(
        args.out, args.layers, model=args.model, vocab=args.vocab, expert_type=args.experts,
        dense_type=args.dense, seed=args.seed,
    )  # fmt: skip
    print(f"{args.out}: {sum(s.nbytes for s in specs) / 2**30:.2f} GiB, {len(specs)} tensors")


if __name__ == "__main__":
    main()
