"""Eager ``tcc.torch`` calls that record an autograd graph, on both eager paths: the C++ one (a
repeat signature: the kernel, then the graph node of ``tcc/interop/torch_autograd.cpp``, whose
backward calls ``TorchOp._native_backward``) and the Python one (``_Graph``, an
``autograd.Function``). Each checks values and gradients against PyTorch on fresh random inputs at
odd sizes, and which path recorded the graph (the C++ module's count of graphs it recorded)."""

import gc
import threading
import weakref
from itertools import count

import pytest

import tcc

torch = pytest.importorskip("torch")
from torch_paths import eager_path  # noqa: E402, F401  (the fixture "path")

from tcc.interop import torch as torch_interop  # noqa: E402  (imports torch: after the skip)
from tcc.interop import torch_native  # noqa: E402

OPS = """
op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j])
}
op axpy(a: f64, X: f64[N], Y: f64[N]) -> (Z: f64[N], S: i64[N]) {
    Z[i] = a * X[i] * Y[i] + Y[i]
    S[i] = i64(X[i] > 0.0)
}
op two(X: f64[N], Y: f64[N]) -> (P: f64[N], Q: f64[N]) {
    P[i] = X[i] * X[i] * Y[i]
    Q[i] = tanh(X[i]) + Y[i]
}
op decay(X: f64[N]) -> H: f64[N] {
    H[t] = select(t == 0, X[t], sum[k: 1](0.5 * H[t - 1]) + X[t])
}
"""
_NAMESPACES = count()
SIZES = [(1, 1, 1), (7, 33, 5), (33, 7, 1)]


def fresh_ops(path: str):
    return tcc.torch.library(OPS, namespace=f"tcc_test_graph_{path}_{next(_NAMESPACES)}")


def recorded() -> int:
    """How many graphs the C++ eager path has recorded in this process (0 before it loaded)."""
    module = torch_native._state.get("module")
    return module.recorded() if module is not None else 0


def expect_recorded(path: str, before: int, calls: int) -> None:
    assert recorded() - before == (calls if path == "native" else 0)


@pytest.mark.parametrize("m,k,n", SIZES)
def test_gradients_match_torch(path, m, k, n):
    ops = fresh_ops(path)
    ops.matmul(torch.randn(m, k, requires_grad=True), torch.randn(k, n))  # learns the signature
    before = recorded()
    for _ in range(3):
        a, b = torch.randn(m, k, requires_grad=True), torch.randn(k, n, requires_grad=True)
        up = torch.randn(m, n)
        y = ops.matmul(a, b)
        assert y.requires_grad and not y.is_leaf
        y.backward(up)
        ar, br = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        yr = ar @ br
        yr.backward(up)
        torch.testing.assert_close(y, yr, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.grad, ar.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.grad, br.grad, rtol=1e-4, atol=1e-4)
    expect_recorded(path, before, 3)


