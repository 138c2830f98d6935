"""f32 lanes divided by one value are computed through an f64 reciprocal (codegen_cpu/llvm_math.py):
bit for bit NumPy's (IEEE) quotients, special values included."""

import numpy as np

import tcc

SRC = "op d(X: f32[N, C], s: f32[N]) -> Y: f32[N, C] { Y[n, c] = X[n, c] / s[n] }"


def test_invariant_division_is_correctly_rounded(rng):
    op = tcc.compile(SRC).d
    n, c = 257, 1001
    x = rng.integers(0, 2**32, size=(n, c), dtype=np.uint64).astype(np.uint32).view(np.float32)  # any bits
    s = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    s[:12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3e38, 1.9999999, 1.0, 0.1, -7.0]
    x[:, :8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38, 1.0]
    normal = (rng.standard_normal((n, c)) * 10.0 ** rng.integers(-30, 30, (n, c))).astype(np.float32)
    for xs in (x, normal):
        with np.errstate(all="ignore"):
            want = xs / s[:, None]
        got = op(xs, s)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{(~same).sum()} quotients differ from IEEE division"
    assert "fpext" in op.lower(x, s, stage="llvm")  # the f64 path was taken
