"""`regolith inspect --plan` on a full-size synthetic Qwen3.8-Flash-Next laid out as it is published: 48 layers of
512 IQ2_XS experts, the full 248,320-token vocabulary, the model in gguf-split shards, the ~320M-row PLE table in
ple-iq4_nl.gguf, the MTP head (Q2_0 experts) in mtp-q2_0.gguf and the vision tower in mmproj-f16.gguf. The
files are sparse (headers only, ~51 GB
apparent, a few MB on disk). The plan's sizes are checked against the tensor infos as the gguf package reads
them, and the table against a 24 GB machine's cap (the seed's 18.8 GB)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

import regolith
from regolith import memory_plan, model_sizes
from regolith.models import resolve_files

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synthetic_qwen4exp as synthetic

CAP_GB = 18.8  # the seed's plan cap on a 24 GB machine
EXPERT = re.compile(r"_exps\.weight$")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("flash-next")
    synthetic.write_bundle(
        d,
        48,
        vocab=248320,
        expert_type="IQ2_XS",
        ple="full",
        ple_type="IQ4_NL",
        mtp=True,
        split_max_size=10 * 10**9,
        vision=True,
    )
    return d


def test_bundle_is_split_sparse_and_found_by_name(bundle):
    files = resolve_files(bundle)
    assert files.model.name == "flash-next-IQ2_XS-00001-of-00003.gguf"
    assert (files.ple.name, files.mtp.name, files.mmproj.name) == (
        "ple-iq4_nl.gguf",
        "mtp-q2_0.gguf",
        "mmproj-f16.gguf",
    )
    total = sum(p.stat().st_size for p in bundle.iterdir())
    assert total > 45 * 10**9 and sum(p.stat().st_blocks * 512 for p in bundle.iterdir()) < 100 * 10**6


def test_plan_sizes_match_the_files_tensor_infos(bundle):
    files = resolve_files(bundle)
    shards = sorted(bundle.glob("flash-next-*.gguf"))
    infos = [t for p in [*shards, files.ple] for t in gguf.GGUFReader(p).tensors]
    with regolith.gguf.open(files.mtp) as mtp:  # gguf-py 0.19 does not know Q2_0 (type 42)
        mtp_tensors = list(mtp.tensors.values())
    with regolith.gguf.open(files.model, side_files=files.side_files) as f:
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None)
        assert len(f.tensors) == len(infos) + len(mtp_tensors)
    experts = [t for t in infos if EXPERT.search(t.name)]
    assert len(experts) == 48 * 3 and {t.tensor_type.name for t in experts} == {"IQ2_XS"}
    table = next(t for t in infos if t.name == "per_layer_token_embd.weight")
    assert table.tensor_type.name == "IQ4_NL"
    assert sizes.dense_bytes == sum(
        int(t.n_bytes) for t in infos if not EXPERT.search(t.name) and t is not table
    )
    assert sizes.mtp_bytes == sum(t.nbytes for t in mtp_tensors if not EXPERT.search(t.name))
    mtp_experts = sum(t.nbytes for t in mtp_tensors if EXPERT.search(t.name))
    assert sizes.expert_bytes == sum(int(t.n_bytes) for t in experts) + mtp_experts
    assert sizes.n_experts_total == 49 * 512 and sizes.vocab == 248320
    assert (sizes.ple_rows, sizes.ple_row_bytes) == (
        int(table.shape[1]),
        int(table.n_bytes) // int(table.shape[1]),
    )
    # the vision encoder as it loads: F16 matrices as stored, the rest converted to f32, two rotary tables
    projector = gguf.GGUFReader(files.mmproj)
    hd = int(projector.get_field("clip.vision.embedding_length").contents()) // int(
        projector.get_field("clip.vision.attention.head_count").contents()
    )
    as_stored = [t for t in projector.tensors if len(t.shape) == 2 and "position" not in t.name]
    assert {t.tensor_type.name for t in as_stored} == {"F16"}
    stored = {t.name for t in as_stored}
    converted = sum(4 * int(t.n_elements) for t in projector.tensors if t.name not in stored)
    with regolith.gguf.open(files.mmproj) as f:
        planned = model_sizes.vision_bytes(f.tensors, f.metadata, str(files.mmproj))
    assert planned == sum(int(t.n_bytes) for t in as_stored) + converted + 4 * hd


def test_inspect_plan_prints_the_24gb_table(bundle):
    # a fresh process, as a user's: the plan counts the process's resident memory (this one's grows with the suite)
    args = [
        "inspect",
        str(bundle),
        "--plan",
        "--memory-gb",
        str(CAP_GB),
        "--arena-gb",
        "6.5",
        "--ctx",
        "32k,128k",
    ]
    run = subprocess.run(
        [sys.executable, "-c", f"import sys; from regolith.cli import main; sys.exit(main({args!r}))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    head, *rows, total = [line for line in out.splitlines() if line.strip()]
    assert head.split() == ["32,768", "ctx", "131,072", "ctx"]
    names = [re.split(r"\s{2,}", r.strip())[0] for r in rows]
    assert names == [
        "dense weights (resident)",
        "MTP head (resident)",
        "expert arena",
        "KV / state",
        "scratch",
        "PLE row cache",
        "vision encoder",
        "runtime (before load)",
    ]
    assert total.startswith("total") and total.endswith(f"of a {CAP_GB} GiB budget")
    files = resolve_files(bundle)
    with regolith.gguf.open(files.model, side_files=files.side_files) as f:
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None)
    plans = [
        memory_plan.plan_memory(sizes, n_ctx=n, memory_gb=CAP_GB, arena_gb=6.5, overhead_bytes=0)
        for n in (32768, 65536, 131072)
    ]
    for p in plans:
        assert p.total_bytes <= CAP_GB * 2**30 and p.arena_slots == int(6.5 * 2**30) // sizes.slot_bytes
    # the state grows linearly with the context; the arena and the PLE cache do not
    assert (
        plans[2].state_bytes - plans[0].state_bytes == 3 * (plans[1].state_bytes - plans[0].state_bytes) > 0
    )
    arena = next(r for r in rows if r.startswith("expert arena"))
    assert f"{plans[0].arena_slots} of {49 * 512} experts" in arena


def test_an_8_bit_cache_plans_128k_within_the_seeds_context_state(bundle):
    """The seed holds 128k tokens of context in 2.23 GB (int8 QSA keys, values and pooled indexer keys, and
    the Gated DeltaNet state); q8_0 and i8 caches plan within it, the f32 cache at 3.7x."""
    files = resolve_files(bundle)
    with regolith.gguf.open(files.model, side_files=files.side_files) as f:
        state = {
            kv: model_sizes.sizes_from_gguf(f.tensors, f.metadata, None, kv).state_bytes(131072)
            for kv in ("f32", "q8_0", "i8")
        }
    assert state["i8"] < state["q8_0"] <= 2.23e9 < state["f32"] / 3.5
    # per token and QSA cache (the 12 layers' and the MTP head's), the default i8 within the seed's 14.2 KiB for
    # its 12 layers
    with regolith.gguf.open(files.model, side_files=files.side_files) as f:
        i8 = model_sizes.sizes_from_gguf(f.tensors, f.metadata, None, "i8")
        assert model_sizes.default_kv_type(f.architecture) == "i8"
    assert i8.state_per_token / 13 <= 14.2 * 1024 / 12
