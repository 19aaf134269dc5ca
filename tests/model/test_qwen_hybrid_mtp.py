"""Qwen3.5 MoE's and Qwen3-Next's MTP heads against an independent torch implementation of llama.cpp's qwen35moe /
qwen3next graph_mtp (the same equations as vLLM's Qwen3NextMTP): transformers ignores ``mtp.*``, so the oracle is
written here from transformers' ``Qwen3_5MoeDecoderLayer`` / ``Qwen3NextDecoderLayer`` (fed ``mtp.layers.0.*``)
for the layer and plain torch for the rest:
z = fc([pre_fc_norm_embedding(embed(x)); pre_fc_norm_hidden(h)]), one pre-norm decoder layer, o = norm(z'),
logits = lm_head(o), where h is the main model's final hidden state after its output norm and drafting feeds o
back. The checkpoints (Qwen3.5's with ``mtp_num_hidden_layers``, Qwen3-Next's as released: MTP tensors only) go
through ``regolith.convert`` (llama.cpp's nextn names, tests/test_convert_qwen35moe.py and test_convert_qwen3next.py)
and the C++ head must agree to 1e-4 of the logits' scale."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import _core, model_sizes
from regolith.speculative import Speculation
from tests.dense_models import (
    qwen3next_mtp_weights,
    qwen35moe_mtp_weights,
    save_tiny_checkpoint,
    tiny_model,
)

torch.set_num_threads(1)

SEQ = 24
SEED = 5


def _rms(x, w, eps):
    """Qwen3_5MoeRMSNorm / Qwen3NextRMSNorm semantics: x / rms(x) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class TorchMtp:
    """The head's equations over a whole pair sequence at once (causal, so a prefix gives the same rows)."""

    def __init__(self, model, weights, layer_class):
        self.model = model
        cfg = model.config
        n = cfg.num_hidden_layers
        ext = type(cfg)(
            **{
                **cfg.to_dict(),
                "num_hidden_layers": n + 1,
                "layer_types": [*cfg.layer_types, "full_attention"],
            }
        )
        ext._attn_implementation = cfg._attn_implementation  # the mask below is made for it
        ext._experts_implementation = cfg._experts_implementation
        self.cfg = cfg
        self.layer = layer_class(ext, n).eval()
        self.layer.load_state_dict(
            {k[len("mtp.layers.0.") :]: v for k, v in weights.items() if k.startswith("mtp.layers.0.")}
        )
        self.w = weights

    def hidden(self, ids: np.ndarray) -> torch.Tensor:
        """The main model's final hidden states (after its output norm): [T, H]."""
        got = {}
        hook = self.model.model.norm.register_forward_hook(lambda m, i, o: got.setdefault("h", o))
        try:
            self.model(torch.tensor(ids)[None])
        finally:
            hook.remove()
        return got["h"][0]

    def run(self, h: torch.Tensor, x: torch.Tensor, positions: torch.Tensor):
        """Pairs (h[i], x[i]) at RoPE positions -> (o [1, n, H], logits [1, n, V])."""
        from transformers.masking_utils import create_causal_mask

        w, eps = self.w, self.cfg.rms_norm_eps
        e = _rms(self.model.model.embed_tokens(x), w["mtp.pre_fc_norm_embedding.weight"], eps)
        g = _rms(h, w["mtp.pre_fc_norm_hidden.weight"], eps)
        z = (torch.cat([e, g], -1) @ w["mtp.fc.weight"].T)[None]  # [1, n, H]
        pe = self.model.model.rotary_emb(z, positions[None])
        mask = create_causal_mask(
            config=self.cfg,
            inputs_embeds=z,
            attention_mask=None,
            cache=None,
            position_ids=torch.arange(len(x))[None],  # cache indices: the mask is plain causal
            allow_is_causal_skip=False,
        )
        s = self.layer(z, position_embeddings=pe, attention_mask=mask)  # [1, n, H]
        o = _rms(s, w["mtp.norm.weight"], eps)
        return o, self.model.lm_head(o)


@pytest.fixture(scope="module", params=["qwen35moe", "qwen3next"])
def tiny(request, tmp_path_factory):
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    from regolith.convert import convert

    arch = request.param
    tmp = tmp_path_factory.mktemp(f"{arch}-mtp")
    if arch == "qwen35moe":
        hf = save_tiny_checkpoint(arch, tmp / "hf", SEED, mtp_num_hidden_layers=1)
        model = tiny_model(arch, SEED, mtp_num_hidden_layers=1)
        ref = TorchMtp(model, qwen35moe_mtp_weights(model.config, SEED), Qwen3_5MoeDecoderLayer)
    else:
        hf = save_tiny_checkpoint(arch, tmp / "hf", SEED, mtp=True)
        model = tiny_model(arch, SEED)
        ref = TorchMtp(model, qwen3next_mtp_weights(model.config, SEED), Qwen3NextDecoderLayer)
    return convert(hf, tmp / "mtp.gguf", "f32"), ref


