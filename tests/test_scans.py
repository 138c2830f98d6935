"""Reduction extents that depend on an outer index (``sum[j: i + 1]``): DSL.md's cumsum as written
and variants (offsets, prod/max/min, a prefix inside a larger expression, a window that is not a
prefix), on random data at odd sizes with poisoned outputs, against NumPy and the reference; the
prefix ones computed by a recurrence (linear work) on the CPU and in the CUDA simulator."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest
from helpers import check_op
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccNameError
from tcc.ir.loops import For, is_sequential, walk_stmts

CUMSUM = """
op cumsum(X: f32[B, L]) -> Y: f32[B, L] {
    Y[b, i] = sum[j: i + 1](X[b, j])
}
"""


@pytest.mark.parametrize("B,L", [(1, 1), (7, 33), (33, 7), (3, 1000)])
def test_cumsum_as_written(rng, B, L):
    source = step11_ops().get("cumsum", CUMSUM)
    X = rng.standard_normal((B, L)).astype(np.float32)
    (Y,) = check_op(source, "cumsum", {"B": B, "L": L}, rng, args=[X])
    np.testing.assert_allclose(Y, np.cumsum(X.astype(np.float64), axis=1), rtol=1e-4, atol=1e-4)


def _loops(op, bindings):
    return [s for s in walk_stmts(op.lowered(bindings).scheduled.body) if isinstance(s, For)]


def test_cumsum_is_a_recurrence_not_a_triangle():
    loops = _loops(tcc.compile(CUMSUM).cumsum, {"B": 4, "L": 1000})
    assert [f.var.name for f in loops if is_sequential(f)] == ["i"]
    assert "j" not in [f.var.name for f in loops]


@pytest.mark.parametrize("expr,numpy", [
    ("sum[j: i](X[b, j])", lambda X: np.concatenate([np.zeros((X.shape[0], 1)), np.cumsum(X, 1)[:, :-1]], 1)),
    ("max[j: i + 1](X[b, j])", lambda X: np.maximum.accumulate(X, 1)),
    ("min[j: i + 1](X[b, j]) * 2.0 + 1.0", lambda X: np.minimum.accumulate(X, 1) * 2 + 1),
    ("prod[j: i + 1](1.0 + 0.01 * X[b, j])", lambda X: np.cumprod(1 + 0.01 * X, 1)),
    ("X[b, i] - sum[j: i + 1](exp(X[b, j]))", lambda X: X - np.cumsum(np.exp(X), 1)),
])
@pytest.mark.parametrize("B,L", [(1, 7), (7, 33), (2, 1000)])
def test_prefix_variants(rng, expr, numpy, B, L):
    source = f"op f(X: f32[B, L]) -> Y: f32[B, L] {{\n    Y[b, i] = {expr}\n}}\n"
    X = rng.standard_normal((B, L)).astype(np.float32)
    (Y,) = check_op(source, "f", {"B": B, "L": L}, rng, args=[X])
    np.testing.assert_allclose(Y, numpy(X.astype(np.float64)), rtol=1e-4, atol=1e-4)
    assert any(is_sequential(f) for f in _loops(tcc.compile(source).f, {"B": B, "L": L}))


def test_prefix_over_a_shorter_axis_set(rng):
    source = "op f(X: f32[N], W: f32[K]) -> Y: f32[N - 1, K] {\n    Y[i, k] = sum[j: i + 2](X[j]) * W[k]\n}\n"
    X = rng.standard_normal(34).astype(np.float32)
    W = rng.standard_normal(7).astype(np.float32)
    (Y,) = check_op(source, "f", {"N": 34, "K": 7}, rng, args=[X, W])
    np.testing.assert_allclose(Y, np.cumsum(X.astype(np.float64))[1:, None] * W, rtol=1e-4, atol=1e-4)


def test_a_reduction_that_is_not_a_prefix_runs_as_a_triangle(rng):
    source = "op f(X: f32[B, L], W: f32[L]) -> Y: f32[B, L] {\n    Y[b, i] = sum[j: i + 1](X[b, j] * W[i])\n}\n"
    X = rng.standard_normal((7, 33)).astype(np.float32)
    W = rng.standard_normal(33).astype(np.float32)
    (Y,) = check_op(source, "f", {"B": 7, "L": 33}, rng, args=[X, W])
    np.testing.assert_allclose(Y, np.cumsum(X.astype(np.float64), 1) * W, rtol=1e-4, atol=1e-4)
    assert "j" in [f.var.name for f in _loops(tcc.compile(source).f, {"B": 7, "L": 33})]


def test_extent_may_not_use_another_reduction_index():
    source = "op f(X: f32[N, N]) -> Y: f32[N] {\n    Y[i] = sum[k](sum[j: k + 1](X[k, j]))\n}\n"
    with pytest.raises(TccNameError, match="unknown name 'k' in the extent of j"):
        tcc.compile(source)


def test_cumsum_in_the_cuda_simulator(rng):
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(CUMSUM, target="cuda", arch="sm_90").cumsum
    X = rng.standard_normal((33, 7)).astype(np.float32)
    arrays = {"X": X, "Y": np.full(X.shape, np.nan, np.float32)}
    gpu_sim.run(op.lowered({"B": 33, "L": 7}).scheduled, arrays)
    np.testing.assert_allclose(arrays["Y"], np.cumsum(X.astype(np.float64), axis=1), rtol=1e-5, atol=1e-5)


def test_grad_of_a_moving_extent_other_than_a_prefix_is_a_clear_error():
    """(Prefix sums differentiate: tests/test_grad_data.py; a body that uses the moving index does not.)"""
    source = "op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = sum[k: i + 1](X[i] * X[k])\n}"
    with pytest.raises(tcc.TccError, match="only as a prefix sum or product"):
        tcc.grad(tcc.compile(source).f)


def test_a_decomposed_triangular_reduction_on_cuda(rng):
    """``decompose`` leaves a triangular reduction loop inside the output loop; the CUDA scheduler
    keeps it serial in a thread (CUDA fuzz seed 40739: 'no constant extent for the GPU')."""
    pytest.importorskip("cuda.bindings.nvrtc")
    source = "op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = sum[k: i + 1](X[i] * X[k])\n}"
    X = rng.standard_normal(33).astype(np.float32)
    op = tcc.compile(source, target="cuda", arch="sm_90").f.schedule("decompose(Y)")
    arrays = {"X": X, "Y": np.full(33, np.nan, np.float32)}
    gpu_sim.run(op.lowered({"N": 33}).scheduled, arrays)
    np.testing.assert_allclose(arrays["Y"], X * np.cumsum(X), rtol=1e-5, atol=1e-5)
