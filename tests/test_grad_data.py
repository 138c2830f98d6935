"""``tcc.grad`` of the language's data-driven forms: gathers by data (their gradient a scatter-add,
linear in the number of reads), ``+=`` scatters (their gradient a gather of the adjoint), prefix
sums, recurrences, random numbers and dtype parameters. Each against central differences in
float64 (first and second order, ``fuzz.grad_check``) on random data at odd sizes with duplicate
indices, against PyTorch's autograd, and trained through ``tcc.torch``."""

from __future__ import annotations

import numpy as np
import pytest
from fuzz.grad_check import check_op_gradients, run_poisoned

import tcc
from tcc.ir.expr import Reduce, free_vars, walk
from tcc.ir.te import format_op

GATHERS = """
op embedding(E: f64[V, D], idx: i64[N]) -> Y: f64[N, D] {
    Y[n, d] = E[idx[n], d] * E[idx[n], d]
}
op pick(X: f64[N, C], lab: i64[N]) -> Y: f64[N] {
    Y[n] = exp(X[n, lab[n]]) + X[n, 0]
}
op window[L = 1](X: f64[T, D], start: i64) -> Y: f64[L, D] {
    Y[i, d] = sin(X[start + i, d])
}
op copy_window[L = 1](X: f64[T, D], start: i64) -> Y: f64[L, D] {
    Y[i, d] = X[start + i, d] * 2.0
}
op bag(E: f64[V, D], idx: i64[N, K], W: f64[K]) -> Y: f64[N, D] {
    Y[n, d] = sum[k](E[idx[n, k], d] * W[k])
}
op shifted(E: f64[V], idx: i64[N]) -> Y: f64[N, 2] {
    Y[n, k] = E[idx[n] + k] * E[idx[n] + k]
}
op segment_sum[S = 1](X: f64[N, D], seg: i64[N], W: f64[S, D]) -> Y: f64[S, D] {
    Y[s, d] = W[s, d]
    Y[seg[n], d] += X[n, d] * X[n, d]
}
op added_after[S = 1](X: f64[S], seg: i64[N], W: f64[N]) -> Z: f64[S] {
    T[s] = exp(X[s])
    T[seg[n]] += W[n] * X[seg[n]]
    Z[s] = T[s] * T[s]
}
op recurrence_added[S = 1](X: f64[S], seg: i64[N], W: f64[N]) -> H: f64[S] {
    H[s] = select(s == 0, X[s], tanh(H[s - 1]) * X[s])
    H[seg[n]] += W[n] * W[n]
}
op pad_border(X: f64[M, N], idx: i64[M]) -> Y: f64[M] {
    Xp = pad(X, [0, 0], [1, 1])
    Y[i] = tanh(Xp[(i + 1) % (M + 1), idx[i]]) + Xp[idx[i] + 1, i % (N + 1)]
}
op scatter_sum[S = 1](X: f64[N], pos: i64[N, K]) -> Y: f64[S] {
    Y[s] = 0.0
    Y[pos[n, k]] += sum[d: 2](X[n] * f64(d + k + 1))
}
"""


def _ints(rng, high: int, shape) -> np.ndarray:
    """Indices in [0, high) with duplicates (more draws than values, or a value repeated)."""
    out = rng.integers(0, high, shape)
    if out.size > 1:
        out.flat[-1] = out.flat[0]
    return out


def _fd(op, args: list, bindings: dict, orders: int = 2) -> None:
    status, detail = check_op_gradients(op, bindings, seed=1, orders=orders, torch_check=False, args=args)
    assert status == "ok", detail


@pytest.mark.parametrize("v,d,n", [(1, 1, 1), (7, 3, 33), (33, 7, 7)])
def test_embedding_gradient_is_a_scatter_add(rng, v, d, n):
    op = tcc.compile(GATHERS).embedding
    grad = tcc.grad(op)
    scatters = [c for c in grad.te.computes if c.accumulate]
    assert len(scatters) == 1 and "idx[n]" in format_op(grad.te)  # dE[idx[n], d] += ...: no sum over n per row
    assert {ax.var.name for ax in scatters[0].axes} == {"n", "d"}
    E, idx = rng.standard_normal((v, d)), _ints(rng, v, n)
    dY = rng.standard_normal((n, d))
    want = np.zeros((v, d))
    np.add.at(want, idx, 2 * E[idx] * dY)
    np.testing.assert_allclose(run_poisoned(grad, [E, idx, dY], {"V": v, "D": d, "N": n}, {})[0], want,
                               rtol=1e-12, atol=1e-12)
    _fd(op, [E, idx], {"V": v, "D": d, "N": n})


