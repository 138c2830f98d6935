"""``tcc.torch``: tcc ops as PyTorch operators, in eager mode, under torch.compile (no graph
break) and autograd (gradcheck in float64, derived backward ops), with no copies in or out."""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tcc

torch = pytest.importorskip("torch")
F = torch.nn.functional
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

OPS = """
op axpy2(a: f64, X: f64[N], Y: f64[N]) -> (Z: f64[N], W: f64[N]) {
    Z[i] = a * X[i] + Y[i]
    W[i] = tanh(X[i]) * Y[i]
}
op shifted(X: f64[N]) -> Y: f64[N] {
    Y[i] = X[i * i % N]
}
"""


@pytest.fixture(scope="module")
def ops64():
    """The examples in float64, as torch operators (registered once per test session)."""
    text = "".join((EXAMPLES / f"{n}.tc").read_text() for n in ("conv2d", "softmax", "layernorm", "maxpool2d",
                                                                "matmul"))
    return tcc.torch.library(text.replace("f32", "f64") + OPS, namespace="tcc_test64")


def test_import_tcc_does_not_import_torch():
    code = "import sys, tcc; assert 'torch' not in sys.modules; tcc.torch; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


def test_eager_forward_matches_torch(rng):
    ops = tcc.torch.library(EXAMPLES / "conv2d.tc", namespace="tcc_test_eager")
    x = torch.randn(2, 3, 11, 7)
    w = torch.randn(5, 3, 3, 2)
    b = torch.randn(5)
    for s, p, d in [(1, 0, 1), (2, 1, 1), (1, 2, 2)]:
        got = ops.conv2d(x, w, b, S=s, P=p, D=d)
        torch.testing.assert_close(got, F.conv2d(x, w, b, stride=s, padding=p, dilation=d), rtol=1e-4, atol=1e-4)
    assert torch.ops.tcc_test_eager.conv2d(x, w, b).shape == (2, 5, 9, 6)


def test_several_results_and_scalars(ops64):
    x, y = torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    z, w = ops64.axpy2(0.5, x, y)
    torch.testing.assert_close(z, 0.5 * x + y)
    torch.testing.assert_close(w, torch.tanh(x) * y)


@pytest.mark.parametrize("name,shapes,cparams", [
    ("conv2d", [(2, 3, 7, 6), (4, 3, 3, 2), (4,)], dict(S=2, P=1)),
    ("conv2d", [(1, 2, 6, 7), (3, 2, 2, 3), (3,)], dict(D=2, P=2)),
    ("softmax", [(3, 7)], {}), ("layernorm", [(3, 7), (7,), (7,)], {}),
    ("maxpool2d", [(1, 2, 7, 5)], dict(K=3, S=2)), ("matmul", [(5, 3), (3, 7)], {}),
    ("axpy2", [(), (9,), (9,)], {}),
])
def test_gradcheck_float64(ops64, name, shapes, cparams):
    args = [torch.randn(s, dtype=torch.float64, requires_grad=True) if s else 0.7 for s in shapes]
    fn = getattr(ops64, name)
    assert torch.autograd.gradcheck(lambda *a: fn(*a, **cparams), tuple(args))


@pytest.mark.parametrize("name,shapes,cparams", [
    ("conv2d", [(1, 2, 5, 6), (3, 2, 3, 2), (3,)], dict(S=2, P=1)), ("conv2d", [(2, 1, 5, 5), (2, 1, 3, 3), (2,)], {}),
    ("softmax", [(3, 7)], {}), ("layernorm", [(3, 7), (7,), (7,)], {}), ("matmul", [(5, 3), (3, 7)], {}),
])
def test_gradgradcheck_float64(ops64, name, shapes, cparams):
    """Double backward: the gradient ops are operators with a backward of their own, derived on
    first use (a strided conv's data gradient reads dY through ``u // S``: a guarded gather)."""
    args = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    fn = getattr(ops64, name)
    assert torch.autograd.gradgradcheck(lambda *a: fn(*a, **cparams), tuple(args))


