"""Tiny random qwen4_exp checkpoints for tests: configs, seeded models, a byte-level BPE tokenizer.

Every model test builds its checkpoint here, so the whole effort shares one set of shapes.
``tiny_text_config(**overrides)`` returns a ``Qwen4ExpTextConfig`` (fp32); ``tiny_model(seed, **overrides)``
a seeded ``Qwen4ExpForCausalLM``; ``save_tiny_model(path, seed, **overrides)`` writes it with
``save_pretrained`` plus ``tokenizer.json`` / ``tokenizer_config.json`` and returns ``path``.

The default config has 4 layers (GDN, QSA, GDN, QSA), so both mixers appear twice:

============================  =======  ==============================================================
override                      default  notes
============================  =======  ==============================================================
``hc_count``                  3        hyper-connection streams (> 1); ``hc_lowrank`` 8
``ple_layer_ids``             [1]      1-based, linear-attention layers only; ``[]`` turns PLE off
``ple_embed_dim``             hidden   llama.cpp loads only ple_embed_dim == hidden_size
``ngram_size`` /              3 / 2    PLE n-gram heads = (ngram_size - 1) * heads_per_ngram = 4
``heads_per_ngram``
``ngram_vocab_size_base``     100      4 prime-sized heads -> 420 rows, padded to 512, 4 shards
``indexer_budget`` /          8 / 4    QSA keeps budget // ratio = 2 blocks of 4 tokens + the tail,
``indexer_compress_ratio``             so a 40-token prompt exercises the sparse selection
``num_experts`` /             16 / 4   ``moe_intermediate_size`` 32, ``shared_expert_intermediate_size`` 48
``num_experts_per_tok``
``norm_topk_prob``            True     renormalise the top-k router weights
``num_attention_heads`` /     4 / 2    GQA ratio 2, ``head_dim`` 16
``num_key_value_heads``
``partial_rotary``            0.5      rotary dims = head_dim * factor = 8 (mrope sections [2, 1, 1])
``linear_num_key_heads`` /    2 / 4    GDN heads of 16 (llama.cpp needs key dim == value dim)
``linear_num_value_heads``
``eos_token_id``              2        ``<|im_end|>``; the PLE hash resets its n-grams on it
``layer_types``               L,I,L,I  ``linear_attention`` / ``indexed_attention`` (transformers' name;
                                       checkpoints say ``full_attention``, both are accepted)
============================  =======  ==============================================================

``partial_rotary`` is a shorthand for ``rope_parameters["partial_rotary_factor"]`` (the mrope sections are
rescaled to fit). Everything else passes through to ``Qwen4ExpTextConfig``.

Weights come from ``torch.manual_seed(seed)`` with ``initializer_range`` 0.1 (router logits then spread
well apart, so top-k choices are stable across implementations). transformers initialises every
zero-centred RMSNorm gamma and the PLE conv to zeros and the GDN norm and ``dt_bias`` to ones; those are
perturbed with seeded noise so that a converter forgetting ``+1`` or a model using the wrong gamma fails.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = [
    "SPECIAL_TOKENS",
    "TINY_CORPUS",
    "save_tiny_model",
    "save_tiny_mtp",
    "save_tiny_tokenizer",
    "tiny_model",
    "tiny_mtp_weights",
    "tiny_text_config",
    "with_mtp_layer",
]

# Qwen3.5's pre-tokenizer regex (llama.cpp: LLAMA_VOCAB_PRE_TYPE_QWEN35); the converter recognises it.
QWEN35_PRE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CORPUS = (
    "the quick brown fox jumps over the lazy dog. the dog sleeps; the fox runs on and on.\n"
    "def add(a, b):\n    return a + b\n"
    "experts stream from the disk into the arena, then the router picks the top experts.\n"
)
N_MERGES = 36


def _rope(head_dim: int, factor: float) -> dict[str, Any]:
    half = int(head_dim * factor) // 2
    t = half - 2 * (half // 4)
    return {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": factor,
        "mrope_section": [t, half // 4, half // 4],
        "mrope_interleaved": True,
    }


def tiny_text_config(**overrides: Any):
    """A tiny fp32 ``Qwen4ExpTextConfig``; see the module docstring for the defaults and overrides."""
    from transformers import Qwen4ExpTextConfig

    partial = overrides.pop("partial_rotary", 0.5)
    head_dim = overrides.get("head_dim", 16)
    kw: dict[str, Any] = {
        "vocab_size": 304,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "rope_parameters": _rope(head_dim, partial),
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "hc_count": 3,
        "hc_lowrank": 8,
        "ple_layer_ids": [1],
        "ple_conv_kernel_size": 4,
        "ngram_size": 3,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": 100,
        "make_ngram_vocab_size_divisible_by": 128,
        "split_ngram_parts": 4,
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "norm_topk_prob": True,
        "eos_token_id": 2,
        "bos_token_id": None,
        "pad_token_id": None,
        "initializer_range": 0.1,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    n_layers = overrides.get("num_hidden_layers")
    if n_layers is not None and "layer_types" not in overrides:
        kw["layer_types"] = [("indexed_attention" if i % 2 else "linear_attention") for i in range(n_layers)]
    kw.update(overrides)
    return Qwen4ExpTextConfig(**kw)


def tiny_model(seed: int = 0, **overrides: Any):
    """A seeded ``Qwen4ExpForCausalLM`` (fp32, eval mode) for ``tiny_text_config(**overrides)``."""
    import torch
    from transformers import Qwen4ExpForCausalLM

    config = tiny_text_config(**overrides)
    torch.manual_seed(seed)
    return perturb_constant_parameters(Qwen4ExpForCausalLM(config).eval(), seed + 1)


def perturb_constant_parameters(model, seed: int):
    """Add seeded noise to every parameter that _init_weights left constant (zeros / ones: norms, dt_bias, the
    PLE conv, biases), so a wrong gamma or a missing bias shows; returns the model."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dtype.is_floating_point and p.numel() > 0 and bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _learn_merges(corpus: str, n: int) -> list[tuple[str, str]]:
    """A deterministic byte-level BPE: the most frequent pair (ties: smallest pair) merges first."""
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=_regex(), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    words = Counter(w for w, _ in pre.pre_tokenize_str(corpus))
    seqs = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(n):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, count in words.items():
            s = seqs[w]
            for a, b in itertools.pairwise(s):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


