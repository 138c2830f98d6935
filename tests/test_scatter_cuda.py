"""``+=`` statements on CUDA: threads add atomically (``atomicAdd``, i64 through the unsigned
overload), or, with ``deterministic=True`` or for types without an atomic add, one thread adds in
the statement's order; checked in the GPU simulator against NumPy, and built through NVRTC."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest
from test_scatter import SCATTERS, embedding_grad

import tcc
from tcc.runtime import cuda as rt
from tcc.target import CudaTarget

SUMS = """
op sums[M = 1](X: T[N], idx: i64[N]) -> Y: T[M] {
    Y[m] = T(0)
    Y[idx[n]] += X[n]
}
"""


def simulate(op, args: tuple, cparams: dict, outputs: dict) -> dict:
    lowered = op.lowered(op.bindings_for(args, cparams))
    arrays = {**dict(zip(op.te.params, args)), **outputs}
    gpu_sim.run(lowered.scheduled, arrays)
    return arrays


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("v,d,n", [(1, 1, 1), (7, 33, 7), (5, 7, 1000)])
def test_embedding_grad_in_the_simulator(rng, deterministic, v, d, n):
    op = tcc.compile(SCATTERS, target="cuda", arch="sm_90", deterministic=deterministic).embedding_grad
    dY, idx = rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, v, n)
    got = simulate(op, (dY, idx), {"V": v}, {"dE": np.full((v, d), np.nan, np.float32)})["dE"]
    np.testing.assert_allclose(got, embedding_grad(dY, idx, v), rtol=1e-5, atol=1e-4)
    scheduled = op.lower(dY, idx, V=v, stage="scheduled")
    assert ("for tx1 in 0..1:" in scheduled) == deterministic  # one thread, in order


@pytest.mark.parametrize("n", [1, 33, 1000])
def test_histogram_in_the_simulator_and_atomic_i64(rng, n):
    op = tcc.compile(SCATTERS, target="cuda", arch="sm_90").histogram
    X = rng.integers(0, 16, n)
    got = simulate(op, (X,), {}, {"H": np.full(16, -1, np.int64)})["H"]
    np.testing.assert_array_equal(got, np.bincount(X, minlength=16))
    assert "atomicAdd((unsigned long long*)&H[" in op.lower(X, stage="cuda")


@pytest.mark.parametrize("dtype,atomic", [("f32", True), ("f64", True), ("i32", True), ("i64", True),
                                          ("f16", False), ("i8", False)])
def test_each_dtype_atomic_or_in_order(rng, dtype, atomic):
    src = SUMS.replace("T", dtype)
    op = tcc.compile(src, target="cuda", arch="sm_90").sums
    np_type = np.dtype(tcc.dtypes.ALL[dtype].numpy)
    X, idx = (rng.integers(-3, 4, 33)).astype(np_type), rng.integers(0, 5, 33)
    got = simulate(op, (X, idx), {"M": 5}, {"Y": np.full(5, 9, np_type)})["Y"]
    expected = np.zeros(5, np.float64)
    np.add.at(expected, idx, X.astype(np.float64))
    np.testing.assert_array_equal(got.astype(np.float64), expected)
    assert ("atomicAdd(" in op.lower(X, idx, M=5, stage="cuda")) == atomic


@pytest.mark.parametrize("deterministic", [False, True])
def test_scatter_kernels_compile_through_nvrtc(deterministic):
    pytest.importorskip("cuda.bindings.nvrtc")
    lib = tcc.compile(SCATTERS + SUMS.replace("T", "f64"), target="cuda", arch="sm_90", deterministic=deterministic)
    for op, args, cparams in [(lib.embedding_grad, (np.zeros((9, 33), np.float32), np.zeros(9, np.int64)), {"V": 4}),
                              (lib.histogram, (np.zeros(1000, np.int64),), {}),
                              (lib.sums, (np.zeros(7), np.zeros(7, np.int64)), {"M": 3})]:
        artifact = rt.build(op.lowered(op.bindings_for(args, cparams)).scheduled, CudaTarget.for_arch("sm_90"))
        assert artifact


def test_deterministic_is_a_bool_and_on_the_cache_key():
    with pytest.raises(tcc.TccError, match="deterministic= must be True or False"):
        tcc.compile(SCATTERS, target="cuda", deterministic="yes")
    plain = tcc.compile(SCATTERS, target="cuda", arch="sm_90").histogram
    fixed = tcc.compile(SCATTERS, target="cuda", arch="sm_90", deterministic=True).histogram
    assert plain.cache_key({"N": 7, "B": 16}) != fixed.cache_key({"N": 7, "B": 16})
    assert tcc.compile(SCATTERS, target="cpu", deterministic=True).histogram(np.array([1, 1]))[1] == 2
