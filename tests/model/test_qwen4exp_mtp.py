"""qwen4_exp's MTP head against an independent torch implementation of regolith's MTP spec.

No public qwen4_exp MTP reference exists (transformers ignores ``mtp.*``; llama.cpp's qwen4exp converter drops
it), so the oracle is written here from the spec (docs/qwen4exp.md#mtp): transformers'
``Qwen4ExpTextDecoderLayer`` (fed ``mtp.layers.0.*``) for the layer, ``Qwen4ExpTextGatedResidual`` for the
output mixer, plain torch for the norms, ``fc``, the stream expansion and the head. The checkpoint goes
through ``regolith.convert`` (llama.cpp's nextn names) and the C++ head must agree to 1e-4 of the logits'
scale.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
gguf = pytest.importorskip("gguf")

import regolith
from regolith import _core

torch.set_num_threads(1)

SEQ = 24
OVERRIDES = {"indexer_n_heads": 8, "output_gate_type": "sigmoid"}


def _rms(x, w, eps):
    """Qwen4ExpTextRMSNorm semantics: x / rms(x) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class TorchMtp:
    """The spec's equations over a whole pair sequence at once (causal, so a prefix gives the same rows)."""

    def __init__(self, model, weights):
        from transformers.models.qwen4_exp.modeling_qwen4_exp import (
            Qwen4ExpTextDecoderLayer,
            Qwen4ExpTextGatedResidual,
        )

        from tests.qwen4exp_models import with_mtp_layer as _with_mtp_layer

        self.model = model
        cfg = model.config
        ext = _with_mtp_layer(cfg)
        ext._attn_implementation = cfg._attn_implementation  # the mask below is made for it
        self.cfg, self.ext = cfg, ext
        self.layer = Qwen4ExpTextDecoderLayer(ext, cfg.num_hidden_layers).eval()
        self.layer.load_state_dict(
            {k[len("mtp.layers.0.") :]: v for k, v in weights.items() if k.startswith("mtp.layers.0.")}
        )
        self.mixer = Qwen4ExpTextGatedResidual(cfg, use_combine=False).eval()
        self.mixer.load_state_dict(
            {
                k[len("mtp.hyper_connection_mixer.") :]: v
                for k, v in weights.items()
                if k.startswith("mtp.hyper_connection_mixer.")
            }
        )
        self.w = weights

    def hidden(self, ids: np.ndarray) -> torch.Tensor:
        """The main model's final hidden states (the hyper-connection mixer's output): [T, H]."""
        got = {}
        hook = self.model.model.hyper_connection_mixer.register_forward_hook(
            lambda m, i, o: got.setdefault("h", o)
        )
        try:
            self.model(torch.tensor(ids)[None])
        finally:
            hook.remove()
        return got["h"][0]

    def run(self, h: torch.Tensor, x: torch.Tensor, positions: torch.Tensor):
        """Pairs (h[i], x[i]) at RoPE positions -> (o [n, H], logits [n, V])."""
        from transformers.masking_utils import create_causal_mask

        cfg, w, eps = self.cfg, self.w, self.cfg.rms_norm_eps
        e = _rms(self.model.model.embed_tokens(x), w["mtp.pre_fc_norm_embedding.weight"], eps)
        g = _rms(h, w["mtp.pre_fc_norm_hidden.weight"], eps)
        z = torch.cat([e, g], -1) @ w["mtp.fc.weight"].T
        s = z.repeat(1, cfg.hc_count)[None]  # [1, n, hc * H]
        pos = positions[None]
        pe = self.model.model.rotary_emb(s, pos.view(1, 1, -1).expand(3, 1, -1))
        mask = create_causal_mask(
            config=self.cfg,
            inputs_embeds=s,
            attention_mask=None,
            cache=None,
            position_ids=torch.arange(len(x))[None],  # cache indices: the mask is plain causal
            allow_is_causal_skip=False,
        )
        s = self.layer(s, position_embeddings=pe, attention_mask=mask)
        o = self.mixer(s)[0]
        logits = self.model.lm_head(_rms(o, w["mtp.norm.weight"], eps))
        return o, logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model, save_tiny_mtp, tiny_model, tiny_mtp_weights

    model = tiny_model(11, **OVERRIDES)
    weights = tiny_mtp_weights(model.config, seed=12)
    tmp = tmp_path_factory.mktemp("mtp")
    save_tiny_mtp(save_tiny_model(tmp / "hf", 11, **OVERRIDES), weights)
    path = convert(tmp / "hf", tmp / "tiny-mtp.gguf", "f32")
    return path, TorchMtp(model, weights)


