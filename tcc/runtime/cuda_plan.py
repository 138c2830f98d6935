"""The CUDA backend's repeat-call fast path: a plan per argument signature of PyTorch CUDA tensors.

A checked call (``tcc.runtime.cuda.invoke``) leaves a :class:`Plan`; a repeat call with the same
signature checks only what can change (each tensor's type, dtype, device, shape, contiguity; each
scalar's type and range), writes each value once into its slot of an argument block and launches.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tcc.codegen_cuda import driver
from tcc.ir.loops import GUARD_PARAM
from tcc.runtime.cuda_guard import CudaGuard
from tcc.runtime.cuda_tensors import DeviceTensor, as_array, torch_dtypes
from tcc.runtime.index_checks import IndexGuard
from tcc.runtime.plans import CudaFastPath, CudaLaunch, FastTensor, same_params

SYNC = os.environ.get("TCC_CUDA_SYNC", "") not in ("", "0")  # debugging: synchronise after every call
_INT_RANGES = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1), "i8": (-128, 127)}

class _Tensor(NamedTuple):
    """What a plan expects of one torch CUDA tensor argument (or ``out=`` target), and its slot."""

    pos: int  # in the call's arguments (or ``out=``)
    dtype: Any  # a torch dtype, compared by identity
    shape: tuple[int, ...]
    nbytes: int
    slot: int  # in the argument block


@dataclass
class Plan:
    """What a repeat call with the same argument signature needs: no binding, no checks redone.

    Made only after a call with that signature passed every check, for contiguous PyTorch CUDA
    tensors and Python scalars (others take the checked path). It checks its own signature as
    it writes each value into its slot of an argument block (:class:`driver.ArgumentBlock`: the
    kernels' parameter arrays built once), then launches the kernels: no dictionary, no context
    query (a launch refused for want of the context makes it current and retries), intermediates
    from the kernel's workspace for the stream.
    """

    kernel: Any
    context: driver.Context
    device: int
    nargs: int
    cparams: dict[str, Any]
    inputs: list[_Tensor]
    scalars: list[tuple[int, type, tuple[int, int] | None, str, int]]  # (position, Python type, int range,
    # parameter code, slot)
    outs: list[_Tensor] | None  # None: the call allocates its results
    results: list[tuple[tuple[int, ...], Any, int]]  # (shape, torch dtype, slot) of each new result
    temp_slots: list[int]  # the slots of the intermediates
    tensor: type  # torch.Tensor
    torch_device: Any
    stream: Callable[[int], int]  # the device's current raw stream
    empty: Callable[..., Any]  # torch.empty
    launchers: list[driver.Launcher]
    slots: dict[str, int]
    op: str
    pool: list[tuple[driver.ArgumentBlock, list[tuple[int, type, Any, memoryview, int]]]] = \
        field(default_factory=list)  # argument blocks not in use, each with its scalars' setters
    guard: CudaGuard | None = None  # the index checks, run on the device before the kernels
    guard_copies: list[tuple[int, int]] = field(default_factory=list)  # (guard slot, slot) of what they read

    def __post_init__(self) -> None:
        self.spans = [(t.slot, t.nbytes) for t in self.inputs]  # for the overlap checks of out=
        self.guard_slot = self.slots.get(GUARD_PARAM, -1)

    def fast_path(self) -> CudaFastPath:
        """This signature for callers that launch its kernels themselves (tcc.interop.torch's C++)."""
        def launch(launcher: driver.Launcher) -> CudaLaunch:
            params = tuple((self.slots[name], type(cell)) for name, cell in zip(launcher.names, launcher.slots))
            fallback = None if launcher.fallback is None else launch(launcher.fallback)
            return CudaLaunch(launcher.fn, launcher.grid, launcher.block, launcher.shared, params, fallback)
        return CudaFastPath(self.op, self.device, self.nargs, self.cparams,
                            tuple(FastTensor(t.pos, t.slot, t.dtype, tuple(t.shape)) for t in self.inputs),
                            tuple((pos, kind) for pos, kind, *_ in self.scalars),
                            tuple(FastTensor(i, slot, dtype, tuple(shape))
                                  for i, (shape, dtype, slot) in enumerate(self.results)),
                            self.outs is None, bool(self.kernel.temps), tuple(map(launch, self.launchers)),
                            driver.launch_kernel_address(), self.stream, SYNC, self.guard is not None)

    def new_block(self) -> tuple[driver.ArgumentBlock, list[tuple[int, type, Any, memoryview, int]]]:
        block = driver.ArgumentBlock(self.launchers, self.slots, self.context)
        return block, [(pos, kind, bounds, *block.setter(code, slot)) for pos, kind, bounds, code, slot in self.scalars]

    def run(self, args: tuple[Any, ...], cparams: dict[str, Any], out: Any) -> list[Any] | None:
        """The results, or None when this call's signature differs from the plan's, ``out=`` overlaps
        an input, or a scalar is out of range (the checked path handles those)."""
        if len(args) != self.nargs or (out is None) != (self.outs is None):
            return None
        if (cparams or self.cparams) and not same_params(cparams, self.cparams):
            return None
        try:
            entry = self.pool.pop()
        except IndexError:  # none free: the first call, or other threads hold them all
            entry = self.new_block()
        try:
            block, setters = entry
            words, device, tensor = block.words, self.device, self.tensor
            for pos, kind, bounds, view, index in setters:
                value = args[pos]
                if type(value) is not kind or (bounds is not None and not bounds[0] <= value <= bounds[1]):
                    return None
                try:
                    view[index] = value
                except ValueError:  # an int beyond f64's range for an f32 scalar: the checked path says so
                    return None
            bits = 0  # every pointer written, or-ed: misaligned ones show in the low bits
            for pos, dtype, shape, _, slot in self.inputs:
                a = args[pos]
                if not (isinstance(a, tensor) and a.dtype is dtype and a.get_device() == device and a.shape == shape
                        and a.is_contiguous()):
                    return None
                words[slot] = ptr = a.data_ptr()
                bits |= ptr
            results, result_bits = self._results(out, words) if out is not None else self._new_results(words)
            if results is None:
                return None
            bits |= result_bits
            stream = self.stream(device)
            try:
                if self.guard is None:
                    self._launch(block, stream, bits)
                elif not self.guard.around_words(words, self.guard_copies, stream, self.op,
                                                 lambda count: self._launch(block, stream, bits, count)):
                    results.clear()  # an index out of range: nothing written, the checked call names it
                    return None
            except BaseException:
                results.clear()  # the traceback must not keep new result tensors alive
                entry = None  # nor is the block kept: the next call builds one from the kernels as they are then
                raise
        finally:
            if entry is not None:
                self.pool.append(entry)
        if SYNC:
            driver.synchronize(stream, f"op {self.op}: running its kernels")
        return results

    def _launch(self, block: driver.ArgumentBlock, stream: int, bits: int, count: int = 0) -> None:
        """Launch the kernels; ``count``: the index guard's device count, which they read (if guarded)."""
        if self.guard is not None:
            block.words[self.guard_slot] = count
        if not self.kernel.temps:  # (read each call, like the checked path)
            block.launch(stream, self.op, bits & 15)
            return
        with self.kernel.lock:  # one call's kernels queued together on the stream's workspace
            for slot, ptr in zip(self.temp_slots, self.kernel.workspace(self.device, stream, self.op)):
                block.words[slot] = ptr
            block.launch(stream, self.op, bits & 15)

    def _new_results(self, words: memoryview) -> tuple[list[Any], int]:
        """New result tensors, their pointers written; and those pointers or-ed."""
        results, bits = [], 0
        for shape, dtype, slot in self.results:
            r = self.empty(shape, dtype=dtype, device=self.torch_device)
            words[slot] = ptr = r.data_ptr()
            bits |= ptr
            results.append(r)
        return results, bits

    def _results(self, out: Any, words: memoryview) -> tuple[list[Any] | None, int]:
        """The ``out=`` targets, their pointers written, and those pointers or-ed; (None, 0) when they
        differ from the plan's or one overlaps an input."""
        results = [out] if type(out) is not tuple and type(out) is not list else list(out)
        if len(results) != len(self.outs):
            return None, 0
        device, tensor, bits = self.device, self.tensor, 0
        for (_, dtype, shape, nbytes, slot), r in zip(self.outs, results):
            if not (isinstance(r, tensor) and r.dtype is dtype and r.get_device() == device and r.shape == shape
                    and r.is_contiguous()):
                return None, 0
            ptr = r.data_ptr()
            end = ptr + nbytes
            for input_slot, input_bytes in self.spans:  # an input overlapping the result: the checked path copies
                start = words[input_slot]
                if start < end and ptr < start + input_bytes:
                    return None, 0
            words[slot] = ptr
            bits |= ptr
        return results, bits


def make_plan(kernel: Any, op, bound, args: tuple[Any, ...], cparams: dict[str, Any],
              out: Any, guard: IndexGuard | None = None) -> Plan | None:
    """The plan for calls like this checked one, running ``guard`` first (None when it has no
    fast path)."""
    torch = sys.modules.get("torch")
    arrays = list(bound.arrays.values())
    if torch is None or not arrays or any(not isinstance(a, DeviceTensor) or a.kind != "torch"
                                          or not a.contiguous for a in arrays):
        return None
    device = arrays[0].device
    position = {name: i for i, name in enumerate(op.params)}
    if any(type(args[position[n]]) not in (float, int, bool) for n in bound.scalars):
        return None
    guarded = [GUARD_PARAM] if guard is not None else []
    slots = {name: i for i, name in enumerate([*op.params, *op.results, *(n for n, _ in kernel.temps), *guarded])}
    inputs = [_Tensor(position[n], a.owner.dtype, tuple(a.shape), a.nbytes, slots[n]) for n, a in bound.arrays.items()]
    outs = None
    if out is not None:
        targets = list(out) if type(out) in (tuple, list) else [out]
        outs = []
        for i, (name, target) in enumerate(zip(op.results, targets)):
            view = as_array(target, "out=")
            if not (isinstance(view, DeviceTensor) and view.kind == "torch" and view.contiguous):
                return None
            outs.append(_Tensor(i, target.dtype, tuple(view.shape), view.nbytes, slots[name]))
    scalars = []
    for n in bound.scalars:
        kind = op.scalars[n].dtype.name
        scalars.append((position[n], type(args[position[n]]), _INT_RANGES.get(kind), kind, slots[n]))
    inverse = {v: k for k, v in torch_dtypes().items()}
    results = [(bound.result_shapes[r], inverse[op.tensors[r].dtype], slots[r]) for r in op.results]
    checks = None if guard is None else CudaGuard.on(guard, device)
    return Plan(kernel, driver.context(device), device, len(args), dict(cparams), inputs, scalars, outs, results,
                [slots[n] for n, _ in kernel.temps], torch.Tensor, torch.device("cuda", device), stream_getter(),
                torch.empty, kernel.launchers(device), slots, op.name, guard=checks,
                guard_copies=[] if checks is None else checks.copies(slots))


@functools.cache
def stream_getter() -> Any:
    """The fastest way to read PyTorch's current raw stream of a device: ``getter(device) -> stream``,
    the stream CUDA plans launch on (public: the torch C++ eager path launches on it too)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def raw_stream(device: int) -> int:
    return int(stream_getter()(device))
