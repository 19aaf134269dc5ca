"""Train the demo qwen4_exp (+ MTP) on the corpus of ``corpus.py``; resumable, time-budgeted.

Loss = LM cross-entropy + ``--mtp-weight`` x MTP cross-entropy (joint training; the MTP head reads the main
model's final hidden state without detaching it) + ``router_aux_loss_coef`` x the Switch load-balancing loss
(mean over MoE layers, 1.0 when balanced) + the QSA indexers' distillation KL (their input detached, so it
trains the indexers only: the LM loss cannot reach them through the top-k selection).

The learning rate follows the *training time*: linear warmup over ``--warmup`` steps, then a cosine from
``--lr`` to ``--lr`` / 10 as the training time goes from 0 to ``--train-seconds``; the run stops there (or at
``--stop-after`` seconds of this invocation, to be resumed). Batches are non-overlapping windows of
``--seq`` + 1 tokens of train.bin in a seeded random order per epoch. A checkpoint (model, AdamW, step,
data position, training time, RNG states) is written to ``--ckpt`` every ``--ckpt-every`` seconds and at
the end; ``--resume`` continues from it. At the end the weights go to ``--export`` as fp16 safetensors
shards (see ``export.py``). Logs to stdout, a CSV (``--csv``) every ``--log-every`` steps.

Usage: ``python -m tools.train_demo.train --data DIR --config config.json --ckpt DIR --export DIR ...``
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tools.train_demo.export import write_shards
from tools.train_demo.model import Config, Qwen4ExpLM


def losses(model: Qwen4ExpLM, batch: torch.Tensor, mtp_weight: float, balance_coef: float):
    """(total loss, {part: value}) for batch [B, T + 1] of token ids."""
    ids, labels = batch[:, :-1], batch[:, 1:]
    aux: dict = {}
    h = model.hidden(ids, aux)
    lm = F.cross_entropy(model.lm_head(h).float().flatten(0, 1), labels.flatten())
    # MTP: h_t with token t+1 predicts token t+2 = labels[:, t+1]
    m = model.mtp_hidden(h[:, :-1], ids[:, 1:], aux)
    mtp = F.cross_entropy(model.lm_head(m).float().flatten(0, 1), labels[:, 1:].flatten())
    E = model.cfg.num_experts
    balance = 0.0
    for logits, top in zip(aux["router_logits"], aux["router_ids"], strict=True):
        frac = (
            torch.zeros(E, device=batch.device).scatter_add_(
                0, top.flatten(), torch.ones(top.numel(), device=batch.device)
            )
            / top.numel()
        )
        balance = balance + E * (frac * logits.float().softmax(-1).mean(0)).sum()
    balance = balance / len(aux["router_logits"])
    kl = sum(aux["indexer_kl"])
    total = lm + mtp_weight * mtp + balance_coef * balance + kl
    return total, {"lm_loss": lm, "mtp_loss": mtp, "balance": balance, "indexer_kl": kl}


class Batches:
    """Non-overlapping windows of seq + 1 tokens in a seeded random order per epoch; ``pos`` = windows used."""

    def __init__(self, tokens: torch.Tensor, seq: int, seed: int, pos: int = 0) -> None:
        self.tokens, self.seq, self.seed, self.pos = tokens, seq, seed, pos
        self.n = (tokens.numel() - 1) // (seq + 1)
        self._epoch, self._perm = -1, None

    def next(self, batch: int) -> torch.Tensor:
        idx = []
        for _ in range(batch):
            epoch, i = divmod(self.pos, self.n)
            if epoch != self._epoch:
                self._epoch = epoch
                self._perm = torch.from_numpy(np.random.default_rng(self.seed + epoch).permutation(self.n))
            idx.append(int(self._perm[i]))
            self.pos += 1
        starts = torch.tensor(idx, device=self.tokens.device) * (self.seq + 1)
        return self.tokens[starts[:, None] + torch.arange(self.seq + 1, device=self.tokens.device)]


def lr_at(step: int, progress: float, args) -> float:
    warm = min(1.0, (step + 1) / args.warmup)
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return args.lr * warm * (0.1 + 0.9 * cos)


@torch.no_grad()
def heldout_loss(model: Qwen4ExpLM, tokens: torch.Tensor, seq: int, batch: int, dtype) -> float:
    """Mean LM cross-entropy over the first ``batch`` windows of the held-out tokens."""
    n = min(batch, (tokens.numel() - 1) // (seq + 1))
    x = tokens[: n * (seq + 1)].view(n, seq + 1)
    with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = model(x[:, :-1])
    return float(F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()))


def save_checkpoint(path: Path, model, opt, step: int, data: Batches, train_time: float, tokens: int) -> None:
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "step": step,
        "data_pos": data.pos,
        "train_time": train_time,
        "tokens": tokens,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="corpus.py's output (train.bin, heldout.bin)")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--ckpt", type=Path, required=True, help="checkpoint directory (last.pt)")
    ap.add_argument("--export", type=Path, help="write fp16 safetensors shards here at the end")
    ap.add_argument("--csv", type=Path, help="loss curve CSV (appended on resume)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--train-seconds", type=float, required=True, help="length of the LR schedule")
    ap.add_argument("--stop-after", type=float, default=float("inf"), help="wall seconds for this invocation")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--ckpt-every", type=float, default=120.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    start = time.time()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    raw = json.loads(args.config.read_text())
    cfg = Config.from_dict(raw)
    train = torch.from_numpy(np.fromfile(args.data / "train.bin", dtype=np.uint16).astype(np.int64)).to(dev)
    held = torch.from_numpy(np.fromfile(args.data / "heldout.bin", dtype=np.uint16).astype(np.int64)).to(dev)
    torch.manual_seed(args.seed)
    model = Qwen4ExpLM(cfg).to(dev)
    indexer_params = [p for n, p in model.named_parameters() if ".indexer." in n]
    main_params = [p for n, p in model.named_parameters() if ".indexer." not in n]
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=dev.type == "cuda",
    )
    args.ckpt.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.ckpt / "last.pt"
    step, train_time, tokens_seen, pos = 0, 0.0, 0, 0
    if args.resume and ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=dev, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, pos, train_time, tokens_seen = (
            state["step"],
            state["data_pos"],
            state["train_time"],
            state["tokens"],
        )
        torch.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        print(f"resumed at step {step}, {tokens_seen} tokens, {train_time:.1f} s of training", flush=True)
    data = Batches(train, args.seq, args.seed, pos)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"params {n_params} ({n_params / 1e6:.2f}M), train tokens {train.numel()}, held-out {held.numel()}, "
        f"windows/epoch {data.n}, device {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}, "
        f"torch {torch.__version__}",
        flush=True,
    )
    print("args", json.dumps({k: str(v) for k, v in vars(args).items()}), flush=True)

    with contextlib.ExitStack() as stack:
        fn = torch.compile(losses) if args.compile else losses
        writer = None
        if args.csv:
            new = not (args.resume and args.csv.exists())
            fh = stack.enter_context(open(args.csv, "a" if not new else "w", newline=""))
            writer = csv.writer(fh)
            if new:
                writer.writerow(
                    ["step", "tokens", "train_seconds", "lr", "loss", "lm_loss", "mtp_loss", "balance",
                     "indexer_kl", "tokens_per_s", "heldout_loss"]
                )  # fmt: skip
        last_ckpt = time.time()
        window_t, window_tok, first = time.time(), 0, True
        model.train()
        while train_time < args.train_seconds and (args.max_steps is None or step < args.max_steps):
            if time.time() - start > args.stop_after:
                break
            t0 = time.time()
            lr = lr_at(step, train_time / args.train_seconds, args)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = data.next(args.batch)
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                total, parts = fn(model, batch, args.mtp_weight, raw.get("router_aux_loss_coef", 0.01))
            opt.zero_grad(set_to_none=True)
            total.backward()
            # the indexers learn from their own KL loss only: clip them apart so they cannot shrink the LM step
            torch.nn.utils.clip_grad_norm_(main_params, 1.0)
            torch.nn.utils.clip_grad_norm_(indexer_params, 1.0)
            opt.step()
            step += 1
            n_tok = batch.shape[0] * (batch.shape[1] - 1)
            tokens_seen += n_tok
            window_tok += n_tok
            if step % args.log_every == 0 or first:
                vals = {k: float(v.detach()) for k, v in parts.items()}  # syncs
                total_f = float(total.detach())
                tps = window_tok / (time.time() - window_t)
                ho = ""
                if step % args.eval_every == 0:
                    model.eval()
                    ho = f"{heldout_loss(model, held, args.seq, 32, dtype):.4f}"
                    model.train()
                print(
                    f"step {step} tok {tokens_seen} t {train_time:.0f}s lr {lr:.2e} loss {total_f:.4f} "
                    + " ".join(f"{k} {v:.4f}" for k, v in vals.items())
                    + f" tok/s {tps:.0f}"
                    + (f" heldout {ho}" if ho else ""),
                    flush=True,
                )
                if writer:
                    writer.writerow(
                        [step, tokens_seen, f"{train_time:.1f}", f"{lr:.3e}", f"{total_f:.4f}"]
                        + [f"{vals[k]:.4f}" for k in ("lm_loss", "mtp_loss", "balance", "indexer_kl")]
                        + [f"{tps:.0f}", ho]
                    )
                    fh.flush()
                window_t, window_tok = time.time(), 0
            if not first:  # the first step of an invocation compiles: not training time
                train_time += time.time() - t0
            first = False
            if time.time() - last_ckpt > args.ckpt_every:
                save_checkpoint(ckpt_path, model, opt, step, data, train_time, tokens_seen)
                last_ckpt = time.time()
    model.eval()
    final = heldout_loss(model, held, args.seq, 64, dtype)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0
    print(
        f"done: step {step}, {tokens_seen} tokens, {train_time:.1f} s of training, held-out loss {final:.4f}, "
        f"peak GPU memory {peak:.1f} GiB"
    )
    save_checkpoint(ckpt_path, model, opt, step, data, train_time, tokens_seen)
    if args.export:
        for p in write_shards(model.state_dict(), args.export):
            print(f"wrote {p} ({p.stat().st_size} bytes)")
    print(f"wall {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