def test_convert_writes_nextn_block(tiny):
    path, ref = tiny
    L = ref.cfg.num_hidden_layers
    with regolith.gguf.open(path) as f:
        md, names = f.metadata, set(f.tensors)
    assert md["qwen4exp.block_count"] == L + 1
    assert md["qwen4exp.nextn_predict_layers"] == 1
    assert list(md["qwen4exp.attention.recurrent_layers"]) == [
        *(t == "linear_attention" for t in ref.cfg.layer_types),
        False,
    ]
    nextn = {
        "eh_proj",
        "enorm",
        "hnorm",
        "shared_head_norm",
        "output_hc_norm",
        "output_hc_down",
        "output_hc_up",
    }
    assert {f"blk.{L}.nextn.{n}.weight" for n in nextn} <= names
    assert {
        f"blk.{L}.attn_q.weight",
        f"blk.{L}.indexer.q_proj.weight",
        f"blk.{L}.ffn_gate_exps.weight",
    } <= names
    assert not any(n.startswith((f"blk.{L}.ssm", f"blk.{L}.ple")) for n in names)
    m = regolith.Model.load(path)
    assert m.config["mtp"] and m.config["n_layer"] == L
    assert m.window(64).has_draft_head


def test_mtp_head_matches_torch_reference(tiny):
    path, ref = tiny
    ids = np.random.default_rng(3).integers(3, ref.cfg.vocab_size, SEQ)
    with torch.no_grad():
        h = ref.hidden(ids)
        pos = torch.arange(1, SEQ)
        want_o, want = ref.run(h[:-1], torch.tensor(ids[1:]), pos)
    head = _core.MtpHeadBlock(str(path), 64)
    # the pairs in two uneven calls: the head's attention state carries over
    o1, l1 = head.forward(h[:-1][:9].numpy(), ids[1:10].astype(np.int32), pos[:9].numpy())
    o2, l2 = head.forward(h[:-1][9:].numpy(), ids[10:].astype(np.int32), pos[9:].numpy())
    got = np.concatenate([l1, l2])
    scale = np.abs(want.numpy()).max()
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4 * scale, rtol=0)
    np.testing.assert_allclose(
        np.concatenate([o1, o2]), want_o.numpy(), atol=1e-4 * np.abs(want_o.numpy()).max()
    )


def test_window_draft_follows_the_reference_chain(tiny):
    """Window.draft: catch up on every pair the window holds, then k greedy steps feeding o back."""
    path, ref = tiny
    ids = np.random.default_rng(4).integers(3, ref.cfg.vocab_size, SEQ)
    prompt, nxt = ids[:-1], int(ids[-1])
    w = regolith.Model.load(path).window(64)
    w.eval(prompt[:7], all_logits=False)
    w.eval(prompt[7:], all_logits=False)
    got = w.draft(nxt, 4)
    with torch.no_grad():
        h = ref.hidden(prompt)
        hs, xs = list(h), [*map(int, prompt[1:]), nxt]
        want = []
        for _ in range(4):
            o, logits = ref.run(torch.stack(hs), torch.tensor(xs), torch.arange(1, len(xs) + 1))
            top2 = torch.topk(logits[-1], 2).values
            assert float(top2[0] - top2[1]) > 1e-3 * float(logits[-1].abs().max()), (
                "near-tie in the reference"
            )
            token = int(logits[-1].argmax())
            want.append(token)
            hs.append(o[-1])
            xs.append(token)
    assert got == want
    # drafting leaves the window's own state alone: the same draft again
    assert w.draft(nxt, 4) == want


def test_catching_the_draft_head_up_first_drafts_the_same(tiny):
    """Window.catch_up_draft_head takes in every held pair but the last (whose token comes with the draft),
    once; a draft after it equals a draft that catches up by itself, with the head's logits from the same
    pairs; tokens evaluated later are taken in by the next catch-up."""
    path, ref = tiny
    ids = np.random.default_rng(6).integers(3, ref.cfg.vocab_size, SEQ + 4)
    model = regolith.Model.load(path)
    alone, first = model.window(64), model.window(64)
    for w in (alone, first):
        w.eval(ids[:SEQ], all_logits=False)
    assert first.draft_head_lag == SEQ - 1
    assert first.catch_up_draft_head() == SEQ - 1
    assert first.draft_head_lag == 0 and first.catch_up_draft_head() == 0
    nxt = int(ids[SEQ])
    assert first.draft(nxt, 4) == alone.draft(nxt, 4)
    for w in (alone, first):
        w.eval(ids[SEQ:-1], all_logits=False)
    assert first.draft_head_lag == 3  # the pair with ids[SEQ] was dropped after the draft, and 2 more
    assert first.catch_up_draft_head() == 3
    nxt = int(ids[-1])
    assert first.draft(nxt, 4) == alone.draft(nxt, 4)
    assert regolith.Model.load(path).window(8).catch_up_draft_head() == 0  # holds nothing


