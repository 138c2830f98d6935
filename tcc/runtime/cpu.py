"""The CPU target: build object code for a scheduled loop function, load it, call it."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from tcc.codegen_cpu import jit
from tcc.codegen_cpu.llvm_ir import build_module, symbol_name
from tcc.errors import TccRuntimeError, TccTypeError
from tcc.ir.loops import Buffer, LoopFunc
from tcc.passes import autoschedule
from tcc.target import CpuTarget

STAGES = ("ast", "te", "fused", "loops", "scheduled", "llvm", "asm")


def machine(options: dict[str, Any]) -> CpuTarget:
    """The host as the auto-scheduler sees it: CPU, features, threads and cache sizes."""
    triple, cpu, features = jit.host()
    return CpuTarget(triple, cpu, features, autoschedule.threads(), tuple(sorted(autoschedule.host_caches().items())))


def host_key(options: dict[str, Any]) -> str:
    return machine(options).key()


def llvm_ir(func: LoopFunc) -> str:
    return str(build_module(func))


def build(func: LoopFunc, options: dict[str, Any] | None = None) -> bytes:
    """Optimised object code for ``func``: the artifact the cache stores."""
    return jit.emit_object(jit.optimize(llvm_ir(func)))


def assembly(func: LoopFunc) -> str:
    return jit.emit_assembly(jit.optimize(llvm_ir(func)))


class CpuKernel:
    """A loaded kernel and the layout of its argument array."""

    def __init__(self, func: LoopFunc, artifact: bytes):
        self.name = func.name
        self.params = [(p.name, isinstance(p, Buffer)) for p in func.params]
        self._dtypes = {p.name: p.dtype for p in func.params}
        self._object = jit.LoadedObject(artifact)
        self._fn = self._object.function(symbol_name(func))

    def __call__(self, values: dict[str, Any]) -> None:
        """Run on ``values``: C-contiguous arrays for buffers, Python numbers for scalars."""
        keep = []
        ptrs = (ctypes.c_void_p * len(self.params))()
        for i, (name, is_buffer) in enumerate(self.params):
            value = values[name]
            if not is_buffer:
                value = np.array(value, dtype=self._dtypes[name].numpy)
                keep.append(value)
            ptrs[i] = value.ctypes.data
        status = self._fn(ptrs)
        if status != 0:
            raise TccRuntimeError(f"op {self.name}: out of memory for an intermediate tensor",
                                  hint="use smaller inputs")


def as_array(value: Any, what: str) -> np.ndarray:
    from tcc.runtime.binding import as_host_array

    return as_host_array(value, what)


def load(func: LoopFunc, artifact: bytes) -> CpuKernel:
    return CpuKernel(func, artifact)


def stage_text(func: LoopFunc, stage: str, options: dict[str, Any]) -> str:
    return llvm_ir(func) if stage == "llvm" else assembly(func)


def invoke(kernel: CpuKernel, op, bound, out: Any) -> list[np.ndarray]:
    """Run ``kernel`` on a bound call; writes into ``out`` when given (checked first)."""
    for name in op.results:
        if op.tensors[name].dtype.name == "bf16":  # code generation refuses bf16, unless nothing is computed
            raise TccTypeError(f"result {name} is bf16, which is supported on target='cuda' only",
                               op.tensors[name].span, "use f32 or f16 on the CPU")
    outs = _check_out(op, bound, out)
    values: dict[str, Any] = dict(bound.scalars)
    inputs = []
    for name, arr in bound.arrays.items():
        contiguous = np.ascontiguousarray(arr)
        values[name] = contiguous
        inputs.append(contiguous)
    results, copies = [], []
    for name, target in zip(op.results, outs):
        shape, dtype = bound.result_shapes[name], op.tensors[name].dtype.numpy
        direct = (target is not None and target.flags.c_contiguous and target.flags.writeable
                  and not any(np.may_share_memory(target, a) for a in inputs))
        buf = target if direct else _allocate(op, name, shape, dtype)
        if target is not None and not direct:
            copies.append((target, buf))
        values[name] = buf
        results.append(target if target is not None else buf)
    kernel(values)
    for target, buf in copies:
        np.copyto(target, buf)
    return results


ALIGN = 64  # bytes: a cache line, so that large results take non-temporal vector stores
ALIGN_FROM = 1 << 20  # smaller results are plain np.empty (the alignment costs a few us a call)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty`` starting on a cache line when large (NumPy's large blocks start 16 bytes
    into a page)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < ALIGN_FROM:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _allocate(op, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    try:
        return aligned_empty(shape, dtype)
    except (MemoryError, ValueError) as exc:
        raise TccRuntimeError(f"cannot allocate result {name} of {op.name}: {dtype.name}{list(shape)} "
                              f"({exc})", op.tensors[name].span, "use smaller inputs") from None


def _check_out(op, bound, out: Any) -> list[np.ndarray | None]:
    from tcc.errors import TccArgumentError
    from tcc.runtime.binding import out_list

    outs = out_list(op, out)
    if out is None:
        return outs
    for name, target in zip(op.results, outs):
        want_shape, want = bound.result_shapes[name], op.tensors[name].dtype
        if not isinstance(target, np.ndarray):
            raise TccArgumentError(f"out= for {name} must be a NumPy array on target='cpu'", op.span)
        if target.shape != want_shape or target.dtype != want.numpy:
            raise TccArgumentError(f"out= for {name} must be {want}{list(want_shape)}, got "
                                   f"{target.dtype}{list(target.shape)}", op.tensors[name].span)
        if not target.flags.writeable:
            raise TccArgumentError(f"out= for {name} is read-only", op.tensors[name].span)
    return outs
