"""im2col's row blocks: a strided conv with large patches makes and multiplies them a few output
rows at a time (passes/im2col.py), under a loop the threads share, its epilogue in the tile store."""

import numpy as np
import pytest
from helpers import check_op

import tcc

CONV = """
op conv7[S = 2, P = 3](X: f32[N, C, H, W], Wt: f32[F, C, 7, 7], b: f32[F])
    -> Y: f32[N, F, (H + 2*P - 7) // S + 1, (W + 2*P - 7) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s]) + b[f], 0.0)
}
"""


def _text(stage, n, c, h, w, f, **cparams):
    op = tcc.compile(CONV).conv7
    z = np.zeros
    return op.lower(z((n, c, h, w), np.float32), z((f, c, 7, 7), np.float32), z(f, np.float32), stage=stage,
                    **cparams)


def test_large_strided_patches_are_blocked_by_rows():
    fused = _text("fused", 1, 3, 140, 140, 8)  # 147 x 70*70 patches: 2.9 MiB
    assert "block of 10 output rows (strided patches)" in fused
    assert "group [Xp_patches, Y_gemm] share 2 outer loop(s)" in fused
    scheduled = _text("scheduled", 1, 3, 140, 140, 8)
    assert "# parallel" in scheduled.split("\n")[2]  # the row blocks go to the threads
    assert "allocate Y_gemm:" not in scheduled and "= max(Y_gemm_c1[ii, jj] + b[" in scheduled


def test_small_or_unit_stride_patches_are_not_blocked():
    assert "output rows" not in _text("fused", 1, 3, 60, 60, 8)  # 0.6 MiB of patches
    assert "output rows" not in _text("fused", 1, 3, 140, 140, 8, S=1)  # stride 1: gathered into panels


@pytest.mark.parametrize("shapes", [dict(N=1, C=3, H=140, W=140, F=8), dict(N=2, C=3, H=141, W=139, F=5)])
def test_row_blocked_conv_matches_reference(shapes, rng):
    check_op(CONV, "conv7", shapes, rng)
