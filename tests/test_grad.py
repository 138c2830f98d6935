"""``tcc.grad``: derived gradient ops against finite differences (float64, on the reference
interpreter's forward) and against PyTorch's autograd (float32), at odd sizes; outputs poisoned."""

from pathlib import Path

import numpy as np
import pytest

import tcc
from tcc.testing import reference_results

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

OPS = """
op bmm(A: f32[B, M, K], Bm: f32[B, K, N]) -> C: f32[B, M, N] {
    C[b, i, j] = sum[k](A[b, i, k] * Bm[b, k, j])
}
op conv1d[S = 1, P = 0, D = 1](X: f32[N, C, L], Wt: f32[F, C, K], b: f32[F])
    -> Y: f32[N, F, (L + 2*P - D*(K - 1) - 1) // S + 1] {
    Xp = pad(X, [0, 0, P])
    Y[n, f, y] = sum[c, r](Xp[n, c, y*S + r*D] * Wt[f, c, r]) + b[f]
}
op conv3d[S = 1, P = 0, D = 1](X: f32[N, C, T, H, W], Wt: f32[F, C, KT, KH, KW])
    -> Y: f32[N, F, (T + 2*P - D*(KT - 1) - 1) // S + 1, (H + 2*P - D*(KH - 1) - 1) // S + 1,
              (W + 2*P - D*(KW - 1) - 1) // S + 1] {
    Xp = pad(X, [0, 0, P, P, P])
    Y[n, f, t, y, x] = sum[c, q, r, s](Xp[n, c, t*S + q*D, y*S + r*D, x*S + s*D] * Wt[f, c, q, r, s])
}
op gconv2d[S = 1, P = 0](X: f32[N, G, C, H, W], Wt: f32[G, F, C, KH, KW])
    -> Y: f32[N, G, F, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, 0, P, P])
    Y[n, g, f, y, x] = sum[c, r, s](Xp[n, g, c, y*S + r, x*S + s] * Wt[g, f, c, r, s])
}
op dwconv2d[S = 1, P = 0, D = 1](X: f32[N, C, H, W], Wt: f32[C, KH, KW])
    -> Y: f32[N, C, (H + 2*P - D*(KH - 1) - 1) // S + 1, (W + 2*P - D*(KW - 1) - 1) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, c, y, x] = sum[r, s](Xp[n, c, y*S + r*D, x*S + s*D] * Wt[c, r, s])
}
op avgpool2d[K = 2, S = 2](X: f32[N, C, H, W]) -> Y: f32[N, C, (H - K) // S + 1, (W - K) // S + 1] {
    Y[n, c, y, x] = sum[r: K, s: K](X[n, c, y*S + r, x*S + s]) / (K * K)
}
op chain(X: f32[N], Z: f32[N]) -> Y: f32[N] {
    a[i] = exp(0.3 * X[i]) + log(abs(X[i]) + 1.0) + sqrt(abs(Z[i]) + 0.5) + rsqrt(X[i] * X[i] + 1.0)
    b[i] = sin(X[i]) * cos(Z[i]) + tanh(X[i] - Z[i]) + sigmoid(2.0 * Z[i]) + erf(X[i]) + abs(Z[i] - 0.1)
    c[i] = max(X[i], Z[i]) - min(X[i], 0.25) + select(X[i] > Z[i], X[i] * Z[i], Z[i] / (1.5 + X[i] * X[i]))
    Y[i] = a[i] * b[i] + c[i] ** 2 + pow(abs(X[i]) + 1.0, Z[i]) + f32(f64(X[i]) * 3.0) + floor(X[i]) - X[i] % 0.75
}
op shifts(X: f32[N]) -> (Y: f32[N - 2], Z: f32[(N + 1) // 2]) {
    Y[i] = X[i + 2] * X[i] - X[0]
    Z[i] = X[2 * i] * 3.0
}
op reversed(X: f32[N], Z: f32[N, 2]) -> Y: f32[N] {
    Y[i] = X[N - 1 - i] * X[i] + sum[k: 2](Z[N - 1 - i, 1 - k] * f32(k + 1))
}
op padpad(X: f32[N]) -> (Y: f32[N + 3], Z: f32[N + 1]) {
    Xp = pad(X, [1], [0])
    Xq = pad(Xp, [0], [2], value=1.0)
    Y[i] = Xq[i] * Xq[i]
    Z[i] = Xp[i] * 2.0
}
op diag(X: f32[N, N]) -> Y: f32[N] {
    Y[i] = X[i, i] * X[0, i]
}
op reused(X: f32[N, C]) -> (Y: f32[N, C], Z: f32[N]) {
    Y[n, c] = tanh(X[n, c])
    Z[n] = sum[c](Y[n, c] * X[n, c] * sum[k](X[k, c]))
}
op extremes(X: f32[N, C]) -> (P: f32[N], M: f32[C]) {
    P[n] = prod[c](X[n, c])
    M[c] = min[n](X[n, c]) * 2.0
}
"""
EXAMPLE = {"matmul": "matmul.tc", "softmax": "softmax.tc", "layernorm": "layernorm.tc",
           "maxpool2d": "maxpool2d.tc", "conv2d": "conv2d.tc", "bias_relu": "bias_relu.tc"}

