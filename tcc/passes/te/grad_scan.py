"""Adjoints that run along an axis, for :mod:`tcc.passes.te.grad`: prefix reductions and recurrences.

**Prefix reductions.** ``Y[.., i, ..] = sum[j: i + c](f(j))`` adds ``f(j)`` into every ``Y[i]``
with ``i > j - c``, so the adjoint of the term ``f(j)`` is the suffix sum
``G[j] = sum over i >= max(j - c + 1, 0) of dY[i]``: a reversed prefix sum, written as a prefix
sum over the reversed axis (``Grev[r] = sum[k: r + 1](dY[L - 1 - k])``, ``G[j] = Grev[J - 1 - j]``)
so that the scan rewrite makes it a recurrence, linear work like the forward. ``prod`` is the
same with ``dY[i] * Y[i]`` summed and divided by the term (undefined where a term is 0, as for
an ordinary ``prod``).

**Recurrences.** ``H[t] = f(H[t - k1], H[t - k2], .., inputs at t)`` (sequential along ``t``):
the adjoint ``dH`` of every position collects, besides what later statements read of it
(``ext``), what the later positions ``t = s + k`` of the recurrence pass back through their reads
``H[t - k]``. So ``dH[s] = ext[s] + sum over k of P_k(s + k) * dH[s + k]``: the same kind of
recurrence, run from ``t = T - 1`` down to 0. It is written along the reversed axis
(``R[r] = dH[T - 1 - r]``), where it reads itself at ``r - k``, guarded by ``r >= k``, as a
forward recurrence does; ``dH[s] = R[T - 1 - s]`` is then the upstream adjoint of the
statement's other reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcc import dtypes
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Const, Expr, IterVar, Read, Reduce, Var, free_vars, substitute, transform, walk
from tcc.ir.te import Compute
from tcc.passes.te.grad_expr import Partial, fadd, fdiv, fmul, fselect, num
from tcc.passes.te.grad_index import Adjoint, Emitter, iadd, imax, isub, linear

I64 = dtypes.i64


def _i(value: int) -> Const:
    return Const(value, I64)


@dataclass(frozen=True)
class Prefix:
    """A statement's reduction ``op[j: i + shift](..)``: its axis ``i`` and the constant ``shift``."""

    axis: str
    shift: int


def prefix_of(c: Compute) -> Prefix | None:
    """The prefix form of ``c``'s reduction, or None where no extent moves with an outer index;
    raises for a moving extent that has no adjoint rule here."""
    red = c.body
    axes = {ax.var.name for ax in c.axes}
    moving = [n for n in walk(red) if isinstance(n, Reduce) and any(free_vars(ax.extent) & axes for ax in n.axes)]
    if not moving:
        return None
    if isinstance(red, Reduce) and red.op in ("sum", "prod") and len(red.axes) == 1:
        form = linear(red.axes[0].extent, axes)
        names = [] if form is None else [k for k in form if k is not None]
        rest = None if form is None else form.get(None, _i(0))
        if len(names) == 1 and _is(form[names[0]], 1) and isinstance(rest, Const) \
                and names[0] not in _uses(red.body):
            return Prefix(names[0], int(rest.value))
    r = moving[0]
    raise TccCompileError(f"tcc.grad differentiates a reduction whose extent moves with an outer index only as a "
                          f"prefix sum or product (sum[j: i + c](f(j)), f not using i); {c.tensor}'s is "
                          f"{r.op}[{', '.join(ax.var.name for ax in r.axes)}] over extents depending on "
                          f"{', '.join(sorted(set().union(*(free_vars(ax.extent) & axes for ax in r.axes))))}",
                          r.span or c.span, "write the prefix as its own statement, or the op without it")


def _is(e: Expr, value: int) -> bool:
    return isinstance(e, Const) and e.value == value


def _uses(e: Expr) -> set[str]:
    used = free_vars(e)
    for n in walk(e):
        if isinstance(n, Reduce):
            used |= {v for ax in n.axes for v in free_vars(ax.extent)}
    return used