def test_a_long_catch_up_runs_in_prefill_chunks_with_the_same_drafts(tiny):
    """Many pairs to take in (a long prompt's first draft) run 128 at a time, so the head's scratch stays
    within what the prompt's evaluation held and the plan counts (one evaluation of all 1,199 held twice
    the plan); the drafts equal those of a head that took the pairs in 100 at a time."""
    path, ref = tiny
    ids = np.random.default_rng(7).integers(3, ref.cfg.vocab_size, 1001)
    model = regolith.Model.load(path)
    at_once, by_hundreds = model.window(1100), model.window(1100)
    for i in range(0, 1000, 500):  # as generation's prefill does, in chunks of 512 at most
        at_once.eval(ids[i : i + 500], all_logits=False)
    for i in range(0, 1000, 100):
        by_hundreds.eval(ids[i : i + 100], all_logits=False)
        assert by_hundreds.catch_up_draft_head() == (99 if i == 0 else 100)
    assert at_once.draft_head_lag == 999  # within the 1,024 pairs a window leaves for its first draft
    nxt = int(ids[1000])
    assert at_once.draft(nxt, 4) == by_hundreds.draft(nxt, 4)
    assert at_once.draft_head_lag == 0
    assert at_once._w.scratch_peak_bytes <= model.plan.sizes.scratch_bytes()


HELD = 1024  # MtpContext::kHeldRows


def test_a_long_context_holds_a_bounded_number_of_hidden_states(tiny):
    """A window holds its draft head's pending pairs up to MtpContext::kHeldRows (1,024), so its hidden states
    stay within the plan's MTP_BUFFER_ROWS however long the context: a head that has taken nothing in (it has
    not drafted) keeps the latest 1,024 pairs for its first draft, and one in use takes them in during the
    evaluation, drafting what a head caught up after every chunk drafts. A cut of its attention
    (``truncate_attention``, suffix cache reuse's) to within the held rows keeps the head's context (the same
    drafts as a window that never went further); one further back restarts the head after the kept tokens
    (its pairs before them are not taken in again)."""
    from regolith import model_sizes

    path, ref = tiny
    n = 3 * HELD
    ids = np.random.default_rng(8).integers(3, ref.cfg.vocab_size, 2 * n + 2)
    model = regolith.Model.load(path)
    assert model_sizes.MTP_BUFFER_ROWS >= HELD + 256 + 512
    lazy, eager = model.window(2 * n + 64), model.window(2 * n + 64)
    for w in (lazy, eager):
        for i in range(0, n, 512):
            w.eval(ids[i : i + 512], all_logits=False)
            assert w.draft_head_lag <= HELD
        assert w.draft_head_lag == HELD  # nothing drafted: the latest pairs wait for the first draft
        assert len(w.draft(int(ids[n]), 4)) == 4  # the head is in use from now on
    for i in range(n, 2 * n, 512):
        lazy.eval(ids[i : i + 512], all_logits=False)
        assert lazy.draft_head_lag <= HELD  # taken in during the evaluation past 1,024
        eager.eval(ids[i : i + 512], all_logits=False)
        eager.catch_up_draft_head()
    nxt = int(ids[2 * n])
    assert lazy.draft(nxt, 4) == eager.draft(nxt, 4)

    # within the held rows: the head keeps its context
    cut = 2 * n - 100
    for w in (lazy, eager):
        w.truncate_attention(cut)
        w.eval(ids[cut : cut + 10], all_logits=False)
        assert w.draft_head_lag == 10  # from the pair of the last kept token on: its hidden state was held
    assert lazy.draft(int(ids[cut + 10]), 4) == eager.draft(int(ids[cut + 10]), 4)
    # further back: the head restarts after the kept tokens, and takes in only what follows them
    lazy.truncate_attention(cut - 2 * HELD)
    assert lazy.draft_head_lag == 0
    lazy.eval(ids[cut - 2 * HELD : cut - 2 * HELD + 10], all_logits=False)
    assert lazy.draft_head_lag == 9
    assert len(lazy.draft(int(ids[cut - 2 * HELD + 10]), 4)) == 4


def test_gguf_without_nextn_tensors_has_no_mtp(tmp_path):
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    path = convert(save_tiny_model(tmp_path / "hf", 1, **OVERRIDES), tmp_path / "plain.gguf", "f32")
    m = regolith.Model.load(path)
    assert not m.config["mtp"]
    w = m.window(32)
    w.eval([5, 6, 7])
    assert not w.has_draft_head and w.draft(8, 3) == []


def test_mtp_head_streams_its_experts(tiny, tmp_path):
    """With an expert arena (from the GGUF, or a packed directory) the head's experts stream like the main
    layers' (regolith pack stores every block's experts): same drafts, same logits."""
    from regolith import model_sizes
    from regolith import pack as pk

    path, ref = tiny
    ids = np.random.default_rng(5).integers(3, ref.cfg.vocab_size, SEQ)

    def drafts(model):
        w = model.window(64)
        logits = w.eval(ids[:-1])
        return logits, w.draft(int(ids[-1]), 4)

    want = drafts(regolith.Model.load(path))
    packed = pk.pack(path, tmp_path / "tiny.pack")
    for src in (path, packed):
        dense = pk.open_packed(src).dense if pk.is_packed(src) else src
        with regolith.gguf.open(dense) as f:
            manifest = pk.open_packed(src).manifest if pk.is_packed(src) else None
            slot = model_sizes.sizes_from_gguf(f.tensors, f.metadata, manifest).slot_bytes
        logits, got = drafts(regolith.Model.load(src, arena_gb=3 * slot / 2**30))
        np.testing.assert_array_equal(logits, want[0])
        assert got == want[1]