CASES = [
    ("matmul", dict(M=7, K=5, N=33)), ("bmm", dict(B=3, M=1, K=7, N=5)),
    ("conv1d", dict(N=2, C=3, L=11, F=4, K=3, S=2, P=1, D=2)), ("conv2d", dict(N=1, C=3, H=9, W=7, F=5, KH=3, KW=2)),
    ("conv2d", dict(N=2, C=2, H=8, W=9, F=3, KH=3, KW=3, S=2, P=2, D=2)),
    ("conv3d", dict(N=1, C=2, T=5, H=6, W=7, F=3, KT=2, KH=3, KW=2, S=2, P=1)),
    ("gconv2d", dict(N=2, G=3, C=2, H=7, W=6, F=2, KH=3, KW=3, P=1)),
    ("dwconv2d", dict(N=1, C=5, H=9, W=8, KH=3, KW=3, S=2, P=1)),
    ("softmax", dict(N=7, C=33)), ("layernorm", dict(N=3, D=17)), ("maxpool2d", dict(N=2, C=3, H=9, W=7, K=3, S=2)),
    ("avgpool2d", dict(N=1, C=3, H=7, W=8, K=3, S=2)), ("bias_relu", dict(N=7, C=5)), ("chain", dict(N=33)),
    ("shifts", dict(N=9)), ("reversed", dict(N=7)), ("diag", dict(N=7)), ("reused", dict(N=4, C=7)),
    ("extremes", dict(N=5, C=3)), ("padpad", dict(N=6)),
]


def _source(name: str, dtype: str = "f32") -> str:
    text = (EXAMPLES / EXAMPLE[name]).read_text() if name in EXAMPLE else OPS
    return text.replace("f32", dtype)


def _split(op, bindings: dict) -> tuple[dict, dict]:
    cparams = {k: v for k, v in bindings.items() if k in op.te.cparams}
    return cparams, {**op.te.cparams, **bindings}


def _inputs(op, full: dict, rng) -> list[np.ndarray]:
    from tcc.testing import specialize_inputs

    shapes = specialize_inputs(op.te, full)
    return [rng.standard_normal(shapes[p]) for p in op.te.params]


def _call_poisoned(op, args: list, cparams: dict, full: dict) -> tuple[np.ndarray, ...]:
    expected = reference_results(op.te, args, full)
    outs = tuple(np.full(e.shape, np.nan, e.dtype) for e in expected)
    got = op(*args, out=outs if len(outs) > 1 else outs[0], **cparams)
    return got if isinstance(got, tuple) else (got,)


