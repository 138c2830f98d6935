"""The CPU target: build object code for a scheduled loop function, load it, call it.

The artifact the cache stores is self-describing (the kernel's symbol and parameter layout in a
small header, then the object code), so a warm start loads it without running any pass. A
checked call leaves a :class:`Plan` behind; a repeat call with the same argument signature runs
it: a few attribute reads, one foreign call.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tcc import dtypes
from tcc.codegen_cpu import jit
from tcc.codegen_cpu.llvm_ir import build_module, symbol_name
from tcc.errors import TccArgumentError, TccCompileError, TccRuntimeError, TccTypeError
from tcc.ir.loops import Buffer, For, LoopFunc, walk_stmts
from tcc.passes.pipeline import cpu_schedule
from tcc.runtime.backend import Backend
from tcc.runtime.binding import as_host_array, out_list
from tcc.runtime.cache import pack_artifact, unpack_artifact
from tcc.runtime.cpu_guard import CpuGuard
from tcc.runtime.cpu_guard import passes as guard_passes
from tcc.runtime.index_checks import IndexGuard
from tcc.runtime.plans import CpuFastPath, FastTensor, same_params
from tcc.runtime.prepared import Prepared
from tcc.target import CpuTarget

STAGES = ("ast", "te", "fused", "loops", "scheduled", "llvm", "asm")
_MAGIC = b"TCC-CPU-1\n"


def machine(given: CpuTarget | None = None, options: Mapping[str, Any] | None = None) -> CpuTarget:
    """The machine to compile for: the CpuTarget given to tcc.compile, else this host (its CPU and
    features, the cores this process may use, its cache sizes). Kernels run here, so a given
    target may not ask for features this CPU lacks (it may leave some out: AVX2 code on an
    AVX-512 host)."""
    if given is None:
        return CpuTarget.of_host(*jit.host())
    missing = {f for f in given.features.split(",") if f.startswith("+")} - set(jit.host()[2].split(","))
    if missing:
        raise TccArgumentError(f"CpuTarget features {', '.join(sorted(missing))} are not on this CPU",
                               hint="kernels run on this machine: drop those features (or give none)")
    return given


def llvm_ir(func: LoopFunc, target: CpuTarget) -> str:
    return str(build_module(func, target))


def build(func: LoopFunc, target: CpuTarget | None = None) -> bytes:
    """The artifact the cache stores: the kernel's symbol and parameters, then object code for
    ``target`` (this host where none is given)."""
    target = target or machine()
    params = [[p.name, isinstance(p, Buffer), p.dtype.name] for p in func.params]
    level = llvm_level(func)
    obj = jit.emit_object(jit.optimize(llvm_ir(func, target), target, level), target, level)
    meta: dict[str, Any] = {"symbol": symbol_name(func), "params": params}
    prepare = func.attrs.get("prepare")
    if isinstance(prepare, LoopFunc):  # work on constant parameters, hoisted out of the kernel
        count = int(prepare.attrs["sources"])  # type: ignore[call-overload]
        meta["prepare"] = {"symbol": symbol_name(prepare), "sources": [p.name for p in prepare.params[:count]],
                           "buffers": [[p.name, p.dtype.name, list(p.shape)] for p in prepare.params[count:]]}
    return pack_artifact(_MAGIC, meta, obj)


def llvm_level(func: LoopFunc) -> jit.Level:
    """LLVM's full effort, or less where tcc's schedule already vectorised the loops."""
    vectorized = any(isinstance(s, For) and s.kind == "vector" for s in walk_stmts(func.body))
    return jit.VECTORIZED if vectorized else jit.FULL


def _parse(artifact: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, object code) of an artifact; TccCompileError when it is not one of ours."""
    try:
        meta, obj = unpack_artifact(_MAGIC, artifact)
        params = [(str(n), bool(b), dtypes.ALL[d]) for n, b, d in meta["params"]]
        prepare = meta.get("prepare")
        if prepare is not None:
            prepare = {"symbol": str(prepare["symbol"]), "sources": [str(n) for n in prepare["sources"]],
                       "buffers": [(str(n), dtypes.ALL[d].numpy, tuple(int(x) for x in shape))
                                   for n, d, shape in prepare["buffers"]]}
        return {"symbol": str(meta["symbol"]), "params": params, "prepare": prepare}, obj
    except (ValueError, KeyError, TypeError) as exc:
        raise TccCompileError(f"unusable cached CPU kernel ({exc})") from None


