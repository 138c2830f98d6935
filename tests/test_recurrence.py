"""Recurrences (a statement reading its own tensor at earlier positions along one axis): DSL.md's
linear recurrence as written, on random data at odd sizes against a Python loop and the
reference, with poisoned outputs; how the axis is scheduled; and the reads that are refused."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccScheduleError, TccShapeError
from tcc.ir.loops import For, is_sequential, walk_stmts

LINEAR = """
op linear_recurrence(A: f32[T, D], X: f32[T, D]) -> H: f32[T, D] {
    H[t, d] = select(t == 0, X[t, d], A[t, d] * H[t - 1, d] + X[t, d])
}
"""


def linear_loop(A: np.ndarray, X: np.ndarray) -> np.ndarray:
    H = np.zeros(X.shape)
    for t in range(X.shape[0]):
        H[t] = X[t] if t == 0 else A[t] * H[t - 1] + X[t]
    return H


@pytest.mark.parametrize("T,D", [(1, 1), (7, 33), (33, 7), (1000, 5)])
def test_linear_recurrence_as_written(rng, T, D):
    source = step11_ops().get("linear_recurrence", LINEAR)
    A = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    X = rng.standard_normal((T, D)).astype(np.float32)
    (H,) = check_op(source, "linear_recurrence", {"T": T, "D": D}, rng, args=[A, X])
    np.testing.assert_allclose(H, linear_loop(A, X), rtol=1e-4, atol=1e-5)


def test_offset_of_two_along_the_inner_axis(rng):
    source = """
op fib(X: f32[B, N]) -> Y: f32[B, N] {
    Y[b, n] = select(n < 2, X[b, n], Y[b, n - 1] + Y[b, n - 2] * 0.5)
}
"""
    X = rng.standard_normal((33, 7)).astype(np.float32)
    (Y,) = check_op(source, "fib", {"B": 33, "N": 7}, rng, args=[X])
    want = X.astype(np.float64).copy()
    for n in range(2, 7):
        want[:, n] = want[:, n - 1] + want[:, n - 2] * 0.5
    np.testing.assert_allclose(Y, want, rtol=1e-5)


def test_intermediate_recurrence_read_by_a_later_statement(rng):
    source = """
op decay(X: f32[N, T]) -> Y: f32[N, T] {
    S: f32[N, T]
    S[n, t] = select(t == 0, X[n, t], 0.9 * S[n, t - 1] + X[n, t])
    Y[n, t] = S[n, t] * 2.0 + 1.0
}
"""
    X = rng.standard_normal((7, 1000)).astype(np.float32)
    (Y,) = check_op(source, "decay", {"N": 7, "T": 1000}, rng, args=[X])
    S = linear_loop(np.full(X.T.shape, 0.9), X.T).T
    np.testing.assert_allclose(Y, S * 2 + 1, rtol=1e-4, atol=1e-4)


def _loops(func) -> list[For]:
    return [s for s in walk_stmts(func.body) if isinstance(s, For)]


def test_cpu_schedule_keeps_the_axis_in_order_and_vectorises_the_other():
    op = tcc.compile(LINEAR).linear_recurrence
    loops = _loops(op.lowered({"T": 1000, "D": 256}).scheduled)
    ordered = [f for f in loops if is_sequential(f)]
    assert [f.var.name for f in ordered] == ["t"] and all(f.kind == "serial" for f in ordered)
    assert any(f.kind == "vector" for f in loops)


def test_inner_axis_recurrence_parallel_over_the_outer():
    source = "op run(X: f32[B, L]) -> Y: f32[B, L] {\n    Y[b, i] = select(i == 0, X[b, i], Y[b, i - 1] + X[b, i])\n}\n"
    op = tcc.compile(source).run
    loops = _loops(op.lowered({"B": 4096, "L": 64}).scheduled)
    assert [f.kind for f in loops if f.var.name == "i"] == ["serial"]
    assert any(f.kind == "parallel" for f in loops)


def test_fusion_keeps_the_recurrence():
    source = """
