"""ONNX elementwise operators beyond arithmetic: logic, comparisons, tests for NaN and infinity,
rounding, the remaining activations (HardSigmoid, HardSwish, Softplus, Mish, Elu, ...) and the
variadic Min, Max and Mean. Each is one statement of the language's own functions; fusion
inlines them into their neighbours like any elementwise node.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tcc.frontend.unparse import Ex, call, num, select
from tcc.interop.graph import Node, Program, Value, float_literal
from tcc.interop.onnx_ops import elementwise, is_float, small_known, zero

INF = num(float("inf"))


def _not_bool(node: Node, x: Value) -> None:
    if x.dtype == "bool":
        raise node.error("a bool input: this operator takes numbers", hint="Cast it first")


# ---------------------------------------------------------------- logic and comparisons

LOGIC: dict[str, Callable[[Ex, Ex], Ex]] = {
    "And": Ex.and_, "Or": Ex.or_, "Xor": Ex.ne,
    "GreaterOrEqual": Ex.ge, "LessOrEqual": Ex.le,
}
LOGIC_FOLD = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
              "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal}


def logic(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    a, b = args[0], args[1]
    if node.op_type in ("And", "Or", "Xor") and not a.dtype == b.dtype == "bool":
        raise node.error(f"{node.op_type} takes bool inputs, got {a.dtype} and {b.dtype}")
    if small_known([a, b]):
        return [p.constant(LOGIC_FOLD[node.op_type](a.const, b.const), "bool", node.outputs[0])]
    return [elementwise(p, node, [a, b], "bool", LOGIC[node.op_type])]


def not_(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if x.dtype != "bool":
        raise node.error(f"Not takes a bool input, got {x.dtype}")
    if small_known([x]):
        return [p.constant(np.logical_not(x.const), "bool", node.outputs[0])]
    return [elementwise(p, node, [x], "bool", Ex.not_)]


def is_nan(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if not is_float(x.dtype):
        raise node.error(f"IsNaN takes a float input, got {x.dtype}")
    return [elementwise(p, node, [x], "bool", lambda a: a.ne(a))]


def is_inf(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if not is_float(x.dtype):
        raise node.error(f"IsInf takes a float input, got {x.dtype}")
    positive, negative = node.attrs.get("detect_positive", 1), node.attrs.get("detect_negative", 1)

    def test(a: Ex) -> Ex:
        if positive and negative:
            return call("abs", a).eq(INF)
        if positive:
            return a.eq(INF)
        return a.eq(-INF) if negative else a.ne(a).and_(a.eq(a))  # neither: always false

    return [elementwise(p, node, [x], "bool", test)]


# ---------------------------------------------------------------- arithmetic


def _c_remainder(a: Ex, b: Ex) -> Ex:
    """C's ``fmod``: the sign of the dividend (the language's ``%`` takes the divisor's)."""
    r = a % b
    return select(r.ne(0).and_(r.lt(0).ne(a.lt(0))), r - b, r)


def mod(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    a, b = args[0], args[1]
    _not_bool(node, a)
    fmod = node.attrs.get("fmod", 0)
    if small_known([a, b]) and not is_float(a.dtype):
        with np.errstate(all="ignore"):
            folded = np.fmod(a.const, b.const) if fmod else np.mod(a.const, b.const)
        return [p.constant(np.where(b.const == 0, 0, folded), a.dtype, node.outputs[0])]
    return [elementwise(p, node, [a, b], a.dtype, _c_remainder if fmod else Ex.__mod__)]  # fmod=0: Python's %


def sign(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    _not_bool(node, x)
    one, zero_ = (num(1.0), num(0.0)) if is_float(x.dtype) else (num(1), num(0))
    return [elementwise(p, node, [x], x.dtype, lambda a: select(a.gt(0), one, select(a.lt(0), -one, zero_)))]


def reciprocal(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if not is_float(x.dtype):
        raise node.error(f"Reciprocal takes a float input, got {x.dtype}")
    return [elementwise(p, node, [x], x.dtype, lambda a: 1.0 / a)]


def round_(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Halves to even, as ONNX (and NumPy) round: exact, from floor and the fraction it leaves."""
    x = args[0]
    if not is_float(x.dtype):
        raise node.error(f"Round takes a float input, got {x.dtype}")

    def body(a: Ex) -> Ex:
        down = call("floor", a)
        fraction = a - down
        return select(fraction.gt(0.5), down + 1.0, select(fraction.lt(0.5), down, down + down % 2.0))

    return [elementwise(p, node, [x], x.dtype, body)]


def variadic(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Min, Max and Mean of any number of inputs, broadcast together."""
    present = [a for a in args if a is not None]
    _not_bool(node, present[0])
    if small_known(present) and node.op_type != "Mean":  # shape arithmetic (a crop's pads)
        fold = np.minimum if node.op_type == "Min" else np.maximum
        return [p.constant(fold.reduce(np.broadcast_arrays(*[a.const for a in present])), present[0].dtype,
                           node.outputs[0])]

    def body(*xs: Ex) -> Ex:
        result = xs[0]
        for x in xs[1:]:
            result = result + x if node.op_type == "Mean" else call(node.op_type.lower(), result, x)
        return result / float(len(xs)) if node.op_type == "Mean" and len(xs) > 1 else result

    return [elementwise(p, node, present, present[0].dtype, body)]


# ---------------------------------------------------------------- activations


def _clamp01(a: Ex) -> Ex:
    return call("max", num(0.0), call("min", num(1.0), a))


def _softplus(a: Ex) -> Ex:
    """``log(1 + exp(a))`` without overflow: ``max(a, 0) + log(1 + exp(-|a|))``."""
    return call("max", a, 0.0) + call("log", 1.0 + call("exp", -call("abs", a)))


def _alpha(node: Node, default: float) -> Ex:
    return float_literal(node.attrs.get("alpha", default))


ACTIVATIONS: dict[str, Callable[[Node], Callable[[Ex], Ex]]] = {
    "HardSigmoid": lambda n: lambda a: _clamp01(a * _alpha(n, 0.2) + float_literal(n.attrs.get("beta", 0.5))),
    "HardSwish": lambda n: lambda a: a * _clamp01(a * (1 / 6) + 0.5),
    "Softplus": lambda n: _softplus,
    "Softsign": lambda n: lambda a: a / (1.0 + call("abs", a)),
    "Mish": lambda n: lambda a: a * call("tanh", _softplus(a)),
    "Elu": lambda n: lambda a: select(a.lt(0), _alpha(n, 1.0) * (call("exp", a) - 1.0), a),
    "Celu": lambda n: lambda a: call("max", a, 0.0) + call(
        "min", 0.0, _alpha(n, 1.0) * (call("exp", a / _alpha(n, 1.0)) - 1.0)),
    "Selu": lambda n: lambda a: float_literal(n.attrs.get("gamma", 1.0507009873554805)) * select(
        a.gt(0), a, _alpha(n, 1.6732632423543772) * (call("exp", a) - 1.0)),
    "ThresholdedRelu": lambda n: lambda a: select(a.gt(_alpha(n, 1.0)), a, 0.0),
}


def activation(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if not is_float(x.dtype):
        raise node.error(f"{node.op_type} takes a float input, got {x.dtype}")
    return [elementwise(p, node, [x], x.dtype, ACTIVATIONS[node.op_type](node))]


def prelu(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, slope = args[0], args[1]
    _not_bool(node, x)
    return [elementwise(p, node, [x, slope], x.dtype, lambda a, s: select(a.lt(zero(x.dtype)), a * s, a))]
