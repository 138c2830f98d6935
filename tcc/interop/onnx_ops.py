"""ONNX elementwise, constant and reduction operators as tcc statements.

Each handler takes the program, the node and its input values (None for an omitted optional
input) and returns its output values. Elementwise nodes become one statement each (fusion inlines
chains of them); on small values known at import they fold with NumPy. Shape operators are in
``onnx_shapes``, neural-network ones in ``onnx_nn``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tcc.frontend.unparse import Ex, add_all, call, num, reduction, select, var
from tcc.interop.graph import (
    NUMPY_DTYPES,
    NeedsValue,
    Node,
    OnnxImportError,
    Program,
    Value,
    broadcast_read,
    broadcast_shape,
    float_literal,
)

FOLD_LIMIT = 4096  # elementwise nodes on known values up to this size are folded with NumPy

# ---------------------------------------------------------------- helpers


def const_of(node: Node, value: Value | None, what: str) -> np.ndarray:
    """The value of an input the import needs (a shape, axes, starts...)."""
    if value is None:
        raise node.error(f"missing input {what}")
    if value.const is not None:
        return value.const
    if value.input_name is not None:
        raise NeedsValue(f"{node.where()}: input {what} ({value.input_name!r}) must be known at import",
                         value.input_name, hint=f"make it an initializer, or pass constants={{{value.input_name!r}: "
                                                "array}} to tcc.onnx.load")
    raise node.error(f"input {what} is computed at run time; tcc needs it at import",
                     hint="tcc compiles for static shapes: this input must be a constant")


def axes_of(node: Node, args: list[Value | None], position: int, rank: int) -> list[int] | None:
    """Axes from the ``axes`` attribute (older opsets) or an input, normalised to 0..rank-1."""
    if "axes" in node.attrs:
        axes = node.attrs["axes"]
    elif len(args) > position and args[position] is not None:
        axes = const_of(node, args[position], "axes").reshape(-1).tolist()
    else:
        return None
    return [norm_axis(node, int(a), rank) for a in axes]


def norm_axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise node.error(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def cast_to(e: Ex, dtype: str) -> Ex:
    return call(dtype, e)


def is_float(dtype: str) -> bool:
    return dtype.startswith("f") or dtype == "bf16"


def zero(dtype: str) -> Ex:
    return num(0.0) if is_float(dtype) else num(0)


def small_known(args: Sequence[Value | None]) -> bool:
    return all(a is None or (a.const is not None and a.size <= FOLD_LIMIT) for a in args)


def elementwise(p: Program, node: Node, args: Sequence[Value], dtype: str, template: Callable[..., Ex]) -> Value:
    """One statement over the broadcast shape of ``args``: ``template(read0, read1, ...)``. It
    remembers a graph input it computes from, so that an import needing its value (shape
    arithmetic on a shape given as an input) asks for that input's value."""
    shape = broadcast_shape(node, *(a.shape for a in args))
    value = p.emit(node.outputs[0], shape, dtype, lambda idx: template(*(broadcast_read(a, idx, shape) for a in args)))
    value.input_name = next((a.input_name for a in args if a.const is None and a.input_name), None)
    return value


# ---------------------------------------------------------------- elementwise

UNARY: dict[str, tuple[Callable[[Ex, str], Ex], Callable]] = {
    "Neg": (lambda x, t: -x, np.negative),
    "Abs": (lambda x, t: call("abs", x), np.abs),
    "Sqrt": (lambda x, t: call("sqrt", x), np.sqrt),
    "Exp": (lambda x, t: call("exp", x), np.exp),
    "Log": (lambda x, t: call("log", x), np.log),
    "Erf": (lambda x, t: call("erf", x), None),
    "Sigmoid": (lambda x, t: call("sigmoid", x), None),
    "Tanh": (lambda x, t: call("tanh", x), np.tanh),
    "Sin": (lambda x, t: call("sin", x), np.sin),
    "Cos": (lambda x, t: call("cos", x), np.cos),
    "Floor": (lambda x, t: call("floor", x), np.floor),
    "Ceil": (lambda x, t: call("ceil", x), np.ceil),
    "Relu": (lambda x, t: call("max", x, zero(t)), lambda a: np.maximum(a, 0).astype(a.dtype)),
}


