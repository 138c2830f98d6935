"""Accumulating statements (``T[...] += expr``, a scatter), as DSL.md writes them: against NumPy's
``np.add.at`` and the reference at odd sizes with duplicate positions and poisoned outputs;
out-of-range positions a TccIndexError with nothing written; loops that may add into one element
kept serial by the CPU schedule; the sema errors."""

from __future__ import annotations

import numpy as np
import pytest
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccIndexError, TccNameError, TccScheduleError, TccShapeError, TccTypeError
from tcc.ir.source import format_source
from tcc.ir.te import format_op
from tcc.passes.loops.parallel import parallel
from tcc.passes.loops.vectorize import vectorize
from tcc.testing import reference_results

SCATTERS = "".join(step11_ops().get(name, "") for name in ("embedding_grad", "histogram")) or """
op embedding_grad[V = 1](dY: f32[N, D], idx: i64[N]) -> dE: f32[V, D] {
    dE[v, d] = 0.0
    dE[idx[n], d] += dY[n, d]
}
op histogram[B = 16](X: i64[N]) -> H: i64[B] {
    H[b] = 0
    H[X[n]] += 1
}
"""


def embedding_grad(dY: np.ndarray, idx: np.ndarray, v: int) -> np.ndarray:
    out = np.zeros((v, dY.shape[1]), np.float64)
    np.add.at(out, idx, dY.astype(np.float64))
    return out


