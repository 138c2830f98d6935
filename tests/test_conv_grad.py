"""The conv2d gradients written in the language (examples/conv2d_grad.tc) agree with the
reference and with PyTorch's autograd."""

from pathlib import Path

import numpy as np
import pytest
from helpers import check_op

import tcc

SRC = (Path(__file__).resolve().parent.parent / "examples" / "conv2d_grad.tc").read_text()
CASES = [dict(N=1, C=2, H=5, W=6, F=3, KH=3, KW=3), dict(N=2, C=3, H=9, W=8, F=2, KH=3, KW=2, S=2, P=1),
         dict(N=1, C=1, H=7, W=7, F=2, KH=3, KW=3, S=3, P=2), dict(N=2, C=2, H=6, W=5, F=4, KH=1, KW=1),
         # 6x6 phases: the batch joins their GEMMs' columns, one phase's result is then read per
         # image by a group (whose slice init_in_registers once zeroed as if it were a tile)
         dict(N=2, C=8, H=12, W=12, F=16, KH=3, KW=3, S=2, P=1)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["conv2d_grad_x", "conv2d_grad_w"])
def test_gradients_match_reference(name, case, rng):
    check_op(SRC, name, case, rng)


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_torch_autograd(case, rng):
    torch = pytest.importorskip("torch")
    s, p = case.get("S", 1), case.get("P", 0)
    x = rng.standard_normal((case["N"], case["C"], case["H"], case["W"])).astype(np.float32)
    w = rng.standard_normal((case["F"], case["C"], case["KH"], case["KW"])).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    y = torch.nn.functional.conv2d(tx, tw, stride=s, padding=p)
    dy = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(dy))
    lib = tcc.compile(SRC)
    dx = lib.conv2d_grad_x(x, w, dy, S=s, P=p)
    dw = lib.conv2d_grad_w(x, w, dy, S=s, P=p)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_matches_torch_forward(rng):
    torch = pytest.importorskip("torch")
    lib = tcc.compile(Path(__file__).resolve().parent.parent / "examples" / "conv2d.tc")
    x = rng.standard_normal((2, 3, 11, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    for s, p, d in [(1, 0, 1), (2, 1, 1), (1, 2, 2)]:
        expected = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=s,
                                              padding=p, dilation=d).numpy()
        np.testing.assert_allclose(lib.conv2d(x, w, b, S=s, P=p, D=d), expected, rtol=1e-4, atol=1e-4)


# Weight gradients large enough for im2col's partial sums: one image's output pixels (the GEMM's
# reduction) reach PARTIAL_MIN_K, so each image is a GEMM of its own whose results are summed.
WEIGHT_CASES = [dict(N=3, C=5, H=17, W=19, F=7, KH=3, KW=3, P=1),       # 17 x 19 pixels: partial sums
                dict(N=2, C=33, H=16, W=16, F=3, KH=1, KW=1),           # 1x1: the patches transpose X
                dict(N=2, C=3, H=35, W=33, F=4, KH=3, KW=2, S=2, P=1),  # strided, 17 x 17 pixels
                dict(N=1, C=1, H=7, W=7, F=2, KH=3, KW=3, S=3, P=2)]    # too few pixels: no partial sums


@pytest.mark.parametrize("case", WEIGHT_CASES)
def test_weight_gradient_is_one_gemm_over_channels_and_window(case, rng):
    """dW = sum[n, y, x](dY * Xp) is a GEMM whose columns are c, r, s (not C GEMMs of R*S columns),
    per image with its results summed when an image has enough pixels; it matches the reference."""
    check_op(SRC, "conv2d_grad_w", case, rng)
    cparams = {k: case[k] for k in ("S", "P") if k in case}
    op = tcc.compile(SRC).conv2d_grad_w
    x = np.ones((case["N"], case["C"], case["H"], case["W"]), np.float32)
    w = np.ones((case["F"], case["C"], case["KH"], case["KW"]), np.float32)
    oy, ox = ((d + 2 * case.get("P", 0) - k) // case.get("S", 1) + 1 for d, k in ((case["H"], case["KH"]),
                                                                                 (case["W"], case["KW"])))
    fused = op.lower(x, w, np.ones((case["N"], case["F"], oy, ox), np.float32), stage="fused", **cparams)
    assert "into columns r, s, c" in fused
    assert ("summed after" in fused) == (oy * ox >= 256)


def test_unit_stride_data_gradient_pads_dy_itself(rng):
    """With S = 1, dY "dilated" by the stride is a copy of dY: fusion drops it and the pad reads dY,
    so the data gradient is the forward's patches and GEMM; the values still match the reference."""
    case = dict(N=2, C=3, H=9, W=7, F=5, KH=3, KW=2, P=1)
    check_op(SRC, "conv2d_grad_x", case, rng)
    op = tcc.compile(SRC).conv2d_grad_x
    x, w, dy = np.ones((2, 3, 9, 7), np.float32), np.ones((5, 3, 3, 2), np.float32), np.ones((2, 5, 9, 8), np.float32)
    assert "alias dYd: a copy of dY" in op.lower(x, w, dy, P=1, stage="fused")
    assert "alias" not in op.lower(x, w, np.ones((2, 5, 5, 4), np.float32), S=2, P=1, stage="fused")