def test_backward_runs_only_the_gradients_asked_for(ops64):
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64)
    ops64.conv2d(x, w, b, P=1).square().sum().backward()
    xr, wr = x.clone(), w.detach().clone().requires_grad_()
    F.conv2d(xr, wr, b, padding=1).square().sum().backward()
    torch.testing.assert_close(w.grad, wr.grad)
    assert x.grad is None and b.grad is None


def test_no_graph_without_grad(ops64):
    """Calls that record no graph (no input needs a gradient, or grad mode is off) skip autograd;
    the same inputs, once one needs a gradient, record it."""
    a = torch.randn(4, 3, dtype=torch.float64)
    b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert not ops64.matmul(a, b.detach()).requires_grad
    with torch.no_grad():
        c = ops64.matmul(a, b)
    assert not c.requires_grad and c.grad_fn is None
    c = ops64.matmul(a, b)
    assert c.requires_grad and c.grad_fn is not None
    c.sum().backward()
    torch.testing.assert_close(b.grad, a.sum(0)[:, None].expand(3, 5))


def test_backward_through_a_non_affine_read(ops64):
    """``X[i * i % N]``: the backward is the scatter-add of the upstream gradient (a masked gather)."""
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    y = ops64.shifted(x)
    torch.testing.assert_close(y, x.detach()[(torch.arange(7) ** 2) % 7])
    dy = torch.randn(7, dtype=torch.float64)
    y.backward(dy)
    torch.testing.assert_close(x.grad, torch.zeros(7, dtype=torch.float64).index_add(0, (torch.arange(7) ** 2) % 7, dy))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(ops64, backend):
    """No graph break (fullgraph=True raises on one); forward and backward as in eager mode."""
    torch._dynamo.reset()

    def model(x, w, b, g, beta):
        y = torch.relu(ops64.conv2d(x, w, b, P=1))
        z = ops64.layernorm(y.flatten(1), g, beta)
        return ops64.softmax(z).square().sum()

    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    b, g, beta = (torch.randn(n, dtype=torch.float64, requires_grad=True) for n in (3, 75, 75))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    loss = compiled(x, w, b, g, beta)
    grads = torch.autograd.grad(loss, (w, b, g, beta))
    eager = model(x, w, b, g, beta)
    torch.testing.assert_close(loss, eager)
    for got, want in zip(grads, torch.autograd.grad(eager, (w, b, g, beta))):
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # a graph without autograd: the ops' no-graph path, traced
        torch.testing.assert_close(compiled(x, w, b, g, beta), eager)


def test_cpu_tensors_are_not_copied(ops64, monkeypatch):
    """The kernel reads the inputs' memory and writes the result that PyTorch allocated and returns."""
    from tcc.runtime import cpu

    seen = {}
    real = cpu.CpuKernel.__call__

    def spy(kernel, values):
        seen.update({k: v.ctypes.data for k, v in values.items() if isinstance(v, np.ndarray)})
        return real(kernel, values)

    monkeypatch.setattr(cpu.CpuKernel, "__call__", spy)
    # shapes no other test uses: the spy sees the checked first call, not the fast path of a repeat
    a = torch.randn(13, 3, dtype=torch.float64)
    b = torch.randn(3, 17, dtype=torch.float64)
    c = ops64.matmul(a, b)
    assert seen == {"A": a.data_ptr(), "B": b.data_ptr(), "C": c.data_ptr()}
    torch.testing.assert_close(c, a @ b)


def test_strided_inputs(ops64):
    """A strided input is read through a contiguous copy (tcc's rule); the result is still fresh."""
    a = torch.randn(3, 5, dtype=torch.float64).t()
    b = torch.randn(3, 7, dtype=torch.float64)
    torch.testing.assert_close(ops64.matmul(a, b), a @ b)


