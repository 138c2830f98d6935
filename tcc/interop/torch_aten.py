"""Core ATen operators onto the graph engine: the torch front door's operator table.

AOTAutograd hands ``torch.compile(backend="tcc")`` FX graphs of core ATen calls (after the core
decompositions). Each call here becomes the engine's equivalent, most through the handler of the
ONNX operator with the same meaning (``aten.mm`` is ``MatMul``, ``aten.native_layer_norm`` is
``LayerNormalization`` with its mean and inverse deviation): the two front doors share one set of
lowerings. Shapes are static: they come from the fake tensors FX records on each node
(``node.meta["val"]``); dtypes follow the same record, so that PyTorch's type promotion decides
them (an operand of another dtype is cast first). A call with no entry in :data:`ATEN`, or whose
arguments its entry refuses (``Unsupported``), is left to PyTorch by the partitioner.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch  # the optional dependency of the torch front door

from tcc.errors import TccError
from tcc.frontend.unparse import call, select
from tcc.interop.graph import NUMPY_DTYPES, Node, Program, Value
from tcc.interop.graph_ops import HANDLERS
from tcc.interop.onnx_ops import ONNX_DTYPES

aten = torch.ops.aten
TCC_DTYPES = {torch.float16: "f16", torch.float32: "f32", torch.float64: "f64", torch.int8: "i8",
              torch.int32: "i32", torch.int64: "i64", torch.bool: "bool"}
_ONNX_TYPE = {dtype: elem for elem, dtype in ONNX_DTYPES.items() if dtype != "bf16"}
OPSET = 21


class Unsupported(TccError):
    """An ATen call the engine does not take (this op, or these arguments): PyTorch runs it."""

    kind = "unsupported"


class Lowering:
    """The translation of one FX graph into a ``Program``: what the operator table's entries see."""

    def __init__(self, program: Program):
        self.p = program
        self.node: torch.fx.Node | None = None

    # ------------------------------------------------------------ what the node records
    def meta(self, n: int | None = None) -> Any:
        val = self.node.meta.get("val")  # type: ignore[union-attr]
        return val if n is None else val[n]

    def dtype(self, n: int | None = None) -> str:
        return tcc_dtype(self.meta(n).dtype)

    def shape(self, n: int | None = None) -> tuple[int, ...]:
        return static_shape(self.meta(n).shape)

    # ------------------------------------------------------------ building
    def onnx(self, op_type: str, args: Sequence[Value | None], outputs: int = 1, **attrs: Any) -> list[Value]:
        """The engine's ``op_type`` (an ONNX operator's handler) on ``args``."""
        name = self.node.name  # type: ignore[union-attr]
        node = Node(op_type, name, [f"{name}_in{k}" for k in range(len(args))],
                    [name if k == 0 else f"{name}_{k}" for k in range(outputs)], attrs, OPSET)
        return HANDLERS[op_type](self.p, node, list(args))

    def one(self, op_type: str, *args: Value | None, **attrs: Any) -> Value:
        return self.onnx(op_type, args, **attrs)[0]

    def const(self, value: Any, dtype: str) -> Value:
        return self.p.constant(np.asarray(value, dtype=NUMPY_DTYPES[dtype]), dtype, self.node.name)  # type: ignore

    def ints(self, values: Sequence[int]) -> Value:
        return self.const(np.asarray(list(values), np.int64), "i64")

    def cast(self, x: Value, dtype: str) -> Value:
        return x if x.dtype == dtype else self.one("Cast", x, to=_ONNX_TYPE[dtype])

    def operand(self, x: Value | float | int | bool, dtype: str) -> Value:
        """A tensor or Python number as a ``dtype`` operand."""
        return self.cast(x, dtype) if isinstance(x, Value) else self.const(x, dtype)


def tcc_dtype(dtype: torch.dtype) -> str:
    if dtype not in TCC_DTYPES:
        raise Unsupported(f"element type {dtype} is not one of tcc's")
    return TCC_DTYPES[dtype]


def static_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"shape {list(shape)} is symbolic; tcc compiles for static shapes")
    return tuple(int(d) for d in shape)


