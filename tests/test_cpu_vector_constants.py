"""The short spellings of vector constants (``zeroinitializer``, ``splat``) mean to LLVM exactly
what llvmlite's lane-by-lane spelling means: both parse to the same constant (-0.0 and NaN
included, which must not become ``zeroinitializer``)."""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest
from llvmlite import ir

from tcc.codegen_cpu.llvm_types import I1, I32, I64, int_vector, splat_constant


def _parsed(const: ir.Constant) -> str:
    """LLVM's own printing of a module returning ``const`` (it prints a constant one way only)."""
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(const.type, []), name="f")
    ir.IRBuilder(fn.append_basic_block()).ret(const)
    return str(llvm.parse_assembly(str(module)))


def _lane_by_lane(const: ir.Constant) -> ir.Constant:
    return ir.Constant(const.type, [lane.constant for lane in const.constant])


@pytest.mark.parametrize("elem, value", [
    (ir.FloatType(), None), (ir.FloatType(), 0.0), (ir.FloatType(), -0.0), (ir.FloatType(), 1.5),
    (ir.DoubleType(), -0.0), (ir.DoubleType(), float("nan")), (ir.HalfType(), 0.0), (I1, True),
    (I1, False), (I64, 0), (I64, 1536), (I32, -1),
])
@pytest.mark.parametrize("lanes", [1, 7, 16])
def test_splat_means_the_same(elem, value, lanes):
    const = splat_constant(elem, lanes, value)
    assert _parsed(const) == _parsed(_lane_by_lane(const))


@pytest.mark.parametrize("values", [(0,) * 8, (0, 1, 2, 3), (5, 5, 5), (0, 0, 1)])
def test_int_vector_means_the_same(values):
    const = int_vector(I32, values)
    assert _parsed(const) == _parsed(_lane_by_lane(const))