def assembly(func: LoopFunc, target: CpuTarget) -> str:
    level = llvm_level(func)
    return jit.emit_assembly(jit.optimize(llvm_ir(func, target), target, level), target, level)


class CpuKernel:
    """A loaded kernel and the layout of its argument array."""

    def __init__(self, name: str, artifact: bytes):
        meta, obj = _parse(artifact)
        self.name = name
        self.params = [(n, is_buffer) for n, is_buffer, _ in meta["params"]]
        self.dtypes = {n: dt for n, _, dt in meta["params"]}
        self._object = jit.LoadedObject(obj)
        self.fn = self._object.function(meta["symbol"])
        prepare = meta["prepare"]
        self.prepared = None if prepare is None else Prepared(
            self._object.function(prepare["symbol"]), prepare["sources"], prepare["buffers"])

    @property
    def address(self) -> int:
        """The kernel's entry point, ``int kernel(void **args)``: what a caller outside Python (the
        torch C++ eager path) calls with the argument array a :class:`Plan` lays out."""
        return int(ctypes.cast(self.fn, ctypes.c_void_p).value or 0)

    def prepare(self, values: dict[str, Any], objects: tuple[Any, ...]) -> None:
        """Add the prepared buffers to ``values`` (made now from its constant parameters, unless
        made before for ``objects``: the caller's arguments for them)."""
        if self.prepared is not None:
            made = self.prepared.arrays(objects, [values[n].ctypes.data for n in self.prepared.sources])
            values.update(zip(self.prepared.names, made))

    def __call__(self, values: dict[str, Any]) -> None:
        """Run on ``values``: C-contiguous arrays for buffers, Python numbers for scalars."""
        keep = []
        ptrs = (ctypes.c_void_p * len(self.params))()
        for i, (name, is_buffer) in enumerate(self.params):
            value = values[name]
            if not is_buffer:
                value = np.array(value, dtype=self.dtypes[name].numpy)
                keep.append(value)
            ptrs[i] = value.ctypes.data
        if self.fn(ptrs) != 0:
            raise_out_of_memory(self.name)


def raise_out_of_memory(name: str) -> None:
    raise TccRuntimeError(f"op {name}: out of memory for an intermediate tensor", hint="use smaller inputs")


def as_array(value: Any, what: str) -> np.ndarray:
    return as_host_array(value, what)


def load(name: str, artifact: bytes) -> CpuKernel:
    return CpuKernel(name, artifact)


def stage_text(func: LoopFunc, stage: str, target: CpuTarget) -> str:
    return llvm_ir(func, target) if stage == "llvm" else assembly(func, target)


def invoke(kernel: CpuKernel, op, bound, out: Any, guard: IndexGuard | None = None) -> list[Any] | None:
    """Run ``kernel`` on a bound call; writes into ``out`` when given (checked first). None, with
    nothing written, when ``guard`` (the call's index checks) finds an index out of range."""
    for name in op.results:
        if op.tensors[name].dtype.name == "bf16":  # code generation refuses bf16, unless nothing is computed
            raise TccTypeError(f"result {name} is bf16, which is supported on target='cuda' only",
                               op.tensors[name].span, "use f32 or f16 on the CPU")
    targets, views = _check_out(op, bound, out)
    values: dict[str, Any] = dict(bound.scalars)
    values.update(dynamic_values(kernel, bound))
    inputs = []
    for name, arr in bound.arrays.items():
        contiguous = _contiguous(op, name, arr)
        values[name] = contiguous
        inputs.append(contiguous)
    if guard is not None and not guard_passes(guard, values):
        return None
    if kernel.prepared is not None:
        position = {name: i for i, name in enumerate(op.params)}
        try:
            kernel.prepare(values, tuple(bound.args[position[n]] for n in kernel.prepared.sources))
        except MemoryError:
            raise TccRuntimeError(f"op {op.name}: out of memory preparing the constant parameters "
                                  f"{', '.join(kernel.prepared.sources)}", op.span, "use smaller inputs") from None
    results, copies = [], []
    for name, target, view in zip(op.results, targets, views):
        shape, dtype = bound.result_shapes[name], op.tensors[name].dtype.numpy
        direct = (view is not None and view.flags.c_contiguous
                  and not any(np.may_share_memory(view, a) for a in inputs))
        buf = view if direct else _allocate(op, name, shape, dtype)
        if view is not None and not direct:
            copies.append((view, buf))
        values[name] = buf
        results.append(target if target is not None else buf)
    kernel(values)
    for view, buf in copies:
        np.copyto(view, buf)
    return results


