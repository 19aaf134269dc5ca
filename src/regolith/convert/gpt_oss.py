"""gpt_oss (Hugging Face ``GptOssForCausalLM``) -> llama.cpp's ``gpt-oss`` GGUF layout, as pure functions.

``gguf_metadata(config)`` gives the ``gpt-oss.*`` keys (and ``general.file_type``) and
``tensor_plan(config, sources)`` the GGUF tensors, with the names, shapes, order and value transforms of
llama.cpp's converter (``conversion/gpt_oss.py``: ``GptOssModel`` on ``TextModel``):

- tensors in the order llama.cpp walks a checkpoint (file by file, by name within a file:
  ``Checkpoint.tensors_by_name``); ``self_attn.sinks`` -> ``attn_sinks.weight``, ``mlp.router`` ->
  ``ffn_gate_inp``, ``post_attention_layernorm`` -> ``post_attention_norm``;
- float experts (``mlp.experts.gate_up_proj`` [E, H, 2F], ``down_proj`` [E, F, H], what transformers holds and
  tiny test checkpoints save) transposed to llama.cpp's [E][out][in] rows, gate and up de-interleaved
  (gate = columns ``0::2``, up = ``1::2``; the same for ``gate_up_proj_bias``);
- MXFP4 experts (the released checkpoints: ``*_proj_blocks`` uint8 [E, out, in / 32, 16] and
  ``*_proj_scales`` uint8 [E, out, in / 32], ``quantization_config.quant_method`` ``mxfp4``) repacked bit for
  bit into GGUF MXFP4 blocks (:func:`repack_mxfp4`), never dequantized; llama.cpp writes them first, before
  every other tensor, and so does this. ``general.file_type`` is then ``MOSTLY_MXFP4_MOE`` for a float
  outtype.

What llama.cpp's graph hard-codes is checked rather than written: the experts' clamped SwiGLU
(``swiglu_alpha`` 1.702, ``swiglu_limit`` 7.0), sliding-window attention on even layers and full attention
on odd ones (``layer_types``), attention biases and an untied output. Shapes are numpy order (a GGUF
``[ne0, ne1]`` tensor is ``(ne1, ne0)``). docs/formats.md has the mapping.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType, LlamaFileType

from ..errors import ModelFormatError

__all__ = [
    "ARCH",
    "HF_ARCHITECTURES",
    "Mxfp4Experts",
    "file_type",
    "gguf_metadata",
    "handles",
    "is_mxfp4",
    "repack_mxfp4",
    "tensor_plan",
    "text_config",
]

ARCH = "gpt-oss"
HF_ARCHITECTURES = ("GptOssForCausalLM",)
# llama.cpp's LLM_FFN_SWIGLU_OAI_MOE: gate * sigmoid(alpha * gate) * (up + 1), gate <= limit, |up| <= limit
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
# GptOssConfig's defaults (transformers), which llama.cpp's converter sees through AutoConfig when config.json
# leaves a key out
_DEFAULTS: dict[str, Any] = {
    "head_dim": 64,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "swiglu_alpha": SWIGLU_ALPHA,
    "swiglu_limit": SWIGLU_LIMIT,
    "attention_bias": True,
    "tie_word_embeddings": False,
}
_DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
_DEFAULT_THETA = 150000.0

Metadata = list[tuple[str, Any, GGUFValueType]]
PlannedTensor = tuple[str, tuple[int, ...], Callable[[], np.ndarray]]

_GLOBAL = {
    "lm_head.weight": "output.weight",
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}
_FLOAT_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_MXFP4_PARTS = {
    f"mlp.experts.{p}_{part}": (p, part)
    for p in ("gate_up_proj", "down_proj")
    for part in ("blocks", "scales")
}


def _load(src: Any) -> np.ndarray:
    """A checkpoint tensor (lazy, with ``load()``, or an array) as contiguous float32."""
    return np.ascontiguousarray(src.load() if hasattr(src, "load") else src, dtype=np.float32)


def _load_u8(src: Any) -> np.ndarray:
    data = src.load() if hasattr(src, "load") else src
    return np.ascontiguousarray(data, dtype=np.uint8)


def _is_u8(src: Any) -> bool:
    return str(getattr(src, "dtype", "")) in ("U8", "uint8")


def handles(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (config.json) is a gpt-oss checkpoint."""
    if not isinstance(config, Mapping):
        return False
    archs = config.get("architectures") or []
    return any(a in HF_ARCHITECTURES for a in archs) or config.get("model_type") == "gpt_oss"


