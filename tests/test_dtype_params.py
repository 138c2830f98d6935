"""Ops generic over dtypes (``op rmsnorm[T: float](...)``): one kernel per binding, each checked
against the reference at odd sizes; the binding read from the arguments, refused where the kind
does not admit it or where arguments disagree; CUDA C for half types through NVRTC."""

from __future__ import annotations

import numpy as np
import pytest
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccArgumentError, TccTypeError
from tcc.testing import reference_results

RMSNORM = step11_ops().get("rmsnorm") or """
op rmsnorm[T: float](X: T[N, D], g: T[D]) -> Y: T[N, D] {
    r[n] = rsqrt(sum[d](f32(X[n, d]) * f32(X[n, d])) / D + 1e-6)
    Y[n, d] = T(f32(X[n, d]) * r[n] * f32(g[d]))
}
"""
SCALE = """
op scale[T: int](X: T[N], k: i64) -> Y: T[N] {
    Y[i] = T(X[i] * k)
}
op pick[T: any](C: bool[N], A: T[N], B: T[N]) -> Y: T[N] {
    Y[i] = select(C[i], A[i], B[i])
}
"""


def rmsnorm_numpy(X, g):
    x = X.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * g.astype(np.float64)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (np.float32, 1e-5), (np.float64, 1e-5)])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 33), (1000, 64)])
def test_rmsnorm_as_written_in_every_float_type(rng, dtype, tol, n, d):
    op = tcc.compile(RMSNORM).rmsnorm
    X, g = rng.standard_normal((n, d)).astype(dtype), rng.standard_normal(d).astype(dtype)
    out = np.full((n, d), np.nan, dtype)
    Y = op(X, g, out=out)
    assert Y is out and Y.dtype == dtype
    np.testing.assert_allclose(Y.astype(np.float64), rmsnorm_numpy(X, g), rtol=tol, atol=tol)
    bound = op.bound(T={np.float16: "f16", np.float32: "f32", np.float64: "f64"}[dtype])
    expected = reference_results(bound.te, [X, g], {"N": n, "D": d})[0]  # the oracle, on this binding's TE
    np.testing.assert_allclose(Y.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def test_bindings_share_a_process_and_a_cache(rng, tmp_path, monkeypatch):
    """Each binding is its own kernel: calling f16 then f32 then f64 gives each its own answer."""
    monkeypatch.setenv("TCC_CACHE_DIR", str(tmp_path))
    op = tcc.compile(RMSNORM).rmsnorm
    for dtype in (np.float16, np.float32, np.float64, np.float32):
        X, g = rng.standard_normal((5, 9)).astype(dtype), rng.standard_normal(9).astype(dtype)
        np.testing.assert_allclose(op(X, g).astype(np.float64), rmsnorm_numpy(X, g), rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_int_and_any_kinds(rng, dtype):
    lib = tcc.compile(SCALE)
    X = rng.integers(-9, 10, 33).astype(dtype)
    np.testing.assert_array_equal(lib.scale(X, 3), (X.astype(np.int64) * 3).astype(dtype))
    C = rng.random(33) > 0.5
    for t in (dtype, np.float32, np.bool_):
        A, B = rng.integers(0, 2, 33).astype(t), rng.integers(0, 2, 33).astype(t)
        np.testing.assert_array_equal(lib.pick(C, A, B), np.where(C, A, B))


def test_a_kind_refuses_other_dtypes_and_arguments_must_agree():
    op = tcc.compile(RMSNORM).rmsnorm
    with pytest.raises(TccTypeError, match="T is float"):
        op(np.zeros((2, 3), np.int32), np.zeros(3, np.int32))
    with pytest.raises(TccArgumentError, match="must be f16"):
        op(np.zeros((2, 3), np.float16), np.zeros(3, np.float32))
    with pytest.raises(TccTypeError, match="T is int"):
        tcc.compile(SCALE).scale(np.zeros(3, np.float32), 2)


@pytest.mark.parametrize("source,message", [
    ("op f[T: real](X: T[N]) -> Y: T[N] {\n    Y[i] = X[i]\n}", "not a kind of dtype"),
    ("op f[T: float](X: f32[N]) -> Y: T[N] {\n    Y[i] = X[i]\n}", "nothing binds it"),
    ("op f[f32: float](X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i]\n}", "is a dtype"),
    ("op f[T: float](X: T[N], Z: U[N]) -> Y: T[N] {\n    Y[i] = X[i]\n}", "unknown dtype .U."),
])
def test_bad_type_parameters_are_errors_at_compile(source, message):
    with pytest.raises(TccTypeError, match=message):
        tcc.compile(source)


def test_lower_and_schedule_follow_the_binding(rng):
    op = tcc.compile(RMSNORM).rmsnorm
    X, g = rng.standard_normal((4, 8)).astype(np.float64), rng.standard_normal(8).astype(np.float64)
    assert "X: f64[4, 8]" in op.lower(X, g, stage="te")
    scheduled = op.schedule("parallel(n_1)")
    np.testing.assert_allclose(scheduled(X, g), rmsnorm_numpy(X, g), rtol=1e-6)
    assert "rmsnorm[T: float]" in repr(op)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_bindings_compile_to_cubin(dtype):
    pytest.importorskip("cuda.bindings.nvrtc")
    from tcc.runtime import cuda as rt

    op = tcc.compile(RMSNORM, target="cuda", arch="sm_90").rmsnorm.bound(T=dtype)
    lowered = op.lowered({"N": 64, "D": 96})
    artifact = rt.build(lowered.scheduled, op.target)
    assert all(c.startswith(b"\x7fELF") for c in rt.load("rmsnorm", artifact).cubins)
