"""Vector math the CPU backend emits itself (exp by vscalefps, erf and tanh by rational fits,
max/min by vrangeps on AVX-512): values at odd sizes (vector body and tail) and the special cases NumPy defines."""

from __future__ import annotations

import numpy as np
import pytest

import tcc

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3e-45, -2.5, 88.72, 88.73, -87.5,
                    -103.9, -104.5, 1e30, -1e30], np.float32)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values, NaN where NumPy has NaN, and the sign of every zero."""
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan], want[~nan])
                and np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0])))


@pytest.mark.parametrize("n", [7, 1000, 2_001])
def test_vector_exp_is_within_two_ulp_down_to_the_subnormals(n, rng):
    f = tcc.compile("op e(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i]) }")["e"]
    x = np.concatenate([rng.uniform(-110, 95, n).astype(np.float32), SPECIAL])
    got = f(x)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
        want32 = want.astype(np.float32)
    finite = np.isfinite(want32)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    assert np.array_equal(got[np.isinf(want32)], want32[np.isinf(want32)])
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    ulp = np.spacing(np.maximum(want32[finite], np.float32(1.2e-38))).astype(np.float64)
    assert (err <= 2 * ulp).all()


@pytest.mark.parametrize("fn", ["max", "min"])
def test_vector_max_min_propagate_nan_from_either_side_and_order_zeros(fn):
    f = tcc.compile(f"op m(A: f32[N], B: f32[N]) -> Y: f32[N] {{ Y[i] = {fn}(A[i], B[i]) }}")["m"]
    a = np.tile(np.repeat(SPECIAL, len(SPECIAL)), 3)
    b = np.tile(np.tile(SPECIAL, len(SPECIAL)), 3)
    want = (np.maximum if fn == "max" else np.minimum)(a, b)
    zeros = (a == 0) & (b == 0)  # IEEE maximum / minimum (as before): -0 < +0; NumPy picks either
    want[zeros] = np.float32(0.0) if fn == "max" else np.float32(-0.0)
    want[zeros & (np.signbit(a) == np.signbit(b))] = a[zeros & (np.signbit(a) == np.signbit(b))]
    assert _same(f(a, b), want)


def test_row_max_with_nan_and_softmax_of_minus_inf(rng):
    """A NaN anywhere in a row makes its max NaN; exp(-inf) is 0 so masked softmax entries are 0."""
    src = ("op softmax(X: f32[N, C]) -> Y: f32[N, C] {\n m[n] = max[c](X[n, c])\n e[n, c] = exp(X[n, c] - m[n])\n"
           " s[n] = sum[c](e[n, c])\n Y[n, c] = e[n, c] / s[n]\n}")
    x = rng.standard_normal((5, 77)).astype(np.float32)
    x[1, 40] = np.nan
    x[2, ::3] = -np.inf
    y = tcc.compile(src)["softmax"](x)
    e = np.exp(x - x.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2, 3, 4]]).any()
    assert (y[2, ::3] == 0).all()
    np.testing.assert_allclose(y[[0, 2, 3, 4]], want[[0, 2, 3, 4]], rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("d", [1024, 96])
def test_row_sums_fold_their_partial_results_as_a_tree(d, rng):
    """The 32 per-lane partial sums of a row (layernorm's mean) fold in halving vector steps (16,
    8, 4 lanes), then the last four in order: a few dependent adds per row instead of 32."""
    src = ("op layernorm(X: f32[N, D], g: f32[D], b: f32[D]) -> Y: f32[N, D] {\n mu[n] = sum[d](X[n, d]) / D\n"
           " var[n] = sum[d]((X[n, d] - mu[n]) ** 2) / D\n"
           " Y[n, d] = (X[n, d] - mu[n]) * rsqrt(var[n] + 1e-5) * g[d] + b[d]\n}")
    op = tcc.compile(src)["layernorm"]
    x, g, b = rng.standard_normal((37, d)).astype(np.float32), rng.random(d, np.float32), rng.random(d, np.float32)
    text = op.lower(x, g, b, stage="scheduled")
    assert "for acc_2_lane in 0..16:  # vector\n" in text
    assert "acc_2_v[acc_2_lane] = acc_2_v[acc_2_lane] + acc_2_v[acc_2_lane + 4]" in text
    assert "for acc_2_lane in 0..4:\n" in text
    x64 = x.astype(np.float64)
    mu = x64.mean(1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(op(x, g, b), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c", [1000, 77])
def test_softmax_rows_of_odd_width_vectorise_with_their_tail(c, rng):
    """A row split by 32 lanes leaves a narrower tail copy; both add into the partial results,
    so the row's reductions (and everything else) stay vectorised instead of falling to scalar."""
    src = ("op softmax(X: f32[N, C]) -> Y: f32[N, C] {\n m[n] = max[c](X[n, c])\n e[n, c] = exp(X[n, c] - m[n])\n"
           " s[n] = sum[c](e[n, c])\n Y[n, c] = e[n, c] / s[n]\n}")
    op = tcc.compile(src)["softmax"]
    x = (rng.standard_normal((29, c)) * 4).astype(np.float32)
    text = op.lower(x, stage="scheduled")
    tail = c % 32
    assert f"for c_v in 0..{tail}:  # vector\n" in text
    assert f"acc_2_v[c_v] = max(acc_2_v[c_v], X[n_1, {c - tail} + c_v])" in text
    assert f"acc_3_v[c_v] = acc_3_v[c_v] + e[{c - tail} + c_v]" in text
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    np.testing.assert_allclose(op(x), e / e.sum(1, keepdims=True), rtol=2e-6, atol=1e-9)


