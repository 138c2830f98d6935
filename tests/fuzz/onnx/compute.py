"""Generators of the computing operators: elementwise (with broadcasting and shared operands),
comparisons and Where on bools, Cast, the Reduce* family (keepdims, axes, rank 0), ArgMax and
ArgMin, Softmax, MatMul and Gemm (shared operands too), Layer-, Batch- and InstanceNormalization.

Operands are kept away from the points where two correct implementations may differ by more than
rounding: a divisor is ``|b| + 0.5``, Log and ReduceLogSum read ``|x| + 1``, a float is cast to an
integer type only when it is small, ArgMax reads exact values (a tie is between equal numbers).
What is left to differ is tcc's bug.
"""

from __future__ import annotations

import math

import numpy as np

from fuzz.onnx.graph import ELEM, FLOATS, INTS, Graph, Val, broadcast_shape, broadcastable_to

UNARY_FLOAT = ("Neg", "Abs", "Sqrt", "Exp", "Log", "Erf", "Sigmoid", "Tanh", "Relu")
UNARY_INT = ("Neg", "Abs")
NUMERIC = FLOATS + ("i32", "i64")


def _float(v: Val) -> bool:
    return v.dtype in FLOATS


def _numeric(v: Val) -> bool:
    return v.dtype in NUMERIC


def unary(g: Graph) -> bool:
    x = g.pick(lambda v: v.dtype in FLOATS + INTS)
    if x is None:
        return False
    op = g.rng.choice(UNARY_FLOAT if _float(x) else UNARY_INT + (("Relu",) if x.dtype != "i64" else ()))
    if op == "Erf" and x.dtype == "f64":
        op = "Tanh"  # onnxruntime has no f64 Erf
    if op in ("Sqrt", "Log"):
        x = g.node("Abs", [x], [(x.dtype, x.shape)])[0]
    if op == "Log":
        x = g.node("Add", [x, g.const(np.ones(()), x.dtype)], [(x.dtype, x.shape)])[0]
    g.node(op, [x], [(x.dtype, x.shape)])
    return True


def activation(g: Graph) -> bool:
    """LeakyRelu, Gelu (opset 20) and Clip with and without bounds."""
    x = g.pick(lambda v: v.dtype in ("f32", "f16"))
    if x is None:
        return False
    op = g.rng.choice(("LeakyRelu", "Clip", "Clip") + (("Gelu",) if g.opset >= 20 else ()))
    if op == "LeakyRelu":
        g.node(op, [x], [(x.dtype, x.shape)], alpha=g.rng.choice((0.01, 0.2, 1.5)))
    elif op == "Gelu":
        g.node(op, [x], [(x.dtype, x.shape)], approximate=g.rng.choice(("none", "tanh")))
    else:
        lo = g.const(np.array(g.rng.uniform(-1.5, 0)), x.dtype) if g.rng.random() < 0.7 else None
        hi = g.const(np.array(g.rng.uniform(0, 1.5)), x.dtype) if g.rng.random() < 0.7 else None
        g.node(op, [x, lo, hi] if hi else [x, lo] if lo else [x], [(x.dtype, x.shape)])
    return True


def operand(g: Graph, x: Val, exact: bool = False) -> Val:
    """A second operand for ``x``: ``x`` itself, a value of a broadcast-compatible shape (an
    exact one if ``exact``), or a new input or constant that broadcasts against it."""
    r = g.rng.random()
    if r < 0.25:
        return x
    if r < 0.6:
        other = g.pick(lambda v: v.dtype == x.dtype and v is not x and broadcasts(v.shape, x.shape)
                       and (v.exact or not exact))
        if other is not None:
            return other
    shape = broadcastable_to(g.rng, x.shape)
    if g.rng.random() < 0.3:  # the other way round: x broadcasts against it
        shape = tuple(g.rng.choice((2, 3)) if d == 1 else d for d in x.shape)
        shape = (g.rng.choice((1, 2)),) * g.rng.randint(0, 1) + shape
    if g.rng.random() < 0.5:
        return g.input(x.dtype, shape)
    return g.const(g.random_array(x.dtype, shape), x.dtype)


def broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        return len(broadcast_shape(a, b)) <= 5
    except ValueError:
        return False


def binary(g: Graph) -> bool:
    """Add, Sub, Mul, Div and Pow; Sum of one to three operands."""
    x = g.pick(lambda v: _numeric(v) or v.dtype == "i8")
    if x is None:
        return False
    op = g.rng.choice(("Add", "Sub", "Mul", "Div", "Pow", "Sum") if _float(x) else ("Add", "Sub", "Mul", "Div"))
    if x.dtype == "i8" and op not in ("Add", "Sub"):
        return False
    if op == "Sum":
        args = [x]
        for _ in range(g.rng.randint(0, 2)):
            y = operand(g, x)
            args.append(y if all(broadcasts(a.shape, y.shape) for a in args) else x)
    elif op == "Div":
        args = [x, away_from_zero(g, operand(g, x))]
    elif op == "Pow":
        x = g.node("Abs", [x], [(x.dtype, x.shape)])[0]
        exponent = np.array(g.rng.choice((2.0, 0.5, 3.0, -1.0, 1.5)))
        args = [x, g.const(exponent, g.rng.choice((x.dtype, "f32")))]
    else:
        args = [x, operand(g, x)]
    shape = x.shape
    for a in args[1:]:
        shape = broadcast_shape(shape, a.shape)
    g.node(op, args, [(x.dtype, shape)])
    return True


def away_from_zero(g: Graph, b: Val) -> Val:
    """``|b| + 0.5`` (``|b| + 1`` for integers): a divisor that cannot be zero."""
    b = g.node("Abs", [b], [(b.dtype, b.shape)])[0]
    one = g.const(np.array(0.5 if _float(b) else 1), b.dtype)
    return g.node("Add", [b, one], [(b.dtype, b.shape)])[0]


def compare(g: Graph) -> bool:
    """Equal, Less, Greater into a bool; Where choosing between two values by a bool."""
    cond = g.pick(lambda v: v.dtype == "bool")
    if cond is None or g.rng.random() < 0.5:
        x = g.pick(lambda v: v.exact and (v.dtype != "bool" or g.rng.random() < 0.3))
        if x is None:
            return False
        op = "Equal" if x.dtype == "bool" else g.rng.choice(("Equal", "Less", "Greater", "Less", "Greater"))
        y = operand(g, x, exact=True)
        cond = g.node(op, [x, y], [("bool", broadcast_shape(x.shape, y.shape))])[0]
        if g.rng.random() < 0.5:
            return True
    a = g.pick(lambda v: v.dtype != "bool" and broadcasts(v.shape, cond.shape)) or g.input("f32", cond.shape)
    b = operand(g, a)
    shape = broadcast_shape(cond.shape, a.shape)
    b = b if broadcasts(shape, b.shape) else a
    shape = broadcast_shape(shape, b.shape)
    g.node("Where", [cond, a, b], [(a.dtype, shape)])
    return True


def cast(g: Graph) -> bool:
    """Cast between every pair of types, but from float to integer or bool only of exact values
    (the float's rounding decides which side of an integer it lands on). A float narrowed to f16
    is not exact: where the next node has no f16 kernel, onnxruntime casts its inputs to f32 and
    then removes the pair Cast(to f16), Cast(to f32), dropping the rounding
    (Equal(Identity(Cast(x)), Cast(x)) is false for x = -0.59497774: seed 1651)."""
    x = g.pick()
    targets = ["f32", "f16", "f64"] + (["bool", "i32", "i64", "i8"] if x.exact or not _float(x) else [])
    to = g.rng.choice(targets)
    narrowed = to == "f16" and x.dtype in ("f32", "f64")
    g.node("Cast", [x], [(to, x.shape)], exact=False if narrowed else None, to=ELEM[to])
    return True