def _regex():
    from tokenizers import Regex

    return Regex(QWEN35_PRE_REGEX)


def save_tiny_tokenizer(path: str | Path) -> Path:
    """Write a tiny byte-level BPE (Qwen3.5 pre-tokenizer; 3 specials at ids 0-2, then 256 bytes, 36 merges)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = _learn_merges(TINY_CORPUS, N_MERGES)
    vocab = {tok: i + len(SPECIAL_TOKENS) for i, tok in enumerate(alphabet)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab) + len(SPECIAL_TOKENS))
    for i, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=_regex(), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "model_max_length": 256,
        "chat_template": (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def save_tiny_model(path: str | Path, seed: int = 0, *, tokenizer: bool = True, **overrides: Any) -> Path:
    """Save ``tiny_model(seed, **overrides)`` with ``save_pretrained`` (+ the tiny tokenizer) into ``path``."""
    path = Path(path)
    tiny_model(seed, **overrides).save_pretrained(path)
    if tokenizer:
        save_tiny_tokenizer(path)
    return path


def with_mtp_layer(config):
    """``config`` with one more layer, of type indexed_attention: where the MTP head's decoder layer sits."""
    kw = {**config.to_dict(), "num_hidden_layers": config.num_hidden_layers + 1}
    kw["layer_types"] = [*config.layer_types, "indexed_attention"]
    return type(config)(**kw)


def tiny_mtp_weights(config, seed: int = 0) -> dict:
    """Seeded ``mtp.*`` tensors for ``config`` (regolith's MTP spec, docs/qwen4exp.md#mtp): the decoder layer
    ``mtp.layers.0.*`` of transformers' ``Qwen4ExpTextDecoderLayer`` for an indexed-attention layer placed
    after the model's layers, ``mtp.fc``, the three zero-centred norms and the output mixer. Every tensor is
    0.1 * N(0, 1)."""
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import (
        Qwen4ExpTextDecoderLayer,
        Qwen4ExpTextGatedResidual,
    )

    ext = with_mtp_layer(config)
    H = config.hidden_size
    layer = Qwen4ExpTextDecoderLayer(ext, config.num_hidden_layers)
    mixer = Qwen4ExpTextGatedResidual(config, use_combine=False)
    out = {f"mtp.layers.0.{k}": v for k, v in layer.state_dict().items()}
    out.update({f"mtp.hyper_connection_mixer.{k}": v for k, v in mixer.state_dict().items()})
    out["mtp.fc.weight"] = torch.zeros(H, 2 * H)
    for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{k}.weight"] = torch.zeros(H)
    gen = torch.Generator().manual_seed(seed)
    return {k: (0.1 * torch.randn(v.shape, generator=gen)).contiguous() for k, v in sorted(out.items())}


def save_tiny_mtp(path: str | Path, weights: dict) -> Path:
    """Add ``weights`` (``tiny_mtp_weights``) to the checkpoint at ``path`` as ``model-mtp.safetensors`` and
    ``"mtp_num_hidden_layers": 1`` to its config.json."""
    from safetensors.torch import save_file

    path = Path(path)
    save_file(weights, str(path / "model-mtp.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path