def test_the_head_loads_and_the_window_drafts(tiny):
    path, ref = tiny
    m = regolith.Model.load(path)
    assert m.config["mtp"] and m.config["nextn_predict_layers"] == 1
    assert m.config["n_layer"] == ref.cfg.num_hidden_layers
    assert m.window(64).has_draft_head
    # the plan keeps f16 keys and values for the main attention layers and the head's (also where the file
    # gives the layers by full_attention_interval, as released Qwen3-Next files do), conv and recurrent state
    # for the Gated DeltaNet layers
    cfg, sizes = ref.cfg, m.plan.sizes
    n_attn = cfg.layer_types.count("full_attention") + 1
    n_gdn = cfg.layer_types.count("linear_attention")
    conv = (
        2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
        + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    )
    recurrent = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    assert sizes.state_per_token == n_attn * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    # fixed: the Gated DeltaNet layers' conv and recurrent states, and the final hidden states (f32) the
    # draft head holds (MtpContext::kBufferRows)
    held = 4 * cfg.hidden_size * model_sizes.MTP_BUFFER_ROWS
    assert sizes.state_fixed == n_gdn * 4 * ((cfg.linear_conv_kernel_dim - 1) * conv + recurrent) + held


def test_mtp_head_matches_torch_reference(tiny):
    path, ref = tiny
    ids = np.random.default_rng(3).integers(3, ref.cfg.vocab_size, SEQ)
    with torch.no_grad():
        h = ref.hidden(ids)
        pos = torch.arange(1, SEQ)
        want_o, want = ref.run(h[:-1], torch.tensor(ids[1:]), pos)
    head = _core.MtpHeadBlock(str(path), 64)
    # the pairs in two uneven calls: the head's KV cache carries over
    o1, l1 = head.forward(h[:-1][:9].numpy(), ids[1:10].astype(np.int32), pos[:9].numpy())
    o2, l2 = head.forward(h[:-1][9:].numpy(), ids[10:].astype(np.int32), pos[9:].numpy())
    want_o, want = want_o[0].numpy(), want[0].numpy()
    np.testing.assert_allclose(np.concatenate([l1, l2]), want, atol=1e-4 * np.abs(want).max(), rtol=0)
    np.testing.assert_allclose(np.concatenate([o1, o2]), want_o, atol=1e-4 * np.abs(want_o).max(), rtol=0)


def test_window_draft_follows_the_reference_chain(tiny):
    """Window.draft: catch up on every pair the window holds, then k greedy steps feeding o back."""
    path, ref = tiny
    ids = np.random.default_rng(4).integers(3, ref.cfg.vocab_size, SEQ)
    prompt, nxt = ids[:-1], int(ids[-1])
    w = regolith.Model.load(path, kv_type="f32").window(64)
    w.eval(prompt[:7], all_logits=False)
    w.eval(prompt[7:], all_logits=False)
    got = w.draft(nxt, 4)
    with torch.no_grad():
        h = ref.hidden(prompt)
        hs, xs = list(h), [*map(int, prompt[1:]), nxt]
        want = []
        for _ in range(4):
            o, logits = ref.run(torch.stack(hs), torch.tensor(xs), torch.arange(1, len(xs) + 1))
            last = logits[0, -1]
            top2 = torch.topk(last, 2).values
            assert float(top2[0] - top2[1]) > 1e-3 * float(last.abs().max()), "near-tie in the reference"
            token = int(last.argmax())
            want.append(token)
            hs.append(o[0, -1])
            xs.append(token)
    assert got == want
    assert w.draft(nxt, 4) == want  # drafting leaves the window's own state alone


def test_mtp_speculation_is_token_identical_while_streaming(tiny, tmp_path):
    """The head's experts stream through the arena with the main layers' (from a pack too); greedy decoding
    with MTP drafts gives plain decoding's tokens."""
    from regolith import pack as pk

    path, _ = tiny
    packed = pk.pack(path, tmp_path / "mtp.pack")
    src = pk.open_packed(packed)
    with regolith.gguf.open(src.dense) as f:
        slot = model_sizes.sizes_from_gguf(f.tensors, f.metadata, src.manifest).slot_bytes
    model = regolith.Model.load(packed, arena_gb=5 * slot / 2**30, lock_memory=False, n_ctx=256)
    assert model._window is None and model.window(8).has_draft_head
    prompt = [int(t) for t in np.random.default_rng(8).integers(3, 300, 12)]
    plain = model.generate(prompt, 20, stream=True, speculative=False, temperature=0.0)
    text = "".join(plain)
    spec = model.generate(prompt, 20, stream=True, speculative=Speculation(gate=False), temperature=0.0)
    assert "".join(spec) == text and spec.tokens == plain.tokens
    assert spec.stats.drafted_tokens > 0
