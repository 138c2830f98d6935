"""Device arrays for ``target="cuda"``: what ops return when their inputs are not framework tensors.

``tcc.cuda.Array`` owns stream-ordered device memory of one GPU and speaks both interop
protocols (``__cuda_array_interface__`` and DLPack), so ``torch.from_dlpack(a)`` or
``cupy.asarray(a)`` use it in place. ``to_numpy()`` copies it back to the host.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import numpy as np

from tcc import dtypes
from tcc.codegen_cuda import driver
from tcc.dtypes import DType
from tcc.errors import TccArgumentError, TccError

__all__ = ["Array", "allocated_bytes", "device_count", "is_available", "synchronize", "to_device"]

_DLPACK_CODES = {"f": 2, "i": 0, "b": 6}  # kDLFloat, kDLInt, kDLBool
_KDL_BFLOAT = 4
_KDL_CUDA = 2


class Array:
    """A C-contiguous tensor in device memory that tcc allocated."""

    def __init__(self, shape: tuple[int, ...], dtype: DType | str | np.dtype, device: int = 0, *,
                 stream: int = 0):
        self.shape = tuple(int(d) for d in shape)
        self.tcc_dtype = _as_dtype(dtype)
        self.device = device
        self.nbytes = math.prod(self.shape) * self.tcc_dtype.itemsize
        self._stream = stream
        driver.context(device).activate()
        self.ptr = driver.alloc(self.nbytes, stream, f"a {self.tcc_dtype}{list(self.shape)} array")

    def __del__(self) -> None:
        ptr = getattr(self, "ptr", None)
        if ptr is None:
            return
        try:
            driver.context(self.device).activate()
            driver.free(ptr, self.nbytes, self._stream)
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
            pass
        self.ptr = None

    # ------------------------------------------------------------ NumPy-like surface
    @property
    def dtype(self) -> np.dtype | DType:
        """The NumPy dtype, or tcc's ``bf16``, ``f8e4m3``, ``f8e5m2`` (NumPy has none)."""
        return self.tcc_dtype.numpy if self.tcc_dtype.has_numpy else self.tcc_dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"tcc.cuda.Array(shape={self.shape}, dtype={self.tcc_dtype}, device=cuda:{self.device})"

    def to_numpy(self) -> np.ndarray:
        """A host copy (bf16 and the 8-bit floats come back as float32)."""
        if self.tcc_dtype.name == "bf16":
            raw = np.empty(self.shape, np.uint16)
            self._copy_to_host(raw)
            return (raw.astype(np.uint32) << 16).view(np.float32)
        if self.tcc_dtype.is_fp8:
            raw = np.empty(self.shape, np.uint8)
            self._copy_to_host(raw)
            return dtypes.fp8_values(self.tcc_dtype)[raw]
        out = np.empty(self.shape, self.tcc_dtype.numpy)
        self._copy_to_host(out)
        return out

    def _copy_to_host(self, out: np.ndarray) -> None:
        driver.context(self.device).activate()
        driver.copy_dtoh(out.ctypes.data, self.ptr, self.nbytes, self._stream, "Array.to_numpy")
        driver.synchronize(self._stream, "Array.to_numpy")

    # ------------------------------------------------------------ interop
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        typestr = self.tcc_dtype.numpy.str if self.tcc_dtype.has_numpy else f"<V{self.tcc_dtype.itemsize}"
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False), "strides": None,
                "version": 3, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self.device)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A DLPack capsule; the consumer's tensor keeps this array alive.

        Our work runs on the legacy default stream, which orders itself with every blocking
        stream, so no extra synchronisation with the consumer's ``stream`` is needed.
        """
        if copy:
            raise BufferError("tcc.cuda.Array cannot export a copy through DLPack")
        return _export(self)


def _as_dtype(dtype: DType | str | np.dtype) -> DType:
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in dtypes.ALL:
        return dtypes.ALL[dtype]
    found = dtypes.from_numpy(np.dtype(dtype))
    if found is None:
        raise TccArgumentError(f"tcc has no dtype {dtype}")
    return found


def to_device(array: Any, device: int = 0, dtype: DType | str | None = None) -> Array:
    """A device copy of a host array; ``dtype="f8e4m3"`` or ``"f8e5m2"`` converts float values to
    that 8-bit float first (saturating, as the language's conversion does)."""
    want = None if dtype is None else _as_dtype(dtype)
    if want is not None and want.is_fp8:
        host = np.ascontiguousarray(dtypes.fp8_bytes(array, want))
        out = Array(host.shape, want, device)
    elif want is not None:
        raise TccArgumentError(f"tcc.cuda.to_device converts to the 8-bit floats only, not {want}",
                               hint="convert on the host first: array.astype(...)")
    else:
        host = np.ascontiguousarray(array)
        out = Array(host.shape, host.dtype, device)
    driver.copy_htod(out.ptr, host.ctypes.data, out.nbytes, 0, "tcc.cuda.to_device")
    driver.synchronize(0, "tcc.cuda.to_device")
    return out


def is_available() -> bool:
    """Whether a CUDA GPU and driver are usable here."""

    try:
        return driver.device_count() > 0
    except TccError:
        return False


def device_count() -> int:
    return driver.device_count()


def synchronize(device: int = 0) -> None:
    """Wait for all of tcc's work on the legacy default stream of ``device``."""
    driver.context(device).activate()
    driver.synchronize(0, "tcc.cuda.synchronize")


def allocated_bytes() -> int:
    """Device memory tcc holds now (arrays, call temporaries)."""
    return driver.live_bytes()


# ---------------------------------------------------------------- DLPack export (ctypes)

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # raw PyObject*: it is being destroyed
_EXPORTED: dict[int, tuple] = {}  # managed-tensor address -> what must stay alive until the deleter runs
_EXPORT_LOCK = threading.Lock()
_PY = ctypes.PyDLL(None)  # our own function objects: argtypes set here touch nobody else's
_PY.PyCapsule_GetName.restype, _PY.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
_PY.PyCapsule_GetPointer.restype = ctypes.c_void_p
_PY.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_PY.PyCapsule_New.restype = ctypes.py_object
_PY.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]


@_DELETER
def _dl_deleter(managed: Any) -> None:
    with _EXPORT_LOCK:
        _EXPORTED.pop(ctypes.addressof(managed.contents), None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: Any) -> None:
    """A capsule nobody consumed still owns its tensor: release it."""
    if _PY.PyCapsule_GetName(capsule) != b"dltensor":
        return
    address = _PY.PyCapsule_GetPointer(capsule, b"dltensor")
    with _EXPORT_LOCK:
        _EXPORTED.pop(address, None)


def _export(array: Array) -> Any:
    dt = array.tcc_dtype
    if dt.is_fp8:
        raise BufferError(f"tcc.cuda.Array of {dt} has no DLPack export here: pass it to tcc ops, or read it "
                          "with to_numpy()")
    code = _KDL_BFLOAT if dt.name == "bf16" else _DLPACK_CODES[dt.kind]
    shape = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(array.ptr, _DLDevice(_KDL_CUDA, array.device), array.ndim,
                                  _DLDataType(code, dt.bits, 1), shape, None, 0)
    managed.deleter = _dl_deleter
    address = ctypes.addressof(managed)
    with _EXPORT_LOCK:
        _EXPORTED[address] = (managed, shape, array)
    return _PY.PyCapsule_New(address, b"dltensor", _capsule_destructor)
