"""MTP draft acceptance of a model's own head, measured in regolith (default: the bundled demo model).

    python benchmarks/bench_mtp.py [--model regolith-demo] [--depth 3] [--markdown]

On the held-out windows of tests/fixtures/demo/heldout_ppl.json (text the demo model never trained on),
teacher-forced: after the window holds tokens 0..t, the head drafts ``--depth`` tokens following the true
token t+1 (``Window.draft``), and draft k is accepted when it equals the main model's greedy choice at
t+1+k given the true tokens before it and every earlier draft accepted (what greedy speculative
verification accepts). Reports acceptance by draft position, the expected tokens per verification round
when drafting 1..depth tokens, and the time of one draft token against one decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import regolith

FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "demo" / "heldout_ppl.json"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="regolith-demo")
    ap.add_argument("--depth", type=int, default=3, help="draft tokens per position")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    model = regolith.Model.load(args.model, n_ctx=1024)
    windows = [np.asarray(w["ids"], dtype=np.int32) for w in json.loads(FIXTURE.read_text())["windows"]]
    accepted = np.zeros(args.depth)  # positions whose drafts 0..k were all accepted
    positions = 0
    draft_s = step_s = 0.0
    for ids in windows:
        w = model.window(len(ids) + 1)
        greedy = []  # the main model's argmax after each prefix
        t0 = time.perf_counter()
        for tok in ids:
            greedy.append(int(w.eval([int(tok)])[-1].argmax()))
        step_s += time.perf_counter() - t0
        w = model.window(len(ids) + 1)
        for t in range(len(ids) - 1 - args.depth):
            w.eval([int(ids[t])])
            t0 = time.perf_counter()
            drafts = w.draft(int(ids[t + 1]), args.depth)
            draft_s += time.perf_counter() - t0
            positions += 1
            for k, d in enumerate(drafts):
                # accepted if it is the main model's greedy token after true tokens up to t+1+k
                if all(int(ids[t + 2 + j]) == drafts[j] for j in range(k)) and d == greedy[t + 1 + k]:
                    accepted[k] += 1
                else:
                    break
    rate = accepted / positions
    decode_ms = 1e3 * step_s / sum(len(x) for x in windows)
    draft_ms = 1e3 * draft_s / positions / args.depth
    rows = [[str(k + 1), f"{rate[k]:.1%}", f"{1 + rate[: k + 1].sum():.2f}"] for k in range(args.depth)]
    title = (
        f"{args.model}: MTP drafts on {positions} held-out positions; decode step {decode_ms:.2f} ms, "
        f"draft token {draft_ms:.2f} ms"
    )
    head = ["draft length", "accepted at this position", "tokens per round (drafting this many)"]
    if args.markdown:
        print(f"\n{title}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    table = Table(title=title)
    for h in head:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)


if __name__ == "__main__":
    main()
