"""The oracle: a NumPy interpreter of the tensor-expression IR.

It evaluates a specialised :class:`~tcc.ir.te.OpTE` directly, with no loops, passes or code
generation, in float64 (int64 for integers) wherever it can, and rounds only where the
program stores into a tensor. Every op, pass and backend is tested against it.

Each statement is evaluated on a broadcast grid: every index variable (output axes, then
reduction axes) owns one dimension, reads become NumPy advanced indexing, and reductions
reduce their dimensions with ``keepdims`` so that shapes stay aligned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import TccIndexError
from tcc.ir import philox
from tcc.ir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    Unary,
    Var,
    format_expr,
    substitute,
    transform,
    walk,
)
from tcc.ir.te import Compute, OpTE
from tcc.passes.te.bounds import prove_bounds
from tcc.stack import deep

_MATH = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": np.frompyfunc(math.erf, 1, 1), "abs": np.abs, "floor": np.floor, "ceil": np.ceil,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power, "max": np.maximum,
    "min": np.minimum, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "and": np.logical_and,
    "or": np.logical_or,
}
_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def wide(dtype: DType) -> np.dtype:
    """The type the reference computes a value of ``dtype`` in."""
    if dtype.is_float:
        return np.dtype(np.float64)
    if dtype.is_int:
        return np.dtype(np.int64)
    return np.dtype(bool)


def store(value: np.ndarray, dtype: DType) -> np.ndarray:
    """Round a wide value to a tensor's dtype, as a store does (bf16 and 8-bit float values held in
    float32)."""
    if dtype.name == "bf16":
        return round_bf16(value).astype(np.float32)
    if dtype.is_fp8:
        return dtypes.round_fp8(value, dtype).astype(np.float32)
    return np.asarray(value).astype(dtype.numpy)


def round_bf16(value) -> np.ndarray:
    """Round to the nearest bf16 (ties to even; NaN stays NaN), as float64: NumPy has no bf16.
    f64 goes to f32 rounding to odd first, so that the second rounding is exact."""
    a = np.asarray(value, dtype=np.float64)
    with np.errstate(over="ignore"):
        t = a.astype(np.float32)
    back = t.astype(np.float64)
    bits = t.view(np.uint32).astype(np.uint64)
    inexact = (back != a) & ~np.isnan(a)
    bits = np.where(inexact & (np.abs(back) > np.abs(a)), bits - 1, bits)  # toward zero, then odd
    bits = np.where(inexact, bits | 1, bits)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    rounded = np.where(np.isnan(a), np.uint64(0x7FC00000), rounded)
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def _identity(op: str, dtype: DType) -> int | float | bool:
    """What an empty reduction gives: 0, 1, or the lowest (highest) value of the type."""
    if op in ("sum", "prod"):
        return int(op == "prod")
    if dtype.is_bool:
        return op == "min"
    if dtype.is_float:
        return -math.inf if op == "max" else math.inf
    info = np.iinfo(dtype.numpy)
    return int(info.min if op == "max" else info.max)


def _wrap(value, dtype: DType) -> np.ndarray:
    """A computed value in the reference's wide type; integers wrap at their own width, as
    integer arithmetic does in compiled code (``i8`` 100 + 100 is -56)."""
    value = np.asarray(value)
    if dtype.is_int and dtype.bits < 64:
        return value.astype(dtype.numpy).astype(np.int64)
    return value.astype(wide(dtype))


def float_to_i64(a: np.ndarray) -> np.ndarray:
    """The language's float -> integer conversion, before wrapping to the width: truncate toward
    zero, saturate to the i64 range, NaN to 0 (what LLVM's fptosi.sat and CUDA's cvt.rzi do)."""
    a = np.trunc(np.asarray(a, dtype=np.float64))
    inside = np.clip(np.nan_to_num(a, nan=0.0), -2.0**63, 2.0**63 - 1024)  # f64s that convert exactly
    out = inside.astype(np.int64)
    return np.where(a >= 2.0**63, np.iinfo(np.int64).max, out)


def run(op: OpTE, args: Mapping[str, np.ndarray | int | float]) -> dict[str, np.ndarray]:
    """Evaluate a specialised op on its named arguments; returns every result by name.

    Reads are bounds-checked first, as compilation does, so the oracle refuses what tcc refuses.
    Runs on a deep stack (:mod:`tcc.stack`): evaluation recurses over the expression trees.
    """
    return deep(_run, op, args)


def _run(op: OpTE, args: Mapping[str, np.ndarray | int | float]) -> dict[str, np.ndarray]:
    op = prove_bounds(op)  # both sides of a select are evaluated: reads proved under its condition are clamped
    env, scalars = _environment(op, args)
    check_indices(op, env, scalars)
    with np.errstate(all="ignore"):
        for c in op.computes:
            tensor = op.tensors[c.tensor]
            if c.sequential:
                _recurrence(op, env, scalars, c)
                continue
            statement = _Statement(op, env, scalars, c)
            value = statement.add_into(env[c.tensor]) if c.accumulate else statement.evaluate()
            env[c.tensor] = store(value, tensor.dtype).astype(wide(tensor.dtype))
    return {r: store(env[r], op.tensors[r].dtype) for r in op.results}


def _recurrence(op: OpTE, env: dict[str, np.ndarray], scalars: dict[str, np.ndarray], c: Compute) -> None:
    """A recurrence, one position of its sequential axis at a time: each step reads only the
    positions stored before it (the tensor starts as NaN, so a read of anything else shows)."""
    tensor = op.tensors[c.tensor]
    shape = tensor.concrete_shape()
    env[c.tensor] = np.full(shape, np.nan if tensor.dtype.is_float else 0, dtype=wide(tensor.dtype))
    dim = next(i for i, ax in enumerate(c.axes) if ax.var.name == c.sequential[0])
    rest = c.axes[:dim] + c.axes[dim + 1:]
    for k in range(shape[dim]):
        body = substitute(c.body, {c.axes[dim].var.name: Const(k, dtypes.i64)})
        value = _Statement(op, env, scalars, Compute(c.tensor, rest, body)).evaluate()
        position = (slice(None),) * dim + (k,)
        env[c.tensor][position] = store(value, tensor.dtype).astype(wide(tensor.dtype))


def _environment(op: OpTE, args: Mapping[str, np.ndarray | int | float]
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The inputs in their wide types, and the scalars (each rounded to its dtype first)."""
    env = {name: np.asarray(args[name]).astype(wide(op.tensors[name].dtype)) for name in op.inputs if name in args}
    return env, scalar_values(op, args)


