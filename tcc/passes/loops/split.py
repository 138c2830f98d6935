"""split: one loop becomes an outer and an inner loop; a remainder becomes a tail copy.

``for v in 0..E`` split by ``f`` gives ``for o in 0..E//f: for i in 0..f: body[v := o*f + i]``
and, when ``f`` does not divide ``E``, a tail ``for o in 0..1: for i in 0..E%f: body[v := E//f*f + i]``.
The tail keeps the names of the main part on purpose: every later primitive that names a loop
applies to both copies, so tails get the same tiling, unrolling and vectorisation as the main
part (with their own, shorter extents) instead of a slow scalar epilogue.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Var, const, free_vars, iadd, imul
from tcc.ir.loopnest import const_extent, fresh, loop_names, on_loops, require_loop, subst
from tcc.ir.loops import SEQUENTIAL, For, LoopFunc, Stmt, is_sequential, seq


def split(func: LoopFunc, loop: str, factor: int, outer: str | None = None, inner: str | None = None,
          span: Span | None = None, remainder_step: int | None = None) -> LoopFunc:
    """Split every loop named ``loop`` by ``factor`` into ``outer`` x ``inner``; a loop whose
    extent is an expression of dynamic shape symbols too (:func:`split_dynamic`, whose remainder
    is split again by ``remainder_step`` where given)."""
    loops = require_loop(func, loop, span)
    if not isinstance(factor, int) or factor < 1:
        raise TccScheduleError(f"split factor of {loop} must be a positive integer, got {factor!r}", span)
    arguments = {p.name for p in func.params}
    for found in loops:
        if not free_vars(found.extent) or not free_vars(found.extent) <= arguments:
            const_extent(found, span)  # (an extent of the dynamic shape symbols, kernel arguments, splits too)
        if found.kind in ("vector", "unroll"):  # its lanes or copies are one unit: split it first
            raise TccScheduleError(f"loop {loop} is already marked {found.kind}; it cannot be split", span,
                                   f"split (or unroll by a factor) before the step that marks {loop} {found.kind}")
    taken = (loop_names(func.body) | set(func.buffers()) | {p.name for p in func.params}) - {loop}
    for name in (outer, inner):
        if name in taken:
            raise TccScheduleError(f"split of {loop}: the name {name!r} is already used in {func.name}", span,
                                   "choose new names for the two loops")
    outer = outer or fresh(func, f"{loop}_o")
    inner = inner or fresh(func, f"{loop}_i")
    if outer == inner:
        raise TccScheduleError(f"split of {loop} needs two different names, got {outer!r} twice", span)
    return on_loops(func, loop, lambda s: split_loop(s, factor, outer, inner, remainder_step))


def split_loop(s: For, factor: int, outer: str, inner: str, remainder_step: int | None = None) -> Stmt:
    if not isinstance(s.extent, Const):
        return split_dynamic(s, factor, outer, inner, remainder_step)
    extent = int(s.extent.value)
    o, i = Var(outer), Var(inner)
    order = (SEQUENTIAL,) if is_sequential(s) else ()  # both halves of a recurrence's loop run in order
    parts = []
    full, rest = divmod(extent, factor)
    if full:
        body = subst(s.body, {s.var.name: iadd(imul(o, factor), i)})
        parts.append(replace(s, var=o, extent=const(full),
                             body=For(i, const(factor), body, annotations=order, span=s.span)))
    if rest or not parts:
        body = subst(s.body, {s.var.name: iadd(Const(full * factor, s.var.dtype), i)})
        kind = "serial" if s.kind == "parallel" else s.kind
        parts.append(replace(s, var=o, extent=const(1), kind=kind,
                             body=For(i, const(rest), body, annotations=order, span=s.span)))
    return seq(*parts)


def split_dynamic(s: For, factor: int, outer: str, inner: str, remainder_step: int | None = None) -> Stmt:
    """Split a loop whose extent ``E`` is known only at the call: ``E // factor`` whole steps of
    ``factor``, then a peeled remainder of ``E % factor`` iterations, with the names of the main
    part as a constant tail has (later primitives tile it alike). Its inner extent is not a
    constant: vectorize and unroll leave that copy a plain loop. A multiple declared with
    ``dynamic=`` (the extent ``factor * k``) leaves no remainder. With ``remainder_step`` (a
    divisor of ``factor``) the remainder is itself split, with the same names, into whole steps
    of that many and a last remainder (a GEMM's remainder rows as 4-row tiles)."""
    o, i = Var(outer), Var(inner)
    order = (SEQUENTIAL,) if is_sequential(s) else ()
    full, rest = _divide(s.extent, factor)
    body = subst(s.body, {s.var.name: iadd(imul(o, factor), i)})
    main = replace(s, var=o, extent=full, body=For(i, const(factor), body, annotations=order, span=s.span))
    if rest is None:
        return main
    start = imul(full, factor)
    kind = "serial" if s.kind == "parallel" else s.kind
    if remainder_step is not None and remainder_step < factor and factor % remainder_step == 0:
        rest_loop = replace(s, var=Var(f"{s.var.name}_rest"), extent=rest, kind=kind,
                            body=subst(s.body, {s.var.name: iadd(start, Var(f"{s.var.name}_rest"))}))
        return seq(main, split_dynamic(rest_loop, remainder_step, outer, inner))
    tail = replace(s, var=o, extent=const(1), kind=kind,
                   body=For(i, rest, subst(s.body, {s.var.name: iadd(start, i)}), annotations=order, span=s.span))
    return seq(main, tail)


def _divide(extent: Expr, factor: int) -> tuple[Expr, Expr | None]:
    """``(extent // factor, extent % factor)``; no remainder where ``extent`` is a multiple of
    ``factor`` by its form (``8 * k`` split by 2, 4 or 8)."""
    if isinstance(extent, Binary) and extent.op == "mul":
        for c, x in ((extent.a, extent.b), (extent.b, extent.a)):
            if isinstance(c, Const) and int(c.value) % factor == 0:
                return imul(x, int(c.value) // factor), None
    i64 = extent.dtype
    return Binary("floordiv", extent, const(factor), i64), Binary("mod", extent, const(factor), i64)