def dynamic_values(kernel: CpuKernel, bound) -> dict[str, int]:
    """The values of the dynamic shape symbols a kernel reads (its scalar parameters that are
    not the op's): this call's bindings."""
    return {name: bound.bindings[name] for name, is_buffer in kernel.params
            if not is_buffer and name not in bound.scalars and name in bound.bindings}


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


def _contiguous(op, name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` C-contiguous (a strided input is copied: memory that may not be there)."""
    try:
        return np.ascontiguousarray(arr)
    except MemoryError:
        raise TccRuntimeError(f"op {op.name}: out of memory copying the strided argument {name} "
                              f"({arr.dtype}{list(arr.shape)}) to contiguous memory", op.tensors[name].span,
                              "pass a C-contiguous array (no copy) or use smaller inputs") from None


def _check_out(op, bound, out: Any) -> tuple[list[Any], list[np.ndarray | None]]:
    """The caller's ``out=`` objects and NumPy views of them (a CPU tensor is viewed, not copied)."""
    targets = out_list(op, out)
    if out is None:
        return targets, targets
    views = []
    for name, target in zip(op.results, targets):
        want_shape, want = bound.result_shapes[name], op.tensors[name].dtype
        if isinstance(target, np.ndarray):
            view = target
        elif _is_torch_tensor(target):
            view = as_host_array(target, f"out= for {name}")
        else:
            raise TccArgumentError(f"out= for {name} must be a NumPy array or a CPU tensor on target='cpu', "
                                   f"got {type(target).__name__}", op.tensors[name].span)
        if view.shape != want_shape or view.dtype != want.numpy:
            raise TccArgumentError(f"out= for {name} must be {want}{list(want_shape)}, got "
                                   f"{view.dtype}{list(view.shape)}", op.tensors[name].span)
        if not view.flags.writeable:
            raise TccArgumentError(f"out= for {name} is read-only", op.tensors[name].span)
        views.append(view)
    return targets, views


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # only a program that imported torch can pass a tensor
    return torch is not None and isinstance(value, torch.Tensor)


# ---------------------------------------------------------------- the repeat-call fast path

_DATA = object.__basicsize__  # offset of ``data`` in NumPy's PyArrayObject: right after the object header
# The process's memory as 64-bit words, to read an array's data pointer: ``_WORDS[(id(a) + _DATA) >> 3]``
# costs a third of ``ctypes.c_void_p.from_address(...).value`` (~100 ns against ~300; a call reads one
# per array). Objects are 16-byte aligned, so the field is a whole word; the probe below checks it.
_WORDS = memoryview((ctypes.c_char * (sys.maxsize >> 3 << 3)).from_address(0)).cast("B").cast("Q")
_SCALAR_CELLS = {"f32": ctypes.c_float, "f64": ctypes.c_double, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
                 "i8": ctypes.c_int8, "bool": ctypes.c_bool}
_INT_RANGES = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1), "i8": (-128, 127)}

_C_WRITEABLE = 0x401  # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE, in ``ndarray.flags.num``
_NDARRAY = np.ndarray  # a module global: read faster than np.ndarray in the plan's checks


def _pointer_offset_holds() -> bool:
    """Whether an ndarray's data pointer is the word at ``_DATA`` (CPython's layout) and its flags
    read as one number (a writeable C-contiguous target in one test); else no fast path."""
    probe = np.arange(3, dtype=np.float32)
    frozen = probe[::2]
    frozen.flags.writeable = False
    return (_DATA % 8 == 0 and all(id(a) % 8 == 0 for a in (probe, frozen))
            and all(_WORDS[(id(a) + _DATA) >> 3] == a.__array_interface__["data"][0] for a in (probe, frozen))
            and probe.flags.num & _C_WRITEABLE == _C_WRITEABLE and frozen.flags.num & _C_WRITEABLE == 0)


_FAST_POINTERS = _pointer_offset_holds()


class _Miss(Exception):
    """A call whose signature differs from a plan's."""


class _Tensor(NamedTuple):
    """What a plan expects of one array argument (or ``out=`` target) and where its pointer goes.
    A tuple: its fields read as fast as a tuple's items."""

    slot: int  # in the kernel's argument array
    pos: int  # in the call's arguments (or ``out=``)
    numpy: bool  # an np.ndarray, exactly; else a CPU torch.Tensor
    kind: type  # np.ndarray or torch.Tensor (so that torch is not looked up a call)
    dtype: Any  # compared by identity
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, compared for NumPy; a torch tensor is checked for contiguity
    nbytes: int


def _pointer(t: _Tensor, a: Any) -> int:
    """The data pointer of ``a`` after checking that it matches ``t``; raises _Miss otherwise. The
    plan reads an array's or a tensor's pointer inline; this is the general case (it raises)."""
    if t.numpy:
        if type(a) is not np.ndarray or a.dtype is not t.dtype or a.shape != t.shape or a.strides != t.strides:
            raise _Miss
        return _WORDS[(id(a) + _DATA) >> 3]
    if (type(a) is not t.kind or a.dtype is not t.dtype or a.shape != t.shape or not a.is_contiguous()
            or not a.is_cpu or a.requires_grad):
        raise _Miss
    return a.data_ptr()


def _tensor(slot: int, pos: int, a: Any) -> _Tensor | None:
    if type(a) is np.ndarray and a.flags.c_contiguous:
        return _Tensor(slot, pos, True, np.ndarray, a.dtype, a.shape, a.strides, a.nbytes)
    torch = sys.modules.get("torch")
    if torch is not None and type(a) is torch.Tensor and a.is_contiguous():
        nbytes = a.numel() * a.element_size()
        return _Tensor(slot, pos, False, torch.Tensor, a.dtype, tuple(a.shape), a.stride(), nbytes)
    return None


@dataclass
class Plan:
    """What a repeat call with the same argument signature needs: no binding, no checks redone.

    Made only after a call with that signature passed every check, for C-contiguous NumPy arrays
    and CPU tensors (others take the checked path, which copies a strided input). It checks its
    own signature as it reads pointers, then makes one foreign call. Argument arrays are pooled,
    so that threads calling the same op never share one.
    """

    kernel: CpuKernel
    nargs: int
    cparams: dict[str, Any]
    inputs: list[_Tensor]
    scalars: list[tuple[int, type, Any, tuple[int, int] | None]]  # (position, Python type, cell type, int range)
    slots: list[int]  # of the scalars
    outs: list[_Tensor] | None  # None: the call allocates its results
    results: list[tuple[int, tuple[int, ...], np.dtype, int]]  # (slot, shape, dtype, bytes)
    constants: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
    # (positions of the constant arguments, their slots, the prepared buffers' slots): see run
    pool: list[tuple[Any, list[Any], int]] = field(default_factory=list)  # (argument array, scalar cells, address)
    symbols: list[tuple[int, int]] = field(default_factory=list)  # (slot, value): dynamic shape symbols
    guard: CpuGuard | None = None  # the index checks, run on the argument array before the kernel

    def new_buffer(self) -> tuple[Any, list[tuple[int, type, tuple[int, int] | None, Any]], int]:
        """An argument array and its scalar cells (each cell's address already in its slot)."""
        ptrs = (ctypes.c_void_p * len(self.kernel.params))()
        cells = []
        for slot, (pos, kind, cell_type, bounds) in zip(self.slots, self.scalars):
            cell = cell_type()
            ptrs[slot] = ctypes.addressof(cell)
            cells.append((pos, kind, bounds, cell))
        for slot, value in self.symbols:  # the same for every call of this signature: set once
            cell = ctypes.c_int64(value)
            ptrs[slot] = ctypes.addressof(cell)
            cells.append((-1, None, None, cell))
        return ptrs, cells, ctypes.addressof(ptrs)  # an address passes faster than the array

    def fast_path(self) -> CpuFastPath:
        """This signature for callers outside tcc's own call (tcc.interop.torch and its C++)."""
        def tensor(t: _Tensor) -> FastTensor:
            return FastTensor(t.pos, t.slot, t.dtype, tuple(t.shape), t.numpy)
        scalars = tuple((pos, slot, kind, cell) for slot, (pos, kind, cell, _) in zip(self.slots, self.scalars))
        return CpuFastPath(self.kernel.name, self.kernel.address, self.kernel.fn, self.nargs, len(self.kernel.params),
                           self.cparams, tuple(map(tensor, self.inputs)), scalars,
                           None if self.outs is None else tuple(map(tensor, self.outs)), self.constants is not None,
                           self.pool, self.new_buffer, len(self.symbols), self.guard)

    def __post_init__(self) -> None:
        self.single_out = self.outs[0] if self.outs is not None and len(self.outs) == 1 else None
        t = self.single_out
        self.numpy_out = (t.dtype, t.shape, t.nbytes, t.slot) if t is not None and t.numpy else None
        self.input_ranges = [(t.slot, t.nbytes) for t in self.inputs]  # for _outs' overlap checks

    def _outs(self, out: Any, ptrs: Any) -> list[Any] | None:
        """``out=`` targets in general (several, or torch tensors), their pointers set; None on a
        mismatch or an overlap with an input."""
        results = [out] if type(out) is not tuple and type(out) is not list else list(out)
        if len(results) != len(self.outs):
            return None
        for t, r in zip(self.outs, results):
            if (t.numpy and type(r) is np.ndarray and r.dtype is t.dtype and r.shape == t.shape
                    and r.strides == t.strides):
                ptr = _WORDS[(id(r) + _DATA) >> 3]
                if not r.flags.writeable:
                    return None
            elif (type(r) is t.kind and not t.numpy and r.dtype is t.dtype and r.shape == t.shape
                  and r.is_contiguous() and r.is_cpu and not r.requires_grad):  # a torch.Tensor
                ptr = r.data_ptr()
            else:
                ptr = _pointer(t, r)
            for slot, nbytes in self.input_ranges:
                start = ptrs[slot] or 0
                if start < ptr + t.nbytes and ptr < start + nbytes:
                    return None
            ptrs[t.slot] = ptr
        return results

    def run(self, args: tuple[Any, ...], cparams: dict[str, Any], out: Any) -> list[Any] | None:
        """The results, or None when this call's signature differs from the plan's, ``out=``
        overlaps an input, or an integer scalar is out of range (the checked path handles those)."""
        if len(args) != self.nargs or (out is None) != (self.outs is None):
            return None
        if (cparams or self.cparams) and not same_params(cparams, self.cparams):
            return None
        try:
            buffer = self.pool.pop()
        except IndexError:  # none free: the first call, or other threads hold them all
            buffer = self.new_buffer()
        ptrs, cells, address = buffer
        try:
            for pos, kind, bounds, cell in cells:
                if pos < 0:
                    break  # (the symbols' cells, last: set once)
                value = args[pos]
                if type(value) is not kind or (bounds is not None and not bounds[0] <= value <= bounds[1]):
                    return None
                cell.value = value
            results, low, high = None, 0, 0  # [low, high): a single out='s bytes, checked first
            t = self.single_out
            if type(out) is _NDARRAY and self.numpy_out is not None:  # the common out=: inline
                dtype, shape, nbytes, slot = self.numpy_out
                if out.dtype is not dtype or out.shape != shape or out.flags.num & _C_WRITEABLE != _C_WRITEABLE:
                    return None
                low = _WORDS[(id(out) + _DATA) >> 3]
                high = low + nbytes
                ptrs[slot] = low
                results = [out]
            elif t is not None and type(out) is t.kind:  # a torch.Tensor (the ndarray case is above)
                if (out.dtype is not t.dtype or out.shape != t.shape or not out.is_contiguous()
                        or not out.is_cpu or out.requires_grad):
                    return None
                low = out.data_ptr()
                high = low + t.nbytes
                ptrs[t.slot] = low
                results = [out]
            for t in self.inputs:
                a = args[t.pos]
                if (t.numpy and type(a) is _NDARRAY and a.dtype is t.dtype and a.shape == t.shape
                        and a.strides == t.strides):
                    ptr = _WORDS[(id(a) + _DATA) >> 3]
                elif (type(a) is t.kind and not t.numpy and a.dtype is t.dtype and a.shape == t.shape
                      and a.is_contiguous() and a.is_cpu and not a.requires_grad):  # a torch.Tensor
                    ptr = a.data_ptr()
                else:
                    ptr = _pointer(t, a)
                if ptr < high and low < ptr + t.nbytes:  # overlaps out=: the checked path copies
                    return None
                ptrs[t.slot] = ptr
            if self.guard is not None and not self.guard(ptrs):  # out of range: the checked call names it
                return None
            if self.constants is not None:
                positions, sources, slots = self.constants
                objects = tuple([args[p] for p in positions])
                pointers = self.kernel.prepared.pointers(objects)  # type: ignore[union-attr]
                if pointers is None:  # new constant arguments: their buffers are made now, once
                    made = self.kernel.prepared.arrays(objects, [ptrs[s] for s in sources])  # type: ignore[union-attr]
                    pointers = [a.ctypes.data for a in made]
                for slot, pointer in zip(slots, pointers):
                    ptrs[slot] = pointer
            if out is None:
                results = []
                for slot, shape, dtype, nbytes in self.results:
                    r = np.empty(shape, dtype) if nbytes < ALIGN_FROM else aligned_empty(shape, dtype)
                    ptrs[slot] = _WORDS[(id(r) + _DATA) >> 3]
                    results.append(r)
            elif results is None:
                results = self._outs(out, ptrs)
                if results is None:
                    return None
            status = self.kernel.fn(address)
        except (_Miss, MemoryError):  # a result that cannot be allocated: the checked path says so
            return None
        finally:
            self.pool.append(buffer)
        if status != 0:
            raise_out_of_memory(self.kernel.name)
        return results


def make_plan(kernel: CpuKernel, op, bound, args: tuple[Any, ...], cparams: dict[str, Any],
              out: Any, guard: IndexGuard | None = None) -> Plan | None:
    """The plan for calls like this checked one, running ``guard`` first (None when it has no
    fast path)."""
    if not _FAST_POINTERS:
        return None
    kinds = {n: op.scalars[n].dtype.name for n in bound.scalars}
    if any(kind not in _SCALAR_CELLS for kind in kinds.values()):
        return None
    slot = {name: i for i, (name, _) in enumerate(kernel.params)}
    position = {name: i for i, name in enumerate(op.params)}
    inputs = [_tensor(slot[n], position[n], args[position[n]]) for n in bound.arrays]
    outs = None
    if out is not None:
        targets = list(out) if type(out) in (tuple, list) else [out]
        outs = [_tensor(slot[r], i, o) for i, (r, o) in enumerate(zip(op.results, targets))]
        if None in outs:
            return None
    if None in inputs:
        return None
    scalars = [(position[n], type(args[position[n]]), _SCALAR_CELLS[kind], _INT_RANGES.get(kind))
               for n, kind in kinds.items()]
    results = []
    for name in op.results:
        shape, dtype = bound.result_shapes[name], op.tensors[name].dtype.numpy
        results.append((slot[name], shape, dtype, math.prod(shape) * dtype.itemsize))
    constants = None
    if kernel.prepared is not None:
        sources = kernel.prepared.sources
        constants = (tuple(position[n] for n in sources), tuple(slot[n] for n in sources),
                     tuple(slot[n] for n in kernel.prepared.names))
    symbols = [(slot[n], v) for n, v in dynamic_values(kernel, bound).items()]
    checks = None if guard is None else CpuGuard.for_slots(guard, slot)
    if guard is not None and checks is None:
        return None
    return Plan(kernel, len(args), dict(cparams), inputs, scalars, [slot[n] for n in kinds], outs, results,
                constants, symbols=symbols, guard=checks)


BACKEND = Backend(
    kind="cpu", target_type=CpuTarget, stages=STAGES,
    primitives=frozenset(("split", "tile", "reorder", "fuse", "unroll", "vectorize", "parallel", "cache", "pack",
                          "compute_at", "inline", "decompose", "conv")),
    cache_scopes=frozenset(("local", "global")), options=frozenset(("conv", "constant_params", "deterministic")),
    defaults={},
    resolve=machine, schedule=cpu_schedule, build=build, load=load, invoke=invoke, make_plan=make_plan,
    as_array=as_array, stage_text=stage_text, cache_key=CpuTarget.key)