@pytest.mark.parametrize("name,bindings,ints", [
    ("pick", dict(N=7, C=33), {"lab": ("C", (7,))}),
    ("pick", dict(N=1, C=1), {"lab": ("C", (1,))}),
    ("bag", dict(V=7, D=3, N=33, K=2), {"idx": ("V", (33, 2))}),
    ("bag", dict(V=1, D=1, N=1, K=1), {"idx": ("V", (1, 1))}),
    ("shifted", dict(V=8, N=33), {"idx": (7, (33,))}),
    ("segment_sum", dict(N=33, D=7, S=7), {"seg": ("S", (33,))}),
    ("segment_sum", dict(N=1, D=1, S=1), {"seg": ("S", (1,))}),
    ("scatter_sum", dict(N=7, K=3, S=5), {"pos": ("S", (7, 3))}),
    ("added_after", dict(N=33, S=7), {"seg": ("S", (33,))}),  # exp's derivative reads T before the +=
    ("recurrence_added", dict(N=7, S=33), {"seg": ("S", (7,))}),  # (grad fuzz: refused, then wrong)
    ("pad_border", dict(M=7, N=3), {"idx": (4, (7,))}),  # reads in a pad's border add nothing (fuzz 425)
])
def test_gathers_and_scatters_match_finite_differences(rng, name, bindings, ints):
    """First and second order (the second differentiates the first's scatter-add: a gather)."""
    op = tcc.compile(GATHERS)[name]
    args = []
    for p in op.te.inputs:
        if p in ints:
            high, shape = ints[p]
            args.append(_ints(rng, bindings[high] if isinstance(high, str) else high, shape))
        else:
            shape = [bindings[str(d)] if str(d) in bindings else int(str(d)) for d in op.te.tensors[p].shape]
            args.append(rng.standard_normal(shape))
    _fd(op, args, bindings)


@pytest.mark.parametrize("t,length,start", [(9, 4, 5), (7, 1, 0), (33, 33, 0), (1, 1, 0)])
def test_window_at_a_runtime_offset(rng, t, length, start):
    """(The copy's gradient once read dY through a pad whose widths used the runtime offset, which a
    pad may not: grad fuzz seed 256.)"""
    for name in ("window", "copy_window"):
        op = tcc.compile(GATHERS)[name]
        X = rng.standard_normal((t, 3))
        status, detail = check_op_gradients(op, {"T": t, "D": 3, "L": length}, seed=2, orders=2, torch_check=False,
                                            args=[X, start])
        assert status == "ok", detail


def test_gathers_match_torch_autograd(rng):
    """Embedding, label pick and a window at a runtime offset, in f32, against PyTorch's autograd."""
    torch = pytest.importorskip("torch")
    lib = tcc.compile(GATHERS.replace("f64", "f32"))
    E, X = rng.standard_normal((7, 33)).astype(np.float32), rng.standard_normal((33, 7)).astype(np.float32)
    idx, lab = _ints(rng, 7, 33), _ints(rng, 7, 33)
    cases = [(lib.embedding, [E, idx], {}, lambda e, i: e[i] * e[i]),
             (lib.pick, [X, lab], {}, lambda x, i: torch.exp(x[torch.arange(33), i]) + x[:, 0]),
             (lib.window, [X, 3], {"L": 7}, lambda x, s: torch.sin(x[s:s + 7]))]
    for op, args, cparams, fn in cases:
        leaf = torch.tensor(args[0], requires_grad=True)
        out = fn(leaf, torch.tensor(args[1]) if isinstance(args[1], np.ndarray) else args[1])
        dy = rng.standard_normal(tuple(out.shape)).astype(np.float32)
        out.backward(torch.tensor(dy))
        got = tcc.grad(op)(*args, dy, **cparams)
        np.testing.assert_allclose(got, leaf.grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=op.name)