# the Reduce* operators, by the types they take here: onnxruntime has no i8 kernels but ReduceMax
# and ReduceMin's; bool ones only from opset 20; of ints, L2, LogSum and LogSumExp round a float
# result back to an int (a choice of libraries, left out), and a Mean divides exactly or not
REDUCE_TYPES = {"ReduceSum": NUMERIC, "ReduceMean": FLOATS, "ReduceMax": NUMERIC + ("i8", "bool"),
                "ReduceMin": NUMERIC + ("i8", "bool"), "ReduceProd": NUMERIC, "ReduceL1": NUMERIC,
                "ReduceL2": FLOATS, "ReduceSumSquare": NUMERIC, "ReduceLogSum": FLOATS, "ReduceLogSumExp": FLOATS}
PROD_LIMIT = 8  # elements a ReduceProd multiplies: f16's range ends at 65504


def reduce(g: Graph) -> bool:
    """Reduce* over some axes (or all, or none with noop_with_empty_axes, or of a rank-0
    tensor), keepdims either way, axes as an attribute or an input (opset 13 or 18 on)."""
    op = g.rng.choice(list(REDUCE_TYPES))
    x = g.pick(lambda v: v.dtype in REDUCE_TYPES[op] and (v.dtype != "bool" or g.opset >= 20))
    if x is None:
        return False
    axes = g.rng.sample(range(x.rank), g.rng.randint(0, x.rank)) if x.rank else []
    reduced = set(axes) if axes else set(range(x.rank))
    if op == "ReduceProd" and math.prod(x.shape[a] for a in reduced) > PROD_LIMIT:
        return False
    if op == "ReduceLogSum":  # the log of a positive sum
        x = g.node("Abs", [x], [(x.dtype, x.shape)])[0]
        x = g.node("Add", [x, g.const(np.ones(()), x.dtype)], [(x.dtype, x.shape)])[0]
    keep = g.rng.random() < 0.5
    axes_input = g.opset >= (13 if op == "ReduceSum" else 18)
    attrs = {"keepdims": int(keep)} if g.rng.random() < 0.8 or not keep else {}
    if not axes and axes_input and g.rng.random() < 0.2:
        g.node(op, [x], [(x.dtype, x.shape)], noop_with_empty_axes=1, **attrs)  # no axes: x itself
        return True
    shape = [1 if i in reduced else d for i, d in enumerate(x.shape) if keep or i not in reduced]
    spelled = [a - x.rank if g.rng.random() < 0.3 else a for a in axes]
    if axes_input and (axes or g.rng.random() < 0.3):  # an empty axes input: all of them
        g.node(op, [x, g.ints(spelled)], [(x.dtype, shape)], **attrs)
    elif axes:
        g.node(op, [x], [(x.dtype, shape)], axes=spelled, **attrs)
    else:
        g.node(op, [x], [(x.dtype, shape)], **attrs)
    return True


def arg_extreme(g: Graph) -> bool:
    """ArgMax or ArgMin of an exact value (ties only between equal numbers), with keepdims and
    select_last_index (which tied position wins) either way."""
    x = g.pick(lambda v: v.exact and v.rank > 0 and v.dtype in NUMERIC + ("i8",))
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    keep = g.rng.random() < 0.5
    attrs = {"axis": axis - x.rank if g.rng.random() < 0.3 else axis} if axis or g.rng.random() < 0.5 else {}
    if g.rng.random() < 0.8 or not keep:
        attrs["keepdims"] = int(keep)
    if g.rng.random() < 0.6:
        attrs["select_last_index"] = g.rng.choice((0, 1))
    shape = [1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis]
    g.node(g.rng.choice(("ArgMax", "ArgMin")), [x], [("i64", shape)], **attrs)
    return True


def softmax(g: Graph) -> bool:
    x = g.pick(lambda v: _float(v) and v.rank > 0)
    if x is None:
        return False
    axis = g.rng.randint(-x.rank, x.rank - 1)
    g.node(g.rng.choice(("Softmax", "LogSoftmax")), [x], [(x.dtype, x.shape)], axis=axis)
    return True


