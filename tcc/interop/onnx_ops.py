"""ONNX elementwise, reduction and shape operators as tcc statements and views.

Each handler takes the program, the node and its input values (None for an omitted optional
input) and returns its output values. Elementwise nodes become one statement each (fusion inlines
chains of them); shape-only nodes become views (index expressions) or, on values known at
import, NumPy folds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tcc.interop.onnx_graph import (
    NUMPY_DTYPES,
    NeedsValue,
    Node,
    OnnxImportError,
    Program,
    Value,
    broadcast_read,
    broadcast_shape,
    float_literal,
    view,
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


def cast_text(text: str, dtype: str) -> str:
    return f"{dtype}({text})"


def is_float(dtype: str) -> bool:
    return dtype.startswith("f") or dtype == "bf16"


def zero(dtype: str) -> str:
    return "0.0" if is_float(dtype) else "0"


def small_known(args: Sequence[Value | None]) -> bool:
    return all(a is None or (a.const is not None and a.size <= FOLD_LIMIT) for a in args)


def elementwise(p: Program, node: Node, args: Sequence[Value], dtype: str, template: Callable[..., str]) -> Value:
    """One statement over the broadcast shape of ``args``: ``template(read0, read1, ...)``."""
    shape = broadcast_shape(node, *(a.shape for a in args))
    return p.emit(node.outputs[0], shape, dtype,
                  lambda idx: template(*(f"({broadcast_read(a, idx, shape)})" for a in args)))


# ---------------------------------------------------------------- elementwise

UNARY: dict[str, tuple[Callable[[str, str], str], Callable]] = {
    "Neg": (lambda x, t: f"-{x}", np.negative),
    "Abs": (lambda x, t: f"abs({x})", np.abs),
    "Sqrt": (lambda x, t: f"sqrt({x})", np.sqrt),
    "Exp": (lambda x, t: f"exp({x})", np.exp),
    "Log": (lambda x, t: f"log({x})", np.log),
    "Erf": (lambda x, t: f"erf({x})", None),
    "Sigmoid": (lambda x, t: f"sigmoid({x})", None),
    "Tanh": (lambda x, t: f"tanh({x})", np.tanh),
    "Relu": (lambda x, t: f"max({x}, {zero(t)})", lambda a: np.maximum(a, 0).astype(a.dtype)),
}


def unary(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    template, fold = UNARY[node.op_type]
    if fold is not None and small_known([x]):
        return [p.constant(fold(x.const), x.dtype, node.outputs[0])]
    return [elementwise(p, node, [x], x.dtype, lambda a: template(a, x.dtype))]


def _trunc_div(a: str, b: str) -> str:
    """Integer division rounding toward zero, as ONNX (and C) divide."""
    return f"select(({a} % {b} != 0) and (({a} < 0) != ({b} < 0)), {a} // {b} + 1, {a} // {b})"


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
        sign = {"Equal": "==", "Less": "<", "Greater": ">"}[op]
        return [elementwise(p, node, [a, b], "bool", lambda x, y: f"{x} {sign} {y}")]
    if op == "Div" and not is_float(a.dtype):
        return [elementwise(p, node, [a, b], a.dtype, _trunc_div)]
    if op == "Pow":
        return [elementwise(p, node, [a, b], a.dtype, lambda x, y: _pow(x, y, a.dtype, b.dtype))]
    sign = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}[op]
    return [elementwise(p, node, [a, b], a.dtype, lambda x, y: f"{x} {sign} {y}")]


def _pow(x: str, y: str, xt: str, yt: str) -> str:
    if xt == yt:
        return f"{x} ** {y}"
    if is_float(xt):
        return f"{x} ** {xt}({y})"
    return f"{xt}(f64({x}) ** f64({y}))"


def variadic_sum(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    present = [a for a in args if a is not None]
    return [elementwise(p, node, present, present[0].dtype, lambda *xs: " + ".join(xs))]


def where(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    c, a, b = args
    return [elementwise(p, node, [c, a, b], a.dtype, lambda x, y, z: f"select({x}, {y}, {z})")]


def leaky_relu(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, alpha = args[0], float_literal(node.attrs.get("alpha", 0.01))
    return [elementwise(p, node, [x], x.dtype, lambda a: f"select({a} < 0, {a} * {alpha}, {a})")]


def gelu(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, approximate = args[0], node.attrs.get("approximate", "none")
    if approximate == "tanh":
        def body(a: str) -> str:
            return f"0.5 * {a} * (1.0 + tanh({math.sqrt(2 / math.pi)!r} * ({a} + 0.044715 * {a} * {a} * {a})))"
    elif approximate == "none":
        def body(a: str) -> str:
            return f"0.5 * {a} * (1.0 + erf({a} * {1 / math.sqrt(2)!r}))"
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

    def body(a: str, *rest: str) -> str:
        it = iter(rest)
        text = f"max({a}, {next(it)})" if lo_v is not None else a
        return f"min({text}, {next(it)})" if hi_v is not None else text

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
        return [elementwise(p, node, [x], to, lambda a: f"{a} != 0")]
    if to == "f16" and x.dtype == "f64":  # through f32: tcc's CPU f64 -> f16 cast crashes (see docs/onnx.md)
        return [elementwise(p, node, [x], to, lambda a: f"f16(f32({a}))")]
    return [elementwise(p, node, [x], to, lambda a: cast_text(a, to))]


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


def reduce_text(kind: str, x: Value, axes: Sequence[int], idx: Sequence[str], body: Callable[[list[str]], str],
                prefix: str = "k") -> str:
    """``kind[k0: n0, ...](body(full index))`` where the reduced positions of ``idx`` become k's."""
    ks = {a: f"{prefix}{n}" for n, a in enumerate(axes)}
    full = [ks.get(d, idx[d] if d < len(idx) else "0") for d in range(x.rank)]
    extents = ", ".join(f"{ks[a]}: {x.shape[a]}" for a in axes)
    return f"{kind}[{extents}]({body(full)})"


