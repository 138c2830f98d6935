"""Peel the borders of a window reduction over a padded tensor (max pool, average pool).

A read through a ``pad`` view lowers to ``select(inside, X[clamp(idx)], value)``
(:mod:`tcc.passes.te.lower`): every tap of every window pays the bound checks, the clamps and
a masked merge, though only the first and last few output rows and columns have windows that
reach the padding. For each output loop ``v`` of such a nest this pass finds, by interval
analysis over the window loops inside it, the range ``[lo, hi)`` of ``v`` whose windows stay in
bounds, and splits the loop into the border ``[0, lo)``, the interior ``[lo, hi)`` and the
border ``[hi, E)``. In the interior the checks that hold are dropped and the clamps they made
redundant removed, so its loads are plain (strided) loads; the borders keep the guarded body.
Loops inside the interior are peeled the same way (a pooling layer's columns inside its rows),
and so are the loops inside one with no interior (a pool's window loops, when every output
reaches the padding); the copies keep the loop's name, as split's tails do, so later steps
(vectorize) reach each.

Only nests that reduce into a local accumulator through a guarded read are peeled: an im2col
patch gather (a copy, packed by the GEMM schedule) keeps its form.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Select, Var, free_vars, iadd, substitute, transform, walk
from tcc.ir.loopnest import linear_coeff, map_exprs, subst
from tcc.ir.loops import Allocate, For, LoopFunc, Seq, Stmt, Store, map_stmt, seq, stmt_exprs, walk_stmts
from tcc.passes.te.bounds import Interval, interval


def peel_borders(func: LoopFunc) -> LoopFunc:
    """Each top-level window reduction with guarded reads split into borders and interior."""
    return replace(func, body=_top(func.body))


def _top(s: Stmt) -> Stmt:
    if isinstance(s, Seq):
        return seq(*(_top(c) for c in s.stmts))
    if isinstance(s, Allocate):
        return replace(s, body=_top(s.body))
    if isinstance(s, For) and _window_reduction(s):
        return _peel(s, {})
    return s


def _window_reduction(nest: For) -> bool:
    """All loops serial, and a local accumulator updated from a guarded read."""
    stmts = list(walk_stmts(nest))
    if any(isinstance(n, For) and n.kind != "serial" for n in stmts):
        return False
    local = {n.buffer.name for n in stmts if isinstance(n, Allocate) and n.buffer.scope == "local"}
    return any(isinstance(st, Store) and st.buffer in local and _guards(st.value)
               and any(getattr(e, "buffer", None) == st.buffer for e in walk(st.value)) for st in stmts)


def _guards(e: Expr) -> list[Binary]:
    """The bound checks ``e >= 0`` and ``e < N`` that the selects of ``e`` are conjunctions of."""
    found: list[Binary] = []
    for n in walk(e):
        if isinstance(n, Select):
            found += _terms(n.cond)
    return found


def _terms(cond: Expr) -> list[Binary]:
    if isinstance(cond, Binary) and cond.op == "and":
        return _terms(cond.a) + _terms(cond.b)
    if isinstance(cond, Binary) and cond.op in ("ge", "lt") and isinstance(cond.b, Const):
        return [cond]
    return []


def _peel(f: For, ranges: dict[str, Interval]) -> Stmt:
    """``f`` as border, interior (its checks on ``f``'s variable dropped, loops inside peeled
    in turn) and border; ``f`` with the loops inside it peeled where none of its iterations has
    its checks all true."""
    extent = getattr(f.extent, "value", None)
    if not isinstance(extent, int):
        return f
    v = f.var.name
    inner = {**ranges, **_loop_ranges(f.body), v: (0, extent - 1)}
    lo, hi, held = 0, extent, []
    for term in dict.fromkeys(t for st in walk_stmts(f.body) for e in stmt_exprs(st) for t in _guards(e)):
        bound = _bound(term, v, inner)
        if bound is not None:
            lo, hi = max(lo, bound[0]), min(hi, bound[1])
            held.append(term)
    if not held or lo >= hi:  # (the loops inside may still have borders: a pool's rows inside its images)
        return replace(f, body=_descend(f.body, {**ranges, v: (0, extent - 1)}))
    interior = _drop(f.body, set(held))
    interior = subst(interior, {v: iadd(Var(v, f.var.dtype), lo)}) if lo else interior
    interior = _unclamp(interior, {**ranges, **_loop_ranges(interior), v: (0, hi - lo - 1)})
    interior = _descend(interior, {**ranges, v: (0, hi - lo - 1)})  # (``v`` now counts from ``lo``)
    interior = _unroll_windows(interior, {n for t in held for n in free_vars(t)} - {v})
    parts = [replace(f, extent=Const(lo, f.extent.dtype))] if lo else []
    parts.append(replace(f, extent=Const(hi - lo, f.extent.dtype), body=interior))
    if hi < extent:
        tail = subst(f.body, {v: iadd(Var(v, f.var.dtype), hi)})
        parts.append(replace(f, extent=Const(extent - hi, f.extent.dtype), body=tail))
    return seq(*parts)


WINDOW_UNROLL = 3


def _unroll_windows(s: Stmt, window: set[str]) -> Stmt:
    """The small window loops whose checks were dropped, unrolled: the interior's taps become
    straight-line loads (as ``unroll_masked_windows`` does for the guarded taps); left as
    loops, ResNet-18's stem max pool ran 1.14-1.21x its guarded form, unrolled 0.95-0.96x."""
    def node(n: Stmt) -> Stmt | None:
        if isinstance(n, For) and n.kind == "serial" and n.var.name in window \
                and 1 < int(getattr(n.extent, "value", 0)) <= WINDOW_UNROLL:
            return replace(n, kind="unroll")
        return None

    return map_stmt(s, node)


