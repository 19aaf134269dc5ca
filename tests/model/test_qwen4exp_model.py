"""The whole qwen4_exp text model (regolith.Model / Window) against transformers 5.24 in fp32.

Tiny random configs from tests/qwen4exp_models.py are converted to llama.cpp's GGUF layout by
regolith.convert's mapping; logits for a 40-token prompt (with an EOS inside) must match transformers'
to 1e-4 of their scale, for the whole prompt at once, in uneven chunks and token by token.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import regolith
from regolith import ModelFormatError, RegolithError

torch.set_num_threads(1)

SEQ = 40
CASES = {
    "default": {},
    "no_ple": {"ple_layer_ids": []},
    "hc4_ple_layer3": {"hc_count": 4, "ple_layer_ids": [3]},
    "topk_not_normalised": {"norm_topk_prob": False},
    "gqa4_full_rotary": {"num_attention_heads": 4, "num_key_value_heads": 1, "partial_rotary": 1.0},
    "large_budget": {"indexer_budget": 64},
    "silu_gate_v6": {"output_gate_type": "silu", "linear_num_value_heads": 6},
}


def write_gguf(path, model) -> None:
    from regolith.convert.qwen4exp import gguf_metadata, gguf_tensors

    cfg = model.config.to_dict()
    w = gguf.GGUFWriter(str(path), "qwen4exp")
    for key, val, vt in gguf_metadata(cfg):
        if isinstance(val, list):
            w.add_key_value(key, val, gguf.GGUFValueType.ARRAY, sub_type=vt)
        else:
            w.add_key_value(key, val, vt)
    gate = cfg.get("output_gate_type") or cfg.get("hidden_act")
    if not any(k == "qwen4exp.ssm.gate_activation" for k, _, _ in gguf_metadata(cfg)):
        w.add_string("qwen4exp.ssm.gate_activation", gate)
    named = [(n, t.detach().numpy()) for n, t in model.state_dict().items()]
    for name, arr in gguf_tensors(cfg, named):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def prompt(vocab: int, eos: int, seed: int = 0) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, vocab, SEQ)
    ids[17] = eos
    return ids


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    from tests.qwen4exp_models import tiny_model

    overrides = dict(CASES[request.param])
    overrides.setdefault("output_gate_type", "sigmoid")
    model = tiny_model(7, **overrides)
    path = tmp_path_factory.mktemp(request.param) / "tiny.gguf"
    write_gguf(path, model)
    ids = prompt(model.config.vocab_size, 2)
    with torch.no_grad():
        ref = model(torch.tensor(ids)[None]).logits[0].numpy().astype(np.float64)
    return regolith.Model.load(path), ids, ref


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
    _check(w.eval(ids), ref)
    with pytest.raises(RegolithError, match="context overflow"):
        w.eval(ids[:1])
    assert w.n_past == SEQ
    with pytest.raises(ValueError, match="out of range"):
        model.window(8).eval([model.config["vocab_size"]])


def test_unsupported_architecture_and_missing_tensor(tmp_path):
    from tests.gguf_samples import write_gguf as write_sample

    other = write_sample(tmp_path / "llama.gguf", [], [("w", np.zeros((2, 32), np.float32), None)])
    with pytest.raises(ModelFormatError, match="not supported"):
        regolith.Model.load(other)
