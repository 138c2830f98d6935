"""Gathering im2col's patches straight into the GEMM's packed panels (passes/autoschedule_cpu/pack_gather.py)."""

import numpy as np
import pytest
from helpers import check_op

import tcc
from tcc import dtypes
from tcc.ir.expr import Binary, Const, Var
from tcc.ir.loopnest import flat_coeff
from tcc.passes.autoschedule_cpu.pack_gather import _lanes_apart

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


GRAD_W = """
op grad_w(X: f32[N, C, H, W], dY: f32[N, F, H, W]) -> dWt: f32[F, C, 3, 3] {
    Xp = pad(X, [0, 0, 1, 1])
    dWt[f, c, r, s] = sum[n, y, x](dY[n, f, y, x] * Xp[n, c, y + r, x + s])
}
"""


@pytest.mark.parametrize("shapes,gathered", [
    (dict(N=2, C=64, H=12, W=15, F=16), True),  # 576 patch columns (r, s, c), blocks of 32 lanes
    (dict(N=1, C=64, H=33, W=7, F=5), True),
    (dict(N=1, C=32, H=33, W=7, F=5), False),  # the two cores' halves split at column 144: mid-group
    (dict(N=2, C=7, H=9, W=13, F=3), False),  # 7 channels: every block of lanes crosses (r, s) groups
])
def test_weight_gradient_patches_are_gathered_when_lanes_stay_in_one_window_tap(shapes, gathered, rng):
    """A weight gradient's patch columns are ``(r, s, c)``, ``c`` fastest: where each block of
    lanes stays within one ``(r, s)``, the lanes walk X's channels at a constant stride, so the
    panels are gathered from X with no patch tensor; where a block crosses, the patches stay."""
    op = tcc.compile(GRAD_W).grad_w
    n, c, h, w, f = (shapes[k] for k in "NCHWF")
    x, dy = np.ones((n, c, h, w), np.float32), np.ones((n, f, h, w), np.float32)
    assert ("allocate Xp_patches:" not in op.lower(x, dy, stage="scheduled")) == gathered
    check_op(GRAD_W, "grad_w", shapes, rng)


def test_lanes_within_one_group_of_a_modulus():
    """``(128*jo + 16*jr + jj) % 64`` over 16 lanes ``jj`` is ``(128*jo + 16*jr) % 64 + jj``: a
    constant stride; 32 lanes, or an offset of 8, may cross a multiple of 64: not affine."""
    jo, jr, jj = (Var(n, I64) for n in ("jo", "jr", "jj"))
    col = _b("add", _b("mul", jo, 128), _b("add", _b("mul", jr, 16), jj))
    idx = (_b("mod", col, 64), _b("floordiv", col, 64))
    assert flat_coeff(_lanes_apart(idx, "jj", 16), (64, 9), "jj") == 9
    assert flat_coeff(_lanes_apart(idx, "jj", 32), (64, 9), "jj") is None
    shifted = tuple(_b(op, _b("add", col, 8), 64) for op in ("mod", "floordiv"))
    assert flat_coeff(_lanes_apart(shifted, "jj", 16), (64, 9), "jj") is None
    assert flat_coeff(_lanes_apart(shifted, "jj", 8), (64, 9), "jj") == 9
