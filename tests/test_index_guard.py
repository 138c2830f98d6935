"""Index checks on the fast path: a call that reads indices from data takes a plan like any other,
and the plan runs the op's guard (the checks compiled as an op of the target) before its kernel.
Good, bad, good calls in a row: the bad one is a TccIndexError naming the position and value,
with ``out=`` untouched, through the plan, ``tcc.torch``'s eager path, and on CUDA; the guard op
itself is checked against the host pass (CPU) and through NVRTC and the GPU simulator."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccIndexError
from tcc.index_guard import guard_source

SOURCE = """
op embedding(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {
    Y[n, d] = E[idx[n], d]
}
op pick(X: f32[N, C], lab: i32[N]) -> Y: f32[N] {
    Y[n] = X[n, lab[n]]
}
op window[L = 1](X: f32[T, D], start: i64) -> Y: f32[L, D] {
    Y[i, d] = X[start + i, d]
}
op two(E: f32[V, D], a: i64[N], b: i64[M]) -> Y: f32[N, M, D] {
    Y[n, m, d] = E[a[n], d] + E[b[m], d]
}
"""


def _raises_untouched(call, out, match: str) -> None:
    before = np.array(out, copy=True)
    with pytest.raises(TccIndexError, match=match):
        call()
    np.testing.assert_array_equal(np.asarray(out), before)


@pytest.mark.parametrize("n,bad", [(1, -1), (7, 1000), (33, -(2**40)), (1000, 999 + 1)])
def test_good_bad_good_through_the_plan(rng, n, bad):
    """A binding's first call is checked on the host, its next ones by the guard op, the plan's
    calls included: each bad call raises with ``out=`` untouched, the good calls after it work."""
    op = tcc.compile(SOURCE).embedding
    E = rng.standard_normal((1000, 7)).astype(np.float32)
    idx = rng.integers(0, 1000, n)
    out = np.full((n, 7), np.nan, np.float32)
    np.testing.assert_array_equal(op(E, idx, out=out), E[idx])
    assert not op.plans and not op._guards, "a binding's first call is checked on the host: no guard compiled"
    np.testing.assert_array_equal(op(E, idx, out=out), E[idx])
    assert op.plans and op.plans.plans[0].guard is not None, "a repeat call leaves a plan that checks"
    np.testing.assert_array_equal(op(E, idx, out=out), E[idx])  # the plan's own call
    wrong = idx.copy()
    wrong[n // 2] = bad
    out[:] = np.nan
    assert op.plans.run((E, wrong), {}, out) is None, "the plan refuses"
    assert np.isnan(out).all(), "having written nothing"
    _raises_untouched(lambda: op(E, wrong, out=out), out,
                      rf"index 0 of E \(idx\[n\]\) is {bad} at n={n // 2}, outside \[0, 1000\)")
    _raises_untouched(lambda: op(E, wrong, out=out), out, f"is {bad}")  # again: the plan is still there
    out[:] = np.nan
    np.testing.assert_array_equal(op(E, idx, out=out), E[idx])
    np.testing.assert_array_equal(out, E[idx])


def test_new_shapes_are_checked_on_the_host_without_a_guard_compile(rng):
    """A stream of new sizes (sequence lengths) is checked by the host pass, compiling no guard
    op per size; a size that comes again gets its guard and plan."""
    op = tcc.compile(SOURCE).embedding
    E = rng.standard_normal((50, 3)).astype(np.float32)
    for n in (1, 7, 33, 8, 9):
        idx = rng.integers(0, 50, n)
        np.testing.assert_array_equal(op(E, idx), E[idx])
    for n in (2, 3, 1000):
        idx = rng.integers(0, 50, n)
        idx[-1] = 50
        with pytest.raises(TccIndexError, match=f"is 50 at n={n - 1}"):
            op(E, idx)
    assert not op._guards
    idx = rng.integers(0, 50, 7)
    np.testing.assert_array_equal(op(E, idx), E[idx])
    assert len(op._guards) == 1 and op.plans


def test_threads_share_a_checked_plan(rng):
    """Threads calling one checked op, good and bad calls mixed: each good call right, each bad
    one a TccIndexError with its own ``out=`` untouched (the guard's argument arrays are pooled)."""
    from concurrent.futures import ThreadPoolExecutor

    op = tcc.compile(SOURCE).embedding
    E = rng.standard_normal((1000, 16)).astype(np.float32)
    ids = [rng.integers(0, 1000, 257) for _ in range(8)]
    for i in range(1, 8, 2):
        ids[i][i * 31] = 1000 + i
    op(E, ids[0])
    op(E, ids[0])  # the plan

    def call(i: int) -> bool:
        out = np.full((257, 16), -1.0, np.float32)
        for _ in range(20):
            try:
                op(E, ids[i], out=out)
            except TccIndexError as exc:
                assert i % 2 == 1 and f"is {1000 + i} at n={i * 31}" in str(exc) and (out == -1.0).all()
                continue
            assert i % 2 == 0 and np.array_equal(out, E[ids[i]])
        return True
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, range(8)))


