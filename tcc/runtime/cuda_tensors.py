"""Device tensors as the CUDA backend sees them: PyTorch and CuPy tensors, anything with
``__cuda_array_interface__``, ``tcc.cuda.Array``; host arrays stay NumPy arrays (to be copied over)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tcc import dtypes
from tcc.codegen_cuda import driver
from tcc.cuda import Array
from tcc.dtypes import DType
from tcc.errors import TccArgumentError
from tcc.runtime.binding import as_host_array


@dataclass
class DeviceTensor:
    """A view of a caller's device tensor: where it is and how it is laid out."""

    ptr: int
    shape: tuple[int, ...]
    tcc_dtype: DType
    device: int
    owner: Any
    kind: str  # "torch" | "cupy" | "tcc" | "cai"
    contiguous: bool = True
    keep: list[Any] = field(default_factory=list)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self.tcc_dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.tcc_dtype.itemsize


@functools.cache
def torch_dtypes() -> dict[Any, DType]:
    import torch

    return {torch.float16: dtypes.f16, torch.bfloat16: dtypes.bf16, torch.float32: dtypes.f32,
            torch.float64: dtypes.f64, torch.int8: dtypes.i8, torch.int32: dtypes.i32, torch.int64: dtypes.i64,
            torch.bool: dtypes.boolean, torch.float8_e4m3fn: dtypes.f8e4m3, torch.float8_e5m2: dtypes.f8e5m2}


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def as_array(value: Any, what: str) -> Any:
    """A :class:`DeviceTensor` for a device tensor, else a NumPy array (to be copied over)."""
    if isinstance(value, Array):
        return DeviceTensor(value.ptr, value.shape, value.tcc_dtype, value.device, value, "tcc")
    if _is_torch(value):
        if value.is_cuda:
            return _from_torch(value, what)
        dt = torch_dtypes().get(value.dtype)
        if dt is not None and not dt.has_numpy:
            raise TccArgumentError(f"{what}: a CPU {dt} tensor cannot be copied to the GPU by tcc",
                                   hint="move it first: x.cuda()")
        return value.detach().resolve_conj().numpy()
    if hasattr(value, "__cuda_array_interface__"):
        return _from_cai(value, what)
    return as_host_array(value, what)


def _from_torch(t: Any, what: str) -> DeviceTensor:
    dt = torch_dtypes().get(t.dtype)
    if dt is None:
        raise TccArgumentError(f"{what}: tcc has no dtype for torch.{str(t.dtype).split('.')[-1]}",
                               hint="use one of f16 bf16 f32 f64 i8 i32 i64 bool float8_e4m3fn float8_e5m2")
    return DeviceTensor(t.data_ptr(), tuple(t.shape), dt, t.device.index or 0, t, "torch", t.is_contiguous())


def _from_cai(value: Any, what: str) -> DeviceTensor:
    cai = value.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    dt = dtypes.from_numpy(np.dtype(cai["typestr"]))
    if dt is None:
        raise TccArgumentError(f"{what}: tcc has no dtype for {cai['typestr']}")
    ptr = int(cai["data"][0])
    strides = cai.get("strides")
    contiguous = strides is None or tuple(strides) == _c_strides(shape, dt.itemsize) or math.prod(shape) <= 1
    device = driver.pointer_device(ptr, what) if ptr else driver.current_device()
    kind = "cupy" if type(value).__module__.startswith("cupy") else "cai"
    return DeviceTensor(ptr, shape, dt, device, value, kind, contiguous)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))
