"""The fast path's argument block (tcc.codegen_cuda.driver.ArgumentBlock), without a GPU: what
each kernel would receive is read back through the parameter arrays a stand-in cuLaunchKernel is
given, on random values."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tcc.codegen_cuda import driver
from tcc.errors import TccRuntimeError

_READ = {"p": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double, "i8": ctypes.c_int8,
         "i32": ctypes.c_int32, "i64": ctypes.c_int64, "bool": ctypes.c_bool}


def _launcher(name: str, fn: int, params: list[tuple[str, str]], grid: int = 3, block: int = 128) -> driver.Launcher:
    """A Launcher as load_module would make it, minus the driver (its handle made up)."""
    launcher = object.__new__(driver.Launcher)
    launcher.name, launcher.fn, launcher.grid, launcher.block, launcher.shared = name, fn, grid, block, 0
    launcher.names = [n for n, _ in params]
    launcher.codes = [c for _, c in params]
    launcher.pointers = [i for i, (_, c) in enumerate(params) if c == "p"]
    launcher.fallback = None
    return launcher


class _Context:
    def __init__(self) -> None:
        self.activated = 0

    def activate(self) -> None:
        self.activated += 1


class _Driver:
    """Records each launch: the function, grid, block, stream and the parameter values as read."""

    def __init__(self, launchers: list[driver.Launcher], refuse: int = 0):
        self.codes = {launcher.fn: launcher.codes for launcher in launchers}
        self.launches: list[tuple[int, int, int, int | None, list]] = []
        self.refuse = refuse  # launches to refuse first for want of a context
        self.limit = 1 << 30  # threads a block

    def __call__(self, fn, grid, gy, gz, block, by, bz, shared, stream, argv, extra) -> int:
        assert (gy, gz, by, bz, shared, extra) == (1, 1, 1, 1, 0, None)
        if block > self.limit:
            return 1  # CUDA_ERROR_INVALID_VALUE
        if self.refuse:
            self.refuse -= 1
            return driver.ERROR_INVALID_CONTEXT
        addresses = ctypes.cast(argv.value, ctypes.POINTER(ctypes.c_void_p))
        codes = self.codes[fn.value]
        values = [_READ[c].from_address(addresses[i]).value for i, c in enumerate(codes)]
        self.launches.append((fn.value, grid, block, None if stream is None else stream.value, values))
        return driver.SUCCESS


def _block(launchers, refuse=0):
    names = sorted({n for launcher in launchers for n in launcher.names})
    slots = {n: i for i, n in enumerate(names)}
    context, stand_in = _Context(), _Driver(launchers, refuse)
    return driver.ArgumentBlock(launchers, slots, context, stand_in), slots, context, stand_in


def test_each_kernel_reads_its_parameters_from_the_shared_slots(rng):
    codes = ["f32", "f64", "i8", "i32", "i64", "bool"]
    k0 = _launcher("k0", 0x1000, [("X", "p"), ("T", "p"), *((f"s_{c}", c) for c in codes)])
    k1 = _launcher("k1", 0x2000, [("s_i32", "i32"), ("T", "p"), ("Y", "p"), ("s_f32", "f32")], grid=7, block=64)
    block, slots, _, stand_in = _block([k0, k1])
    for _ in range(3):  # the same block, new values each call
        pointers = {n: int(rng.integers(1, 1 << 48)) * 16 for n in ("X", "T", "Y")}
        scalars = {"f32": float(np.float32(rng.standard_normal())), "f64": float(rng.standard_normal()),
                   "i8": int(rng.integers(-128, 128)), "i32": int(rng.integers(-(1 << 31), 1 << 31)),
                   "i64": int(rng.integers(-(1 << 62), 1 << 62)), "bool": bool(rng.integers(2))}
        for n, p in pointers.items():
            block.words[slots[n]] = p
        for c, v in scalars.items():
            view, index = block.setter(c, slots[f"s_{c}"])
            view[index] = v
        stream = int(rng.integers(1, 1 << 40))
        stand_in.launches.clear()
        block.launch(stream, "op", 0)
        assert stand_in.launches == [
            (0x1000, 3, 128, stream, [pointers["X"], pointers["T"], *(scalars[c] for c in codes)]),
            (0x2000, 7, 64, stream, [scalars["i32"], pointers["T"], pointers["Y"], scalars["f32"]])]
    stand_in.launches.clear()
    block.launch(0, "op", 0)  # the legacy default stream goes as NULL
    assert [launch[3] for launch in stand_in.launches] == [None, None]


@pytest.mark.parametrize("offset", [0, 4, 8])
def test_a_misaligned_pointer_runs_the_fallback_of_the_kernels_that_read_it(offset):
    fast = _launcher("fast", 0x10, [("X", "p"), ("Y", "p")], grid=2)
    slow = _launcher("slow", 0x20, [("X", "p"), ("Y", "p")], grid=8)
    fast.fallback = slow
    other = _launcher("other", 0x30, [("Z", "p")])
    other_fallback = _launcher("other_fallback", 0x40, [("Z", "p")])
    other.fallback = other_fallback
    block, slots, _, stand_in = _block([fast, other])
    stand_in.codes.update({0x20: ["p", "p"], 0x40: ["p"]})
    x, y, z = 1 << 20, (1 << 21) + offset, 1 << 22
    for n, p in zip("XYZ", (x, y, z)):
        block.words[slots[n]] = p
    block.launch(5, "op", x | y | z)
    assert [(fn, grid) for fn, grid, *_ in stand_in.launches] == [(0x20 if offset else 0x10, 8 if offset else 2),
                                                                 (0x30, 3)]


def test_a_launch_refused_for_want_of_a_context_makes_it_current_and_retries():
    k = _launcher("k", 0x10, [("X", "p")])
    block, slots, context, stand_in = _block([k], refuse=1)
    block.words[slots["X"]] = 1 << 20
    block.launch(0, "op", 0)
    assert context.activated == 1 and len(stand_in.launches) == 1
    block, slots, context, stand_in = _block([k], refuse=2)
    with pytest.raises(TccRuntimeError, match="op op: launching kernel k"):
        block.launch(0, "op", 0)


# ---------------------------------------------------------------- the fast path's plan, on CPU tensors

class _Kernel:
    temps: list = []

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()


def _axpy_plan(monkeypatch, out: bool):
    """cuda_plan.Plan for ``axpy(a: f32, X: f32[N], Y: f32[N]) -> Z`` at N = 33 on CPU tensors
    (``get_device()`` -1 for the device), launching through a stand-in driver."""
    torch = pytest.importorskip("torch")
    from tcc.runtime import cuda_plan

    launcher = _launcher("axpy", 0x10, [("a", "f32"), ("X", "p"), ("Y", "p"), ("Z", "p")], grid=1, block=64)
    stand_in = _Driver([launcher])
    stand_in.limit = 1024  # threads a block: a larger block is refused, as the driver does
    monkeypatch.setattr(driver, "raw_launch", lambda: stand_in)
    slots = {"a": 0, "X": 1, "Y": 2, "Z": 3}
    f32 = torch.float32
    inputs = [cuda_plan._Tensor(1, f32, (33,), 132, 1), cuda_plan._Tensor(2, f32, (33,), 132, 2)]
    outs = [cuda_plan._Tensor(0, f32, (33,), 132, 3)] if out else None
    plan = cuda_plan.Plan(_Kernel(), _Context(), -1, 3, {}, inputs, [(0, float, None, "f32", 0)], outs,
                          [((33,), f32, 3)], [], torch.Tensor, "cpu", lambda device: 7, torch.empty, [launcher],
                          slots, "axpy")
    return plan, launcher, stand_in


def test_a_plan_writes_each_value_to_its_slot_and_checks_what_can_change(monkeypatch, rng):
    torch = pytest.importorskip("torch")
    plan, _, stand_in = _axpy_plan(monkeypatch, out=True)
    for _ in range(3):
        x, y, z = (torch.from_numpy(rng.standard_normal(33).astype(np.float32)) for _ in range(3))
        a = float(np.float32(rng.standard_normal()))
        stand_in.launches.clear()
        assert plan.run((a, x, y), {}, z) == [z]
        assert stand_in.launches == [(0x10, 1, 64, 7, [a, x.data_ptr(), y.data_ptr(), z.data_ptr()])]
    stand_in.launches.clear()
    misses = [((a, x, y), {}, x),  # out= overlapping an input: the checked path copies
              ((a, x.double(), y), {}, z), ((a, x[:32], y), {}, z), ((a, x, y), {}, z.double()),
              ((2, x, y), {}, z), ((a, x, y), {"P": 1}, z), ((a, x, y), {}, None),
              ((a, torch.randn(66)[::2], y), {}, z)]  # a strided input
    for args, cparams, out in misses:
        assert plan.run(args, cparams, out) is None
    assert stand_in.launches == []


def test_a_plan_allocates_results_and_drops_a_block_whose_launch_failed(monkeypatch, rng):
    torch = pytest.importorskip("torch")
    plan, launcher, stand_in = _axpy_plan(monkeypatch, out=False)
    x, y = (torch.from_numpy(rng.standard_normal(33).astype(np.float32)) for _ in range(2))
    good = launcher.block
    launcher.block = 4096
    with pytest.raises(TccRuntimeError, match="op axpy: launching kernel axpy"):
        plan.run((1.5, x, y), {}, None)
    launcher.block = good  # a block built while the kernel was wrong is not reused
    (z,) = plan.run((1.5, x, y), {}, None)
    assert z.shape == (33,) and z.dtype == torch.float32
    assert stand_in.launches == [(0x10, 1, 64, 7, [1.5, x.data_ptr(), y.data_ptr(), z.data_ptr()])]
