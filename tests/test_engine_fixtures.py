"""The CPU engine against its own pre-refactor outputs: every case of tests/engine_cases.py, replayed with the
installed build, must give the logits, image embeddings, draft ids and text that
tools/engine_fixtures/record.py recorded with the build of commit 3ca5084 (tests/fixtures/engine/logits.json),
bit for bit (SHA-256 of each float32 row).

The oracle is regolith itself before every op moved behind the Backend interface: a refactor may not change
a single bit of the CPU results. Each ISA recorded there (scalar and avx2 on x86-64; they differ from each
other, so each has its own hashes) that this CPU offers is replayed; others (neon) skip. The avxvnni and
avx512 kernels compute avx2's bits by design (csrc/cpu/matmul_avxvnni.cpp, matmul_avx512.cpp), so they
replay avx2's hashes.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from regolith import _core
from tests import engine_cases as ec

RECORD = json.loads(ec.LOGITS.read_text())
# kernels that must reproduce another ISA's results bit for bit
SAME_BITS = {"avxvnni": "avx2", "avx512": "avx2"}
RECORDED = list(RECORD["isas"]) + [isa for isa, same in SAME_BITS.items() if same in RECORD["isas"]]
ACTIVE = _core.isa()  # the kernels this CPU runs by default
ISAS = sorted(set(RECORDED) | set(_core.available_isas()), key=lambda n: (n != ACTIVE, n))


@pytest.fixture(params=ISAS)
def isa(request):
    name = request.param
    if name not in RECORDED:
        pytest.skip(
            f"the fixture has no {name} hashes (recorded for {', '.join(RECORDED)}): record them with "
            "tools/engine_fixtures/record.py on the pre-refactor build, on a CPU that has them"
        )
    if name not in _core.available_isas():
        pytest.skip(f"this CPU has no {name} kernels (available: {', '.join(_core.available_isas())})")
    before = _core.isa()
    _core.set_isa(name)
    yield name
    _core.set_isa(before)


def _cases(group: str) -> list[pytest.param]:
    return [pytest.param(c, id=c.name) for c in ec.CASES.values() if c.group == group]


def _replay(case: ec.Case, isa: str, tmp_path) -> None:
    reason = case.missing()
    if reason:
        pytest.skip(reason)
    want = RECORD["isas"][SAME_BITS.get(isa, isa)].get(case.name)
    assert want is not None, f"{case.name} is not in {ec.LOGITS.name}: record it with the pre-refactor build"
    diffs = ec.compare(ec.digest(case.run(tmp_path)), want)
    assert not diffs, f"{case.name} [{isa}] differs from the pre-refactor fixture:\n" + "\n".join(diffs)


@pytest.mark.parametrize("case", _cases("tiny"))
def test_qwen4exp_logits_bit_identical_to_prerefactor_fixture(case, isa, tmp_path):
    """Tiny qwen4exp (f32, q8_0, q4_k, no PLE): whole, chunked, token by token, rollback, MTP drafts,
    streamed through a 3-slot arena from the GGUF and from a pack, a reloaded state, exact activations."""
    _replay(case, isa, tmp_path)


@pytest.mark.parametrize("case", _cases("llamacpp"))
def test_llamacpp_iquant_logits_bit_identical_to_prerefactor_fixture(case, isa, tmp_path):
    """Re-recorded after issue 18's per-128 activation blocks of the i-quants (``rerecorded``)."""
    _replay(case, isa, tmp_path)


@pytest.mark.parametrize("case", _cases("demo"))
def test_demo_model_logits_drafts_and_text_bit_identical_to_prerefactor_fixture(case, isa, tmp_path):
    _replay(case, isa, tmp_path)


@pytest.mark.parametrize("case", _cases("dense"))
def test_dense_model_logits_bit_identical_to_prerefactor_fixture(case, isa, tmp_path):
    """gemma3-270m and qwen2.5-coder-0.5b: f16 and f32 KV caches, a 600-token prompt. On the kernels this CPU
    runs by default only: the other ISAs' kernels are replayed on the tiny, demo and vision models, and the
    real models' prompts take minutes at scalar speed. Re-recorded after issue 18's changes of the k-quant
    products (``rerecorded`` in the fixture; tests/model/test_fidelity_real.py judges it against float64)."""
    if isa != ACTIVE:
        pytest.skip(
            f"real-model cases replay on the default {ACTIVE} kernels; {isa} is checked on the others"
        )
    _replay(case, isa, tmp_path)


@pytest.mark.parametrize("case", _cases("vision"))
def test_vision_embeddings_and_logits_bit_identical_to_prerefactor_fixture(case, isa, tmp_path):
    _replay(case, isa, tmp_path)


def test_fixture_models_and_cases_are_the_recorded_ones():
    """The committed GGUFs are the files the hashes were recorded on, and every case was recorded for every
    recorded ISA (a case added to engine_cases.py needs a recording with the pre-refactor build)."""
    for name, sha in RECORD["files"].items():
        got = hashlib.sha256((ec.FIXTURES / name).read_bytes()).hexdigest()
        assert got == sha, f"{name} is not the file logits.json was recorded with"
    assert set(RECORD["files"]) == set(ec.TINY_FILES)
    for isa in RECORD["isas"]:
        assert set(RECORD["isas"][isa]) == set(ec.CASES), isa
