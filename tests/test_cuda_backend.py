"""The CUDA backend under whole models, where this build and machine have one (the lent H200; elsewhere these
skip): tests/backend_suite.py's model tests on "cuda" — the tiny qwen4exp configs (with MTP), gemma3, qwen2 and
the vision tower against transformers, streamed output equal to resident output bit for bit whatever the arena
size (with and without a host tier), states, speculation, generation, the demo model — and the released
models (real_weights) where their packages are installed. The op-by-op comparison with the CPU is
tests/test_backend_conformance.py."""

from __future__ import annotations

import os

import pytest

from regolith import backends
from tests.backend_suite import run_suite


@pytest.mark.skipif("cuda" not in backends.available(), reason="this build or machine has no CUDA backend")
@pytest.mark.skipif(bool(os.environ.get("REGOLITH_BACKEND")), reason="already running on a chosen backend")
def test_model_suite_passes_on_cuda():
    run_suite("cuda", workers=14)  # the suite's processes share the GPU