@pytest.mark.cuda
def test_cuda_in_place_on_the_current_stream():
    if not torch.cuda.is_available() or not tcc.cuda.is_available():
        pytest.skip("no CUDA GPU")
    ops = tcc.torch.library(EXAMPLES / "conv2d.tc", namespace="tcc_test_cuda")
    x = torch.randn(2, 3, 17, 13, device="cuda", requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(4, device="cuda", requires_grad=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = ops.conv2d(x, w, b, S=2, P=1)
        y.square().sum().backward()
    stream.synchronize()
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    yr = F.conv2d(xr, wr, br, stride=2, padding=1)
    yr.square().sum().backward()
    torch.testing.assert_close(y, yr, rtol=1e-4, atol=1e-4)
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_bad_arguments_are_tcc_errors(ops64):
    with pytest.raises(tcc.TccError, match="must be f64"):
        ops64.matmul(torch.randn(3, 4), torch.randn(4, 5))
    with pytest.raises(tcc.TccError, match="cannot read"):
        ops64.matmul(torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(4, 5, dtype=torch.float64))
    with pytest.raises(tcc.TccError, match="takes 2 argument"):
        ops64.matmul(torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(tcc.TccError, match="symbol K"):
        ops64.matmul(torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64))


def test_expanded_and_sliced_upstream_gradients(ops64):
    """Autograd's upstream gradients may be broadcast (stride 0) or partly zero: both are read right."""
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    ops64.matmul(a, b).sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(3, 5, dtype=torch.float64) @ b.detach().T)
    a.grad = None
    ops64.matmul(a, b)[:, 1:3].sum().backward()
    mask = torch.zeros(3, 5, dtype=torch.float64)
    mask[:, 1:3] = 1
    torch.testing.assert_close(a.grad, mask @ b.detach().T)


def test_eager_calls_go_straight_to_the_kernel_unless_something_watches_the_dispatcher(rng):
    """A plain CPU call skips torch's dispatcher (its cost is the call overhead,
    benchmarks/torch_overhead.py), also when it records a graph; a dispatch mode, vmap, the
    profiler and tensor subclasses still go through it, with the same values."""
    from dispatch_seen import Seen

    ops = tcc.torch.library(EXAMPLES / "matmul.tc", namespace="tcc_test_fast")
    matmul = ops.matmul
    dispatched = []
    real = matmul.overload
    matmul.overload = lambda *a, **k: (dispatched.append(1), real(*a, **k))[1]
    a, b = torch.randn(5, 3), torch.randn(3, 7)
    torch.testing.assert_close(matmul(a, b), a @ b)
    assert not dispatched

    with Seen() as mode:
        torch.testing.assert_close(matmul(a, b), a @ b)
    assert "tcc_test_fast.matmul.default" in mode.ops
    batched_a, batched_b = torch.randn(4, 5, 3), torch.randn(4, 3, 7)
    with warnings.catch_warnings():  # torch's warning that a custom op has no batching rule
        warnings.simplefilter("ignore")
        torch.testing.assert_close(torch.vmap(matmul)(batched_a, batched_b), batched_a @ batched_b)
    with torch.profiler.profile() as prof:
        matmul(a, b)
    assert any("tcc_test_fast" in e.key for e in prof.key_averages())
    assert len(dispatched) == 3
    y = matmul(a.requires_grad_(), b)  # a graph, recorded by the eager path's autograd.Function
    assert y.grad_fn is not None and len(dispatched) == 3
    y.sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(5, 7) @ b.T)
    with torch.no_grad():  # a parameter under no_grad: plain, no graph, no dispatch
        w = torch.nn.Parameter(torch.randn(3, 7))
        for _ in range(2):
            torch.testing.assert_close(matmul(a, w), a.detach() @ w.detach())
    assert len(dispatched) == 3


