"""On CUDA an element-wise statement over a reduction's result (a GELU reading ``Z`` twice)
joins the reduction's final store (tcc/passes/autoschedule_cuda/epilogue.py): one kernel, the
intermediate never written; checked by the simulator of scheduled CUDA loop IR
(tests/gpu_sim.py) against the CPU, where it must not fuse too."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.ir.loops import Allocate, For, walk_stmts

pytest.importorskip("cuda.bindings.nvrtc")

SOURCE = """
op linear_gelu(X: f16[M, K], W: f16[N, K], b: f16[N]) -> Y: f16[M, N] {
    Z[m, n] = sum[k](f32(X[m, k]) * f32(W[n, k])) + f32(b[n])
    Y[m, n] = f16(0.5 * Z[m, n] * (1.0 + erf(Z[m, n] * 0.7071067811865476)))
}
op mm_square(A: f32[M, K], B: f32[K, N]) -> Y: f32[M, N] {
    Z[i, j] = sum[k](A[i, k] * B[k, j])
    Y[i, j] = Z[i, j] * Z[i, j] - Z[i, j]
}
op mm_transposed(A: f32[M, K], B: f32[K, N]) -> Y: f32[N, M] {
    Z[i, j] = sum[k](A[i, k] * B[k, j])
    Y[j, i] = Z[i, j] * Z[i, j]
}
"""


def _kernels(func) -> int:
    return sum(1 for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "block.x")


def _temps(func) -> set[str]:
    return {s.buffer.name for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "global"}


def _run(name: str, bindings: dict, args: dict, out: str, shape: tuple, dtype) -> tuple:
    op = tcc.compile(SOURCE, target="cuda", arch="sm_90")[name]
    func = op.lowered(bindings).scheduled
    arrays = {**args, out: np.full(shape, np.nan, dtype)}
    gpu_sim.run(func, arrays)
    return func, arrays[out], tcc.compile(SOURCE)[name](*args.values())


def test_linear_gelu_is_one_tensor_core_kernel(rng):
    M, N, K = 128, 128, 64
    x, w = (rng.standard_normal(s).astype(np.float16) for s in ((M, K), (N, K)))
    b = rng.standard_normal(N).astype(np.float16)
    func, got, want = _run("linear_gelu", {"M": M, "N": N, "K": K}, {"X": x, "W": w, "b": b}, "Y", (M, N), np.float16)
    assert "Z" not in _temps(func)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("M,K,N", [(33, 40, 7), (64, 32, 65)])
def test_a_gemm_epilogue_reading_its_result_twice_fuses(rng, M, K, N):
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    func, got, want = _run("mm_square", {"M": M, "K": K, "N": N}, {"A": a, "B": b}, "Y", (M, N), np.float32)
    assert not _temps(func) and _kernels(func) >= 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_a_consumer_at_another_element_keeps_the_intermediate(rng):
    """``Y[j, i] = f(Z[i, j])``: the consumer's loops are not the producer's, so Z stays."""
    a, b = rng.standard_normal((33, 40)).astype(np.float32), rng.standard_normal((40, 7)).astype(np.float32)
    func, got, want = _run("mm_transposed", {"M": 33, "K": 40, "N": 7}, {"A": a, "B": b}, "Y", (7, 33), np.float32)
    assert "Z" in _temps(func)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_a_recurrence_keeps_its_own_tensor(rng):
    """A prefix product of an inner reduction, in another dtype than its result, is a recurrence
    into ``Y_prefix`` with a reduction nest's form, then a cast; the recurrence reads
    ``Y_prefix`` itself, so the cast must not replace its store (CUDA fuzz seed 50209: 'load
    from unknown buffer Y0_prefix')."""
    source = ("op fz1(X1: i64[N, M], X2: bool[N, K]) -> Y0: f32[K, M] {\n"
              "    Y0[i, j] = prod[k1: i](((min[k2: 3]((i32(X2[0, k1]) % X1[0, j]))) % 3 - 1))\n}\n")
    op = tcc.compile(source, target="cuda", arch="sm_90").fz1
    x1 = rng.integers(-5, 6, (3, 7)).astype(np.int64)
    x2 = rng.integers(0, 2, (3, 33)).astype(bool)
    func = op.lowered({"N": 3, "M": 7, "K": 33}).scheduled
    assert "Y0_prefix" in _temps(func)
    arrays = {"X1": x1, "X2": x2, "Y0": np.full((33, 7), np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_array_equal(arrays["Y0"], tcc.compile(source).fz1(x1, x2))