SCANS = """
op cumsum(X: f64[B, L]) -> Y: f64[B, L] {
    Y[b, i] = sum[j: i + 1](X[b, j])
}
op exclusive(X: f64[L]) -> Y: f64[L] {
    Y[i] = X[i] * sum[j: i](exp(X[j]))
}
op ahead(W: f64[L], X: f64[L + 2]) -> Y: f64[L] {
    Y[i] = W[i] * sum[j: i + 3](sin(X[j]))
}
op cumprod(X: f64[L]) -> Y: f64[L] {
    Y[i] = prod[j: i + 1](X[j])
}
op linear_recurrence(A: f64[T, D], X: f64[T, D]) -> H: f64[T, D] {
    H[t, d] = select(t == 0, X[t, d], A[t, d] * H[t - 1, d] + X[t, d])
}
op rnn(W: f64[D], X: f64[T, D]) -> H: f64[T, D] {
    H[t, d] = select(t < 2, tanh(X[t, d]), tanh(W[d] * H[t - 1, d] + X[t, d] * H[t - 2, d]))
}
op nested(X: f64[L, 4], W: f64[D]) -> Y: f64[L, D] {
    Y[i, d] = sum[k: i + 1](exp(max[m: 4](X[k, m])) * W[d])
}
op periodic(X: f64[K], Z: f64[N]) -> H: f64[N] {
    H[i] = select(i < 2, Z[i], 0.5 * H[i - 2] * X[i % K] + Z[i])
}
op smoothed(X: f64[T], a: f64[1]) -> Y: f64[T] {
    S: f64[T]
    S[t] = select(t == 0, X[t], a[0] * S[t - 1] + (1.0 - a[0]) * X[t])
    Y[t] = S[t] * S[t]
}
"""


def _normal_args(op, bindings: dict, rng) -> list:
    from tcc.testing import specialize_inputs

    shapes = specialize_inputs(op.te, {**op.te.cparams, **bindings})
    return [rng.standard_normal(shapes[p]) for p in op.te.params]


@pytest.mark.parametrize("name,bindings", [
    ("cumsum", dict(B=3, L=7)), ("cumsum", dict(B=1, L=1)), ("cumsum", dict(B=2, L=33)),
    ("exclusive", dict(L=1)), ("exclusive", dict(L=7)), ("ahead", dict(L=1)), ("ahead", dict(L=33)),
    ("cumprod", dict(L=7)), ("linear_recurrence", dict(T=1, D=3)), ("linear_recurrence", dict(T=33, D=7)),
    ("rnn", dict(T=7, D=3)), ("rnn", dict(T=1, D=1)), ("smoothed", dict(T=33)),
    ("nested", dict(L=7, D=3)),  # the inner max hoisted over k, whose extent i + 1 names i (fuzz 88)
    ("periodic", dict(K=3, N=8)),  # X[i % K] splits i = K*q + t: H[i - 2] under min(K*q + t, N - 1) >= 2 (fuzz 126)
])
def test_scans_and_recurrences_match_finite_differences(rng, name, bindings):
    """First and second order (the second differentiates the first's reversed scan or recurrence)."""
    op = tcc.compile(SCANS)[name]
    _fd(op, _normal_args(op, bindings, rng), bindings)


@pytest.mark.parametrize("name,bindings", [("cumsum", dict(B=2, L=33)), ("exclusive", dict(L=7)),
                                           ("ahead", dict(L=7)), ("linear_recurrence", dict(T=33, D=3))])
def test_gradients_of_scans_are_linear(name, bindings):
    """Every reduction of the gradient op whose extent moves is a prefix that the scan rewrite turns
    into a recurrence (no triangular loop is left), and the recurrences run backwards via a reversed axis."""
    grad = tcc.grad(tcc.compile(SCANS)[name])
    te = grad.lowered({**grad.te.cparams, **bindings}).te
    for c in te.computes:
        for r in (n for n in walk(c.body) if isinstance(n, Reduce)):
            assert not any(free_vars(ax.extent) for ax in r.axes), format_op(te)
    assert any(c.sequential for c in te.computes)


def test_scans_match_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    lib = tcc.compile(SCANS.replace("f64", "f32"))
    X, A = rng.standard_normal((33, 7)).astype(np.float32), rng.uniform(-1, 1, (33, 7)).astype(np.float32)
    x = torch.tensor(X, requires_grad=True)
    y = torch.cumsum(x, 1)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(torch.tensor(dy))
    np.testing.assert_allclose(tcc.grad(lib.cumsum)(X, dy), x.grad.numpy(), rtol=1e-5, atol=1e-5)
    a, x = torch.tensor(A, requires_grad=True), torch.tensor(X, requires_grad=True)
    h, hs = x[0], [x[0]]
    for t in range(1, 33):
        h = a[t] * h + x[t]
        hs.append(h)
    torch.stack(hs).backward(torch.tensor(dy))
    da, dx = tcc.grad(lib.linear_recurrence)(A, X, dy)
    np.testing.assert_allclose(da, a.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-4, atol=1e-4)


