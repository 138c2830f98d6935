"""Gathering im2col's patches straight into the GEMM's packed panels (passes/autoschedule_cpu/pack_gather.py)."""

import numpy as np
import pytest
from helpers import check_op

import tcc
from tcc import dtypes
from tcc.ir.expr import Binary, Const, Var
from tcc.passes.loops.loopnest import flat_coeff

I64 = dtypes.i64


def _b(op, a, c):
    return Binary(op, a, c if not isinstance(c, int) else Const(c, I64), I64)


def test_flat_coeff_recombines_row_and_column_of_a_pixel():
    j = _b("add", Var("J", I64), Var("jj", I64))
    k = Var("k", I64)
    idx = (_b("floordiv", _b("floordiv", k, 3), 3),
           _b("add", _b("floordiv", j, 56), _b("mod", _b("floordiv", k, 3), 3)),
           _b("sub", _b("add", _b("mod", j, 56), _b("mod", k, 3)), 1))
    assert flat_coeff(idx, (64, 56, 56), "jj") == 1
    assert flat_coeff(idx, (64, 56, 57), "jj") is None  # the row width is not the divisor
    assert flat_coeff(idx, (64, 56, 56), "k") is None  # c, r, s strides 3136, 56, 1: not affine
    assert flat_coeff(idx, (64, 56, 56), "J") == 1
    assert flat_coeff((_b("mul", Var("i", I64), 3), Var("i", I64)), (4, 8), "i") == 25


CONV = """
op conv(X: f32[N, C, H, W], Wt: f32[F, C, KH, KW]) -> Y: f32[N, F, H + 2 - KH + 1, W + 2 - KW + 1] {
    Xp = pad(X, [0, 0, 1, 1])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y + r, x + s] * Wt[f, c, r, s])
}
"""


def test_patches_are_gathered_into_the_panels():
    op = tcc.compile(CONV, conv="im2col").conv
    x, w = np.ones((2, 6, 9, 13), np.float32), np.ones((20, 6, 3, 3), np.float32)
    text = op.lower(x, w, stage="scheduled")
    assert "allocate Xp_patches:" not in text  # no whole patch tensor
    pack = next(line for line in text.splitlines() if "Xp_patches_c1[" in line and "= select(" in line)
    assert "X[" in pack  # read from the input itself


@pytest.mark.parametrize("shapes", [
    dict(N=2, C=6, H=9, W=13, F=20, KH=3, KW=3),  # 13-wide rows: each 32-pixel block spans rows
    dict(N=1, C=1, H=1, W=33, F=7, KH=1, KW=3),
    dict(N=3, C=7, H=33, W=7, F=13, KH=3, KW=2),
])
def test_gathered_panels_match_reference(shapes, rng):
    check_op(CONV, "conv", shapes, rng)


STRIDED = """
op conv_s2(X: f32[N, C, H, W], Wt: f32[F, C, 3, 3]) -> Y: f32[N, F, (H - 3) // 2 + 1, (W - 3) // 2 + 1] {
    Y[n, f, y, x] = sum[c, r, s](X[n, c, y * 2 + r, x * 2 + s] * Wt[f, c, r, s])
}
"""


def test_strided_patches_stay_a_row_by_row_gather(rng):
    """A stride-2 conv's pixel blocks jump rows: no constant lane stride, so no gather into panels."""
    op = tcc.compile(STRIDED, conv="im2col").conv_s2
    x, w = np.ones((2, 6, 19, 23), np.float32), np.ones((20, 6, 3, 3), np.float32)
    assert "allocate Xp_patches" not in op.lower(x, w, stage="scheduled")  # no pad: X is read directly
    assert "allocate X_patches:" in op.lower(x, w, stage="scheduled")
    check_op(STRIDED, "conv_s2", dict(N=2, C=6, H=19, W=23, F=20), rng)
