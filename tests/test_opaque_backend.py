"""The core never touches device memory from the host: the whole test suite passes on "cpu-opaque", the CPU
backend whose buffers are PROT_NONE outside backend calls (any host access faults) and whose ops are deferred
until the core submits or reads (any dependence on an op having run shows). It runs in a subprocess with
REGOLITH_BACKEND set, which every model, window and vision tower then uses: the layer, model, streaming,
state, speculation, vision, generation and server tests, and the pre-refactor fixtures, which the opaque
backend must match bit for bit as the CPU does."""

from __future__ import annotations

import os

import pytest

from tests.backend_suite import run_suite


@pytest.mark.skipif(bool(os.environ.get("REGOLITH_BACKEND")), reason="already running on a chosen backend")
def test_model_suite_passes_on_opaque_device_memory():
    run_suite("cpu-opaque", paths=("tests",))