def unary(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    template, fold = UNARY[node.op_type]
    if fold is not None and small_known([x]):
        return [p.constant(fold(x.const), x.dtype, node.outputs[0])]
    return [elementwise(p, node, [x], x.dtype, lambda a: template(a, x.dtype))]


def _trunc_div(a: Ex, b: Ex) -> Ex:
    """Integer division rounding toward zero, as ONNX (and C) divide."""
    inexact = (a % b).ne(0).and_(a.lt(0).ne(b.lt(0)))
    return select(inexact, a // b + 1, a // b)


BINARY_FOLD = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Less": np.less,
               "Greater": np.greater}


def binary(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    a, b = args[0], args[1]
    op = node.op_type
    if op in BINARY_FOLD and small_known([a, b]):
        result = BINARY_FOLD[op](a.const, b.const)
        return [p.constant(result, "bool" if result.dtype == np.bool_ else a.dtype, node.outputs[0])]
    if op == "Div" and small_known([a, b]) and not is_float(a.dtype):
        with np.errstate(all="ignore"):
            result = np.trunc(a.const / np.where(b.const == 0, 1, b.const)).astype(a.const.dtype)
        return [p.constant(result, a.dtype, node.outputs[0])]
    if op in ("Equal", "Less", "Greater"):
        compare = {"Equal": Ex.eq, "Less": Ex.lt, "Greater": Ex.gt}[op]
        return [elementwise(p, node, [a, b], "bool", compare)]
    if op == "Div" and not is_float(a.dtype):
        return [elementwise(p, node, [a, b], a.dtype, _trunc_div)]
    if op == "Pow" and (power := _small_power(a, b)) is not None:
        return [elementwise(p, node, [a], a.dtype, power)]
    if op == "Pow":
        return [elementwise(p, node, [a, b], a.dtype, lambda x, y: _pow(x, y, a.dtype, b.dtype))]
    arithmetic = {"Add": Ex.__add__, "Sub": Ex.__sub__, "Mul": Ex.__mul__, "Div": Ex.__truediv__}[op]
    return [elementwise(p, node, [a, b], a.dtype, arithmetic)]


def _small_power(a: Value, b: Value) -> Callable[[Ex], Ex] | None:
    """``x ** 2``, ``x ** 3`` (GELU's tanh form, variances) and ``x ** 0.5`` by a known exponent:
    products and a square root, where ``**`` is a call to pow for each element (30 ns)."""
    if b.const is None or b.size != 1 or not is_float(a.dtype):
        return None
    exponent = float(b.const.reshape(-1)[0])
    if exponent in (1.0, 2.0, 3.0, 4.0):
        return lambda x: _product([x] * int(exponent))
    if exponent == 0.5:
        return lambda x: call("sqrt", x)
    return None


def _product(factors: Sequence[Ex]) -> Ex:
    result = factors[0]
    for f in factors[1:]:
        result = result * f
    return result


def _pow(x: Ex, y: Ex, xt: str, yt: str) -> Ex:
    if xt == yt:
        return x ** y
    if is_float(xt):
        return x ** call(xt, y)
    return call(xt, call("f64", x) ** call("f64", y))


def variadic_sum(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    present = [a for a in args if a is not None]
    return [elementwise(p, node, present, present[0].dtype, lambda *xs: add_all(xs))]


def where(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    c, a, b = args
    if small_known([c, a, b]):  # shape arithmetic: exporters replace -1 in a target shape so
        return [p.constant(np.where(c.const, a.const, b.const), a.dtype, node.outputs[0])]
    return [elementwise(p, node, [c, a, b], a.dtype, select)]


def leaky_relu(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, alpha = args[0], float_literal(node.attrs.get("alpha", 0.01))
    return [elementwise(p, node, [x], x.dtype, lambda a: select(a.lt(0), a * alpha, a))]


def gelu(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, approximate = args[0], node.attrs.get("approximate", "none")
    if approximate == "tanh":
        def body(a: Ex) -> Ex:
            return 0.5 * a * (1.0 + call("tanh", math.sqrt(2 / math.pi) * (a + 0.044715 * a * a * a)))
    elif approximate == "none":
        def body(a: Ex) -> Ex:
            return 0.5 * a * (1.0 + call("erf", a * (1 / math.sqrt(2))))
    else:
        raise node.error(f"approximate={approximate!r} is not supported", hint="use 'none' or 'tanh'")
    return [elementwise(p, node, [x], x.dtype, body)]


def clip(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    bounds: list[Value] = []
    if node.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        lo_v = p.constant(np.array(lo), x.dtype) if lo is not None else None
        hi_v = p.constant(np.array(hi), x.dtype) if hi is not None else None
    else:
        lo_v = args[1] if len(args) > 1 else None
        hi_v = args[2] if len(args) > 2 else None
    bounds = [v for v in (lo_v, hi_v) if v is not None]

    def body(a: Ex, *rest: Ex) -> Ex:
        it = iter(rest)
        clipped = call("max", a, next(it)) if lo_v is not None else a
        return call("min", clipped, next(it)) if hi_v is not None else clipped

    return [elementwise(p, node, [x, *bounds], x.dtype, body)]


# ONNX TensorProto element types tcc has (others are refused by name).
ONNX_DTYPES = {1: "f32", 3: "i8", 6: "i32", 7: "i64", 9: "bool", 10: "f16", 11: "f64", 16: "bf16"}
ONNX_TYPE_NAMES = {0: "undefined", 2: "uint8", 4: "uint16", 5: "int16", 8: "string", 12: "uint32", 13: "uint64",
                   14: "complex64", 15: "complex128", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
                   20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0",
                   25: "uint2", 26: "int2"}


def tcc_dtype(node: Node | None, elem_type: int, what: str) -> str:
    dtype = ONNX_DTYPES.get(elem_type)
    if dtype is None or dtype == "bf16":
        name = ONNX_TYPE_NAMES.get(elem_type, "bfloat16" if elem_type == 16 else str(elem_type))
        where = f"{node.where()}: " if node is not None else ""
        raise OnnxImportError(f"{where}{what} has element type {name}, which tcc does not have",
                              hint="tcc's types: float16, float, double, int8, int32, int64, bool")
    return dtype


def cast(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    to = tcc_dtype(node, node.attrs["to"], "the target of Cast")
    if small_known([x]):
        return [p.constant(x.const.astype(NUMPY_DTYPES[to]), to, node.outputs[0])]
    if to == x.dtype:
        return [x]
    if to == "bool":
        return [elementwise(p, node, [x], to, lambda a: a.ne(0))]
    if to == "f16" and x.dtype == "f64":  # through f32: tcc's CPU f64 -> f16 cast crashes (see docs/onnx.md)
        return [elementwise(p, node, [x], to, lambda a: call("f16", call("f32", a)))]
    return [elementwise(p, node, [x], to, lambda a: cast_to(a, to))]


def identity(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    return [args[0]]


def dropout(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    training = len(args) > 2 and args[2] is not None and bool(const_of(node, args[2], "training_mode"))
    if training or node.attrs.get("is_test", 1) == 0 and node.opset < 7:
        raise node.error("training mode is not supported", hint="export the model in inference mode")
    x = args[0]
    outputs = [x]
    if len(node.outputs) > 1 and node.outputs[1]:
        outputs.append(p.constant(np.ones(x.shape, np.bool_), "bool", node.outputs[1]))
    return outputs


# ---------------------------------------------------------------- constants


def constant(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    attrs = node.attrs
    for key, dtype in (("value_float", "f32"), ("value_floats", "f32"), ("value_int", "i64"), ("value_ints", "i64")):
        if key in attrs:
            return [p.constant(np.array(attrs[key]), dtype, node.outputs[0])]
    if "value" in attrs:
        array, elem = attrs["value"]
        return [p.constant(array, tcc_dtype(node, elem, "the value"), node.outputs[0])]
    raise node.error(f"attribute {', '.join(attrs) or '(none)'} is not supported",
                     hint="tcc takes value, value_float(s) and value_int(s)")


def constant_of_shape(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    shape = [int(d) for d in const_of(node, args[0], "shape").reshape(-1)]
    array, elem = node.attrs.get("value", (np.zeros(1, np.float32), 1))
    dtype = tcc_dtype(node, elem, "the value")
    return [p.constant(np.full(shape, array.reshape(-1)[0]), dtype, node.outputs[0])]


def shape_of(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    shape = np.array(args[0].shape, np.int64)
    rank = len(shape)
    start = node.attrs.get("start", 0)
    end = node.attrs.get("end", rank)
    start, end = (min(max(s + rank if s < 0 else s, 0), rank) for s in (start, end))
    return [p.constant(shape[start:end], "i64", node.outputs[0])]


# ---------------------------------------------------------------- reductions


def reduce_over(kind: str, x: Value, axes: Sequence[int], idx: Sequence[Ex], body: Callable[[list[Ex]], Ex],
                prefix: str = "k") -> Ex:
    """``kind[k0: n0, ...](body(full index))`` where the reduced positions of ``idx`` become k's;
    just ``body(idx)`` when there is no axis to reduce (a rank-0 input)."""
    ks = {a: f"{prefix}{n}" for n, a in enumerate(axes)}
    full = [var(ks[d]) if d in ks else idx[d] if d < len(idx) else num(0) for d in range(x.rank)]
    if not axes:
        return body(full)
    return reduction(kind, [(ks[a], x.shape[a]) for a in axes], body(full))


def keep_index(idx: Sequence[Ex], rank: int, axes: Sequence[int], keepdims: bool) -> list[Ex]:
    """The input index of a reduction's output index ``idx`` (reduced positions filled later)."""
    if keepdims:
        return list(idx)
    it = iter(idx)
    return [num(0) if d in axes else next(it) for d in range(rank)]


# Reduce*: (the reduction, what each element contributes, what the total becomes)
REDUCTIONS: dict[str, tuple[str, Callable[[Ex], Ex] | None, Callable[[Ex, int], Ex] | None]] = {
    "ReduceSum": ("sum", None, None),
    "ReduceMean": ("sum", None, lambda total, count: total / count),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceL1": ("sum", lambda x: call("abs", x), None),
    "ReduceL2": ("sum", lambda x: x * x, lambda total, count: call("sqrt", total)),
    "ReduceSumSquare": ("sum", lambda x: x * x, None),
    "ReduceLogSum": ("sum", None, lambda total, count: call("log", total)),
    "ReduceLogSumExp": ("sum", None, None),  # around the maximum: see _log_sum_exp
}


def reduce(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    kind, term, finish = REDUCTIONS[node.op_type]
    axes = axes_of(node, args, 1, x.rank)
    if not axes:  # no axes: all of them, or none with noop_with_empty_axes (ReduceL2 is still |x|)
        noop = node.attrs.get("noop_with_empty_axes", 0)
        if noop and term is None and finish is None and node.op_type != "ReduceLogSumExp":
            return [x]
        axes = [] if noop else list(range(x.rank))
    axes = sorted(set(axes))
    keepdims = bool(node.attrs.get("keepdims", 1))
    shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape) if keepdims or d not in axes)
    count = math.prod(x.shape[a] for a in axes)
    if kind in ("max", "min") and count == 0 and not is_float(x.dtype) and x.dtype != "bool":
        raise node.error(f"{node.op_type} over an empty set of integers has no value")
    if x.dtype == "bool":
        if kind not in ("max", "min"):
            raise node.error(f"{node.op_type} of bools is not defined", hint="Cast them first")
        # any() and all(): the largest (smallest) of 0/1 is positive
        return [p.emit(node.outputs[0], shape, "bool", lambda idx: reduce_over(
            kind, x, axes, keep_index(idx, x.rank, axes, keepdims), lambda full: select(x.read(full), 1, 0)).gt(0))]
    if node.op_type == "ReduceLogSumExp":
        return [_log_sum_exp(p, node, x, axes, keepdims, shape)]

    def body(idx: list[Ex]) -> Ex:
        read = x.read if term is None else (lambda full: term(x.read(full)))
        total = reduce_over(kind, x, axes, keep_index(idx, x.rank, axes, keepdims), read)
        if finish is not None:
            total = finish(total, count)
        # tcc sums small ints into i64 and divides ints into f64: cast those back to the input's type
        keeps_type = x.dtype in ("f32", "f64") or x.dtype == "i64" and finish is None
        return total if keeps_type else cast_to(total, x.dtype)

    return [p.emit(node.outputs[0], shape, x.dtype, body)]


def _log_sum_exp(p: Program, node: Node, x: Value, axes: list[int], keepdims: bool, shape: tuple[int, ...]) -> Value:
    """``m + log(sum(exp(x - m)))`` with ``m`` the maximum: no overflow."""
    if not is_float(x.dtype):
        raise node.error(f"ReduceLogSumExp takes floats, got {x.dtype}")
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    m = p.emit(node.outputs[0] + "_max", kept, x.dtype, lambda idx: reduce_over("max", x, axes, idx, x.read))

    def body(idx: list[Ex]) -> Ex:
        full = keep_index(idx, x.rank, axes, keepdims)
        top = m.read([num(0) if d in axes else i for d, i in enumerate(full)])
        total = reduce_over("sum", x, axes, full, lambda at: call("exp", x.read(at) - m.read(
            [num(0) if d in axes else i for d, i in enumerate(at)])))
        return top + call("log", total)

    return p.emit(node.outputs[0], shape, x.dtype, body)


def arg_extreme(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """ArgMax / ArgMin: the first (or, with select_last_index, the last) position of the extreme."""
    x = args[0]
    if x.dtype == "bool":
        raise node.error(f"{node.op_type} of bools is not supported", hint="Cast them first")
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    keepdims = bool(node.attrs.get("keepdims", 1))
    n = x.shape[axis]
    if n == 0:
        raise node.error(f"{node.op_type} over an empty axis")
    kind = "max" if node.op_type == "ArgMax" else "min"
    kept = tuple(1 if d == axis else size for d, size in enumerate(x.shape))
    extreme = p.emit(node.outputs[0] + "_" + kind, kept, x.dtype,
                     lambda idx: reduce_over(kind, x, [axis], idx, x.read))
    last = bool(node.attrs.get("select_last_index", 0))
    shape = tuple(size for d, size in enumerate(kept) if keepdims or d != axis)

    def body(idx: list[Ex]) -> Ex:
        full = keep_index(idx, x.rank, [axis], keepdims)
        k = var("k0")
        at = [k if d == axis else i for d, i in enumerate(full)]
        hit = x.read(at).eq(extreme.read([num(0) if d == axis else i for d, i in enumerate(full)]))
        position = call("i64", k)
        return reduction("max" if last else "min", [("k0", n)],
                         select(hit, position, call("i64", -1 if last else n)))

    return [p.emit(node.outputs[0], shape, "i64", body)]


def softmax(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axis = norm_axis(node, node.attrs.get("axis", -1 if node.opset >= 13 else 1), x.rank)
    axes = [axis] if node.opset >= 13 else list(range(axis, x.rank))
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    name = node.outputs[0]
    m = p.emit(name + "_max", kept, x.dtype, lambda idx: reduce_over("max", x, axes, idx, x.read))
    e = p.emit(name + "_exp", x.shape, x.dtype,
               lambda idx: call("exp", x.read(idx) - broadcast_read(m, idx, x.shape)))
    s = p.emit(name + "_sum", kept, x.dtype, lambda idx: reduce_over("sum", e, axes, idx, e.read))
    if node.op_type == "LogSoftmax":
        def log_softmax(idx: list[Ex]) -> Ex:
            return x.read(idx) - broadcast_read(m, idx, x.shape) - call("log", broadcast_read(s, idx, x.shape))

        return [p.emit(name, x.shape, x.dtype, log_softmax)]
    return [p.emit(name, x.shape, x.dtype, lambda idx: e.read(idx) / broadcast_read(s, idx, x.shape))]
