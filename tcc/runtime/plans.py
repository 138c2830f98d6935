"""Call plans shared by the backends: a few argument signatures remembered per op.

A backend's ``make_plan(kernel, op, bound, args, cparams, out, guard)`` turns one checked call into
a plan whose ``run(args, cparams, out)`` repeats it for calls of the same signature (and answers
None for any other); :class:`Plans` keeps the newest few and tries them most recent first. A call
that reads indices from data passes its ``guard`` (``tcc.runtime.index_checks.IndexGuard``): the
plan runs it before the kernels and answers None when an index is out of range, having written
nothing, so that the checked call names the index.

This is also the fast call path that interop builds on (``tcc.interop.torch`` and its C++): an
op's ``plans`` (newest first in ``plans.plans``), each describing its signature through
``plan.fast_path()``: a :class:`CpuFastPath` (the kernel's entry point, its argument slots and
pooled argument arrays) or a :class:`CudaFastPath` (each kernel's launch, the stream getter).
Those dataclasses are the interface; the plans' other attributes are the backends' own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

MAX_PLANS = 8  # argument signatures remembered per op


class Plan(Protocol):
    def run(self, args: tuple[Any, ...], cparams: dict[str, Any], out: Any) -> list[Any] | None: ...

    def fast_path(self) -> CpuFastPath | CudaFastPath: ...


@dataclass(frozen=True)
class FastTensor:
    """One tensor of a signature: its place among the call's arguments (a result: among the
    results) and among the kernel's argument slots, and the dtype and shape it must have."""

    pos: int
    slot: int
    dtype: Any  # the array's own dtype object (torch's or NumPy's), compared by identity
    shape: tuple[int, ...]
    numpy: bool = False  # a C-contiguous NumPy array; else a contiguous torch tensor


@dataclass(frozen=True)
class CpuFastPath:
    """A CPU plan's signature, for a caller that repeats it outside tcc's own call: take an
    argument array from ``pool`` (or ``new_buffer()``), write each input's and new result's data
    pointer into its slot and each scalar into its cell, call the kernel once (``call(address)``
    from Python, ``address`` from C), give the array back. A nonzero status is an allocation that
    failed inside the kernel (``tcc.runtime.cpu.raise_out_of_memory(name)`` says so)."""

    name: str  # the kernel's
    address: int  # its entry point, ``int kernel(void **args)``
    call: Callable[[int], int]  # the same through ctypes, given the address of an argument array
    nargs: int  # the op's arguments
    params: int  # the kernel's argument slots
    cparams: dict[str, Any]  # the compile-time parameters of the signature
    inputs: tuple[FastTensor, ...]
    scalars: tuple[tuple[int, int, type, type], ...]  # (argument position, slot, Python type, ctypes cell type)
    results: tuple[FastTensor, ...] | None  # the ``out=`` targets it was made for; None: the call allocates
    constants: bool  # it prepares buffers from constant parameters: only its plan's own ``run`` repeats it
    # free argument arrays, each (pointer array, [(position, Python type, int range or None, ctypes
    # cell)], the array's address): shared with the plan, so that threads never share one; a
    # dynamic kernel's shape symbols come last in the list, position -1, their cells set once
    pool: list[Any]
    new_buffer: Callable[[], Any]  # another argument array, when none is free
    symbols: int = 0  # the dynamic shape symbols the kernel reads (set in the arrays already)
    # the index checks: ``guard(pointer array)`` after the inputs' pointers and scalars are set,
    # False when an index is out of range (then call nothing: the op's own call names it);
    # ``guard.native()`` describes it to C++ (``tcc.runtime.cpu_guard.CpuGuard``)
    guard: Any = None


@dataclass(frozen=True)
class CudaLaunch:
    """One kernel of a CUDA signature: ``cuLaunchKernel(function, grid, 1, 1, block, 1, 1,
    shared, stream, params)``, each parameter's value taken from its position in (arguments,
    results) and written as its ctypes type (``c_uint64``: a device pointer)."""

    function: int  # the CUfunction
    grid: int
    block: int
    shared: int  # bytes of dynamic shared memory
    params: tuple[tuple[int, type], ...]  # (position in (arguments, results), ctypes type)
    fallback: CudaLaunch | None  # this kernel assumes 16-byte aligned pointers; else this one runs


@dataclass(frozen=True)
class CudaFastPath:
    """A CUDA plan's signature, for a caller that launches its kernels itself (on ``stream(device)``,
    the stream tcc's own calls use) with new result tensors of ``results``' shapes."""

    op: str  # the op's name, for errors
    device: int  # the CUDA device ordinal
    nargs: int
    cparams: dict[str, Any]
    inputs: tuple[FastTensor, ...]
    scalars: tuple[tuple[int, type], ...]  # (argument position, Python type)
    results: tuple[FastTensor, ...]  # the new results (``pos``: the result's index)
    allocates: bool  # made for calls without ``out=``
    intermediates: bool  # its kernels share a workspace that only the plan's own ``run`` provides
    launches: tuple[CudaLaunch, ...]
    launch_kernel: int  # the address of the driver's ``cuLaunchKernel``
    stream: Callable[[int], int]  # device -> the current raw stream of PyTorch
    synchronous: bool  # every call waits for its kernels (``TCC_CUDA_SYNC``, for debugging)
    checked: bool = False  # its calls check indices first, which only the plan's own ``run`` does


MakePlan = Callable[[Any, Any, Any, tuple[Any, ...], dict[str, Any], Any, Any], Plan | None]


def same_params(cparams: dict[str, Any], planned: dict[str, Any]) -> bool:
    """Whether a call's compile-time parameters are the plan's, in value and type."""
    if not cparams:
        return not planned
    return cparams.keys() == planned.keys() and all(
        type(v) is type(planned[k]) and v == planned[k] for k, v in cparams.items())


class Plans:
    """The plans of one op, newest first; a call runs the first that matches."""

    def __init__(self, make_plan: MakePlan) -> None:
        self.make_plan = make_plan
        self.plans: list[Plan] = []
        # run(args, cparams, out) -> results or None: the only plan's own run when there is one
        # (a Python call less per call), else the search below
        self.run: Callable[[tuple[Any, ...], dict[str, Any], Any], list[Any] | None] = self._first_match

    def __bool__(self) -> bool:
        return bool(self.plans)

    def _first_match(self, args: tuple[Any, ...], cparams: dict[str, Any], out: Any) -> list[Any] | None:
        plans = self.plans
        for plan in plans:
            results = plan.run(args, cparams, out)
            if results is not None:
                if plan is not plans[0]:  # most recently used first: a loop's calls match at once
                    self.plans = [plan, *(p for p in plans if p is not plan)]
                return results
        return None

    def learn(self, kernel: Any, op: Any, bound: Any, args: tuple[Any, ...], cparams: dict[str, Any],
              out: Any, guard: Any = None) -> None:
        """Remember a plan for calls like this checked one, where one can be made (running
        ``guard``, the call's index checks, where it has one)."""
        plan = self.make_plan(kernel, op, bound, args, cparams, out, guard)
        if plan is not None:
            self.plans = [plan, *self.plans[:MAX_PLANS - 1]]  # replaced whole: threads may be reading it
            self.run = plan.run if len(self.plans) == 1 else self._first_match