def _directional(op, args: list, full: dict, upstream: list, i: int, v: np.ndarray, h: float = 1e-6) -> float:
    """d/dh sum(<R(args[i] + h v), dR>) at h = 0 by central differences on the reference interpreter."""
    def loss(sign: int) -> float:
        moved = [a + sign * h * v if k == i else a for k, a in enumerate(args)]
        outs = reference_results(op.te, moved, full)
        return sum(float(np.sum(r * u)) for r, u in zip(outs, upstream) if r.dtype.kind == "f")

    return (loss(1) - loss(-1)) / (2 * h)


FD_CASES = CASES + [("conv2d", dict(N=1, C=2, H=3, W=5, F=2, KH=3, KW=3, S=2, D=2))]  # an empty output


@pytest.mark.parametrize("name,bindings", FD_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FD_CASES)])
def test_gradient_matches_finite_differences(name, bindings, rng):
    """<dX, v> == d/dh sum(<R(X + h v), dR>) at h = 0, central differences in float64, for every input."""
    op = tcc.compile(_source(name, "f64"))[name]
    cparams, full = _split(op, bindings)
    args = _inputs(op, full, rng)
    results = reference_results(op.te, args, full)
    upstream = [rng.standard_normal(r.shape) for r in results]
    grads = _call_poisoned(tcc.grad(op), [*args, *upstream], cparams, {**full})
    for x, (arg, g) in enumerate(zip(args, grads)):
        v = rng.standard_normal(arg.shape)
        numeric = _directional(op, args, full, upstream, x, v)
        analytic = float(np.sum(g * v))
        assert abs(numeric - analytic) <= 1e-5 * max(1.0, abs(numeric)), (op.te.params[x], numeric, analytic)


@pytest.mark.parametrize("n,d", [(3, 17), (2, 5), (4, 16)])
def test_two_reductions_in_one_statement(n, d, rng):
    """Vectorised reductions fold their lanes before the statement's store (the layernorm gradient
    sums two reductions in one statement; the second's allocation used to swallow the first's fold)."""
    from helpers import check_op

    src = """op two(X: f32[N, D]) -> Y: f32[N] {
        m[n] = sum[d](X[n, d])
        Y[n] = sum[d](X[n, d] * m[n]) + sum[e](X[n, e] * 2.0)
    }"""
    check_op(src, "two", dict(N=n, D=d), rng)


def _torch_fns():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def gconv(x, w, S=1, P=0):
        n, g, c, h, wd = x.shape
        y = F.conv2d(x.reshape(n, g * c, h, wd), w.reshape(g * w.shape[1], c, *w.shape[3:]), stride=S, padding=P,
                     groups=g)
        return y.reshape(n, g, w.shape[1], *y.shape[2:])

    return {
        "matmul": lambda a, b: a @ b,
        "bmm": lambda a, b: torch.bmm(a, b),
        "conv1d": lambda x, w, b, S=1, P=0, D=1: F.conv1d(x, w, b, stride=S, padding=P, dilation=D),
        "conv2d": lambda x, w, b, S=1, P=0, D=1: F.conv2d(x, w, b, stride=S, padding=P, dilation=D),
        "conv3d": lambda x, w, S=1, P=0, D=1: F.conv3d(x, w, stride=S, padding=P, dilation=D),
        "gconv2d": gconv,
        "dwconv2d": lambda x, w, S=1, P=0, D=1: F.conv2d(x, w[:, None], stride=S, padding=P, dilation=D,
                                                         groups=x.shape[1]),
        "softmax": lambda x: torch.softmax(x, 1),
        "layernorm": lambda x, g, b: F.layer_norm(x, x.shape[1:], g, b, eps=1e-5),
        "maxpool2d": lambda x, K=2, S=2: F.max_pool2d(x, K, S),
        "avgpool2d": lambda x, K=2, S=2: F.avg_pool2d(x, K, S),
        "bias_relu": lambda x, b: torch.relu(x + b),
    }


NO_TORCH = ("chain", "shifts", "reversed", "diag", "reused", "extremes", "padpad")  # no one torch function
TORCH_CASES = [c for c in CASES if c[0] not in NO_TORCH] + [
    ("conv2d", dict(N=1, C=4, H=7, W=7, F=3, KH=1, KW=1)), ("conv1d", dict(N=1, C=2, L=9, F=3, K=4, P=3)),
    ("dwconv2d", dict(N=2, C=3, H=7, W=9, KH=3, KW=3, D=2, P=2)), ("maxpool2d", dict(N=1, C=2, H=8, W=8)),
]