def test_eager_repeat_calls_recheck_what_may_change(ops64):
    """The eager path's repeat call (one per signature: shapes and parameters) still checks each
    input's dtype and layout: a strided input, another dtype and other parameters take the full
    path, with the right answer or a TccError."""
    a, b = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    for _ in range(2):
        torch.testing.assert_close(ops64.matmul(a, b), a @ b)
    strided = torch.randn(4, 6, dtype=torch.float64).t()
    torch.testing.assert_close(ops64.matmul(strided, b), strided @ b)
    with pytest.raises(tcc.TccError, match="must be f64"):
        ops64.matmul(a.float(), b)
    x, w, bias = (torch.randn(s, dtype=torch.float64) for s in ((1, 2, 9, 9), (3, 2, 3, 3), (3,)))
    for s in (1, 2, 1, 2):
        torch.testing.assert_close(ops64.conv2d(x, w, bias, S=s, P=1), F.conv2d(x, w, bias, stride=s, padding=1))
    z, y = ops64.axpy2(0.25, a[0], a[1])  # runtime scalars and two results
    torch.testing.assert_close(z, 0.25 * a[0] + a[1])
    torch.testing.assert_close(y, torch.tanh(a[0]) * a[1])


def test_eager_repeat_calls_with_scalars_and_integer_results(ops64):
    """The repeat call sets runtime scalars per call (a changed value is used, a value of another
    type takes the checked path); integer results of a call that records a graph are not
    differentiable, the float ones are."""
    x, y = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    for a in (0.5, -1.25, 3, 2.0):
        z, _ = ops64.axpy2(a, x, y)
        torch.testing.assert_close(z, a * x + y)
    ops = tcc.torch.library("op sign2(X: f64[N]) -> (Y: f64[N], K: i64[N]) {\n"
                            "    Y[i] = X[i] * X[i]\n    K[i] = i64(X[i] > 0.0)\n}\n", namespace="tcc_test_ints")
    x = torch.randn(33, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        y, k = ops.sign2(x)
        assert y.requires_grad and not k.requires_grad and k.dtype == torch.int64
        torch.testing.assert_close(k, (x.detach() > 0).long())
        (g,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g, 2 * x.detach())


def test_eager_results_are_fresh_and_keep_their_dtype(ops64):
    """Each repeat call allocates its own results, in the op's dtype whatever torch's default."""
    ops = tcc.torch.library(EXAMPLES / "softmax.tc", namespace="tcc_test_fresh")
    x = torch.randn(5, 33)
    first, second = ops.softmax(x), ops.softmax(x)
    assert first.data_ptr() != second.data_ptr()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        third = ops.softmax(x)
    finally:
        torch.set_default_dtype(before)
    assert third.dtype == torch.float32
    for y in (first, second, third):
        torch.testing.assert_close(y, torch.softmax(x, 1))


def test_gradient_of_a_scalar_is_a_one_element_tensor():
    """A runtime scalar is a Python number (autograd cannot track one): a tensor given for it is a
    TccError saying so; a one-element tensor parameter read at [0] has its gradient derived."""
    ops = tcc.torch.library("op axpy_s(a: f64, X: f64[N]) -> Z: f64[N] {\n    Z[i] = a * X[i]\n}\n"
                            "op axpy_t(a: f64[1], X: f64[N], Y: f64[N]) -> Z: f64[N] {\n"
                            "    Z[i] = a[0] * X[i] + Y[i]\n}\n", namespace="tcc_test_scalar_grad")
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    with pytest.raises(tcc.TccError, match=r"(?s)runtime scalar.*f64\[1\]"):
        ops.axpy_s(torch.tensor(0.5, dtype=torch.float64, requires_grad=True), x)
    a = torch.randn(1, dtype=torch.float64, requires_grad=True)
    y = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ops.axpy_t, (a, x, y))
    ops.axpy_t(a, x, y).square().sum().backward()
    torch.testing.assert_close(a.grad, (2 * (a.detach() * x.detach() + y.detach()) * x.detach()).sum().reshape(1))
