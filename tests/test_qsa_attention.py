"""QSA indexed attention (csrc/model/qsa_attention.cpp) against transformers' Qwen4ExpTextAttention.

A tiny qwen4_exp model with random weights runs in transformers; a forward hook captures the attention
layer's input and output. The C++ layer reads the same weights from a GGUF in llama.cpp's layout and runs
on the captured input: the whole prompt at once, in uneven chunks, or token by token. The compress ratio
and budget are far below the prompt length, so the indexer's block selection decides what each query sees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from regolith import ModelFormatError, RegolithError, _core

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

LAYER = 1  # layer 0 is a GDN layer, so the loader must find the right block
SEQ = 45


@dataclass(frozen=True)
class Case:
    heads: int
    kv_heads: int
    head_dim: int
    rotary: float  # partial_rotary_factor
    index_heads: int
    index_dim: int
    ratio: int
    budget: int


CASES = {
    "gqa2_half_rotary": Case(4, 2, 32, 0.5, 4, 16, 4, 8),
    "gqa4_quarter_rotary": Case(4, 1, 32, 0.25, 8, 16, 3, 9),
    "mha_full_index_rotary": Case(2, 2, 16, 1.0, 4, 16, 5, 10),
}


def _config(c: Case):
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    return Qwen4ExpTextConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        layer_types=["linear_attention", "indexed_attention"],
        num_attention_heads=c.heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_dim,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": c.rotary,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        hc_count=2,
        hc_lowrank=8,
        indexer_n_heads=c.index_heads,
        indexer_kv_heads=1,
        indexer_head_dim=c.index_dim,
        indexer_budget=c.budget,
        indexer_compress_ratio=c.ratio,
        max_position_embeddings=256,
        eos_token_id=1,
    )


def _model(c: Case):
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    torch.manual_seed(0)
    model = Qwen4ExpForCausalLM(_config(c)).eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():  # spread the weights so scores are far from ties
        for p in model.parameters():
            p.normal_(0.0, 0.25 if p.ndim == 1 else 0.12)
    return model


def _reference(model, ids: torch.Tensor):
    """(attention input, attention output) of layer LAYER for the whole prompt."""
    attn = model.model.layers[LAYER].self_attn
    seen = {}

    def hook(_module, args, kwargs, output):
        seen["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach().numpy().copy()
        seen["y"] = output[0][0].detach().numpy().copy()

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    handle.remove()
    return seen["x"].astype(np.float32), seen["y"].astype(np.float32)


def _write_gguf(model, path: Path, qtype=None, drop: str | None = None) -> None:
    """The QSA layer's metadata and tensors in llama.cpp's qwen4exp layout (conversion/qwen4exp.py)."""
    cfg = model.config
    attn = model.model.layers[LAYER].self_attn
    w = gguf.GGUFWriter(str(path), "qwen4exp")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
    w.add_rope_dimension_sections([*cfg.rope_parameters["mrope_section"], 0])
    w.add_uint32("qwen4exp.attention.indexer.head_count", cfg.indexer_n_heads)
    w.add_uint32("qwen4exp.attention.indexer.key_length", cfg.indexer_head_dim)
    w.add_uint32("qwen4exp.attention.indexer.top_k", cfg.indexer_budget)
    w.add_array(
        "qwen4exp.attention.compress_ratios",
        [cfg.indexer_compress_ratio if t == "indexed_attention" else 0 for t in cfg.layer_types],
    )

    n_q = cfg.indexer_n_heads * cfg.indexer_head_dim
    qk = attn.indexer.index_qk_proj.weight.detach()
    tensors = {
        "attn_q.weight": attn.q_proj.weight,
        "attn_k.weight": attn.k_proj.weight,
        "attn_v.weight": attn.v_proj.weight,
        "attn_output.weight": attn.o_proj.weight,
        "attn_q_norm.weight": attn.q_norm.weight + 1,
        "attn_k_norm.weight": attn.k_norm.weight + 1,
        "indexer.q_proj.weight": qk[:n_q],
        "indexer.k_proj.weight": qk[n_q:],
        "indexer.q_norm.weight": attn.indexer.q_layernorm.weight + 1,
        "indexer.k_norm.weight": attn.indexer.k_layernorm.weight + 1,
    }
    for name, t in tensors.items():
        if name == drop:
            continue
        a = t.detach().float().numpy().copy()
        full = f"blk.{LAYER}.{name}"
        if a.ndim == 2 and qtype is not None:
            w.add_tensor(full, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(full, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _run(layer, x: np.ndarray, chunks: list[int]) -> np.ndarray:
    state = layer.new_state(256)
    out, start = [], 0
    for n in chunks:
        pos = np.arange(start, start + n, dtype=np.int64)
        out.append(layer.forward(np.ascontiguousarray(x[start : start + n]), pos, state))
        start += n
    assert start == len(x) and state.size == len(x)
    return np.concatenate(out)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", params=list(CASES))
def setup(request, tmp_path_factory):
    c = CASES[request.param]
    model = _model(c)
    ids = torch.randint(0, 64, (1, SEQ), generator=torch.Generator().manual_seed(1))
    x, y = _reference(model, ids)
    path = tmp_path_factory.mktemp("qsa") / f"{request.param}.gguf"
    _write_gguf(model, path)
    return c, model, x, y, path


SPLITS = {
    "prompt": lambda n: [n],
    "uneven_chunks": lambda n: [7, 1, 13, 2, n - 23],
    "token_by_token": lambda n: [1] * n,
}


@pytest.mark.parametrize("split", list(SPLITS))
def test_qsa_matches_transformers(setup, split):
    c, _model, x, y, path = setup
    layer = _core.QsaAttentionLayer(str(path), LAYER)
    assert layer.compress_ratio == c.ratio and layer.block_topk == c.budget // c.ratio
    got = _run(layer, x, SPLITS[split](len(x)))
    assert _rel(got, y) <= 1e-4


def test_qsa_truncate_then_continue_matches_transformers(setup):
    """Rolling the state back (speculation) and re-feeding the tokens gives the same outputs."""
    _c, _model, x, y, path = setup
    layer = _core.QsaAttentionLayer(str(path), LAYER)
    state = layer.new_state(SEQ)
    pos = np.arange(SEQ, dtype=np.int64)
    layer.forward(np.ascontiguousarray(x[:30]), pos[:30], state)
    state.truncate(17)  # mid-block for every ratio in CASES
    assert state.size == 17 and state.n_blocks == 17 // layer.compress_ratio
    got = layer.forward(np.ascontiguousarray(x[17:]), pos[17:], state)
    assert _rel(got, y[17:]) <= 1e-4


def test_qsa_q8_0_matches_dequantized_reference(setup, tmp_path):
    """Q8_0 weights, with float activations (exact mode), compute exactly what the layer does on the
    dequantized f32 weights, which the tests above check against transformers. (The default int8
    activations add rounding that the kernel tests bound per product; with the sparse selection it can flip
    a near-tied block choice for a query, so it is not compared token by token here.)"""
    from tests.model.twin import write_dequantized_twin

    _c, model, x, _y, _path = setup
    q8_path = tmp_path / "q8.gguf"
    _write_gguf(model, q8_path, qtype=gguf.GGMLQuantizationType.Q8_0)
    twin = write_dequantized_twin(q8_path, tmp_path / "twin.gguf")
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        got = _run(_core.QsaAttentionLayer(str(q8_path), LAYER), x, [SEQ])
        want = _run(_core.QsaAttentionLayer(str(twin), LAYER), x, [SEQ])
    finally:
        _core.set_exact_activations(before)
    np.testing.assert_array_equal(got, want)


def test_qsa_context_overflow_is_a_clear_error(setup):
    _c, _model, x, _y, path = setup
    layer = _core.QsaAttentionLayer(str(path), LAYER)
    state = layer.new_state(10)
    layer.forward(np.ascontiguousarray(x[:8]), np.arange(8, dtype=np.int64), state)
    with pytest.raises(RegolithError, match="context full.*holds 8 of 10 tokens.*3 more"):
        layer.forward(np.ascontiguousarray(x[8:11]), np.arange(8, 11, dtype=np.int64), state)
    assert state.size == 8  # unchanged: the two tokens that fit can still be fed
    layer.forward(np.ascontiguousarray(x[8:10]), np.arange(8, 10, dtype=np.int64), state)
    assert state.size == 10


def test_qsa_missing_tensor_is_a_model_format_error(setup, tmp_path):
    _c, model, _x, _y, path = setup
    broken = tmp_path / "broken.gguf"
    _write_gguf(model, broken, drop="indexer.k_norm.weight")
    with pytest.raises(
        ModelFormatError, match=rf"QSA layer {LAYER}: missing tensor 'blk\.{LAYER}\.indexer\.k_norm\.weight'"
    ):
        _core.QsaAttentionLayer(str(broken), LAYER)
    with pytest.raises(ModelFormatError, match="not a QSA"):
        _core.QsaAttentionLayer(str(path), 0)  # the GDN layer
