"""The Metal emulator against Metal's definitions (csrc/metal/emu/; its test kernels in selftest_kernels.cpp):
SIMD-group functions, threadgroup barriers, SIMD-group matrices, and the errors it must report, since
everything the conformance suite says about metal-emu rests on it."""

from __future__ import annotations

import numpy as np
import pytest

from regolith import _core
from regolith.errors import RegolithError


def dispatch(kernel, arrays, grid=(1, 1, 1), threads=32, shmem=0):
    _core.metal_emu_dispatch(kernel, [a.reshape(-1).view(np.uint8) for a in arrays], grid, threads, shmem)


@pytest.fixture
def order():
    yield _core.metal_emu_set_order
    _core.metal_emu_set_order(False)


@pytest.mark.parametrize("reverse", [False, True])
def test_simd_group_functions_match_their_definitions(order, reverse):
    order(reverse)
    rng = np.random.default_rng(3)
    n = 96  # three SIMD-groups
    x = rng.integers(-50, 50, n).astype(np.float32)  # small integers: float sums are exact in any order
    out = np.zeros((6, n), np.float32)
    dispatch("rg_emu_test_simd", [x, out], threads=n)
    g = x.reshape(3, 32)
    lane = np.arange(32)
    np.testing.assert_array_equal(out[0].reshape(3, 32), np.repeat(g.sum(1, keepdims=True), 32, 1))
    np.testing.assert_array_equal(out[1].reshape(3, 32), np.repeat(g.max(1, keepdims=True), 32, 1))
    np.testing.assert_array_equal(out[2].reshape(3, 32), np.cumsum(g, 1) - g)
    np.testing.assert_array_equal(out[3].reshape(3, 32), g[:, lane ^ 5])
    down = out[4].reshape(3, 32)
    np.testing.assert_array_equal(down[:, :29], g[:, 3:])
    assert np.isnan(down[:, 29:]).all(), "a shuffle from past the SIMD-group reads no lane: poison"
    np.testing.assert_array_equal(out[5].reshape(3, 32), np.repeat(g[:, 7:8], 32, 1))


def test_a_barrier_orders_threadgroup_memory_in_either_order(order):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(4 * 64).astype(np.float32)
    want = np.roll(x.reshape(4, 64), -1, axis=1).reshape(-1)
    for reverse in (False, True):
        order(reverse)
        out = np.zeros_like(x)
        dispatch(
            "rg_emu_test_exchange", [x, out, np.array([1], np.uint32)], grid=(4, 1, 1), threads=64, shmem=256
        )
        np.testing.assert_array_equal(out, want)


def test_a_missing_barrier_shows_in_one_of_the_orders(order):
    """Without the barrier a thread may read its neighbour's slot before it is written: running the threads
    in increasing order it does (and reads the 0xFF fill: NaN), so a kernel with a race fails its tests."""
    x = np.arange(64, dtype=np.float32)
    results = []
    for reverse in (False, True):
        order(reverse)
        out = np.zeros_like(x)
        dispatch("rg_emu_test_exchange", [x, out, np.array([0], np.uint32)], threads=64, shmem=256)
        results.append(out)
    assert np.isnan(results[0][:-1]).all()
    np.testing.assert_array_equal(results[1][:-1], np.roll(x, -1)[:-1])
    assert np.isnan(results[1][-1])


def test_divergent_simd_group_functions_are_an_error():
    with pytest.raises(RegolithError, match="rg_emu_test_divergent.*different SIMD-group functions"):
        dispatch("rg_emu_test_divergent", [np.zeros(32, np.float32)])


def test_returning_before_a_barrier_others_wait_at_is_an_error():
    with pytest.raises(RegolithError, match="thread 0 returned while others wait at a threadgroup barrier"):
        dispatch("rg_emu_test_early_return", [np.zeros(64, np.float32)], threads=64)


def test_simd_group_matrices_multiply_and_accumulate():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    c = rng.standard_normal((8, 8)).astype(np.float32)
    out = c.copy()
    dispatch("rg_emu_test_matrix", [a, np.ascontiguousarray(b.T), out])
    np.testing.assert_allclose(out, a.astype(np.float64) @ b + c, rtol=1e-5, atol=1e-5)


def test_unknown_kernels_and_wrong_buffer_counts_are_errors():
    with pytest.raises(ValueError, match="no kernel rg_nope"):
        dispatch("rg_nope", [])
    with pytest.raises(ValueError, match="takes 2 buffers"):
        dispatch("rg_emu_test_simd", [np.zeros(32, np.float32)])
