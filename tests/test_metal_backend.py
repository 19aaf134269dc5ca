"""The Metal backend under whole models, without a Mac: the model tests on "metal-emu", the Metal backend's
own host code and kernels with the GPU emulated (docs/metal.md).

They run in a subprocess with REGOLITH_BACKEND=metal-emu, which every model, window and vision tower then
uses: the tiny qwen4exp configs (with MTP), gemma3, qwen2 and the vision tower against transformers; streamed
output equal to resident output bit for bit at any arena size (the arena reading straight into unified
memory while the emulated GPU may still be reading the slot: Backend::wait_submitted); saved and restored
states (in place: Backend::synchronize); speculation's rollback; the bundled demo model. Left out: the
statistical test of speculative sampling (thousands of draws of the demo model: minutes on the emulator,
and what it tests, the sampler, is host code the CPU run covers), the CPU-only fixture replay and the tests
marked real_weights (the released 270M / 0.5B models decode at about 5 s per token on the emulator): the
released Gemma 3 weights go through the Metal kernels once, below, on a short prompt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import regolith
from regolith.models import resolve_model
from tests.backend_suite import run_suite
from tests.model.test_dense_real import FIXTURES, _check_near_tie, _installed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(bool(os.environ.get("REGOLITH_BACKEND")), reason="already running on a chosen backend")
def test_model_suite_passes_on_the_emulated_metal_backend():
    run_suite("metal-emu", "-m", "not real_weights", "-k", "not keeps_the_joint_distribution")


def test_released_gemma3_weights_agree_with_llamacpp_on_the_emulated_metal_backend():
    """Gemma 3 270M Q4_K_M (Q5_0, Q4_K, Q6_K and Q8_0 blocks at real scales, a 262k-row output matrix) on metal-emu:
    the next tokens after each of the fixture text's first 16 positions are llama.cpp's, or within llama.cpp's
    own self-noise of them (the rule of tests/model/test_dense_real.py)."""
    if not _installed("gemma3-270m"):
        pytest.skip("the gemma3-270m weights package is not installed")
    fx = json.loads((FIXTURES / "dense-gemma3.json").read_text())
    model = regolith.Model.load(resolve_model("gemma3-270m"), backend="metal-emu")
    ids = fx["text"]["ids"][:16]
    top1 = model._core.new_window(32).eval(np.asarray(ids, dtype=np.int32), True).argmax(axis=1)
    noise = fx["self_noise"]["max_abs_logit_diff"]
    for pos, ours in enumerate(top1.tolist()):
        want = fx["text"]["top5_ids"][pos]
        if ours != want[0]:
            _check_near_tie(want, fx["text"]["top5_logits"][pos], ours, noise, f"position {pos}")