def test_runtime_scalar_and_i32_labels_through_the_plan(rng):
    lib = tcc.compile(SOURCE)
    X = rng.standard_normal((33, 5)).astype(np.float32)
    for start in (0, 30, 12):
        np.testing.assert_array_equal(lib.window(X, start, L=3), X[start:start + 3])
    assert lib.window.plans
    out = np.full((3, 5), 2.0, np.float32)
    _raises_untouched(lambda: lib.window(X, 31, L=3, out=out), out, r"\(start \+ i\) is 33 at i=2")
    _raises_untouched(lambda: lib.window(X, -1, L=3, out=out), out, r"is -1 at i=0")
    np.testing.assert_array_equal(lib.window(X, 1, L=3, out=out), X[1:4])
    lab = rng.integers(0, 5, 33).astype(np.int32)
    np.testing.assert_array_equal(lib.pick(X, lab), X[np.arange(33), lab])
    lab[32] = 5
    with pytest.raises(TccIndexError, match="is 5 at n=32"):
        lib.pick(X, lab)
    lab[32] = 4
    np.testing.assert_array_equal(lib.pick(X, lab), X[np.arange(33), lab])


def test_two_checks_each_named(rng):
    op = tcc.compile(SOURCE).two
    E = rng.standard_normal((9, 3)).astype(np.float32)
    a, b = rng.integers(0, 9, 7), rng.integers(0, 9, 5)
    np.testing.assert_array_equal(op(E, a, b), E[a][:, None] + E[b][None])
    b2 = b.copy()
    b2[4] = 9
    with pytest.raises(TccIndexError, match=r"\(b\[m\]\) is 9 at m=4"):
        op(E, a, b2)
    a2 = a.copy()
    a2[0] = -3
    with pytest.raises(TccIndexError, match=r"\(a\[n\]\) is -3 at n=0"):
        op(E, a2, b)
    np.testing.assert_array_equal(op(E, a, b), E[a][:, None] + E[b][None])