def scalar_values(op: OpTE, args: Mapping[str, np.ndarray | int | float]) -> dict[str, np.ndarray]:
    """The runtime scalars in their wide types, each rounded to its dtype first."""
    return {name: store(np.asarray(args[name]), s.dtype).astype(wide(s.dtype))
            for name, s in op.scalars.items() if name in args}


def check_indices(op: OpTE, env: dict[str, np.ndarray], scalars: dict[str, np.ndarray]) -> None:
    """Raise :class:`TccIndexError` for the first index that reads data (``op.index_checks``, made
    by the bounds pass) and leaves its tensor: the index evaluated at every point of its variables'
    ranges, one vectorised pass over the index tensor, before anything is computed."""
    for check in op.index_checks:
        values = index_values(op, check, env, scalars)
        bad = np.flatnonzero((values < 0) | (values >= check.size))
        if bad.size:
            raise _index_error(check, values, int(bad[0]))


def index_values(op: OpTE, check, env: dict[str, np.ndarray], scalars: dict[str, np.ndarray]) -> np.ndarray:
    """``check.index`` at every point of ``check.ranges`` (one grid dimension a variable)."""
    whole = _whole_tensor(check, env)
    if whole is None:
        whole = _from_whole_tensor(op, check, env, scalars)
    if whole is not None:
        return whole
    shifted = substitute(check.index, {v: Binary("add", Var(v, dtypes.i64), Const(lo, dtypes.i64), dtypes.i64)
                                       for v, lo, _ in check.ranges})
    axes = tuple(IterVar(Var(v, dtypes.i64), Const(hi - lo + 1, dtypes.i64)) for v, lo, hi in check.ranges)
    statement = _Statement(op, env, scalars, Compute("<index>", axes, shifted))
    with np.errstate(all="ignore"):
        return statement.evaluate().astype(np.int64).reshape(-1)


