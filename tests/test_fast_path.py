"""The CPU repeat-call fast path: a plan per argument signature, right answers whatever changes."""

import numpy as np
import pytest

import tcc
from tcc import compiler
from tcc.errors import TccArgumentError

AXPY = "op axpy(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = a * X[i] + Y[i] }"
MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
SCALE = "op scale[S = 1](X: f32[N], k: i32) -> Y: f32[N] { Y[i] = X[i] * f32(S * k) }"


def data(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def checked_calls(monkeypatch):
    """How many calls took the checked path (binding and checking every argument)."""
    calls = []
    real = compiler.Op.bind

    def bind(self, args, cparams):
        calls.append(1)
        return real(self, args, cparams)

    monkeypatch.setattr(compiler.Op, "bind", bind)
    return calls


@pytest.mark.parametrize("n", [1, 7, 256])
def test_repeat_calls_take_the_plan_and_stay_right(rng, checked_calls, n):
    op = tcc.compile(AXPY).axpy
    for _ in range(4):
        x, y = data(rng, n), data(rng, n)
        a = float(rng.standard_normal())
        np.testing.assert_allclose(op(a, x, y), a * x + y, rtol=1e-6, atol=1e-6)
    assert len(checked_calls) == 1
    out = np.full(n, np.nan, np.float32)
    for _ in range(3):
        x, y = data(rng, n), data(rng, n)
        assert op(2.0, x, y, out=out) is out
        np.testing.assert_allclose(out, 2 * x + y, rtol=1e-6, atol=1e-6)
    assert len(checked_calls) == 2


def test_changed_strides_shape_and_out_take_the_checked_path(rng, checked_calls):
    op = tcc.compile(MATMUL).matmul
    a, b = data(rng, 7, 33), data(rng, 33, 5)
    np.testing.assert_allclose(op(a, b), a @ b, rtol=1e-4, atol=1e-4)
    wide = data(rng, 7, 66)
    strided = wide[:, ::2]  # the same shape and dtype, not contiguous
    np.testing.assert_allclose(op(strided, b), strided @ b, rtol=1e-4, atol=1e-4)
    transposed = np.asfortranarray(a)
    np.testing.assert_allclose(op(transposed, b), a @ b, rtol=1e-4, atol=1e-4)
    a2, b2 = data(rng, 3, 33), data(rng, 33, 5)
    np.testing.assert_allclose(op(a2, b2), a2 @ b2, rtol=1e-4, atol=1e-4)
    out = np.full((7, 5), np.nan, np.float32)
    op(a, b, out=out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    other = np.full((7, 5), np.nan, np.float32)
    op(a, b, out=other)  # a different out= array, same signature: the plan
    np.testing.assert_allclose(other, a @ b, rtol=1e-4, atol=1e-4)
    strided_out = np.full((7, 10), np.nan, np.float32)[:, ::2]
    op(a, b, out=strided_out)
    np.testing.assert_allclose(strided_out, a @ b, rtol=1e-4, atol=1e-4)
    assert len(checked_calls) == 6


def test_out_overlapping_an_input_is_right(rng):
    op = tcc.compile(MATMUL).matmul
    a = data(rng, 8, 8)
    b = data(rng, 8, 8)
    expected = a @ b
    out = np.empty((8, 8), np.float32)
    op(a, b, out=out)  # leaves a plan for out= calls of this signature
    op(a, b, out=a)  # the result overwrites an input it still reads
    np.testing.assert_allclose(a, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shift", [-3, 0, 5])
def test_out_sharing_part_of_an_input_is_right(rng, checked_calls, shift):
    """Views of one buffer: ``out=`` starting inside an input, before it, or on it, after a plan for
    out= calls exists (the plan reads the target first and checks each input against it)."""
    op = tcc.compile(AXPY).axpy
    n = 33
    x = data(rng, n)
    op(2.0, x, x, out=np.full(n, np.nan, np.float32))  # leaves the plan
    for _ in range(2):
        buf = data(rng, 2 * n + 8)
        y = buf[8:8 + n]
        out = buf[8 + shift:8 + shift + n]
        want = 2.0 * x + y
        assert op(2.0, x, y, out=out) is out
        np.testing.assert_allclose(out, want, rtol=1e-6)
    column = np.full((n, 2), np.nan, np.float32)[:, 0]  # strided: the checked path
    op(2.0, x, x, out=column)
    np.testing.assert_allclose(column, 3.0 * x, rtol=1e-6)


def test_argument_errors_after_a_plan_are_still_tcc_errors(rng):
    op = tcc.compile(AXPY).axpy
    x = data(rng, 9)
    op(1.0, x, x)
    op(1.0, x, x, out=np.empty(9, np.float32))
    with pytest.raises(TccArgumentError, match="argument Y of axpy must be f32"):
        op(1.0, x, x.astype(np.float64))
    with pytest.raises(TccArgumentError, match="argument a of axpy must be a f32 scalar"):
        op("1", x, x)
    read_only = np.empty(9, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(TccArgumentError, match="read-only"):
        op(1.0, x, x, out=read_only)
    with pytest.raises(TccArgumentError, match="out= for Z must be f32"):
        op(1.0, x, x, out=np.empty(9, np.float64))
    with pytest.raises(TccArgumentError, match="takes 3 argument"):
        op(1.0, x)


def test_integer_scalars_and_parameters(rng, checked_calls):
    op = tcc.compile(SCALE).scale
    x = data(rng, 33)
    np.testing.assert_allclose(op(x, 3), x * 3)
    np.testing.assert_allclose(op(x, -5), x * -5)
    np.testing.assert_allclose(op(x, 3, S=2), x * 6)
    np.testing.assert_allclose(op(x, 4, S=2), x * 8)
    assert len(checked_calls) == 2
    with pytest.raises(TccArgumentError, match="must be a i32 scalar"):
        op(x, 2.5, S=2)
    with pytest.raises(TccArgumentError, match="S must be a number"):
        op(x, 2, S=True)
    with pytest.raises(tcc.TccError):
        op(x, 1 << 40, S=2)  # out of i32's range: never wrapped silently


def test_torch_cpu_tensors_with_and_without_out(rng, checked_calls):
    torch = pytest.importorskip("torch")
    op = tcc.compile(AXPY).axpy
    for n in (1, 7, 256):
        x, y = torch.from_numpy(data(rng, n)), torch.from_numpy(data(rng, n))
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(op(1.5, x, y)), (1.5 * x + y).numpy(), rtol=1e-6, atol=1e-6)
            out = torch.full((n,), float("nan"))
            assert op(1.5, x, y, out=out) is out
            np.testing.assert_allclose(out.numpy(), (1.5 * x + y).numpy(), rtol=1e-6, atol=1e-6)
    assert len(checked_calls) == 6  # once per shape and per out= or not
    x = torch.from_numpy(data(rng, 14))
    strided = x[::2]
    np.testing.assert_allclose(np.asarray(op(1.0, strided, strided)), (2 * strided).numpy(), rtol=1e-6)
    with pytest.raises(TccArgumentError):
        op(1.0, x[:7].double(), x[:7])


@pytest.mark.parametrize("n", [1, 7, 33])
def test_a_torch_out_after_its_plan_is_checked_like_any(rng, n):
    """Once a torch out= call has a plan, an out= that overlaps an input, is strided, has another
    dtype or needs grad still gets the right answer or a TccError."""
    torch = pytest.importorskip("torch")
    op = tcc.compile(AXPY).axpy
    x, y = torch.from_numpy(data(rng, n)), torch.from_numpy(data(rng, n))
    for _ in range(2):  # the second call runs the plan
        out = torch.full((n,), float("nan"))
        op(1.5, x, y, out=out)
    want = (1.5 * x + y).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)
    inplace = x.clone()
    assert op(1.5, inplace, y, out=inplace) is inplace
    np.testing.assert_allclose(inplace.numpy(), want, rtol=1e-6, atol=1e-6)
    strided = torch.full((2 * n,), float("nan"))[::2]
    op(1.5, x, y, out=strided)
    np.testing.assert_allclose(strided.numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TccArgumentError):
        op(1.5, x, y, out=torch.empty(n, dtype=torch.float64))
    other = torch.full((n,), float("nan"))
    op(1.5, x, y, out=other)
    np.testing.assert_allclose(other.numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [7, 33])
def test_a_transposed_torch_tensor_of_the_same_shape_misses_the_plan(rng, checked_calls, n):
    """A square tensor and its transpose share dtype and shape; the plan checks contiguity, so the
    transpose takes the checked path (which copies it) and the product is right."""
    torch = pytest.importorskip("torch")
    op = tcc.compile(MATMUL).matmul
    a, b = torch.from_numpy(data(rng, n, n)), torch.from_numpy(data(rng, n, n))
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(op(a, b)), (a @ b).numpy(), rtol=1e-4, atol=1e-4)
    assert len(checked_calls) == 1
    out = torch.full((n, n), float("nan"))
    op(a.t(), b, out=out)
    np.testing.assert_allclose(out.numpy(), (a.t() @ b).numpy(), rtol=1e-4, atol=1e-4)
    op(a, b, out=out.t())  # a transposed out= too
    np.testing.assert_allclose(out.t().numpy(), (a @ b).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 33])
