"""The bundled demo model (issue 10): a trained qwen4exp MoE with an MTP head inside the package.

The reference is transformers 5.24 running the exported fp32 checkpoint (tools/train_demo/make_ppl_fixture.py
wrote its held-out NLL to tests/fixtures/demo/heldout_ppl.json): regolith's perplexity on the shipped Q8_0
GGUF must agree within 1%.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import regolith
from regolith import models
from regolith.speculative import Speculation

FIXTURE = Path(__file__).parent / "fixtures" / "demo" / "heldout_ppl.json"


@pytest.fixture(scope="module")
def demo() -> regolith.Model:
    return regolith.Model.load(n_ctx=1024)


def _nll(logits: np.ndarray, ids: np.ndarray) -> float:
    """Mean next-token negative log-likelihood of ids[1:] under logits[:-1], in float64."""
    lg = logits[:-1].astype(np.float64)
    top = lg.max(axis=1, keepdims=True)
    lse = np.log(np.exp(lg - top).sum(axis=1)) + top[:, 0]
    return float((lse - lg[np.arange(len(ids) - 1), ids[1:]]).mean())


def test_the_default_model_is_the_bundled_demo(demo):
    path = models.resolve_model(None)
    assert (
        models.DEFAULT_MODEL == "regolith-demo"
        and path == Path(models.__file__).parent / models.KNOWN_MODELS["regolith-demo"].bundled
    )
    assert path.stat().st_size <= 40 * 2**20
    assert demo.config["architecture"] == "qwen4exp" and demo.config["num_experts"] == 64
    assert demo.window(64).has_draft_head  # the MTP head is in the GGUF


def test_heldout_perplexity_matches_transformers_within_1_percent(demo):
    fx = json.loads(FIXTURE.read_text())
    nlls = []
    for w in fx["windows"]:
        ids = np.asarray(w["ids"], dtype=np.int32)
        nlls.append(_nll(demo.window(len(ids)).eval(ids), ids))
    ppl = float(np.exp(np.mean(nlls)))
    assert abs(ppl / fx["ppl"] - 1) < 0.01, (ppl, fx["ppl"])
    # and per window, so no window's error hides behind another's
    for got, w in zip(nlls, fx["windows"], strict=True):
        assert abs(got - w["nll"]) < 0.02, (w["window"], got, w["nll"])


def test_streamed_through_a_small_arena_bit_identical(demo):
    ids = np.asarray(json.loads(FIXTURE.read_text())["windows"][0]["ids"][:96], dtype=np.int32)
    streamed = regolith.Model.load(arena_gb=0.004, n_ctx=1024)
    assert streamed.plan.streaming and streamed.plan.arena_slots < streamed.plan.sizes.n_experts_total / 4
    np.testing.assert_array_equal(_chunked(streamed, ids), _chunked(demo, ids))
    st = streamed.stats()
    # trained routing reuses experts: the hit rate beats the arena's share of the experts
    assert st["hit_rate"] > streamed.plan.arena_slots / streamed.plan.sizes.n_experts_total
    assert st["prefetch_hits"] > 0


def _chunked(model: regolith.Model, ids: np.ndarray) -> np.ndarray:
    w = model.window(128)
    return np.concatenate([w.eval(ids[:32]), *(w.eval(ids[i : i + 1]) for i in range(32, 96))])


def test_mtp_drafts_are_accepted_and_exact(demo):
    """Greedy decoding with MTP drafts gives the tokens plain greedy decoding gives, and a trained head's drafts
    are often right (a random head's almost never are)."""
    prompt = "class Stack:\n    def __init__(self):\n"
    plain = demo.generate(prompt, max_tokens=48, temperature=0, speculative=False)
    # drafts of 2 every step, no cost gate (the gate would skip drafting where it does not pay)
    forced = Speculation(draft_max=2, drafters=("mtp",), gate=False)
    gen = demo.generate(prompt, max_tokens=48, temperature=0, speculative=forced, stream=True)
    assert "".join(gen) == plain
    st = gen.stats
    assert st.drafted_tokens > 0 and st.accepted_tokens / st.drafted_tokens > 0.25


def test_readme_main_command_streams_and_reports(capsys):
    from regolith.cli import main

    assert main(["run", "-p", "class Stack:", "-n", "16", "--arena-gb", "0.004", "--seed", "1"]) == 0
    err = capsys.readouterr().err
    assert "expert arena" in err and "hit rate" in err
