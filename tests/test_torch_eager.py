"""``tcc.torch``'s eager path, both halves: the C++ one (``tcc/interop/torch_native.cpp``, built
once per test session into the session's cache directory) and the Python one that serves when it
cannot be built or ``TCC_TORCH_NATIVE=0``. Each checks its results against PyTorch on fresh random
inputs, at odd and round sizes, and takes only the calls it may: a call it declines goes to the
checked path (tcc's errors) or to torch's dispatcher, with the same values."""

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
    Z[i] = a * X[i] + Y[i]
    S[i] = i64(X[i] > 0.0)
}
op shift(X: i64[N], k: i32) -> Y: i64[N] {
    Y[i] = X[i] + i64(k)
}
"""
_NAMESPACES = count()


def fresh_ops(path: str):
    return tcc.torch.library(OPS, namespace=f"tcc_test_eager_{path}_{next(_NAMESPACES)}")


def served_natively(op, path: str, monkeypatch) -> None:
    """After the first call, whether the C++ path takes the repeat calls: the Python path's repeat
    call (``_Direct.run``) is made to fail, so a repeat that reaches it shows."""
    assert (op._native is not None) == (path == "native")
    if path == "native":
        monkeypatch.setattr(torch_interop._Direct, "run", lambda *a: pytest.fail("the Python path ran"))


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (16, 64, 32)])
def test_repeat_calls_match_torch(path, monkeypatch, m, k, n):
    ops = fresh_ops(path)
    a, b = torch.randn(m, k), torch.randn(k, n)
    first = ops.matmul(a, b)
    served_natively(ops.matmul, path, monkeypatch)
    for _ in range(3):
        a, b = torch.randn(m, k), torch.randn(k, n)
        got = ops.matmul(a, b)
        assert got.data_ptr() != first.data_ptr() and got.dtype == torch.float32 and got.is_contiguous()
        torch.testing.assert_close(got, a @ b, rtol=1e-4, atol=1e-4)
    w = torch.nn.Parameter(torch.randn(k, n))
    with torch.no_grad():  # a parameter (and a tensor asking for a gradient) under no_grad: no graph
        got = ops.matmul(a, w)
    assert got.grad_fn is None
    torch.testing.assert_close(got, a @ w.detach(), rtol=1e-4, atol=1e-4)


def test_declined_calls_take_the_checked_path(path):
    """Another shape, a strided input, another dtype, a graph to record: each call is right or a
    TccError naming the argument, and the repeat call still serves afterwards."""
    ops = fresh_ops(path)
    a, b = torch.randn(7, 5), torch.randn(5, 3)
    for _ in range(2):
        torch.testing.assert_close(ops.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    c = torch.randn(9, 5)
    torch.testing.assert_close(ops.matmul(c, b), c @ b, rtol=1e-4, atol=1e-4)
    strided = torch.randn(5, 7).t()
    torch.testing.assert_close(ops.matmul(strided, b), strided @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(tcc.TccError, match="argument A of matmul.*must be f32"):
        ops.matmul(a.double(), b)
    with pytest.raises(tcc.TccError, match="symbol K"):
        ops.matmul(a, torch.randn(4, 3))
    g = a.clone().requires_grad_()
    y = ops.matmul(g, b)
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(g.grad, torch.ones(7, 3) @ b.T, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ops.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_scalars_and_several_results(path, monkeypatch):
    """Runtime scalars are read per call (another value is used; a value out of its type's range is
    the checked path's error); integer results keep their dtype."""
    ops = fresh_ops(path)
    x, y = torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    ops.axpy(0.5, x, y)
    served_natively(ops.axpy, path, monkeypatch)
    for a in (0.5, -1.25, 3.0):
        z, s = ops.axpy(a, x, y)
        torch.testing.assert_close(z, a * x + y)
        assert s.dtype == torch.int64 and torch.equal(s, (x > 0).long())
    monkeypatch.undo()  # an int where a float was seen: the Python path takes it
    z, _ = ops.axpy(2, x, y)
    torch.testing.assert_close(z, 2 * x + y)
    n = torch.randint(-50, 50, (17,))
    for k in (3, -2**31, 2**31 - 1):
        assert torch.equal(ops.shift(n, k), n + k)
    with pytest.raises(tcc.TccError, match="out of range for i32"):
        ops.shift(n, 2**31)


def test_what_watches_the_dispatcher_gets_it(path):
    """A dispatch mode, the profiler and a tensor subclass see the registered operator, also for a
    signature the eager path knows; the values are the same."""
    from dispatch_seen import Seen

    class Sub(torch.Tensor):
        pass

    ops = fresh_ops(path)
    matmul = ops.matmul
    dispatched = []
    real = matmul.overload
    matmul.overload = lambda *a, **k: (dispatched.append(1), real(*a, **k))[1]
    a, b = torch.randn(5, 3), torch.randn(3, 7)
    for _ in range(2):
        torch.testing.assert_close(matmul(a, b), a @ b)
    assert not dispatched
    with Seen() as mode:
        torch.testing.assert_close(matmul(a, b), a @ b)
    assert any(matmul.namespace in op for op in mode.ops)
    with torch.profiler.profile() as prof:
        matmul(a, b)
    assert any(matmul.namespace in e.key for e in prof.key_averages())
    torch.testing.assert_close(matmul(a.as_subclass(Sub), b), a @ b)
    assert len(dispatched) == 3


def test_threads_share_an_op(path):
    """Threads calling one op at once (a kernel above 1 MiB of data runs without the GIL in C++)
    each get their own right results."""
    from concurrent.futures import ThreadPoolExecutor

    ops = fresh_ops(path)
    b = torch.randn(128, 1024)  # with A and C: 1.06 MiB
    ops.matmul(torch.randn(128, 128), b)

    def work(seed: int) -> bool:
        gen = torch.Generator().manual_seed(seed)
        ok = True
        for _ in range(4):
            a = torch.randn(128, 128, generator=gen)
            ok = ok and torch.allclose(ops.matmul(a, b), a @ b, rtol=1e-4, atol=1e-3)
        return ok

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))


