"""A fast torch training module for qwen4_exp (text only) with regolith's one-depth MTP head.

Parameter names and semantics equal transformers 5.24's ``Qwen4ExpForCausalLM`` (``state_dict`` compatible; the
test ``tests/test_train_demo.py`` checks the logits), but every mixer is vectorised for training:

- QSA: block scores of every (query, block) pair in one einsum, top-k over blocks, one boolean mask, SDPA.
- Gated DeltaNet: the chunked scan (chunks of 64, a triangular solve per chunk, a loop over chunks only).
- MoE: every expert's SwiGLU as two dense matmuls over all experts, weighted by the (sparse) top-k routing
  weights, so unselected experts contribute exact zeros. With 64 small experts this is cheap on a GPU and
  needs no token permutation.

No KV cache: sequences are processed whole (training, perplexity). The MTP head follows
the agreed spec in docs/demo_model.md. Needs torch only (no transformers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

GDN_CHUNK = 64


@dataclass
class Config:
    """The qwen4_exp text config fields this module reads (names as in config.json)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: list[str]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_parameters: dict[str, Any]
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    hc_count: int
    hc_lowrank: int
    indexer_n_heads: int
    indexer_head_dim: int
    indexer_budget: int
    indexer_compress_ratio: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    eos_token_id: int
    ple_layer_ids: list[int] = field(default_factory=list)
    ple_embed_dim: int | None = None
    ple_conv_kernel_size: int = 4
    ngram_size: int = 3
    heads_per_ngram: int = 8
    ngram_vocab_size_base: int = 20_000_000
    make_ngram_vocab_size_divisible_by: int = 128
    seed: int = 1234
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    output_gate_type: str | None = None
    initializer_range: float = 0.02
    mtp_num_hidden_layers: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        """The fields of ``d`` (a config.json dict) that this module knows; ``full_attention`` reads as QSA."""
        names = cls.__dataclass_fields__
        kw = {k: v for k, v in d.items() if k in names}
        kw["layer_types"] = ["indexed_attention" if t == "full_attention" else t for t in kw["layer_types"]]
        eos = kw["eos_token_id"]
        kw["eos_token_id"] = eos[0] if isinstance(eos, list) else eos
        return cls(**kw)

    @property
    def ple_dim(self) -> int:
        return self.ple_embed_dim or self.hidden_size

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope_parameters.get("partial_rotary_factor", 1.0))


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: ``x / rms(x) * (1 + w)`` in fp32, per group of ``group`` features if given."""

    def __init__(self, dim: int, eps: float, group: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps, self.group = eps, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        if self.group is not None:
            y = y.unflatten(-1, (-1, self.group))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.group is not None:
            y = y.flatten(-2)
        return (y * (1.0 + self.weight.float())).type_as(x)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX RoPE on the first ``cos.shape[-1]`` features of x [..., T, heads, d]; cos/sin [T, rot]."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    xr = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((xr, xp), dim=-1)


def rope_tables(cfg: Config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim] for integer positions [T] (text positions: all mrope sections agree)."""
    dim = cfg.rotary_dim
    base = cfg.rope_parameters["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class GatedResidual(nn.Module):
    """A hyper-connection read (and, with ``combine``, the write weights) over hc streams."""

    def __init__(self, cfg: Config, combine: bool = True) -> None:
        super().__init__()
        n, h = cfg.hc_count, cfg.hidden_size
        self.n, self.h = n, h
        self.hc_norm = RMSNorm(n * h, cfg.rms_norm_eps, group=h)
        self.input_mix_weight_down = nn.Linear(n * h, cfg.hc_lowrank, bias=False)
        self.input_mix_weight_up = nn.Linear(cfg.hc_lowrank, n * h, bias=False)
        self.block_inject_weight = nn.Linear(n * h, n, bias=False) if combine else None

    def forward(self, x: torch.Tensor) -> Any:
        xn = self.hc_norm(x)  # [B, T, n*H]
        mix = torch.sigmoid(self.input_mix_weight_up(F.silu(self.input_mix_weight_down(xn) / self.n)))
        u = (mix.unflatten(-1, (self.n, self.h)) * xn.unflatten(-1, (self.n, self.h))).mean(-2)  # [B, T, H]
        if self.block_inject_weight is None:
            return u
        w = 2 * torch.sigmoid(self.block_inject_weight(xn) / self.n)  # [B, T, n]
        return u, w

    @staticmethod
    def write(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """X + [w_i * y]_i: the residual streams X [B, T, n*H] plus the block output y [B, T, H]."""
        return x + (y.unsqueeze(-2) * w.unsqueeze(-1)).flatten(-2)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet (linear attention) with a chunked scan in fp32."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.lk, self.lv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.lk * self.dk, self.lv * self.dv
        self.key_dim, self.value_dim = key_dim, value_dim
        conv_dim = 2 * key_dim + value_dim
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, cfg.linear_conv_kernel_dim, groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.lv))
        self.A_log = nn.Parameter(torch.empty(self.lv).uniform_(0.01, 16).log())
        self.norm = GatedNorm(self.dv, cfg.rms_norm_eps, cfg.output_gate_type or cfg.hidden_act)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.lv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.lv, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        k_size = self.conv1d.weight.shape[-1]
        qkv = self.in_proj_qkv(u).transpose(1, 2)  # [B, C, T]
        qkv = F.conv1d(F.pad(qkv, (k_size - 1, 0)), self.conv1d.weight, groups=qkv.shape[1])
        qkv = F.silu(qkv).transpose(1, 2)
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.lv // self.lk
        q = q.unflatten(-1, (self.lk, self.dk)).repeat_interleave(rep, dim=2)  # [B, T, lv, dk]
        k = k.unflatten(-1, (self.lk, self.dk)).repeat_interleave(rep, dim=2)
        v = v.unflatten(-1, (self.lv, self.dv))
        beta = torch.sigmoid(self.in_proj_b(u).float())  # [B, T, lv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(u).float() + self.dt_bias.float())
        o = chunk_gated_delta_rule(q, k, v, g, beta).to(u.dtype)  # [B, T, lv, dv]
        z = self.in_proj_z(u).unflatten(-1, (self.lv, self.dv))
        return self.out_proj(self.norm(o, z).flatten(-2))


