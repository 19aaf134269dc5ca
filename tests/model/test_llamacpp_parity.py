"""regolith against llama.cpp's own logits on the same qwen4exp GGUFs (fixtures from llama-cpp-python 0.3.36).

llama.cpp is a second opinion, not the oracle: its qwen4exp graph assumes a sigmoid Gated DeltaNet output
gate and selects QSA blocks with a wider top-k than transformers (docs/qwen4exp.md). The fixtures pin both
halves of that finding: where a model avoids the two differences (sigmoid gate; an indexer budget that
covers the prompt), llama.cpp, regolith and transformers agree; where it does not, llama.cpp differs from
both. Regenerate with tools/llamacpp_fixtures/make_qwen4exp_logits.py.

llama.cpp also loaded the gguf-split shards regolith writes of one case (tools/llamacpp_fixtures/
make_split_fixture.py): regolith's logits on those shards must agree with llama.cpp's on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "qwen4exp-logits.npz"
SEED = 7
BASE = {"indexer_n_heads": 8}
CASES = {
    "sigmoid_gate_full_budget": {**BASE, "output_gate_type": "sigmoid", "indexer_budget": 64},
    "sigmoid_gate_full_budget_no_ple": {
        **BASE,
        "output_gate_type": "sigmoid",
        "indexer_budget": 64,
        "ple_layer_ids": [],
    },
    "sigmoid_gate_sparse_qsa": {**BASE, "output_gate_type": "sigmoid"},
    "silu_gate": {**BASE, "output_gate_type": "silu", "indexer_budget": 64},
}


SPLIT_FIXTURE = FIXTURE.with_name("qwen4exp-split-logits.npz")
SPLIT_CASE = "sigmoid_gate_full_budget"
SPLIT_TENSORS = 24  # tensors per shard


def case_prompt() -> np.ndarray:
    ids = np.random.default_rng(0).integers(3, 304, 40)
    ids[17] = 2  # an EOS inside the prompt
    return ids


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def llamacpp():
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory, llamacpp):
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model, tiny_model

    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    hf = save_tiny_model(tmp / "hf", SEED, **CASES[name])
    ids = llamacpp[f"{name}/ids"]
    np.testing.assert_array_equal(ids, case_prompt())
    with torch.no_grad():
        ref = tiny_model(SEED, **CASES[name])(torch.tensor(ids)[None]).logits[0].numpy()
    # the f32 cache, as transformers and llama.cpp's f32 KV cache compute (the default i8: test_kv_cache_types.py)
    ours = regolith.Model.load(convert(hf, tmp / "m.gguf", "f32"), kv_type="f32").window(64).eval(ids)
    return name, ours, ref, llamacpp[f"{name}/logits"]


def test_regolith_matches_transformers(case):
    _, ours, ref, _ = case
    assert _rel(ours, ref) <= 1e-4


def test_llamacpp_agrees_where_its_graph_matches_the_reference(case):
    name, ours, ref, lc = case
    if name.startswith("sigmoid_gate_full_budget"):
        # measured ~2e-6 (f32 KV cache): the three implementations agree
        assert _rel(lc, ours) <= 1e-4 and _rel(lc, ref) <= 1e-4
    else:
        # llama.cpp's sigmoid-only gate / wider QSA top-k change the output (docs/qwen4exp.md):
        # measured 1.3 (silu gate) and 0.27 (sparse QSA) relative
        assert _rel(lc, ref) > 0.05


def test_llamacpp_reads_our_shards_as_we_do(tmp_path):
    """The shards are the very files llama.cpp loaded (their sha256), and both engines compute the same logits
    from them (measured ~2e-6, as for the single file)."""
    import hashlib

    from regolith import gguf_split
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    with np.load(SPLIT_FIXTURE) as f:
        ids, lc, recorded = f["ids"], f["logits"], [str(s) for s in f["shards"]]
    np.testing.assert_array_equal(ids, case_prompt())
    hf = save_tiny_model(tmp_path / "hf", SEED, **CASES[SPLIT_CASE])
    with regolith.gguf.open(convert(hf, tmp_path / "m.gguf", "f32")) as src:
        shards = gguf_split.write_split(src, tmp_path / "split" / "m.gguf", max_tensors=SPLIT_TENSORS)
    assert [f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in shards] == recorded
    assert len(shards) > 2
    ours = regolith.Model.load(shards[1], kv_type="f32").window(64).eval(ids)
    assert _rel(ours, lc) <= 1e-4