def test_a_plans_published_fast_path_repeats_the_call(rng, n):
    """What interop's eager paths use (``plan.fast_path()``, tcc/runtime/plans.py) is enough to
    repeat a call by hand: pointers and scalars into an argument array from the pool, one call
    of the entry point; the result is the op's, into a NaN-poisoned output."""
    op = tcc.compile(AXPY).axpy
    x, y, z = data(rng, n), data(rng, n), np.full(n, np.nan, np.float32)
    op(2.0, x, y, out=z)
    path = op.plans.plans[0].fast_path()
    assert (path.nargs, path.params, path.cparams, path.constants) == (3, 4, {}, False)
    assert [(t.pos, t.numpy, t.dtype, t.shape) for t in path.inputs] == [(1, True, x.dtype, (n,)),
                                                                         (2, True, y.dtype, (n,))]
    assert path.address and [(t.pos, t.shape) for t in path.results] == [(0, (n,))]
    x, y, z = data(rng, n), data(rng, n), np.full(n, np.nan, np.float32)
    ptrs, cells, address = path.pool.pop() if path.pool else path.new_buffer()
    for t, a in zip((*path.inputs, *path.results), (x, y, z)):
        ptrs[t.slot] = a.ctypes.data
    (pos, kind, _, cell), = cells
    assert (pos, kind) == (0, float) and [s[:3] for s in path.scalars] == [(0, 0, float)]
    cell.value = -1.5
    assert path.call(address) == 0
    np.testing.assert_allclose(z, -1.5 * x + y, rtol=1e-6, atol=1e-6)