def test_both_paths_agree():
    """The C++ node's gradients are the Python path's, bit for bit (the same gradient ops)."""
    if torch_native.load() is None:
        pytest.skip(f"the C++ eager path cannot be built here: {torch_native.status()}")
    ops = fresh_ops("native")
    x, y = torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    grads = []
    for native in (True, False):
        xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
        ops.two(xs, ys)  # the first call of a signature is the Python path's
        before = recorded()
        p, q = ops.two(xs, ys) if native else torch_interop._record(ops.two, {}, xs, ys)
        assert recorded() - before == (1 if native else 0)
        (p * 3 + q).sum().backward()
        grads.append((xs.grad, ys.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_gradcheck_and_gradgradcheck_float64(path):
    """Through the node, its backward's gradient ops (recording the double backward's graph with
    create_graph=True) and theirs; a runtime scalar and an integer result."""
    ops = fresh_ops(path)
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    y = torch.randn(7, dtype=torch.float64, requires_grad=True)
    z, s = ops.axpy(0.5, x, y)
    assert not s.requires_grad and s.dtype == torch.int64
    before = recorded()
    assert torch.autograd.gradcheck(lambda x, y: ops.axpy(0.5, x, y), (x, y))
    assert torch.autograd.gradgradcheck(lambda x, y: ops.axpy(-1.5, x, y)[0], (x, y))
    assert torch.autograd.gradgradcheck(ops.two, (x, y))
    if path == "native":
        assert recorded() > before
    else:
        expect_recorded(path, before, 0)


def test_only_the_gradients_asked_for(path, monkeypatch):
    """torch.autograd.grad with respect to one input runs only that input's gradient op on the C++
    node (which asks the backward pass); the Python path's autograd.Function asks which inputs
    require a gradient (ctx.needs_input_grad), so it runs both there."""
    ops = fresh_ops(path)
    a, b = torch.randn(7, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    ops.matmul(a, b).sum().backward()  # derives the gradient ops
    top = ops.matmul
    ran = []
    for name in ("A", "B"):
        grad_op = top.grads[name]
        monkeypatch.setitem(top.grads, name,
                            lambda *args, _op=grad_op, _name=name: ran.append(_name) or _op(*args))
    before = recorded()
    (ga,) = torch.autograd.grad(top(a, b).sum(), [a])
    assert ran == (["A"] if path == "native" else ["A", "B"])
    torch.testing.assert_close(ga, torch.ones(7, 3) @ b.detach().T)
    a.grad = b.grad = None
    ran.clear()
    top(a.detach(), b).sum().backward()
    assert ran == ["B"] and a.grad is None
    torch.testing.assert_close(b.grad, a.detach().T @ torch.ones(7, 3))
    expect_recorded(path, before, 2)


def test_unused_and_strided_upstream_gradients(path):
    """A result that the loss does not use (no upstream gradient: zeros), an integer result, and
    broadcast (stride 0) or sliced upstream gradients."""
    ops = fresh_ops(path)
    x = torch.randn(33, dtype=torch.float64, requires_grad=True)
    y = torch.randn(33, dtype=torch.float64, requires_grad=True)
    ops.two(x, y)
    ops.axpy(2.0, x, y)
    before = recorded()
    p, _ = ops.two(x, y)
    p.sum().backward()  # Q unused; P's gradient broadcast
    xd, yd = x.detach(), y.detach()
    torch.testing.assert_close(x.grad, 2 * xd * yd)
    torch.testing.assert_close(y.grad, xd * xd)
    x.grad = y.grad = None
    z, s = ops.axpy(2.0, x, y)
    z[1::3].sum().backward()
    mask = torch.zeros(33, dtype=torch.float64)
    mask[1::3] = 1
    torch.testing.assert_close(x.grad, mask * 2 * yd)
    torch.testing.assert_close(y.grad, mask * (2 * xd + 1))
    expect_recorded(path, before, 2)


def test_retain_graph_and_a_second_backward(path):
    ops = fresh_ops(path)
    a, b = torch.randn(7, 5, requires_grad=True), torch.randn(5, 3)
    ops.matmul(a, b)
    y = ops.matmul(a, b).sum()
    y.backward(retain_graph=True)
    y.backward()
    torch.testing.assert_close(a.grad, 2 * torch.ones(7, 3) @ b.T)
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_saved_inputs_are_checked_for_changes_in_place(path):
    ops = fresh_ops(path)
    a, b = torch.randn(7, 5, requires_grad=True), torch.randn(5, 3)
    ops.matmul(a, b)
    y = ops.matmul(a, b)
    b.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_saved_tensor_hooks_see_the_saved_inputs(path):
    """Both paths save the tensor arguments as autograd.Function.save_for_backward does."""
    ops = fresh_ops(path)
    a, b = torch.randn(7, 5, requires_grad=True), torch.randn(5, 3)
    ops.matmul(a, b)
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t

    def unpack(t):
        unpacked.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = ops.matmul(a, b)
    y.sum().backward()
    assert packed == [(7, 5), (5, 3)] and sorted(unpacked) == sorted(packed)
    torch.testing.assert_close(a.grad, torch.ones(7, 3) @ b.T)


def test_no_reference_cycles(path):
    """The graph frees with its last result, by reference counts alone (the collector off): the
    results, the node and the inputs it saved."""
    ops = fresh_ops(path)
    w = torch.randn(5, 3)
    ops.matmul(torch.randn(7, 5, requires_grad=True), w)
    gc.collect()
    gc.disable()
    try:
        x = torch.randn(7, 5, requires_grad=True)
        h = x * 2  # a saved input with a graph of its own
        before = recorded()
        y = ops.matmul(h, w)
        expect_recorded(path, before, 1)
        refs = [weakref.ref(t) for t in (h, y)]
        del h, y
        assert all(r() is None for r in refs)
        y = ops.matmul(x * 2, w)
        y.sum().backward()
        ref = weakref.ref(y)
        del y
        assert ref() is None
    finally:
        gc.enable()


def test_backward_errors_reach_the_caller(path):
    """An op whose gradient cannot be derived runs forward; its backward raises the TccError."""
    ops = fresh_ops(path)
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    ops.decay(x)
    before = recorded()
    y = ops.decay(x)
    expect_recorded(path, before, 1)
    want = x.detach().clone()
    for t in range(1, 7):
        want[t] += 0.5 * want[t - 1]
    torch.testing.assert_close(y, want)
    with pytest.raises(tcc.TccError, match="recurrence"):  # one that reads itself inside a reduction: refused
        y.sum().backward()


def test_threads_record_and_run_backward(path):
    ops = fresh_ops(path)
    w = torch.randn(33, 7, requires_grad=True)
    ops.matmul(torch.randn(5, 33), w)
    errors, inputs = [], []

    def work():
        try:
            for _ in range(20):
                a = torch.randn(5, 33, requires_grad=True)
                inputs.append(a)
                ops.matmul(a, w).sum().backward()
                torch.testing.assert_close(a.grad, torch.ones(5, 7) @ w.detach().T, rtol=1e-4, atol=1e-4)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expected = sum(a.detach().T @ torch.ones(5, 7) for a in inputs)
    torch.testing.assert_close(w.grad, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs(path):
    """On CUDA tensors: the node's gradients match PyTorch's, also after a double backward."""
    ops = fresh_ops(path)
    dev = "cuda"
    ops.matmul(torch.randn(7, 33, device=dev, requires_grad=True), torch.randn(33, 5, device=dev))
    before = recorded()
    for _ in range(2):
        a = torch.randn(7, 33, device=dev, requires_grad=True)
        b = torch.randn(33, 5, device=dev, requires_grad=True)
        up = torch.randn(7, 5, device=dev)
        ops.matmul(a, b).backward(up)
        torch.testing.assert_close(a.grad, up @ b.detach().T, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.grad, a.detach().T @ up, rtol=1e-4, atol=1e-4)
    expect_recorded(path, before, 2)
    x = torch.randn(33, dtype=torch.float64, device=dev, requires_grad=True)
    y = torch.randn(33, dtype=torch.float64, device=dev, requires_grad=True)
    ops.two(x, y)
    assert torch.autograd.gradgradcheck(ops.two, (x, y))


def test_compiled_autograd(path):
    """Compiled autograd calls the node's backward as an opaque function of its graph (a runtime
    scalar lifted into the graph's inputs: other values reuse it)."""
    compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")
    ops = fresh_ops(path)
    x = torch.randn(9, dtype=torch.float64, requires_grad=True)
    y = torch.randn(9, dtype=torch.float64, requires_grad=True)
    ops.axpy(0.5, x, y)
    before = recorded()
    for a in (0.5, -2.0):
        x.grad = y.grad = None
        z, _ = ops.axpy(a, x, y)
        with compiled_autograd._enable(torch.compile(backend="eager")):
            (z * z).sum().backward()
        xd, yd, zd = x.detach(), y.detach(), z.detach()
        torch.testing.assert_close(x.grad, 2 * zd * a * yd)
        torch.testing.assert_close(y.grad, 2 * zd * (a * xd + 1))
    expect_recorded(path, before, 2)


def test_what_watches_the_dispatcher_gets_graph_calls(path):
    """A dispatch mode, the profiler and a tensor subclass see the registered operator for a call
    that records a graph too (its autograd is register_autograd's), with the same gradients."""
    from dispatch_seen import Seen

    class Sub(torch.Tensor):
        pass

    ops = fresh_ops(path)
    a, b = torch.randn(5, 3, requires_grad=True), torch.randn(3, 7)
    ops.matmul(a, b)
    expected = torch.ones(5, 7) @ b.T
    before = recorded()
    with Seen() as mode:
        ops.matmul(a, b).sum().backward()
    assert any(ops.matmul.namespace in op for op in mode.ops)
    with torch.profiler.profile() as prof:
        ops.matmul(a, b).sum().backward()
    assert any(ops.matmul.namespace in e.key for e in prof.key_averages())
    ops.matmul(a.as_subclass(Sub), b).sum().backward()
    expect_recorded(path, before, 0)
    torch.testing.assert_close(a.grad, 3 * expected)
