"""The dtypes of the tcc language and NumPy-style type promotion.

Promotion follows NumPy 2 (NEP 50): two tensors promote as NumPy arrays do, and Python-like
literals are *weak*: ``x * 2`` keeps ``x``'s dtype, ``i32 * 0.5`` becomes ``f64``. Symbols,
compile-time parameters and index variables used as values are weak integers too, so
``sum[d](X[n, d]) / D`` stays ``f32``.

The 8-bit floats ``f8e4m3`` (OCP E4M3, the "fn" variant: no infinity, largest 448) and ``f8e5m2``
(largest finite 57344) are storage types of CUDA's FP8 tensor cores. A conversion to them
saturates: it rounds to the nearest value (ties to even) of the finite range, keeps NaN and takes
an infinity to the largest finite value of its sign (PTX ``cvt.rn.satfinite``); :func:`round_fp8`
is that rule, shared by constant folding and the reference interpreter.
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
    def is_fp8(self) -> bool:
        return self.kind == "f" and self.bits == 8

    @property
    def has_numpy(self) -> bool:
        """Whether NumPy has this type (bf16 and the 8-bit floats are CUDA-only: held as float32)."""
        return self.name in _NUMPY_NAMES

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that holds this type (bf16 and the 8-bit floats have none: CUDA-only)."""
        if not self.has_numpy:
            raise KeyError(f"{self.name} has no NumPy dtype")
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
f8e4m3 = DType("f8e4m3", "f", 8)
f8e5m2 = DType("f8e5m2", "f", 8)
FP8 = (f8e4m3, f8e5m2)

ALL: dict[str, DType] = {d.name: d for d in (f16, bf16, f32, f64, i8, i32, i64, boolean, f8e4m3, f8e5m2)}
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
    if a.is_fp8 or b.is_fp8:
        return _promote_fp8(a, b)
    if {a, b} == {bf16, f16}:
        return f32
    if bf16 in (a, b):
        other = b if a == bf16 else a
        if other == f16:
            return f32
        return other if other.is_float else bf16
    return from_numpy(np.promote_types(a.numpy, b.numpy)) or f64


def _promote_fp8(a: DType, b: DType) -> DType:
    """An 8-bit float joins another type as f16 would (both formats are exact in f16, bf16 and
    wider floats): with a wider float it becomes that float, with the other 8-bit format f16;
    with bool it stays itself."""
    eight, other = (a, b) if a.is_fp8 else (b, a)
    if other.is_bool:
        return eight
    if other.is_float and not other.is_fp8:
        return other
    return promote(f16, other)


@dataclass(frozen=True)
class Fp8Format:
    """The numbers of an 8-bit float: mantissa bits, the exponent of its smallest normal value and
    its largest finite value."""

    mantissa: int
    min_exponent: int
    largest: float


FP8_FORMATS = {"f8e4m3": Fp8Format(3, -6, 448.0), "f8e5m2": Fp8Format(2, -14, 57344.0)}


def round_fp8(value, dtype: DType) -> np.ndarray:
    """``value`` (any float array) rounded to the 8-bit float ``dtype``, as float64: clamped to the
    finite range first (an infinity too; NaN stays NaN), then rounded to nearest, ties to even,
    straight from float64 (one rounding: a quantum is a power of two, so the division is exact)."""
    fmt = FP8_FORMATS[dtype.name]
    a = np.clip(np.asarray(value, dtype=np.float64), -fmt.largest, fmt.largest)
    exponent = np.maximum(np.frexp(a)[1] - 1, fmt.min_exponent)  # frexp: a = m 2^e, 0.5 <= |m| < 1
    quantum = np.exp2((exponent - fmt.mantissa).astype(np.float64))
    return np.round(a / quantum) * quantum


def fp8_values(dtype: DType) -> np.ndarray:
    """The float32 value of each of the 256 bytes of an 8-bit float (index a uint8 array with it)."""
    byte = np.arange(256, dtype=np.uint16)
    if dtype.name == "f8e5m2":  # the high byte of an f16 (its NaNs made quiet ones)
        with np.errstate(invalid="ignore"):
            value = (byte << 8).view(np.float16).astype(np.float32)
        return np.where(np.isnan(value), np.float32(np.nan), value)
    sign = np.where(byte & 0x80, -1.0, 1.0)
    exponent, mantissa = (byte >> 3) & 0xF, (byte & 7).astype(np.float64)
    value = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * np.exp2(exponent - 7.0))
    value = np.where((exponent == 15) & (mantissa == 7), np.nan, value)  # e4m3fn: no infinity, one NaN
    return (sign * value).astype(np.float32)


def fp8_bytes(value, dtype: DType) -> np.ndarray:
    """The bytes of ``value`` converted to the 8-bit float ``dtype`` (saturating, as
    :func:`round_fp8`): the storage a CUDA tensor of it holds. Positive codes order as their
    values do, so a value's code is its place among the finite positive ones."""
    rounded = round_fp8(value, dtype)
    positive = fp8_values(dtype)[:0x80]
    finite = positive[np.isfinite(positive)]
    with np.errstate(invalid="ignore"):
        codes = np.searchsorted(finite, np.abs(np.nan_to_num(rounded))).astype(np.uint8)
    codes |= np.where(np.signbit(rounded), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(rounded), np.uint8(0x7F), codes).astype(np.uint8)


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
