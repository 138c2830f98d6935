"""Indices that read data (gather) and runtime-scalar offsets, as DSL.md writes them: checked at
the call (a TccIndexError naming the tensor, position and value, with nothing written), clamped
indices unchecked, against NumPy and the reference at odd sizes; CUDA through NVRTC and the GPU
simulator."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccBoundsError, TccIndexError
from tcc.testing import reference_results

GATHERS = "".join(step11_ops().get(name, "") for name in ("embedding", "pick", "window")) or """
op embedding(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {
    Y[n, d] = E[idx[n], d]
}
op pick(X: f32[N, C], lab: i64[N]) -> Y: f32[N] {
    Y[n] = X[n, lab[n]]
}
op window[L = 1](X: f32[T, D], start: i64) -> Y: f32[L, D] {
    Y[i, d] = X[start + i, d]
}
"""


@pytest.mark.parametrize("v,d,n", [(1, 1, 1), (7, 33, 7), (1000, 64, 33), (33, 7, 1000)])
def test_embedding_lookup(rng, v, d, n):
    op = tcc.compile(GATHERS).embedding
    E, idx = rng.standard_normal((v, d)).astype(np.float32), rng.integers(0, v, n)
    out = np.full((n, d), np.nan, np.float32)
    np.testing.assert_array_equal(op(E, idx, out=out), E[idx])
    np.testing.assert_array_equal(reference_results(op.te, [E, idx], {"V": v, "D": d, "N": n})[0], E[idx])


@pytest.mark.parametrize("n,c", [(1, 1), (7, 33), (1000, 7)])
def test_label_pick_and_window(rng, n, c):
    lib = tcc.compile(GATHERS)
    X, lab = rng.standard_normal((n, c)).astype(np.float32), rng.integers(0, c, n)
    np.testing.assert_array_equal(lib.pick(X, lab), X[np.arange(n), lab])
    start = int(rng.integers(0, n))
    np.testing.assert_array_equal(lib.window(X, start, L=n - start), X[start:])


@pytest.mark.parametrize("bad", [-1, 1000, 2**40])
def test_out_of_range_index_is_an_error_and_writes_nothing(rng, bad):
    op = tcc.compile(GATHERS).embedding
    E, idx = rng.standard_normal((1000, 8)).astype(np.float32), rng.integers(0, 1000, 33)
    idx[17] = bad
    out = np.full((33, 8), 7.0, np.float32)
    with pytest.raises(TccIndexError, match=rf"index 0 of E \(idx\[n\]\) is {bad} at n=17, outside \[0, 1000\)"):
        op(E, idx, out=out)
    assert (out == 7.0).all()
    with pytest.raises(TccIndexError):  # the oracle refuses the same call
        reference_results(op.te, [E, idx], {"V": 1000, "D": 8, "N": 33})


def test_runtime_scalar_offset_out_of_range():
    X = np.zeros((7, 3), np.float32)
    with pytest.raises(TccIndexError, match=r"index 0 of X \(start \+ i\) is 7 at i=2"):
        tcc.compile(GATHERS).window(X, 5, L=3)


def test_clamped_index_is_not_checked(rng):
    """``min(max(idx[n], 0), V - 1)`` is proved in range: no check, and out-of-range ids clamp."""
    op = tcc.compile("op f(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {\n"
                     "    Y[n, d] = E[min(max(idx[n], 0), V - 1), d]\n}").f
    E, idx = rng.standard_normal((9, 4)).astype(np.float32), np.array([-3, 4, 20])
    np.testing.assert_array_equal(op(E, idx), E[np.clip(idx, 0, 8)])
    assert op._index_checks({"V": 9, "D": 4, "N": 3}) is None


def test_an_index_read_under_select_is_checked_where_the_select_takes_it(rng):
    """``select(n < K, E[idx[n]], 0)``: only positions n < K are read, so only they are checked."""
    op = tcc.compile("op f[K = 2](E: f32[V], idx: i64[N]) -> Y: f32[N] {\n"
                     "    Y[n] = select(n < K, E[idx[n]], 0.0)\n}").f
    E = rng.standard_normal(5).astype(np.float32)
    got = op(E, np.array([1, 3, 99, -7]), K=2)
    np.testing.assert_array_equal(got, [E[1], E[3], 0, 0])
    with pytest.raises(TccIndexError, match="is 99 at n=2"):
        op(E, np.array([1, 3, 99, -7]), K=3)


def test_an_index_reading_a_computed_tensor_is_a_compile_error():
    source = "op f(E: f32[V], idx: i64[N]) -> Y: f32[N] {\n    j[n] = idx[n] + 1\n    Y[n] = E[j[n]]\n}"
    with pytest.raises(TccBoundsError, match="which this op computes"):
        tcc.compile(source).f(np.zeros(4, np.float32), np.zeros(2, np.int64))


def test_gathers_on_cuda_match_the_cpu(rng):
    pytest.importorskip("cuda.bindings.nvrtc")
    E, idx = rng.standard_normal((33, 7)).astype(np.float32), rng.integers(0, 33, 9)
    op = tcc.compile(GATHERS, target="cuda", arch="sm_90").embedding
    arrays = {"E": E, "idx": idx, "Y": np.full((9, 7), np.nan, np.float32)}
    gpu_sim.run(op.lowered(op.bindings_for((E, idx), {})).scheduled, arrays)
    np.testing.assert_array_equal(arrays["Y"], E[idx])
    assert "idx[" in op.lower(E, idx, stage="cuda") or "idx" in op.lower(E, idx, stage="cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not tcc.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_index_checks_run_on_the_gpu(rng):
    """On CUDA the checks are a guard op run there, before the kernels: in range, only its count
    is copied to the host; out of range, the host pass names the position, and nothing is written."""
    torch = pytest.importorskip("torch")
    op = tcc.compile(GATHERS, target="cuda").embedding
    E = torch.from_numpy(rng.standard_normal((1000, 64)).astype(np.float32)).cuda()
    idx = torch.from_numpy(rng.integers(0, 1000, 777)).cuda()
    torch.testing.assert_close(op(E, idx), E[idx])
    assert op._guards, "the checks ran as a guard op on the device"
    idx[5] = 1000
    out = torch.full((777, 64), 7.0, device="cuda")
    with pytest.raises(TccIndexError, match="is 1000 at n=5"):
        op(E, idx, out=out)
    assert bool((out == 7.0).all())


def test_a_two_dimensional_id_tensor_names_the_position(rng):
    """Ids read whole (``idx[n, k]`` over every n and k) are checked straight from the tensor;
    the error still names the position in the index's variables and the value."""
    op = tcc.compile("op g(E: f32[V, D], idx: i64[N, K]) -> Y: f32[N, K, D] {\n"
                     "    Y[n, k, d] = E[idx[n, k], d]\n}").g
    E, idx = rng.standard_normal((50, 3)).astype(np.float32), rng.integers(0, 50, (7, 5))
    np.testing.assert_array_equal(op(E, idx), E[idx])
    idx[4, 2] = -1
    out = np.full((7, 5, 3), 9.0, np.float32)
    with pytest.raises(TccIndexError, match=r"is -1 at k=2, n=4, outside \[0, 50\)"):
        op(E, idx, out=out)
    assert (out == 9.0).all()


@pytest.mark.parametrize("n", [1, 7, 33])
def test_wrapped_ids_read_three_times_are_checked_once(rng, n):
    """An ONNX-style gather (negative ids count from the end) read three times, in two
    statements: one index check (the same values, the variables renamed), evaluated on the ids
    themselves; in-range negative ids give NumPy's rows, an id outside [-V, V) names its position."""
    op = tcc.compile("""
op rms(E: f32[V, D], ids: i64[N]) -> Y: f32[N, D] {
    s: f32[N]
    s[n] = sum[d](E[select(ids[n] < 0, ids[n] + V, ids[n]), d] * E[select(ids[n] < 0, ids[n] + V, ids[n]), d])
    Y[n, d] = E[select(ids[n] < 0, ids[n] + V, ids[n]), d] / sqrt(s[n] + 1.0)
}
""").rms
    v, d = 1000, 33
    E, ids = rng.standard_normal((v, d)).astype(np.float32), rng.integers(-v, v, n)
    assert len(op._index_checks({"V": v, "D": d, "N": n}).index_checks) == 1
    rows = E[ids].astype(np.float64)
    out = np.full((n, d), np.nan, np.float32)
    expected = rows / np.sqrt((rows * rows).sum(axis=1, keepdims=True) + 1.0)
    np.testing.assert_allclose(op(E, ids, out=out), expected, rtol=1e-5, atol=1e-6)
    bad = ids.copy()
    bad[n - 1] = -v - 1
    untouched = np.full((n, d), np.nan, np.float32)
    with pytest.raises(TccIndexError, match=f"is -1 at n={n - 1}, outside \\[0, {v}\\)"):
        op(E, bad, out=untouched)
    assert np.isnan(untouched).all()
