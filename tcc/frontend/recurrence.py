"""Recurrences: a statement that reads its own tensor at earlier positions.

``H[t, d] = select(t == 0, X[t, d], A[t, d] * H[t - 1, d] + X[t, d])`` reads ``H`` one step back
along ``t``. That is allowed when, along exactly one axis, the index is ``axis - c`` for a
constant ``c >= 1`` and every other index is the left-hand side's own variable: the axis then
runs in ascending order and every element it reads is already stored. Anything else (a later
position, offsets along two axes, an offset that is not a constant) could read an element before
it is computed, and is rejected here, at the read.
"""

from __future__ import annotations

from tcc import dtypes
from tcc.errors import Span, TccShapeError
from tcc.frontend.ranges import affine_form
from tcc.ir.expr import Const, Expr


def recurrence_axis(tensor: str, indices: tuple[Expr, ...], axes: list[str], span: Span | None) -> str:
    """The axis along which ``tensor[indices]``, read in ``tensor``'s own statement over ``axes``,
    looks back; raises at the read when it is not a strictly earlier position along one axis."""
    hint = f"a recurrence reads {tensor}[{', '.join(axes)}] with one index lowered by a constant, " \
           f"e.g. {tensor}[{', '.join([f'{axes[0]} - 1', *axes[1:]])}], guarded by select"
    back: list[tuple[str, int]] = []
    for dim, (idx, axis) in enumerate(zip(indices, axes)):
        offset = _offset(idx, axis, set(axes))
        if offset is None:
            raise TccShapeError(f"{tensor} reads itself with index {dim} not of the form {axis} - c "
                                "(c a constant): its own statement may read it only at earlier positions "
                                "along one axis", span, hint)
        if offset > 0:
            raise TccShapeError(f"{tensor} reads itself at a later position along {axis} ({axis} + {offset}), "
                                "which is not computed yet", span, hint)
        if offset < 0:
            back.append((axis, -offset))
    if not back:
        raise TccShapeError(f"{tensor} reads the element it is defining", span, hint)
    if len(back) > 1:
        raise TccShapeError(f"{tensor} reads itself at an offset along {back[0][0]} and {back[1][0]}: "
                            "a recurrence runs in order along one axis", span, hint)
    return back[0][0]


def _offset(idx: Expr, axis: str, index_vars: set[str]) -> int | None:
    """``c`` where ``idx`` is ``axis + c`` for a constant integer ``c``, else None."""
    form = affine_form(idx, index_vars)
    if form is None or set(form) - {None} != {axis}:
        return None
    coef, rest = form[axis], form.get(None, Const(0, dtypes.i64))
    if not (isinstance(coef, Const) and coef.value == 1 and isinstance(rest, Const)):
        return None
    return int(rest.value)
