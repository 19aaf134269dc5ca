"""qwen4_exp's and Qwen3.5 MoE's vision tower (Hugging Face) -> llama.cpp's projector GGUF ("mmproj", ``clip``
architecture).

llama.cpp converts both as an unmodified Qwen3-VL ViT (``conversion/qwen4exp.py`` subclasses
``Qwen3VLVisionModel``; ``Qwen3_5MoeForConditionalGeneration`` maps to it in ``conversion/__init__.py``): projector type ``qwen3vl_merger``, the Conv3d patch kernel split into one
``[hidden, C, p, p]`` tensor per frame (``v.patch_embd.weight`` and ``v.patch_embd.weight.1``), blocks as
``v.blk.N.{ln1,attn_qkv,attn_out,ln2,ffn_up,ffn_down}``, the merger as ``v.post_ln`` / ``mm.0`` / ``mm.2``.

Two keys differ in value from llama.cpp's converter, which writes the text model's ``rms_norm_eps`` as the
vision LayerNorm epsilon (transformers uses 1e-6 there) and no pixel limits: regolith writes the 1e-6 the
model computes with, and ``clip.vision.image_min_pixels`` / ``image_max_pixels`` from the checkpoint's
preprocessor config (llama.cpp defines both keys; its Qwen-VL loader uses fixed limits instead).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFormatError

__all__ = ["PROJECTOR_TYPE", "has_vision", "mmproj_metadata", "mmproj_tensors"]

PROJECTOR_TYPE = "qwen3vl_merger"
_PREFIXES = ("model.visual.", "visual.")
_BLOCK = {
    "norm1": "ln1",
    "norm2": "ln2",
    "attn.qkv": "attn_qkv",
    "attn.proj": "attn_out",
    "mlp.linear_fc1": "ffn_up",
    "mlp.linear_fc2": "ffn_down",
}
_GLOBAL = {
    "patch_embed.proj.bias": "v.patch_embd.bias",
    "pos_embed.weight": "v.position_embd.weight",
    "merger.norm.weight": "v.post_ln.weight",
    "merger.norm.bias": "v.post_ln.bias",
    "merger.linear_fc1.weight": "mm.0.weight",
    "merger.linear_fc1.bias": "mm.0.bias",
    "merger.linear_fc2.weight": "mm.2.weight",
    "merger.linear_fc2.bias": "mm.2.bias",
}
Metadata = list[tuple[str, Any, GGUFValueType]]


def has_vision(config: Mapping[str, Any]) -> bool:
    """Whether a config.json dict describes a vision tower."""
    return isinstance(config.get("vision_config"), Mapping)


def _vision(config: Mapping[str, Any]) -> dict[str, Any]:
    if not has_vision(config):
        raise ModelFormatError("config.json has no vision_config: the checkpoint has no vision tower")
    v = dict(config["vision_config"])
    v.setdefault("depth", v.get("num_hidden_layers"))
    v.setdefault("num_heads", v.get("num_attention_heads"))
    required = ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "out_hidden_size")
    missing = [k for k in required if v.get(k) is None]
    if missing:
        raise ModelFormatError(f"config.json vision_config lacks {', '.join(missing)}")
    if v.get("temporal_patch_size", 2) != 2:
        raise ModelFormatError("vision_config.temporal_patch_size must be 2 (llama.cpp's mmproj layout)")
    if v.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelFormatError(
            f"vision_config.hidden_act {v['hidden_act']!r} is not supported (gelu_pytorch_tanh)"
        )
    theta = (v.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    if theta != 10000.0:
        raise ModelFormatError(f"vision rope_theta {theta} is not supported: the mmproj layout fixes 10000")
    if v.get("deepstack_visual_indexes"):
        raise ModelFormatError("deepstack vision layers are not supported (qwen4_exp has none)")
    if v.get("in_channels", 3) != 3:
        raise ModelFormatError("vision_config.in_channels must be 3")
    return v


def mmproj_metadata(
    config: Mapping[str, Any], preprocessor: Mapping[str, Any], *, file_type: int | None = None
) -> Metadata:
    """The projector's GGUF keys in llama.cpp's order (``general.architecture`` and ``general.type`` are the
    writer's); ``preprocessor`` is preprocessor_config.json (image mean/std, pixel limits)."""
    v = _vision(config)
    text = {**config, **(config.get("text_config") or {})}
    u32, f32, boolean, string = (
        GGUFValueType.UINT32,
        GGUFValueType.FLOAT32,
        GGUFValueType.BOOL,
        GGUFValueType.STRING,
    )
    if text.get("hidden_size") != v["out_hidden_size"]:
        raise ModelFormatError(
            f"vision_config.out_hidden_size {v['out_hidden_size']} differs from the text hidden_size "
            f"{text.get('hidden_size')}"
        )
    n_pos = v.get("num_position_embeddings", 2304)
    md: Metadata = []
    if file_type is not None:
        md.append(("general.file_type", int(file_type), u32))
    md += [
        ("clip.has_vision_encoder", True, boolean),
        ("clip.vision.projection_dim", int(text["hidden_size"]), u32),
        ("clip.vision.image_size", int(math.sqrt(n_pos) * v["patch_size"]), u32),
        ("clip.vision.patch_size", int(v["patch_size"]), u32),
        ("clip.vision.embedding_length", int(v["hidden_size"]), u32),
        ("clip.vision.feed_forward_length", int(v["intermediate_size"]), u32),
        ("clip.vision.block_count", int(v["depth"]), u32),
        ("clip.vision.attention.head_count", int(v["num_heads"]), u32),
        ("clip.vision.image_mean", [float(x) for x in preprocessor.get("image_mean", [0.5] * 3)], f32),
        ("clip.vision.image_std", [float(x) for x in preprocessor.get("image_std", [0.5] * 3)], f32),
        ("clip.projector_type", PROJECTOR_TYPE, string),
        ("clip.use_gelu", True, boolean),
        ("clip.vision.spatial_merge_size", int(v.get("spatial_merge_size", 2)), u32),
        ("clip.vision.attention.layer_norm_epsilon", 1e-6, f32),
    ]
    size = preprocessor.get("size") or {}
    lo = preprocessor.get("min_pixels", size.get("shortest_edge"))
    hi = preprocessor.get("max_pixels", size.get("longest_edge"))
    if lo is not None:
        md.append(("clip.vision.image_min_pixels", int(lo), u32))
    if hi is not None:
        md.append(("clip.vision.image_max_pixels", int(hi), u32))
    return md


def _name(key: str) -> str | list[str] | None:
    if key in _GLOBAL:
        return _GLOBAL[key]
    if key == "patch_embed.proj.weight":
        return ["v.patch_embd.weight", "v.patch_embd.weight.1"]
    parts = key.split(".")
    if parts[0] == "blocks" and len(parts) >= 4 and parts[1].isdigit():
        mapped = _BLOCK.get(".".join(parts[2:-1]))
        if mapped is not None:
            return f"v.blk.{parts[1]}.{mapped}.{parts[-1]}"
    return None


def mmproj_tensors(
    config: Mapping[str, Any], named_tensors: Iterable[tuple[str, Any]]
) -> list[tuple[str, tuple[int, ...], Any]]:
    """``(gguf_name, numpy_shape, load)`` for every vision tensor of a checkpoint (others are skipped);
    ``load()`` returns float32. Raises ModelFormatError for an unknown vision tensor, a wrong shape or a
    missing one."""
    v = _vision(config)
    h, ff, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = h * v.get("spatial_merge_size", 2) ** 2
    want: dict[str, tuple[int, ...]] = {
        "patch_embed.proj.weight": (h, 3, 2, p, p),
        "patch_embed.proj.bias": (h,),
        "pos_embed.weight": (v.get("num_position_embeddings", 2304), h),
        "merger.norm.weight": (h,),
        "merger.norm.bias": (h,),
        "merger.linear_fc1.weight": (merged, merged),
        "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (v["out_hidden_size"], merged),
        "merger.linear_fc2.bias": (v["out_hidden_size"],),
    }
    for i in range(v["depth"]):
        b = f"blocks.{i}."
        for n in ("norm1", "norm2"):
            want[b + n + ".weight"] = want[b + n + ".bias"] = (h,)
        want[b + "attn.qkv.weight"], want[b + "attn.qkv.bias"] = (3 * h, h), (3 * h,)
        want[b + "attn.proj.weight"], want[b + "attn.proj.bias"] = (h, h), (h,)
        want[b + "mlp.linear_fc1.weight"], want[b + "mlp.linear_fc1.bias"] = (ff, h), (ff,)
        want[b + "mlp.linear_fc2.weight"], want[b + "mlp.linear_fc2.bias"] = (h, ff), (h,)
    out: list[tuple[str, tuple[int, ...], Any]] = []
    seen = set()
    for name, src in named_tensors:
        prefix = next((pre for pre in _PREFIXES if name.startswith(pre)), None)
        if prefix is None:
            continue
        key = name[len(prefix) :]
        target = _name(key)
        if target is None or key not in want:
            raise ModelFormatError(f"checkpoint: unexpected vision tensor {name}")
        if tuple(src.shape) != want[key]:
            raise ModelFormatError(
                f"checkpoint: tensor {name} has shape {list(src.shape)}, expected {list(want[key])}"
            )
        seen.add(key)
        if isinstance(target, list):  # the Conv3d kernel, one [hidden, C, p, p] tensor per frame
            for frame, t in enumerate(target):
                out.append((t, (h, 3, p, p), lambda s=src, f=frame: _f32(s)[:, :, f]))
        else:
            out.append((target, want[key], lambda s=src: _f32(s)))
    missing = sorted(set(want) - seen)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelFormatError(f"checkpoint: missing vision tensors {', '.join(missing[:3])}{more}")
    return out


def _f32(src: Any) -> np.ndarray:
    arr = src.load() if hasattr(src, "load") else np.asarray(src)
    return np.ascontiguousarray(arr, dtype=np.float32)