def keep_index(idx: Sequence[str], rank: int, axes: Sequence[int], keepdims: bool) -> list[str]:
    """The input index of a reduction's output index ``idx`` (reduced positions filled later)."""
    if keepdims:
        return list(idx)
    it = iter(idx)
    return ["0" if d in axes else next(it) for d in range(rank)]


def reduce(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axes = axes_of(node, args, 1, x.rank)
    if not axes:  # no axes: all of them, or none at all with noop_with_empty_axes
        if node.attrs.get("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    axes = sorted(set(axes))
    keepdims = bool(node.attrs.get("keepdims", 1))
    shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape) if keepdims or d not in axes)
    count = math.prod(x.shape[a] for a in axes)
    kind = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max"}[node.op_type]

    read = x.read
    if x.dtype == "bool":  # any(): the largest of 0/1 is positive
        kind, read = "max", (lambda full: f"select({x.read(full)}, 1, 0)")

    def body(idx: list[str]) -> str:
        text = reduce_text(kind, x, axes, keep_index(idx, x.rank, axes, keepdims), read)
        if x.dtype == "bool":
            return f"{text} > 0"
        if node.op_type == "ReduceMean":
            text = f"{text} / {count}"
        # tcc sums small ints into i64 and divides ints into f64: cast those back to the input's type
        keeps_type = x.dtype in ("f32", "f64") or x.dtype == "i64" and node.op_type != "ReduceMean"
        return text if keeps_type else cast_text(text, x.dtype)

    if node.op_type == "ReduceMax" and count == 0 and not is_float(x.dtype) and x.dtype != "bool":
        raise node.error("ReduceMax over an empty set of integers has no value")
    return [p.emit(node.outputs[0], shape, x.dtype, body)]