def prefix_partials(c: Compute, p: Prefix, adjoint: Adjoint, emit: Emitter,
                    partials) -> tuple[dict[str, Expr], list[Partial], Adjoint]:
    """The scope (the statement's axes with ``i`` replaced by ``j``) and the partials of the body of
    ``c``'s prefix reduction, each term's upstream the suffix sum of the adjoint (module docstring)."""
    red = c.body
    assert isinstance(red, Reduce)
    t = red.dtype
    j = red.axes[0].var
    axes = tuple(ax.var for ax in c.axes)
    length = next(ax.extent for ax in c.axes if ax.var.name == p.axis)
    terms = iadd(length, _i(p.shift - 1))  # j runs over [0, L + c - 1)
    if p.shift < 1:
        terms = imax(terms, _i(0))
    added: Expr = Read(adjoint.name, axes, t)
    if red.op == "prod":
        added = fmul(added, Read(c.tensor, axes, t))
    r, k = Var(emit.fresh("r")), Var(emit.fresh("k"))
    at = {p.axis: isub(isub(length, _i(1)), k)}
    term = substitute(added, at)
    if p.shift > 1:  # the last values of r sum past the first position
        term = fselect(Binary("lt", k, length, dtypes.boolean), term, num(0))
    rev_axes = tuple(IterVar(r, terms) if ax.var.name == p.axis else ax for ax in c.axes)
    rev = emit.fresh(f"d{c.tensor}_rev")
    emit.add_temp(rev, t, tuple(ax.extent for ax in rev_axes), rev_axes,
                  Reduce("sum", (IterVar(k, iadd(r, _i(1))),), term, t, t))
    suffix = emit.fresh(f"d{c.tensor}_suffix")
    suf_axes = tuple(IterVar(j, terms) if ax.var.name == p.axis else ax for ax in c.axes)
    back = tuple(isub(isub(terms, _i(1)), j) if ax.var.name == p.axis else ax.var for ax in c.axes)
    emit.add_temp(suffix, t, tuple(ax.extent for ax in suf_axes), suf_axes, Read(rev, back, t))
    upstream: Expr = Read(suffix, tuple(ax.var for ax in suf_axes), t)
    if red.op == "prod":
        upstream = fdiv(upstream, red.body)
    scope = {ax.var.name: ax.extent for ax in suf_axes}
    suffix_adjoint = Adjoint(suffix, t, tuple(ax.var.name for ax in suf_axes), tuple(ax.extent for ax in suf_axes))
    return scope, partials(red.body, upstream), suffix_adjoint


def recurrence_partials(c: Compute, adj: str, emit: Emitter, partials) -> tuple[str, list[Partial]]:
    """The adjoint of recurrence ``c`` as a whole (``ext`` = ``adj`` plus what later positions pass
    back, module docstring), and the partials of its reads other than of itself, for the sweep."""
    axis = c.sequential[0]
    t = c.tensor
    dtype = c.body.dtype
    axes = tuple(ax.var for ax in c.axes)
    length = next(ax.extent for ax in c.axes if ax.var.name == axis)
    own = emit.fresh(f"d{t}_all")  # the placeholder of the total adjoint, replaced below
    parts = partials(c.body, Read(own, axes, dtype), Read(t, axes, dtype))
    r = Var(emit.fresh("r"))
    flip = isub(isub(length, _i(1)), r)  # s = T - 1 - r
    rev = emit.fresh(f"d{t}_rev")
    rev_axes = tuple(IterVar(r, length) if ax.var.name == axis else ax for ax in c.axes)
    body: Expr = Read(adj, tuple(flip if v.name == axis else v for v in axes), dtype)
    others: list[Partial] = []
    for read, value in parts:
        if read.tensor != t:
            others.append((read, value))
            continue
        back = _offset(read, axis)
        later = iadd(flip, _i(back))  # the position t = s + k whose read H[t - k] is H[s]
        moved = substitute(value, {axis: later})
        step = tuple(isub(r, _i(back)) if v.name == axis else v for v in axes)
        moved = transform(moved, lambda n, step=step: Read(rev, step, n.dtype)
                          if isinstance(n, Read) and n.tensor == own else None)
        body = fadd(body, fselect(Binary("ge", r, _i(back), dtypes.boolean), moved, num(0)))
    emit.add_temp(rev, dtype, tuple(ax.extent for ax in rev_axes), rev_axes, body, sequential=(r.name,))
    back_axes = tuple(flip_of(v, axis, length) for v in axes)
    emit.add_temp(own, dtype, tuple(ax.extent for ax in c.axes), c.axes, Read(rev, back_axes, dtype))
    return own, others


def flip_of(v: Var, axis: str, length: Expr) -> Expr:
    return isub(isub(length, _i(1)), v) if v.name == axis else v


def _offset(read: Read, axis: str) -> int:
    """``k`` of a recurrence's read of itself ``H[.., axis - k, ..]``."""
    for i in read.indices:
        form = linear(i, {axis})
        if form is not None and axis in form and not _is(form.get(None, _i(0)), 0):
            return -int(form[None].value)  # type: ignore[attr-defined]
    raise AssertionError(f"not a read of an earlier position along {axis}: {read}")
