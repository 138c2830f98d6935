"""The CUDA driver API through cuda-python: contexts, memory, modules and launches.

We use each device's **primary** context, the one the CUDA runtime (and so PyTorch and
CuPy) uses, so our allocations, modules and streams interoperate with theirs. Every driver
call goes through :func:`check`, which turns a failure into a
:class:`~tcc.errors.TccRuntimeError` that says what was being done.
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


@functools.cache
def api():
    """``cuda.bindings.driver``, or a clear error when cuda-python is missing."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise TccRuntimeError(f"target='cuda' needs cuda-python ({exc})",
                              hint='pip install "cuda-bindings>=13.0,<14" (the \'cuda\' extra of tcc)') from None
    return driver


def error_name(err: Any) -> str:
    try:
        _, name = api().cuGetErrorName(err)
        _, text = api().cuGetErrorString(err)
        return f"{name.decode()} ({text.decode()})"
    except Exception:  # noqa: BLE001 - naming an error must never raise another
        return str(err)


def check(result: tuple, what: str, hint: str | None = None) -> Any:
    """The value(s) of a driver call's ``(err, *values)``; raises on any error."""
    err = result[0]
    if err != api().CUresult.CUDA_SUCCESS:
        raise TccRuntimeError(f"{what}: {error_name(err)}", hint=hint or _hint(err))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _hint(err: Any) -> str | None:
    r = api().CUresult
    if err == r.CUDA_ERROR_OUT_OF_MEMORY:
        return "free device memory (other tensors, caches) or use smaller inputs"
    if err in (r.CUDA_ERROR_ILLEGAL_ADDRESS, r.CUDA_ERROR_LAUNCH_FAILED):
        return "the CUDA context is now unusable: restart the process; please report this as a tcc bug"
    return None


@functools.cache
def libcuda() -> Any:
    """The driver library through ctypes, for the two calls of the hot path (None if not loadable).

    A ctypes call costs about a microsecond; cuda-python's wrappers several.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    u, p = ctypes.c_uint, ctypes.c_void_p
    lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(p)]
    lib.cuCtxGetCurrent.restype = ctypes.c_int
    return lib


@functools.cache
def _init() -> None:
    try:
        result = api().cuInit(0)
    except TccRuntimeError:
        raise
    except Exception as exc:  # noqa: BLE001 - cuda-python raises its own types when no driver loads
        raise TccRuntimeError(f"no CUDA driver on this machine ({exc})",
                              hint="running on target='cuda' needs an NVIDIA GPU; compiling and "
                                   "lower(stage='cuda'/'ptx') work without one") from None
    check(result, "cuInit", "no usable NVIDIA GPU here")


def init() -> None:
    """Initialise the driver once (raises a TccRuntimeError with no GPU)."""
    with _LOCK:
        _init()


def device_count() -> int:
    init()
    return check(api().cuDeviceGetCount(), "cuDeviceGetCount")


# Intermediates come from cuMemAllocAsync on the device's default pool. By default the pool gives
# freed memory back at every synchronisation, so a caller that synchronises after each call paid
# a fresh allocation per intermediate per call (138 us against 27 us without intermediates, H100);
# the pool keeps up to this much freed memory for the next call instead.
POOL_RELEASE_THRESHOLD = 1 << 30


class Context:
    """The primary context of one device."""

    def __init__(self, ordinal: int):
        d = api()
        self.ordinal = ordinal
        self.device = check(d.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.handle = check(d.cuDevicePrimaryCtxRetain(self.device), f"retaining the context of cuda:{ordinal}")
        self.ptr = int(self.handle)
        major = check(d.cuDeviceGetAttribute(
            d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "cuDeviceGetAttribute")
        minor = check(d.cuDeviceGetAttribute(
            d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "cuDeviceGetAttribute")
        self.arch = f"sm_{major}{minor}"
        self.pool = check(d.cuDeviceGetDefaultMemPool(self.device), f"the memory pool of cuda:{ordinal}")
        check(d.cuMemPoolSetAttribute(self.pool, d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                      d.cuuint64_t(POOL_RELEASE_THRESHOLD)), f"the memory pool of cuda:{ordinal}")

    def activate(self) -> None:
        """Make this context current on the calling thread (a no-op when it already is)."""
        lib = libcuda()
        if lib is not None:
            current = ctypes.c_void_p()
            if lib.cuCtxGetCurrent(ctypes.byref(current)) == 0 and (current.value or 0) == self.ptr:
                return
        d = api()
        current = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) != self.ptr:
            check(d.cuCtxSetCurrent(self.handle), f"making cuda:{self.ordinal} current")


def device_target(ordinal: int) -> CudaTarget:
    """The resources of device ``ordinal``, read from the driver."""
    ctx = context(ordinal)
    d = api()
    attr = d.CUdevice_attribute

    def read(name: str) -> int:
        return int(check(d.cuDeviceGetAttribute(getattr(attr, f"CU_DEVICE_ATTRIBUTE_{name}"), ctx.device),
                         f"reading {name.lower()} of cuda:{ordinal}"))

    return CudaTarget(ctx.arch, read("MULTIPROCESSOR_COUNT"), read("MAX_SHARED_MEMORY_PER_BLOCK"),
                      read("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"), read("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
                      read("MAX_REGISTERS_PER_MULTIPROCESSOR"), read("MAX_THREADS_PER_BLOCK"),
                      read("L2_CACHE_SIZE"))


def context(ordinal: int) -> Context:
    ctx = _CONTEXTS.get(ordinal)
    if ctx is None:
        init()
        count = device_count()
        if not 0 <= ordinal < count:
            raise TccRuntimeError(f"no device cuda:{ordinal} (this machine has {count})")
        with _LOCK:
            ctx = _CONTEXTS.setdefault(ordinal, Context(ordinal))
    return ctx


def current_device() -> int:
    """The device of the calling thread's current context, else 0."""
    init()
    d = api()
    current = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(current) == 0:
        return 0
    return int(check(d.cuCtxGetDevice(), "cuCtxGetDevice"))


