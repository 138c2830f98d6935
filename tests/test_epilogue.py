"""An epilogue folded into a one-k-block GEMM's register-tile stores (passes/autoschedule_cpu/epilogue.py)."""

import numpy as np
import pytest
from helpers import check_op

import tcc

RESIDUAL = """
op mm_res(A: f32[M, K], B: f32[K, N], R: f32[M, N], b: f32[N]) -> C: f32[M, N] {
    C[i, j] = max(sum[k](A[i, k] * B[k, j]) + b[j], 0.0) + R[i, j] * 0.5
}
"""

TWO_USES = """
op two(A: f32[M, K], B: f32[K, N]) -> (P: f32[M, N], Q: f32[M, N]) {
    T[i, j] = sum[k](A[i, k] * B[k, j])
    P[i, j] = max(T[i, j], 0.0)
    Q[i, j] = T[i, j] * 2.0 - P[i, j]
}
"""

CONV = """
op conv_bias_relu(X: f32[N, C, H, W], Wt: f32[F, C, 3, 3], b: f32[F]) -> Y: f32[N, F, H, W] {
    Xp = pad(X, [0, 0, 1, 1])
    Y[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y + r, x + s] * Wt[f, c, r, s]) + b[f], 0.0)
}
"""


@pytest.mark.parametrize("m, k, n", [(1, 7, 33), (37, 29, 45), (61, 300, 99), (13, 1100, 40)])
def test_residual_epilogue(m, k, n, rng):
    check_op(RESIDUAL, "mm_res", {"M": m, "K": k, "N": n}, rng)


def test_epilogue_is_in_the_tile_store():
    op = tcc.compile(RESIDUAL).mm_res
    m, k, n = 40, 50, 64
    z = np.zeros
    text = op.lower(z((m, k), np.float32), z((k, n), np.float32), z((m, n), np.float32), z(n, np.float32),
                    stage="scheduled")
    assert "allocate C_acc:" not in text
    assert "C[" in text and "= max(C_acc_c1[ii, jj] + b[" in text


@pytest.mark.parametrize("m, k, n", [(7, 33, 45), (64, 64, 64)])
def test_gemm_result_read_twice_stays_materialised(m, k, n, rng):
    check_op(TWO_USES, "two", {"M": m, "K": k, "N": n}, rng)


def test_conv_epilogue_writes_the_output_from_registers(rng):
    op = tcc.compile(CONV, conv="im2col").conv_bias_relu
    z = np.zeros
    text = op.lower(z((2, 6, 9, 13), np.float32), z((20, 6, 3, 3), np.float32), z(20, np.float32),
                    stage="scheduled")
    assert "allocate Y_gemm:" not in text
    assert "Y[n_1, " in text and "= max(Y_gemm_c1[ii, jj] + b[" in text
    check_op(CONV, "conv_bias_relu", dict(N=2, C=6, H=9, W=13, F=20), rng)
    check_op(CONV, "conv_bias_relu", dict(N=1, C=1, H=1, W=1, F=1), rng)


POINTWISE = """
op pointwise(X: f32[N, C, H, W], Wt: f32[F, C, 1, 1], b: f32[F]) -> Y: f32[N, F, H, W] {
    Y[n, f, y, x] = max(sum[c, r, s](X[n, c, y + r, x + s] * Wt[f, c, r, s]) + b[f], 0.0)
}
"""


def test_merged_pixel_epilogue_in_the_tile_store(rng):
    """A 1x1 conv's GEMM runs over merged pixels (``Y[n, f, 0, y*W + x]``): the epilogue folds too."""
    op = tcc.compile(POINTWISE).pointwise
    z = np.zeros
    text = op.lower(z((2, 40, 9, 13), np.float32), z((24, 40, 1, 1), np.float32), z(24, np.float32),
                    stage="scheduled")
    assert "allocate Y_acc:" not in text and "= max(Y_acc_c1[ii, jj] + b[" in text
    check_op(POINTWISE, "pointwise", dict(N=2, C=40, H=9, W=13, F=24), rng)
    check_op(POINTWISE, "pointwise", dict(N=3, C=7, H=1, W=33, F=13), rng)


