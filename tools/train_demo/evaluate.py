"""Evidence for the demo model, on CPU: perplexity (torch fp32 vs regolith), router statistics, MTP acceptance.

- Perplexity: the first ``--windows`` non-overlapping windows of ``--ctx`` tokens of heldout.bin, each from an
  empty context, every position but the first predicted; once by the training module (``model.py``, fp32) from
  the HF checkpoint, once per GGUF through ``regolith.Model.load(gguf).window(ctx).eval(ids)`` (numpy softmax).
- Router statistics (torch, same windows), per main MoE layer: expert load (max / mean, normalised entropy of the
  load, share of the 8 busiest experts), temporal locality (fraction of token t's experts that token t-1 also
  used), and layer-to-layer predictability (layer l+1's router applied to layer l's MoE input: fraction of layer
  l+1's chosen experts it names). Chance level for the overlaps is k / E.
- MTP acceptance (torch): at every position t, the MTP head fed h_t and the true token t+1; top-1 acceptance =
  how often its argmax equals the main model's greedy prediction at t+1 (argmax of the logits at t+1).
- The routing trace (``--trace``): the first ``--trace-tokens`` held-out tokens as one window (one context, as a
  decode would see them), per token and main MoE layer the chosen expert ids and weights, saved as .npz.

Usage: ``python -m tools.train_demo.evaluate HF_DIR --data DIR --gguf A.gguf [--gguf B.gguf] --out report.json``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tools.train_demo.model import Config, Qwen4ExpLM


def load_model(hf_dir: Path) -> Qwen4ExpLM:
    """The training module (fp32, eval mode) with the checkpoint's weights."""
    model = Qwen4ExpLM(Config.from_dict(json.loads((hf_dir / "config.json").read_text())))
    model.load_state_dict(load_file(str(hf_dir / "model.safetensors")))
    return model.eval()


def nll_numpy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-position negative log-likelihood from float logits [n, V] (float64 log-softmax)."""
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(-1)) + m[:, 0]
    return lse - x[np.arange(len(targets)), targets]


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over rows of |set(a_i) & set(b_i)| / k for id arrays [n, k]."""
    hits = (a[:, :, None] == b[:, None, :]).any(-1).sum(-1)
    return float(hits.mean() / a.shape[1])


@torch.no_grad()
def torch_pass(model: Qwen4ExpLM, ids: torch.Tensor) -> dict:
    """Per-window NLL, routing, MTP agreement for ids [W, T]."""
    aux: dict = {}
    h = model.hidden(ids, aux)
    logits = model.lm_head(h)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    greedy = logits.argmax(-1)  # [W, T]: main model's prediction of token t+1
    mtp_logits = model.lm_head(model.mtp_hidden(h[:, :-1], ids[:, 1:]))
    draft = mtp_logits.argmax(-1)  # [W, T-1]: MTP's prediction of token t+2
    return {
        "nll": nll.numpy(),
        "router_ids": [r.numpy() for r in aux["router_ids"]],
        "moe_inputs": aux["moe_inputs"],
        "accept": (draft[:, :-1] == greedy[:, 1:-1]).float().mean().item(),
        "mtp_true": (draft[:, :-1] == ids[:, 2:]).float().mean().item(),
        "main_true": (greedy[:, :-1] == ids[:, 1:]).float().mean().item(),
    }


def router_stats(model: Qwen4ExpLM, ids: torch.Tensor, router_ids: list, moe_inputs: list) -> list[dict]:
    """Per main MoE layer: load skew, temporal locality, predictability from the previous layer's input."""
    W, T = ids.shape
    E = model.cfg.num_experts
    out = []
    layers = model.model.layers
    for li in range(len(layers)):
        chosen = router_ids[li].reshape(W, T, -1)
        load = np.bincount(chosen.ravel(), minlength=E) / chosen.size
        p = load[load > 0]
        row = {
            "layer": li,
            "load_max_over_mean": float(load.max() * E),
            "load_entropy_norm": float(-(p * np.log(p)).sum() / np.log(E)),
            "top8_share": float(np.sort(load)[::-1][:8].sum()),
            "unused_experts": int((load == 0).sum()),
            "temporal_locality": overlap(
                chosen[:, 1:].reshape(-1, chosen.shape[-1]), chosen[:, :-1].reshape(-1, chosen.shape[-1])
            ),
        }
        if li + 1 < len(layers):
            with torch.no_grad():
                _, pred, _ = layers[li + 1].mlp.route(moe_inputs[li].reshape(-1, model.cfg.hidden_size))
            row["next_layer_predictability"] = overlap(pred.numpy(), router_ids[li + 1])
        out.append(row)
    return out


