"""Programs the differential fuzzer (tests/fuzz) found wrong, each shrunk by hand and checked
against the reference on random data. Grouped by the bug they exposed."""

import numpy as np
import pytest
from helpers import check_op

import tcc


def test_f64_to_f16_stores_round_like_numpy(rng):
    """x86 has no f64 -> f16 instruction: LLVM calls libgcc's __truncdfhf2, which the engine
    could not resolve (a jump to address 0)."""
    lib = tcc.compile("op fz(X: f64[N]) -> Y0: f16[N] { Y0[i] = X[i] }")
    x = np.concatenate([rng.standard_normal(37) * 1e3, [65519.9, 65520.0, 1e-8, -6.1e-5, np.inf, np.nan]])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(lib.fz(x), x.astype(np.float16))
    check_op("op fz(X: f64[N]) -> Y0: f32[N] { Y0[i] = f16(X[i] * 3.0) }", "fz", dict(N=7), rng)


@pytest.mark.parametrize("source", [
    "op fz(X: i32[66]) -> Y: i32[33] { Y[i] = X[2*i] }",
    "op fz(X: i64[33]) -> Y: i64[35] { Xp = pad(X, [1]); Y[i] = Xp[i] }",
    "op fz(X: i8[33, 4]) -> Y: bool[33] { Y[i] = X[i, 0] > 1 }",
    "op fz(X: bool[70]) -> Y: bool[33] { Y[i] = X[2*i + 1] and X[2*i] }",
])
def test_strided_and_padded_integer_reads_vectorise(source, rng):
    """Masked loads and gathers of integer vectors named their intrinsic with a float suffix."""
    check_op(source, "fz", {}, rng)
