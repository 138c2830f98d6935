"""The fusion pass: what it inlines, what it keeps, how it groups row reductions, and that fused
programs still agree with the reference (which never fuses)."""

from pathlib import Path

import numpy as np
import pytest
from helpers import check_op

import tcc


def fused(src: str, name: str, **shapes) -> str:
    op = tcc.compile(src)[name]
    return op.stage_text({**op.te.cparams, **shapes}, "fused")


def loops(src: str, name: str, **shapes) -> str:
    op = tcc.compile(src)[name]
    return op.stage_text({**op.te.cparams, **shapes}, "loops")


SOFTMAX = """
op softmax(X: f32[N, C]) -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    s[n] = sum[c](e[n, c])
    Y[n, c] = e[n, c] / s[n]
}
"""


def test_softmax_rows_share_one_outer_loop():
    text = fused(SOFTMAX, "softmax", N=8, C=16)
    assert "keep e: cost 11 per element read at 2 places" in text
    assert "group [m, e, s, Y] share 1 outer loop(s); m, e, s kept per outer iteration" in text
    nest = loops(SOFTMAX, "softmax", N=8, C=16)
    assert nest.count("for n") == 1  # one pass over the rows: each row read from memory once
    assert "allocate e: f32[16] in local" in nest


@pytest.mark.parametrize("n,c", [(1, 1), (7, 33), (3, 1000)])
def test_softmax_fused_matches_reference(n, c, rng):
    check_op(SOFTMAX, "softmax", dict(N=n, C=c), rng)


CONV_RELU = """
op conv_relu(X: f32[N, C, H, W], Wt: f32[F, C, 3, 3], b: f32[F]) -> Y: f32[N, F, H - 2, W - 2] {
    Z[n, f, y, x] = sum[c, r, s](X[n, c, y + r, x + s] * Wt[f, c, r, s])
    Y[n, f, y, x] = max(Z[n, f, y, x] + b[f], 0.0)
}
"""


def test_epilogue_is_fused_into_the_reduction(rng):
    text = fused(CONV_RELU, "conv_relu", N=1, C=2, H=6, W=5, F=3)
    assert "inline Z: reduction, read once by Y" in text
    assert "allocate Z" not in loops(CONV_RELU, "conv_relu", N=1, C=2, H=6, W=5, F=3)
    check_op(CONV_RELU, "conv_relu", dict(N=2, C=3, H=7, W=6, F=4), rng)


def test_reduction_read_by_every_column_is_not_recomputed(rng):
    src = """
    op center(X: f32[N, C]) -> Y: f32[N, C] {
        mu[n] = sum[c](X[n, c])
        Y[n, c] = X[n, c] - mu[n]
    }
    """
    text = fused(src, "center", N=4, C=5)
    assert "keep mu: Y reads it under loops that do not index it: inlining would recompute each element " \
           "5 times" in text
    check_op(src, "center", dict(N=4, C=5), rng)


def test_cheap_elementwise_read_twice_is_inlined(rng):
    src = """
    op f(X: f32[N]) -> (Y: f32[N], Z: f32[N]) {
        t[i] = X[i] * 2.0
        Y[i] = t[i] + 1.0
        Z[i] = t[i] - 1.0
    }
    """
    assert "inline t: cheap" in fused(src, "f", N=9)
    check_op(src, "f", dict(N=9), rng)


def test_inlined_reduction_variables_do_not_capture(rng):
    src = """
    op f(X: f32[N, D]) -> Y: f32[N, D] {
        v[n] = sum[d](X[n, d] * X[n, d])
        Y[n, d] = X[n, d] * v[n]
    }
    """
    # with D = 1 the read of v repeats nothing, so v is inlined into Y, whose axis is also d
    assert "inline v" in fused(src, "f", N=3, D=1)
    check_op(src, "f", dict(N=3, D=1), rng)
    check_op(src, "f", dict(N=3, D=7), rng)