@pytest.mark.parametrize("k", [1024 + 256, 1024 + 77])  # whole k blocks only; a k tail after them
def test_several_k_blocks_apply_the_epilogue_in_the_last(k, rng):
    """K > 4 blocks: partial sums go to C_acc, the last block's tiles apply the epilogue (``if ko ==
    last`` when the blocks are whole, unconditionally in the k tail), and no second nest reads C_acc."""
    op = tcc.compile(RESIDUAL).mm_res
    m, n = 20, 70
    z = np.zeros
    text = op.lower(z((m, k), np.float32), z((k, n), np.float32), z((m, n), np.float32), z(n, np.float32),
                    stage="scheduled")
    assert "allocate C_acc:" in text and "_post" not in text
    assert ("if ko == 4:" in text) == (k % 256 == 0)
    check_op(RESIDUAL, "mm_res", {"M": m, "K": k, "N": n}, rng)


def test_conv_with_several_k_blocks(rng):
    check_op(CONV, "conv_bias_relu", dict(N=2, C=129, H=9, W=7, F=13), rng)  # K = 1161: 4 blocks + a tail


GELU = """
op gelu_mm(X: f32[T, D], W: f32[D, H], b: f32[H]) -> Y: f32[T, H] {
    h[t, j] = sum[k](X[t, k] * W[k, j]) + b[j]
    Y[t, j] = h[t, j] * 0.5 * (1.0 + erf(h[t, j] * 0.7071067811865476))
}
"""

GELU_BOTH = """
op gelu_both(X: f32[T, D], W: f32[D, H], b: f32[H]) -> (h: f32[T, H], Y: f32[T, H]) {
    h[t, j] = sum[k](X[t, k] * W[k, j]) + b[j]
    Y[t, j] = h[t, j] * 0.5 * (1.0 + erf(h[t, j] * 0.7071067811865476))
}
"""

MIRRORED = """
op mirrored(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    T[i, j] = sum[k](A[i, k] * B[k, j])
    C[i, j] = T[i, j] * T[i, N - 1 - j]
}
"""


def test_epilogue_reading_the_result_twice_folds_into_the_tile_store(rng):
    """GELU reads ``h = X @ W + b`` twice at the same element: ``+ b`` and GELU both go into the
    tile's store, and neither ``h_acc`` nor ``h`` is allocated."""
    op = tcc.compile(GELU).gelu_mm
    z = np.zeros
    text = op.lower(z((40, 64), np.float32), z((64, 96), np.float32), z(96, np.float32), stage="scheduled")
    assert "allocate h:" not in text and "allocate h_acc:" not in text and "_post" not in text
    assert "Y[" in text and "erf((h_acc_c1[ii, jj] + b[" in text
    for t, d, h in [(40, 64, 96), (1, 7, 33), (33, 1, 7), (64, 300, 256)]:
        check_op(GELU, "gelu_mm", {"T": t, "D": d, "H": h}, rng)


@pytest.mark.parametrize("t, d, h", [(7, 33, 45), (40, 64, 96), (20, 1024 + 256, 70)])
def test_gelu_epilogue_of_a_result_or_with_k_blocks(t, d, h, rng):
    """``h`` a result too (the chain stops at it), or several k blocks (only the first fold)."""
    check_op(GELU_BOTH, "gelu_both", {"T": t, "D": d, "H": h}, rng)
    check_op(GELU, "gelu_mm", {"T": t, "D": d, "H": h}, rng)


@pytest.mark.parametrize("m, k, n", [(7, 33, 45), (64, 64, 64)])
def test_two_reads_at_different_elements_stay_apart(m, k, n, rng):
    op = tcc.compile(MIRRORED).mirrored
    z = np.zeros
    text = op.lower(z((m, k), np.float32), z((k, n), np.float32), stage="scheduled")
    assert "allocate T:" in text
    check_op(MIRRORED, "mirrored", {"M": m, "K": k, "N": n}, rng)