def _descend(s: Stmt, ranges: dict[str, Interval]) -> Stmt:
    if isinstance(s, For):
        return _peel(s, ranges)
    if isinstance(s, Seq):
        return seq(*(_descend(c, ranges) for c in s.stmts))
    if isinstance(s, Allocate):
        return replace(s, body=_descend(s.body, ranges))
    return s


def _loop_ranges(s: Stmt) -> dict[str, Interval]:
    """Each loop variable inside ``s`` over the widest of the loops that bind it."""
    out: dict[str, Interval] = {}
    for n in walk_stmts(s):
        if isinstance(n, For) and isinstance(getattr(n.extent, "value", None), int):
            top = max(out.get(n.var.name, (0, 0))[1], n.extent.value - 1)  # type: ignore[attr-defined]
            out[n.var.name] = (0, top)
    return out


def _bound(term: Binary, v: str, ranges: dict[str, Interval]) -> tuple[int, int] | None:
    """The ``[lo, hi)`` of ``v`` over which ``term`` holds for every value of the other loops
    (None: ``term`` does not move with ``v`` by a positive step, or cannot be bounded)."""
    c = linear_coeff(term.a, v)
    if not c or c < 0:
        return None
    rest = interval(substitute(term.a, {v: Const(0, dtypes.i64)}), ranges)
    if rest is None:
        return None
    if term.op == "ge":  # c*v + rest >= b for every rest
        return -((rest[0] - int(term.b.value)) // c), 1 << 62  # type: ignore[attr-defined]
    return 0, (int(term.b.value) - 1 - rest[1]) // c + 1  # type: ignore[attr-defined]


def _drop(s: Stmt, held: set[Binary]) -> Stmt:
    """``s`` with the checks ``held`` taken as true (and selects on nothing else gone)."""
    def node(e: Expr) -> Expr | None:
        if e in held:
            return Const(True, dtypes.boolean)
        if isinstance(e, Binary) and e.op == "and":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if isinstance(x, Const) and x.value is True:
                    return y
        if isinstance(e, Select) and isinstance(e.cond, Const) and e.cond.value is True:
            return e.a
        return None

    return map_exprs(s, lambda e: transform(e, node))


def _unclamp(s: Stmt, ranges: dict[str, Interval]) -> Stmt:
    """``min(max(x, 0), N)`` is ``x`` where ``x`` provably stays in ``[0, N]``."""
    def node(e: Expr) -> Expr | None:
        if isinstance(e, Binary) and e.op in ("min", "max") and isinstance(e.b, Const):
            r = interval(e.a, ranges)
            if r is not None and (r[1] <= e.b.value if e.op == "min" else r[0] >= e.b.value):
                return e.a
        return None

    return map_exprs(s, lambda e: transform(e, node))
