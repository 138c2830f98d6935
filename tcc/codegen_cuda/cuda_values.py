"""C text of values in the CUDA printer: register and memory types, conversions between
formats (16-bit and 8-bit floats are bit patterns in memory, ``float`` in registers, rounded
after every operation), literals."""

from __future__ import annotations

import math
import struct

import numpy as np

from tcc.dtypes import DType, round_fp8

VALUE_TYPE = {"f16": "float", "bf16": "float", "f32": "float", "f64": "double", "i8": "signed char",
              "i32": "int", "i64": "long long", "bool": "bool", "f8e4m3": "float", "f8e5m2": "float"}
MEMORY_TYPE = {**VALUE_TYPE, "f16": "unsigned short", "bf16": "unsigned short", "bool": "unsigned char",
               "f8e4m3": "unsigned char", "f8e5m2": "unsigned char"}
NARROW = ("f16", "bf16", "f8e4m3", "f8e5m2")  # floats held as float in registers, rounded after each operation


def round_to(text: str, dtype: DType) -> str:
    """Round an f32 computation of an f16/bf16 (or 8-bit float) value to that type's precision."""
    return f"tcc_round_{dtype.name}({text})" if dtype.name in NARROW else text


def wrap(text: str, dtype: DType) -> str:
    """Narrow integer arithmetic back to i8 (C computes it in int)."""
    if dtype.name == "i8":
        return f"(signed char){text}"
    return round_to(text, dtype)


def from_memory(text: str, dtype: DType) -> str:
    if dtype.name in NARROW:
        return f"tcc_{dtype.name}_to_f32({text})"
    if dtype.is_bool:
        return f"({text} != 0)"
    return text


def to_memory(text: str, dtype: DType) -> str:
    if dtype.name in NARROW:
        return f"tcc_f32_to_{dtype.name}({text})"
    if dtype.is_bool:
        return f"(unsigned char)({text})"
    return text


def convert(x: str, src: DType, dst: DType) -> str:
    """C for a value cast, with NumPy's meaning (float -> bool is ``!= 0``, NaN included)."""
    if src == dst:
        return x
    if dst.is_bool:
        return f"({x} != 0)"
    if dst.name == "f16" and src.name == "f64":
        return f"tcc_f16_to_f32(tcc_f64_to_f16({x}))"
    if dst.name != "f16" and dst.name in NARROW and src.name == "f64":  # not through a rounded f32: that
        return f"tcc_round_{dst.name}(tcc_f64_to_f32_odd({x}))"  # would round twice (to odd first is exact)
    if dst.name in NARROW:
        return f"tcc_round_{dst.name}((float){x})"
    if src.is_float and dst.is_int:  # truncate, saturate to i64 (NaN: 0; cvt.rzi does both), wrap
        return f"(({VALUE_TYPE[dst.name]})(long long){x})"
    return f"({VALUE_TYPE[dst.name]}){x}"


def const_text(value: int | float | bool, dtype: DType) -> str:
    """A C literal of ``dtype``; f16/bf16 constants are rounded to their precision first."""
    if dtype.is_bool:
        return "true" if value else "false"
    if dtype.is_int:
        v = int(value)
        if dtype.name == "i64":
            return f"({v + 1}LL - 1)" if v == -(2**63) else f"{v}LL"
        if dtype.name == "i32":
            return "(-2147483647 - 1)" if v == -(2**31) else str(v)
        return f"((signed char){v})"
    v = float(value)
    if dtype.name == "f16":
        v = float(np.float16(v))
    elif dtype.name == "bf16":
        v = round_bf16(v)
    elif dtype.is_fp8:
        v = float(round_fp8(v, dtype))
    if math.isnan(v):
        return "__longlong_as_double(0x7ff8000000000000LL)" if dtype.name == "f64" else "__int_as_float(0x7fc00000)"
    if math.isinf(v):
        sign = "-" if v < 0 else ""
        if dtype.name == "f64":
            return f"{sign}__longlong_as_double(0x7ff0000000000000LL)"
        return f"{sign}__int_as_float(0x7f800000)"
    text = repr(v)
    return text if dtype.name == "f64" else f"{text}f"


def round_bf16(v: float) -> float:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