@pytest.mark.parametrize("v,d,n", [(1, 1, 1), (7, 33, 7), (5, 7, 1000), (33, 1000, 33)])
def test_embedding_grad_matches_add_at(rng, v, d, n):
    op = tcc.compile(SCATTERS).embedding_grad
    dY, idx = rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, v, n)  # duplicates: n > v
    out = np.full((v, d), np.nan, np.float32)
    got = op(dY, idx, V=v, out=out)
    assert got is out or np.shares_memory(got, out)
    np.testing.assert_allclose(out, embedding_grad(dY, idx, v), rtol=1e-5, atol=1e-4)
    ref = reference_results(op.te, [dY, idx], {"V": v, "D": d, "N": n})[0]
    np.testing.assert_allclose(ref, embedding_grad(dY, idx, v), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("n,b", [(1, 16), (7, 16), (33, 3), (1000, 16), (1000, 1)])
def test_histogram_matches_bincount(rng, n, b):
    op = tcc.compile(SCATTERS).histogram
    X = rng.integers(0, b, n)
    out = np.full(b, -12345, np.int64)
    op(X, B=b, out=out)
    np.testing.assert_array_equal(out, np.bincount(X, minlength=b))
    np.testing.assert_array_equal(reference_results(op.te, [X], {"B": b, "N": n})[0], np.bincount(X, minlength=b))


@pytest.mark.parametrize("bad", [-1, 16, 2**40])
def test_out_of_range_position_is_an_error_and_writes_nothing(rng, bad):
    op = tcc.compile(SCATTERS).histogram
    X = rng.integers(0, 16, 33)
    X[17] = bad
    out = np.full(16, 7, np.int64)
    with pytest.raises(TccIndexError, match=rf"index 0 of H \(X\[n\]\) is {bad} at n=17, outside \[0, 16\)"):
        op(X, out=out)
    assert (out == 7).all()
    with pytest.raises(TccIndexError):  # the oracle refuses the same call
        reference_results(op.te, [X], {"B": 16, "N": 33})


def test_scatter_of_a_reduction_into_an_intermediate_then_read(rng):
    """``+=`` of a reduced value into an intermediate, then an ordinary statement reads the sums;
    an affine left-hand position (``2 * i``) needs no check."""
    source = """
op f[M = 1](X: f32[N, K], idx: i64[N]) -> Y: f32[M] {
    acc: f32[M]
    acc[m] = 1.0
    acc[idx[n]] += sum[k](X[n, k] * X[n, k])
    acc[2 * i] += X[i, 0]
    Y[m] = acc[m] * 2.0
}
"""
    op = tcc.compile(source).f
    n, k, m = 33, 7, 70
    X, idx = rng.standard_normal((n, k)).astype(np.float32), rng.integers(0, m, n)
    acc = np.ones(m)
    np.add.at(acc, idx, (X.astype(np.float64) ** 2).sum(1))
    acc[0:2 * n:2] += X[:, 0]
    out = np.full(m, np.nan, np.float32)
    op(X, idx, out=out, M=m)
    np.testing.assert_allclose(out, acc * 2, rtol=1e-5, atol=1e-5)


def test_printers_show_the_accumulation():
    op = tcc.compile(SCATTERS).histogram
    assert "H[X[n]] [n: N] += 1" in format_op(op.te)
    text = format_source(op.te)
    assert "H[X[n]] += 1" in text
    again = tcc.compile(text).histogram
    X = np.array([3, 3, 0, 15])
    np.testing.assert_array_equal(again(X), np.bincount(X, minlength=16))
    assert "# accumulate" in op.lower(X, stage="loops")


@pytest.mark.parametrize("body,error,match", [
    ("Y[i] += X[i]", TccNameError, "not defined by an earlier statement"),
    ("Y[i] = X[i]\n    X[i] += 1.0", TccNameError, "an input is read-only"),
    ("Y[i] = X[i]\n    Y[j + 1] += 1.0", TccShapeError, "range of index 'j'"),
    ("Y[i] = X[i]\n    Y[i] += X[i] * scale", TccShapeError, "range of index 'scale'"),
    ("Y[i] = X[i]\n    Y[X[i]] += 1.0", TccTypeError, "integer"),
])
def test_accumulate_errors(body, error, match):
    with pytest.raises(error, match=match):
        tcc.compile(f"op f(X: f32[N]) -> Y: f32[N] {{\n    {body}\n}}")


def test_int_value_into_a_float_tensor_and_float_into_int_refused():
    with pytest.raises(TccTypeError, match="value added into H"):
        tcc.compile("op f(X: i64[N]) -> H: i64[N] {\n    H[i] = 0\n    H[X[i]] += 0.5\n}")


def test_scatter_loops_stay_serial_under_the_primitives():
    """``parallel`` and ``vectorize`` refuse a loop whose iterations may add into one element."""
    op = tcc.compile(SCATTERS).histogram
    loops = op.lowered(op.bindings_for((np.zeros(64, np.int64),), {})).loops
    with pytest.raises(TccScheduleError, match="may add into the same element of H"):
        parallel(loops, "n")
    with pytest.raises(TccScheduleError, match="may add into the same element of H"):
        vectorize(loops, "n", 8)


def test_grad_of_a_scatter_is_a_gather(rng):
    """(More in tests/test_grad_data.py.) The gradient of ``dE[idx[n], d] += dY[n, d]`` reads the
    adjoint where each point added: ``ddY[n, d] = ddE[idx[n], d]``."""
    grad = tcc.grad(tcc.compile(SCATTERS).embedding_grad)
    dY, idx, ddE = rng.standard_normal((33, 7)).astype(np.float32), rng.integers(0, 5, 33), \
        rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(grad(dY, idx, ddE, V=5, out=np.full((33, 7), np.nan, np.float32)), ddE[idx])


def test_a_contraction_added_into_a_same_named_intermediate(rng):
    """A ``+=`` of a GEMM-sized contraction stays a scatter (not the GEMM's tiles), and an
    intermediate defined and added into over the same loop name is not fused into one loop."""
    source = """
op f[M = 1](A: f32[I, K], B: f32[K, J], idx: i64[I]) -> Y: f32[M, J] {
    t: f32[M, J]
    t[i, j] = 1.0
    t[idx[i], j] += sum[k](A[i, k] * B[k, j])
    Y[m, j] = t[m, j] + 0.5
}
"""
    op = tcc.compile(source).f
    i, k, j, m = 96, 64, 80, 7
    A, B = rng.standard_normal((i, k)).astype(np.float32), rng.standard_normal((k, j)).astype(np.float32)
    idx = rng.integers(0, m, i)
    t = np.ones((m, j))
    np.add.at(t, idx, A.astype(np.float64) @ B.astype(np.float64))
    np.testing.assert_allclose(op(A, B, idx, M=m), t + 0.5, rtol=1e-4, atol=1e-3)


def test_a_tensor_added_into_is_not_cached():
    """``cache(T, v1)`` of a ``+=`` target copied a tile the data-chosen positions run past (CUDA fuzz
    seed 40010: an unspecified launch failure); it is a schedule error on both targets."""
    source = ("op f(X: f32[N], idx: i64[N]) -> Y: f32[4] {\n    T: f32[4]\n    T[v] = 0.0\n"
              "    T[idx[n]] += X[n]\n    Y[v] = T[v]\n}")
    for target in ("cpu", "cuda"):
        op = tcc.compile(source, target=target).f.schedule("cache(T, n)")
        with pytest.raises(TccScheduleError, match="added into"):
            op.lower(np.ones(5, np.float32), np.zeros(5, np.int64), stage="scheduled")


@pytest.mark.parametrize("v,d,n", [(1, 1, 1), (7, 33, 7), (5, 7, 1000)])
def test_positions_computed_by_a_statement_the_group_would_shrink(rng, v, d, n):
    """The positions are an intermediate computed over the loop the zero fill runs (same extent):
    the group pass joined the two and kept one position per iteration, so the scatter after the
    group read a buffer that no longer existed (the torch.compile importer's embedding gradient)."""
    op = tcc.compile("""
op scatter_wrapped(dY: f32[N, D], idx: i64[N]) -> dE: f32[N, D] {
    J: i64[N]
    J[n] = select(idx[n] < 0, idx[n] + N, idx[n])
    dE[v, d] = 0.0
    dE[min(max(J[n], 0), N - 1), d] += dY[n, d]
}
""").scatter_wrapped
    dY, idx = rng.standard_normal((n, d)).astype(np.float32), rng.integers(-n, n, n)
    out = np.full((n, d), np.nan, np.float32)
    op(dY, idx, out=out)
    expected = embedding_grad(dY, np.where(idx < 0, idx + n, idx), n)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(reference_results(op.te, [dY, idx], {"D": d, "N": n})[0], expected, rtol=1e-6,
                               atol=1e-5)