def test_an_index_read_at_a_data_index_is_checked_on_the_host(rng):
    """``E[idx[jdx[n]]]``: a guard op would read ``idx`` where ``jdx`` may leave it, so these calls
    keep the host pass (no guard, no plan) and raise for either index, writing nothing."""
    source = "op f(E: f32[V], idx: i64[M], jdx: i64[N]) -> Y: f32[N] {\n    Y[n] = E[idx[jdx[n]]]\n}"
    op = tcc.compile(source).f
    E = rng.standard_normal(10).astype(np.float32)
    idx, jdx = rng.integers(0, 10, 33), rng.integers(0, 33, 7)
    out = np.full(7, np.nan, np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(op(E, idx, jdx, out=out), E[idx[jdx]])
    assert op.index_guard({"V": 10, "M": 33, "N": 7}) is None and not op.plans
    out[:] = 5.0
    bad_j = jdx.copy()
    bad_j[6] = 1 << 40
    _raises_untouched(lambda: op(E, idx, bad_j, out=out), out, r"\(jdx\[n\]\) is 1099511627776 at n=6")
    bad_i = idx.copy()
    bad_i[jdx[2]] = -4
    _raises_untouched(lambda: op(E, bad_i, jdx, out=out), out, r"is -4 at n=2")
    pytest.importorskip("cuda.bindings.nvrtc")
    cuda = tcc.compile(source, target="cuda", arch="sm_90").f
    assert "tcc_guard" not in cuda.lower(E, idx, jdx, stage="cuda")


def test_the_guard_op_counts_what_the_host_pass_finds(rng):
    """The guard's count is nonzero exactly where the reference's host pass raises."""
    lib = tcc.compile(SOURCE)
    op = lib.two
    for trial in range(20):
        a, b = rng.integers(-2, 11, 7), rng.integers(-2, 11, 5)
        guard = op.index_guard({"V": 9, "D": 3, "N": 7, "M": 5})
        count = np.full(1, -7, np.int64)
        guard.kernel({"a": a, "b": b, "R": count})
        bad = int(((a < 0) | (a >= 9)).any()) + int(((b < 0) | (b >= 9)).any())
        assert count[0] == bad, (trial, a, b)


@pytest.fixture(params=["native", "python"], name="path")
def eager_path(request, monkeypatch):
    """tcc.torch's C++ eager path (skipped where it cannot be built) or its Python one."""
    pytest.importorskip("torch")
    from tcc.interop import torch_native

    if request.param == "python":
        monkeypatch.setenv("TCC_TORCH_NATIVE", "0")
    elif torch_native.load() is None:
        pytest.skip(f"the C++ eager path cannot be built here: {torch_native.status()}")
    return request.param


def test_torch_eager_path_checks_too(rng, path, monkeypatch):
    """Both eager paths run the guard: good calls served (natively where built: the Python path
    made to fail shows it), a bad one declined there and raised by the checked call, nothing
    written; the gradient (a checked scatter-add) too."""
    import torch

    from tcc.interop import torch as torch_interop

    ops = tcc.torch.library(SOURCE, namespace=f"tcc_guard_{path}_{rng.integers(1 << 30)}")
    E = torch.from_numpy(rng.standard_normal((50, 4)).astype(np.float32))
    idx = torch.from_numpy(rng.integers(0, 50, 33))
    for _ in range(2):  # the first call (host check), then the one that leaves the plan
        torch.testing.assert_close(ops.embedding(E, idx), E[idx], rtol=0, atol=0)
    assert (ops.embedding._native is not None) == (path == "native")
    with monkeypatch.context() as patch:
        if path == "native":
            patch.setattr(torch_interop._Direct, "run", lambda *a: pytest.fail("the Python path ran"))
        for _ in range(3):
            torch.testing.assert_close(ops.embedding(E, idx), E[idx], rtol=0, atol=0)
    wrong = idx.clone()
    wrong[3] = 50
    for bad in (50, -1):
        wrong[3] = bad
        for _ in range(2):
            with pytest.raises(TccIndexError, match=f"is {bad} at n=3"):
                ops.embedding(E, wrong)
    torch.testing.assert_close(ops.embedding(E, idx), E[idx], rtol=0, atol=0)
    Eg = E.clone().requires_grad_()
    for _ in range(3):
        Eg.grad = None
        ops.embedding(Eg, idx).sum().backward()  # the gradient (a scatter-add) is checked too
        torch.testing.assert_close(Eg.grad, torch.zeros_like(E).index_add_(0, idx, torch.ones(33, 4)))
    with pytest.raises(TccIndexError, match="is -1 at n=3"):
        ops.embedding(Eg, wrong).sum().backward()


def test_a_big_table_gathered_at_data_indices_is_read_in_parallel():
    """Each read of a label pick from a table beyond the L2 cache is a cache miss: worth a fork
    at 4096 rows (a small table's pick stays serial)."""
    lib = tcc.compile(SOURCE)
    big = lib.pick.stage_text({"N": 4096, "C": 32000}, "scheduled")
    small = lib.pick.stage_text({"N": 4096, "C": 8}, "scheduled")
    if lib.target.cores > 1:
        assert "# parallel" in big
    assert "# parallel" not in small


@pytest.mark.parametrize("name,bindings", [("embedding", {"V": 33, "D": 7, "N": 9}),
                                           ("window", {"T": 33, "D": 7, "L": 5}),
                                           ("two", {"V": 9, "D": 3, "N": 7, "M": 5})])
def test_the_cuda_guard_compiles_and_counts(rng, name, bindings):
    """The guard op of each CUDA specialisation compiles through NVRTC; in the GPU simulator it
    counts the checks out of range."""
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(SOURCE, target="cuda", arch="sm_90")[name]
    source, params = guard_source(op._index_checks(bindings))
    guard = tcc.compile(source, target="cuda", arch="sm_90").index_guard
    assert "__global__" in guard.lower(stage="cuda")
    assert guard.lower(stage="ptx")
    scheduled = guard.lowered({}).scheduled
    tensors = {p: guard.te.tensors[p] for p in params if p in guard.te.tensors}
    for bad in (False, True):
        arrays = {p: rng.integers(0, 7, t.concrete_shape()).astype(np.int64) for p, t in tensors.items()}
        scalars = {p: 3 for p in params if p not in tensors}
        if bad and arrays:
            first = next(iter(arrays))
            arrays[first].reshape(-1)[-1] = -1
        elif bad:
            scalars = {p: 40 for p in scalars}
        arrays["R"] = np.full(1, -5, np.int64)
        gpu_sim.run(scheduled, arrays, scalars=scalars)
        assert arrays["R"][0] == int(bad)


needs_gpu = pytest.mark.skipif(not tcc.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.cuda
@needs_gpu
def test_cuda_good_bad_good_through_the_plan(rng):
    torch = pytest.importorskip("torch")
    lib = tcc.compile(SOURCE, target="cuda")
    E = torch.from_numpy(rng.standard_normal((1000, 64)).astype(np.float32)).cuda()
    idx = torch.from_numpy(rng.integers(0, 1000, 777)).cuda()
    out = torch.full((777, 64), 7.0, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(lib.embedding(E, idx), E[idx], rtol=0, atol=0)
    assert lib.embedding.plans and lib.embedding.plans.plans[0].guard is not None
    for bad in (1000, -1):
        wrong = idx.clone()
        wrong[5] = bad
        for _ in range(2):
            with pytest.raises(TccIndexError, match=f"is {bad} at n=5"):
                lib.embedding(E, wrong, out=out)
            assert bool((out == 7.0).all())
            with pytest.raises(TccIndexError, match=f"is {bad} at n=5"):
                lib.embedding(E, wrong)
    torch.testing.assert_close(lib.embedding(E, idx, out=out), E[idx], rtol=0, atol=0)
    torch.testing.assert_close(out, E[idx], rtol=0, atol=0)
    X = torch.from_numpy(rng.standard_normal((33, 5)).astype(np.float32)).cuda()
    torch.testing.assert_close(lib.window(X, 30, L=3), X[30:], rtol=0, atol=0)
    with pytest.raises(TccIndexError, match=r"is 33 at i=2"):
        lib.window(X, 31, L=3)
    torch.testing.assert_close(lib.window(X, 29, L=3), X[29:32], rtol=0, atol=0)


@pytest.mark.cuda
@needs_gpu
def test_cuda_torch_eager_path_checks_too(rng):
    torch = pytest.importorskip("torch")
    ops = tcc.torch.library(SOURCE, namespace="tcc_guard_cuda")
    E = torch.from_numpy(rng.standard_normal((50, 4)).astype(np.float32)).cuda()
    idx = torch.from_numpy(rng.integers(0, 50, 33)).cuda()
    for _ in range(3):
        torch.testing.assert_close(ops.embedding(E, idx), E[idx], rtol=0, atol=0)
    wrong = idx.clone()
    wrong[3] = -2
    for _ in range(2):
        with pytest.raises(TccIndexError, match="is -2 at n=3"):
            ops.embedding(E, wrong)
    torch.testing.assert_close(ops.embedding(E, idx), E[idx], rtol=0, atol=0)


def test_cuda_kernels_of_a_checked_op_read_the_guard_count(rng):
    """Every CUDA kernel of an op with index checks takes the guard's device count and returns
    at once when it is not zero (compiled through NVRTC); an op whose indices are proved does not."""
    pytest.importorskip("cuda.bindings.nvrtc")
    lib = tcc.compile(SOURCE, target="cuda", arch="sm_90")
    E, idx = rng.standard_normal((33, 7)).astype(np.float32), rng.integers(0, 33, 9)
    source = lib.embedding.lower(E, idx, stage="cuda")
    kernels = source.count("__global__")
    assert kernels >= 1 and source.count("if (*tcc_guard != 0) return;") == kernels
    assert lib.embedding.lower(E, idx, stage="ptx")
    clamped = tcc.compile("op f(E: f32[V, D], idx: i64[N]) -> Y: f32[N, D] {\n"
                          "    Y[n, d] = E[min(max(idx[n], 0), V - 1), d]\n}", target="cuda", arch="sm_90").f
    assert "tcc_guard" not in clamped.lower(E, idx, stage="cuda")


class _FakeGuardKernel:
    """A loaded guard op as CudaKernel presents it, minus the driver: one kernel reading idx and
    start and writing R."""

    name = "index_guard"
    temps: list = []
    meta = {"kernels": [{"params": [["idx", "p"], ["start", "i64"], ["R", "p"]]}]}

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def launchers(self, device: int) -> list:
        from tcc.codegen_cuda import driver

        launcher = object.__new__(driver.Launcher)
        launcher.name, launcher.fn, launcher.grid, launcher.block, launcher.shared = "guard_k0", 0x1000, 1, 256, 0
        launcher.names, launcher.pointers, launcher.fallback = ["idx", "start", "R"], [0, 2], None
        return [launcher]


def test_cuda_guard_queues_check_copy_event_kernels_then_waits(monkeypatch):
    """Without a GPU (the driver stood in for): a call queues the guard's kernel on the call's
    stream with the index tensor's pointer and the scalar copied from the op's argument block, then
    the count's copy to the host, an event, the op's kernels (given the stream's device count),
    and only then waits on the event; a nonzero count is a failed check."""
    import ctypes

    from tcc.codegen_cuda import driver
    from tcc.runtime.cuda_guard import CudaGuard
    from tcc.runtime.index_checks import IndexGuard

    log: list = []
    host = ctypes.c_int64(-1)
    simulated = {"count": 0}

    def launch(fn, grid, gy, gz, block, by, bz, shared, stream, argv, extra) -> int:
        addresses = ctypes.cast(argv.value, ctypes.POINTER(ctypes.c_void_p))
        values = [ctypes.c_uint64.from_address(addresses[0]).value, ctypes.c_int64.from_address(addresses[1]).value,
                  ctypes.c_uint64.from_address(addresses[2]).value]
        log.append(("guard", fn.value, None if stream is None else stream.value, values))
        return driver.SUCCESS

    def copy(dst, src, nbytes, stream, what) -> None:
        log.append(("copy", src, nbytes, stream))
        ctypes.c_int64.from_address(dst).value = simulated["count"]

    class _Context:
        def activate(self) -> None:
            pass

    monkeypatch.setattr(driver, "context", lambda device: _Context())
    monkeypatch.setattr(driver, "raw_launch", lambda: launch)
    counts = iter([0xC0DE00, 0xC0DF00])
    monkeypatch.setattr(driver, "alloc_workspace", lambda nbytes, what: next(counts))
    monkeypatch.setattr(driver, "alloc_pinned", lambda nbytes, what: ctypes.addressof(host))
    monkeypatch.setattr(driver, "event", lambda what: 77)
    monkeypatch.setattr(driver, "record", lambda event, stream, what: log.append(("record", event, stream)))
    monkeypatch.setattr(driver, "wait", lambda event, what: log.append(("wait", event)))
    monkeypatch.setattr(driver, "copy_dtoh", copy)
    for name in ("free_workspace", "free_pinned", "destroy_event"):
        monkeypatch.setattr(driver, name, lambda *a: None)

    checks = CudaGuard(IndexGuard(_FakeGuardKernel(), ("idx", "start")), 0)
    main = (ctypes.c_uint64 * 5)()
    words = memoryview((ctypes.c_char * 40).from_buffer(main)).cast("B").cast("Q")
    slots = {"E": 0, "idx": 1, "start": 2, "Y": 3, "tcc_guard": 4}
    words[1] = 0xABC0
    ctypes.c_int64.from_address(ctypes.addressof(main) + 16).value = -5
    for count in (0, 2, 0):
        simulated["count"] = count
        log.clear()
        ok = checks.around_words(words, checks.copies(slots), 9, "f", lambda c: log.append(("kernels", c)))
        assert ok == (count == 0)
        assert log == [("guard", 0x1000, 9, [0xABC0, -5, 0xC0DE00]), ("copy", 0xC0DE00, 8, 9), ("record", 77, 9),
                       ("kernels", 0xC0DE00), ("wait", 77)]
    log.clear()
    simulated["count"] = 1  # another stream: a count of its own
    assert not checks.around_values({"idx": 0xDEF0, "start": 3, "E": 1}, 0, "f", lambda c: log.append(("kernels", c)))
    assert log[0] == ("guard", 0x1000, None, [0xDEF0, 3, 0xC0DF00])
    assert log[-2:] == [("kernels", 0xC0DF00), ("wait", 77)]