def softmax(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axis = norm_axis(node, node.attrs.get("axis", -1 if node.opset >= 13 else 1), x.rank)
    axes = [axis] if node.opset >= 13 else list(range(axis, x.rank))
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    name = node.outputs[0]
    m = p.emit(name + "_max", kept, x.dtype, lambda idx: reduce_text("max", x, axes, idx, x.read))
    e = p.emit(name + "_exp", x.shape, x.dtype, lambda idx: f"exp({x.read(idx)} - {broadcast_read(m, idx, x.shape)})")
    s = p.emit(name + "_sum", kept, x.dtype, lambda idx: reduce_text("sum", e, axes, idx, e.read))
    if node.op_type == "LogSoftmax":
        def log_softmax(idx: list[str]) -> str:
            return f"{x.read(idx)} - {broadcast_read(m, idx, x.shape)} - log({broadcast_read(s, idx, x.shape)})"

        return [p.emit(name, x.shape, x.dtype, log_softmax)]
    return [p.emit(name, x.shape, x.dtype, lambda idx: f"{e.read(idx)} / {broadcast_read(s, idx, x.shape)}")]


# ---------------------------------------------------------------- shapes


def transpose(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    perm = list(node.attrs.get("perm", range(x.rank - 1, -1, -1)))
    if sorted(perm) != list(range(x.rank)):
        raise node.error(f"perm {perm} is not a permutation of the {x.rank} axes")
    if x.const is not None:
        return [p.constant(np.transpose(x.const, perm), x.dtype, node.outputs[0])]
    inverse = [perm.index(d) for d in range(x.rank)]
    return [view(x, [x.shape[d] for d in perm], lambda idx: x.read([idx[inverse[d]] for d in range(x.rank)]))]


def reshape_view(p: Program, x: Value, shape: Sequence[int], hint: str) -> Value:
    """``x`` with a new shape of the same size: an index expression per dimension group."""
    shape = tuple(int(d) for d in shape)
    if x.const is not None or math.prod(shape) == 0:
        array = x.const if x.const is not None else np.zeros(x.shape, NUMPY_DTYPES[x.dtype])
        return p.constant(array.reshape(shape), x.dtype, hint)
    if shape == x.shape:
        return x
    groups = _reshape_groups(x.shape, shape)

    def read(idx: Sequence[str]) -> str:
        src: list[str] = []
        for ins, outs in groups:
            terms, stride = [], 1
            for d in reversed(outs):
                if shape[d] != 1 and idx[d] != "0":
                    terms.append(idx[d] if stride == 1 else f"{idx[d]} * {stride}")
                stride *= shape[d]
            flat = " + ".join(reversed(terms)) or "0"
            stride, outer = math.prod(x.shape[d] for d in ins), 1
            for d in ins:
                stride //= x.shape[d]
                text = flat if stride == 1 else f"({flat}) // {stride}"
                if outer > 1:  # the flat index runs past this dim only when a larger one sits outside it
                    text = f"({text}) % {x.shape[d]}"
                src.append(text if x.shape[d] != 1 else "0")
                outer *= x.shape[d]
        return x.read(src)

    return view(x, shape, read)


def _reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Runs of source and result dims with equal products (size-1 dims join a neighbour)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        ins, outs = [], []
        a = b = 1
        while True:
            if (a <= b or j >= len(dst)) and i < len(src):
                a *= src[i]
                ins.append(i)
                i += 1
            elif j < len(dst):
                b *= dst[j]
                outs.append(j)
                j += 1
            if a == b and (i >= len(src) or src[i] != 1 or not ins) and (j >= len(dst) or dst[j] != 1 or not outs) \
                    and ins and outs:
                break
            if i >= len(src) and j >= len(dst):
                break
        groups.append((ins, outs))
    return groups


def reshape(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if node.opset < 5:
        target = list(node.attrs["shape"])
    else:
        target = [int(d) for d in const_of(node, args[1], "shape").reshape(-1)]
    allowzero = node.attrs.get("allowzero", 0)
    shape = [x.shape[d] if n == 0 and not allowzero else n for d, n in enumerate(target)]
    if shape.count(-1) > 1:
        raise node.error(f"shape {target} has more than one -1")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape[shape.index(-1)] = x.size // known if known else 0
    if math.prod(shape) != x.size:
        raise node.error(f"cannot reshape {list(x.shape)} to {target}")
    return [reshape_view(p, x, shape, node.outputs[0])]


def flatten(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axis = node.attrs.get("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    return [reshape_view(p, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), node.outputs[0])]


def unsqueeze(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    rank = x.rank + len(node.attrs.get("axes", ())) if "axes" in node.attrs else \
        x.rank + const_of(node, args[1], "axes").size
    axes = axes_of(node, args, 1, rank) or []
    shape, it = [], iter(x.shape)
    for d in range(rank):
        shape.append(1 if d in axes else next(it))
    return [reshape_view(p, x, shape, node.outputs[0])]


def squeeze(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axes = axes_of(node, args, 1, x.rank)
    if axes is None:
        axes = [d for d, n in enumerate(x.shape) if n == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise node.error(f"cannot squeeze axes {axes} of shape {list(x.shape)}")
    return [reshape_view(p, x, [n for d, n in enumerate(x.shape) if d not in axes], node.outputs[0])]


def slice_(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if node.opset < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts = const_of(node, args[1], "starts").reshape(-1).tolist()
        ends = const_of(node, args[2], "ends").reshape(-1).tolist()
        axes = const_of(node, args[3], "axes").reshape(-1).tolist() if len(args) > 3 and args[3] is not None else None
        steps = const_of(node, args[4], "steps").reshape(-1).tolist() if len(args) > 4 and args[4] is not None \
            else None
    axes = [norm_axis(node, int(a), x.rank) for a in (axes if axes is not None else range(len(starts)))]
    steps = steps or [1] * len(axes)
    first = [0] * x.rank
    step = [1] * x.rank
    shape = list(x.shape)
    for a, s, e, k in zip(axes, starts, ends, steps):
        n = x.shape[a]
        if k == 0:
            raise node.error("a slice step is 0")
        s, e = int(s), int(e)
        s, e = s + n if s < 0 else s, e + n if e < 0 else e
        if k > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
            shape[a] = max(0, -(-(e - s) // k))
        else:
            s, e = min(max(s, -1), n - 1), min(max(e, -1), n - 1)
            shape[a] = max(0, -(-(s - e) // -k))
        first[a], step[a] = s, k
    if x.const is not None:
        index = tuple(slice(first[d], first[d] + step[d] * shape[d] if first[d] + step[d] * shape[d] >= 0 else None,
                            step[d]) for d in range(x.rank))
        return [p.constant(x.const[index].reshape(shape), x.dtype, node.outputs[0])]

    def read(idx: Sequence[str]) -> str:
        return x.read([_affine(first[d], step[d], idx[d]) if x.shape[d] != 1 else "0" for d in range(x.rank)])

    return [view(x, shape, read)]


def _affine(start: int, step: int, var: str) -> str:
    term = var if step == 1 else f"{var} * {step}" if step > 0 else f"-{var}" if step == -1 else f"-{var} * {-step}"
    if start == 0:
        return term
    return f"{start} + {term}" if step < 0 else f"{var} + {start}" if step == 1 else f"{start} + {term}"


def gather(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, indices = args[0], args[1]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    n = x.shape[axis]
    shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]
    k = indices.rank
    if indices.const is not None:
        flat = indices.const.reshape(-1).astype(np.int64)
        if np.any((flat < -n) | (flat >= n)):
            raise node.error(f"indices out of range for axis {axis} of size {n}")
        flat = np.where(flat < 0, flat + n, flat)
        if x.const is not None:
            return [p.constant(np.take(x.const, flat.reshape(indices.shape), axis=axis), x.dtype, node.outputs[0])]
        if flat.size == 1 or k == 1 and flat.size > 1 and len(set(np.diff(flat).tolist())) == 1:
            start, step = int(flat[0]), int(flat[1] - flat[0]) if flat.size > 1 else 0

            def read(idx: Sequence[str]) -> str:
                pos = str(start) if k == 0 or step == 0 else _affine(start, step, idx[axis])
                return x.read([*idx[:axis], pos, *idx[axis + k:]])

            return [view(x, shape, read)]

    def body(idx: list[str]) -> str:
        i = indices.read(idx[axis:axis + k])
        picked = x.read([*idx[:axis], "k0", *idx[axis + k:]])
        text = f"sum[k0: {n}](select(select({i} < 0, {i} + {n}, {i}) == k0, {picked}, {zero(x.dtype)}))"
        return text if x.dtype in ("f32", "f64", "i64") else cast_text(text, x.dtype)

    if x.dtype == "bool":
        raise node.error("Gather of booleans with indices known only at run time is not supported")
    return [p.emit(node.outputs[0], shape, x.dtype, body)]


def concat(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    parts = [a for a in args if a is not None]
    axis = norm_axis(node, node.attrs["axis"], parts[0].rank)
    if all(a.const is not None for a in parts):
        return [p.constant(np.concatenate([a.const for a in parts], axis=axis), parts[0].dtype, node.outputs[0])]
    total = sum(a.shape[axis] for a in parts)
    shape = list(parts[0].shape)
    shape[axis] = total
    live = [a for a in parts if a.shape[axis] > 0]
    if len(live) == 1:
        return [live[0]]
    padded, offsets, offset = [], [], 0
    for a in live:
        lo = [0] * a.rank
        hi = [0] * a.rank
        lo[axis], hi[axis] = offset, total - offset - a.shape[axis]
        padded.append(p.pad(a, lo, hi, node.outputs[0] + "_part"))
        offset += a.shape[axis]
        offsets.append(offset)

    def body(idx: list[str]) -> str:
        text = padded[-1].read(idx)
        for a, end in zip(reversed(padded[:-1]), reversed(offsets[:-1])):
            text = f"select({idx[axis]} < {end}, {a.read(idx)}, {text})"
        return text

    return [p.emit(node.outputs[0], shape, parts[0].dtype, body)]


def split(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Split along an axis: each output a view (a slice) of the input."""
    x = args[0]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    n, count = x.shape[axis], len(node.outputs)
    if "split" in node.attrs:
        sizes = list(node.attrs["split"])
    elif len(args) > 1 and args[1] is not None:
        sizes = const_of(node, args[1], "split").reshape(-1).tolist()
    else:
        chunk = -(-n // node.attrs.get("num_outputs", count))
        sizes = [min(chunk, n - k * chunk) for k in range(count)]
    if sum(sizes) != n or len(sizes) != count:
        raise node.error(f"split sizes {sizes} do not cover axis {axis} of size {n} in {count} outputs")
    outputs, start = [], 0
    for size in sizes:
        shape = list(x.shape)
        shape[axis] = int(size)
        if x.const is not None:
            outputs.append(p.constant(np.take(x.const, range(start, start + size), axis=axis), x.dtype, "split"))
        else:
            outputs.append(view(x, shape, lambda idx, s=start: x.read(
                [_affine(s, 1, i) if d == axis else i for d, i in enumerate(idx)])))
        start += int(size)
    return outputs
