"""The dtypes of the tcc language and NumPy-style type promotion.

Promotion follows NumPy 2 (NEP 50): two tensors promote as NumPy arrays do, and Python-like
literals are *weak*: ``x * 2`` keeps ``x``'s dtype, ``i32 * 0.5`` becomes ``f64``. Symbols,
compile-time parameters and index variables used as values are weak integers too, so
``sum[d](X[n, d]) / D`` stays ``f32``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    kind: str  # "f" float, "i" signed int, "b" bool
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind == "i"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that holds this type (bf16 has none: it is CUDA-only)."""
        if self.name == "bf16":
            raise KeyError("bf16 has no NumPy dtype")
        return np.dtype(_NUMPY_NAMES[self.name])

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


f16 = DType("f16", "f", 16)
bf16 = DType("bf16", "f", 16)
f32 = DType("f32", "f", 32)
f64 = DType("f64", "f", 64)
i8 = DType("i8", "i", 8)
i32 = DType("i32", "i", 32)
i64 = DType("i64", "i", 64)
boolean = DType("bool", "b", 8)

ALL: dict[str, DType] = {d.name: d for d in (f16, bf16, f32, f64, i8, i32, i64, boolean)}
_NUMPY_NAMES = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8",
                "i32": "int32", "i64": "int64", "bool": "bool"}
_FROM_NUMPY = {np.dtype(v): ALL[k] for k, v in _NUMPY_NAMES.items()}


def from_numpy(dt: np.dtype) -> DType | None:
    """The tcc dtype of a NumPy dtype, or None when tcc has no such type."""
    return _FROM_NUMPY.get(np.dtype(dt))


def promote(a: DType, b: DType) -> DType:
    """NumPy promotion of two strongly typed operands (bf16 joins f16 at f32, like PyTorch)."""
    if a == b:
        return a
    if {a, b} == {bf16, f16}:
        return f32
    if bf16 in (a, b):
        other = b if a == bf16 else a
        if other == f16:
            return f32
        return other if other.is_float else bf16
    return from_numpy(np.promote_types(a.numpy, b.numpy)) or f64


def promote_weak(strong: DType, weak_kind: str) -> DType:
    """Combine a typed operand with a weak literal of kind 'b', 'i' or 'f'."""
    if weak_kind == "f" and not strong.is_float:
        return f64
    if weak_kind == "i" and strong.is_bool:
        return i64
    return strong


def weak_default(weak_kind: str) -> DType:
    """The type a weak value takes when nothing strong is around it (like Python's)."""
    return {"b": boolean, "i": i64, "f": f64}[weak_kind]
