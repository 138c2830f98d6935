"""Index ranges that a statement does not declare, inferred from how the index is used: alone as a
tensor's index (its dimension gives the range; several that disagree are checked at
specialisation), or in an affine window ``y + r`` of a tensor whose other index's range is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tcc import dtypes
from tcc.errors import Span
from tcc.frontend import ast
from tcc.ir.expr import (
    Binary,
    Const,
    Expr,
    Read,
    Reduce,
    Unary,
    Var,
    walk,
)
from tcc.ir.te import Tensor


@dataclass(frozen=True)
class RangeSource:
    """Where an index variable's range was inferred from: dim ``dim`` of ``tensor``."""

    tensor: str
    dim: int
    extent: Expr
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RangeCheck:
    """Several tensors give an index its range; specialisation checks they agree."""

    var: str
    where: str  # "T" for T's statement, used in the message
    sources: tuple[RangeSource, ...]


def index_add(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value, dtypes.i64)
    return Binary("add", a, b, dtypes.i64)


def ast_children(node: ast.Node) -> list[ast.Node]:
    out: list[ast.Node] = []
    for value in vars(node).values():
        if isinstance(value, ast.Node):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.Node))
    return out


def affine_extent(var: str, body: Expr, tensors: dict[str, Tensor]) -> Expr | None:
    """The largest range of ``var`` that keeps every read ``T[c*var + rest]`` in bounds.

    Used when ``var`` is never an index on its own, as in ``Z[n, f, y, x] = sum[c, r, s](
    Xp[n, c, y*S + r, x*S + s] * ...)``: ``y*S + r <= dim - 1`` for every ``r`` gives
    ``y < (dim - max(r)) // S + 1``. Several reads give the minimum. The bounds proof
    re-checks the result for the concrete shapes.
    """
    extents = {ax.var.name: ax.extent for n in walk(body) if isinstance(n, Reduce) for ax in n.axes}
    found: list[Expr] = []
    for read in (n for n in walk(body) if isinstance(n, Read)):
        for dim, idx in enumerate(read.indices):
            form = _linear(idx, extents.keys() | {var})
            if form is None or var not in form:
                continue
            coef = form.pop(var)
            if (isinstance(coef, Const) and coef.value <= 0) or any(v not in extents for v in form if v):
                continue
            top = _sub(tensors[read.tensor].shape[dim], Const(1, dtypes.i64))
            for v, c in form.items():  # subtract the largest value of the rest of the index
                if isinstance(c, Const) and c.value < 0:
                    break
                top = _sub(top, c if v is None else _mul(c, _sub(extents[v], Const(1, dtypes.i64))))
            else:
                found.append(index_add(Binary("floordiv", top, coef, dtypes.i64), Const(1, dtypes.i64)))
    if not found:
        return None
    out = found[0]
    for other in found[1:]:
        if other != out:
            out = Binary("min", out, other, dtypes.i64)
    return out


def _linear(e: Expr, index_vars: set[str]) -> dict[str | None, Expr] | None:
    """``e`` as {index var: coefficient, None: constant part}, or None if not affine."""
    if isinstance(e, Var):
        return {e.name: Const(1, dtypes.i64)} if e.name in index_vars else {None: e}
    if isinstance(e, Const):
        return {None: e}
    if isinstance(e, Unary) and e.op == "neg":
        inner = _linear(e.a, index_vars)
        return None if inner is None else {k: _mul(Const(-1, dtypes.i64), v) for k, v in inner.items()}
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _linear(e.a, index_vars), _linear(e.b, index_vars)
        if a is None or b is None:
            return None
        for k, v in b.items():
            v = v if e.op == "add" else _mul(Const(-1, dtypes.i64), v)
            a[k] = index_add(a[k], v) if k in a else v
        return a
    if isinstance(e, Binary) and e.op == "mul":
        a, b = _linear(e.a, index_vars), _linear(e.b, index_vars)
        if a is None or b is None:
            return None
        if list(a) == [None]:
            return {k: _mul(a[None], v) for k, v in b.items()}
        if list(b) == [None]:
            return {k: _mul(v, b[None]) for k, v in a.items()}
    return None


def _sub(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value - b.value, dtypes.i64)
    return Binary("sub", a, b, dtypes.i64)


def _mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and a.value == 1:
        return b
    if isinstance(b, Const) and b.value == 1:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value, dtypes.i64)
    return Binary("mul", a, b, dtypes.i64)


def affine_form(e: Expr, index_vars: set[str]) -> dict[str | None, Expr] | None:
    """``e`` as {index variable: coefficient, None: the rest}, or None where it is not affine in
    ``index_vars`` (a recurrence's read ``H[t - 1, d]`` is {t: 1, None: -1} along its first dim)."""
    return _linear(e, index_vars)