def axis_list(dims: Any, rank: int) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    return [d % rank if rank else 0 for d in dims]


# ---------------------------------------------------------------- elementwise

def _arith(op_type: str, scaled: bool = False) -> Callable:
    def lower(t: Lowering, a: Any, b: Any, alpha: Any = 1) -> Value:
        dtype = t.dtype()
        x, y = t.operand(a, dtype), t.operand(b, dtype)
        if scaled and alpha != 1:
            y = t.one("Mul", y, t.const(alpha, dtype))
        return t.one(op_type, x, y)
    return lower


def _compare(op_type: str, negate: bool = False) -> Callable:
    def lower(t: Lowering, a: Any, b: Any) -> Value:
        common = tcc_dtype(torch.result_type(*(x.meta["val"] if isinstance(x, torch.fx.Node) else x
                                               for x in t.node.args[:2])))  # type: ignore[union-attr]
        result = t.one(op_type, t.operand(a, common), t.operand(b, common))
        return t.one("Not", result) if negate else result
    return lower


def _unary(op_type: str, **attrs: Any) -> Callable:
    def lower(t: Lowering, x: Value, *rest: Any, **kw: Any) -> Value:
        if rest or kw:
            raise Unsupported(f"{op_type} with arguments {rest} {kw}")
        return t.one(op_type, t.cast(x, t.dtype()), **attrs)
    return lower


def _logic(op_type: str) -> Callable:
    def lower(t: Lowering, a: Any, b: Any) -> Value:
        if t.dtype() != "bool":
            raise Unsupported(f"bitwise {op_type} of integers")
        return t.one(op_type, t.operand(a, "bool"), t.operand(b, "bool"))
    return lower


def _not(t: Lowering, x: Value) -> Value:
    if x.dtype != "bool":
        raise Unsupported("bitwise not of integers")
    return t.one("Not", x)


def _rsqrt(t: Lowering, x: Value) -> Value:
    return t.one("Reciprocal", t.one("Sqrt", t.cast(x, t.dtype())))


def _div(t: Lowering, a: Any, b: Any, rounding_mode: str | None = None) -> Value:
    if rounding_mode is not None:
        raise Unsupported(f"division with rounding_mode={rounding_mode!r}")
    dtype = t.dtype()
    return t.one("Div", t.operand(a, dtype), t.operand(b, dtype))


def _pow(t: Lowering, a: Any, b: Any) -> Value:
    dtype = t.dtype()
    if b == 2 and not isinstance(b, Value):
        x = t.operand(a, dtype)
        return t.one("Mul", x, x)
    return t.one("Pow", t.operand(a, dtype), t.operand(b, dtype))


def _where(t: Lowering, cond: Value, a: Any, b: Any) -> Value:
    dtype = t.dtype()
    return t.one("Where", t.cast(cond, "bool"), t.operand(a, dtype), t.operand(b, dtype))


def _clamp(t: Lowering, x: Value, lo: Any = None, hi: Any = None) -> Value:
    dtype = t.dtype()
    return t.one("Clip", t.cast(x, dtype), None if lo is None else t.operand(lo, dtype),
                 None if hi is None else t.operand(hi, dtype))


def _gelu(t: Lowering, x: Value, approximate: str = "none") -> Value:
    return t.one("Gelu", x, approximate=approximate)


def _leaky_relu(t: Lowering, x: Value, slope: float = 0.01) -> Value:
    return t.one("LeakyRelu", x, alpha=float(slope))


def _to_copy(t: Lowering, x: Value, **kw: Any) -> Value:
    source = t.node.args[0].meta["val"]  # type: ignore[union-attr]
    if kw.get("device") is not None and torch.device(kw["device"]) != source.device:
        raise Unsupported("a copy to another device")
    if kw.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        raise Unsupported(f"memory_format {kw['memory_format']}")
    return t.cast(x, t.dtype())


def _same(t: Lowering, x: Value, *rest: Any, **kw: Any) -> Value:
    return x  # clone, alias, detach: values, not storage, are what the engine computes


# ---------------------------------------------------------------- reductions

