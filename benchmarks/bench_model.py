"""qwen4_exp prefill and decode speed on CPU at Qwen3.8-Flash-Next's per-layer shapes.

A synthetic model with the real per-layer dimensions (hidden 2048, 512 experts top-10 of width 512 plus a
shared expert, Gated DeltaNet 16 key / 32 value heads of 128, QSA 16 heads of 256 with 2 KV heads, 4
hyper-connection streams of rank 320, vocabulary 248,320) but only a few layers, so it fits in RAM: IQ2_XS
routed experts (random valid blocks), Q8_0 dense matrices, Q6_K LM head, F32 vectors. No PLE layer (the
real table is 51B parameters). Random weights route near-uniformly, which makes decode read more distinct
experts than a trained model would.

    python benchmarks/bench_model.py [--layers 4] [--prompt 512] [--decode 32] [--repeat 1] [--baseline DIR]

Prints a table: prefill and decode tokens/s, and the weight bytes a decode step touches against the
memory bandwidth measured in the same run. ``--baseline DIR`` adds another regolith build (installed in DIR
with ``pip install --no-deps --target``), run in its own process; with ``--repeat`` the builds take turns and
each figure is the best of the runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import gguf
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.engines import Baseline, Regolith
from regolith import _core
from regolith.convert.qwen4exp import gguf_metadata
from regolith.quant import type_size
from tests.quant_data import random_blocks, set_fp16

H, V, HC, RANK = 2048, 248320, 4, 320
E, TOPK, FF, FF_SH = 512, 10, 512, 512
LK, LV, DK, DV, KCONV = 16, 32, 128, 128, 4
NH, NKV, HD, IH, IDIM = 16, 2, 256, 16, 128


def config(n_layers: int) -> dict:
    types = ["indexed_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layers)]
    if "indexed_attention" not in types:
        types[-1] = "indexed_attention"
    return {
        "architectures": ["Qwen4ExpForCausalLM"],
        "model_type": "qwen4_exp_text",
        "vocab_size": V, "hidden_size": H, "num_hidden_layers": n_layers, "layer_types": types,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
        "rope_parameters": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": KCONV, "linear_key_head_dim": DK, "linear_value_head_dim": DV,
        "linear_num_key_heads": LK, "linear_num_value_heads": LV,
        "hc_count": HC, "hc_lowrank": RANK, "ple_layer_ids": [],
        "indexer_n_heads": IH, "indexer_head_dim": IDIM, "indexer_budget": 2048, "indexer_compress_ratio": 64,
        "num_experts": E, "num_experts_per_tok": TOPK, "moe_intermediate_size": FF,
        "shared_expert_intermediate_size": FF_SH, "norm_topk_prob": True,
        "output_gate_type": "sigmoid", "hidden_act": "silu", "eos_token_id": 2,
    }  # fmt: skip


def quant(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float) -> np.ndarray:
    """Random valid blocks of type `name` for a tensor of numpy `shape`, every block scale `scale`."""
    qk, bs = type_size(name)
    n_blocks = int(np.prod(shape)) // qk
    blocks = random_blocks(name, n_blocks, rng)
    set_fp16(blocks, name, np.float16(scale).view(np.uint16))
    return blocks.reshape(*shape[:-1], shape[-1] // qk * bs)


def write_model(path: str, n_layers: int, rng: np.random.Generator) -> int:
    """The synthetic GGUF; returns the bytes of weights one decode step reads (dense + top-k experts)."""
    cfg = config(n_layers)
    w = gguf.GGUFWriter(path, "qwen4exp")
    for key, val, vt in gguf_metadata(cfg):
        if isinstance(val, list):
            w.add_key_value(key, val, gguf.GGUFValueType.ARRAY, sub_type=vt)
        else:
            w.add_key_value(key, val, vt)
    # no vocabulary: llama.cpp then sizes it from vocab_size (and needs no tokenizer to run token ids)
    w.add_string("tokenizer.ggml.model", "none")
    w.add_uint32("qwen4exp.vocab_size", V)
    per_token = 0

    def mat(name: str, rows: int, cols: int, qtype: str = "Q8_0", scale: float = 2**-8) -> None:
        nonlocal per_token
        data = quant(qtype, (rows, cols), rng, scale)
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])
        if name != "token_embd.weight":
            per_token += data.nbytes

    def vec(name: str, n: int, value: float = 1.0) -> None:
        w.add_tensor(name, np.full(n, value, np.float32))

    def experts(name: str, rows: int, cols: int) -> None:
        nonlocal per_token
        data = quant("IQ2_XS", (E, rows, cols), rng, 2**-6)
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.IQ2_XS)
        per_token += data.nbytes * TOPK // E

    mat("token_embd.weight", V, H, scale=2**-4)
    mat("output.weight", V, H, "Q6_K", 2**-8)
    for p, inject in [("output_hc", False)] + [
        (f"blk.{i}.hc_{k}", True) for i in range(n_layers) for k in ("attn", "ffn")
    ]:
        vec(f"{p}_norm.weight", HC * H)
        mat(f"{p}_down.weight", RANK, HC * H)
        mat(f"{p}_up.weight", HC * H, RANK)
        if inject:
            mat(f"{p}_inject.weight", HC, HC * H)
    for i, kind in enumerate(cfg["layer_types"]):
        b = f"blk.{i}."
        if kind == "linear_attention":
            conv = 2 * LK * DK + LV * DV
            mat(b + "attn_qkv.weight", conv, H)
            mat(b + "attn_gate.weight", LV * DV, H)
            w.add_tensor(b + "ssm_conv1d.weight", rng.standard_normal((conv, KCONV)).astype(np.float32) * 0.1)
            vec(b + "ssm_a", LV, -1.0)
            vec(b + "ssm_dt.bias", LV, 0.5)
            mat(b + "ssm_alpha.weight", LV, H, "F32" if False else "Q8_0")
            mat(b + "ssm_beta.weight", LV, H)
            vec(b + "ssm_norm.weight", DV)
            mat(b + "ssm_out.weight", H, LV * DV)
        else:
            mat(b + "attn_q.weight", 2 * NH * HD, H)
            mat(b + "attn_k.weight", NKV * HD, H)
            mat(b + "attn_v.weight", NKV * HD, H)
            vec(b + "attn_q_norm.weight", HD)
            vec(b + "attn_k_norm.weight", HD)
            mat(b + "attn_output.weight", H, NH * HD)
            mat(b + "indexer.q_proj.weight", IH * IDIM, H)
            mat(b + "indexer.k_proj.weight", IDIM, H)
            vec(b + "indexer.q_norm.weight", IDIM)
            vec(b + "indexer.k_norm.weight", IDIM)
        w.add_tensor(b + "ffn_gate_inp.weight", rng.standard_normal((E, H)).astype(np.float32) * 0.05)
        per_token += E * H * 4
        experts(b + "ffn_gate_exps.weight", FF, H)
        experts(b + "ffn_up_exps.weight", FF, H)
        experts(b + "ffn_down_exps.weight", H, FF)
        mat(b + "ffn_gate_shexp.weight", FF_SH, H)
        mat(b + "ffn_up_shexp.weight", FF_SH, H)
        mat(b + "ffn_down_shexp.weight", H, FF_SH)
        w.add_tensor(b + "ffn_gate_inp_shexp.weight", rng.standard_normal(H).astype(np.float32) * 0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return per_token


def time_llamacpp(path: str, prompt: np.ndarray, n_decode: int, threads: int) -> tuple[float, float] | None:
    """The same for llama.cpp (llama-cpp-python), or None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=len(prompt) + n_decode + 8, n_batch=len(prompt), n_ubatch=len(prompt),
        n_threads=threads, n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    llm.eval(prompt[:8].tolist())  # warm-up: fault the mapping in
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt.tolist())
    prefill = time.perf_counter() - t

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(V,))

    tok = int(np.argmax(last_logits()))
    t = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
    return prefill, time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each build, taking turns (best counts)")
    ap.add_argument("--baseline", help="a directory holding another regolith build to compare with")
    args = ap.parse_args(argv)
    _core.set_threads(args.threads)
    console = Console()
    buf = np.random.default_rng(0).integers(0, 256, 1 << 30, dtype=np.uint8)
    _core.read_all(buf)
    t = time.perf_counter()
    _core.read_all(buf)
    bw = buf.nbytes / (time.perf_counter() - t)
    del buf

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "synthetic-qwen4exp.gguf")
        console.print(f"writing a {args.layers}-layer synthetic qwen4exp GGUF ...")
        per_token = write_model(path, args.layers, rng)
        size = os.path.getsize(path)
        prompt = rng.integers(3, V, args.prompt).astype(np.int32)
        builds = {"regolith": Regolith(path, prompt, args.decode)}
        if args.baseline:
            builds["baseline"] = Baseline(args.baseline, path, prompt, args.decode, _core.threads())
        best = {name: (float("inf"), float("inf")) for name in builds}
        for _ in range(args.repeat):
            for name, engine in builds.items():
                pre, dec = engine.run()
                best[name] = (min(best[name][0], pre), min(best[name][1], dec))
        for engine in builds.values():
            engine.close()
        ours = best["regolith"]
        peer = time_llamacpp(path, prompt, args.decode, _core.threads())

    table = Table(title=f"qwen4exp, {args.layers} layers at Flash-Next shapes ({size / 2**30:.2f} GiB), "
                  f"{_core.threads()} threads, kernels: {_core.isa()}")  # fmt: skip
    for col in ("engine", "prefill tok/s", "decode tok/s", "decode weight GB/s", "note"):
        table.add_column(col, justify="left" if col in ("engine", "note") else "right")
    rows = [("regolith", ours)] + ([("baseline", best["baseline"])] if args.baseline else [])
    rows += [("llama.cpp", peer)] if peer else []
    for engine, (pre, dec) in rows:
        rate = args.decode / dec
        note = f"{per_token * rate / bw:.0%} of {bw / 1e9:.1f} GB/s memory bandwidth"
        if engine == "regolith" and args.baseline:
            base = best["baseline"]
            note += f"; vs baseline: prefill {base[0] / pre:.3f}x, decode {base[1] / dec:.3f}x"
        if engine == "regolith" and peer:
            note += f"; vs llama.cpp: prefill {peer[0] / pre:.2f}x, decode {peer[1] / dec:.2f}x"
        table.add_row(
            engine, f"{args.prompt / pre:.1f}", f"{rate:.2f}", f"{per_token * rate / 1e9:.1f}", note
        )
    if not peer:
        console.print("llama.cpp (llama-cpp-python) is not installed: no peer column")
    console.print(table)


if __name__ == "__main__":
    main()
