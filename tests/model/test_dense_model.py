"""The dense decoder models (gemma3, qwen2) against transformers 5.24 in fp32.

Tiny random checkpoints from tests/dense_models.py are written as f32 GGUFs in llama.cpp's layout; with an
f32 KV cache, logits for a 40-token prompt must match transformers' to 1e-4 of their scale, for the whole
prompt at once, in uneven chunks and token by token. The gemma3 model slides over 8 tokens on six of its
seven layers, so the prompt runs far past the window.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import regolith
from regolith import ModelFormatError, RegolithError, backends
from tests.dense_models import tiny_model, write_gguf

torch.set_num_threads(1)

SEQ = 40
CASES = {
    "qwen2": ("qwen2", {}),
    "qwen2_tied_mha": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "gemma3": ("gemma3", {}),
    "gemma3_softcap_gqa4": ("gemma3", {"final_logit_softcapping": 5.0, "num_key_value_heads": 1}),
}


def _prompt(vocab: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab, SEQ)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    model = tiny_model(arch, 7, **overrides)
    path = write_gguf(model, tmp_path_factory.mktemp(request.param) / "tiny.gguf")
    ids = _prompt(model.config.vocab_size)
    with torch.no_grad():
        ref = model(torch.tensor(ids)[None]).logits[0].numpy().astype(np.float64)
    return regolith.Model.load(path), ids, ref


def _window(model: regolith.Model, max_ctx: int = 64):
    """A window with an f32 KV cache (the default f16 cache rounds keys and values as llama.cpp's does)."""
    return model._core.new_window(max_ctx, "f32")


def _eval(w, ids, all_logits: bool = True) -> np.ndarray:
    return w.eval(np.ascontiguousarray(ids, dtype=np.int32), all_logits)


def _check(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and got.dtype == np.float32
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= 1e-4, f"relative error {err:.3g}"


def test_logits_match_transformers_whole_prompt(case):
    model, ids, ref = case
    _check(_eval(_window(model), ids), ref)


def test_logits_match_transformers_uneven_chunks(case):
    model, ids, ref = case
    w = _window(model)
    parts, start = [], 0
    for n in (7, 1, 13, 2, 17):
        parts.append(_eval(w, ids[start : start + n]))
        start += n
    assert w.n_past == SEQ
    _check(np.concatenate(parts), ref)


def test_logits_match_transformers_token_by_token(case):
    model, ids, ref = case
    w = _window(model)
    _check(np.concatenate([_eval(w, ids[i : i + 1]) for i in range(SEQ)]), ref)


@pytest.mark.parametrize("kv_type", ["f16", "f32", "i8"])
def test_chunks_and_single_tokens_are_bit_identical(case, kv_type):
    if kv_type not in ("f16", "f32") and kv_type not in backends.cache_types():
        pytest.skip(f"the {backends.resolve(None)} backend has no kernels for {kv_type} attention caches")
    model, ids, _ = case
    whole = _eval(model._core.new_window(64, kv_type), ids)
    w = model._core.new_window(64, kv_type)
    np.testing.assert_array_equal(np.concatenate([_eval(w, ids[i : i + 1]) for i in range(SEQ)]), whole)
    w = model._core.new_window(64, kv_type)
    np.testing.assert_array_equal(np.concatenate([_eval(w, ids[:11]), _eval(w, ids[11:])]), whole)


def test_last_logits_only_match_transformers(case):
    model, ids, ref = case
    _check(_eval(_window(model), ids, all_logits=False), ref[-1:])


def test_truncate_then_eval_equals_a_fresh_window(case):
    model, ids, _ = case
    fresh = model._core.new_window(64)  # the default f16 cache
    _eval(fresh, ids[:20])
    want = _eval(fresh, ids[20:30])
    w = model._core.new_window(64)
    _eval(w, ids[:20])
    _eval(w, ids[30:40])
    assert w.truncate(20) is True and w.n_past == 20
    np.testing.assert_array_equal(_eval(w, ids[20:30]), want)
    with pytest.raises(RegolithError, match="truncate"):
        w.truncate(31)


def test_reset_overflow_and_bad_ids(case):
    model, ids, ref = case
    w = _window(model, SEQ)
    _eval(w, ids[:5])
    w.reset()
    assert w.n_past == 0
    _check(_eval(w, ids[:30]), ref[:30])
    with pytest.raises(RegolithError, match="context overflow"):
        _eval(w, np.full(SEQ - 30 + 1, 3))
    assert w.n_past == 30
    _check(_eval(w, ids[30:]), ref[30:])
    vocab = model.config["vocab_size"]
    with pytest.raises(RegolithError, match="out of range"):
        _eval(_window(model), [vocab])
    with pytest.raises(ValueError, match="out of range"):
        model.window(8).eval([-1])
    with pytest.raises(ValueError, match="kv_type"):
        model._core.new_window(8, "q4_0")
    with pytest.raises(RegolithError, match="q8_0 cache needs a head dim that is a multiple of 32, not 16"):
        model._core.new_window(8, "q8_0")


def test_config(case):
    model, _, _ = case
    c = model.config
    assert c["architecture"] in ("gemma3", "qwen2") and c["n_layer"] in (3, 7)
    assert (c["hidden_size"], c["vocab_size"], c["head_dim"], c["intermediate_size"]) == (64, 320, 16, 96)
    if c["architecture"] == "gemma3":
        assert c["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
        assert c["sliding_window"] == 8 and c["hidden_activation"] == "gelu_pytorch_tanh"
    else:
        assert c["layer_types"] == ["full_attention"] * 3 and c["hidden_activation"] == "silu"


@pytest.mark.parametrize(
    ("arch", "drop"),
    [
        ("qwen2", "blk.1.attn_v.weight"),
        ("gemma3", "blk.4.post_ffw_norm.weight"),
        ("gemma3", "output_norm.weight"),
    ],
)
def test_missing_tensor_is_named(tmp_path, arch, drop):
    path = write_gguf(tiny_model(arch, 7), tmp_path / "broken.gguf", drop=drop)
    with pytest.raises(ModelFormatError, match=rf"{arch}: missing tensor '{drop}'"):
        regolith.Model.load(path)


def _rewrite(tmp_path, src, edit_kv=None, edit_tensor=None):
    """A copy of ``src`` with metadata values from ``edit_kv`` and tensors passed through ``edit_tensor``."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    out = tmp_path / "edited.gguf"
    w = gguf.GGUFWriter(str(out), arch)
    kv = {
        k: (f.contents(), f.types[0], f.types[-1])
        for k, f in reader.fields.items()
        if not k.startswith("GGUF.")
    }
    kv.update(edit_kv or {})
    for key, (value, vtype, sub_type) in kv.items():
        if key not in ("general.architecture", "general.alignment"):
            w.add_key_value(key, value, vtype, sub_type=sub_type)
    with regolith.gguf.open(src) as f:
        for name in f.tensors:
            data = np.ascontiguousarray(f.tensor(name))
            w.add_tensor(name, edit_tensor(name, data) if edit_tensor else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_misshaped_tensor_and_bad_metadata(tmp_path):
    good = write_gguf(tiny_model("qwen2", 7), tmp_path / "good.gguf")
    short = _rewrite(tmp_path, good, edit_tensor=lambda n, d: d[:-1] if n == "blk.2.ffn_down.weight" else d)
    with pytest.raises(ModelFormatError, match=r"'blk\.2\.ffn_down\.weight' has ggml shape \[96, 63\]"):
        regolith.Model.load(short)
    vt = gguf.GGUFValueType
    longrope = _rewrite(tmp_path, good, {"qwen2.rope.scaling.type": ("longrope", vt.STRING, None)})
    with pytest.raises(ModelFormatError, match="rope.scaling.type 'longrope'"):
        regolith.Model.load(longrope)
    heads = _rewrite(tmp_path, good, {"qwen2.attention.head_count_kv": (3, vt.UINT32, None)})
    with pytest.raises(ModelFormatError, match="head_count_kv"):
        regolith.Model.load(heads)


def test_sliding_window_pattern_array(tmp_path):
    """llama.cpp's per-layer form of attention.sliding_window_pattern overrides the every-6th rule."""
    pattern = [True, False, True, False, True, True, False]
    model = tiny_model(
        "gemma3", 7, layer_types=["sliding_attention" if p else "full_attention" for p in pattern]
    )
    src = write_gguf(model, tmp_path / "src.gguf")
    vt = gguf.GGUFValueType
    path = _rewrite(tmp_path, src, {"gemma3.attention.sliding_window_pattern": (pattern, vt.ARRAY, vt.BOOL)})
    ids = _prompt(320)
    with torch.no_grad():
        ref = model(torch.tensor(ids)[None]).logits[0].numpy().astype(np.float64)
    loaded = regolith.Model.load(path)
    assert loaded.config["layer_types"] == model.config.layer_types
    _check(_eval(_window(loaded), ids), ref)