TRAIN = """
op embed(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {
    Y[n, d] = E[idx[n], d]
}
op xent(X: f32[N, C], lab: i64[N]) -> L: f32[N] {
    m[n] = max[c](X[n, c])
    L[n] = log(sum[c](exp(X[n, c] - m[n]))) + m[n] - X[n, lab[n]]
}
op decay(a: f32[D], X: f32[T, D]) -> H: f32[T, D] {
    H[t, d] = select(t == 0, X[t, d], a[d] * H[t - 1, d] + X[t, d])
}
"""


def test_embedding_and_label_pick_train_like_torch(rng):
    """A few SGD steps of embedding -> linear -> cross-entropy (a label pick), tcc ops through
    tcc.torch against torch's own embedding and cross_entropy: the same losses."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    ops = tcc.torch.library(TRAIN, namespace="grad_data_train")
    idx, lab = torch.tensor(_ints(rng, 11, 33)), torch.tensor(_ints(rng, 5, 33))
    E0, W0 = rng.standard_normal((11, 7)).astype(np.float32), rng.standard_normal((7, 5)).astype(np.float32)
    losses = []
    for use_tcc in (True, False):
        E, W = torch.tensor(E0, requires_grad=True), torch.tensor(W0, requires_grad=True)
        run = []
        for _ in range(4):
            if use_tcc:
                loss = ops.xent(ops.embed(E, idx) @ W, lab).mean()
            else:
                loss = F.cross_entropy(F.embedding(idx, E) @ W, lab)
            E.grad = W.grad = None
            loss.backward()
            with torch.no_grad():
                E -= 0.5 * E.grad
                W -= 0.5 * W.grad
            run.append(float(loss.detach()))
        losses.append(run)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert losses[0][-1] < losses[0][0]


def test_linear_recurrence_trains_like_torch(rng):
    torch = pytest.importorskip("torch")
    ops = tcc.torch.library(TRAIN, namespace="grad_data_train_rec")
    X = torch.tensor(rng.standard_normal((33, 7)).astype(np.float32))
    target = torch.tensor(rng.standard_normal((33, 7)).astype(np.float32))
    a0 = rng.uniform(-0.5, 0.5, 7).astype(np.float32)

    def torch_decay(a, x):
        h, hs = x[0], [x[0]]
        for t in range(1, x.shape[0]):
            h = a * h + x[t]
            hs.append(h)
        return torch.stack(hs)

    losses = []
    for fn in (ops.decay, torch_decay):
        a = torch.tensor(a0, requires_grad=True)
        run = []
        for _ in range(4):
            loss = ((fn(a, X) - target) ** 2).mean()
            a.grad = None
            loss.backward()
            with torch.no_grad():
                a -= 0.05 * a.grad
            run.append(float(loss.detach()))
        losses.append(run)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert losses[0][-1] < losses[0][0]


RANDOM = """
op dropout(X: f64[N, D], p: f64, seed: i64) -> Y: f64[N, D] {
    Y[n, d] = select(rand(seed, n, d) < p, 0.0, X[n, d] / (1.0 - p))
}
op noisy(X: f64[N]) -> Y: f64[N] {
    Y[n] = X[n] * X[n] + 0.1 * f64(randn(7, n))
}
"""


@pytest.mark.parametrize("n,d", [(1, 1), (7, 33), (33, 7)])
def test_random_numbers_are_constants(rng, n, d):
    """dropout's gradient drops the same elements (the same ``rand`` values) and scales the rest;
    ``randn`` added to a value adds nothing to its gradient."""
    lib = tcc.compile(RANDOM)
    X, dY = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    kept = lib.dropout(np.ones((n, d)), 0.3, 1234) != 0
    got = run_poisoned(tcc.grad(lib.dropout), [X, 0.3, 1234, dY], {"N": n, "D": d}, {})[0]
    np.testing.assert_array_equal(got, np.where(kept, dY / 0.7, 0.0))
    assert n * d < 30 or 0.5 < kept.mean() < 0.9
    _fd(lib.dropout, [X, 0.3, 1234], {"N": n, "D": d})
    _fd(lib.noisy, [X[:, 0]], {"N": n})


GENERIC = """
op rmsnorm[T: float](X: T[N, D], g: T[D]) -> Y: T[N, D] {
    r[n] = rsqrt(sum[d](f32(X[n, d]) * f32(X[n, d])) / D + 1e-6)
    Y[n, d] = T(f32(X[n, d]) * r[n] * f32(g[d]))
}
op gated[T: float](X: T[N], g: T[N]) -> Y: T[N] {
    Y[n] = X[n] * sigmoid(g[n]) * T(2.0)
}
"""


def test_dtype_parameters_differentiate_per_binding(rng):
    """tcc.grad of a generic op is generic: each binding (read from the arguments) derives its own
    gradient op, in its dtype; f32 against PyTorch, f16 against f32."""
    torch = pytest.importorskip("torch")
    op = tcc.compile(GENERIC).rmsnorm
    grad = tcc.grad(op)
    X, g = rng.standard_normal((7, 33)).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    dY = rng.standard_normal((7, 33)).astype(np.float32)
    x, w = torch.tensor(X, requires_grad=True), torch.tensor(g, requires_grad=True)
    (x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * w).backward(torch.tensor(dY))
    dX, dg = grad(X, g, dY)
    assert dX.dtype == np.float32
    np.testing.assert_allclose(dX, x.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dg, w.grad.numpy(), rtol=1e-4, atol=1e-4)
    half = grad(X.astype(np.float16), g.astype(np.float16), dY.astype(np.float16))
    assert half[0].dtype == np.float16 and grad.bound(T="f16").te.tensors["dX"].dtype.name == "f16"
    np.testing.assert_allclose(half[0].astype(np.float32), dX, rtol=2e-2, atol=2e-2 * np.abs(dX).max())
    gated = tcc.compile(GENERIC).gated.bound(T="f64")  # (rmsnorm computes in f32: too coarse for differences)
    _fd(gated, [X[0].astype(np.float64), g.astype(np.float64)], {"N": 33})


def test_inlining_does_not_capture_a_consumer_variable(rng):
    """An intermediate with a reduction over ``j``, inlined where it is read at ``s[.., j]`` with the
    consumer's own ``j``: the reduction is renamed before the substitution (grad fuzz seed 158, a
    recurrence's reversed adjoint: the fused statement compared the sum's ``j`` instead)."""
    source = """