def test_the_switch_forces_the_python_path(monkeypatch):
    monkeypatch.setenv("TCC_TORCH_NATIVE", "0")
    assert torch_native.load() is None and torch_native.status() == "python (TCC_TORCH_NATIVE=0)"
    ops = fresh_ops("off")
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    for _ in range(2):
        torch.testing.assert_close(ops.matmul(a, b), a @ b)
    assert ops.matmul._native is None


def test_without_a_compiler_the_python_path_serves(tmp_path, monkeypatch):
    """A build that fails (here: no C++ compiler, in an empty cache) leaves the Python path, with
    the reason in ``status()``; calls are right and tried natively never."""
    monkeypatch.setattr(torch_native, "_state", {})  # this test's own attempt (restored after it)
    monkeypatch.setenv("TCC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    ops = fresh_ops("nocxx")
    a, b = torch.randn(6, 7), torch.randn(7, 3)
    for _ in range(2):
        torch.testing.assert_close(ops.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert ops.matmul._native is None
    assert torch_native.load() is None and torch_native.status().startswith("python (build failed")


@pytest.mark.cuda
def test_cuda_eager_calls_launch_on_the_tensors_and_the_current_stream(path, monkeypatch):
    """CUDA tensors skip the dispatcher too: the kernels read the inputs' memory and write results
    that PyTorch allocated and returns (pointers seen at the first, checked call), on PyTorch's
    current stream: on a side stream whose input is written after a GPU sleep, a kernel on any
    other stream would read it too early. Repeat calls are served by C++ where it is built."""
    if not torch.cuda.is_available() or not tcc.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from tcc.codegen_cuda import driver
    from tcc.runtime import cuda_plan

    ops = fresh_ops(path)
    matmul = ops.matmul
    dispatched = []
    real_overload = matmul.overload
    matmul.overload = lambda *a, **k: (dispatched.append(1), real_overload(*a, **k))[1]
    launches = []
    real = driver.Launcher.launch

    def spy(launcher, values, stream, *rest):  # the checked call's launches, parameters by name
        launches.append(([values[name] for name in launcher.names], stream))
        return real(launcher, values, stream, *rest)

    monkeypatch.setattr(driver.Launcher, "launch", spy)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for m, k, n in ((7, 33, 5), (64, 32, 16)):
            a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
            launches.clear()
            c = matmul(a, b)  # the checked call
            pointers = {p for values, _ in launches for p in values if isinstance(p, int)}
            assert {a.data_ptr(), b.data_ptr(), c.data_ptr()} <= pointers
            assert launches and all(s == stream.cuda_stream for _, s in launches)
            torch.testing.assert_close(c, a @ b, rtol=1e-3, atol=1e-3)
    # not a plan with intermediates or shape symbols (the second size's kernel is dynamic under
    # the automatic policy): their cells are Python's
    native = path == "native" and not matmul.cuda_op.plans.plans[-1].fast_path().intermediates
    if native:
        assert matmul._native is not None
    if native:
        monkeypatch.setattr(cuda_plan.Plan, "run", lambda *a: pytest.fail("the Python path ran"))
    with torch.cuda.stream(stream):
        for _ in range(3):
            src = torch.randn(64, 32, device="cuda")
            a = torch.empty_like(src)
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time before the input is written
            a.copy_(src)
            c = matmul(a, b)
            got = c.clone()
    stream.synchronize()
    torch.testing.assert_close(got, src @ b, rtol=1e-3, atol=1e-3)
    assert not dispatched
