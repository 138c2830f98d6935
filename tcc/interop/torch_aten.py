"""Core ATen operators onto the graph engine: the torch front door's operator table
(elementwise, reductions and shapes here, the neural-network operators in ``torch_aten_nn``).

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

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch  # the optional dependency of the torch front door

from tcc.interop.graph import NUMPY_DTYPES, Value
from tcc.interop.torch_aten_nn import NN
from tcc.interop.torch_lowering import (
    TCC_DTYPES,
    Lowering,
    Unsupported,
    axis_list,
    static_shape,
    target_name,
    tcc_dtype,
)

aten = torch.ops.aten  # (PyTorch's operator namespace: its private-looking names are its own)

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
    return _filled(t, value)


def _scalar_tensor(t: Lowering, value: Any, **kw: Any) -> Value:
    return t.const(value, t.dtype())


def _full_like(t: Lowering, x: Value, value: Any, **kw: Any) -> Value:
    return _filled(t, value)


def _filled(t: Lowering, value: Any) -> Value:
    """The node's result filled with ``value``: a broadcast view (no memory), which becomes a
    literal in the program."""
    return t.const(np.broadcast_to(np.asarray(value, NUMPY_DTYPES[t.dtype()]), t.shape()), t.dtype())


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
    **NN,
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
    aten.view.default: _view, aten._unsafe_view.default: _view, aten.reshape.default: _view,
    aten.permute.default: _permute, aten.t.default: _transpose, aten.transpose.int: _transpose,
    aten.expand.default: _expand, aten.slice.Tensor: _slice, aten.select.int: _select, aten.cat.default: _cat,
    aten.split_with_sizes.default: _split, aten.split.Tensor: _split,
    aten.unsqueeze.default: _reshape_to_meta, aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze,
    aten.full.default: _full, aten.scalar_tensor.default: _scalar_tensor, aten.full_like.default: _full_like,
    aten.arange.start_step: _arange, aten.arange.default: _arange, aten.arange.start: _arange,
    aten.constant_pad_nd.default: _pad, aten.repeat.default: _repeat,
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
            raise Unsupported(f"{target_name(t.node.target)} gave shape {list(value.shape)}, "  # type: ignore
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
        raise Unsupported(f"{target_name(node.target)} has no tcc lowering")
    got = lowering(t, *arg(node.args), **{k: arg(v) for k, v in node.kwargs.items()})
    if got is None:
        raise Unsupported(f"{target_name(node.target)} with these arguments")
    return got if node.target is operator.getitem else check_result(t, got)


def operator_name(node: torch.fx.Node) -> str:
    return target_name(node.target)