@pytest.mark.parametrize("name,bindings", TORCH_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(TORCH_CASES)])
def test_gradient_matches_torch_autograd(name, bindings, rng):
    torch = pytest.importorskip("torch")
    fn = _torch_fns()[name]
    op = tcc.compile(_source(name))[name]
    cparams, full = _split(op, bindings)
    args = [a.astype(np.float32) for a in _inputs(op, full, rng)]
    leaves = [torch.tensor(a, requires_grad=True) for a in args]
    out = fn(*leaves, **cparams)
    upstream = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    out.backward(torch.tensor(upstream))
    grads = _call_poisoned(tcc.grad(op), [*args, upstream], cparams, full)
    for param, got, leaf in zip(op.te.params, grads, leaves):
        want = leaf.grad.numpy()
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 2e-5 * scale, f"d{param}"


HAND = [dict(N=1, C=2, H=5, W=6, F=3, KH=3, KW=3), dict(N=2, C=3, H=9, W=8, F=2, KH=3, KW=2, S=2, P=1),
        dict(N=1, C=1, H=7, W=7, F=2, KH=3, KW=3, S=3, P=2)]


@pytest.mark.parametrize("case", HAND)
def test_conv2d_gradients_are_the_hand_written_ones(case, rng):
    """tcc.grad(conv2d) gives examples/conv2d_grad.tc's gradients, through the same im2col GEMMs."""
    hand = tcc.compile(EXAMPLES / "conv2d_grad.tc")
    conv = tcc.compile(EXAMPLES / "conv2d.tc").conv2d
    cparams = {k: case[k] for k in ("S", "P") if k in case}
    x = rng.standard_normal((case["N"], case["C"], case["H"], case["W"])).astype(np.float32)
    w = rng.standard_normal((case["F"], case["C"], case["KH"], case["KW"])).astype(np.float32)
    b = rng.standard_normal(case["F"]).astype(np.float32)
    dy = rng.standard_normal(conv(x, w, b, **cparams).shape).astype(np.float32)
    for wrt, hand_op in (("X", hand.conv2d_grad_x), ("Wt", hand.conv2d_grad_w)):
        derived = tcc.grad(conv, [wrt])
        got = derived(x, w, b, dy, out=np.full(x.shape if wrt == "X" else w.shape, np.nan, np.float32), **cparams)
        np.testing.assert_allclose(got, hand_op(x, w, dy, **cparams), rtol=1e-5, atol=1e-5)
        fused = derived.lower(x, w, b, dy, stage="fused", **cparams)
        assert fused.count("im2col") == hand_op.lower(x, w, dy, stage="fused", **cparams).count("im2col")


def test_gradient_source_prints_and_reparses():
    """The derived op is ordinary source: it names its inputs, upstream gradients and results."""
    conv = tcc.compile(EXAMPLES / "conv2d.tc").conv2d
    text = tcc.grad_source(conv, ["X", "b"])
    lib = tcc.compile(text)
    op = lib.conv2d_grad
    assert op.te.params == ["X", "Wt", "b", "dY"] and op.te.results == ["dX", "db"]
    assert "dYp = pad(dYd" in text  # the data gradient reads dY dilated and padded: a gather, no scatter


def test_grad_rejects_bad_wrt():
    conv = tcc.compile(EXAMPLES / "conv2d.tc").conv2d
    with pytest.raises(tcc.TccError, match="no tensor input 'Q'"):
        tcc.grad(conv, ["Q"])
    ints = tcc.compile("op f(X: i32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = f32(X[i]) * Y[i] }").f
    with pytest.raises(tcc.TccError, match="only float inputs"):
        tcc.grad(ints, ["X"])
    np.testing.assert_array_equal(tcc.grad(ints)(np.arange(3, dtype=np.int32), np.ones(3, np.float32),
                                                 np.full(3, 2, np.float32)), [0, 2, 4])


