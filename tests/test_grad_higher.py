"""``tcc.grad`` of every op the forward compiles, to second order: reads through clamps, ``//``,
``%``, pad views, repeated and coupled index variables, and the gradient of a gradient. Each op is
checked against central differences in float64 (``fuzz.grad_check``) at odd sizes, first and
second order; a few against PyTorch's ``gradgradcheck`` through ``tcc.torch``."""

import numpy as np
import pytest
from fuzz.grad_check import check_op_gradients

import tcc

# The fuzz findings of issue "Step 10", classes 5 to 8, as ops with the sizes to call them at.
OPS = {
    # 5: the first gradient reads dY clamped (min(max(i0, 0), 2)): its own gradient masks
    "tanh_literal": ("op f(X: f64[N]) -> Y: f64[3] { Y[i] = tanh(X[i]) }", dict(N=5)),
    "row_sums_literal": ("op f(X: f64[N, 5]) -> Y: f64[3] { Y[i] = sum[j](X[i, j] * X[i, j]) }", dict(N=7)),
    "reversed_literal": ("op f(X: f64[4]) -> Y: f64[4] { Y[j] = X[3 - j] * X[j] }", {}),
    "shifted_strided": ("op f(X: f64[N]) -> (Y: f64[N - 2], Z: f64[(N + 1) // 2]) {\n"
                        "    Y[i] = X[i + 2] * sin(X[i])\n    Z[i] = X[2 * i] * X[2 * i] * 3.0\n}", dict(N=9)),
    "maxpool": ("op f[K = 3, S = 2](X: f64[C, H, W]) -> Y: f64[C, (H - K) // S + 1, (W - K) // S + 1] {\n"
                "    Y[c, y, x] = max[r: K, s: K](X[c, y*S + r, x*S + s] * X[c, y*S + r, x*S + s])\n}",
                dict(C=2, H=7, W=5)),
    "avgpool_strided_conv": ("op f[S = 2, P = 1](X: f64[C, L], Wt: f64[F, C, K]) -> "
                             "Y: f64[F, (L + 2*P - K) // S + 1] {\n    Xp = pad(X, [0, P])\n"
                             "    Y[f, y] = tanh(sum[c, r](Xp[c, y*S + r] * Wt[f, c, r]))\n}",
                             dict(C=2, L=7, F=3, K=3)),
    # 6: coupled variables (a cycle if solved one dim at a time) and a repeated one
    "coupled": ("op f(X: f64[5, 8]) -> Y: f64[2, 2] { Y[i, j] = X[i + j, 2*i + j] * X[i + j, 2*i + j] }", {}),
    "repeated_in_sum": ("op f(X: f64[5, 8]) -> Y: f64[2] { Y[i] = sum[k: 2](exp(X[i + k, i + k])) }", {}),
    # 7: a reduction hoisted into an intermediate of higher rank than any tensor of the op
    "hoisted_rank": ("op f(X: f64[3, 4], T: f64[4]) -> Y: f64[3, 4] {\n"
                     "    Y[i, j] = sum[k: 3](sum[m: 1](select(j < 0, T[k], X[i, m + i] * X[i, m + i])))\n}", {}),
    # 8: reads through pad views, //, % and a repeated variable under //
    "pad_floordiv": ("op f(X: f64[4]) -> Y: f64[17] { P = pad(X, [1], [1]); Y[j] = P[j // 3] * cos(P[j // 3]) }", {}),
    # a pad view of a pad view of an intermediate (found by the grad fuzzer: its gradient was 0)
    "pad_of_pad": ("op f(X: f64[N, K]) -> Y: f64[K, N] {\n    T[i] = i - X[i, 0]\n    P = pad(T, [0], [1])\n"
                   "    Q = pad(P, [1], [0], value=-1.0)\n    Y[i, j] = Q[j + 2] * Q[j + 1] * X[j, i]\n}",
                   dict(N=3, K=4)),
    "mod": ("op f(X: f64[N]) -> Y: f64[9] { Y[j] = X[j % N] * X[(j + 1) % N] }", dict(N=4)),
    "floordiv_offset": ("op f(X: f64[6]) -> Y: f64[9] { Y[i] = sigmoid(X[i // 2 + 1]) }", {}),
    "floordiv_diagonal": ("op f(X: f64[5, 9]) -> Y: f64[9] { Y[j] = X[j // 2, j] * X[j // 2, j] }", {}),
    "squared_index": ("op f(X: f64[N]) -> Y: f64[N] { Y[i] = X[i * i % N] * X[i] }", dict(N=7)),
    "clamped_read": ("op f(X: f64[N]) -> Y: f64[N + 3] { Y[i] = X[min(max(i - 2, 0), N - 1)] ** 3 }", dict(N=5)),
}


@pytest.mark.parametrize("name", list(OPS))
def test_first_and_second_order_match_finite_differences(name):
    source, bindings = OPS[name]
    op = tcc.compile(source).f
    status, detail = check_op_gradients(op, bindings, seed=len(name), orders=2, torch_check=False)
    assert status == "ok", detail


def test_third_order():
    """Higher orders are the same derivation again: the gradient of the gradient of the gradient."""
    op = tcc.compile(OPS["reversed_literal"][0]).f
    status, detail = check_op_gradients(op, {}, seed=3, orders=3, torch_check=False)
    assert status == "ok", detail


@pytest.mark.parametrize("name", ["tanh_literal", "shifted_strided", "pad_floordiv", "coupled"])
def test_gradgradcheck_through_torch(name):
    torch = pytest.importorskip("torch")
    source, bindings = OPS[name]
    fn = tcc.torch.op(tcc.compile(source).f, namespace="grad_higher", name=name)
    shapes = {"tanh_literal": (5,), "shifted_strided": (9,), "pad_floordiv": (4,), "coupled": (5, 8)}
    x = torch.randn(shapes[name], dtype=torch.float64, requires_grad=True)

    def first(t):
        out = fn(t)
        return out if isinstance(out, tuple) else (out,)

    assert torch.autograd.gradcheck(first, (x,))
    assert torch.autograd.gradgradcheck(first, (x,))


def test_masked_gather_values(rng):
    """A non-invertible read ``X[i * i % N]``: ``dX[a]`` sums ``dY[i]`` over the ``i`` that read ``a``."""
    op = tcc.compile(OPS["squared_index"][0].replace("* X[i]", "* 2.0")).f
    x, dy = rng.standard_normal(7), rng.standard_normal(7)
    got = tcc.grad(op)(x, dy, out=np.full(7, np.nan))
    want = np.zeros(7)
    np.add.at(want, np.arange(7) ** 2 % 7, 2.0 * dy)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
