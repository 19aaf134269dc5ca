"""Held-out perplexity fixture for the bundled demo model: transformers 5.24 (fp32) on the exported checkpoint.

    python -m tools.train_demo.make_ppl_fixture HF_DIR HELDOUT_BIN OUT.json [--windows 4] [--ctx 512]

Takes ``--windows`` windows of ``--ctx`` tokens spread evenly over the held-out token file (corpus.py's
``heldout.bin``) and writes their ids with transformers' mean next-token negative log-likelihood per window.
tests/test_demo_model.py checks that regolith's perplexity on the bundled GGUF agrees within 1%.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen4ExpForCausalLM


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("heldout", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    ids = np.fromfile(args.heldout, dtype=np.uint16).astype(np.int64)
    n_win = ids.size // args.ctx
    picks = np.linspace(0, n_win - 1, args.windows + 2)[1:-1].round().astype(int)
    model = Qwen4ExpForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    windows = []
    for w in picks:
        seq = ids[w * args.ctx : (w + 1) * args.ctx]
        with torch.no_grad():
            logits = model(torch.from_numpy(seq)[None]).logits[0].double()
        nll = torch.nn.functional.cross_entropy(logits[:-1], torch.from_numpy(seq[1:]), reduction="mean")
        windows.append({"window": int(w), "ids": seq.tolist(), "nll": float(nll)})
        print(f"window {w}: nll {float(nll):.5f}", flush=True)
    mean = float(np.mean([x["nll"] for x in windows]))
    args.out.write_text(
        json.dumps({"reference": "transformers 5.24.0 Qwen4ExpForCausalLM, fp32", "ctx": args.ctx,
                    "mean_nll": mean, "ppl": float(np.exp(mean)), "windows": windows}) + "\n"
    )  # fmt: skip


if __name__ == "__main__":
    main()
