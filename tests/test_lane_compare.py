"""Comparisons affine in the vector index, emitted as one i32 constant vector against a scalar
(codegen_cpu/llvm_ir.py ``_lane_compare``): padding tests of strided patch rows and masks with
the lane index on either side, at odd and round sizes, against the reference interpreter."""

from __future__ import annotations

import pytest
from helpers import check_op

PATCH = """
op patch[S = 2, P = 1](X: f32[C, H, W]) -> Y: f32[C, 3, 3, (H + 2*P - 3) // S + 1, (W + 2*P - 3) // S + 1] {
    Xp = pad(X, [0, P, P])
    Y[c, r, s, y, x] = Xp[c, y*S + r, x*S + s]
}
"""

MASKS = """
op masks(X: f32[M, N]) -> Y: f32[M, N] {
    A[i, j] = select(j * 3 - i >= 5, X[i, j], 0.0) + select(i - 2 * j > -7, 1.0, 0.0)
    Y[i, j] = A[i, j] + select(j == i + 1, 2.0, 0.0) + select(i != j, 4.0, 0.0) + select(j <= i, 8.0, 0.0)
}
"""


@pytest.mark.parametrize("shapes", [dict(C=3, H=56, W=56), dict(C=2, H=57, W=57), dict(C=1, H=7, W=33),
                                    dict(C=2, H=1, W=1), dict(C=5, H=14, W=14), dict(C=1, H=9, W=65, S=1, P=2),
                                    dict(C=2, H=11, W=100, S=3, P=0)])
def test_strided_patch_rows_match_reference(shapes, rng):
    check_op(PATCH, "patch", shapes, rng)


@pytest.mark.parametrize("shapes", [dict(M=33, N=64), dict(M=7, N=33), dict(M=1, N=1), dict(M=40, N=100)])
def test_lane_masks_match_reference(shapes, rng):
    check_op(MASKS, "masks", shapes, rng)
