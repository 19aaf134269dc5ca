"""The qwen4exp PLE layer (csrc/model/ple.cpp) against transformers' Qwen4ExpTextPLELayer in fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from regolith import _core
from regolith.errors import ModelFormatError

torch = pytest.importorskip("torch")
modeling = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
configuration = pytest.importorskip("transformers.models.qwen4_exp.configuration_qwen4_exp")
gguf = pytest.importorskip("gguf")

torch.set_num_threads(1)

EOS = 7
VOCAB = 320


def tiny_config(ple_layer: int, **overrides):
    """A config whose decoder layer `ple_layer` (0-based) carries the PLE."""
    args = {
        "vocab_size": VOCAB,
        "hidden_size": 96,
        "num_hidden_layers": 4,
        "hc_count": 3,
        "ple_layer_ids": [ple_layer + 1],
        "ngram_size": 3,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": 1000,
        "make_ngram_vocab_size_divisible_by": 128,
        "eos_token_id": EOS,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    }
    args.update(overrides)
    return configuration.Qwen4ExpTextConfig(**args)


def make_ple(ple_layer: int, ple_layer_index: int = 0, seed: int = 0, **overrides):
    """A transformers PLE layer with every weight random (norm gammas and conv start at zero otherwise)."""
    config = tiny_config(ple_layer, **overrides)
    torch.manual_seed(seed)
    ple = modeling.Qwen4ExpTextPLELayer(config, ple_layer, ple_layer_index).eval()
    with torch.no_grad():
        for p in ple.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return config, ple


def write_ple_gguf(path: Path, config, ple, layer: int, table_type=None, skip: str = "") -> None:
    """The PLE tensors and metadata under llama.cpp's qwen4exp names and layout (conversion/qwen4exp.py)."""
    emb = ple.ple_embedding
    w = gguf.GGUFWriter(str(path), "qwen4exp")
    arch = "qwen4exp"
    w.add_uint32(f"{arch}.embedding_length", config.hidden_size)
    w.add_uint32(f"{arch}.hyper_connection.count", config.hc_count)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    w.add_array(f"{arch}.ple.layers", [layer])
    w.add_uint32(f"{arch}.ple.ngram_size", config.ngram_size)
    w.add_uint32(f"{arch}.ple.heads_per_ngram", config.heads_per_ngram)
    w.add_uint32(f"{arch}.ple.conv_kernel", config.ple_conv_kernel_size)
    w.add_uint32(f"{arch}.ple.eos_token_id", EOS)
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", emb.ngram_embedding.weight.shape[1])
    u64 = gguf.GGUFValueType.UINT64
    for key, buf in [
        ("layer_multipliers", emb.layer_multipliers),
        ("head_offsets", emb.ngram_heads_offsets),
        ("head_vocab_sizes", emb.ngram_heads_vocab_sizes),
    ]:
        w.add_key_value(f"{arch}.ple.{key}", [int(x) for x in buf], gguf.GGUFValueType.ARRAY, u64)

    def f32(t):
        return t.detach().float().numpy()

    table = f32(emb.ngram_embedding.weight)
    if table_type == "F16":
        table = table.astype(np.float16)
    elif table_type is not None:
        table = gguf.quants.quantize(table, gguf.GGMLQuantizationType[table_type])
    tensors = {
        "per_layer_token_embd.weight": table,
        f"blk.{layer}.ple_key.weight": f32(ple.key_proj.weight),
        f"blk.{layer}.ple_value.weight": f32(ple.value_proj.weight),
        f"blk.{layer}.ple_conv1d.weight": f32(ple.conv1d.weight).squeeze(1),
        f"blk.{layer}.ple_norm_key.weight": f32(ple.norm_key.weight) + 1,
        f"blk.{layer}.ple_norm_query.weight": f32(ple.norm_query.weight) + 1,
        f"blk.{layer}.ple_norm_conv.weight": f32(ple.norm_conv.weight) + 1,
    }
    for name, arr in tensors.items():
        if name != skip:
            raw = gguf.GGMLQuantizationType[table_type] if arr.dtype == np.uint8 else None
            w.add_tensor(name, np.ascontiguousarray(arr), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def token_sequence(rng: np.random.Generator, n: int, high: int = VOCAB) -> np.ndarray:
    """Random ids with EOS at the start, in the middle, twice in a row and near the end."""
    ids = rng.integers(0, high, size=n).astype(np.int32)
    ids[ids == EOS] = EOS + 1
    for pos in (0, n // 3, n // 3 + 1, n - 3):
        ids[pos] = EOS
    return ids


def oracle_rows(ple, ids: np.ndarray) -> np.ndarray:
    """The table rows transformers gathers: the input of its nn.Embedding."""
    seen = []
    hook = ple.ple_embedding.ngram_embedding.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        ple.ple_embedding(torch.from_numpy(ids.astype(np.int64))[None], None)
    hook.remove()
    return seen[0][0].numpy()


def core_rows(ple, ids: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
    emb = ple.ple_embedding
    if context is None:
        context = np.full(emb.ngram_size - 1, EOS, dtype=np.int64)
    return _core.ple_ngram_rows(
        ids,
        context,
        EOS,
        [int(x) for x in emb.layer_multipliers],
        [int(x) for x in emb.ngram_heads_offsets],
        [int(x) for x in emb.ngram_heads_vocab_sizes],
        emb.heads_per_ngram,
    )


@pytest.mark.parametrize("ngram_size", [2, 3, 5])
@pytest.mark.parametrize("ple_layer_index", [0, 1, 3])
def test_ple_hash_matches_transformers(ngram_size: int, ple_layer_index: int) -> None:
    _, ple = make_ple(0, ple_layer_index, ngram_size=ngram_size, ple_embed_dim=96 if ngram_size != 5 else 128)
    rng = np.random.default_rng(ngram_size * 10 + ple_layer_index)
    # ids up to 2^31-1 overflow the int64 products (wrap-around) and make the xor negative (floor modulo)
    for high in (VOCAB, 2**31 - 1):
        ids = token_sequence(rng, 64, high)
        want = oracle_rows(ple, ids)
        np.testing.assert_array_equal(core_rows(ple, ids), want)
        # continuing from a context: the last ngram_size-1 ids before the split
        for split in (1, 2, 5, 21, 22, 40):
            context = np.concatenate([np.full(ngram_size, EOS), ids[:split]])[-(ngram_size - 1) :]
            got = core_rows(ple, ids[split:], context.astype(np.int64))
            np.testing.assert_array_equal(got, want[split:])


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def run_chunks(layer, ids: np.ndarray, hidden: np.ndarray, sizes: list[int]) -> np.ndarray:
    state = layer.new_state()
    outs, at = [], 0
    for n in sizes:
        outs.append(layer.forward(ids[at : at + n], hidden[at : at + n], state))
        at += n
    assert at == len(ids)
    return np.concatenate(outs)


@pytest.mark.parametrize(("layer", "table_type"), [(0, None), (2, None), (1, "F16"), (1, "Q8_0")])
def test_ple_matches_transformers(tmp_path: Path, layer: int, table_type: str | None) -> None:
    # Q8_0 blocks are 32 wide: 4 heads of 32
    config, ple = make_ple(layer, seed=layer, ple_embed_dim=128 if table_type == "Q8_0" else 96)
    if table_type is not None:  # the oracle sees the table as stored
        with torch.no_grad():
            w = ple.ple_embedding.ngram_embedding.weight
            qtype = gguf.GGMLQuantizationType[table_type]
            stored = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), qtype), qtype)
            w.copy_(torch.from_numpy(stored))
    path = tmp_path / "ple.gguf"
    write_ple_gguf(path, config, ple, layer, table_type)

    rng = np.random.default_rng(layer)
    n = 41
    ids = token_sequence(rng, n)
    hidden = rng.standard_normal((n, config.hc_count * config.hidden_size)).astype(np.float32)
    with torch.no_grad():
        ids_t = torch.from_numpy(ids.astype(np.int64))[None]
        want = ple(torch.from_numpy(hidden)[None], ids_t, None)[0].numpy()

    core = _core.PleLayer(str(path), layer)
    heads = (config.ngram_size - 1) * config.heads_per_ngram
    assert core.rows_per_token == heads
    for sizes in ([n], [3, 1, 7, 2, 11, 17], [1] * n):
        got = run_chunks(core, ids, hidden, sizes)
        assert got.shape == want.shape
        assert rel_err(got, want) <= 1e-4, sizes
    # rows are read on demand only: one per head and token, never the table
    assert core.rows_read == 3 * n * heads
    assert core.rows_read < core.table_rows


