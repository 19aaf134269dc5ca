"""lm-evaluation-harness against the live Qwen2.5-Coder-0.5B server, as its users run it: ``lm_eval --model
local-completions`` on a multiple-choice task defined in local files (no dataset download), the tokenizer
found through the server's /tokenize endpoints. Oracle: the library's own log-likelihood of each choice, the
log-softmax of its logits for the same token ids, computed here; lm-eval's numbers must be those, and its
accuracy the one they give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("lm_eval")

from tests.server.conftest import API_KEY, MODEL

DOCS = [
    ("Question: What is the capital of France?\nAnswer:", ["Paris", "Berlin", "Madrid"], 0),
    ("def add(a, b):\n    return a", ["+ b", "- b", "* b"], 0),
    ("The opposite of hot is", ["cold", "warm", "green"], 0),
    ("Question: How many legs does a spider have?\nAnswer:", ["six", "eight", "ten"], 1),
    ("import numpy as", ["np", "pd", "plt"], 1),
]

TASK = """\
task: regolith_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _loglikelihood(model, context: str, continuation: str) -> tuple[float, bool]:
    """The library's log-likelihood of ``continuation`` after ``context`` and whether each of its tokens is the
    most likely one, for the token ids lm-eval sends: it encodes the context and the whole text without
    special tokens (trailing spaces of the context moved to the continuation) and takes the continuation's
    ids as the whole's after the context's."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = model.tokenize(context, add_special=False)
    ids = model.tokenize(context + continuation, add_special=False)
    logits = model.window(len(ids) + 1).eval(ids).astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    rows = range(len(ctx) - 1, len(ids) - 1)  # row r predicts token r + 1
    ll = sum(float(logits[r, ids[r + 1]] - lse[r]) for r in rows)
    return ll, all(int(np.argmax(logits[r])) == ids[r + 1] for r in rows)


def test_lm_eval_local_completions_scores_the_library_loglikelihoods(server, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in DOCS)
    )
    (tmp_path / "regolith_mc.yaml").write_text(TASK.format(data=data))
    env = {
        **os.environ,
        "OPENAI_API_KEY": API_KEY,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    args = f"model={MODEL},base_url={server.url}/v1/completions,auth_token={API_KEY},max_length=1024"
    run = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args]
        + ["--tasks", "regolith_mc", "--include_path", str(tmp_path)]
        + ["--output_path", str(tmp_path / "out"), "--log_samples"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Using remote tokenizer" in run.stderr  # found /tokenize by itself
    (results,) = (tmp_path / "out").rglob("results_*.json")
    (samples,) = (tmp_path / "out").rglob("samples_regolith_mc_*.jsonl")

    model = server.app.state.server.model
    correct = []
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        question, choices, answer = DOCS[sample["doc_id"]]
        want = [_loglikelihood(model, question, " " + c) for c in choices]
        got = [(float(ll), greedy == "True") for ((ll, greedy),) in sample["resps"]]
        for (g, g_greedy), (w, w_greedy) in zip(got, want, strict=True):
            assert g == pytest.approx(w, rel=1e-12, abs=1e-12) and g_greedy == w_greedy
        correct.append(float(int(np.argmax([w for w, _ in want])) == answer))
    assert len(correct) == len(DOCS)
    acc = json.loads(results.read_text())["results"]["regolith_mc"]["acc,none"]
    assert acc == pytest.approx(np.mean(correct))
