"""rand, randn and philox: Philox-4x32-10 against its published test vectors, the DSL.md dropout
as written, bit-identical ``rand`` on the CPU, the reference, CUDA (through NVRTC and the GPU
simulator) and under a user schedule, and the errors for a misused call."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest
from helpers import check_op
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccTypeError
from tcc.ir.philox import philox
from tcc.testing import reference_results

DROPOUT = step11_ops().get("dropout") or """
op dropout(X: f32[N, D], p: f32, seed: i64) -> Y: f32[N, D] {
    Y[n, d] = select(rand(seed, n, d) < p, 0.0, X[n, d] / (1.0 - p))
}
"""
NOISE = """
op noise(X: f32[N, D], seed: i64) -> (U: f32[N, D], Z: f32[N, D], W: i64[N, D]) {
    U[n, d] = rand(seed, n, d)
    Z[n, d] = randn(seed, n, d)
    W[n, d] = philox(3, seed, n, d, 7)
}
"""


@pytest.mark.parametrize("counter,key,expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    """Random123's known-answer vectors for philox4x32_10."""
    seed = np.array((key[1] << 32) | key[0], np.uint64).view(np.int64)
    assert tuple(int(w) for w in philox(seed, tuple(np.int64(c) for c in counter))) == expected


@pytest.mark.parametrize("n,d", [(1, 1), (7, 33), (1000, 129)])
def test_dropout_as_written_is_the_reference_bit_for_bit(n, d, rng):
    X = rng.standard_normal((n, d)).astype(np.float32)
    got = tcc.compile(DROPOUT).dropout(X, np.float32(0.3), 12345)
    want = reference_results(tcc.compile(DROPOUT).dropout.te, [X, np.float32(0.3), 12345], {"N": n, "D": d})[0]
    np.testing.assert_array_equal(got, want)
    kept = got != 0
    np.testing.assert_allclose(got[kept], X[kept] / np.float32(0.7), rtol=1e-6)
    if n * d > 10000:
        assert abs(kept.mean() - 0.7) < 0.01


def test_rand_and_randn_against_the_reference(rng):
    n, d, seed = 333, 129, -987654321987
    X = rng.standard_normal((n, d)).astype(np.float32)
    op = tcc.compile(NOISE).noise
    U, Z, W = op(X, seed)
    rU, rZ, rW = reference_results(op.te, [X, seed], {"N": n, "D": d})
    np.testing.assert_array_equal(U, rU)
    np.testing.assert_array_equal(W, rW)
    np.testing.assert_allclose(Z, rZ, rtol=1e-5, atol=1e-5)  # f32 log and cos: a few ulps
    assert U.min() >= 0 and U.max() < 1 and abs(U.mean() - 0.5) < 0.01
    assert abs(Z.mean()) < 0.02 and abs(Z.std() - 1) < 0.02
    assert W.min() >= 0 and W.max() < 2**32
    assert not np.array_equal(op(X, seed + 1)[0], U)  # another seed, other numbers
    np.testing.assert_array_equal(op(X, seed)[0], U)  # the same seed, the same numbers


def test_rand_does_not_depend_on_the_schedule(rng):
    X = rng.standard_normal((37, 45)).astype(np.float32)
    plain = tcc.compile(DROPOUT).dropout
    tiled = plain.schedule("tile(n, d, 4, 16); vectorize(d_i); parallel(n_o)")
    np.testing.assert_array_equal(tiled(X, np.float32(0.5), 7), plain(X, np.float32(0.5), 7))


def test_dropout_on_cuda_is_the_cpu_bit_for_bit(rng):
    """NVRTC compiles the generated Philox; the GPU simulator runs the scheduled CUDA loops."""
    pytest.importorskip("cuda.bindings.nvrtc")
    X = rng.standard_normal((7, 33)).astype(np.float32)
    op = tcc.compile(DROPOUT, target="cuda", arch="sm_90").dropout
    assert "tcc_philox(" in op.lower(X, np.float32(0.25), 99, stage="cuda")
    arrays = {"X": X, "Y": np.full(X.shape, np.nan, np.float32)}
    gpu_sim.run(op.lowered(op.bindings_for((X, np.float32(0.25), 99), {})).scheduled, arrays,
                scalars={"p": np.float32(0.25), "seed": 99})
    np.testing.assert_array_equal(arrays["Y"], tcc.compile(DROPOUT).dropout(X, np.float32(0.25), 99))


def test_noise_compiles_to_cubin():
    pytest.importorskip("cuda.bindings.nvrtc")
    from tcc.runtime import cuda as rt

    op = tcc.compile(NOISE, target="cuda", arch="sm_90").noise
    X = np.zeros((5, 3), np.float32)
    artifact = rt.build(op.lowered(op.bindings_for((X, 1), {})).scheduled, op.target)
    assert all(c.startswith(b"\x7fELF") for c in rt.load("noise", artifact).cubins)


@pytest.mark.parametrize("n", [1, 7, 33])
def test_rand_in_an_expression_matches_the_reference(n, rng):
    source = "op f(X: f32[N], seed: i64) -> Y: f32[N] {\n    Y[i] = X[i] * rand(seed, i) + randn(seed, i, 1)\n}"
    check_op(source, "f", {"N": n}, rng, scalars={"seed": 5})


def test_gradient_treats_rand_as_a_constant(rng):
    op = tcc.compile("op f(X: f32[N], seed: i64) -> Y: f32[N] {\n    Y[i] = X[i] * rand(seed, i)\n}").f
    X, dY = rng.standard_normal(9).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    U = tcc.compile("op u(seed: i64, X: f32[N]) -> Y: f32[N] {\n    Y[i] = rand(seed, i)\n}").u(3, X)
    np.testing.assert_allclose(tcc.grad(op)(X, 3, dY), dY * U, rtol=1e-6)


@pytest.mark.parametrize("body,message", [
    ("rand(1.5, i)", "integers"),
    ("rand(s)", "1 to 4 indices"),
    ("rand(s, i, i, i, i, i)", "1 to 4 indices"),
    ("f32(philox(4, s, i))", "output word"),
    ("randn(s, i > 0)", "integers"),
])
def test_misused_calls_are_type_errors(body, message):
    with pytest.raises(TccTypeError, match=message):
        tcc.compile(f"op f(X: f32[N], s: i64) -> Y: f32[N] {{\n    Y[i] = {body}\n}}")