def _whole_tensor(check, env: dict[str, np.ndarray]) -> np.ndarray | None:
    """The values of an index that reads a whole tensor at its variables (``idx[n]`` over every
    ``n``: an embedding's ids, a loss's labels), in the order of ``check.ranges``: the tensor
    itself, transposed to that order, without evaluating the expression (the evaluator's set-up
    costs more than a label pick's kernel)."""
    e = check.index.a if isinstance(check.index, Cast) else check.index
    if not (isinstance(e, Read) and e.tensor in env and len(e.indices) == len(check.ranges)):
        return None
    values = env[e.tensor]
    names = [i.name if isinstance(i, Var) else None for i in e.indices]
    ranges = {v: (lo, hi) for v, lo, hi in check.ranges}
    if values.ndim != len(names) or set(names) != set(ranges) or any(
            ranges[v] != (0, size - 1) for v, size in zip(names, values.shape)):
        return None
    order = [names.index(v) for v, _, _ in check.ranges]
    return values.transpose(order).astype(np.int64, copy=False).reshape(-1)


def _from_whole_tensor(op: OpTE, check, env: dict[str, np.ndarray], scalars: dict[str, np.ndarray]
                       ) -> np.ndarray | None:
    """The values of an index computed element by element from one tensor read whole (ONNX
    Gather's ``select(i < 0, i + n, i)`` of an embedding's ids): the expression on the tensor's
    values, without the evaluator's index grids (three gathers of the ids per check: ~0.2 ms of a
    BERT-size model's ~1 ms call)."""
    reads = [n for n in walk(check.index) if isinstance(n, Read)]
    if not reads or any(r != reads[0] for r in reads):
        return None
    whole = _whole_tensor(replace(check, index=reads[0]), env)
    if whole is None:
        return None
    name = "<whole>"
    expr = transform(check.index, lambda n: Var(name, n.dtype) if isinstance(n, Read) else None)
    if any(isinstance(n, Var) and n.name != name and n.name not in scalars or isinstance(n, Reduce | Call)
           for n in walk(expr)):
        return None  # it moves with an index variable too, or needs the evaluator
    statement = _Statement(op, env, {**scalars, name: whole}, Compute("<index>", (), expr))
    with np.errstate(all="ignore"):
        return np.broadcast_to(np.asarray(statement._eval(expr)), whole.shape).astype(np.int64).reshape(-1)


def _index_error(check, values: np.ndarray, flat: int) -> TccIndexError:
    shape = tuple(hi - lo + 1 for _, lo, hi in check.ranges)
    position = np.unravel_index(flat, shape) if shape else ()
    where = ", ".join(f"{v}={lo + int(p)}" for (v, lo, _), p in zip(check.ranges, position))
    return TccIndexError(
        f"index {check.dim} of {check.tensor} ({format_expr(check.index)}) is {int(values[flat])}"
        f"{' at ' + where if where else ''}, outside [0, {check.size})", check.span,
        "indices read from data must be in range (negative values are errors, not wrap-arounds); "
        "nothing was computed or written")


def _pad(op: OpTE, pad, env: dict[str, np.ndarray]) -> np.ndarray:
    if pad.source not in env:  # a pad of a pad view
        env[pad.source] = _pad(op, op.pads[pad.source], env)
    src = env[pad.source]
    widths = [(int(lo.value), int(hi.value)) for lo, hi in zip(pad.lo, pad.hi)]
    return np.pad(src, widths, constant_values=float(pad.value.value) if src.dtype.kind == "f" else pad.value.value)


