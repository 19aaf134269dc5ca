"""The C++ Gated DeltaNet layer against transformers' ``Qwen4ExpTextGatedDeltaNet`` (5.24, fp32).

The oracle is the transformers module itself (its pure-torch causal conv and chunked delta rule). Its weights
are written to a one-layer GGUF in llama.cpp's qwen4exp layout (``write_gdn_gguf``: value heads reordered from
HF's grouped order to tiled order, ``ssm_a = -exp(A_log)``, conv1d squeezed), and ``_core.GatedDeltaNetLayer``
runs the same input. Errors are max |y - y_ref| / max |y_ref| over the whole output.

``gguf_tensors`` reproduces llama.cpp's converter: on the convert branch's tiny checkpoints (tiny-a/b/nople,
2 or 3 v heads per k head) every GDN tensor it makes was checked byte-identical to the recorded llama.cpp
output (tests/fixtures/llamacpp on that branch).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import regolith
from regolith import _core
from regolith.errors import ModelFormatError, RegolithError

torch.set_num_threads(1)

ARCH = "qwen4exp"
LAYER = 2  # a layer index other than 0, so tensor names are really built from it
TOL_F32 = 1e-4
# Q8_0 weights: the CPU kernels also quantize each matmul's activations to int8 per block of 32 (scale
# amax/127, round half to even, as ggml does). With that emulated in transformers the layer is exact to
# TOL_F32 (measured ~2e-6); against plain dequantized weights the activation rounding alone costs up to
# TOL_Q8_0_PLAIN (measured 0.029-0.042 over 5 seeds of the shape below).
TOL_Q8_0_PLAIN = 0.1


def gdn_module(seed: int, gate: str = "sigmoid", **cfg):
    """A seeded transformers GDN layer; the ones-initialised dt_bias and norm gamma are perturbed."""
    from transformers import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextGatedDeltaNet

    kw = {
        "hidden_size": 64,
        "num_hidden_layers": LAYER + 2,
        "layer_types": ["linear_attention"] * (LAYER + 1) + ["indexed_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "output_gate_type": gate,
    }
    kw.update(cfg)
    torch.manual_seed(seed)
    m = Qwen4ExpTextGatedDeltaNet(Qwen4ExpTextConfig(**kw), layer_idx=LAYER).eval()
    with torch.no_grad():
        m.dt_bias.add_(0.5 * torch.randn_like(m.dt_bias))
        m.norm.weight.add_(0.2 * torch.randn_like(m.norm.weight))
    return m


def reorder_v_heads(a: np.ndarray, axis: int, nk: int, nv: int, d: int, inverse: bool = False) -> np.ndarray:
    """HF grouped value-head order (k head i owns v heads i*r..i*r+r-1) -> llama.cpp's tiled order (GGUF head
    j*nk + i), a fact of llama.cpp's converter (_LinearAttentionVReorderBase); ``inverse`` undoes it."""
    a = np.moveaxis(a, axis, 0)
    r = nv // nk
    grouped = (r, nk, d) if inverse else (nk, r, d)
    out = a.reshape(*grouped, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
    return np.moveaxis(out, 0, axis)


def gguf_tensors(m) -> dict[str, np.ndarray]:
    """The layer's GGUF tensors (numpy row-major, i.e. ggml shape reversed), in llama.cpp's layout."""
    nk, nv, dk, dv = m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim
    sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()}
    kd = nk * dk
    qkv = sd["in_proj_qkv.weight"]
    conv = sd["conv1d.weight"][:, 0, :]  # [conv_dim, kernel]
    p = f"blk.{LAYER}."
    return {
        p + "attn_qkv.weight": np.concatenate([qkv[: 2 * kd], reorder_v_heads(qkv[2 * kd :], 0, nk, nv, dv)]),
        p + "attn_gate.weight": reorder_v_heads(sd["in_proj_z.weight"], 0, nk, nv, dv),
        p + "ssm_conv1d.weight": np.concatenate(
            [conv[: 2 * kd], reorder_v_heads(conv[2 * kd :], 0, nk, nv, dv)]
        ),
        p + "ssm_a": reorder_v_heads(
            -torch.exp(m.A_log).detach().numpy(), 0, nk, nv, 1
        ),  # torch rounding, as the converter
        p + "ssm_dt.bias": reorder_v_heads(sd["dt_bias"], 0, nk, nv, 1),
        p + "ssm_alpha.weight": reorder_v_heads(sd["in_proj_a.weight"], 0, nk, nv, 1),
        p + "ssm_beta.weight": reorder_v_heads(sd["in_proj_b.weight"], 0, nk, nv, 1),
        p + "ssm_norm.weight": sd["norm.weight"],
        p + "ssm_out.weight": reorder_v_heads(sd["out_proj.weight"], 1, nk, nv, dv),
    }


