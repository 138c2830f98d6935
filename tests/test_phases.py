"""tcc/passes/te/phases.py: the data gradient of a strided convolution reads dY dilated by the
stride; after specialisation it becomes one stride-1 convolution of dY per phase (no product with
an inserted zero) and an interleave. Values against PyTorch's autograd at odd sizes, strides 2
and 3, a 1x1 window (phases that no tap reads), 1-D, 2-D, 3-D, depthwise and a stride along one
axis only."""

import numpy as np
import pytest

import tcc

torch = pytest.importorskip("torch")
F = torch.nn.functional

SRC = """
op conv1d[S = 1, P = 0](X: f32[N, C, L], Wt: f32[F, C, K]) -> Y: f32[N, F, (L + 2*P - K) // S + 1] {
    Xp = pad(X, [0, 0, P])
    Y[n, f, y] = sum[c, r](Xp[n, c, y*S + r] * Wt[f, c, r])
}
op conv2d[S = 1, P = 0](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW])
    -> Y: f32[N, F, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s])
}
op conv3d[S = 1, P = 0](X: f32[N, C, T, H, W], Wt: f32[F, C, KT, KH, KW])
    -> Y: f32[N, F, (T + 2*P - KT) // S + 1, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P, P])
    Y[n, f, z, y, x] = sum[c, q, r, s](Xp[n, c, z*S + q, y*S + r, x*S + s] * Wt[f, c, q, r, s])
}
op conv_h[S = 1, P = 0](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW])
    -> Y: f32[N, F, (H + 2*P - KH) // S + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y*S + r, x + s] * Wt[f, c, r, s])
}
op dwconv2d[S = 1, P = 0](X: f32[N, C, H, W], Wt: f32[C, KH, KW])
    -> Y: f32[N, C, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, c, y, x] = sum[r, s](Xp[n, c, y*S + r, x*S + s] * Wt[c, r, s])
}
"""

CASES = [("conv2d", (2, 3, 9, 8), (4, 3, 3, 3), 2, 1), ("conv2d", (1, 2, 33, 17), (3, 2, 3, 2), 3, 0),
         ("conv2d", (2, 5, 8, 7), (3, 5, 1, 1), 2, 0), ("conv2d", (1, 3, 11, 10), (2, 3, 5, 5), 2, 2),
         ("conv2d", (1, 1, 1, 1), (1, 1, 1, 1), 2, 0), ("conv1d", (2, 3, 13), (4, 3, 4), 2, 1),
         ("conv3d", (1, 2, 5, 6, 7), (3, 2, 2, 3, 2), 2, 1), ("dwconv2d", (2, 4, 9, 8), (4, 3, 3), 2, 1),
         ("conv_h", (2, 3, 10, 7), (4, 3, 3, 2), 2, 1)]  # strided along H only, padded along both


def _torch(name, x, w, s, p):
    if name == "conv_h":
        return F.conv2d(x, w, stride=(s, 1), padding=p)
    if name == "dwconv2d":
        return F.conv2d(x, w[:, None], stride=s, padding=p, groups=x.shape[1])
    return {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d}[name](x, w, stride=s, padding=p)


@pytest.mark.parametrize("name,xs,ws,s,p", CASES)
def test_strided_data_gradient_matches_torch(name, xs, ws, s, p, rng):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    y = _torch(name, tx, torch.tensor(w), s, p)
    dy = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(dy))
    grad = tcc.grad(tcc.compile(SRC)[name], ["X"])
    got = grad(x, w, dy, S=s, P=p, out=np.full(x.shape, np.nan, np.float32))
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert "dX_ph" in grad.lower(x, w, dy, S=s, P=p, stage="fused")  # the phases were made


def test_unit_stride_is_left_alone(rng):
    """Nothing is dilated at stride 1: the data gradient keeps its one convolution."""
    x, w = rng.standard_normal((1, 2, 7, 6)).astype(np.float32), rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    grad = tcc.grad(tcc.compile(SRC).conv2d, ["X"])
    dy = rng.standard_normal((1, 3, 7, 6)).astype(np.float32)
    assert "_ph" not in grad.lower(x, w, dy, P=1, stage="fused")