def pointer_device(ptr: int, what: str) -> int:
    """The device ordinal that owns a device pointer."""
    init()
    d = api()
    attr = d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(d.cuPointerGetAttribute(attr, ptr), f"{what}: not a CUDA device pointer",
                     "pass a CUDA tensor (PyTorch, CuPy, tcc.cuda.Array) or a host array"))


# ---------------------------------------------------------------- memory

def alloc(nbytes: int, stream: int, what: str) -> int:
    """Stream-ordered device memory; ``what`` names the tensor in errors."""
    size = max(1, nbytes)
    err, ptr = api().cuMemAllocAsync(size, stream)
    if err != api().CUresult.CUDA_SUCCESS:
        raise TccRuntimeError(f"{what}: cannot allocate {nbytes} bytes on the GPU: {error_name(err)}",
                              hint=_hint(err))
    _LIVE_BYTES[0] += size
    return int(ptr)


def free(ptr: int, nbytes: int, stream: int) -> None:
    api().cuMemFreeAsync(ptr, stream)
    _LIVE_BYTES[0] -= max(1, nbytes)


def live_bytes() -> int:
    """Device memory that tcc allocated and has not freed yet."""
    return _LIVE_BYTES[0]


def copy_htod(dst: int, src: int, nbytes: int, stream: int, what: str) -> None:
    if nbytes:
        check(api().cuMemcpyHtoDAsync(dst, src, nbytes, stream), f"{what}: copy to the GPU")


def copy_dtoh(dst: int, src: int, nbytes: int, stream: int, what: str) -> None:
    if nbytes:
        check(api().cuMemcpyDtoHAsync(dst, src, nbytes, stream), f"{what}: copy from the GPU")


def copy_dtod(dst: int, src: int, nbytes: int, stream: int, what: str) -> None:
    if nbytes:
        check(api().cuMemcpyDtoDAsync(dst, src, nbytes, stream), f"{what}: device copy")


