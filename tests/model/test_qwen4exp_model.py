"""The whole qwen4_exp text model (regolith.Model / Window) against transformers 5.24 in fp32.

Tiny random checkpoints from tests/qwen4exp_models.py go through ``save_pretrained`` and
``regolith.convert.convert`` (f32, llama.cpp's layout); logits for a 40-token prompt (with an EOS inside) must match transformers'
to 1e-4 of their scale, for the whole prompt at once, in uneven chunks and token by token.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import regolith
from regolith import ContextOverflowError, ModelFormatError

torch.set_num_threads(1)

SEQ = 40
# The QSA indexer scores a block as sum_h relu(q_h . k): with few indexer heads, blocks often score exactly
# 0, and torch.topk breaks such exact ties in no specified order (regolith takes the lower block). 8 indexer
# heads make an all-zero score rare, so the reference's choices are well defined for these prompts.
BASE = {"indexer_n_heads": 8, "output_gate_type": "sigmoid"}
CASES = {
    "default": {},
    "no_ple": {"ple_layer_ids": []},
    "hc4_ple_layer3": {"hc_count": 4, "ple_layer_ids": [3]},
    "topk_not_normalised": {"norm_topk_prob": False},
    "gqa4_full_rotary": {"num_attention_heads": 4, "num_key_value_heads": 1, "partial_rotary": 1.0},
    "large_budget": {"indexer_budget": 64},
    "silu_gate_v6": {"output_gate_type": "silu", "linear_num_value_heads": 6},
    "eos_list": {"eos_token_id": [2, 0]},
}


def prompt(vocab: int, eos: int, seed: int = 0) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, vocab, SEQ)
    ids[17] = eos
    return ids


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model, tiny_model

    overrides = {**BASE, **CASES[request.param]}
    model = tiny_model(7, **overrides)
    tmp = tmp_path_factory.mktemp(request.param)
    save_tiny_model(tmp / "hf", 7, **overrides)
    path = convert(tmp / "hf", tmp / "tiny.gguf", "f32")
    ids = prompt(model.config.vocab_size, 2)
    with torch.no_grad():
        ref = model(torch.tensor(ids)[None]).logits[0].numpy().astype(np.float64)
    # The f32 cache computes what transformers computes; the 8-bit default is checked against transformers with
    # its rounding applied in tests/model/test_kv_cache_types.py.
    return regolith.Model.load(path, kv_type="f32"), ids, ref


def _check(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and got.dtype == np.float32
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= 1e-4, f"relative error {err:.3g}"


def test_logits_match_transformers_whole_prompt(case):
    model, ids, ref = case
    _check(model.window(64).eval(ids), ref)


def test_logits_match_transformers_uneven_chunks(case):
    model, ids, ref = case
    w = model.window(64)
    parts, start = [], 0
    for n in (7, 1, 13, 2, 17):
        parts.append(w.eval(ids[start : start + n]))
        start += n
    assert w.n_past == SEQ
    _check(np.concatenate(parts), ref)


def test_logits_match_transformers_token_by_token(case):
    model, ids, ref = case
    w = model.window(64)
    _check(np.concatenate([w.eval(ids[i : i + 1]) for i in range(SEQ)]), ref)


def test_reset_and_errors(case):
    model, ids, ref = case
    w = model.window(SEQ)
    w.eval(ids[:5])
    w.reset()
    assert w.n_past == 0
    # overflow on a partly filled window is refused and leaves its state as it was
    _check(w.eval(ids[:30]), ref[:30])
    with pytest.raises(ContextOverflowError, match="context overflow"):
        w.eval(np.full(SEQ - 30 + 1, 3))
    assert w.n_past == 30
    _check(w.eval(ids[30:]), ref[30:])
    with pytest.raises(ContextOverflowError, match="context overflow"):
        w.eval(ids[:1])
    with pytest.raises(ValueError, match="out of range"):
        model.window(8).eval([model.config["vocab_size"]])


def test_unsupported_architecture(tmp_path):
    from tests.gguf_samples import write_gguf as write_sample

    other = write_sample(tmp_path / "llama.gguf", [], [("w", np.zeros((2, 32), np.float32), None)])
    with pytest.raises(ModelFormatError, match="not supported"):
        regolith.Model.load(other)


def test_missing_tensor_and_lying_block_count(tmp_path):
    from regolith.convert import convert
    from tests.model.twin import write_dequantized_twin
    from tests.qwen4exp_models import save_tiny_model

    good = convert(save_tiny_model(tmp_path / "hf", 7, **BASE), tmp_path / "good.gguf", "f32")
    missing = write_dequantized_twin(good, tmp_path / "missing.gguf", drop="blk.2.ffn_up_exps.weight")
    with pytest.raises(ModelFormatError, match=r"blk\.2\.ffn_up_exps\.weight"):
        regolith.Model.load(missing)
    # a block count far beyond the file is refused before it sizes anything
    w = gguf.GGUFWriter(str(tmp_path / "lying.gguf"), "qwen4exp")
    w.add_uint64("qwen4exp.block_count", 10**13)
    for key in ("embedding_length", "hyper_connection.count", "hyper_connection.low_rank"):
        w.add_uint32(f"qwen4exp.{key}", 4)
    w.add_float32("qwen4exp.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="block_count"):
        regolith.Model.load(tmp_path / "lying.gguf")


def test_last_logits_only(case):
    model, ids, ref = case
    last = model.window(64).eval(ids, all_logits=False)
    assert last.shape == (1, ref.shape[1])
    _check(last, ref[-1:])


@pytest.mark.parametrize("outtype", ["q8_0", "q4_k", "iq4_nl"])
def test_quantized_model_matches_dequantized_reference(tmp_path, outtype):
    """A quantized file computes exactly what its dequantized twin does, with float activations.

    The twin is an f32 file of the same model, which the tests above show equal to transformers; with
    exact activations (dequantize each row, multiply in float) the two must agree bit for bit, so every
    layer decodes its quantized weights correctly. The default int8 activations then differ only by
    activation rounding, which the kernel tests bound (tests/test_matmul.py).
    """
    from regolith import _core
    from regolith.convert import convert
    from tests.model.twin import write_dequantized_twin
    from tests.qwen4exp_models import save_tiny_model

    widths = {"hidden_size": 256, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256}
    hf = save_tiny_model(tmp_path / "hf", 7, **BASE, **widths)
    q = convert(hf, tmp_path / "q.gguf", outtype)
    write_dequantized_twin(q, tmp_path / "twin.gguf")
    ids = prompt(304, 2)
    before = _core.exact_activations()
    _core.set_exact_activations(True)
    try:
        got = regolith.Model.load(q).window(64).eval(ids)
        want = regolith.Model.load(tmp_path / "twin.gguf").window(64).eval(ids)
    finally:
        _core.set_exact_activations(before)
    with regolith.gguf.open(q) as f:
        assert outtype.upper() in {t.type_name for t in f.tensors.values()}
    np.testing.assert_array_equal(got, want)