def test_a_cuda_plans_fast_path_names_each_launch(monkeypatch):
    """``CudaFastPath``: each kernel's function, shape and parameters as positions in (arguments,
    results) with their cell types, its aligned variant's fallback, the stream getter."""
    import ctypes
    from types import SimpleNamespace

    from tcc.codegen_cuda import driver
    from tcc.runtime import cuda_plan

    monkeypatch.setattr(driver, "launch_kernel_address", lambda: 1234)
    plain = SimpleNamespace(fn=11, grid=4, block=256, shared=0, names=["n", "X", "Z"], fallback=None,
                            slots=[ctypes.c_int64(), ctypes.c_uint64(), ctypes.c_uint64()])
    aligned = SimpleNamespace(**{**vars(plain), "fn": 10, "grid": 1, "fallback": plain})
    stream = lambda device: 0  # noqa: E731
    plan = cuda_plan.Plan(SimpleNamespace(temps=[]), None, 0, 2, {}, [cuda_plan._Tensor(1, "f32", (8,), 32, 1)],
                          [(0, int, (0, 9), "i64", 0)], None, [((8,), "f32", 2)], [], object, None, stream, None,
                          [aligned], {"n": 0, "X": 1, "Z": 2}, "op")
    path = plan.fast_path()
    assert path.allocates and not path.intermediates and path.launch_kernel == 1234 and path.stream is stream
    assert path.scalars == ((0, int),) and [(t.pos, t.slot, t.shape) for t in path.results] == [(0, 2, (8,))]
    (launch,) = path.launches
    assert (launch.function, launch.grid, launch.fallback.function, launch.fallback.grid) == (10, 1, 11, 4)
    assert launch.params == ((0, ctypes.c_int64), (1, ctypes.c_uint64), (2, ctypes.c_uint64))
