"""The CPU auto-scheduler on convolutions: im2col's GEMM, nested in the batch loop, is scheduled."""

from pathlib import Path

import numpy as np
import pytest
from helpers import check_op

import tcc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SRC = (EXAMPLES / "conv2d_relu.tc").read_text()


@pytest.mark.parametrize("shapes", [
    dict(N=2, C=5, H=23, W=19, F=29, KH=3, KW=3),
    dict(N=1, C=7, H=25, W=21, F=13, KH=3, KW=3, S=2),
    dict(N=2, C=3, H=31, W=29, F=40, KH=5, KW=3, P=2),
])
def test_nested_conv_gemm_matches_reference(shapes, rng):
    check_op(SRC, "conv2d_relu", shapes, rng)


def test_nested_conv_gemm_is_scheduled():
    op = tcc.compile(SRC, conv="im2col").conv2d_relu
    x, w, b = np.zeros((2, 5, 23, 19), np.float32), np.zeros((29, 5, 3, 3), np.float32), np.zeros(29, np.float32)
    text = op.lower(x, w, b, stage="scheduled")
    batch = text.index("for n")
    assert text.index("Xp_patches_c1[") > batch  # the patches are packed (cache B at ko) per batch element
    assert "Wt_c1[" in text and "Y_gemm_c1[ii, jj] = Y_gemm_c1[ii, jj] + " in text  # A packed, C in registers
    assert "for kk in 0..45:" in text  # c, r, s fused into one k loop
    assert "for jj in 0..32:  # vector" in text and "for ii in 0..12:  # unroll" in text
    assert "j_col" in text  # the patch gather runs over rows and (vector) columns
    parallel = [line.strip() for line in text.splitlines() if "# parallel" in line]
    assert parallel and not any(line.startswith("for n") for line in parallel)  # inside the batch loop


def test_two_nested_contractions_get_their_own_tile_loops(rng):
    src = """
op two(X: f32[N, C, H, W], W1: f32[F, C, 3, 3], W2: f32[F, F, 3, 3]) -> Y: f32[N, F, H - 4, W - 4] {
    Z[n, f, y, x] = max(sum[c, r, s](X[n, c, y + r, x + s] * W1[f, c, r, s]), 0.0)
    Y[n, f, y, x] = sum[c, r, s](Z[n, c, y + r, x + s] * W2[f, c, r, s])
}
"""
    check_op(src, "two", dict(N=2, C=6, H=27, W=25, F=20), rng)
    op = tcc.compile(src).two
    x, w1, w2 = (np.zeros(s, np.float32) for s in [(2, 6, 27, 25), (20, 6, 3, 3), (20, 20, 3, 3)])
    text = op.lower(x, w1, w2, stage="scheduled")
    assert "for kk2 in" in text and "for ir2 in" in text
