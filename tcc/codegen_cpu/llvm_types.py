"""LLVM types and constants shared by the CPU code generator's emitters."""

from __future__ import annotations

import hashlib

from llvmlite import ir

from tcc.dtypes import DType
from tcc.errors import TccCompileError

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
FLOAT_TYPES = {"f16": ir.HalfType(), "f32": ir.FloatType(), "f64": ir.DoubleType()}
INT_TYPES = {"i8": I8, "i32": I32, "i64": I64}
ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def value_type(dtype: DType) -> ir.Type:
    """The LLVM type of a value in registers."""
    if dtype.name == "bf16":
        raise TccCompileError("bf16 is supported on target='cuda' only",
                              hint="use f32 or f16 on the CPU")
    if dtype.is_bool:
        return I1
    return FLOAT_TYPES.get(dtype.name) or INT_TYPES[dtype.name]


def memory_type(dtype: DType) -> ir.Type:
    """The LLVM type of an element in memory (bools are bytes, as in NumPy)."""
    return I8 if dtype.is_bool else value_type(dtype)


MAX_LOCAL_NAME = 64  # LLVM truncates local names at 1,024 characters, so long ones would collide


def local_name(name: str) -> str:
    """A user-derived name for an LLVM local value or block: itself when short, else a prefix
    and a hash of the whole (names stay readable and distinct; llvmlite numbers any repeats)."""
    if len(name) <= MAX_LOCAL_NAME:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=6).hexdigest()
    return f"{name[:MAX_LOCAL_NAME - 13]}.{digest}"


def llvm_const(ty: ir.Type, value: int | float) -> ir.Constant:
    """A constant of a scalar or vector type (splatted)."""
    if isinstance(ty, ir.VectorType):
        return splat_constant(ty.element, ty.count, value)
    return ir.Constant(ty, value)


# Vector constants, each made once per process. llvmlite builds a vector constant lane by lane, one
# Constant object each, and prints it again wherever it is used; an object prints once (its text is
# cached). A fifth of a convolution's LLVM IR building went into the same few splats and masks.
_VECTORS: dict[tuple, ir.Constant] = {}
MAX_VECTORS = 4096


def splat_constant(elem: ir.Type, lanes: int, value: int | float | bool | None) -> ir.Constant:
    """``<lanes x elem>`` with every lane ``value`` (None: zero)."""
    tag = value.hex() if isinstance(value, float) else value  # -0.0 == 0.0: keep them apart
    return _vector(elem, lanes, (type(value), tag), lambda: [value] * lanes if value is not None else None)


def int_vector(elem: ir.IntType, values: tuple[int, ...]) -> ir.Constant:
    """An integer vector constant (lane indices, shuffle masks)."""
    return _vector(elem, len(values), values, lambda: list(values))


def _vector(elem: ir.Type, lanes: int, tag: object, values) -> ir.Constant:
    key = (elem, lanes, tag)
    found = _VECTORS.get(key)
    if found is None:
        if len(_VECTORS) >= MAX_VECTORS:
            _VECTORS.clear()
        found = _VECTORS[key] = _Vector(ir.VectorType(elem, lanes), values())
    return found


class _Vector(ir.Constant):
    """A vector constant printed short: ``zeroinitializer`` when every lane is +0, ``splat (T v)``
    when all lanes are equal, else lane by lane. llvmlite always prints lane by lane, and zero
    vectors alone were about a fifth of a convolution's IR text (printed, then parsed by LLVM)."""

    def _get_reference(self) -> str:
        lanes = {lane.get_reference() for lane in self.constant}
        if len(lanes) > 1:
            return super()._get_reference()
        first = self.constant[0]
        if first.constant is None or (first.constant == 0 and str(first.constant)[0] != "-"):
            return "zeroinitializer"
        return f"splat ({first})"


def like(ty: ir.Type, elem: ir.Type) -> ir.Type:
    """``elem``, as a vector when ``ty`` is one."""
    return ir.VectorType(elem, ty.count) if isinstance(ty, ir.VectorType) else elem


def lane_mask(indices: range | list[int]) -> ir.Constant:
    """A shufflevector mask."""
    return int_vector(I32, tuple(indices))


def type_suffix(ty: ir.Type) -> str:
    """The overload suffix of an LLVM intrinsic for ``ty``: ``f32``, ``v8f64``, ``v16i8``, ..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    return {"half": "f16", "float": "f32", "double": "f64"}[str(ty)]


class _LoopId(ir.values.MDValue):
    """A loop's ``!llvm.loop`` node: distinct, its first operand itself (as LLVM requires)."""

    def __init__(self, module: ir.Module, properties: list[ir.values.MDValue]):
        super().__init__(module, properties, name=str(len(module.metadata)))

    def descr(self, buf: list[str]) -> None:
        operands = ", ".join(p.get_reference() for p in self.operands)
        buf += (f"distinct !{{ {self.get_reference()}, {operands} }}", "\n")

    __hash__ = object.__hash__  # one node per loop: not merged with equal ones
    __eq__ = object.__eq__


def loop_metadata(module: ir.Module, *properties: str) -> ir.values.MDValue:
    """A new loop id holding ``properties`` (e.g. ``llvm.loop.unroll.disable``), for a loop's latch
    branch."""
    return _LoopId(module, [module.add_metadata([name]) for name in properties])
