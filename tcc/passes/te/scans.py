"""Prefix reductions become recurrences: linear work instead of a triangular loop.

``Y[b, i] = sum[j: i + c](f(b, j))`` reduces, for each ``i``, the first ``i + c`` values of
``f``; each is the previous one combined with one more value. The reduction becomes a prefix
tensor defined by a recurrence along ``i`` and read where the reduction was:

    P[b, i] = select(i == 0, sum[j: c](f(b, j)), P[b, i - 1] + f(b, i + c - 1))   (c >= 1)
    P[b, i] = select(i <= -c, 0, P[b, i - 1] + f(b, i + c - 1))                   (c <= 0)

(``0`` is the reduction's identity; ``prod``, ``max`` and ``min`` combine the same way). ``P``
keeps only the statement's axes that ``f`` uses, plus ``i``. Where the reduction is the whole
statement and has its tensor's dtype, the statement itself becomes the recurrence. A reduction
this does not cover (several axes, an extent not ``i + c``, a body that uses ``i``) stays a
triangular loop: correct, just not linear.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.frontend.ranges import affine_form
from tcc.ir.expr import (
    Binary,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    cast,
    free_vars,
    substitute,
    transform,
    unique_name,
    walk,
)
from tcc.ir.te import Compute, OpTE, Tensor
from tcc.passes.te.lower import combine, reduce_identity

I64 = dtypes.i64


def prefix_scans(op: OpTE) -> OpTE:
    """``op`` with every prefix reduction computed by a recurrence (see the module docstring)."""
    computes: list[Compute] = []
    tensors = dict(op.tensors)
    for c in op.computes:
        made: list[Compute] = []

        def visit(e: Expr, c: Compute = c, made: list[Compute] = made) -> Expr | None:
            prefix = _prefix(e, c, set(op.scalars))
            if prefix is None:
                return None
            r: Reduce = e  # type: ignore[assignment]
            axes = tuple(ax for ax in c.axes if ax.var.name in _uses(r.body) | {prefix[0]})
            if r is c.body and not c.accumulate and len(axes) == len(c.axes) \
                    and r.acc_dtype == r.dtype == tensors[c.tensor].dtype:  # (a += adds the prefix: below)
                made.append(_recurrence(c.tensor, r, axes, *prefix))  # the statement itself
                return None
            name = unique_name(f"{c.tensor}_prefix", set(tensors))
            tensors[name] = Tensor(name, r.acc_dtype, tuple(ax.extent for ax in axes), "temp", r.span)
            made.append(_recurrence(name, r, axes, *prefix))
            return cast(Read(name, tuple(ax.var for ax in axes), r.acc_dtype, r.span), r.dtype)

        body = transform(c.body, visit)
        if made and made[-1].tensor == c.tensor:
            computes.append(replace(made[-1], span=c.span))
        else:
            computes += [*made, replace(c, body=body) if made else c]
    if not any(c.sequential for c in computes if c not in op.computes):
        return op
    return replace(op, computes=computes, tensors=tensors)


def _prefix(e: Expr, c: Compute, scalars: set[str]) -> tuple[str, int] | None:
    """(the statement axis ``i``, ``c``) where ``e`` reduces over ``j < i + c`` a body that does not
    use ``i`` nor any enclosing reduction's index."""
    if not (isinstance(e, Reduce) and len(e.axes) == 1) or c.sequential:
        return None
    axes = {ax.var.name for ax in c.axes}
    form = affine_form(e.axes[0].extent, axes)
    if form is None or len(set(form) - {None}) != 1:
        return None
    (axis,) = set(form) - {None}
    coef, rest = form[axis], form.get(None, Const(0, I64))
    if not (isinstance(coef, Const) and coef.value == 1 and isinstance(rest, Const)):
        return None
    used = _uses(e.body)
    if axis in used or used - axes - scalars - {e.axes[0].var.name}:
        return None
    return axis, int(rest.value)


def _uses(e: Expr) -> set[str]:
    """The variables ``e`` depends on: those it names and those of its reductions' extents
    (``sum[k: i + 1](X[j])`` depends on ``i``: fuzz seed 796)."""
    used = free_vars(e)
    for n in walk(e):
        if isinstance(n, Reduce):
            used |= {v for ax in n.axes for v in free_vars(ax.extent)}
    return used


def _recurrence(name: str, r: Reduce, axes: tuple[IterVar, ...], axis: str, shift: int) -> Compute:
    """``name[axes]`` as the recurrence that gives ``r`` for every value of ``axis``."""
    j = r.axes[0].var
    i = next(ax.var for ax in axes if ax.var.name == axis)
    back = Read(name, tuple(Binary("sub", ax.var, Const(1, I64), I64) if ax.var is i else ax.var for ax in axes),
                r.acc_dtype, r.span)
    newest = substitute(r.body, {j.name: i if shift == 1 else Binary("add", i, Const(shift - 1, I64), I64)})
    step = combine(r.op, back, newest)
    if shift >= 1:
        first = substitute(r.body, {j.name: Const(0, I64)}) if shift == 1 else \
            replace(r, axes=(IterVar(j, Const(shift, I64)),), dtype=r.acc_dtype)
        body = Select(Binary("eq", i, Const(0, I64), dtypes.boolean), first, step, r.acc_dtype)
    else:
        body = Select(Binary("le", i, Const(-shift, I64), dtypes.boolean), reduce_identity(r.op, r.acc_dtype),
                      step, r.acc_dtype)
    return Compute(name, axes, body, r.span, sequential=(axis,))

