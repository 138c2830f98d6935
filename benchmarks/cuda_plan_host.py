"""The host work of a planned CUDA call, without a GPU: ``tcc.runtime.cuda_plan.Plan`` on CPU torch
tensors, cuLaunchKernel replaced by libc's ``labs`` called the same way (untyped, prebuilt
handles: it returns 0 for a null function). Beside it, the same stand-in called bare, as
``benchmarks/latency.py``'s bare-launch anchor calls the driver. The difference is the Python
work a call adds to a launch: checks, slots, the stream, the loop over kernels.

    python benchmarks/cuda_plan_host.py

Rows (medians of interleaved batches, thread CPU time): the bare stand-in; axpy with ``out=``;
axpy allocating its result (torch.empty on the CPU here, the caching allocator on a GPU); an op
of two kernels sharing an intermediate from the workspace, with ``out=``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import torch
from latency import per_call

from tcc.codegen_cuda import driver
from tcc.runtime import cuda_plan


def _stand_in() -> Callable[..., int]:
    fn = ctypes.CDLL(None)["labs"]
    fn.restype = ctypes.c_int
    return fn


def _launcher(names: list[str], codes: list[str]) -> driver.Launcher:
    """A Launcher as load_module makes it, its function null (the stand-in returns 0 for it)."""
    launcher = object.__new__(driver.Launcher)
    launcher.name, launcher.fn, launcher.grid, launcher.block, launcher.shared = "k", 0, 1, 256, 0
    launcher.names, launcher.fallback = names, None
    launcher.pointers = [i for i, c in enumerate(codes) if c == "p"]
    return launcher


class _Kernel:
    """What a plan reads of a CudaKernel: its intermediates, their lock and workspace."""

    def __init__(self, temps: list[tuple[str, int]]):
        self.temps, self.lock = temps, threading.Lock()

    def workspace(self, device: int, stream: int, op: str) -> list[int]:
        return [1 << 20] * len(self.temps)


def plan(kernels: int, out: bool) -> cuda_plan.Plan:
    """axpy (one kernel), or two kernels passing T between them."""
    f32 = torch.float32
    slots = {"a": 0, "X": 1, "Y": 2, "Z": 3, "T": 4}
    launchers = [_launcher(["a", "X", "Y", "Z"], ["f32", "p", "p", "p"])] if kernels == 1 else \
        [_launcher(["X", "T"], ["p", "p"]), _launcher(["Z", "T", "Y", "a"], ["p", "p", "p", "f32"])]
    inputs = [cuda_plan._Tensor(1, f32, (256,), 1024, 1), cuda_plan._Tensor(2, f32, (256,), 1024, 2)]
    outs = [cuda_plan._Tensor(0, f32, (256,), 1024, 3)] if out else None
    kernel = _Kernel([] if kernels == 1 else [("T", 1024)])
    return cuda_plan.Plan(kernel, None, -1, 3, {}, inputs, [(0, float, None, "f32", 0)], outs, [((256,), f32, 3)],
                          [] if kernels == 1 else [4], torch.Tensor, "cpu", lambda device: 0, torch.empty,
                          launchers, slots, "op")


def main() -> None:
    driver.raw_launch = _stand_in  # every argument block launches through the stand-in
    x, y, z = (torch.randn(256) for _ in range(3))
    args = (1.5, x, y)
    launch, fn, argv = _stand_in(), ctypes.c_void_p(0), ctypes.c_void_p(ctypes.addressof(ctypes.c_uint64()))
    plans = [plan(1, True), plan(1, False), plan(2, True)]
    assert plans[0].run(args, {}, z) == [z] and plans[1].run(args, {}, None) and plans[2].run(args, {}, z)
    empty = {}
    fns = [lambda: launch(fn, 1, 1, 1, 256, 1, 1, 0, None, argv, None),
           lambda: plans[0].run(args, empty, z), lambda: plans[1].run(args, empty, None),
           lambda: plans[2].run(args, empty, z)]
    bare, into, new, two = (t * 1e6 for t in per_call(fns, rounds=31, clock=time.thread_time))
    print(f"| bare stand-in launch | {bare:.2f} µs |\n| axpy, out= | {into:.2f} µs (+{into - bare:.2f}) |\n"
          f"| axpy, allocating | {new:.2f} µs |\n| two kernels + workspace, out= | {two:.2f} µs |")


if __name__ == "__main__":
    main()
