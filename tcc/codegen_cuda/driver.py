"""The CUDA driver API through ctypes: contexts, memory, modules and launches.

We use each device's **primary** context, the one the CUDA runtime (and so PyTorch and
CuPy) uses, so our allocations, modules and streams interoperate with theirs. Every driver
call is checked by :func:`check`, which turns a failure into a
:class:`~tcc.errors.TccRuntimeError` that says what was being done.

The driver is called through ctypes rather than cuda-python's bindings: importing those cost
~40-100 ms of every warm start on a GPU, and each of their calls several microseconds to a ctypes
call's one. The functions are the driver's stable C ABI (``_v2`` where cuda.h maps a name to it).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from tcc.errors import TccRuntimeError
from tcc.target import CudaTarget

_LOCK = threading.Lock()
_CONTEXTS: dict[int, Context] = {}
_LIVE_BYTES = [0]  # device memory tcc holds now (temps, copies of host inputs, Arrays)

# cuda.h's values (tests/test_cuda.py checks them against cuda-python's enums)
SUCCESS = 0
ERROR_OUT_OF_MEMORY = 2
ERROR_INVALID_CONTEXT = 201
ERROR_INVALID_HANDLE = 400
ERROR_ILLEGAL_ADDRESS = 700
ERROR_CONTEXT_IS_DESTROYED = 709
ERROR_LAUNCH_FAILED = 719
ATTRIBUTES = {"COMPUTE_CAPABILITY_MAJOR": 75, "COMPUTE_CAPABILITY_MINOR": 76, "MULTIPROCESSOR_COUNT": 16,
              "MAX_SHARED_MEMORY_PER_BLOCK": 8, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 97,
              "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 81, "MAX_REGISTERS_PER_MULTIPROCESSOR": 82,
              "MAX_THREADS_PER_BLOCK": 1, "L2_CACHE_SIZE": 38, "MAX_REGISTERS_PER_BLOCK": 12,
              "MAX_THREADS_PER_MULTIPROCESSOR": 39}
MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9

_P, _U, _I, _SIZE, _DPTR = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64
_OUT_P, _OUT_I = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
# every function tcc calls: its argument types (each returns a CUresult)
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_U],
    "cuGetErrorName": [_I, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [_I, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGetCount": [_OUT_I],
    "cuDeviceGet": [_OUT_I, _I],
    "cuDeviceGetAttribute": [_OUT_I, _I, _I],
    "cuDevicePrimaryCtxRetain": [_OUT_P, _I],
    "cuDeviceGetDefaultMemPool": [_OUT_P, _I],
    "cuMemPoolSetAttribute": [_P, _I, _P],
    "cuMemPoolGetAttribute": [_P, _I, _P],
    "cuCtxGetCurrent": [_OUT_P],
    "cuCtxSetCurrent": [_P],
    "cuCtxGetDevice": [_OUT_I],
    "cuPointerGetAttribute": [_P, _I, _DPTR],
    "cuMemAllocAsync": [ctypes.POINTER(_DPTR), _SIZE, _P],
    "cuMemFreeAsync": [_DPTR, _P],
    "cuMemAlloc_v2": [ctypes.POINTER(_DPTR), _SIZE],
    "cuMemFree_v2": [_DPTR],
    "cuMemAllocHost_v2": [_OUT_P, _SIZE],
    "cuMemFreeHost": [_P],
    "cuEventCreate": [_OUT_P, _U],
    "cuEventRecord": [_P, _P],
    "cuEventSynchronize": [_P],
    "cuEventDestroy_v2": [_P],
    "cuMemcpyHtoDAsync_v2": [_DPTR, _P, _SIZE, _P],
    "cuMemcpyDtoHAsync_v2": [_P, _DPTR, _SIZE, _P],
    "cuMemcpyDtoDAsync_v2": [_DPTR, _DPTR, _SIZE, _P],
    "cuStreamSynchronize": [_P],
    "cuCtxSynchronize": [],
    "cuModuleLoadData": [_OUT_P, ctypes.c_char_p],
    "cuModuleGetFunction": [_OUT_P, _P, ctypes.c_char_p],
    "cuFuncSetAttribute": [_P, _I, _I],
    "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P],
}


@functools.cache
def launch_kernel_address() -> int:
    """The address of the driver's ``cuLaunchKernel``, for launchers outside Python (C++)."""
    return int(ctypes.cast(libcuda().cuLaunchKernel, ctypes.c_void_p).value or 0)


