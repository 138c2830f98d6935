"""The CUDA target: build cubin for a scheduled loop function, load it, run it on GPU tensors.

Compiling (``build``, ``stage_text``) needs NVRTC only, no GPU: the architecture comes from
the CudaTarget (``target=CudaTarget(...)``, or ``arch=``, default ``sm_90``). Running needs a
GPU. Device tensors (PyTorch, CuPy, anything with ``__cuda_array_interface__``,
``tcc.cuda.Array``) are used in place and the results come back as the same kind of tensor;
NumPy inputs are copied over and the results copied back. Work goes on the caller's current
PyTorch (or CuPy) stream, else the legacy default stream; nothing synchronises unless host
arrays are involved.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.metadata
import itertools
import math
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from tcc import dtypes
from tcc.codegen_cuda import driver, launch_sizes, nvrtc
from tcc.cuda import Array
from tcc.dtypes import DType
from tcc.errors import TccArgumentError, TccCompileError, TccRuntimeError
from tcc.ir.loops import GUARD_PARAM, LoopFunc
from tcc.passes.autoschedule_cuda.indexing import MAX_GRID_X
from tcc.passes.pipeline import cuda_schedule
from tcc.runtime.backend import Backend
from tcc.runtime.binding import out_list
from tcc.runtime.cache import pack_artifact, unpack_artifact
from tcc.runtime.cuda_guard import CudaGuard
from tcc.runtime.cuda_plan import SYNC, make_plan, raw_stream
from tcc.runtime.cuda_tensors import DeviceTensor, as_array, torch_dtypes
from tcc.runtime.index_checks import IndexGuard
from tcc.target import CudaTarget, host_cores

STAGES = ("ast", "te", "fused", "loops", "scheduled", "cuda", "ptx")
_MAGIC = b"TCC-CUBIN-1\n"
_NO_LOCK = contextlib.nullcontext()


def machine(given: CudaTarget | None = None, options: Mapping[str, Any] | None = None) -> CudaTarget:
    """The GPU an op is scheduled for: the one given (``target=CudaTarget(...)``, its architecture
    replaced by ``arch=``), else device 0 where its architecture is the one compiled for (``arch=``,
    default sm_90), else that architecture's usual part."""
    arch = (options or {}).get("arch")
    if given is not None:
        return given if arch is None else replace(given, arch=nvrtc.check_arch(arch))
    return _machine(nvrtc.check_arch(arch or nvrtc.DEFAULT_ARCH))


@functools.cache
def _machine(arch: str) -> CudaTarget:
    try:
        if driver.device_count() > 0 and (found := driver.device_target(0)).arch == arch:
            return found
    except TccRuntimeError:
        pass  # no GPU here: compile for the architecture's usual part
    return CudaTarget.for_arch(arch)


def cache_key(target: CudaTarget) -> str:
    """The machine and NVRTC: a kernel compiled by another NVRTC is built again."""
    return f"nvrtc-{_nvrtc_version()}/{target.key()}"


@functools.cache
def _nvrtc_version() -> str:
    """NVRTC's version for the cache key: from the metadata of the package that installed it, where
    pip did (loading NVRTC's bindings to ask it costs ~70 ms of a warm start), else from NVRTC."""
    try:
        return "pip-" + importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        return nvrtc.version()


@functools.cache
def _cuda_c() -> Any:
    """The CUDA C generator, imported when first needed: a warm start only loads cubin from the
    cache, and importing the code generators (GPU schedules, tensor cores) was part of its time."""
    return importlib.import_module("tcc.codegen_cuda.cuda_c")


def cuda_source(func: LoopFunc, target: CudaTarget | None = None) -> str:
    return _cuda_c().generate(func, target or CudaTarget()).source


def stage_text(func: LoopFunc, stage: str, target: CudaTarget) -> str:
    program = _cuda_c().generate(func, target)
    return program.source if stage == "cuda" else nvrtc.compile_ptx(program.source, _code_arch(program, target))


def _code_arch(program: Any, target: CudaTarget) -> str:
    """The architecture to compile for: sm_90a where the program uses its own instructions (wgmma)."""
    arch = target.arch
    return arch + "a" if program.arch_specific and not arch.endswith("a") else arch