def test_ple_missing_tensor_is_model_format_error(tmp_path: Path) -> None:
    config, ple = make_ple(0)
    path = tmp_path / "ple.gguf"
    write_ple_gguf(path, config, ple, 0, skip="blk.0.ple_value.weight")
    with pytest.raises(ModelFormatError, match="blk.0.ple_value.weight"):
        _core.PleLayer(str(path), 0)
    write_ple_gguf(path, config, ple, 0)
    with pytest.raises(ModelFormatError, match="layer 1 has no PLE"):
        _core.PleLayer(str(path), 1)
    # the embeddings point past the table: the head ranges must fit its rows
    with torch.no_grad():
        ple.ple_embedding.ngram_heads_offsets[-1] += 4096
    write_ple_gguf(path, config, ple, 0)
    with pytest.raises(ModelFormatError, match="head 3 rows"):
        _core.PleLayer(str(path), 0)


def convert_to_gguf(model_dir: Path, out: Path) -> None:
    """HF checkpoint -> llama.cpp-layout f32 GGUF through regolith.convert's qwen4exp mapping."""
    import json

    from safetensors import safe_open

    from regolith.convert import qwen4exp as cq
    from regolith.convert.qwen_hybrid import collect_sources

    config = json.loads((model_dir / "config.json").read_text())
    with safe_open(str(model_dir / "model.safetensors"), "np") as f:
        named = [(k, f.get_tensor(k)) for k in f.keys()]  # noqa: SIM118 (safe_open is not iterable)
    consts = cq.ple_constants_from(collect_sources(named))
    w = gguf.GGUFWriter(str(out), cq.ARCH)
    for key, value, vtype in cq.gguf_metadata(config, ple_constants=consts):
        if isinstance(value, list):
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, vtype)
        else:
            w.add_key_value(key, value, vtype)
    for name, arr in cq.gguf_tensors(config, named):
        w.add_tensor(name, np.ascontiguousarray(np.asarray(arr), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("layer", [0, 2])
def test_ple_in_model_matches_transformers_cache(tmp_path: Path, layer: int) -> None:
    """A tiny Qwen4ExpForCausalLM decoding with its cache (prompt, single tokens, a chunk), converted by
    regolith.convert: the PLE's inputs and outputs captured by a hook against our layer on the same inputs."""
    from tests.qwen4exp_models import tiny_model

    model = tiny_model(layer, ple_layer_ids=[layer + 1])
    model.save_pretrained(tmp_path / "hf")
    convert_to_gguf(tmp_path / "hf", tmp_path / "model.gguf")

    calls = []
    ple = model.model.layers[layer].ple
    ple.register_forward_hook(lambda m, args, out: calls.append((args[0][0], args[1][0], out[0])))
    eos = model.config.eos_token_id
    ids = np.random.default_rng(layer).integers(0, model.config.vocab_size, 24).astype(np.int32)
    ids[[0, 9, 10, 20]] = eos
    cache = modeling.DynamicCache(config=model.config)
    with torch.no_grad():
        for a, b in [(0, 13), *((i, i + 1) for i in range(13, 19)), (19, 24)]:
            model(input_ids=torch.from_numpy(ids[a:b].astype(np.int64))[None], cache=cache, use_cache=True)

    core = _core.PleLayer(str(tmp_path / "model.gguf"), layer)
    state = core.new_state()
    np.testing.assert_array_equal(np.concatenate([c[1].numpy() for c in calls]), ids)  # raw ids, no masking
    for hidden, ple_ids, want in calls:
        got = core.forward(ple_ids.numpy().astype(np.int32), hidden.numpy(), state)
        assert rel_err(got, want.numpy()) <= 1e-4
    assert core.rows_read == len(ids) * core.rows_per_token