def _reduce(op_type: str) -> Callable:
    def lower(t: Lowering, x: Value, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Value:
        axes = axis_list(dims, x.rank) or list(range(x.rank))
        x = t.cast(x, t.dtype())
        return t.one(op_type, x, t.ints(axes), keepdims=int(keepdim)) if axes else x
    return lower


def _sum_all(t: Lowering, x: Value, *, dtype: Any = None) -> Value:
    return _reduce("ReduceSum")(t, x)


def _softmax(op_type: str) -> Callable:
    def lower(t: Lowering, x: Value, dim: int, half_to_float: bool = False) -> Value:
        if half_to_float:
            raise Unsupported("softmax of f16 into f32")
        return t.one(op_type, x, axis=dim % max(x.rank, 1))
    return lower


# ---------------------------------------------------------------- products and layers

def _mm(t: Lowering, a: Value, b: Value) -> Value:
    return t.one("MatMul", a, b)


def _addmm(t: Lowering, bias: Value, a: Value, b: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    product = t.one("MatMul", a, b)
    if alpha != 1:
        product = t.one("Mul", product, t.const(alpha, product.dtype))
    if beta != 1:
        bias = t.one("Mul", bias, t.const(beta, bias.dtype))
    return t.one("Add", product, bias)


def _convolution(t: Lowering, x: Value, w: Value, bias: Value | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Value:
    nd = x.rank - 2
    pads = list(padding) * 2 if len(padding) == nd else list(padding)
    attrs = {"strides": list(stride), "pads": pads, "dilations": list(dilation), "group": groups}
    if transposed:
        attrs["output_padding"] = list(output_padding)
    return t.onnx("ConvTranspose" if transposed else "Conv", [x, w, bias], **attrs)[0]


def _layer_norm(t: Lowering, x: Value, shape: Sequence[int], weight: Value | None, bias: Value | None,
                eps: float) -> list[Value]:
    tail = tuple(shape)
    weight = weight if weight is not None else t.const(np.ones(tail), x.dtype)
    axis = x.rank - len(tail)
    return t.onnx("LayerNormalization", [x, weight, bias], outputs=3, axis=axis, epsilon=float(eps))


def _embedding(t: Lowering, weight: Value, indices: Value, *rest: Any) -> Value:
    return t.one("Gather", weight, indices, axis=0)


def _index_select(t: Lowering, x: Value, dim: int, index: Value) -> Value:
    return t.one("Gather", x, index, axis=dim % x.rank)


def _first_only(t: Lowering) -> None:
    """Refuse a call whose results after the first (indices, saved statistics) something reads."""
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in t.node.users):  # type: ignore[union-attr]
        raise Unsupported(f"{_operator_name(t.node.target)} with its later results read")  # type: ignore[union-attr]


def _channel(t: Lowering, v: Value | None, rank: int, fill: float, dtype: str, channels: int) -> Value:
    """A per-channel vector shaped to broadcast over (N, C, ...)."""
    v = v if v is not None else t.const(np.full(channels, fill), dtype)
    return t.one("Reshape", v, t.ints([1, channels] + [1] * (rank - 2)))


def _batch_norm_inference(t: Lowering, x: Value, w: Value | None, b: Value | None, mean: Value, var: Value,
                          momentum: float, eps: float) -> list[Value | None]:
    _first_only(t)
    c = x.shape[1]
    w = w if w is not None else t.const(np.ones(c), x.dtype)
    b = b if b is not None else t.const(np.zeros(c), x.dtype)
    return [t.one("BatchNormalization", x, w, b, mean, var, epsilon=float(eps)), None, None]


def _batch_norm_training(t: Lowering, x: Value, w: Value | None, b: Value | None, running_mean: Value,
                         running_var: Value, training: bool, momentum: float, eps: float) -> list[Value]:
    """Batch statistics, the normalised output, and the running statistics updated as PyTorch
    does (the variance unbiased)."""
    if not training:
        raise Unsupported("functional batch norm outside training")
    axes = [0, *range(2, x.rank)]
    c, n = x.shape[1], math.prod(x.shape) // x.shape[1]
    mean = t.one("ReduceMean", x, t.ints(axes), keepdims=0)
    centred = t.one("Sub", x, _channel(t, mean, x.rank, 0, x.dtype, c))
    var = t.one("ReduceMean", t.one("Mul", centred, centred), t.ints(axes), keepdims=0)
    rstd = t.one("Reciprocal", t.one("Sqrt", t.one("Add", var, t.const(eps, x.dtype))))
    out = t.one("Mul", centred, _channel(t, rstd, x.rank, 0, x.dtype, c))
    out = t.one("Add", t.one("Mul", out, _channel(t, w, x.rank, 1, x.dtype, c)), _channel(t, b, x.rank, 0, x.dtype, c))

    def update(old: Value, new: Value) -> Value:
        return t.one("Add", t.one("Mul", old, t.const(1 - momentum, old.dtype)),
                     t.one("Mul", new, t.const(momentum, old.dtype)))

    unbiased = t.one("Mul", var, t.const(n / max(n - 1, 1), var.dtype))
    return [out, mean, rstd, update(running_mean, mean), update(running_var, unbiased)]


def _pool_window(kernel: Sequence[int], stride: Sequence[int], padding: Any, nd: int) -> dict[str, Any]:
    pads = [padding] * nd if isinstance(padding, int) else list(padding) * (2 if len(padding) == nd else 1)
    pads = pads * 2 if len(pads) == nd else pads
    return {"kernel_shape": list(kernel), "strides": list(stride or kernel), "pads": pads}


def _max_pool(t: Lowering, x: Value, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> list[Value | None]:
    _first_only(t)
    nd = x.rank - 2
    dilations = [dilation] * nd if isinstance(dilation, int) else list(dilation)
    attrs = _pool_window(kernel, stride, padding, nd)
    return [t.one("MaxPool", x, dilations=dilations, ceil_mode=int(ceil_mode), **attrs), None]


def _avg_pool(t: Lowering, x: Value, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Value:
    if divisor_override is not None:
        raise Unsupported("average pooling with divisor_override")
    attrs = _pool_window(kernel, stride, padding, x.rank - 2)
    return t.one("AveragePool", x, ceil_mode=int(ceil_mode), count_include_pad=int(count_include_pad), **attrs)


def _adaptive_avg_pool(t: Lowering, x: Value, size: Sequence[int]) -> Value:
    spatial = x.shape[2:]
    if any(n % s for n, s in zip(spatial, size)):
        raise Unsupported(f"adaptive average pooling of {list(spatial)} to {list(size)}")
    kernel = [n // s for n, s in zip(spatial, size)]
    return t.one("AveragePool", x, kernel_shape=kernel, strides=kernel)


def _convolution_backward(t: Lowering, grad: Value, x: Value, w: Value, bias_sizes: Any, stride: Sequence[int],
                          padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                          output_padding: Sequence[int], groups: int, mask: Sequence[bool]) -> list[Value | None]:
    """The gradients of a convolution as convolutions: the input's a transposed convolution of
    the output's gradient, the weights' a convolution of the input (batch as channels) by the
    output's gradient (strides and dilations swapped), cropped to the kernel."""
    if transposed or (groups != 1 and mask[1]):
        raise Unsupported("the gradient of a transposed or grouped convolution")
    nd = x.rank - 2
    kernel = w.shape[2:]
    pads = list(padding) * 2
    results: list[Value | None] = [None, None, None]
    if mask[0]:
        extra = [x.shape[2 + d] - ((grad.shape[2 + d] - 1) * stride[d] - 2 * padding[d]
                                   + (kernel[d] - 1) * dilation[d] + 1) for d in range(nd)]
        results[0] = t.one("ConvTranspose", grad, w, strides=list(stride), pads=pads, dilations=list(dilation),
                           output_padding=extra, group=groups)
    if mask[1]:
        swap = [1, 0, *range(2, x.rank)]
        full = t.one("Conv", t.one("Transpose", x, perm=swap), t.one("Transpose", grad, perm=swap),
                     strides=list(dilation), dilations=list(stride), pads=pads)
        crop = t.one("Slice", full, t.ints([0] * nd), t.ints(kernel), t.ints(range(2, x.rank)))
        results[1] = t.one("Transpose", crop, perm=swap)
    if mask[2]:
        results[2] = t.one("ReduceSum", grad, t.ints([0, *range(2, x.rank)]), keepdims=0)
    return results


def _index_put(t: Lowering, x: Value, indices: Sequence[Value | None], values: Value,
               accumulate: bool = False) -> Value:
    """``x`` with ``values`` added at the positions one index tensor gives along the first axis
    (the gradient of an embedding): a copy of ``x``, then a scatter-add statement. A negative
    index counts from the end; the position is clamped into the axis, since an index computed in
    the program cannot be checked before the call (the embedding's decomposition clamps its
    indices the same way, and its forward checked them)."""
    if not accumulate or len(indices) != 1 or indices[0] is None:
        raise Unsupported("index_put other than an accumulation along the first axis")
    index, n = indices[0], x.shape[0]
    if index.dtype not in ("i32", "i64") or values.shape != index.shape + x.shape[1:]:
        raise Unsupported(f"index_put of values {list(values.shape)} at indices {list(index.shape)}")
    out = t.p.emit(t.node.name, x.shape, x.dtype, x.read)  # type: ignore[union-attr]
    k = index.rank
    values = t.cast(values, x.dtype)
    source = t.p.tensor_value(t.p.materialize(values, t.node.name + "_values"), values.shape, x.dtype)  # type: ignore

    def position(idx: list[Any]) -> list[Any]:
        i = index.read(idx[:k])
        return [call("min", call("max", select(i.lt(0), i + n, i), 0), n - 1), *idx[k:]]

    t.p.accumulate(out, values.shape, position, source.read)
    return out


# ---------------------------------------------------------------- shapes

def _view(t: Lowering, x: Value, shape: Sequence[int]) -> Value:
    return t.one("Reshape", x, t.ints(t.shape()))


def _permute(t: Lowering, x: Value, dims: Sequence[int]) -> Value:
    return t.one("Transpose", x, perm=axis_list(dims, x.rank))


def _transpose(t: Lowering, x: Value, a: int = 0, b: int = 1) -> Value:
    perm = list(range(x.rank))
    if x.rank:
        a, b = a % x.rank, b % x.rank
        perm[a], perm[b] = perm[b], perm[a]
    return t.one("Transpose", x, perm=perm)


def _expand(t: Lowering, x: Value, shape: Sequence[int], *, implicit: bool = False) -> Value:
    return t.one("Expand", x, t.ints(t.shape()))


def _slice(t: Lowering, x: Value, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Value:
    big = 2 ** 62
    return t.one("Slice", x, t.ints([0 if start is None else start]), t.ints([big if end is None else min(end, big)]),
                 t.ints([dim % x.rank]), t.ints([step]))


def _select(t: Lowering, x: Value, dim: int, index: int) -> Value:
    dim = dim % x.rank
    index = index % x.shape[dim]
    return t.one("Reshape", _slice(t, x, dim, index, index + 1), t.ints(t.shape()))


def _cat(t: Lowering, tensors: Sequence[Value], dim: int = 0) -> Value:
    dtype = t.dtype()
    parts = [t.cast(v, dtype) for v in tensors if v.size or len(tensors) == 1]
    return t.onnx("Concat", parts, axis=dim % parts[0].rank)[0]


def _split(t: Lowering, x: Value, sizes: Any, dim: int = 0) -> list[Value]:
    shapes = [m.shape for m in t.meta()]
    dim = dim % x.rank
    return t.onnx("Split", [x, t.ints([s[dim] for s in shapes])], outputs=len(shapes), axis=dim)


def _full(t: Lowering, size: Sequence[int], value: Any, **kw: Any) -> Value:
    return t.const(np.full(t.shape(), value), t.dtype())


def _scalar_tensor(t: Lowering, value: Any, **kw: Any) -> Value:
    return t.const(value, t.dtype())


def _full_like(t: Lowering, x: Value, value: Any, **kw: Any) -> Value:
    return t.const(np.full(t.shape(), value), t.dtype())


def _arange(t: Lowering, *args: Any, **kw: Any) -> Value:
    return t.const(np.arange(*args), t.dtype())


def _pad(t: Lowering, x: Value, pads: Sequence[int], value: float = 0.0) -> Value:
    lo, hi = [0] * x.rank, [0] * x.rank
    for k in range(len(pads) // 2):  # (last dim before, after, the one before it, ...)
        lo[x.rank - 1 - k], hi[x.rank - 1 - k] = pads[2 * k], pads[2 * k + 1]
    return t.one("Pad", x, t.ints(lo + hi), t.const(value, x.dtype))


def _repeat(t: Lowering, x: Value, repeats: Sequence[int]) -> Value:
    x = t.one("Reshape", x, t.ints((1,) * (len(repeats) - x.rank) + x.shape))
    return t.one("Tile", x, t.ints(repeats))


def _squeeze(t: Lowering, x: Value, *dims: Any) -> Value:
    return t.one("Reshape", x, t.ints(t.shape()))


def _getitem(t: Lowering, values: Sequence[Value], n: int) -> Value:
    return values[n]


def _reshape_to_meta(t: Lowering, x: Value, *rest: Any) -> Value:
    return t.one("Reshape", x, t.ints(t.shape()))


ATEN: dict[Any, Callable[..., Any]] = {
    operator.getitem: _getitem,
    **{op: _arith("Add", scaled=True) for op in (aten.add.Tensor, aten.add.Scalar)},
    **{op: _arith("Sub", scaled=True) for op in (aten.sub.Tensor, aten.sub.Scalar)},
    **{op: _arith("Mul") for op in (aten.mul.Tensor, aten.mul.Scalar)},
    aten.rsub.Scalar: lambda t, a, b, alpha=1: _arith("Sub", scaled=True)(t, b, a, 1) if alpha == 1 else None,
    aten.div.Tensor: _div, aten.div.Scalar: _div, aten.div.Tensor_mode: _div,
    aten.pow.Tensor_Scalar: _pow, aten.pow.Tensor_Tensor: _pow,
    aten.maximum.default: _arith("Max"), aten.minimum.default: _arith("Min"),
    **{op: _compare("Equal") for op in (aten.eq.Tensor, aten.eq.Scalar)},
    **{op: _compare("Equal", negate=True) for op in (aten.ne.Tensor, aten.ne.Scalar)},
    **{op: _compare("Less") for op in (aten.lt.Tensor, aten.lt.Scalar)},
    **{op: _compare("LessOrEqual") for op in (aten.le.Tensor, aten.le.Scalar)},
    **{op: _compare("Greater") for op in (aten.gt.Tensor, aten.gt.Scalar)},
    **{op: _compare("GreaterOrEqual") for op in (aten.ge.Tensor, aten.ge.Scalar)},
    aten.bitwise_and.Tensor: _logic("And"), aten.bitwise_or.Tensor: _logic("Or"),
    aten.logical_and.default: _logic("And"), aten.logical_or.default: _logic("Or"),
    aten.bitwise_not.default: _not, aten.logical_not.default: _not,
    aten.where.self: _where,
    aten.neg.default: _unary("Neg"), aten.abs.default: _unary("Abs"), aten.exp.default: _unary("Exp"),
    aten.log.default: _unary("Log"), aten.sqrt.default: _unary("Sqrt"), aten.rsqrt.default: _rsqrt,
    aten.tanh.default: _unary("Tanh"), aten.sigmoid.default: _unary("Sigmoid"), aten.relu.default: _unary("Relu"),
    aten.erf.default: _unary("Erf"), aten.reciprocal.default: _unary("Reciprocal"),
    aten.sign.default: _unary("Sign"), aten.isnan.default: _unary("IsNaN"),
    aten.gelu.default: _gelu, aten.leaky_relu.default: _leaky_relu,
    aten.clamp.default: _clamp, aten.clamp_min.default: lambda t, x, lo: _clamp(t, x, lo),
    aten.clamp_max.default: lambda t, x, hi: _clamp(t, x, None, hi),
    aten._to_copy.default: _to_copy, aten.clone.default: _same, aten.alias.default: _same,
    aten.detach.default: _same, aten.lift_fresh_copy.default: _same,
    aten.sum.dim_IntList: _reduce("ReduceSum"), aten.sum.default: _sum_all, aten.mean.dim: _reduce("ReduceMean"),
    aten.amax.default: _reduce("ReduceMax"), aten.amin.default: _reduce("ReduceMin"),
    aten._softmax.default: _softmax("Softmax"), aten._log_softmax.default: _softmax("LogSoftmax"),
    aten.mm.default: _mm, aten.bmm.default: _mm, aten.addmm.default: _addmm,
    aten.convolution.default: _convolution, aten.native_layer_norm.default: _layer_norm,
    aten.embedding.default: _embedding, aten.index_select.default: _index_select,
    aten.view.default: _view, aten._unsafe_view.default: _view, aten.reshape.default: _view,
    aten.permute.default: _permute, aten.t.default: _transpose, aten.transpose.int: _transpose,
    aten.expand.default: _expand, aten.slice.Tensor: _slice, aten.select.int: _select, aten.cat.default: _cat,
    aten.split_with_sizes.default: _split, aten.split.Tensor: _split,
    aten.unsqueeze.default: _reshape_to_meta, aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze,
    aten.full.default: _full, aten.scalar_tensor.default: _scalar_tensor, aten.full_like.default: _full_like,
    aten.arange.start_step: _arange, aten.arange.default: _arange, aten.arange.start: _arange,
    aten.constant_pad_nd.default: _pad, aten.repeat.default: _repeat,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_inference,
    aten._native_batch_norm_legit_functional.default: _batch_norm_training,
    aten.max_pool2d_with_indices.default: _max_pool, aten.avg_pool2d.default: _avg_pool,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool, aten.convolution_backward.default: _convolution_backward,
    aten.index_put.default: _index_put,
}


def supported(node: torch.fx.Node) -> bool:
    """Whether the engine has an entry for this FX node's operator and its values' types (a
    trial lowering may still refuse it)."""
    if node.op != "call_function" or node.target not in ATEN:
        return False
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, list | tuple) else [vals]
    return all(isinstance(v, torch.Tensor) and v.dtype in TCC_DTYPES and v.layout == torch.strided
               and all(isinstance(d, int) for d in v.shape) for v in vals if v is not None) and vals != [None]


def _operator_name(target: Any) -> str:
    return str(getattr(target, "__name__", target)) if target is not operator.getitem else "getitem"


def check_result(t: Lowering, got: Any) -> Any:
    """The lowering's result against the shapes and dtypes FX recorded (a mismatch is a defect of
    the entry: the partitioner then leaves the call to PyTorch)."""
    vals = t.meta()
    many = isinstance(vals, list | tuple)
    results = list(got) if many else [got]
    expected = list(vals) if many else [vals]
    for n, (value, val) in enumerate(zip(results, expected)):
        if val is None or value is None:
            continue
        if value.shape != static_shape(val.shape):
            raise Unsupported(f"{_operator_name(t.node.target)} gave shape {list(value.shape)}, "  # type: ignore
                              f"PyTorch {list(val.shape)}")
        results[n] = t.cast(value, tcc_dtype(val.dtype))
    return results if many else results[0]


def lower_node(t: Lowering, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    """The engine's values of one FX call."""
    t.node = node

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, list | tuple):
            return type(a)(arg(x) for x in a)
        return a

    lowering = ATEN.get(node.target)
    if lowering is None:
        raise Unsupported(f"{_operator_name(node.target)} has no tcc lowering")
    got = lowering(t, *arg(node.args), **{k: arg(v) for k, v in node.kwargs.items()})
    if got is None:
        raise Unsupported(f"{_operator_name(node.target)} with these arguments")
    return got if node.target is operator.getitem else check_result(t, got)


def operator_name(node: torch.fx.Node) -> str:
    return _operator_name(node.target)
