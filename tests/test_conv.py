"""Convolutions of every shape against the reference, through both lowerings (im2col and direct):
stride, dilation, padding, groups, depthwise, 1-D, 2-D and 3-D; and the conv gradients."""

from pathlib import Path

import numpy as np
import pytest
from helpers import check_op

import tcc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

CONV1D = """
op conv1d[S = 1, P = 0, D = 1](X: f32[N, C, W], Wt: f32[F, C, K], b: f32[F])
    -> Y: f32[N, F, (W + 2*P - D*(K - 1) - 1) // S + 1] {
    Xp = pad(X, [0, 0, P])
    Y[n, f, x] = sum[c, s](Xp[n, c, x*S + s*D] * Wt[f, c, s]) + b[f]
}
"""

CONV3D = """
op conv3d[S = 1, P = 0](X: f32[N, C, T, H, W], Wt: f32[F, C, KT, KH, KW])
    -> Y: f32[N, F, (T + 2*P - KT) // S + 1, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P, P])
    Y[n, f, t, y, x] = sum[c, q, r, s](Xp[n, c, t*S + q, y*S + r, x*S + s] * Wt[f, c, q, r, s])
}
"""

DEPTHWISE = """
op depthwise[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[C, KH, KW]) -> Y: f32[N, C, (H + 2*P - KH) // S + 1,
                                                                          (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, c, y, x] = sum[r, s](Xp[n, c, y*S + r, x*S + s] * Wt[c, r, s])
}
"""

GROUPED = """
op grouped[G = 2, P = 1](X: f32[N, C, H, W], Wt: f32[F, CG, KH, KW]) -> Y: f32[N, F, H + 2*P - KH + 1,
                                                                               W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, o, y, x] = sum[c, r, s](Xp[n, (o // (F // G)) * CG + c, y + r, x + s] * Wt[o, c, r, s])
}
"""

LOWERINGS = ["im2col", "direct"]


def check(src, name, shapes, conv, rng):
    lib = tcc.compile(src, conv=conv)
    op = lib[name]
    text = op.stage_text({**op.te.cparams, **shapes}, "fused")
    check_op(src, name, shapes, rng) if conv == "auto" else _check_with(lib, name, shapes, rng)
    return text


def _check_with(lib, name, shapes, rng):
    from tcc.testing import assert_matches, random_args, reference_results

    op = lib[name]
    full = {**op.te.cparams, **shapes}
    args = random_args(op.te, full, rng)
    expected = reference_results(op.te, args, full)
    out = np.full(expected[0].shape, np.nan, np.float32)
    op(*args, out=out, **{k: v for k, v in shapes.items() if k in op.te.cparams})
    assert_matches(out, expected[0], op.te.tensors[op.te.results[0]].dtype, name)


@pytest.mark.parametrize("conv", LOWERINGS)
@pytest.mark.parametrize("shapes", [
    dict(N=1, C=3, H=7, W=9, F=4, KH=3, KW=3),
    dict(N=2, C=2, H=8, W=8, F=3, KH=1, KW=1),
    dict(N=1, C=3, H=9, W=7, F=2, KH=3, KW=2, S=2, P=1),
    dict(N=2, C=1, H=11, W=10, F=2, KH=3, KW=3, S=1, P=2, D=2),
    dict(N=1, C=1, H=1, W=1, F=1, KH=1, KW=1),
    dict(N=1, C=3, H=33, W=17, F=5, KH=7, KW=7, S=2, P=3),
])
def test_conv2d(conv, shapes, rng):
    src = (EXAMPLES / "conv2d.tc").read_text()
    text = check(src, "conv2d", shapes, conv, rng)
    assert ("im2col Y" in text) == (conv == "im2col")
    if conv == "im2col":
        assert "extra memory" in text


def test_1x1_stays_direct_under_auto():
    op = tcc.compile((EXAMPLES / "conv2d.tc").read_text()).conv2d
    text = op.stage_text(dict(N=2, C=8, H=5, W=5, F=4, KH=1, KW=1, S=1, P=0, D=1), "fused")
    assert "direct Y: a 1x1 window" in text


