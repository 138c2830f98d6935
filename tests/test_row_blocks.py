"""im2col's row blocks: a strided conv with large patches makes and multiplies them a few output
rows at a time (passes/te/im2col.py), under a loop the threads share, its epilogue in the tile store."""

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


CONV3D = """
op conv3d(X: f32[N, C, D, H, W], Wt: f32[F, C, 3, 3, 3])
    -> Y: f32[N, F, (D - 3) // 2 + 1, (H - 3) // 2 + 1, (W - 3) // 2 + 1] {
    Y[n, f, z, y, x] = sum[c, dz, r, s](X[n, c, z*2 + dz, y*2 + r, x*2 + s] * Wt[f, c, dz, r, s])
}
"""

DILATED = """
op dilated(X: f32[N, C, H, W], Wt: f32[F, C, 3, 3]) -> Y: f32[N, F, (H + 4 - 5) // 2 + 1, (W + 4 - 5) // 2 + 1] {
    Xp = pad(X, [0, 0, 2, 2])
    Y[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y*2 + r*2, x*2 + s*2] * Wt[f, c, r, s]), 0.0)
}
"""


def test_row_blocked_3d_and_dilated_convs_match_reference(rng):
    shapes3 = dict(N=1, C=2, D=45, H=45, W=47, F=4)  # 54 x 22*22*23 patches: 2.4 MiB
    op = tcc.compile(CONV3D).conv3d
    assert "output rows (strided patches)" in op.stage_text(shapes3, "fused")
    check_op(CONV3D, "conv3d", shapes3, rng)
    shapes = dict(N=2, C=5, H=130, W=131, F=6)  # 45 x 65*65 patches: 0.7 MiB, not blocked
    check_op(DILATED, "dilated", shapes, rng)
    big = dict(N=1, C=16, H=130, W=129, F=6)  # 144 x 65*65 patches: 2.3 MiB, blocked
    assert "output rows (strided patches)" in tcc.compile(DILATED).dilated.stage_text(big, "fused")
    check_op(DILATED, "dilated", big, rng)
