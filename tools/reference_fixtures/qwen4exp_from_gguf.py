"""A qwen4exp GGUF's weights as a transformers ``Qwen4ExpForCausalLM`` state dict: the inverse of
``regolith convert`` (src/regolith/convert/qwen4exp.py), for float64 references on a GGUF's own weights.

The inverse is not a second copy of the converter's mapping: it is read off the converter itself. Every
float tensor of a freshly built model is filled with probe values and sent through ``gguf_tensors``; each
GGUF element then says which checkpoint tensor and element it came from, and how its value was transformed
(the converter's transforms are permutations, reshapes, stacking and splitting, plus ``w + 1`` for
zero-centred norm gammas and ``-exp(w)`` for ``A_log``). ``state_dict`` checks that every checkpoint element
is covered and that converting the result gives back the GGUF's dequantized tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from regolith.errors import ModelFormatError

# probe kinds (the zero probe's output: the transform of 0)
_IDENTITY, _PLUS_ONE, _NEG_EXP = 0.0, 1.0, -1.0
_ID_SCALE = 2.0**-10


def _probe(config: Mapping[str, Any], shapes: Mapping[str, tuple], fill: Callable) -> dict[str, np.ndarray]:
    from regolith.convert.qwen4exp import gguf_tensors

    named = [(n, fill(i, n, s)) for i, (n, s) in enumerate(shapes.items())]
    return {g: np.asarray(a, dtype=np.float64).reshape(-1) for g, a in gguf_tensors(config, named)}


def _decode(v: np.ndarray, kind: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Probe values back to the integers that were sent (times ``scale``), per element transform."""
    return np.rint(_invert(v, kind) / scale).astype(np.int64)


def _invert(v: np.ndarray, kind: np.ndarray) -> np.ndarray:
    out = v.copy()
    out[kind == _PLUS_ONE] -= 1.0
    neg = kind == _NEG_EXP
    out[neg] = np.log(-v[neg])
    return out


def dequantized(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF at ``path`` as float64 in numpy order (``gguf``'s dequantization)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    out = {}
    for t in GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return out


def state_dict(config: Mapping[str, Any], gguf_path: str | Path):
    """(model, state dict) for ``config`` (a qwen4_exp config.json dict) holding the GGUF's weights in
    float64 (the MTP head, which transformers' model lacks, left out); ``model`` is the freshly built
    ``Qwen4ExpForCausalLM`` whose names and buffers were used."""
    import torch
    from transformers import AutoConfig, Qwen4ExpForCausalLM

    # transformers' model has no MTP head: convert without it, and leave the GGUF's nextn block aside
    config = {k: v for k, v in config.items() if k != "mtp_num_hidden_layers"}
    hf_config = AutoConfig.for_model(**config)
    hf_config._experts_implementation = "eager"  # torch's grouped_mm has no float64
    model = Qwen4ExpForCausalLM(hf_config).eval()
    sd = model.state_dict()
    floats = {n: tuple(t.shape) for n, t in sd.items() if t.is_floating_point()}
    others = {n: t.numpy() for n, t in sd.items() if not t.is_floating_point()}
    if max(int(np.prod(s)) for s in floats.values()) > 2**24:
        raise ModelFormatError(
            "a tensor of more than 2^24 elements: its probe indices are not exact in float32"
        )

    def probe(fill: Callable) -> dict[str, np.ndarray]:
        shapes = {**floats, **{n: a.shape for n, a in others.items()}}

        def f(i: int, n: str, s: tuple) -> np.ndarray:
            return others[n] if n in others else fill(i, s)

        return _probe(config, shapes, f)

    kind = probe(lambda i, s: np.zeros(s, dtype=np.float32))
    index = probe(lambda i, s: np.arange(int(np.prod(s)), dtype=np.float32).reshape(s))
    # tensor ids as multiples of 2^-10: exact in float32, and small enough for -exp
    source = probe(lambda i, s: np.full(s, i * _ID_SCALE, dtype=np.float32))
    names = list(floats) + list(others)
    gguf = dequantized(gguf_path)
    mtp = f"blk.{config['num_hidden_layers']}."
    missing = sorted((set(kind) ^ set(gguf)) - {g for g in gguf if g.startswith(mtp)})
    if missing:
        raise ModelFormatError(f"GGUF and converter disagree on tensors: {missing[:8]}")
    flat = {n: np.full(int(np.prod(s)), np.nan) for n, s in floats.items()}
    for g, k in kind.items():
        src = _decode(source[g], k, _ID_SCALE)
        idx = _decode(index[g], k)
        val = _invert(gguf[g].reshape(-1), k)
        for s in np.unique(src):
            m = src == s
            flat[names[int(s)]][idx[m]] = val[m]
    holes = [n for n, a in flat.items() if np.isnan(a).any()]
    if holes:
        raise ModelFormatError(f"checkpoint tensors the GGUF does not determine: {holes[:8]}")
    out = {n: torch.from_numpy(a.reshape(floats[n])) for n, a in flat.items()}
    out.update({n: torch.from_numpy(a) for n, a in others.items()})
    _check_round_trip(config, out, gguf)
    return model, out


def _check_round_trip(
    config: Mapping[str, Any], sd: Mapping[str, Any], gguf: Mapping[str, np.ndarray]
) -> None:
    from regolith.convert.qwen4exp import gguf_tensors

    named = [(n, t.numpy()) for n, t in sd.items()]
    for g, a in gguf_tensors(config, named):
        want = gguf[g].astype(np.float32).reshape(-1)
        got = np.asarray(a, dtype=np.float32).reshape(-1)
        if not np.array_equal(got, want):
            bad = int(np.count_nonzero(got != want))
            raise ModelFormatError(
                f"{g}: converting the inverse back differs in {bad} of {want.size} elements"
            )