MATMUL_WEIGHTS = ("attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out")


def write_gdn_gguf(
    path, m, qtype=gguf.GGMLQuantizationType.F32, drop=(), metadata=None
) -> dict[str, np.ndarray]:
    """A one-layer qwen4exp GGUF for module m; returns the tensors as the file's values (dequantized)."""
    w = gguf.GGUFWriter(str(path), ARCH)
    keys = {
        "embedding_length": m.hidden_size,
        "ssm.conv_kernel": m.conv_kernel_size,
        "ssm.state_size": m.head_k_dim,
        "ssm.group_count": m.num_k_heads,
        "ssm.time_step_rank": m.num_v_heads,
        "ssm.inner_size": m.value_dim,
    }
    keys.update(metadata or {})
    for k, v in keys.items():
        if v is not None:
            w.add_uint32(f"{ARCH}.{k}", v)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", m.layer_norm_epsilon)
    values = {}
    for name, t in gguf_tensors(m).items():
        t = np.ascontiguousarray(t, dtype=np.float32)
        if name.split(".", 2)[2] in drop:
            continue
        if qtype != gguf.GGMLQuantizationType.F32 and name.split(".")[2] in MATMUL_WEIGHTS:
            q = gguf.quants.quantize(t, qtype)
            w.add_tensor(name, q, raw_dtype=qtype)
            values[name] = gguf.quants.dequantize(q, qtype).reshape(t.shape)
        else:
            w.add_tensor(name, t)
            values[name] = t
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


def load_gguf_values(m, values: dict[str, np.ndarray]) -> None:
    """Put the file's (dequantized) matmul weights back into m, undoing the value-head reorder."""
    nk, nv, dv, kd = m.num_k_heads, m.num_v_heads, m.head_v_dim, m.key_dim
    p = f"blk.{LAYER}."
    qkv = values[p + "attn_qkv.weight"]
    hf = {
        "in_proj_qkv": np.concatenate([qkv[: 2 * kd], reorder_v_heads(qkv[2 * kd :], 0, nk, nv, dv, True)]),
        "in_proj_z": reorder_v_heads(values[p + "attn_gate.weight"], 0, nk, nv, dv, True),
        "in_proj_a": reorder_v_heads(values[p + "ssm_alpha.weight"], 0, nk, nv, 1, True),
        "in_proj_b": reorder_v_heads(values[p + "ssm_beta.weight"], 0, nk, nv, 1, True),
        "out_proj": reorder_v_heads(values[p + "ssm_out.weight"], 1, nk, nv, dv, True),
    }
    with torch.no_grad():
        for name, v in hf.items():
            getattr(m, name).weight.copy_(torch.from_numpy(np.ascontiguousarray(v)))


