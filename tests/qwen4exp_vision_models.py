"""Tiny random qwen4_exp and Qwen3.5 MoE vision-language checkpoints for tests
(``Qwen4ExpForConditionalGeneration``, ``Qwen3_5MoeForConditionalGeneration``).

The text model is tests/qwen4exp_models.py's tiny config (qwen35moe: tests/dense_models.py's); the vision tower is a 2-block ViT of width 32
(2 heads of 16), patches of 4 pixels, spatial merge 2 (one text token per 8x8 pixels) and a 6x6 learned
position grid. The tokenizer is the tiny byte-level BPE plus ``<|vision_start|>``, ``<|vision_end|>`` and
``<|image_pad|>``, with a ChatML template that renders image parts as the Qwen3-VL processor's placeholder.
``preprocessor_config.json`` configures transformers' Qwen2-VL image processor (the one qwen4_exp uses).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.qwen4exp_models import perturb_constant_parameters, save_tiny_tokenizer, tiny_text_config

__all__ = ["PREPROCESSOR", "VISION_TOKENS", "save_tiny_vl_model", "tiny_vl_model"]

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 8 * 8 * 4, "longest_edge": 8 * 8 * 64},
}
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _token_ids(path: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    return {t: tok.token_to_id(t) for t in VISION_TOKENS}


def tiny_vl_config(ids: dict[str, int], arch: str = "qwen4exp", **text_overrides: Any):
    """A tiny fp32 ``Qwen4ExpConfig`` (or, ``arch`` "qwen35moe", ``Qwen3_5MoeConfig``) with vision; ``ids``
    maps the vision tokens to their ids."""
    from transformers import Qwen3_5MoeConfig, Qwen4ExpConfig

    from tests.dense_models import tiny_config

    if arch == "qwen35moe":
        text, config_class = tiny_config("qwen35moe", **text_overrides), Qwen3_5MoeConfig
    else:
        text = tiny_text_config(**{"indexer_n_heads": 8, "output_gate_type": "sigmoid", **text_overrides})
        config_class = Qwen4ExpConfig
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 4,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "out_hidden_size": text.hidden_size,
        "num_position_embeddings": 36,
        "initializer_range": 0.1,
    }
    return config_class(
        text_config=text.to_dict(),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|image_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        dtype="float32",
    )


def tiny_vl_model(config, seed: int = 0):
    """A seeded ``Qwen4ExpForConditionalGeneration`` or ``Qwen3_5MoeForConditionalGeneration`` (fp32, eval
    mode); constant-initialised parameters (norms, biases) get seeded noise so a wrong gamma or a missing bias
    shows."""
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration, Qwen4ExpForConditionalGeneration

    cls = (
        Qwen3_5MoeForConditionalGeneration
        if config.model_type == "qwen3_5_moe"
        else Qwen4ExpForConditionalGeneration
    )
    torch.manual_seed(seed)
    return perturb_constant_parameters(cls(config).float().eval(), seed + 1)


def save_tiny_vl_model(path: str | Path, seed: int = 0, arch: str = "qwen4exp", **text_overrides: Any):
    """Write a tiny VL checkpoint (weights, tokenizer, preprocessor config) of ``arch`` ("qwen4exp" or
    "qwen35moe") to ``path``; returns the model."""
    path = Path(path)
    save_tiny_tokenizer(path)
    ids = _token_ids(path)
    model = tiny_vl_model(tiny_vl_config(ids, arch, **text_overrides), seed)
    model.save_pretrained(path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    return model
