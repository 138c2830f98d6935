"""The fast path's argument block (tcc.codegen_cuda.driver.ArgumentBlock), without a GPU: what
each kernel would receive is read back through the parameter arrays a stand-in cuLaunchKernel is
given, on random values."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tcc.codegen_cuda import driver

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

    def __call__(self, fn, grid, gy, gz, block, by, bz, shared, stream, argv, extra) -> int:
        assert (gy, gz, by, bz, shared, extra) == (1, 1, 1, 1, 0, None)
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
    with pytest.raises(driver.TccRuntimeError, match="op op: launching kernel k"):
        block.launch(0, "op", 0)