class GatedNorm(nn.Module):
    """The GDN output norm: ``w * x / rms(x)`` (plain gamma) times ``act(z)``."""

    def __init__(self, dim: int, eps: float, act: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.act = eps, F.silu if act == "silu" else torch.sigmoid

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = self.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (y * self.act(z.float())).to(x.dtype)


def chunk_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """The gated delta rule over whole sequences from a zero state, chunked; returns [B, T, h, dv] in fp32.

    q, k [B, T, h, dk] (L2-normalised here, q scaled by dk^-1/2), v [B, T, h, dv], g (log decay) and beta [B, T, h].
    Per step: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
    """
    with torch.autocast(q.device.type, enabled=False):
        return _chunk_gated_delta_rule(q, k, v, g, beta)


def _chunk_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    B, T, h, dk = k.shape
    C = GDN_CHUNK
    pad = (C - T % C) % C
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))  # [B, h, T, d]
    g, beta = g.float().transpose(1, 2), beta.float().transpose(1, 2)  # [B, h, T]
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // C
    q, k, v = (x.unflatten(2, (n, C)) for x in (q, k, v))  # [B, h, n, C, d]
    g, beta = g.unflatten(2, (n, C)), beta.unflatten(2, (n, C))  # [B, h, n, C]
    cum = g.cumsum(-1)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()  # [.., C, C]
    kb = k * beta.unsqueeze(-1)
    a = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(C, dtype=a.dtype, device=a.device)
    rhs = torch.cat((v * beta.unsqueeze(-1), kb * cum.exp().unsqueeze(-1)), dim=-1)
    sol = torch.linalg.solve_triangular(a + eye, rhs, upper=False, unitriangular=True)
    u, w = sol[..., : v.shape[-1]], sol[..., v.shape[-1] :]
    intra = (q @ k.transpose(-1, -2)) * decay
    qd = q * cum.exp().unsqueeze(-1)
    kd = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    last = cum[..., -1].exp()[..., None, None]  # [B, h, n, 1, 1]
    state = q.new_zeros(B, h, dk, v.shape[-1])
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        outs.append(qd[:, :, i] @ state + intra[:, :, i] @ v_new)
        state = state * last[:, :, i] + kd[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).flatten(2, 3)[:, :, :T]
    return o.transpose(1, 2)


