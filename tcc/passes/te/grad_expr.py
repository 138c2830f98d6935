"""Reverse-mode derivatives of one scalar expression, for :mod:`tcc.passes.te.grad`.

:func:`partials` walks an elementwise expression from its root with the upstream gradient
``g`` and returns, for every tensor read it meets, the expression that read contributes to:
``g * d(root)/d(read)``. The expressions it builds are ordinary TE expressions; literals are
weak (``f64`` constants print as plain numbers), so the source printer and semantic analysis
give them the dtype of the value they meet, as in hand-written code.

Tie rules (the same as PyTorch's ``maximum``/``minimum``): ``max(a, b)`` sends the gradient to
the larger operand, and half of it to each when they are equal. ``abs`` has derivative 0 at
0; ``floor``, ``ceil``, ``//``, comparisons and integer values have none.
"""

from __future__ import annotations

import math

from tcc import dtypes
from tcc.ir.expr import Binary, Call, Cast, Const, Expr, Read, Select, Unary

Partial = tuple[Read, Expr]


def num(value: float) -> Const:
    """A weak float literal."""
    return Const(float(value), dtypes.f64)


def is_num(e: Expr, value: float) -> bool:
    return isinstance(e, Const) and e.value == value


def fmul(a: Expr, b: Expr) -> Expr:
    """``a * b`` on floats, dropping factors of 1."""
    if is_num(a, 1):
        return b
    if is_num(b, 1):
        return a
    return Binary("mul", a, b, _float(a, b))


def fdiv(a: Expr, b: Expr) -> Expr:
    return a if is_num(b, 1) else Binary("div", a, b, _float(a, b))


def fadd(a: Expr, b: Expr) -> Expr:
    return Binary("add", a, b, _float(a, b))


def fsub(a: Expr, b: Expr) -> Expr:
    return Binary("sub", a, b, _float(a, b))


def fneg(a: Expr) -> Expr:
    if isinstance(a, Const):
        return Const(-a.value, a.dtype)
    return Unary("neg", a, a.dtype)


def fselect(cond: Expr, a: Expr, b: Expr) -> Expr:
    return Select(cond, a, b, _float(a, b))


def _float(a: Expr, b: Expr) -> dtypes.DType:
    """The dtype a float expression of ``a`` and ``b`` prints with: the strong one's."""
    for e in (a, b):
        if e.dtype.is_float and not isinstance(e, Const):
            return e.dtype
    return dtypes.f64


def partials(e: Expr, g: Expr, value: Expr | None = None) -> list[Partial]:
    """``(read, g * d e / d read)`` for every float read of ``e``; ``value`` stands for ``e``'s own
    value where a derivative needs it (a read of the tensor it is stored in, at the root)."""
    out: list[Partial] = []
    _walk(e, g, value, out)
    return out


def _walk(e: Expr, g: Expr, value: Expr | None, out: list[Partial]) -> None:
    if not e.dtype.is_float:
        return
    if isinstance(e, Read):
        out.append((e, g))
    elif isinstance(e, Cast):
        if e.a.dtype.is_float:
            _walk(e.a, g if e.a.dtype == e.dtype else Cast(g, e.a.dtype), None, out)
    elif isinstance(e, Unary):
        _walk(e.a, fneg(g), None, out)
    elif isinstance(e, Select):  # each branch's partials under its condition: the reads they make too
        for branch, taken in ((e.a, True), (e.b, False)):
            inner: list[Partial] = []
            _walk(branch, g, None, inner)
            out += [(r, fselect(e.cond, v, num(0)) if taken else fselect(e.cond, num(0), v)) for r, v in inner]
    elif isinstance(e, Call):
        _walk(e.args[0], _call(e, g, value or e), None, out)
    elif isinstance(e, Binary):
        for child, grad in _binary(e, g, value or e):
            _walk(child, grad, None, out)


def _call(e: Call, g: Expr, v: Expr) -> Expr:
    a = e.args[0]
    t = e.dtype
    rules = {
        "exp": lambda: fmul(g, v),
        "log": lambda: fdiv(g, a),
        "sqrt": lambda: fdiv(fmul(num(0.5), g), v),
        "rsqrt": lambda: fdiv(fmul(fmul(num(-0.5), g), v), a),
        "sin": lambda: fmul(g, Call("cos", (a,), t)),
        "cos": lambda: fneg(fmul(g, Call("sin", (a,), t))),
        "tanh": lambda: fmul(g, fsub(num(1), fmul(v, v))),
        "sigmoid": lambda: fmul(g, fmul(v, fsub(num(1), v))),
        "erf": lambda: fmul(fmul(g, num(2 / math.sqrt(math.pi))), Call("exp", (fneg(fmul(a, a)),), t)),
        "abs": lambda: fselect(Binary("gt", a, num(0), dtypes.boolean), g,
                               fselect(Binary("lt", a, num(0), dtypes.boolean), fneg(g), num(0))),
    }
    rule = rules.get(e.fn)
    return rule() if rule is not None else num(0)  # floor, ceil: flat


def _binary(e: Binary, g: Expr, v: Expr) -> list[tuple[Expr, Expr]]:
    a, b = e.a, e.b
    op = e.op
    if op == "add":
        return [(a, g), (b, g)]
    if op == "sub":
        return [(a, g), (b, fneg(g))]
    if op == "mul":
        return [(a, fmul(g, b)), (b, fmul(g, a))]
    if op == "div":
        return [(a, fdiv(g, b)), (b, fneg(fdiv(fmul(g, v), b)))]
    if op == "pow":
        return [(a, _pow_base(a, b, g)), (b, fmul(fmul(g, v), Call("log", (a,), e.dtype)))]
    if op in ("max", "min"):
        wins = Binary("gt" if op == "max" else "lt", a, b, dtypes.boolean)
        loses = Binary("lt" if op == "max" else "gt", a, b, dtypes.boolean)
        half = fmul(num(0.5), g)
        return [(a, fselect(wins, g, fselect(loses, num(0), half))),
                (b, fselect(wins, num(0), fselect(loses, g, half)))]
    if op == "mod":  # a - floor(a / b) * b
        return [(a, g), (b, fneg(fmul(g, Call("floor", (fdiv(a, b),), e.dtype))))]
    return []  # floordiv, comparisons: flat


def _pow_base(a: Expr, b: Expr, g: Expr) -> Expr:
    """``g * b * a ** (b - 1)``, with a constant exponent folded (``x ** 2`` gives ``2 * x``)."""
    if isinstance(b, Const):
        if b.value == 1:
            return g
        power = a if b.value == 2 else Binary("pow", a, num(b.value - 1), a.dtype)
        return fmul(g, fmul(num(b.value), power))
    return fmul(g, fmul(b, Binary("pow", a, fsub(b, num(1)), a.dtype)))