UNIT_CHARS = 24_000  # CUDA C per separately compiled unit, at least (NVRTC's fixed cost per program)


def build(func: LoopFunc, target: CudaTarget | None = None) -> bytes:
    """The artifact the cache stores: a JSON launch plan, then the cubins (one per compile unit)
    for ``target`` (the default sm_90 part where none is given)."""
    target = target or CudaTarget()
    arch = target.arch
    program = _cuda_c().generate(func, target)
    units = program.units(min(host_cores(), len(program.source) // UNIT_CHARS))
    code_arch = _code_arch(program, target)
    if len(units) == 1:
        cubins = [nvrtc.compile_cubin(units[0][0], code_arch)]
    else:  # NVRTC lets go of the GIL while it compiles
        with ThreadPoolExecutor(len(units), thread_name_prefix="tcc-nvrtc") as pool:
            cubins = list(pool.map(lambda unit: nvrtc.compile_cubin(unit[0], code_arch), units))
    module_of = {k: m for m, (_, kernels) in enumerate(units) for k in kernels}
    meta = {"arch": arch, "temps": program.temps, "modules": [len(c) for c in cubins],
            "kernels": [{"name": k.name, "grid": k.grid, "block": k.block, "params": k.params,
                         "aligned": k.aligned, "shared": k.shared, "module": module_of[i], "requires": k.requires}
                        for i, k in enumerate(program.kernels)]}
    return pack_artifact(_MAGIC, meta, b"".join(cubins))


def _parse(artifact: bytes) -> tuple[dict[str, Any], list[bytes]]:
    try:
        meta, payload = unpack_artifact(_MAGIC, artifact)
        sizes = meta.get("modules", [len(payload)])
        if sum(sizes) != len(payload):
            raise ValueError("truncated")
        ends = list(itertools.accumulate(sizes))
        cubins = [payload[end - n:end] for end, n in zip(ends, sizes)]
        if not all(c.startswith(b"\x7fELF") for c in cubins):
            raise ValueError("no cubin")
        return meta, cubins
    except ValueError as exc:  # (UnicodeDecodeError and json's errors are ValueErrors)
        raise TccCompileError(f"unusable CUDA artifact ({exc})") from None


class CudaKernel:
    """The kernels of one op specialisation; modules are loaded per device on first use.

    A kernel with dynamic shape symbols (``symbols``) takes their values as parameters, and its
    grids and intermediates' sizes are formulas of them (:mod:`tcc.codegen_cuda.launch_sizes`):
    :meth:`launchers` and :meth:`sizes` give those of one call's values."""

    def __init__(self, name: str, artifact: bytes):
        self.name = name
        self.meta, self.cubins = _parse(artifact)
        self.temps: list[tuple[str, launch_sizes.Formula]] = [(n, b) for n, b in self.meta["temps"]]
        # the symbols its launch sizes read: none for a kernel specialised on every shape
        self.symbols = sorted(set().union(*(launch_sizes.symbols(f) for f in (
            *(b for _, b in self.temps), *(k["grid"] for k in self.meta["kernels"]),
            *(k["requires"] for k in self.meta["kernels"] if k.get("requires") is not None)))))
        self._launchers: dict[int, list[driver.Launcher]] = {}
        self._sized: dict[tuple, list[driver.Launcher]] = {}  # (device, symbol values) -> launchers
        # (device, stream) -> (the temps it was made for, their pointers): intermediates allocated
        # once, reused by every call on that stream (stream order keeps calls apart)
        self._workspaces: dict[tuple[int, int], tuple[list[tuple[str, int]], list[int]]] = {}
        self.lock = threading.Lock()  # held while one call queues its kernels on a shared workspace
        self._allocating = threading.Lock()
        weakref.finalize(self, _free_workspaces, self._workspaces)

    def sizes(self, values: Mapping[str, Any]) -> list[tuple[str, int]]:
        """The intermediates' (name, bytes) for a call whose shape symbols have ``values``."""
        return [(n, launch_sizes.evaluate(b, values)) for n, b in self.temps]

    def workspace(self, device: int, stream: int, op: str, temps: list[tuple[str, int]] | None = None) -> list[int]:
        """Pointers to this op's intermediates (``temps``: their sizes for this call, default
        :attr:`temps`' constant ones) for calls on ``stream``, allocated on first use and again
        when a call needs more than they hold (a dynamic kernel's grow with its largest call)."""
        temps = temps if temps is not None else [(n, int(b)) for n, b in self.temps]  # type: ignore[arg-type]
        found = self._workspaces.get((device, stream))
        if found is not None and len(found[0]) == len(temps) \
                and all(n == m and have >= need for (n, have), (m, need) in zip(found[0], temps)):
            return found[1]
        with self._allocating:
            driver.context(device).activate()
            if found is not None:  # grown to cover both
                temps = [(n, max(need, have)) for (n, need), (_, have) in zip(temps, found[0])] \
                    if len(found[0]) == len(temps) else temps
            temps, ptrs = list(temps), []
            try:
                for name, nbytes in temps:
                    ptrs.append(driver.alloc_workspace(nbytes, f"op {op}: intermediate {name}"))
            except BaseException:
                _free_workspaces({(device, stream): (temps[:len(ptrs)], ptrs)})
                raise
            old = self._workspaces.get((device, stream))
            self._workspaces[(device, stream)] = (temps, ptrs)
        if old is not None:
            _free_workspaces({(device, stream): old})
        return ptrs

    def launchers(self, device: int, values: Mapping[str, Any] | None = None) -> list[driver.Launcher]:
        """The kernels' launchers on ``device``; a dynamic kernel's with the grids of a call whose
        shape symbols have ``values``, less those with no block to run (an empty dim: CUDA refuses
        a grid of zero blocks)."""
        if not self.symbols:
            return self._loaded(device)
        key = (device, *(int(values[s]) for s in self.symbols))  # type: ignore[index]
        found = self._sized.get(key)
        if found is None:
            if len(self._sized) >= 1024:
                self._sized.clear()
            sized = [_sized(launcher, self.meta["kernels"], values, self.name) for launcher in self._loaded(device)]
            found = self._sized[key] = [launcher for launcher in sized if launcher is not None and launcher.grid > 0]
        return found

    def _loaded(self, device: int) -> list[driver.Launcher]:
        found = self._launchers.get(device)
        if found is None:
            ctx = driver.context(device)
            if ctx.arch != self.meta["arch"]:
                raise TccRuntimeError(f"op {self.name} was compiled for {self.meta['arch']} but cuda:{device} "
                                      f"is {ctx.arch}", hint=f"tcc.compile(..., target='cuda', arch='{ctx.arch}')")
            modules = [driver.load_module(cubin, f"op {self.name}") for cubin in self.cubins]
            made = [driver.Launcher(modules[k.get("module", 0)], k["name"], k["grid"], k["block"],
                                    [tuple(p) for p in k["params"]], int(k.get("shared", 0)))
                    for k in self.meta["kernels"]]
            found = _pair(made, [bool(k.get("aligned")) for k in self.meta["kernels"]])
            self._launchers[device] = found
        return found


def _sized(launcher: driver.Launcher, kernels: list[dict[str, Any]], values: Mapping[str, Any],
           op: str) -> driver.Launcher | None:
    """A copy of ``launcher`` (and of its fallback) with the grid of its formula for ``values``;
    None where its ``requires`` fails for ``values`` (an aligned variant: its fallback, sized)."""
    meta = next(k for k in kernels if k["name"] == launcher.name)
    if meta.get("requires") is not None and not launch_sizes.evaluate(meta["requires"], values):
        fallback = launcher.fallback if meta.get("aligned") else None
        return None if fallback is None else _sized(fallback, kernels, values, op)
    formula = meta["grid"]
    blocks = launch_sizes.evaluate(formula, values)
    if blocks > MAX_GRID_X:
        shown = ", ".join(f"{n}={values[n]}" for n in sorted(launch_sizes.symbols(formula)))
        raise TccRuntimeError(f"op {op}: kernel {launcher.name} needs {blocks} blocks for {shown}, over CUDA's "
                              "grid limit", hint="call it with smaller inputs (or in pieces)")
    made = copy.copy(launcher)  # (sharing its argument slots and their lock)
    made.grid = max(blocks, 0)
    if launcher.fallback is not None:
        made.fallback = _sized(launcher.fallback, kernels, values, op)
        if made.fallback is None:  # (an aligned variant's condition implies its fallback's)
            raise TccRuntimeError(f"internal error: op {op}: kernel {launcher.name} has no fallback for {values}")
    return made


def _free_workspaces(workspaces: dict[tuple[int, int], tuple[list[tuple[str, int]], list[int]]]) -> None:
    for (device, _), (temps, ptrs) in list(workspaces.items()):
        for (_, nbytes), ptr in zip(temps, ptrs):
            try:
                driver.free_workspace(device, ptr, nbytes)
            except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
                pass
    workspaces.clear()


def _pair(launchers: list[driver.Launcher], aligned: list[bool]) -> list[driver.Launcher]:
    """The launchers a call runs: an aligned variant takes the kernel after it as its fallback."""
    out, i = [], 0
    while i < len(launchers):
        if aligned[i]:
            launchers[i].set_fallback(launchers[i + 1])
        out.append(launchers[i])
        i += 2 if aligned[i] else 1
    return out


def load(name: str, artifact: bytes) -> CudaKernel:
    return CudaKernel(name, artifact)


# ---------------------------------------------------------------- calling

class _Call:
    """One call's device state; frees every temporary it made, also when the call fails."""

    def __init__(self, op_name: str, device: int, stream: int):
        self.op = op_name
        self.device = device
        self.stream = stream
        self.temps: list[tuple[int, int]] = []

    def alloc(self, nbytes: int, what: str) -> int:
        ptr = driver.alloc(nbytes, self.stream, f"op {self.op}: {what}")
        self.temps.append((ptr, nbytes))
        return ptr

    def __enter__(self) -> _Call:
        return self

    def __exit__(self, *exc: Any) -> None:
        for ptr, nbytes in self.temps:
            driver.free(ptr, nbytes, self.stream)


def invoke(kernel: CudaKernel, op, bound, out: Any, guard: IndexGuard | None = None) -> list[Any] | None:
    """Run ``kernel`` on a bound call (``out=`` checked first). None, with nothing written, when
    ``guard`` (the call's index checks, run on the device first) finds an index out of range."""
    device_args = {n: a for n, a in bound.arrays.items() if isinstance(a, DeviceTensor)}
    device = _common_device(op, device_args, out)
    driver.context(device).activate()
    kind = next((a.kind for a in device_args.values()), "numpy")
    stream = _stream(device_args, device)
    outs = _check_out(op, bound, out, kind, device)
    results: list[Any] = []
    with _Call(op.name, device, stream) as call:
        try:
            if not _run(call, kernel, op, bound, outs, kind, list(device_args.values()), results, guard):
                return None
        except BaseException:
            results.clear()  # the traceback must not keep new result tensors alive
            raise
    return results


def _run(call: _Call, kernel: CudaKernel, op, bound, outs: list[Any], kind: str, inputs: list[DeviceTensor],
         results: list[Any], guard: IndexGuard | None) -> bool:
    """Launch the kernels behind ``guard``, the call's index checks (False when an index is out of
    range: then the kernels wrote nothing, and nothing is copied to ``out=``)."""
    values: dict[str, Any] = {**bound.bindings, **bound.scalars}  # (a dynamic kernel reads its shape symbols)
    for name, arr in bound.arrays.items():
        values[name] = _input_pointer(call, name, arr)
    finish = []
    for name, target in zip(op.results, outs):
        shape, dt = bound.result_shapes[name], op.tensors[name].dtype
        made = _result(call, name, shape, dt, kind, target, inputs)
        results.append(made[0])
        values[name] = made[1]
        finish.append(made[2])
        del made  # only ``results`` may hold a new tensor (see invoke)
    launchers = kernel.launchers(call.device, bound.bindings)

    def launch(count: int = 0) -> None:  # (count: the guard's device count, which the kernels read)
        if guard is not None:
            values[GUARD_PARAM] = count
        with kernel.lock if kernel.temps else _NO_LOCK:
            temps = kernel.sizes(bound.bindings)
            values.update(zip((n for n, _ in temps), kernel.workspace(call.device, call.stream, op.name, temps)))
            for launcher in launchers:
                launcher.launch(values, call.stream, op.name)
    if guard is None:
        launch()
    else:
        if not CudaGuard.on(guard, call.device).around_values(values, call.stream, op.name, launch):
            return False
    for post in finish:
        if post is not None:
            post()
    if kind == "numpy" or SYNC:
        driver.synchronize(call.stream, f"op {op.name}: running its kernels")
    return True


def _common_device(op, device_args: dict[str, DeviceTensor], out: Any) -> int:
    first = None
    for name, arr in device_args.items():
        if first is None:
            first = (name, arr.device)
        elif arr.device != first[1]:
            raise TccArgumentError(f"argument {name} of {op.name} is on cuda:{arr.device} but argument "
                                   f"{first[0]} is on cuda:{first[1]}", op.tensors[name].span,
                                   "move all tensors of a call to one GPU")
    return first[1] if first is not None else driver.current_device()


def _stream(device_args: dict[str, DeviceTensor], device: int) -> int:
    """The caller's current stream when it passed framework tensors, else the legacy default stream."""
    kinds = {a.kind for a in device_args.values()}
    if "torch" in kinds:
        return raw_stream(device)
    if "cupy" in kinds:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _input_pointer(call: _Call, name: str, arr: Any) -> int:
    what = f"argument {name}"
    if isinstance(arr, DeviceTensor):
        if arr.contiguous:
            return arr.ptr
        return _contiguous_copy(call, name, arr)
    host = np.ascontiguousarray(arr)
    ptr = call.alloc(host.nbytes, f"copy of {what}")
    driver.copy_htod(ptr, host.ctypes.data, host.nbytes, call.stream, f"op {call.op}: {what}")
    return ptr


def _contiguous_copy(call: _Call, name: str, arr: DeviceTensor) -> int:
    """A contiguous copy of a strided device tensor, made by its own framework."""
    if arr.kind == "torch":
        copy = arr.owner.contiguous()
    elif arr.kind == "cupy":
        import cupy

        copy = cupy.ascontiguousarray(arr.owner)
    else:
        raise TccArgumentError(f"argument {name} of {call.op} is a non-contiguous device array",
                               hint="pass a contiguous array (or a PyTorch/CuPy tensor, which tcc copies)")
    arr.keep.append(copy)
    return int(copy.data_ptr()) if arr.kind == "torch" else int(copy.data.ptr)


def _result(call: _Call, name: str, shape: tuple[int, ...], dt: DType, kind: str, target: Any,
            inputs: list[DeviceTensor]):
    """(what the caller gets, the device pointer the kernel writes, a step to run after the kernels)."""
    nbytes = math.prod(shape) * dt.itemsize
    if kind == "numpy":
        ptr = call.alloc(nbytes, f"result {name}")
        host = target if target is not None else _host_result(call, name, shape, dt)
        direct = host.flags.c_contiguous

        def back() -> None:
            staging = host if direct else np.empty(shape, dt.numpy)
            driver.copy_dtoh(staging.ctypes.data, ptr, nbytes, call.stream, f"op {call.op}: result {name}")
            if not direct:
                driver.synchronize(call.stream, f"op {call.op}: result {name}")
                np.copyto(host, staging)
        return host, ptr, back
    if target is not None:
        view = target if isinstance(target, DeviceTensor) else as_array(target, f"out= for {name}")
        if view.contiguous and not _overlaps(view, inputs):
            return target, view.ptr, None
        ptr = call.alloc(nbytes, f"result {name}")
        return target, ptr, lambda: _copy_into(call, name, view, ptr, nbytes)
    try:
        result = _new_device_tensor(shape, dt, kind, call.device, call.stream)
    except Exception as exc:  # noqa: BLE001 - torch/CuPy/our own out-of-memory errors alike
        raise TccRuntimeError(f"op {call.op}: cannot allocate result {name} ({dt}{list(shape)}, {nbytes} bytes) "
                              f"on cuda:{call.device}: {str(exc).splitlines()[0] if str(exc) else exc!r}",
                              hint="free device memory or use smaller inputs") from None
    view = as_array(result, f"result {name}")
    return result, view.ptr, None


def _host_result(call: _Call, name: str, shape: tuple[int, ...], dt: DType) -> np.ndarray:
    try:
        return np.empty(shape, dt.numpy)
    except MemoryError:
        raise TccRuntimeError(f"op {call.op}: cannot allocate result {name} ({dt}{list(shape)}) in host memory",
                              hint="use smaller inputs") from None


def _overlaps(view: DeviceTensor, inputs: list[DeviceTensor]) -> bool:
    """Whether ``out=`` shares memory with an input (then we compute into a temporary)."""
    lo, hi = view.ptr, view.ptr + view.nbytes
    return any(v.ptr < hi and lo < v.ptr + v.nbytes for v in inputs)


def _copy_into(call: _Call, name: str, view: DeviceTensor, ptr: int, nbytes: int) -> None:
    if view.contiguous:
        driver.copy_dtod(view.ptr, ptr, nbytes, call.stream, f"op {call.op}: out= for {name}")
        return
    if view.kind != "torch":
        raise TccArgumentError(f"out= for {name} of {call.op} is a non-contiguous device array",
                               hint="pass a contiguous array")
    import torch

    tmp = torch.empty(view.shape, dtype=view.owner.dtype, device=view.owner.device)
    driver.copy_dtod(tmp.data_ptr(), ptr, nbytes, call.stream, f"op {call.op}: out= for {name}")
    view.owner.copy_(tmp)


def _new_device_tensor(shape: tuple[int, ...], dt: DType, kind: str, device: int, stream: int) -> Any:
    if kind == "torch":
        import torch

        torch_dt = next(k for k, v in torch_dtypes().items() if v == dt)
        return torch.empty(shape, dtype=torch_dt, device=torch.device("cuda", device))
    if kind == "cupy" and dt.has_numpy:
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(shape, dt.numpy)
    return Array(shape, dt, device, stream=stream)


def _check_out(op, bound, out: Any, kind: str, device: int) -> list[Any]:
    outs = out_list(op, out)
    if out is None:
        return outs
    for name, target in zip(op.results, outs):
        what = f"out= for {name} of {op.name}"
        want_shape, want = bound.result_shapes[name], op.tensors[name].dtype
        view = as_array(target, what)
        on_device = isinstance(view, DeviceTensor)
        if on_device != (kind != "numpy"):
            where = "a device tensor" if kind != "numpy" else "a NumPy array"
            raise TccArgumentError(f"{what} must be {where}, like the inputs", op.tensors[name].span)
        got_dtype = view.tcc_dtype if on_device else dtypes.from_numpy(view.dtype)
        if tuple(view.shape) != tuple(want_shape) or got_dtype != want:
            raise TccArgumentError(f"{what} must be {want}{list(want_shape)}, got "
                                   f"{got_dtype or view.dtype}{list(view.shape)}", op.tensors[name].span)
        if on_device and view.device != device:
            raise TccArgumentError(f"{what} is on cuda:{view.device}, the inputs on cuda:{device}",
                                   op.tensors[name].span)
        if not on_device and not view.flags.writeable:
            raise TccArgumentError(f"{what} is read-only", op.tensors[name].span)
    return outs


BACKEND = Backend(
    kind="cuda", target_type=CudaTarget, stages=STAGES,
    primitives=frozenset(("split", "tile", "reorder", "fuse", "unroll", "bind", "cache", "compute_at", "inline",
                          "decompose", "conv", "tensorize")),
    cache_scopes=frozenset(("local", "shared")),
    options=frozenset(("conv", "arch", "tf32", "deterministic", "staged_stores")),
    defaults={"conv": "direct"},  # im2col's per-batch GEMM buffers have no GPU schedule yet
    resolve=machine, schedule=cuda_schedule, build=build, load=load, invoke=invoke, make_plan=make_plan,
    as_array=as_array, stage_text=stage_text, cache_key=cache_key)