@functools.cache
def libcuda() -> Any:
    """The driver library, its functions typed; a clear error where no driver is installed."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TccRuntimeError(f"no CUDA driver on this machine ({exc})",
                              hint="running on target='cuda' needs an NVIDIA GPU; compiling and "
                                   "lower(stage='cuda'/'ptx') work without one") from None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def error_name(err: int) -> str:
    try:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        lib = libcuda()
        if lib.cuGetErrorName(err, ctypes.byref(name)) != SUCCESS:
            return f"CUresult {err}"
        lib.cuGetErrorString(err, ctypes.byref(text))
        return f"{name.value.decode()} ({(text.value or b'').decode()})"
    except Exception:  # noqa: BLE001 - naming an error must never raise another
        return f"CUresult {err}"


def check(err: int, what: str, hint: str | None = None) -> None:
    """Raise on a driver call's error code."""
    if err != SUCCESS:
        raise TccRuntimeError(f"{what}: {error_name(err)}", hint=hint or _hint(err))


def _hint(err: int) -> str | None:
    if err == ERROR_OUT_OF_MEMORY:
        return "free device memory (other tensors, caches) or use smaller inputs"
    if err in (ERROR_ILLEGAL_ADDRESS, ERROR_LAUNCH_FAILED):
        return "the CUDA context is now unusable: restart the process; please report this as a tcc bug"
    return None


@functools.cache
def _init() -> None:
    check(libcuda().cuInit(0), "cuInit", "no usable NVIDIA GPU here")


def init() -> None:
    """Initialise the driver once (raises a TccRuntimeError with no GPU)."""
    with _LOCK:
        _init()


def device_count() -> int:
    init()
    count = ctypes.c_int()
    check(libcuda().cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    return count.value


def attribute(device: int, name: str) -> int:
    """A device attribute (``ATTRIBUTES``' names) of a device handle."""
    value = ctypes.c_int()
    check(libcuda().cuDeviceGetAttribute(ctypes.byref(value), ATTRIBUTES[name], device),
          f"reading {name.lower()} of a CUDA device")
    return value.value


# Intermediates of a checked call come from cuMemAllocAsync on the device's default pool (a
# planned call uses its plan's workspace). By default the pool gives freed memory back at every
# synchronisation, so a caller that synchronises after each call paid a fresh allocation per
# intermediate per call (138 us against 27 us without intermediates, H100); the pool keeps up to
# this much freed memory for the next call instead.
POOL_RELEASE_THRESHOLD = 1 << 30


class Context:
    """The primary context of one device."""

    def __init__(self, ordinal: int):
        lib = libcuda()
        self.ordinal = ordinal
        device, handle, pool = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        check(lib.cuDeviceGet(ctypes.byref(device), ordinal), f"cuDeviceGet({ordinal})")
        self.device = device.value
        check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(handle), self.device),
              f"retaining the context of cuda:{ordinal}")
        self.ptr = handle.value or 0
        self.arch = f"sm_{attribute(self.device, 'COMPUTE_CAPABILITY_MAJOR')}" \
                    f"{attribute(self.device, 'COMPUTE_CAPABILITY_MINOR')}"
        check(lib.cuDeviceGetDefaultMemPool(ctypes.byref(pool), self.device), f"the memory pool of cuda:{ordinal}")
        self.pool = pool.value
        threshold = ctypes.c_uint64(POOL_RELEASE_THRESHOLD)
        check(lib.cuMemPoolSetAttribute(self.pool, MEMPOOL_ATTR_RELEASE_THRESHOLD, ctypes.byref(threshold)),
              f"the memory pool of cuda:{ordinal}")

    def activate(self) -> None:
        """Make this context current on the calling thread (a no-op when it already is)."""
        lib = libcuda()
        current = ctypes.c_void_p()
        check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if (current.value or 0) != self.ptr:
            check(lib.cuCtxSetCurrent(self.ptr), f"making cuda:{self.ordinal} current")

    def pool_attribute(self, attr: int) -> int:
        """A 64-bit attribute of the device's default memory pool."""
        value = ctypes.c_uint64()
        check(libcuda().cuMemPoolGetAttribute(self.pool, attr, ctypes.byref(value)), "cuMemPoolGetAttribute")
        return value.value