MAXPOOL = ("op maxpool(X: f32[N, C, H, W]) -> Y: f32[N, C, (H - 3) // 2 + 1, (W - 3) // 2 + 1] "
           "{ Y[n, c, y, x] = max[r: 3, s: 3](X[n, c, y*2 + r, x*2 + s]) }")


@pytest.mark.parametrize("shapes", [dict(N=2, C=3, H=37, W=111), dict(N=1, C=2, H=9, W=35)])
def test_stride_two_lanes_load_as_one_wide_masked_load(shapes, rng):
    """Pooling windows (and stride-2 conv patch rows) of 16 lanes or more read their lanes, two
    elements apart, with one masked contiguous load of twice the width and a shuffle, not a
    gather; the masked-off odd elements keep the last lane's read inside the row."""
    from helpers import check_op

    op = tcc.compile(MAXPOOL)["maxpool"]
    x = rng.standard_normal((shapes["N"], shapes["C"], shapes["H"], shapes["W"])).astype(np.float32)
    text = op.lower(x, stage="llvm")
    assert "llvm.masked.load.v" in text and "llvm.masked.gather" not in text
    check_op(MAXPOOL, "maxpool", shapes, rng)


def test_stride_two_conv_rows_load_wide_and_match(rng):
    from helpers import check_op

    src = ("op conv[S = 2, P = 3](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW]) -> Y: f32[N, F, (H + 2*P - KH) // S + 1, "
           "(W + 2*P - KW) // S + 1] {\n Xp = pad(X, [0, 0, P, P])\n"
           " Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s])\n}")
    check_op(src, "conv", dict(N=1, C=3, H=45, W=77, F=19, KH=7, KW=7), rng)


def test_max_and_min_against_a_constant_keep_nan_and_zero_rules():
    """``max(x, 0.0)`` (relu) compiles to one compare and a blend: NaN still comes through,
    ``max(-0.0, 0.0)`` is ``0.0`` as NumPy gives it, infinities are ordered."""
    lib = tcc.compile("""
op relu(X: f32[N]) -> Y: f32[N] { Y[i] = max(X[i], 0.0) }
op clip(X: f32[N]) -> Y: f32[N] { Y[i] = min(1.5, X[i]) }
""")
    x = np.array([np.nan, -0.0, 0.0, -1.0, 2.0, np.inf, -np.inf, 1.5, 3.0] * 7, np.float32)
    relu, clip = lib.relu(x), lib.clip(x)
    np.testing.assert_array_equal(relu, np.maximum(x, np.float32(0)))
    assert not np.signbit(relu[1])
    np.testing.assert_array_equal(clip, np.minimum(x, np.float32(1.5)))


@pytest.mark.parametrize("n", [7, 1000, 2_001])
def test_vector_erf_is_within_6e_7_and_keeps_the_special_cases(n, rng):
    """erf by a rational fit on x clamped to [-4, 4] (GELU's erf without a libm call per lane).
    Its error on random inputs reached 5.09e-7 once (x near -3); the bound allows that."""
    import math

    f = tcc.compile("op e(X: f32[N]) -> Y: f32[N] { Y[i] = erf(X[i]) }")["e"]
    tiny = np.float32(10.0) ** rng.uniform(-44, 0, n).astype(np.float32) * rng.choice([-1, 1], n)
    x = np.concatenate([rng.uniform(-6, 6, n).astype(np.float32), tiny.astype(np.float32), SPECIAL])
    got = f(x)
    want = np.array([math.erf(float(v)) if not np.isnan(v) else np.nan for v in x])
    finite = np.isfinite(x)
    assert np.abs(got[finite] - want[finite]).max() <= 6e-7
    normal = finite & (np.abs(x) > 1e-37)  # erf(x) ~ 1.128 x: relative accuracy down to the subnormals
    assert (np.abs(got[normal] - want[normal]) / np.abs(want[normal])).max() <= 6e-7
    assert _same(got[~finite | (x == 0)], want[~finite | (x == 0)].astype(np.float32))


@pytest.mark.parametrize("n", [1, 7, 1000, 2_001])
def test_vector_tanh_is_within_4e_7_relative_and_keeps_the_special_cases(n, rng):
    """tanh by a rational fit on x clamped to [-7.9988, 7.9988] (GPT-2's GELU without a libm call
    per lane): relative error down to the subnormals, never beyond 1, and NaN, infinities and
    signed zeros as NumPy has them. The fit's worst case over a dense grid was 3.41e-7."""
    f = tcc.compile("op t(X: f32[N]) -> Y: f32[N] { Y[i] = tanh(X[i]) }")["t"]
    tiny = np.float32(10.0) ** rng.uniform(-44, 0, n).astype(np.float32) * rng.choice([-1, 1], n)
    x = np.concatenate([rng.uniform(-12, 12, n).astype(np.float32), tiny.astype(np.float32),
                        np.linspace(-9, 9, 4001, dtype=np.float32), SPECIAL])
    got = f(x)
    want = np.tanh(x.astype(np.float64))
    finite = np.isfinite(x)
    normal = finite & (np.abs(x) > 1e-37)
    assert (np.abs(got[normal] - want[normal]) / np.abs(want[normal])).max() <= 4e-7
    assert np.abs(got[finite]).max() <= 1.0
    assert _same(got[~finite | (x == 0)], want[~finite | (x == 0)].astype(np.float32))
