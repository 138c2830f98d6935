"""Scalar expression nodes shared by the tensor-expression IR and the loop IR.

Every node has a concrete dtype: semantic analysis inserts the casts that NumPy promotion
implies, so passes and code generators never promote anything themselves. Spans are carried
but ignored by equality, so structurally equal expressions compare equal.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace

import numpy as np

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import Span

ARITH_OPS = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "max", "min")
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
MATH_FUNCS = ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs",
              "floor", "ceil")
RANDOM_FUNCS = ("rand", "randn", "philox")  # counter-based: pure functions of a seed and indices
REDUCE_OPS = ("sum", "max", "min", "prod")

_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
           "pow": "**", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
           "and": "and", "or": "or"}
_PRECEDENCE = {"or": 1, "and": 2, "lt": 4, "le": 4, "gt": 4, "ge": 4, "eq": 4, "ne": 4,
               "add": 5, "sub": 5, "mul": 6, "div": 6, "floordiv": 6, "mod": 6, "pow": 8}


@dataclass(frozen=True)
class Expr:
    """Base of all scalar expressions."""

    def children(self) -> tuple[Expr, ...]:
        return tuple(v for name in _field_names(type(self)) for v in _expr_values(getattr(self, name)))

    def __str__(self) -> str:
        return format_expr(self)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A node class's field names (``dataclasses.fields`` is slow, and every walk asks)."""
    return tuple(f.name for f in fields(cls))


def _expr_values(value: object) -> Iterator[Expr]:
    if isinstance(value, Expr):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            if isinstance(v, Expr):
                yield v


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool
    dtype: DType

    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True)
class Var(Expr):
    """An index variable, shape symbol, compile-time parameter or runtime scalar."""

    name: str
    dtype: DType = dtypes.i64

    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)

    def children(self) -> tuple[Expr, ...]:  # the common nodes spell out their children: walks are hot
        return (self.a, self.b)


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "neg" or "not"
    a: Expr
    dtype: DType

    def children(self) -> tuple[Expr, ...]:
        return (self.a,)


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]
    dtype: DType


@dataclass(frozen=True)
class Cast(Expr):
    a: Expr
    dtype: DType

    def children(self) -> tuple[Expr, ...]:
        return (self.a,)


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class IterVar:
    """A reduction or output axis: a variable and its extent (an expression of symbols)."""

    var: Var
    extent: Expr


@dataclass(frozen=True)
class Read(Expr):
    """TE only: an element of a tensor, by multi-dimensional index."""

    tensor: str
    indices: tuple[Expr, ...]
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Reduce(Expr):
    """TE only: ``op`` over ``axes`` of ``body``; accumulates in ``acc_dtype``."""

    op: str
    axes: tuple[IterVar, ...]
    body: Expr
    dtype: DType
    acc_dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Load(Expr):
    """Loop IR only: an element of a buffer, by multi-dimensional index."""

    buffer: str
    indices: tuple[Expr, ...]
    dtype: DType


# ---------------------------------------------------------------- construction helpers

def unique_name(base: str, taken: set[str]) -> str:
    """The first of ``base``, ``base2``, ``base3``, ... not in ``taken``, which it joins: every
    pass that adds a tensor, buffer or loop names it this way, so printed stages read alike."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    taken.add(name)
    return name


def const(value: int | float | bool, dtype: DType = dtypes.i64) -> Const:
    return Const(value, dtype)


def iadd(a: Expr, b: Expr | int) -> Expr:
    """Integer (index) addition with trivial folding, used by passes that build indices."""
    b = b if isinstance(b, Expr) else const(b)
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(a, Const) and isinstance(b, Const):
        return const(a.value + b.value)
    return Binary("add", a, b, dtypes.i64)


def imul(a: Expr, b: Expr | int) -> Expr:
    b = b if isinstance(b, Expr) else const(b)
    if isinstance(b, Const) and b.value == 1:
        return a
    if isinstance(a, Const) and a.value == 1:
        return b
    if isinstance(a, Const) and isinstance(b, Const):
        return const(a.value * b.value)
    return Binary("mul", a, b, dtypes.i64)


def cast(e: Expr, dtype: DType) -> Expr:
    """``e`` as ``dtype``; no node when it already is, constants folded."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return Const(convert_value(e.value, dtype), dtype)
    return Cast(e, dtype)