def device_target(ordinal: int) -> CudaTarget:
    """The resources of device ``ordinal``, read from the driver."""
    ctx = context(ordinal)

    def read(name: str) -> int:
        return attribute(ctx.device, name)

    return CudaTarget(ctx.arch, read("MULTIPROCESSOR_COUNT"), read("MAX_SHARED_MEMORY_PER_BLOCK"),
                      read("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"), read("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
                      read("MAX_REGISTERS_PER_MULTIPROCESSOR"), read("MAX_THREADS_PER_BLOCK"),
                      read("L2_CACHE_SIZE"), read("MAX_REGISTERS_PER_BLOCK"),
                      CudaTarget.for_arch(ctx.arch).registers_per_thread,  # the ISA's, no attribute
                      read("MAX_THREADS_PER_MULTIPROCESSOR"))


def context(ordinal: int) -> Context:
    ctx = _CONTEXTS.get(ordinal)
    if ctx is None:
        init()
        count = device_count()
        if not 0 <= ordinal < count:
            raise TccRuntimeError(f"no device cuda:{ordinal} (this machine has {count})")
        with _LOCK:
            ctx = _CONTEXTS.get(ordinal) or _CONTEXTS.setdefault(ordinal, Context(ordinal))
    return ctx


def current_device() -> int:
    """The device of the calling thread's current context, else 0."""
    init()
    lib = libcuda()
    current, device = ctypes.c_void_p(), ctypes.c_int()
    check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if not current.value:
        return 0
    check(lib.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
    return device.value


def pointer_device(ptr: int, what: str) -> int:
    """The device ordinal that owns a device pointer."""
    init()
    ordinal = ctypes.c_int()
    check(libcuda().cuPointerGetAttribute(ctypes.byref(ordinal), POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
          f"{what}: not a CUDA device pointer", "pass a CUDA tensor (PyTorch, CuPy, tcc.cuda.Array) or a host array")
    return ordinal.value


# ---------------------------------------------------------------- memory

def alloc(nbytes: int, stream: int, what: str) -> int:
    """Stream-ordered device memory; ``what`` names the tensor in errors."""
    size = max(1, nbytes)
    ptr = ctypes.c_uint64()
    err = libcuda().cuMemAllocAsync(ctypes.byref(ptr), size, stream)
    if err != SUCCESS:
        raise TccRuntimeError(f"{what}: cannot allocate {nbytes} bytes on the GPU: {error_name(err)}",
                              hint=_hint(err))
    _LIVE_BYTES[0] += size
    return ptr.value


def free(ptr: int, nbytes: int, stream: int) -> None:
    libcuda().cuMemFreeAsync(ptr, stream)
    _LIVE_BYTES[0] -= max(1, nbytes)


def live_bytes() -> int:
    """Device memory that tcc allocated and has not freed yet."""
    return _LIVE_BYTES[0]


def copy_htod(dst: int, src: int, nbytes: int, stream: int, what: str) -> None:
    if nbytes:
        check(libcuda().cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream), f"{what}: copy to the GPU")


def copy_dtoh(dst: int, src: int, nbytes: int, stream: int, what: str) -> None:
    if nbytes:
        check(libcuda().cuMemcpyDtoHAsync_v2(dst, src, nbytes, stream), f"{what}: copy from the GPU")


def copy_dtod(dst: int, src: int, nbytes: int, stream: int, what: str) -> None:
    if nbytes:
        check(libcuda().cuMemcpyDtoDAsync_v2(dst, src, nbytes, stream), f"{what}: device copy")


def synchronize(stream: int, what: str) -> None:
    check(libcuda().cuStreamSynchronize(stream), what)


# ---------------------------------------------------------------- modules and launches

_CTYPES = {"p": ctypes.c_uint64, "f16": ctypes.c_float, "bf16": ctypes.c_float, "f32": ctypes.c_float,
           "f64": ctypes.c_double, "i8": ctypes.c_int8, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
           "bool": ctypes.c_bool, "f8e4m3": ctypes.c_float, "f8e5m2": ctypes.c_float}


class Launcher:
    """One kernel of a loaded module: its function handle and reusable argument storage."""

    def __init__(self, module: int, name: str, grid: int, block: int, params: list[tuple[str, str]],
                 shared: int = 0):
        self.name = name
        self.grid = grid
        self.block = block
        self.shared = shared  # bytes of dynamic shared memory
        fn = ctypes.c_void_p()
        check(libcuda().cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"finding kernel {name}")
        self.fn = fn.value
        if shared:  # dynamic shared memory beyond the static part is usable only after opting in
            check(libcuda().cuFuncSetAttribute(self.fn, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
                  f"kernel {name}: {shared} bytes of shared memory",
                  "the GPU has less shared memory than the kernel was scheduled for: pass its CudaTarget")
        self.names = [p for p, _ in params]
        self.pointers = [i for i, (_, code) in enumerate(params) if code == "p"]
        self.slots = [_CTYPES[code]() for _, code in params]
        self.argv = (ctypes.c_void_p * max(1, len(params)))(*[ctypes.addressof(s) for s in self.slots])
        self.argv_ptr = ctypes.addressof(self.argv)
        self.lock = threading.Lock()
        self.fallback: Launcher | None = None
        self.cu_launch = libcuda().cuLaunchKernel

    def set_fallback(self, other: Launcher) -> None:
        """Make this an aligned variant: calls whose pointers are not all 16-byte aligned run ``other``
        (a kernel of the same parameters, assuming nothing)."""
        if other.names != self.names:
            raise TccRuntimeError(f"internal error: kernels {self.name} and {other.name} differ in parameters")
        self.fallback = other

    def launch(self, values: dict[str, Any], stream: int, op: str) -> None:
        """Launch with each parameter taken from ``values`` by name (the checked path's launch)."""
        if self.fallback is not None and any(values[self.names[i]] % 16 for i in self.pointers):
            self.fallback.launch(values, stream, op)
            return
        with self.lock:
            for slot, name in zip(self.slots, self.names):
                slot.value = values[name]
            err = self.cu_launch(self.fn, self.grid, 1, 1, self.block, 1, 1, self.shared, stream, self.argv_ptr, None)
        if err != SUCCESS:
            raise launch_error(op, self.name, self.grid, self.block, err)


def launch_error(op: str, kernel: str, grid: int, block: int, err: int) -> TccRuntimeError:
    return TccRuntimeError(f"op {op}: launching kernel {kernel} ({grid} blocks of {block} threads) failed: "
                           f"{error_name(err)}", hint=_hint(err))


# a kernel parameter's code -> its format in a memoryview of the argument block (8 bytes a slot)
_FORMATS = {"p": "Q", "f16": "f", "bf16": "f", "f32": "f", "f64": "d", "i8": "b", "i32": "i", "i64": "q",
            "bool": "?", "f8e4m3": "f", "f8e5m2": "f"}


class ArgumentBlock:
    """The parameters of an op's kernels for one call, in one buffer of 8-byte slots (one a value
    of the call: argument, result or intermediate) that each kernel's parameter array points into,
    built once. A call writes each value once into its slot (``set``, ``words``) and launches the
    kernels: no ctypes object per parameter, no list of values, no lock (a block serves one call
    at a time: the fast path keeps a pool of them).
    """

    def __init__(self, launchers: list[Launcher], slots: dict[str, int], context: Context, cu_launch: Any = None):
        self.raw = (ctypes.c_uint64 * max(1, len(slots)))()
        data = memoryview((ctypes.c_char * ctypes.sizeof(self.raw)).from_buffer(self.raw)).cast("B")
        self.words = data.cast("Q")  # pointers, by slot
        self._views = {f: data.cast(f) for f in set(_FORMATS.values())}
        self.context = context
        base = ctypes.addressof(self.raw)
        self._argvs = []  # each kernel's parameter array: addresses of its slots (kept alive here)
        # per kernel: (function, grid, block, shared bytes, parameter array, name, its fallback's
        # (function, grid, block, shared bytes, name) or None, the slots of its pointers)
        self.kernels: list[tuple[Any, ...]] = []
        for launcher in launchers:
            argv = (ctypes.c_void_p * max(1, len(launcher.names)))(*[base + 8 * slots[n] for n in launcher.names])
            self._argvs.append(argv)
            other = launcher.fallback
            fallback = None if other is None else (_P(other.fn), other.grid, other.block, other.shared, other.name)
            self.kernels.append((_P(launcher.fn), launcher.grid, launcher.block, launcher.shared,
                                 _P(ctypes.addressof(argv)), launcher.name, fallback,
                                 [slots[launcher.names[i]] for i in launcher.pointers]))
        self.cu_launch = cu_launch or raw_launch()  # (tests pass a stand-in)
        self._streams: dict[int, Any] = {}  # stream -> its c_void_p

    def setter(self, code: str, slot: int) -> tuple[memoryview, int]:
        """(view, index): ``view[index] = value`` writes a value of parameter code ``code`` into ``slot``."""
        fmt = _FORMATS[code]
        view = self._views[fmt]
        return view, slot * 8 // view.itemsize

    def launch(self, stream: int, op: str, misaligned: int) -> None:
        """Launch every kernel on ``stream``. ``misaligned``: nonzero when some pointer written may not
        be 16-byte aligned (aligned variants then check their own and may run their fallback). A
        launch refused for want of the context current makes it current and tries again (the
        fast path does not ask the driver which context is current on every call)."""
        launch, words = self.cu_launch, self.words
        handle = self._streams.get(stream) if stream else None
        if handle is None and stream:
            if len(self._streams) >= 64:
                self._streams.clear()
            handle = self._streams[stream] = _P(stream)
        for fn, grid, block, shared, argv, name, fallback, pointers in self.kernels:
            if fallback is not None and misaligned and any(words[s] & 15 for s in pointers):
                fn, grid, block, shared, name = fallback
            err = launch(fn, grid, 1, 1, block, 1, 1, shared, handle, argv, None)
            if err != SUCCESS:
                if err in (ERROR_INVALID_CONTEXT, ERROR_INVALID_HANDLE):
                    self.context.activate()
                    err = launch(fn, grid, 1, 1, block, 1, 1, shared, handle, argv, None)
                if err != SUCCESS:
                    raise launch_error(op, name, grid, block, err)


def raw_launch() -> Any:
    """``cuLaunchKernel`` without argument types, for callers that pass its pointers as prebuilt
    ``c_void_p`` objects (or None) and its sizes as small ints: ctypes then converts nothing, and a
    call costs about 0.6 us to the typed function's 1.5 (development VM). Each ``lib[name]`` is a
    new function object, so the typed one that ``libcuda().cuLaunchKernel`` returns keeps its types."""
    fn = libcuda()["cuLaunchKernel"]
    fn.restype = ctypes.c_int
    return fn


def load_module(cubin: bytes, what: str) -> int:
    module = ctypes.c_void_p()
    check(libcuda().cuModuleLoadData(ctypes.byref(module), cubin), f"{what}: loading the compiled kernels",
          "the cubin does not fit this GPU: compile with arch= set to its compute capability")
    return module.value


def alloc_workspace(nbytes: int, what: str) -> int:
    """Device memory kept across calls (an op's intermediates); synchronous, unlike :func:`alloc`."""
    size = max(1, nbytes)
    ptr = ctypes.c_uint64()
    err = libcuda().cuMemAlloc_v2(ctypes.byref(ptr), size)
    if err != SUCCESS:
        raise TccRuntimeError(f"{what}: cannot allocate {nbytes} bytes on the GPU: {error_name(err)}",
                              hint=_hint(err))
    _LIVE_BYTES[0] += size
    return ptr.value


def alloc_pinned(nbytes: int, what: str) -> int:
    """Page-locked host memory (kept across calls): a copy from the GPU into it is one DMA, with
    no staging through a driver buffer."""
    ptr = ctypes.c_void_p()
    err = libcuda().cuMemAllocHost_v2(ctypes.byref(ptr), max(1, nbytes))
    if err != SUCCESS:
        raise TccRuntimeError(f"{what}: cannot allocate {nbytes} bytes of page-locked host memory: "
                              f"{error_name(err)}", hint=_hint(err))
    return int(ptr.value or 0)


def free_pinned(ptr: int) -> None:
    libcuda().cuMemFreeHost(ptr)


EVENT_DISABLE_TIMING = 2


def event(what: str) -> int:
    """A CUDA event without timing (the cheapest to record and wait for), kept across calls."""
    made = ctypes.c_void_p()
    check(libcuda().cuEventCreate(ctypes.byref(made), EVENT_DISABLE_TIMING), f"{what}: creating an event")
    return int(made.value or 0)


def record(event: int, stream: int, what: str) -> None:
    check(libcuda().cuEventRecord(event, stream), f"{what}: recording an event")


def wait(event: int, what: str) -> None:
    """Block until the work queued before ``event`` was recorded is done (later work may still run)."""
    check(libcuda().cuEventSynchronize(event), what)


def destroy_event(event: int) -> None:
    libcuda().cuEventDestroy_v2(event)


def free_workspace(device: int, ptr: int, nbytes: int) -> None:
    """Free :func:`alloc_workspace` memory once all work queued on its device is done."""
    context(device).activate()
    libcuda().cuCtxSynchronize()
    libcuda().cuMemFree_v2(ptr)
    _LIVE_BYTES[0] -= max(1, nbytes)