@pytest.mark.parametrize("shapes", [dict(N=2, C=16, H=28, W=28, F=33), dict(N=1, C=7, H=15, W=9, F=5)])
def test_strided_1x1_gathers_its_pixels_under_auto(shapes, rng):
    """A 1x1 window of stride 2 (ResNet's downsample) reads every other pixel: its patches make
    one GEMM over all output pixels, not one per output row."""
    full = dict(KH=1, KW=1, S=2, P=0, D=1, **shapes)
    text = check((EXAMPLES / "conv2d.tc").read_text(), "conv2d", full, "auto", rng)
    assert "im2col Y: patches of" in text


@pytest.mark.parametrize("conv", LOWERINGS)
def test_conv2d_relu_epilogue(conv, rng):
    src = (EXAMPLES / "conv2d_relu.tc").read_text()
    check(src, "conv2d_relu", dict(N=2, C=4, H=9, W=8, F=6, KH=3, KW=3), conv, rng)
    check(src, "conv2d_relu", dict(N=1, C=3, H=10, W=7, F=2, KH=3, KW=3, S=2), conv, rng)


@pytest.mark.parametrize("conv", LOWERINGS)
@pytest.mark.parametrize("shapes", [dict(N=2, C=3, W=17, F=4, K=3), dict(N=1, C=2, W=9, F=3, K=2, S=2, P=1, D=2)])
def test_conv1d(conv, shapes, rng):
    check(CONV1D, "conv1d", shapes, conv, rng)


@pytest.mark.parametrize("conv", LOWERINGS)
def test_conv3d(conv, rng):
    check(CONV3D, "conv3d", dict(N=1, C=2, T=5, H=6, W=7, F=3, KT=2, KH=3, KW=3, P=1), conv, rng)
    check(CONV3D, "conv3d", dict(N=2, C=1, T=4, H=5, W=5, F=2, KT=3, KH=3, KW=2, S=2), conv, rng)


def test_depthwise_stays_direct_under_auto(rng):
    text = check(DEPTHWISE, "depthwise", dict(N=2, C=5, H=9, W=8, KH=3, KW=3), "auto", rng)
    assert "direct Y: c indexes both the input and the weights (depthwise or grouped)" in text


@pytest.mark.parametrize("conv", LOWERINGS)
def test_depthwise_both_lowerings(conv, rng):
    check(DEPTHWISE, "depthwise", dict(N=1, C=4, H=7, W=7, KH=3, KW=3, S=2), conv, rng)


def test_grouped_stays_direct_under_auto(rng):
    text = check(GROUPED, "grouped", dict(N=1, C=4, H=6, W=6, F=6, CG=2, KH=3, KW=3), "auto", rng)
    assert "direct Y" in text and "grouped" in text


def test_auto_picks_im2col_for_resnet_like_layers():
    src = (EXAMPLES / "conv2d.tc").read_text()
    op = tcc.compile(src).conv2d
    text = op.stage_text(dict(N=8, C=64, H=56, W=56, F=64, KH=3, KW=3, S=1, P=1, D=1), "fused")
    assert "extra memory 6.89 MiB patches + 0.77 MiB GEMM result per batch element" in text
    assert "Xp_patches, Y_gemm kept per outer iteration" in text  # one batch element at a time


@pytest.mark.parametrize("shapes, folded", [
    (dict(N=3, C=5, H=7, W=7, F=33, KH=3, KW=3, P=1), True),  # 49 pixels: 31% of 16-lane vectors empty
    (dict(N=2, C=9, H=13, W=14, F=17, KH=3, KW=3, P=1, S=2), True),  # stride 2, 7x7 outputs
    (dict(N=3, C=6, H=14, W=14, F=8, KH=1, KW=1, S=2, P=0), True),  # ResNet's 1x1 downsample at 7x7
    (dict(N=2, C=4, H=14, W=14, F=7, KH=3, KW=3, P=1), False),  # 196 pixels: 14% empty
    (dict(N=1, C=5, H=7, W=7, F=33, KH=3, KW=3, P=1), False),  # one image: nothing to fold
])
def test_batch_joins_the_columns_of_narrow_images(shapes, folded, rng):
    """Where one image's pixels fill the GEMM's vectors badly (7x7) the batch leads the columns:
    one GEMM of N*49 columns; its epilogue (bias, relu) then runs as a pass of its own, since the
    tile's lanes may belong to two images. Checked against the reference at odd sizes."""
    src = (EXAMPLES / "conv2d_relu.tc").read_text()
    text = check(src, "conv2d_relu", shapes, "auto", rng)
    assert "into columns n, y, x" in text if folded else "into columns y, x" in text
    check((EXAMPLES / "conv2d.tc").read_text(), "conv2d", shapes, "auto", rng)