op f(X: f32[T]) -> Y: f32[T] {
    H: f32[T]
    H[t] = select(t == 0, X[t], H[t - 1] * 0.5 + X[t])
    Y[t] = H[t] + 1.0
}
"""
    text = tcc.compile(source).f.lower(np.zeros(5, np.float32), stage="fused")
    assert "keep H: a recurrence along t" in text


@pytest.mark.parametrize("read,why", [
    ("H[t + 1, d]", "later position along t"),
    ("H[t - 1, d - 1]", "offset along t and d"),
    ("H[t - S, d]", "not of the form t - c"),
    ("H[2 * t - 1, d]", "not of the form t - c"),
    ("H[t - 1, 0]", "not of the form d - c"),
    ("H[t, d]", "reads the element it is defining"),
])
def test_invalid_recurrences(read, why):
    source = f"""
op bad(A: f32[T, D], S: i64) -> H: f32[T, D] {{
    H[t, d] = select(t == 0, A[t, d], {read})
}}
"""
    with pytest.raises(TccShapeError, match=why) as info:
        tcc.compile(source)
    assert "<string>:3:" in str(info.value) and read.split("[")[0] in str(info.value)


def test_offsets_along_two_axes_in_two_reads():
    source = """
op bad(A: f32[T, D]) -> H: f32[T, D] {
    H[t, d] = select(t == 0 or d == 0, A[t, d], H[t - 1, d] + H[t, d - 1])
}
"""
    with pytest.raises(TccShapeError, match="along t and along d"):
        tcc.compile(source)


def test_an_undeclared_intermediate_cannot_read_itself():
    source = "op bad(A: f32[T]) -> Y: f32[T] {\n    H[t] = select(t == 0, A[t], H[t - 1])\n    Y[t] = H[t]\n}\n"
    with pytest.raises(TccShapeError, match="declare it"):
        tcc.compile(source)


def test_an_unguarded_read_is_a_bounds_error():
    source = "op bad(A: f32[T]) -> H: f32[T] {\n    H[t] = A[t] + H[t - 1]\n}\n"
    with pytest.raises(tcc.TccError, match="H"):
        tcc.compile(source).bad(np.zeros(5, np.float32))


def test_grad_of_a_recurrence_reading_itself_in_a_reduction_is_a_clear_error():
    """(Recurrences differentiate: tests/test_grad_data.py; a read of itself inside a reduction does not.)"""
    source = ("op f(A: f32[T, D]) -> H: f32[T, D] {\n"
              "    H[t, d] = select(t == 0, A[t, d], sum[e: 2](H[t - 1, d] * A[t, d]))\n}\n")
    with pytest.raises(tcc.TccError, match="H is a recurrence that reads itself inside a reduction") as info:
        tcc.grad(tcc.compile(source).f)
    assert "<string>:2:" in str(info.value)


def test_a_schedule_keeps_a_recurrence_in_order(rng):
    """``fuse`` refuses a recurrence's loop (fused, it was bound to threads: CUDA fuzz seed 40336,
    a prefix sum under "fuse i j"), and ``split`` keeps both halves in order, so neither can
    be vectorised or parallelised afterwards."""
    source = "op f(X: f32[N, K]) -> Y: f32[N, K] {\n    Y[i, j] = sum[k: j + 1](X[i, k])\n}"
    with pytest.raises(TccScheduleError, match="runs in order"):
        tcc.compile(source).f.schedule("fuse(i, j)")(np.ones((3, 5), np.float32))
    X = rng.standard_normal((7, 33)).astype(np.float32)
    split = tcc.compile(source).f.schedule("split(j, 8, jo, ji)")
    np.testing.assert_allclose(split(X), np.cumsum(X, axis=1), rtol=1e-5, atol=1e-5)
    with pytest.raises(TccScheduleError):
        tcc.compile(source).f.schedule("split(j, 8, jo, ji); vectorize(ji)")(X)
