"""Prove every tensor read in bounds by interval analysis, for concrete shapes.

Each index variable ranges over ``[0, extent - 1]``; intervals propagate through index
arithmetic. A read whose interval may leave its tensor is an error at the read's span
(reads of a ``pad`` view are checked against the padded shape: the view guards the rest).
"""

from __future__ import annotations

from tcc.errors import TccBoundsError
from tcc.ir.expr import Binary, Cast, Const, Expr, Read, Reduce, Select, Unary, Var, format_expr
from tcc.ir.te import OpTE

Interval = tuple[int, int]


def interval(e: Expr, ranges: dict[str, Interval]) -> Interval | None:
    """The range of values ``e`` takes, or None when it cannot be bounded."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if not e.dtype.is_float else None
    if isinstance(e, Var):
        return ranges.get(e.name)
    if isinstance(e, Cast) and e.dtype.is_int and (e.a.dtype.is_int or e.a.dtype.is_bool):
        return interval(e.a, ranges)
    if isinstance(e, Unary) and e.op == "neg":
        a = interval(e.a, ranges)
        return None if a is None else (-a[1], -a[0])
    if isinstance(e, Select):
        a, b = interval(e.a, ranges), interval(e.b, ranges)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, Binary):
        return _binary(e, ranges)
    return None


def _binary(e: Binary, ranges: dict[str, Interval]) -> Interval | None:
    a, b = interval(e.a, ranges), interval(e.b, ranges)
    if a is None or b is None:
        return None
    if e.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "mul":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if e.op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    if e.op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if e.op == "floordiv" and b[0] > 0:
        quotients = [x // y for x in a for y in b]
        return (min(quotients), max(quotients))
    if e.op == "mod" and b[0] > 0:
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return (0, b[1] - 1)
    return None


def check_bounds(op: OpTE) -> None:
    """Raise :class:`TccBoundsError` at the first read that may fall outside its tensor."""
    for c in op.computes:
        ranges = {}
        empty = False
        for ax in c.axes:
            n = int(ax.extent.value)  # type: ignore[attr-defined]
            empty |= n == 0
            ranges[ax.var.name] = (0, n - 1)
        if not empty:
            _check(c.body, op, ranges)


def _check(e: Expr, op: OpTE, ranges: dict[str, Interval]) -> None:
    if isinstance(e, Reduce):
        inner = dict(ranges)
        for ax in e.axes:
            n = int(ax.extent.value)  # type: ignore[attr-defined]
            if n == 0:
                return
            inner[ax.var.name] = (0, n - 1)
        _check(e.body, op, inner)
        return
    if isinstance(e, Read):
        _check_read(e, op, ranges)
    for c in e.children():
        _check(c, op, ranges)


def _check_read(e: Read, op: OpTE, ranges: dict[str, Interval]) -> None:
    shape = op.tensors[e.tensor].concrete_shape()
    for dim, (idx, size) in enumerate(zip(e.indices, shape)):
        span = interval(idx, ranges)
        if span is None:
            raise TccBoundsError(
                f"cannot prove index {dim} of {e.tensor} ({format_expr(idx)}) in bounds", e.span,
                "use affine indices of index variables, or pad the tensor: Xp = pad(X, [...])")
        lo, hi = span
        if lo < 0 or hi >= size:
            raise TccBoundsError(
                f"index {dim} of {e.tensor} ({format_expr(idx)}) takes values in [{lo}, {hi}] but "
                f"{e.tensor} has size {size} in that dim", e.span,
                "pad the tensor (Xp = pad(X, [...])) or shrink the result's shape")