def test_intermediate_read_outside_its_group_keeps_full_size(rng):
    src = """
    op f(X: f32[N, C], W: f32[C, C]) -> (Y: f32[N, C], Z: f32[C, C]) {
        t[n, c] = exp(X[n, c])
        Y[n, c] = t[n, c] * 2.0 + t[n, c]
        Z[a, b] = sum[n](t[n, a] * W[a, b])
    }
    """
    nest = loops(src, "f", N=5, C=4)
    assert "allocate t: f32[5, 4] in global" in nest
    check_op(src, "f", dict(N=5, C=4), rng)


def test_fused_stage_from_the_cli(capsys):
    from tcc.cli import main
    path = Path(__file__).resolve().parent.parent / "examples" / "conv2d_relu.tc"
    assert main([
        "lower", str(path), "--stage", "fused", "--shape", "X=1x2x5x5", "--shape", "Wt=2x2x3x3"]) == 0
    out = capsys.readouterr().out
    assert "fusion:" in out and "inline Z" in out


def test_layernorm_group_matches_reference(rng):
    src = (Path(__file__).resolve().parent.parent / "examples" / "layernorm.tc").read_text()
    text = fused(src, "layernorm", N=4, D=9)
    assert "group [mu, var, Y] share 1 outer loop(s); mu, var kept per outer iteration" in text
    for n, d in [(1, 1), (7, 33), (2, 1000)]:
        check_op(src, "layernorm", dict(N=n, D=d), rng)


def test_nothing_to_fuse_is_said():
    src = "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }"
    assert "nothing to fuse" in fused(src, "f", N=3)


def test_fused_results_equal_unfused_bitwise_for_elementwise(rng):
    src = "op f(X: f32[N]) -> Y: f32[N] { t[i] = X[i] * 3.0; Y[i] = t[i] + 1.0 }"
    x = rng.standard_normal(100).astype(np.float32)
    np.testing.assert_array_equal(tcc.compile(src).f(x), (x * np.float32(3.0)) + np.float32(1.0))


def test_reads_through_a_pad_of_a_group_tensor_keep_their_neighbours(rng):
    src = """
    op blur(X: f32[N, C]) -> Y: f32[N, C] {
        T[n, c] = X[n, c] * 2.0
        Tp = pad(T, [0, 1], [0, 1])
        Y[m, x] = Tp[m, x] + Tp[m, x + 1] + Tp[m, x + 2]
    }
    """
    assert "group [T, Y] share 1 outer loop(s); T kept per outer iteration" in fused(src, "blur", N=4, C=6)
    check_op(src, "blur", dict(N=4, C=6), rng)
    rows = src.replace("pad(T, [0, 1], [0, 1])", "pad(T, [1, 0], [1, 0])").replace(
        "Tp[m, x] + Tp[m, x + 1] + Tp[m, x + 2]", "Tp[m, x] + Tp[m + 1, x] + Tp[m + 2, x]")
    assert "group" not in fused(rows, "blur", N=4, C=6).split("fusion:")[1]
    check_op(rows, "blur", dict(N=4, C=6), rng)


MLP = """
op mlp(X: f32[T, D], W: f32[D, H], b: f32[H]) -> Y: f32[T, H] {
    fc1[t, j] = sum[k](X[t, k] * W[k, j]) + b[j]
    Y[t, j] = fc1[t, j] * 0.5 * (1.0 + erf(fc1[t, j] * 0.7071067811865476))
}
"""

ATTENTION = """
op attention(Q: f32[N, D], K: f32[M, D]) -> Y: f32[N, M] {
    S[i, j] = sum[d](Q[i, d] * K[j, d])
    m[i] = max[j](S[i, j])
    e[i, j] = exp(S[i, j] - m[i])
    s[i] = sum[j](e[i, j])
    Y[i, j] = e[i, j] / s[i]
}
"""


def test_gemm_read_twice_keeps_its_own_loops():
    """GELU reads X @ W + b twice, so it is kept; grouping the two at ``t, j`` would leave the GEMM
    one dot product per element, which the GEMM scheduler cannot tile."""
    text = fused(MLP, "mlp", T=128, D=256, H=1024).split("fusion:")[1]
    assert "keep fc1: a reduction read at 2 places" in text and "group" not in text
    assert "group [fc1, Y] share 2 outer loop(s)" in fused(MLP, "mlp", T=7, D=5, H=9)  # too small to tile


