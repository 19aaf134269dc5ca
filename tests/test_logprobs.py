"""Token log-probabilities (regolith.logprobs) against torch's float64 log_softmax: ordinary logits, logits
large enough to overflow a naive softmax, a 248k vocabulary; the top tokens in order, ties to the lower id."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from regolith.logprobs import TokenLogprob, log_softmax, token_logprob


def _reference(logits: np.ndarray) -> np.ndarray:
    return torch.log_softmax(torch.from_numpy(logits.astype(np.float64)), dim=-1).numpy()


@pytest.mark.parametrize(
    ("vocab", "scale", "shift"),
    [(1000, 3.0, 0.0), (248_320, 8.0, -2.0), (5000, 1.0, 3.0e4), (5000, 1.0e4, 0.0)],
    ids=["small", "248k", "large-offset", "wide"],
)
def test_log_softmax_matches_torch_float64(vocab, scale, shift):
    logits = (np.random.default_rng(vocab).standard_normal(vocab) * scale + shift).astype(np.float32)
    got = log_softmax(logits)
    want = _reference(logits)
    assert got.dtype == np.float64 and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    rows = np.stack([logits, logits[::-1]])
    np.testing.assert_allclose(log_softmax(rows), _reference(rows), rtol=1e-12, atol=1e-12)
    e = token_logprob(logits, 17, top=5)
    assert e.token == 17 and e.logprob == pytest.approx(want[17], rel=1e-12, abs=1e-12)
    order = np.argsort(-want, kind="stable")[:5]
    assert [t for t, _ in e.top] == order.tolist()
    np.testing.assert_allclose([lp for _, lp in e.top], want[order], rtol=1e-12, atol=1e-12)


def test_top_tokens_ties_go_to_the_lower_id():
    logits = np.zeros(10, dtype=np.float32)
    logits[[7, 3, 5]] = 2.0
    logits[[9, 1]] = 1.0
    e = token_logprob(logits, 0, top=4)
    assert [t for t, _ in e.top] == [3, 5, 7, 1]
    assert token_logprob(logits, 0, top=50).top[-1][0] == 8  # more than the vocabulary: all of it, in order
    assert token_logprob(logits, 4) == TokenLogprob(4, float(_reference(logits)[4]), ())