@pytest.mark.parametrize("m,k,d", [(3, 3, 2), (17, 2, 1), (1, 4, 3), (5, 1, 0)])
def test_floor_division_index(m, k, d, rng):
    """A read ``X[i // K]`` (nearest upsampling; a dilation in a derived gradient) differentiates
    as a guarded gather: ``dX[a]`` sums ``dY`` over the ``i`` with ``i // K == a`` that exist."""
    op = tcc.compile("op up[K = 2, D = 0](X: f32[M]) -> Y: f32[M * K - D] { Y[i] = 2.0 * X[i // K] }").up
    x = rng.standard_normal(m).astype(np.float32)
    dy = rng.standard_normal(m * k - d).astype(np.float32)
    got = tcc.grad(op)(x, dy, out=np.full(x.shape, np.nan, np.float32), K=k, D=d)
    want = np.zeros_like(x)
    np.add.at(want, np.arange(m * k - d) // k, 2.0 * dy)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


GPU_CASES = [("conv2d", dict(N=2, C=3, H=9, W=8, F=4, KH=3, KW=3, S=2, P=1)), ("softmax", dict(N=7, C=33)),
             ("layernorm", dict(N=3, D=17)), ("maxpool2d", dict(N=2, C=3, H=9, W=7, K=3, S=2)),
             ("matmul", dict(M=7, K=5, N=33)), ("dwconv2d", dict(N=1, C=5, H=9, W=8, KH=3, KW=3, S=2, P=1))]


@pytest.mark.cuda
@pytest.mark.parametrize("name,bindings", GPU_CASES, ids=[n for n, _ in GPU_CASES])
def test_gradients_on_the_gpu_match_the_reference(name, bindings, rng):
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except tcc.TccError:
        pytest.skip("no CUDA GPU")
    op = tcc.compile(_source(name), target="cuda")[name]
    grad = tcc.grad(op)
    cparams, full = _split(op, bindings)
    args = [a.astype(np.float32) for a in _inputs(op, full, rng)]
    upstream = [rng.standard_normal(r.shape).astype(np.float32) for r in reference_results(op.te, args, full)]
    got = grad(*args, *upstream, **cparams)
    got = got if isinstance(got, tuple) else (got,)
    for g, want in zip(got, reference_results(grad.te, [*args, *upstream], full)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("seed", range(12))
def test_random_programs(seed):
    """The fuzzer's random programs (in float64): where tcc.grad derives a gradient op, it compiles,
    agrees with the reference, and with central differences of the forward."""
    import re

    from fuzz.generate import generate

    from tcc.testing import random_args

    prog = generate(seed)
    rng = np.random.default_rng(seed)
    lib = tcc.compile(re.sub(r"\b(f16|bf16|f32)\b", "f64", prog.source))
    for case in prog.cases:
        op = lib[case.name]
        floats = [p for p in op.te.inputs if op.te.tensors[p].dtype.is_float]
        full = {**op.te.cparams, **case.bindings}
        try:
            grad = tcc.grad(op)
            args = random_args(op.te, full, rng)
            results = reference_results(op.te, args, full)
        except tcc.TccError:  # an index that is not affine, or an op the reference refuses
            continue
        cparams = {k: v for k, v in case.bindings.items() if k in op.te.cparams}
        upstream = [rng.standard_normal(r.shape) if r.dtype.kind == "f" else np.zeros_like(r) for r in results]
        got = _call_poisoned(grad, [*args, *upstream], cparams, full)
        for g, want in zip(got, reference_results(grad.te, [*args, *upstream], full)):
            np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(want).max(initial=0))))
        for name, g in zip(floats, got):
            i = op.te.params.index(name)
            v = rng.standard_normal(args[i].shape)
            numeric = _directional(op, args, full, upstream, i, v)
            assert abs(numeric - float(np.sum(g * v))) <= 1e-4 * max(1.0, abs(numeric)), (seed, case.name, name)