def is_mxfp4(config: Mapping[str, Any]) -> bool:
    """Whether config.json says the routed experts are stored as MXFP4 blocks and scales."""
    quant = config.get("quantization_config") or {}
    return isinstance(quant, Mapping) and quant.get("quant_method") == "mxfp4"


def _rope(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """rope_parameters (transformers 5) or rope_scaling + rope_theta (the released config.json), with
    transformers' default (YaRN 32x) when both are absent, as AutoConfig hands them to llama.cpp."""
    rope = cfg.get("rope_parameters")
    if rope is None:
        rope = cfg.get("rope_scaling")
    if rope is None:
        rope = dict(_DEFAULT_ROPE)
    if not isinstance(rope, Mapping):
        raise ModelFormatError("config.json: rope_parameters must be an object")
    if "full_attention" in rope or "sliding_attention" in rope:
        raise ModelFormatError(
            "config.json: rope_parameters per layer type are not part of llama.cpp's gpt-oss graph (one RoPE "
            "for every layer)"
        )
    rope = dict(rope)
    if "rope_type" not in rope and rope.get("type") is not None:
        rope["rope_type"] = rope["type"]
    if rope.get("rope_theta") is None:
        rope["rope_theta"] = cfg.get("rope_theta", _DEFAULT_THETA)
    if "original_max_position_embeddings" not in rope and "original_max_position_embeddings" in cfg:
        rope["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    kind = rope.get("rope_type", "default")
    if kind not in ("default", "yarn"):
        raise ModelFormatError(
            f"config.json: RoPE scaling {kind!r} is not supported for gpt-oss (YaRN or none)"
        )
    if kind == "yarn":
        for k in ("factor", "original_max_position_embeddings"):
            if not isinstance(rope.get(k), (int, float)) or isinstance(rope.get(k), bool):
                raise ModelFormatError(f"config.json: YaRN RoPE needs a number for {k}")
    if not isinstance(rope["rope_theta"], (int, float)):
        raise ModelFormatError("config.json: rope_theta must be a number")
    return rope


def _alternating(n: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameters from a config.json dict, validated, with GptOssConfig's defaults for the keys it
    leaves out (``rope`` holds the RoPE parameters). Raises ModelFormatError for another architecture or
    for what llama.cpp's gpt-oss graph does not compute: another SwiGLU alpha or limit, another pattern of
    sliding and full layers, no attention biases, a tied output."""
    if not handles(config):
        raise ModelFormatError("config.json is not a gpt_oss checkpoint")
    cfg = {**_DEFAULTS, **config}
    if cfg.get("num_local_experts") is None:
        cfg["num_local_experts"] = cfg.get("num_experts")
    for k in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "intermediate_size",
        "num_local_experts",
        "num_experts_per_tok",
        "head_dim",
        "sliding_window",
    ):
        if k == "head_dim" and cfg[k] is None:  # transformers' rule for an explicit null
            cfg[k] = cfg["hidden_size"] // cfg["num_attention_heads"]
        v = cfg.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelFormatError(f"config.json: {k} must be a positive integer, got {v!r}")
    if not isinstance(cfg["rms_norm_eps"], (int, float)):
        raise ModelFormatError("config.json: rms_norm_eps must be a number")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ModelFormatError("config.json: num_key_value_heads must divide num_attention_heads")
    if cfg["num_experts_per_tok"] > cfg["num_local_experts"]:
        raise ModelFormatError("config.json: num_experts_per_tok exceeds num_local_experts")
    for key, want in (("swiglu_alpha", SWIGLU_ALPHA), ("swiglu_limit", SWIGLU_LIMIT)):
        got = cfg[key]
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-6):
            raise ModelFormatError(
                f"config.json: {key} is {got!r}; llama.cpp's gpt-oss graph hard-codes {want} (its SwiGLU "
                "has no key for it), so the file would compute another model"
            )
    layer_types = cfg.get("layer_types") or _alternating(cfg["num_hidden_layers"])
    if list(layer_types) != _alternating(cfg["num_hidden_layers"]):
        raise ModelFormatError(
            "config.json: layer_types must alternate sliding_attention (even layers) and full_attention (odd "
            "layers), the pattern llama.cpp's gpt-oss graph assumes"
        )
    if not cfg["attention_bias"]:
        raise ModelFormatError(
            "config.json: attention_bias is false; llama.cpp's gpt-oss graph needs the attention biases"
        )
    if cfg["tie_word_embeddings"]:
        raise ModelFormatError(
            "config.json: tie_word_embeddings is true; llama.cpp's gpt-oss graph needs its own output.weight"
        )
    cfg["rope"] = _rope(cfg)
    return cfg


def file_type(config: Mapping[str, Any], outtype_file_type: int) -> int:
    """``general.file_type`` as llama.cpp sets it: MOSTLY_MXFP4_MOE for an MXFP4 checkpoint converted to a
    float outtype (f32, f16, bf16), the outtype's otherwise."""
    floats = (LlamaFileType.ALL_F32, LlamaFileType.MOSTLY_F16, LlamaFileType.MOSTLY_BF16)
    if is_mxfp4(config) and outtype_file_type in floats:
        return int(LlamaFileType.MOSTLY_MXFP4_MOE)
    return int(outtype_file_type)


def gguf_metadata(config: Mapping[str, Any], *, file_type: int | None = None) -> Metadata:
    """The ``gpt-oss.*`` keys in llama.cpp's order: ``(key, value, type)``; ``general.file_type`` at
    llama.cpp's position when ``file_type`` is given (:func:`file_type` gives llama.cpp's value)."""
    cfg = text_config(config)
    u32, f32, string = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
    p = ARCH + "."
    rope = cfg["rope"]
    md: Metadata = [
        (p + "block_count", cfg["num_hidden_layers"], u32),
        (p + "context_length", int(cfg["max_position_embeddings"]), u32),
        (p + "embedding_length", cfg["hidden_size"], u32),
        (p + "feed_forward_length", cfg["intermediate_size"], u32),
        (p + "attention.head_count", cfg["num_attention_heads"], u32),
        (p + "attention.head_count_kv", cfg["num_key_value_heads"], u32),
    ]
    if rope.get("rope_type") == "yarn":
        md += [
            (p + "rope.scaling.type", "yarn", string),
            (p + "rope.scaling.factor", float(rope["factor"]), f32),
            (p + "rope.scaling.original_context_length", int(rope["original_max_position_embeddings"]), u32),
        ]
        extra = (
            ("rope.scaling.yarn_ext_factor", rope.get("extrapolation_factor")),
            ("rope.scaling.yarn_attn_factor", rope.get("attention_factor", rope.get("attn_factor"))),
            ("rope.scaling.yarn_beta_fast", rope.get("beta_fast")),
            ("rope.scaling.yarn_beta_slow", rope.get("beta_slow")),
        )
        md += [(p + key, float(v), f32) for key, v in extra if v is not None]
    md += [
        (p + "rope.freq_base", float(rope["rope_theta"]), f32),
        (p + "attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]), f32),
        (p + "expert_count", cfg["num_local_experts"], u32),
        (p + "expert_used_count", cfg["num_experts_per_tok"], u32),
        (p + "attention.key_length", cfg["head_dim"], u32),
        (p + "attention.value_length", cfg["head_dim"], u32),
    ]
    if file_type is not None:
        md.append(("general.file_type", int(file_type), u32))
    md += [
        (p + "attention.sliding_window", cfg["sliding_window"], u32),
        (p + "expert_feed_forward_length", cfg["intermediate_size"], u32),
    ]
    return md


def repack_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss' MXFP4 (``blocks`` uint8 [..., n / 32, 16]: element 2j of a 32-block in the low nibble of byte
    j, 2j + 1 in the high one; ``scales`` uint8 [..., n / 32], E8M0) as GGUF MXFP4 rows [..., n / 32 * 17]:
    per block the scale byte, then 16 bytes holding element i in the low nibble of byte i and element
    i + 16 in the high one. Only bits move: both sides index the same E2M1 code table and the same E8M0
    scale (ggml doubles the table and halves the scale)."""
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} do not match scales {scales.shape}")
    codes = np.stack((blocks & 0x0F, blocks >> 4), axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate((scales[..., None], qs), axis=-1)
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 17)


@dataclass(frozen=True)
class Mxfp4Experts:
    """``build`` of a stacked expert tensor the checkpoint holds in MXFP4: calling it returns GGUF MXFP4 block
    bytes (uint8 [E, out, in / 32 * 17]; :func:`repack_mxfp4`) of rows ``first::step`` of ``blocks`` /
    ``scales`` (gate and up rows interleave in ``gate_up_proj``), expert by expert, to be written as is."""

    blocks: Any
    scales: Any
    first: int = 0
    step: int = 1

    def __call__(self) -> np.ndarray:
        blocks, scales = _load_u8(self.blocks), _load_u8(self.scales)
        rows = slice(self.first, None, self.step)
        E, R, nb = scales.shape
        out = np.empty((E, len(range(R)[rows]), nb * 17), np.uint8)
        for e in range(E):
            out[e] = repack_mxfp4(blocks[e, rows], scales[e, rows])
        return out


def _expected_shapes(cfg: Mapping[str, Any], mxfp4: bool) -> dict[str, tuple[int, ...]]:
    """Every required HF tensor and its shape."""
    H, V, hd, F = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"], cfg["intermediate_size"]
    nh, nkv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_local_experts"]
    out: dict[str, tuple[int, ...]] = {
        "lm_head.weight": (V, H),
        "model.embed_tokens.weight": (V, H),
        "model.norm.weight": (H,),
    }
    for i in range(cfg["num_hidden_layers"]):
        layer = {
            "input_layernorm.weight": (H,),
            "post_attention_layernorm.weight": (H,),
            "self_attn.q_proj.weight": (nh * hd, H),
            "self_attn.q_proj.bias": (nh * hd,),
            "self_attn.k_proj.weight": (nkv * hd, H),
            "self_attn.k_proj.bias": (nkv * hd,),
            "self_attn.v_proj.weight": (nkv * hd, H),
            "self_attn.v_proj.bias": (nkv * hd,),
            "self_attn.o_proj.weight": (H, nh * hd),
            "self_attn.o_proj.bias": (H,),
            "self_attn.sinks": (nh,),
            "mlp.router.weight": (E, H),
            "mlp.router.bias": (E,),
            "mlp.experts.gate_up_proj_bias": (E, 2 * F),
            "mlp.experts.down_proj_bias": (E, H),
        }
        if mxfp4:
            layer.update(
                {
                    "mlp.experts.gate_up_proj_blocks": (E, 2 * F, H // 32, 16),
                    "mlp.experts.gate_up_proj_scales": (E, 2 * F, H // 32),
                    "mlp.experts.down_proj_blocks": (E, H, F // 32, 16),
                    "mlp.experts.down_proj_scales": (E, H, F // 32),
                }
            )
        else:
            layer.update({"mlp.experts.gate_up_proj": (E, H, 2 * F), "mlp.experts.down_proj": (E, F, H)})
        out.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
    return out


def tensor_plan(config: Mapping[str, Any], sources: Mapping[str, Any]) -> list[PlannedTensor]:
    """``(gguf_name, numpy_shape, build)`` for every output tensor, from shapes only (nothing is read), in
    ``sources``' order (llama.cpp's: :meth:`Checkpoint.tensors_by_name`), MXFP4 experts first. ``build()``
    returns the float32 array, or for MXFP4 experts is an :class:`Mxfp4Experts` returning block bytes.
    Validates names, shapes and dtypes (ModelFormatError)."""
    cfg = text_config(config)
    mxfp4 = is_mxfp4(config)
    H, F, E = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    if mxfp4 and (H % 32 or F % 32):
        raise ModelFormatError(
            "config.json: MXFP4 experts need hidden_size and intermediate_size to be multiples of 32"
        )
    expected = _expected_shapes(cfg, mxfp4)
    first: list[PlannedTensor] = []  # the MXFP4 experts: llama.cpp's generate_extra_tensors
    plan: list[PlannedTensor] = []
    packed: dict[tuple[int, str], dict[str, Any]] = {}  # (layer, proj) -> {"blocks": src, "scales": src}

    def err(msg: str) -> ModelFormatError:
        return ModelFormatError(f"checkpoint: {msg}")

    def one(out: str, name: str, shape: tuple[int, ...], transform: Callable | None = None) -> None:
        if transform is None:
            plan.append((out, shape, lambda n=name: _load(sources[n])))
        else:
            plan.append((out, shape, lambda n=name, f=transform: np.ascontiguousarray(f(_load(sources[n])))))

    for name, src in sources.items():
        shape = tuple(int(d) for d in src.shape)
        want = expected.get(name)
        if want is not None and shape != want:
            raise err(f"tensor {name} has shape {list(shape)}, expected {list(want)} from config.json")
        if name in _GLOBAL:
            one(_GLOBAL[name], name, shape)
            continue
        m = _LAYER.match(name)
        if m is None:
            raise err(f"unexpected tensor {name}")
        bid, key = int(m.group(1)), m.group(2)
        if bid >= cfg["num_hidden_layers"]:
            raise err(f"tensor {name} is beyond num_hidden_layers")
        p = f"blk.{bid}."
        if key in _BLOCK:
            one(p + _BLOCK[key], name, shape)
        elif key == "mlp.experts.gate_up_proj_bias":
            one(p + "ffn_gate_exps.bias", name, (E, F), lambda t: t[..., 0::2])
            one(p + "ffn_up_exps.bias", name, (E, F), lambda t: t[..., 1::2])
        elif key in _FLOAT_EXPERTS and want is not None:
            if key.endswith("down_proj"):
                one(p + "ffn_down_exps.weight", name, (E, H, F), lambda t: t.swapaxes(-1, -2))
            else:
                one(p + "ffn_gate_exps.weight", name, (E, F, H), lambda t: t.swapaxes(-1, -2)[:, 0::2])
                one(p + "ffn_up_exps.weight", name, (E, F, H), lambda t: t.swapaxes(-1, -2)[:, 1::2])
        elif key in _MXFP4_PARTS and want is not None:
            if not _is_u8(src):
                raise err(f"tensor {name} has dtype {src.dtype}, expected U8 (MXFP4 {_MXFP4_PARTS[key][1]})")
            proj, part = _MXFP4_PARTS[key]
            got = packed.setdefault((bid, proj), {})
            got[part] = src
            if len(got) == 2 and proj == "down_proj":
                first.append(
                    (p + "ffn_down_exps.weight", (E, H, F), Mxfp4Experts(got["blocks"], got["scales"]))
                )
            elif len(got) == 2:
                blocks, scales = got["blocks"], got["scales"]
                first.append((p + "ffn_gate_exps.weight", (E, F, H), Mxfp4Experts(blocks, scales, 0, 2)))
                first.append((p + "ffn_up_exps.weight", (E, F, H), Mxfp4Experts(blocks, scales, 1, 2)))
        elif key in _FLOAT_EXPERTS or key in _MXFP4_PARTS:
            form, other = ("MXFP4 blocks and scales", "float") if mxfp4 else ("float", "MXFP4")
            raise err(
                f"tensor {name} holds {other} experts but config.json's quantization_config says the experts "
                f"are {form}"
            )
        else:
            raise err(f"unexpected tensor {name}")

    missing = [k for k in expected if k not in sources]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise err(f"missing tensors {', '.join(missing[:5])}{more}")
    return first + plan