def synchronize(stream: int, what: str) -> None:
    check(api().cuStreamSynchronize(stream), what)


# ---------------------------------------------------------------- modules and launches

_CTYPES = {"p": ctypes.c_uint64, "f16": ctypes.c_float, "bf16": ctypes.c_float, "f32": ctypes.c_float,
           "f64": ctypes.c_double, "i8": ctypes.c_int8, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
           "bool": ctypes.c_bool}


class Launcher:
    """One kernel of a loaded module: its function handle and reusable argument storage."""

    def __init__(self, module: Any, name: str, grid: int, block: int, params: list[tuple[str, str]],
                 shared: int = 0):
        self.name = name
        self.grid = grid
        self.block = block
        self.shared = shared  # bytes of dynamic shared memory
        self.fn = check(api().cuModuleGetFunction(module, name.encode()), f"finding kernel {name}")
        if shared > 48 * 1024:  # above the default limit only after opting in
            attr = api().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(api().cuFuncSetAttribute(self.fn, attr, shared), f"kernel {name}: {shared} bytes of shared memory",
                  "the GPU has less shared memory than the kernel was scheduled for: pass its CudaTarget")
        self.names = [p for p, _ in params]
        self.pointers = [i for i, (_, code) in enumerate(params) if code == "p"]
        self.slots = [_CTYPES[code]() for _, code in params]
        self.argv = (ctypes.c_void_p * max(1, len(params)))(*[ctypes.addressof(s) for s in self.slots])
        self.argv_ptr = ctypes.addressof(self.argv)
        self.lock = threading.Lock()
        self.fallback: Launcher | None = None
        lib = libcuda()
        if lib is not None:
            self.cu_launch, self.fn_arg = lib.cuLaunchKernel, int(self.fn)
        else:
            self.cu_launch, self.fn_arg = _python_launch, self.fn

    def set_fallback(self, other: Launcher) -> None:
        """Make this an aligned variant: calls whose pointers are not all 16-byte aligned run ``other``
        (a kernel of the same parameters, assuming nothing)."""
        if other.names != self.names:
            raise TccRuntimeError(f"internal error: kernels {self.name} and {other.name} differ in parameters")
        self.fallback = other

    def launch(self, values: dict[str, Any], stream: int, op: str) -> None:
        """Launch with each parameter taken from ``values`` by name."""
        self.launch_ordered([values[n] for n in self.names], list(range(len(self.names))), stream, op)

    def launch_ordered(self, values: list[Any], order: list[int], stream: int, op: str) -> None:
        """Launch with parameter ``i`` taken from ``values[order[i]]`` (the fast path's layout)."""
        if self.fallback is not None and any(values[order[i]] % 16 for i in self.pointers):
            self.fallback.launch_ordered(values, order, stream, op)
            return
        with self.lock:
            for slot, i in zip(self.slots, order):
                slot.value = values[i]
            err = self.cu_launch(self.fn_arg, self.grid, 1, 1, self.block, 1, 1, self.shared, stream, self.argv_ptr,
                                 None)
        if err != 0:
            self._fail(err, op)

    def _fail(self, err: Any, op: str) -> None:
        if isinstance(err, int):
            err = api().CUresult(err)
        raise TccRuntimeError(f"op {op}: launching kernel {self.name} ({self.grid} blocks of {self.block} "
                              f"threads) failed: {error_name(err)}", hint=_hint(err))


def _python_launch(fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: int,
                   argv: int, extra: Any) -> Any:
    """cuLaunchKernel through cuda-python, answering as the ctypes call does (0 on success)."""
    (err,) = api().cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, argv, 0)
    return 0 if err == api().CUresult.CUDA_SUCCESS else err


def load_module(cubin: bytes, what: str) -> Any:
    return check(api().cuModuleLoadData(cubin), f"{what}: loading the compiled kernels",
                 "the cubin does not fit this GPU: compile with arch= set to its compute capability")
