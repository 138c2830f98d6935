"""Readable integer expressions for derived ops: sums of products of symbols, collected.

The gather form builds indices and shapes by substitution (``max(-1 * P + D * (KH - 1), 0)``);
:func:`tidy` rewrites every ``i64`` expression of an op as a polynomial with its like terms
collected (``max(D * KH - D - P, 0)``), positive terms first. ``//``, ``%``, ``max`` and
``min`` stay as they are around tidied operands. Integer arithmetic is exact, so the value
never changes.
"""

from __future__ import annotations

from dataclasses import fields, replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, IterVar, Unary, Var, format_expr
from tcc.ir.te import OpTE

Poly = dict[tuple[Expr, ...], int]  # a product of atoms (sorted by text) -> its coefficient
I64 = dtypes.i64


def tidy(e: Expr, index_vars: frozenset[str] = frozenset()) -> Expr:
    """``e`` with each maximal ``i64`` subexpression in collected polynomial form; the terms free
    of ``index_vars`` come last, grouped, so that specialisation folds them into one constant."""
    if e.dtype == I64 and isinstance(e, (Binary, Unary, Const, Var)):
        poly = _poly(e)
        moving = {k: v for k, v in poly.items() if any(isinstance(a, Var) and a.name in index_vars for a in k)}
        fixed = {k: v for k, v in poly.items() if k not in moving}
        if not moving or not fixed:
            return _build(poly)
        if all(v < 0 for v in moving.values()):
            return Binary("sub", _build(fixed), _build({k: -v for k, v in moving.items()}), I64)
        if any(v > 0 for v in fixed.values()):
            return Binary("add", _build(moving), _build(fixed), I64)
        return Binary("sub", _build(moving), _build({k: -v for k, v in fixed.items()}), I64)
    updates = {}
    for f in fields(e):
        value = getattr(e, f.name)
        if isinstance(value, Expr):
            updates[f.name] = tidy(value, index_vars)
        elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
            updates[f.name] = tuple(tidy(v, index_vars) for v in value)
        elif isinstance(value, tuple) and value and isinstance(value[0], IterVar):
            updates[f.name] = tuple(IterVar(ax.var, tidy(ax.extent)) for ax in value)
    return replace(e, **updates) if updates else e


def tidy_op(op: OpTE, index_vars: frozenset[str]) -> OpTE:
    """Every shape, pad width, extent and index of ``op`` tidied."""
    tensors = {n: replace(t, shape=tuple(tidy(d) for d in t.shape)) for n, t in op.tensors.items()}
    pads = {n: replace(p, lo=tuple(tidy(x) for x in p.lo), hi=tuple(tidy(x) for x in p.hi))
            for n, p in op.pads.items()}
    computes = [replace(c, axes=tuple(IterVar(ax.var, tidy(ax.extent)) for ax in c.axes),
                        body=tidy(c.body, index_vars)) for c in op.computes]
    return replace(op, tensors=tensors, pads=pads, computes=computes)


def _poly(e: Expr) -> Poly:
    if isinstance(e, Const):
        return {(): int(e.value)} if e.value else {}
    if isinstance(e, Unary) and e.op == "neg":
        return {k: -v for k, v in _poly(e.a).items()}
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        out = dict(_poly(e.a))
        for k, v in _poly(e.b).items():
            out[k] = out.get(k, 0) + (v if e.op == "add" else -v)
        return {k: v for k, v in out.items() if v}
    if isinstance(e, Binary) and e.op == "mul":
        out: Poly = {}
        for ka, va in _poly(e.a).items():
            for kb, vb in _poly(e.b).items():
                key = tuple(sorted(ka + kb, key=format_expr))
                out[key] = out.get(key, 0) + va * vb
        return {k: v for k, v in out.items() if v}
    if isinstance(e, Binary) and e.dtype == I64:  # floordiv, mod, max, min: an atom of tidied operands
        e = replace(e, a=tidy(e.a), b=tidy(e.b))
    return {(e,): 1}


def _build(poly: Poly) -> Expr:
    terms = sorted(poly.items(), key=lambda kv: (kv[1] < 0, not kv[0], [format_expr(a) for a in kv[0]]))
    out: Expr | None = None
    for atoms, coef in terms:
        size = abs(coef) if out is not None else coef
        term = _product(atoms, size)
        if out is None:
            out = term
        else:
            out = Binary("add" if coef > 0 else "sub", out, term, I64)
    return out if out is not None else Const(0, I64)


def _product(atoms: tuple[Expr, ...], coef: int) -> Expr:
    if not atoms:
        return Const(coef, I64)
    out: Expr = atoms[0] if coef == 1 else Const(coef, I64) if coef != -1 else Unary("neg", atoms[0], I64)
    rest = atoms[1:] if coef in (1, -1) else atoms
    for a in rest:
        out = Binary("mul", out, a, I64)
    return out