def reference(m, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return m(torch.from_numpy(x)[None])[0].numpy()


def run_in_pieces(layer, x: np.ndarray, sizes) -> tuple[np.ndarray, object]:
    state = layer.new_state()
    out, t = [], 0
    for n in sizes:
        out.append(layer.forward(np.ascontiguousarray(x[t : t + n]), state))
        t += n
    assert t == len(x)
    return np.concatenate(out), state


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def uneven(n: int) -> list[int]:
    sizes, pattern, i = [], [7, 1, 13, 64, 2, 65, 30], 0
    while sum(sizes) < n:
        sizes.append(min(pattern[i % len(pattern)], n - sum(sizes)))
        i += 1
    return sizes


CASES = {
    # name: (seed, ntok, gate, config overrides)
    "k2v4-kernel4": (0, 150, "sigmoid", {}),
    "k1v3-dk8-dv24-kernel3": (
        1,
        70,
        "sigmoid",
        {
            "linear_num_key_heads": 1,
            "linear_num_value_heads": 3,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 24,
            "linear_conv_kernel_dim": 3,
        },
    ),
    "k3v3-dk32-dv16-kernel2": (
        2,
        129,
        "sigmoid",
        {
            "linear_num_key_heads": 3,
            "linear_num_value_heads": 3,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 2,
        },
    ),
    "k2v8-silu-gate": (3, 40, "silu", {"linear_num_value_heads": 8, "hidden_size": 48}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gdn_matches_transformers(tmp_path, case):
    seed, ntok, gate, cfg = CASES[case]
    m = gdn_module(seed, gate, **cfg)
    path = tmp_path / "gdn.gguf"
    write_gdn_gguf(path, m)
    layer = _core.GatedDeltaNetLayer(str(path), LAYER, gate=gate)
    assert layer.shape["v_dim"] == m.head_v_dim and layer.shape["n_v_heads"] == m.num_v_heads
    x = np.random.default_rng(seed).standard_normal((ntok, m.hidden_size), dtype=np.float32)
    ref = reference(m, x)

    whole, s_whole = run_in_pieces(layer, x, [ntok])
    pieces, s_pieces = run_in_pieces(layer, x, uneven(ntok))
    steps, s_steps = run_in_pieces(layer, x, [1] * ntok)
    for got in (whole, pieces, steps):
        assert rel_err(got, ref) <= TOL_F32
    # the three schedules leave the same state (chunked scan vs recurrence agree)
    scale = np.abs(s_steps.recurrent).max()
    for s in (s_whole, s_pieces):
        assert np.abs(s.recurrent - s_steps.recurrent).max() <= TOL_F32 * scale
        np.testing.assert_array_equal(s.conv, s_steps.conv)
    # the conv state holds the last kernel-1 qkv projections (GGUF channel order)
    k = m.conv_kernel_size
    qkv = x[-(k - 1) :] @ np.asarray(write_gdn_gguf(tmp_path / "v.gguf", m)[f"blk.{LAYER}.attn_qkv.weight"]).T
    np.testing.assert_allclose(s_whole.conv, qkv, rtol=1e-5, atol=1e-5)


def test_gdn_state_copy_and_reset(tmp_path):
    m = gdn_module(4)
    path = tmp_path / "gdn.gguf"
    write_gdn_gguf(path, m)
    layer = _core.GatedDeltaNetLayer(str(path), LAYER)
    x = np.random.default_rng(4).standard_normal((20, m.hidden_size), dtype=np.float32)
    state = layer.new_state()
    assert state.conv.shape == (m.conv_kernel_size - 1, m.conv_dim)
    assert state.recurrent.shape == (m.num_v_heads, m.head_k_dim, m.head_v_dim)
    layer.forward(x[:12], state)
    saved = state.copy()
    a = layer.forward(x[12:], state)
    state.copy_from(saved)  # roll back
    b = layer.forward(x[12:], state)
    np.testing.assert_array_equal(a, b)
    state.reset()
    assert not state.conv.any() and not state.recurrent.any()
    np.testing.assert_array_equal(layer.forward(x, state), layer.forward(x, layer.new_state()))


def scan_inputs(seed: int, ntok: int, nk: int, nv: int, dk: int, dv: int, max_decay: float):
    """Inputs of the bare scan as gdn_prepare leaves them: unit q and k per head (the kernel's q also scaled by
    dk^-1/2), log decays in [-max_decay, 0], beta in (0, 1), a random initial state."""
    rng = np.random.default_rng(seed)

    def unit(a):
        return (a / np.sqrt((a * a).sum(-1, keepdims=True))).astype(np.float32)

    q, k = unit(rng.standard_normal((ntok, nk, dk))), unit(rng.standard_normal((ntok, nk, dk)))
    v = rng.standard_normal((ntok, nv, dv)).astype(np.float32)
    g = (-rng.uniform(0, max_decay, (ntok, nv))).astype(np.float32)
    beta = rng.uniform(0, 1, (ntok, nv)).astype(np.float32)
    state = (0.1 * rng.standard_normal((nv, dk, dv))).astype(np.float32)
    qkv = np.concatenate(
        [(q * np.float32(dk**-0.5)).reshape(ntok, -1), k.reshape(ntok, -1), v.reshape(ntok, -1)], 1
    )
    return (q, k, v, g, beta, state), qkv


def transformers_scan(q, k, v, g, beta, state):
    """transformers' token-by-token delta rule; v head h reads k head h % n_k (GGUF's tiled order)."""
    from transformers.models.qwen4_exp.modeling_qwen4_exp import torch_recurrent_gated_delta_rule

    heads = [h % q.shape[1] for h in range(v.shape[1])]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))[None]

    with torch.no_grad():
        out, final = torch_recurrent_gated_delta_rule(
            t(q[:, heads]),
            t(k[:, heads]),
            t(v),
            t(g),
            t(beta),
            initial_state=t(state),
            output_final_state=True,
        )
    return out[0].reshape(len(q), -1).numpy(), final[0].numpy()


SCAN_SHAPES = {
    # name: (n_k, n_v, k_dim, v_dim): Flash-Next's heads; column counts that leave vector and scalar tails
    "k2v4-128x128": (2, 4, 128, 128),
    "k1v3-32x80": (1, 3, 32, 80),
    "k2v2-24x20": (2, 2, 24, 20),
}


@pytest.mark.parametrize("shape", list(SCAN_SHAPES))
@pytest.mark.parametrize("max_decay", [0.5, 80.0], ids=["mild-decay", "strong-decay"])
def test_gdn_scan_matches_transformers_recurrence(shape, max_decay):
    """The bare CPU scan, chunked (64, with a partial last chunk), token by token with per-token states, and
    one token, against transformers' recurrence. Strong decays drive products and states into the subnormal
    range, which the scan flushes to zero (cpu/gdn.cpp): far below the tolerance."""
    nk, nv, dk, dv = SCAN_SHAPES[shape]
    ntok = 150
    inputs, qkv = scan_inputs(7, ntok, nk, nv, dk, dv, max_decay)
    ref_out, ref_state = transformers_scan(*inputs)
    _, _, _, g, beta, state = inputs
    out, final, after = _core.gdn_scan(qkv, g, beta, state, nk, 64)
    assert after is None
    assert rel_err(out, ref_out) <= TOL_F32 and rel_err(final, ref_state) <= TOL_F32
    steps, final_steps, after = _core.gdn_scan(qkv, g, beta, state, nk, 64, after=True)
    assert rel_err(steps, ref_out) <= TOL_F32 and rel_err(final_steps, ref_state) <= TOL_F32
    assert after.shape == (ntok, nv * dk * dv)
    np.testing.assert_array_equal(after[-1], final_steps.ravel())
    one, state1, _ = _core.gdn_scan(qkv[:1], g[:1], beta[:1], state, nk, 64)
    np.testing.assert_array_equal(one, steps[:1])
    np.testing.assert_array_equal(state1.ravel(), after[0])


@pytest.mark.parametrize("shape", list(SCAN_SHAPES))
def test_gdn_scan_every_isa_gives_the_portable_bits(shape):
    """The scan is compiled per instruction set (cpu/gdn_scan_impl.h); each must reproduce the portable
    build's float32 bits: chunked, token by token, and through the subnormal flush."""
    nk, nv, dk, dv = SCAN_SHAPES[shape]
    (_, _, _, g, beta, state), qkv = scan_inputs(8, 70, nk, nv, dk, dv, 80.0)
    before = _core.isa()
    runs = {}
    try:
        for isa in _core.available_isas():
            _core.set_isa(isa)
            chunked = _core.gdn_scan(qkv, g, beta, state, nk, 64)[:2]
            steps = _core.gdn_scan(qkv, g, beta, state, nk, 64, after=True)
            runs[isa] = [a.view(np.uint32) for a in (*chunked, *steps)]
    finally:
        _core.set_isa(before)
    if len(runs) < 2:
        pytest.skip(f"this CPU offers one kernel set ({', '.join(runs)}): nothing to compare")
    portable = "scalar" if "scalar" in runs else next(iter(runs))
    for isa, got in runs.items():
        for a, b in zip(got, runs[portable], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{isa} differs from {portable}")


def test_gdn_scan_bad_shapes_raise():
    (_, _, _, g, beta, state), qkv = scan_inputs(9, 4, 1, 2, 8, 8, 1.0)
    with pytest.raises(ValueError, match="shapes disagree"):
        _core.gdn_scan(qkv[:, 1:], g, beta, state, 1, 64)
    with pytest.raises(ValueError, match="shapes disagree"):
        _core.gdn_scan(qkv, g, beta, state, 3, 64)


def quantize_activations_q8(module, args):
    """Forward pre-hook: the CPU kernels' int8 activation rounding for Q8_0 weights (per 32, amax/127)."""
    x = args[0]
    b = x.reshape(*x.shape[:-1], -1, 32)
    scale = b.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return ((torch.round(b * inv) * scale).reshape(x.shape),)


def test_gdn_q8_0_matches_dequantized_transformers(tmp_path):
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    assert _core.activation_block(int(q8_0)) == 32
    m = gdn_module(5, hidden_size=96, linear_key_head_dim=32, linear_value_head_dim=32)
    path = tmp_path / "gdn_q8.gguf"
    load_gguf_values(m, write_gdn_gguf(path, m, q8_0))
    layer = _core.GatedDeltaNetLayer(str(path), LAYER)
    x = np.random.default_rng(5).standard_normal((100, m.hidden_size), dtype=np.float32)
    plain = reference(m, x)
    hooks = [
        getattr(m, n).register_forward_pre_hook(quantize_activations_q8)
        for n in ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj")
    ]
    ref = reference(m, x)
    for h in hooks:
        h.remove()
    # the CPU rounds activations to q8 as the reference's hooks do; a GPU backend rounds them to f16 instead,
    # so there only the distance to the unrounded reference is checked
    cpu = regolith.backends.resolve(None) in ("cpu", "cpu-opaque")
    for sizes in ([100], uneven(100), [1] * 100):
        y = run_in_pieces(layer, x, sizes)[0]
        if cpu:
            assert rel_err(y, ref) <= TOL_F32
        assert rel_err(y, plain) <= TOL_Q8_0_PLAIN


@pytest.mark.parametrize(
    "drop, metadata, match",
    [
        (("ssm_beta.weight",), None, r"missing tensor 'blk\.2\.ssm_beta\.weight'"),
        (("ssm_a",), None, r"missing tensor 'blk\.2\.ssm_a'"),
        ((), {"ssm.inner_size": None}, r"qwen4exp\.ssm\.inner_size"),
        (
            (),
            {"ssm.state_size": 8},
            r"layer 2: tensor 'blk\.2\.attn_qkv\.weight' has ggml shape \[64, 128\], expected \[64, 96\]",
        ),
        ((), {"ssm.time_step_rank": 3}, r"multiple of ssm\.group_count"),
    ],
)
def test_gdn_bad_gguf_raises_model_format_error(tmp_path, drop, metadata, match):
    path = tmp_path / "bad.gguf"
    write_gdn_gguf(path, gdn_module(6), drop=drop, metadata=metadata)
    with pytest.raises(ModelFormatError, match=match):
        _core.GatedDeltaNetLayer(str(path), LAYER)
    assert issubclass(ModelFormatError, RegolithError)


def test_gdn_wrong_layer_raises_model_format_error(tmp_path):
    path = tmp_path / "gdn.gguf"
    write_gdn_gguf(path, gdn_module(7))
    with pytest.raises(ModelFormatError, match=r"missing tensor 'blk\.1\.attn_qkv\.weight'"):
        _core.GatedDeltaNetLayer(str(path), 1)


def write_model_gguf(path, model) -> None:
    """A whole tiny qwen4_exp model as an f32 GGUF through regolith.convert's llama.cpp-layout mapping."""
    from regolith.convert.qwen4exp import gguf_metadata, gguf_tensors

    cfg = model.config.to_dict()
    w = gguf.GGUFWriter(str(path), ARCH)
    for key, val, vt in gguf_metadata(cfg):
        if isinstance(val, list):
            w.add_key_value(key, val, gguf.GGUFValueType.ARRAY, sub_type=vt)
        else:
            w.add_key_value(key, val, vt)
    named = [(n, t.detach().numpy()) for n, t in model.state_dict().items()]
    for name, arr in gguf_tensors(cfg, named):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    "seed, gate, overrides",
    [(0, "sigmoid", {}), (1, "silu", {"linear_num_value_heads": 6})],
    ids=["tiny-a-sigmoid", "tiny-v6k2-silu"],
)
def test_gdn_in_tiny_model_matches_transformers(tmp_path, seed, gate, overrides):
    """Each GDN layer of a whole tiny Qwen4ExpForCausalLM, on the hidden states transformers feeds it."""
    from tests.qwen4exp_models import tiny_model

    model = tiny_model(seed, output_gate_type=gate, **overrides)
    path = tmp_path / "tiny.gguf"
    write_model_gguf(path, model)
    captured: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def capture(i):
        def hook(module, args, kwargs, out):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            captured[i] = (x[0].numpy().copy(), out[0].numpy().copy())

        return hook

    for i, block in enumerate(model.model.layers):
        if hasattr(block, "linear_attn"):
            block.linear_attn.register_forward_hook(capture(i), with_kwargs=True)
    ntok = 150
    ids = torch.randint(0, model.config.vocab_size, (1, ntok), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model(ids)
    assert sorted(captured) == [0, 2]
    for i, (x, ref) in captured.items():
        layer = _core.GatedDeltaNetLayer(str(path), i, gate=gate)
        for sizes in ([ntok], uneven(ntok), [1] * ntok):
            assert rel_err(run_in_pieces(layer, x, sizes)[0], ref) <= TOL_F32