def matmul(g: Graph) -> bool:
    """MatMul of every rank pairing ONNX allows (1-D operands, batch broadcasting), often of a
    value with itself or with its own transpose."""
    x = g.pick(lambda v: _float(v) and 0 < v.rank <= 4)
    if x is None:
        return False
    k = x.shape[-1]
    if x.rank == 1 and g.rng.random() < 0.5:
        y = x  # a dot product of x with itself: rank 0
    elif x.rank == 2 and x.shape[0] == k and g.rng.random() < 0.5:
        y = x
    elif x.rank >= 2 and g.rng.random() < 0.4:
        perm = list(range(x.rank - 2)) + [x.rank - 1, x.rank - 2]
        y = g.node("Transpose", [x], [(x.dtype, [x.shape[p] for p in perm])], perm=perm)[0]
    else:
        batch = broadcastable_to(g.rng, x.shape[:-2]) if g.rng.random() < 0.5 else ()
        shape = (*batch, k, g.rng.choice((1, 2, 3, 5, 7))) if g.rng.random() < 0.8 else (k,)
        y = g.input(x.dtype, shape) if g.rng.random() < 0.5 else g.const(g.random_array(x.dtype, shape), x.dtype)
    g.node("MatMul", [x, y], [(x.dtype, _matmul_shape(x.shape, y.shape))])
    return True


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    a1, b1 = len(a) == 1, len(b) == 1
    a2, b2 = ((1,) + a if a1 else a), (b + (1,) if b1 else b)
    out = broadcast_shape(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if a1:
        out = out[:-2] + out[-1:]
    if b1:
        out = out[:-1]
    return out


def gemm(g: Graph) -> bool:
    a = g.pick(lambda v: v.dtype in ("f32", "f64") and v.rank == 2)
    if a is None:
        return False
    ta, tb = g.rng.random() < 0.3, g.rng.random() < 0.3
    m, k = a.shape[::-1] if ta else a.shape
    n = g.rng.choice((1, 2, 3, 5, 7))
    if a.shape == (k, k) and g.rng.random() < 0.4:
        b, n = a, k  # A times A (or its transpose)
    else:
        b = g.const(g.random_array(a.dtype, (n, k) if tb else (k, n)), a.dtype)
    args = [a, b]
    if g.rng.random() < 0.7:
        args.append(g.const(g.random_array(a.dtype, broadcastable_to(g.rng, (m, n))), a.dtype))
    attrs = {"transA": int(ta), "transB": int(tb)}
    if g.rng.random() < 0.5:
        attrs.update(alpha=g.rng.choice((0.5, 2.0)), beta=g.rng.choice((0.5, 1.5)))
    g.node("Gemm", args, [(a.dtype, (m, n))], **attrs)
    return True


def normalization(g: Graph) -> bool:
    """LayerNormalization over the trailing axes; BatchNormalization of a rank >= 2 value;
    InstanceNormalization of a rank >= 3 one."""
    x = g.pick(lambda v: v.dtype in ("f32", "f16") and v.rank >= 2)
    if x is None:
        return False
    kind = g.rng.random()
    if kind < 0.4:
        axis = g.rng.randint(-x.rank, x.rank - 1)
        tail = x.shape[axis:]
        scale = g.const(g.random_array(x.dtype, tail), x.dtype)
        bias = g.const(g.random_array(x.dtype, tail), x.dtype) if g.rng.random() < 0.6 else None
        g.node("LayerNormalization", [x, scale] + ([bias] if bias else []), [(x.dtype, x.shape)], axis=axis,
               epsilon=g.rng.choice((1e-5, 1e-3)))
        return True
    c = (x.shape[1],)
    if kind < 0.7 and x.rank >= 3:
        scale, bias = (g.const(g.random_array(x.dtype, c), x.dtype) for _ in range(2))
        g.node("InstanceNormalization", [x, scale, bias], [(x.dtype, x.shape)], epsilon=g.rng.choice((1e-5, 1e-2)))
        return True
    stats = [g.const(g.random_array(x.dtype, c), x.dtype) for _ in range(3)]
    var = g.const(np.abs(g.random_array(x.dtype, c)), x.dtype)
    g.node("BatchNormalization", [x, *stats, var], [(x.dtype, x.shape)], epsilon=1e-5)
    return True