def convert_value(value: int | float | bool, dtype: DType) -> int | float | bool:
    """``value`` as a ``dtype`` holds it, by the language's conversions (a folded constant must
    equal the run-time cast): float -> int truncates toward zero, saturates to the i64 range
    (NaN is 0) and wraps to the width, as do int -> int; a float beyond f16's or f32's range
    is infinite."""
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float):
            value = 0 if math.isnan(value) else int(min(max(value, -2.0**63), 2.0**63 - 1024)) \
                if value < 2.0**63 else 2**63 - 1
        half = 1 << (dtype.bits - 1)
        return (int(value) + half) % (2 * half) - half
    try:
        out = float(value)
    except OverflowError:  # an integer beyond the largest double
        out = math.copysign(math.inf, value)
    if dtype.is_fp8:  # saturating: 1e6 as f8e4m3 is 448
        return float(dtypes.round_fp8(out, dtype))
    if dtype.bits < 64 and dtype.name != "bf16" and math.isfinite(out):
        with np.errstate(over="ignore"):
            rounded = float(np.asarray(out).astype(dtype.numpy))
        if math.isinf(rounded):
            return rounded
    return out


# ---------------------------------------------------------------- traversal

def walk(e: Expr) -> Iterator[Expr]:
    """Every node of ``e``, parents first, children left to right. An explicit stack rather
    than nested generators: a 5,000-term sum is 5,000 levels deep, and ``yield from`` would
    pass each node up through every level."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` returns a replacement for a node or None to keep it."""
    cls = type(e)
    if cls is Var or cls is Const:  # the common nodes by hand: schedules transform every index
        node = e
    elif cls is Binary:
        a, b = transform(e.a, fn), transform(e.b, fn)
        node = e if a is e.a and b is e.b else Binary(e.op, a, b, e.dtype, e.span)
    else:
        node = _rebuilt(e, fn)
    out = fn(node)
    return node if out is None else out


def _rebuilt(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """``e`` with its children transformed (any node class)."""
    updates = {}
    for name in _field_names(type(e)):
        value = getattr(e, name)
        if isinstance(value, Expr):
            new = transform(value, fn)
            if new is not value:
                updates[name] = new
        elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
            new_t = tuple(transform(v, fn) for v in value)
            if any(n is not o for n, o in zip(new_t, value)):
                updates[name] = new_t
        elif isinstance(value, tuple) and value and isinstance(value[0], IterVar):
            new_axes = tuple(IterVar(ax.var, transform(ax.extent, fn)) for ax in value)
            if any(n.extent is not o.extent for n, o in zip(new_axes, value)):
                updates[name] = new_axes
    return replace(e, **updates) if updates else e


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables by name."""
    if not mapping:
        return e
    return transform(e, lambda n: mapping.get(n.name) if isinstance(n, Var) else None)


def free_vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


# ---------------------------------------------------------------- printing

def format_expr(e: Expr, parent_prec: int = 0) -> str:
    """Source-like text of an expression; casts and reductions spelled as in the language."""
    if isinstance(e, Const):
        if e.dtype.is_bool:
            return "true" if e.value else "false"
        if e.dtype.is_float:
            text = repr(float(e.value))
            return text if e.dtype == dtypes.f64 else f"{e.dtype}({text})"
        return str(e.value) if e.dtype == dtypes.i64 else f"{e.dtype}({e.value})"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Binary):
        if e.op in ("max", "min"):
            return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
        prec = _PRECEDENCE[e.op]
        right_prec = prec if e.op == "pow" else prec + 1
        left_prec = prec + 1 if e.op == "pow" else prec
        text = f"{format_expr(e.a, left_prec)} {_SYMBOL[e.op]} {format_expr(e.b, right_prec)}"
        return f"({text})" if prec < parent_prec else text
    if isinstance(e, Unary):
        if e.op == "neg":
            text = f"-{format_expr(e.a, 7)}"
            return f"({text})" if parent_prec > 7 else text
        text = f"not {format_expr(e.a, 3)}"
        return f"({text})" if parent_prec > 3 else text
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.a)})"
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Read):
        return f"{e.tensor}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, Load):
        return f"{e.buffer}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(f"{ax.var.name}: {format_expr(ax.extent)}" for ax in e.axes)
        acc = f" as {e.acc_dtype}" if e.acc_dtype != e.dtype else ""
        return f"{e.op}[{axes}]{acc}({format_expr(e.body)})"
    raise TypeError(f"cannot print {type(e).__name__}")