def regolith_nll(gguf: Path, windows: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-position NLL of every window through regolith, and the seconds it took."""
    import regolith

    model = regolith.Model.load(str(gguf))
    t0 = time.time()
    parts = []
    for w in windows:
        win = model.window(len(w))
        logits = win.eval(w.tolist())
        parts.append(nll_numpy(logits[:-1], w[1:]))
    return np.concatenate(parts), time.time() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, action="append", default=[])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--trace", type=Path, help="write the routing trace (.npz) here")
    ap.add_argument("--trace-tokens", type=int, default=2000)
    ap.add_argument("--out", type=Path, required=True, help="report (JSON)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(args.hf_dir)
    held = np.fromfile(args.data / "heldout.bin", dtype=np.uint16).astype(np.int64)
    n = min(args.windows, len(held) // args.ctx)
    windows = held[: n * args.ctx].reshape(n, args.ctx)
    report: dict = {"ctx": args.ctx, "windows": n, "tokens_scored": n * (args.ctx - 1)}

    t0 = time.time()
    nll, routes, inputs = [], [[] for _ in model.model.layers], [[] for _ in model.model.layers]
    acc = {"accept": [], "mtp_true": [], "main_true": []}
    for i in range(0, n, args.batch):
        r = torch_pass(model, torch.from_numpy(windows[i : i + args.batch]))
        nll.append(r["nll"])
        for li in range(len(routes)):
            routes[li].append(r["router_ids"][li])
            inputs[li].append(r["moe_inputs"][li].reshape(-1, model.cfg.hidden_size))
        for k, values in acc.items():
            values.append(r[k])
    torch_nll = np.concatenate(nll)
    report["torch_seconds"] = time.time() - t0
    report["torch_fp32"] = {"nll": float(torch_nll.mean()), "ppl": float(np.exp(torch_nll.mean()))}
    report["mtp"] = {k: float(np.mean(v)) for k, v in acc.items()}
    ids_t = torch.from_numpy(windows)
    report["router"] = router_stats(
        model, ids_t, [np.concatenate(r) for r in routes], [torch.cat(x) for x in inputs]
    )
    report["router_chance_overlap"] = model.cfg.num_experts_per_tok / model.cfg.num_experts
    for g in args.gguf:
        r_nll, secs = regolith_nll(g, windows)
        ppl = float(np.exp(r_nll.mean()))
        report[f"regolith:{g.name}"] = {
            "nll": float(r_nll.mean()),
            "ppl": ppl,
            "ppl_rel_diff": ppl / report["torch_fp32"]["ppl"] - 1,
            "bytes": g.stat().st_size,
            "seconds": secs,
        }
    if args.trace:
        ids = torch.from_numpy(held[: args.trace_tokens])[None]
        aux: dict = {}
        with torch.no_grad():
            logits = model.lm_head(model.hidden(ids, aux))
            trace_nll = F.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
            weights = []
            for layer, u in zip(model.model.layers, aux["moe_inputs"], strict=True):
                _, _, w = layer.mlp.route(u.reshape(-1, model.cfg.hidden_size))
                weights.append(w.numpy())
        expert_ids = np.stack([r.numpy() for r in aux["router_ids"]], axis=1).astype(np.uint8)  # [T, L, k]
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            args.trace,
            tokens=ids[0].numpy().astype(np.uint16),
            expert_ids=expert_ids,
            expert_weights=np.stack(weights, axis=1).astype(np.float16),
            moe_layers=np.arange(len(model.model.layers), dtype=np.int16),
            num_experts=np.int16(model.cfg.num_experts),
        )
        report["trace"] = {
            "path": str(args.trace),
            "tokens": int(ids.shape[1]),
            "bytes": args.trace.stat().st_size,
            "nll": trace_nll,
        }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