op f(D: f64[N, 4], T: f64[N, 2]) -> R: f64[N, 2] {
    s: f64[N, 2]
    s[a, b] = sum[i: N, j: 4](select(j == b, D[i, j] * T[a, 0], 0.0))
    R[r, j] = s[N - 1 - r, j] + 1.0
}
"""
    op = tcc.compile(source).f
    D, T = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    got = run_poisoned(op, [D, T], {"N": 5}, {})[0]
    want = (D[:, :2].sum(0)[None, :] * T[::-1, :1]) + 1.0
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("name,shapes", [("embedding", [(7, 3)]), ("linear_recurrence", [(5, 2), (5, 2)])])
def test_gradgradcheck_through_torch(rng, name, shapes):
    """PyTorch's gradcheck and gradgradcheck of the ops registered through tcc.torch (the double
    backward derives the gradient of the scatter-add, the reversed scan, the reversed recurrence)."""
    torch = pytest.importorskip("torch")
    lib = tcc.compile(GATHERS + SCANS)
    fn = tcc.torch.op(lib[name], namespace="grad_data_gg", name=name)
    xs = tuple(torch.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes)
    extra = (torch.tensor(_ints(rng, 7, 11)),) if name == "embedding" else ()

    def call(*t):
        return fn(*t, *extra)

    assert torch.autograd.gradcheck(call, xs)
    assert torch.autograd.gradgradcheck(call, xs)


def test_an_addition_into_the_first_tensor_of_a_fusion_group(rng):
    """``T`` shares a loop with ``U`` (a fusion group starting at ``T``), and later ``+=`` statements
    add into ``T``: lowering took such a ``+=`` for the group's start again (grad fuzz seed 295, a
    gradient op's copy of a tensor added into)."""
    source = """
op f(X: f64[N], W: f64[1]) -> T: f64[N] {
    T[i] = sqrt(abs(X[i])) + 1.0
    U: f64[N]
    U[i] = X[i] * X[i] + X[(i + 1) % N] + X[(i + 2) % N]
    S: f64[1]
    S[z] = sum[k: 1](W[k] * 2.0)
    T[v] += U[v] / (abs(S[0]) + 1.0)
    Z: f64[N]
    Z[i] = T[i] * U[i]
    T[v] += Z[v]
}
"""
    op = tcc.compile(source).f
    X, W = rng.standard_normal(7), rng.standard_normal(1)
    assert "group [T, U]" in op.lower(X, W, stage="fused")
    got = run_poisoned(op, [X, W], {"N": 7}, {})[0]
    U = X * X + np.roll(X, -1) + np.roll(X, -2)
    T = np.sqrt(np.abs(X)) + 1.0 + U / (abs(2 * W[0]) + 1.0)
    np.testing.assert_allclose(got, T + T * U, rtol=1e-12)