def test_batch_fold_keeps_to_its_patch_budget():
    """A batch whose patches would pass FOLD_MAX_BYTES stays a loop of per-image GEMMs."""
    op = tcc.compile((EXAMPLES / "conv2d.tc").read_text()).conv2d
    base = dict(C=512, H=7, W=7, F=512, KH=3, KW=3, S=1, P=1, D=1)
    assert "into columns n, y, x" in op.stage_text(dict(N=8, **base), "fused")
    assert "into columns y, x" in op.stage_text(dict(N=64, **base), "fused")


def test_unknown_lowering_is_an_error():
    with pytest.raises(tcc.TccError, match="unknown convolution lowering 'fft'"):
        tcc.compile((EXAMPLES / "conv2d.tc").read_text(), conv="fft").conv2d(
            np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 3, 3), np.float32), np.zeros(1, np.float32))


NETWORK = """
op tiny_net(X: f32[N, 3, H, W], W1: f32[8, 3, 3, 3], b1: f32[8], W2: f32[4, 8, 3, 3], b2: f32[4], Wfc: f32[4, 10])
    -> Y: f32[N, 10] {
    Xp = pad(X, [0, 0, 1, 1])
    h1[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y + r, x + s] * W1[f, c, r, s]) + b1[f], 0.0)
    h1p = pad(h1, [0, 0, 1, 1])
    h2[n, g, y, x] = max(sum[f, r, s](h1p[n, f, y*2 + r, x*2 + s] * W2[g, f, r, s]) + b2[g], 0.0)
    pooled[n, g] = sum[y, x](h2[n, g, y, x]) / f32((H // 2) * (W // 2))
    Y[n, k] = sum[g](pooled[n, g] * Wfc[g, k])
}
"""


@pytest.mark.parametrize("conv", ["auto", "direct"])
def test_small_network_as_one_op(conv, rng):
    lib = tcc.compile(NETWORK, conv=conv)
    op = lib.tiny_net
    text = op.stage_text(dict(N=2, H=8, W=6), "fused")
    if conv == "auto":
        assert "im2col h1" in text and "im2col h2" in text
    _check_with(lib, "tiny_net", dict(N=2, H=8, W=6), rng)


@pytest.mark.parametrize("conv", LOWERINGS)
def test_variants_match_torch(conv, rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    lib = tcc.compile(CONV1D + CONV3D + DEPTHWISE + GROUPED, conv=conv)

    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def close(got, want):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)

    x, w, b = arr(2, 3, 17), arr(4, 3, 3), arr(4)
    close(lib.conv1d(x, w, b, S=2, P=1, D=2), F.conv1d(*map(torch.tensor, (x, w, b)), stride=2, padding=1, dilation=2))
    x, w = arr(1, 2, 5, 7, 6), arr(3, 2, 2, 3, 3)
    close(lib.conv3d(x, w, S=2, P=1), F.conv3d(torch.tensor(x), torch.tensor(w), stride=2, padding=1))
    x, w = arr(2, 5, 9, 7), arr(5, 3, 3)
    close(lib.depthwise(x, w, S=2), F.conv2d(torch.tensor(x), torch.tensor(w)[:, None], stride=2, padding=1, groups=5))
    x, w = arr(1, 4, 6, 5), arr(6, 2, 3, 3)
    close(lib.grouped(x, w), F.conv2d(torch.tensor(x), torch.tensor(w), padding=1, groups=2))


TWO_CONVS = """
op two(X: f32[N, C, H, W], A: f32[F, C, 3, 3], B: f32[F, C, 1, 1]) -> Y: f32[N, F, H // 2, W // 2] {
    Xp = pad(X, [0, 0, 1, 1])
    Y[n, f, y, x] = (sum[c, r, s](Xp[n, c, y*2 + r, x*2 + s] * A[f, c, r, s])
                     + sum[c, r: 1, s: 1](X[n, c, y*2 + r, x*2 + s] * B[f, c, r, s]))
}
"""


@pytest.mark.parametrize("conv", ["auto", "im2col"])
def test_two_convolutions_of_one_statement_get_their_own_patches(conv, rng):
    """Both reductions of one statement become GEMMs, each with its own patch and result buffers."""
    text = check(TWO_CONVS, "two", dict(N=1, C=3, H=9, W=11, F=5), conv, rng)
    assert text.count("im2col Y: patches of") == 2
