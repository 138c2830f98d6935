"""Constant folding and integer identities on scalar expressions.

Folding uses the language's semantics (floor division and modulo as in Python), and only
integer identities are applied (``x * 1``, ``x + 0``, ``x * 0``), so floats keep their exact
rounding and NaN behaviour.
"""

from __future__ import annotations

import math

from tcc import dtypes
from tcc.ir.expr import Binary, Cast, Const, Expr, Select, Unary, convert_value, transform

_FOLD = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "max": max, "min": min, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b, "and": lambda a, b: a and b, "or": lambda a, b: a or b,
}


def simplify(e: Expr) -> Expr:
    return transform(e, _simplify_node)


def _simplify_node(e: Expr) -> Expr | None:
    if isinstance(e, Binary):
        return _binary(e)
    if isinstance(e, Unary) and isinstance(e.a, Const):
        return Const(not e.a.value if e.op == "not" else -e.a.value, e.dtype)
    if isinstance(e, Cast) and isinstance(e.a, Const):
        return Const(convert_value(e.a.value, e.dtype), e.dtype)
    if isinstance(e, Select) and isinstance(e.cond, Const):
        return e.a if e.cond.value else e.b
    return None


def _binary(e: Binary) -> Expr | None:
    a, b = e.a, e.b
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold(e.op, a.value, b.value, e.a.dtype)
        if folded is not None:
            return Const(convert_value(folded, e.dtype), e.dtype)
        return None
    if not e.dtype.is_int:
        return None
    if e.op == "add":
        if _is(b, 0):
            return a
        if _is(a, 0):
            return b
    if e.op == "sub" and _is(b, 0):
        return a
    if e.op in ("add", "sub") and isinstance(b, Const):
        return _constant_tail(e)
    if e.op == "mul":
        if _is(b, 1):
            return a
        if _is(a, 1):
            return b
        if _is(a, 0) or _is(b, 0):
            return Const(0, e.dtype)
    if e.op == "floordiv" and _is(b, 1):
        return a
    if e.op == "mod" and _is(b, 1):  # a stride of 1 in a derived gradient: ``u % S == 0``
        return Const(0, e.dtype)
    return None


def _constant_tail(e: Binary) -> Expr | None:
    """``x + c1 - c2`` as ``x + (c1 - c2)``: a dynamic shape symbol's derived extent
    (``W + 2*P - (KW - 1) - 1 + 1`` of a padded conv is ``W``) reads as the symbol, so that
    passes comparing extents and strides see that they are the same."""
    a = e.a
    if not (isinstance(a, Binary) and a.op in ("add", "sub") and isinstance(a.b, Const) and a.b.dtype.is_int):
        return None
    total = (a.b.value if a.op == "add" else -a.b.value) + (e.b.value if e.op == "add" else -e.b.value)
    if total == 0:
        return a.a
    return Binary("add" if total > 0 else "sub", a.a, Const(abs(total), e.dtype), e.dtype, e.span)


def _fold(op: str, a: object, b: object, operand: dtypes.DType) -> object | None:
    if op in ("floordiv", "mod") and b == 0:
        return None
    if op == "div":
        return None if b == 0 else a / b
    if op == "pow":
        try:
            return a ** b
        except (OverflowError, ZeroDivisionError):
            return None
    if op in ("floordiv", "mod") and operand.is_float:
        return math.floor(a / b) if op == "floordiv" else a - math.floor(a / b) * b
    fn = _FOLD.get(op)
    return None if fn is None else fn(a, b)


def _is(e: Expr, value: int) -> bool:
    return isinstance(e, Const) and e.value == value


def evaluate_int(e: Expr) -> int | None:
    """The integer value of a closed expression, or None if it is not constant."""
    out = simplify(e)
    return int(out.value) if isinstance(out, Const) and not out.dtype.is_float else None