class QSAIndexer(nn.Module):
    """The QSA token indexer: index heads score compressed key blocks; weights as in transformers."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.ih, self.di = cfg.indexer_n_heads, cfg.indexer_head_dim
        self.ratio = cfg.indexer_compress_ratio
        self.top_blocks = cfg.indexer_budget // cfg.indexer_compress_ratio
        self.index_qk_proj = nn.Linear(cfg.hidden_size, (self.ih + 1) * self.di, bias=False)
        self.q_layernorm = RMSNorm(self.di, cfg.rms_norm_eps)
        self.k_layernorm = RMSNorm(self.di, cfg.rms_norm_eps)

    def block_scores(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Scores [B, T, nb] of every (query, block) pair (nb = T // ratio complete blocks), fp32."""
        T = u.shape[1]
        nb = T // self.ratio
        q, kt = torch.split(self.index_qk_proj(u), [self.ih * self.di, self.di], dim=-1)
        q = rope(self.q_layernorm(q.unflatten(-1, (self.ih, self.di))), cos, sin)  # [B, T, ih, di]
        kb = kt[:, : nb * self.ratio].unflatten(1, (nb, self.ratio)).float().mean(2).to(kt.dtype)
        starts = torch.arange(nb, device=u.device) * self.ratio
        kb = rope(self.k_layernorm(kb).unsqueeze(2), cos[starts], sin[starts]).squeeze(2)  # [B, nb, di]
        with torch.autocast(u.device.type, enabled=False):
            s = torch.einsum("bthd,bnd->bthn", q.float(), kb.float())
        return s.relu().sum(2) / math.sqrt(self.di)

    def selection(self, scores: torch.Tensor) -> torch.Tensor:
        """The boolean attention mask [B, 1, T, T]: causal, top blocks among complete ones, plus the tail."""
        B, T, nb = scores.shape
        dev = scores.device
        t = torch.arange(T, device=dev)
        complete = (torch.arange(nb, device=dev)[None, :] + 1) * self.ratio <= (t[:, None] + 1)  # [T, nb]
        masked = scores.masked_fill(~complete, float("-inf"))
        chosen = torch.zeros_like(complete).expand(B, T, nb).clone()
        if nb > 0:
            top = masked.topk(min(self.top_blocks, nb), dim=-1).indices
            chosen = chosen.scatter(-1, top, True) & complete
        s = torch.arange(T, device=dev)
        tail_start = ((t + 1) // self.ratio) * self.ratio  # [T]
        block_of = (s // self.ratio).clamp(max=max(nb - 1, 0))
        in_chosen = chosen[:, :, block_of] if nb > 0 else torch.zeros(B, T, T, dtype=torch.bool, device=dev)
        mask = (in_chosen | (s[None, :] >= tail_start[:, None])) & (s[None, :] <= t[:, None])
        return mask.unsqueeze(1)


class QSAttention(nn.Module):
    """Gated GQA attention restricted to the QSA indexer's selection."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.nh * self.hd * 2, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.indexer = QSAIndexer(cfg)

    def forward(
        self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, aux: dict[str, Any] | None = None
    ) -> torch.Tensor:
        q, gate = self.q_proj(u).unflatten(-1, (self.nh, 2 * self.hd)).chunk(2, dim=-1)
        q = rope(self.q_norm(q), cos, sin).transpose(1, 2)  # [B, nh, T, hd]
        k = rope(self.k_norm(self.k_proj(u).unflatten(-1, (self.nkv, self.hd))), cos, sin).transpose(1, 2)
        v = self.v_proj(u).unflatten(-1, (self.nkv, self.hd)).transpose(1, 2)
        index_in = u.detach() if aux is not None else u
        scores = self.indexer.block_scores(index_in, cos, sin)
        with torch.no_grad():
            mask = self.indexer.selection(scores)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd**-0.5)
        if aux is not None:
            aux.setdefault("indexer_kl", []).append(
                indexer_kl(q.detach(), k.detach(), scores, self.indexer.ratio)
            )
        o = o.transpose(1, 2).flatten(-2) * torch.sigmoid(gate.flatten(-2))
        return self.o_proj(o)


def indexer_kl(q: torch.Tensor, k: torch.Tensor, scores: torch.Tensor, ratio: int) -> torch.Tensor:
    """KL(dense causal attention mass per complete block || softmax of the indexer's block scores).

    The indexer only selects (no gradient reaches it through the LM loss), so it learns from this
    distillation loss, as DeepSeek-V3.2's lightning indexer does; q, k are detached [B, nh, T, hd].
    """
    B, _, T, hd = q.shape
    nb = scores.shape[-1]
    if nb == 0:
        return scores.sum() * 0
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        att = (q.float() @ k.float().transpose(-1, -2)) * hd**-0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1).mean(1)  # [B, T, T]
        mass = att[..., : nb * ratio].unflatten(-1, (nb, ratio)).sum(-1)  # [B, T, nb]
        t = torch.arange(T, device=q.device)
        complete = (torch.arange(nb, device=q.device)[None, :] + 1) * ratio <= (t[:, None] + 1)
        mass = mass * complete
        target = mass / mass.sum(-1, keepdim=True).clamp_min(1e-9)
        rows = complete.sum(-1) >= 2  # a query with one complete block has nothing to choose
    logp = scores.masked_fill(~complete, float("-inf")).log_softmax(-1)
    kl = (target * (target.clamp_min(1e-9).log() - logp.masked_fill(~complete, 0.0))).sum(-1)  # [B, T]
    return (kl * rows).sum() / (rows.sum() * B).clamp_min(1)


class Experts(nn.Module):
    """Routed SwiGLU experts as 3-D tensors (transformers' fused layout)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        E, H, Fi = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * Fi, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, Fi))

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H], weights [N, E] (zero for unselected experts) -> [N, H]."""
        E, twoF, H = self.gate_up_proj.shape
        gu = (x @ self.gate_up_proj.reshape(E * twoF, H).t()).unflatten(-1, (E, twoF))  # [N, E, 2F]
        gate, up = gu.chunk(2, dim=-1)
        act = F.silu(gate) * up * weights.unsqueeze(-1).to(gu.dtype)  # [N, E, F]
        return act.flatten(1) @ self.down_proj.permute(0, 2, 1).reshape(E * twoF // 2, H)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))


class SparseMoe(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits [N, E], top-k ids [N, k], top-k weights [N, k] (fp32) for x [N, H]."""
        logits = F.linear(x, self.gate.weight)
        probs = logits.float().softmax(-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        return logits, top_i, top_w

    def forward(self, u: torch.Tensor, aux: dict[str, Any] | None = None) -> torch.Tensor:
        B, T, H = u.shape
        x = u.reshape(-1, H)
        logits, top_i, top_w = self.route(x)
        dense_w = torch.zeros_like(logits, dtype=torch.float32).scatter(-1, top_i, top_w).to(logits.dtype)
        y = self.experts(x, dense_w)
        y = y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if aux is not None:
            aux.setdefault("router_logits", []).append(logits)
            aux.setdefault("router_ids", []).append(top_i)
        return y.reshape(B, T, H)


def _is_prime(v: int) -> bool:
    if v < 2:
        return False
    if v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


def _splitmix64(v: int) -> int:
    m = (1 << 64) - 1
    v = (v + 0x9E3779B97F4A7C15) & m
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & m
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & m
    return (v ^ (v >> 31)) & m


class NGramEmbedding(nn.Module):
    """PLE's hashed n-gram table (orders 2..ngram_size, heads_per_ngram prime-sized heads each)."""

    def __init__(self, cfg: Config, ple_index: int) -> None:
        super().__init__()
        self.g, self.hpn, self.eos = cfg.ngram_size, cfg.heads_per_ngram, cfg.eos_token_id
        heads = (self.g - 1) * self.hpn
        sizes, offsets, total, prime = [], [], 0, cfg.ngram_vocab_size_base - 1
        for _ in range(ple_index * heads):
            prime += 1
            while not _is_prime(prime):
                prime += 1
        for _ in range(heads):
            prime += 1
            while not _is_prime(prime):
                prime += 1
            sizes.append(prime)
            offsets.append(total)
            total += prime
        half = max(1, (((1 << 63) - 1) // max(cfg.vocab_size, 1)) // 2)
        base = cfg.seed + 10007 * ple_index
        mults = [
            2 * (_splitmix64((base + 0x9E3779B97F4A7C15 * (i + 1)) & ((1 << 64) - 1)) % half) + 1
            for i in range(self.g)
        ]
        self.layer_multipliers = nn.Buffer(torch.tensor(mults, dtype=torch.long))
        self.ngram_heads_vocab_sizes = nn.Buffer(torch.tensor(sizes, dtype=torch.long))
        self.ngram_heads_offsets = nn.Buffer(torch.tensor(offsets, dtype=torch.long))
        div = cfg.make_ngram_vocab_size_divisible_by
        self.ngram_embedding = nn.Embedding(math.ceil(total / div) * div, cfg.ple_dim // heads)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] (a whole sequence, n-grams reset at EOS and at the start) -> [B, T, ple_dim]."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)
        eos_pos = torch.where(ids == self.eos, pos, -1)
        prev = torch.cat((eos_pos.new_full((B, 1), -1), torch.cummax(eos_pos, dim=1).values[:, :-1]), dim=1)
        in_seg = pos[None, :] - (prev + 1)
        shifted = [ids]
        for s in range(1, self.g):
            src = F.pad(ids, (s, 0), value=self.eos)[:, :T]
            shifted.append(torch.where(in_seg >= s, src, torch.full_like(ids, self.eos)))
        blocks = []
        for order in range(2, self.g + 1):
            mixed = shifted[0] * self.layer_multipliers[0]
            for p in range(1, order):
                mixed = torch.bitwise_xor(mixed, shifted[p] * self.layer_multipliers[p])
            lo = (order - 2) * self.hpn
            sizes = self.ngram_heads_vocab_sizes[lo : lo + self.hpn]
            blocks.append(
                torch.remainder(mixed.unsqueeze(-1), sizes) + self.ngram_heads_offsets[lo : lo + self.hpn]
            )
        return self.ngram_embedding(torch.cat(blocks, dim=-1)).flatten(-2)


class PLELayer(nn.Module):
    """Per-layer embedding: gated hashed n-gram values added to every stream, plus a dilated causal conv."""

    def __init__(self, cfg: Config, ple_index: int) -> None:
        super().__init__()
        n, H, P = cfg.hc_count, cfg.hidden_size, cfg.ple_dim
        self.n, self.H = n, H
        self.ple_embedding = NGramEmbedding(cfg, ple_index)
        self.dilation = cfg.ngram_size
        self.key_proj = nn.Linear(P, n * H, bias=False)
        self.value_proj = nn.Linear(P, H, bias=False)
        self.norm_key = RMSNorm(n * H, cfg.rms_norm_eps, group=H)
        self.norm_query = RMSNorm(n * H, cfg.rms_norm_eps, group=H)
        self.norm_conv = RMSNorm(n * H, cfg.rms_norm_eps, group=H)
        self.conv1d = nn.Conv1d(
            n * H, n * H, cfg.ple_conv_kernel_size, groups=n * H, dilation=self.dilation, bias=False
        )

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        e = self.ple_embedding(ids).to(x.dtype)
        key = self.norm_key(self.key_proj(e)).unflatten(-1, (self.n, self.H))
        value = self.value_proj(e)
        query = self.norm_query(x).unflatten(-1, (self.n, self.H))
        s = (key * query).sum(-1, keepdim=True) / math.sqrt(self.H)
        s = s.abs().clamp_min(1e-6).sqrt() * s.sign()
        gv = (torch.sigmoid(s) * value.unsqueeze(-2)).flatten(-2)  # [B, T, n*H]
        pad = (self.conv1d.weight.shape[-1] - 1) * self.dilation
        c = F.conv1d(
            F.pad(self.norm_conv(gv).transpose(1, 2), (pad, 0)),
            self.conv1d.weight,
            dilation=self.dilation,
            groups=gv.shape[-1],
        )
        return gv + F.silu(c).transpose(1, 2)


class DecoderLayer(nn.Module):
    """[PLE] -> HC read -> GDN or QSA -> HC write -> HC read -> MoE -> HC write."""

    def __init__(self, cfg: Config, layer_type: str, ple_index: int | None) -> None:
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = QSAttention(cfg)
        self.mlp = SparseMoe(cfg)
        self.ple = PLELayer(cfg, ple_index) if ple_index is not None else None
        self.attn_hyper_connection = GatedResidual(cfg)
        self.mlp_hyper_connection = GatedResidual(cfg)

    def forward(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        aux: dict[str, Any] | None,
    ) -> torch.Tensor:
        if self.ple is not None:
            x = x + self.ple(x, ids)
        u, w = self.attn_hyper_connection(x)
        if self.layer_type == "linear_attention":
            y = self.linear_attn(u)
        else:
            y = self.self_attn(u, cos, sin, aux)
        x = GatedResidual.write(x, y, w)
        u, w = self.mlp_hyper_connection(x)
        if aux is not None:
            aux.setdefault("moe_inputs", []).append(u)
        return GatedResidual.write(x, self.mlp(u, aux), w)


class TextModel(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        ple = [i - 1 for i in cfg.ple_layer_ids]
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, t, ple.index(i) if i in ple else None) for i, t in enumerate(cfg.layer_types)
        )
        self.hyper_connection_mixer = GatedResidual(cfg, combine=False)


class MTP(nn.Module):
    """One MTP depth (docs/demo_model.md): h_t and token t+1 -> logits for token t+2."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.hc = cfg.hc_count
        self.pre_fc_norm_embedding = RMSNorm(H, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(H, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "indexed_attention", None)])
        self.hyper_connection_mixer = GatedResidual(cfg, combine=False)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)

    def forward(
        self,
        h: torch.Tensor,
        emb: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        aux: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        """h [B, T, H] (main hidden at t), emb [B, T, H] (embedding of token t+1), cos/sin at positions t+1.

        Returns the normalised output [B, T, H] that the shared lm_head reads.
        """
        z = self.fc(torch.cat((self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(h)), dim=-1))
        s = z.repeat(1, 1, self.hc)
        s = self.layers[0](s, None, cos, sin, aux)
        return self.norm(self.hyper_connection_mixer(s))


class Qwen4ExpLM(nn.Module):
    """``Qwen4ExpForCausalLM``-compatible LM (+ ``mtp.*`` when ``mtp_num_hidden_layers`` is 1)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TextModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MTP(cfg) if cfg.mtp_num_hidden_layers else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """transformers' initialisation: normal(0, initializer_range) matrices, zero-centred norms at 0."""
        std = self.cfg.initializer_range
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                mod.weight.normal_(0.0, std)
            elif isinstance(mod, RMSNorm):
                mod.weight.zero_()
            elif isinstance(mod, Experts):
                mod.gate_up_proj.normal_(0.0, std)
                mod.down_proj.normal_(0.0, std)
            elif isinstance(mod, Router):
                mod.weight.normal_(0.0, std)
            elif isinstance(mod, GatedDeltaNet):
                mod.dt_bias.fill_(1.0)
                mod.A_log.copy_(torch.empty_like(mod.A_log).uniform_(0.01, 16).log())
                mod.norm.weight.fill_(1.0)
                mod.conv1d.weight.normal_(0.0, std)
            elif isinstance(mod, PLELayer):
                mod.conv1d.weight.zero_()

    def hidden(self, ids: torch.Tensor, aux: dict[str, Any] | None = None) -> torch.Tensor:
        """The final hidden state [B, T, H] (``hyper_connection_mixer`` output) for ids [B, T]."""
        T = ids.shape[1]
        cos, sin = rope_tables(self.cfg, torch.arange(T, device=ids.device))
        x = self.model.embed_tokens(ids).repeat(1, 1, self.cfg.hc_count)
        for layer in self.model.layers:
            x = layer(x, ids, cos, sin, aux)
        return self.model.hyper_connection_mixer(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V]."""
        return self.lm_head(self.hidden(ids))

    def mtp_hidden(
        self, h: torch.Tensor, next_ids: torch.Tensor, aux: dict[str, Any] | None = None
    ) -> torch.Tensor:
        """MTP output [B, T', H] for h = hidden at positions 0..T'-1 and next_ids = tokens 1..T' (RoPE 1..T')."""
        T = next_ids.shape[1]
        cos, sin = rope_tables(self.cfg, torch.arange(1, T + 1, device=h.device))
        return self.mtp(h, self.model.embed_tokens(next_ids), cos, sin, aux)