class _Statement:
    """One statement on a broadcast grid of all its index variables."""

    def __init__(self, op: OpTE, env, scalars, compute):
        self.op, self.env, self.scalars, self.compute = op, env, scalars, compute
        order = [ax.var.name for ax in compute.axes]
        order += [ax.var.name for n in walk(compute.body) if isinstance(n, Reduce) for ax in n.axes]
        self.axis_of = {name: i for i, name in enumerate(order)}
        self.extent = {ax.var.name: int(ax.extent.value) for ax in compute.axes}
        self.ndim = len(order)

    def evaluate(self) -> np.ndarray:
        out_shape = tuple(self.extent[ax.var.name] for ax in self.compute.axes)
        if 0 in out_shape:  # nothing to compute (and nothing may be read: its reads never run)
            return np.empty(out_shape, dtype=wide(self.op.tensors[self.compute.tensor].dtype))
        value = self._eval(self.compute.body)
        value = np.asarray(value)
        value = value.reshape(value.shape + (1,) * (self.ndim - value.ndim)) if value.ndim else value
        if value.ndim:
            value = value.reshape(value.shape[: len(out_shape)]) if value.ndim > len(out_shape) else value
        return np.broadcast_to(value, out_shape).copy()

    def add_into(self, target: np.ndarray) -> np.ndarray:
        """An accumulation: ``target`` plus each point's value at its left-hand position, every
        hit of a position counted (``np.add.at``)."""
        value = self.evaluate()
        out = target.copy()
        if value.size:
            positions = tuple(np.broadcast_to(self._statement_dims(i), value.shape) for i in self.compute.lhs)
            np.add.at(out, positions, value)
        return out

    def _statement_dims(self, e: Expr) -> np.ndarray:
        """``e`` (of the statement's own index variables) without the trailing grid dims of its
        reductions."""
        a = np.asarray(self._eval(e), dtype=np.int64)
        count = len(self.compute.axes)
        return a.reshape(a.shape[:count]) if a.ndim > count else a

    def _grid(self, name: str, extent: int) -> np.ndarray:
        shape = [1] * self.ndim
        shape[self.axis_of[name]] = extent
        return np.arange(extent, dtype=np.int64).reshape(shape)

    def _eval(self, e: Expr):
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=wide(e.dtype))
        if isinstance(e, Var):
            if e.name in self.scalars:
                return self.scalars[e.name]
            return self._grid(e.name, self.extent[e.name])
        if isinstance(e, Read):
            if e.tensor not in self.env:  # a pad view, materialised once its source exists
                self.env[e.tensor] = _pad(self.op, self.op.pads[e.tensor], self.env)
            tensor = self.env[e.tensor]
            indices = [np.asarray(self._eval(i), dtype=np.int64) for i in e.indices]
            indices = np.broadcast_arrays(*indices) if indices else indices
            return tensor[tuple(indices)] if indices else tensor
        if isinstance(e, Reduce):
            bounds = {ax.var.name: np.asarray(self._eval(ax.extent)) for ax in e.axes}
            for name, bound in bounds.items():
                self.extent[name] = max(int(bound.max()), 0)
            if any(self.extent[ax.var.name] == 0 for ax in e.axes):  # an empty reduction: its identity
                return np.asarray(_identity(e.op, e.dtype), dtype=wide(e.dtype)).reshape((1,) * self.ndim)
            body = np.asarray(self._eval(e.body))
            for name, bound in bounds.items():  # an extent that moves with an outer index: masked
                if bound.ndim:
                    body = np.where(self._grid(name, self.extent[name]) < bound, body, _identity(e.op, e.dtype))
            axes = tuple(self.axis_of[ax.var.name] for ax in e.axes)
            full = list(np.broadcast_shapes(body.shape, (1,) * self.ndim))
            for ax in e.axes:
                full[self.axis_of[ax.var.name]] = self.extent[ax.var.name]
            body = np.broadcast_to(body, full)
            return _REDUCE[e.op](body, axis=axes, keepdims=True).astype(wide(e.dtype))
        if isinstance(e, Binary):
            return _wrap(_BINARY[e.op](self._eval(e.a), self._eval(e.b)), e.dtype)
        if isinstance(e, Unary):
            a = self._eval(e.a)
            return np.logical_not(a) if e.op == "not" else _wrap(np.negative(a), e.dtype)
        if isinstance(e, Call) and e.fn == "philox":
            seed, *counter = (self._eval(a) for a in e.args[1:])
            return philox.word(int(e.args[0].value), seed, tuple(counter))  # type: ignore[attr-defined]
        if isinstance(e, Call):
            return _wrap(np.asarray(_MATH[e.fn](self._eval(e.args[0]))), e.dtype)  # abs(i8 -128) is -128
        if isinstance(e, Cast):
            a = np.asarray(self._eval(e.a))
            if e.dtype.is_int and a.dtype.kind == "f":
                a = float_to_i64(a)
            if e.dtype.is_int:
                return a.astype(e.dtype.numpy).astype(np.int64)  # wrap like a real cast
            if e.dtype.name == "bf16":
                return round_bf16(a)
            if e.dtype.is_fp8:
                return dtypes.round_fp8(a, e.dtype)  # saturating, as cvt.rn.satfinite does
            if e.dtype.is_float and e.dtype.bits < 64:
                return a.astype(e.dtype.numpy).astype(np.float64)  # round like a real cast
            return a.astype(wide(e.dtype))
        if isinstance(e, Select):
            return np.where(self._eval(e.cond), self._eval(e.a), self._eval(e.b))
        raise TypeError(f"reference: cannot evaluate {type(e).__name__}")