def test_softmax_of_a_gemm_groups_the_rows_only():
    """Attention's scores are a GEMM: the softmax rows group among themselves, not with it."""
    text = fused(ATTENTION, "attention", N=64, D=32, M=128).split("fusion:")[1]
    assert "group [m, e, s, Y] share 1 outer loop(s)" in text and "S," not in text


@pytest.mark.parametrize("t, d, h", [(1, 1, 1), (1, 7, 33), (33, 7, 1), (7, 33, 33), (33, 100, 65),
                                     (64, 64, 64), (40, 300, 256), (20, 1024 + 77, 70)])
def test_mlp_matches_reference(t, d, h, rng):
    check_op(MLP, "mlp", {"T": t, "D": d, "H": h}, rng)


@pytest.mark.parametrize("n, d, m", [(1, 1, 1), (7, 33, 1), (1, 7, 33), (33, 7, 33), (64, 32, 128)])
def test_attention_matches_reference(n, d, m, rng):
    check_op(ATTENTION, "attention", {"N": n, "D": d, "M": m}, rng)


RESIDUAL = """
op block(X: f32[N, C, H, W], W3: f32[F, F, 3, 3], Wd: f32[F, C, 1, 1], Y1: f32[N, F, H // 2, W // 2])
    -> Y: f32[N, F, H // 2, W // 2] {
    Yp = pad(Y1, [0, 0, 1, 1])
    A[n, f, y, x] = sum[c, r, s](Yp[n, c, y + r, x + s] * W3[f, c, r, s])
    D[n, f, y, x] = sum[c](X[n, c, y * 2, x * 2] * Wd[f, c, 0, 0])
    Y[n, f, y, x] = max(A[n, f, y, x] + D[n, f, y, x], 0.0)
}
"""


def test_two_contractions_into_one_epilogue_stay_two_gemms(rng):
    """A ResNet block's conv and its 1x1 downsample both feed the residual sum: the first inlines
    into it, the second stays a statement of its own (a GEMM, not a dot product per element)."""
    text = fused(RESIDUAL, "block", N=1, C=16, H=28, W=28, F=32)
    assert "inline A: reduction, read once by" in text
    assert "keep D: a contraction read by" in text
    check_op(RESIDUAL, "block", dict(N=2, C=16, H=28, W=28, F=32), rng)
    check_op(RESIDUAL, "block", dict(N=1, C=7, H=15, W=9, F=33), rng)


RMS_MLP = """
op rms_mlp(X: f32[T, D], W: f32[D, H]) -> Y: f32[T, H] {
    r[t] = rsqrt(sum[d](X[t, d] * X[t, d]) + 1.0)
    Xn[t, d] = X[t, d] * r[t]
    Y[t, h] = max(sum[d](Xn[t, d] * W[d, h]), 0.0)
}
"""


def test_a_row_scaled_gemm_operand_is_kept_so_the_gemm_stays_one():
    """T5's RMSNorm before its MLP: the normalised rows are cheap to recompute, but inlined they
    made the GEMM's operand an expression and the GEMM a plain loop nest (5x slower); kept, the
    GEMM is tiled and packed. Too small to tile, it is inlined as before."""
    text = fused(RMS_MLP, "rms_mlp", T=64, D=128, H=512).split("fusion:")[1]
    assert "keep Xn: an expression read by Y as a GEMM's operand" in text
    op = tcc.compile(RMS_MLP)["rms_mlp"]
    assert "_c1" in op.stage_text({"T": 64, "D": 128, "H": 512}, "scheduled")  # packed panels: the GEMM's
    assert "inline Xn" in fused(RMS_MLP, "rms_mlp", T=7, D=5, H=9)


@pytest.mark.parametrize("t, d, h", [(1, 1, 1), (7, 5, 9), (33, 128, 65), (64, 128, 512)])
def test_rms_mlp_matches_reference(t, d, h, rng):
    check_op(RMS_MLP, "rms_mlp", {"T": t, "D": d, "H": h}, rng)
