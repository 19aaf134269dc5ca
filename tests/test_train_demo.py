"""tools/train_demo's training module against transformers 5.24's qwen4_exp in fp32 on CPU.

The LM against ``Qwen4ExpForCausalLM`` loaded with the same weights; the MTP head against the spec equations
(docs/demo_model.md) computed with transformers' own decoder layer, gated residual and RMSNorm.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
modeling = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")

from tests.qwen4exp_models import tiny_model
from tools.train_demo.model import Config, Qwen4ExpLM

torch.set_num_threads(1)

EOS = 2
# every feature: GDN + QSA (2 sparse blocks of 4 + tail over 72 tokens, 2 GDN chunks), 4 streams, PLE on
# layer 1, 16 experts top-4 + shared expert; 8 index heads keep exact-zero score ties (relu) unlikely
OVERRIDES = {"hc_count": 4, "indexer_n_heads": 8, "max_position_embeddings": 128}


def _ids(seed: int, batch: int, length: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 304, (batch, length), generator=gen)
    ids[0, 17] = EOS  # the PLE n-grams restart after EOS
    ids[1, length - 20] = EOS
    return ids


def _ours(ref) -> Qwen4ExpLM:
    cfg = Config.from_dict({**ref.config.to_dict(), "mtp_num_hidden_layers": 1})
    torch.manual_seed(3)
    ours = Qwen4ExpLM(cfg).eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected
    assert all(k.startswith("mtp.") for k in missing)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in ours.mtp.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen) + (1.0 if name.endswith("dt_bias") else 0.0))
    return ours


def test_logits_match_transformers():
    ref = tiny_model(seed=0, **OVERRIDES)
    ours = _ours(ref)
    ids = _ids(1, 2, 72)
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        got = ours(ids)
    scale = want.abs().max()
    assert (got - want).abs().max() < 1e-4 * scale


def test_state_dict_names_match_transformers():
    ref = tiny_model(seed=0, **OVERRIDES)
    ours = _ours(ref)
    main = {k: tuple(v.shape) for k, v in ours.state_dict().items() if not k.startswith("mtp.")}
    assert main == {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def test_mtp_matches_spec_with_transformers_layer():
    ref = tiny_model(seed=0, **OVERRIDES)
    ours = _ours(ref)
    cfg = ref.config
    ids = _ids(2, 2, 40)
    with torch.no_grad():
        h = ref.model(input_ids=ids).last_hidden_state[:, :-1]  # h_t, t = 0..T-2
        nxt = ids[:, 1:]  # x = token t+1
        got = ours.lm_head(ours.mtp_hidden(h, nxt))

        mtp = {k[len("mtp.") :]: v for k, v in ours.state_dict().items() if k.startswith("mtp.")}

        def norm(prefix: str) -> torch.nn.Module:
            n = modeling.Qwen4ExpTextRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            n.weight.copy_(mtp[prefix + ".weight"])
            return n

        e = norm("pre_fc_norm_embedding")(ref.model.embed_tokens(nxt))
        g = norm("pre_fc_norm_hidden")(h)
        z = torch.cat((e, g), dim=-1) @ mtp["fc.weight"].T
        s = z.repeat(1, 1, cfg.hc_count)
        qsa_idx = cfg.layer_types.index("indexed_attention")
        layer = modeling.Qwen4ExpTextDecoderLayer(cfg, qsa_idx).eval()
        layer.load_state_dict({k[len("layers.0.") :]: v for k, v in mtp.items() if k.startswith("layers.0.")})
        n = s.shape[1]
        pos = torch.arange(1, n + 1)[None].expand(3, ids.shape[0], -1)  # RoPE position t+1
        cos_sin = ref.model.rotary_emb(s, pos)
        mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(ids.shape[0], 1, n, n)
        s = layer(s, position_embeddings=cos_sin, attention_mask=mask)
        mixer = modeling.Qwen4ExpTextGatedResidual(cfg, use_combine=False)
        mixer.load_state_dict(
            {k[len("hyper_connection_mixer.") :]: v for k, v in mtp.items() if "mixer" in k}
        )
        o = mixer(s)
        want = ref.lm_head(norm("norm")(o))
    assert (got - want).abs().max() < 1e-4 * want.abs().max()
