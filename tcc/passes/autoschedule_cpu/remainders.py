"""Full register tiles for the remainder rows of a dynamic GEMM.

A contraction whose row count is a dynamic shape symbol ``M`` leaves, after its splits, a
remainder of ``M % mr`` rows that no constant tile covers: as a plain loop of rows its register
tile stays in memory and every k step loads and stores it (a 7-row matmul ran at half the
specialised kernel's speed). Here each loop over the remainder's rows runs all ``mr`` rows
instead, so that it unrolls like the full tiles: the loops that touch only the kernel's own
tiles (zeroing the accumulator, the multiply-adds over the packed panel) compute rows past the
remainder on what the tile holds there and nobody reads them; the loops that reach past the
tiles (packing A's rows, storing C's or its accumulator's) keep a guard ``ii < M % mr`` per
unrolled row.

A dynamic column count leaves ``N % nr`` columns the same way, a loop the vector lanes cannot
take (a 3x3 conv at 7x7: 17 of its 49 pixels ran scalar, the kernel at a third of the
specialised one's speed). The loops over the remainder's columns that touch only the tiles run
all ``nr`` columns as whole vectors (``guard=False``); those that reach past them (gathering B's
columns, storing C's) stay loops of ``N % nr``, since a guard per lane is no branch. Once the
patch gather is inlined into the packing copy (:mod:`.pack_gather`), the copy into the
remainder's panel reads the input through clamped indices, in bounds for every lane: it too runs
``nr`` lanes (:func:`pad_gathers`; as a loop of ``N % nr`` each element took two divisions by
the dynamic width, and a 7x7 image's 17 remainder columns cost more than its GEMM).
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Var, const, free_vars
from tcc.ir.loopnest import fresh, loads, nest_loops, stores, subst
from tcc.ir.loops import Allocate, Buffer, For, If, Let, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts
from tcc.passes.loops.vectorize import vectorize
from tcc.passes.simplify import simplify


def pad_remainders(func: LoopFunc, loop: str, rows: int, guard: bool = True, tile: str | None = None) -> LoopFunc:
    """``func`` with each loop named ``loop`` over a remainder ``E % rows`` run over ``rows``
    (see the module docstring); its cached tiles are ``rows`` long (``cache``'s remainder bound).
    Without ``guard`` a loop that reaches past the tiles is left as it is. ``tile``: the loop of
    one iteration around the remainder's tile (a split's tail), which then runs only where
    there is a remainder (512 columns padded a tile of 32 for none: 6% more work)."""
    buffers = {**func.buffers(), **{p.name: p for p in func.params if isinstance(p, Buffer)}}

    def skip_empty(s: Stmt) -> Stmt | None:
        if not (isinstance(s, For) and s.var.name == tile and s.extent == const(1)):
            return None
        rests = {f.extent for f in walk_stmts(s.body) if isinstance(f, For) and f.var.name == loop
                 and _remainder_of(f, rows)}
        return If(Binary("ge", rests.pop(), const(1), dtypes.boolean), s) if len(rests) == 1 else None

    def visit(s: Stmt) -> Stmt | None:
        if not (isinstance(s, For) and s.var.name == loop and _remainder_of(s, rows)):
            return None
        padded = all(_within(buffers[a.buffer], a.indices, loop, rows) for a in stores(s.body)) \
            and all(_within(buffers[a.buffer], a.indices, loop, rows, read=True) for a in loads(s.body))
        if not (padded or guard):
            return None
        body = s.body if padded else If(Binary("lt", s.var, s.extent, dtypes.boolean), s.body)
        return replace(s, extent=const(rows), body=body)

    body = map_stmt(func.body, visit)
    return replace(func, body=map_stmt(body, skip_empty) if tile is not None else body)


def _within(buf: Buffer, indices: tuple, loop: str, rows: int, read: bool = False) -> bool:
    """Whether an access stays inside ``buf`` for every value of ``loop`` up to ``rows``: a
    register tile (local), a dim indexed by the loop alone that has ``rows`` elements (a packed
    panel's rows), or a ``read`` the loop does not move (packed A's element in a column loop).
    An access to anything else (an argument, the accumulator of C) is guarded."""
    if buf.scope == "local":
        return True
    uses = [d for d, i in enumerate(indices) if loop in free_vars(i)]
    if read and not uses:
        return True
    if read and all(_clamped(indices[d], buf.shape[d]) for d in uses):
        return True
    return all(indices[d] == Var(loop) and isinstance(buf.shape[d], int) and buf.shape[d] >= rows for d in uses) \
        and bool(uses)


def _remainder_of(s: For, rows: int) -> bool:
    e = s.extent
    return isinstance(e, Binary) and e.op == "mod" and isinstance(e.b, Const) and int(e.b.value) == rows


def _clamped(index: Expr, dim: int | Expr) -> bool:
    """``min(max(e, 0), dim - 1)``: a read through a pad, inside the dim whatever ``e`` is."""
    return isinstance(index, Binary) and index.op == "min" and isinstance(index.a, Binary) \
        and index.a.op == "max" and index.a.b == Const(0, index.dtype) \
        and simplify(index.b) == simplify(Binary("sub", dim if isinstance(dim, Expr) else const(dim),
                                                 const(1), index.dtype))


def pad_gathers(func: LoopFunc) -> LoopFunc:
    """Each innermost copy over a remainder ``E % n`` into the last dim (of ``n`` elements) of a
    packed panel, reading only in bounds at every lane, run as ``n`` vector lanes (see the
    module docstring)."""
    params = {p.name for p in func.params}
    buffers = func.buffers()
    for f in [f for f in walk_stmts(func.body) if isinstance(f, For) and f.kind == "serial"]:
        loops, store = nest_loops(f)
        if len(loops) != 1 or not isinstance(store, Store) or store.buffer in params \
                or store.indices[-1] != f.var or not isinstance(f.extent, Binary) or f.extent.op != "mod":
            continue
        lanes = buffers[store.buffer].shape[-1]
        if not (isinstance(lanes, int) and f.extent.b == const(lanes) and 4 <= lanes):
            continue
        name = fresh(func, f"{f.var.name}_lanes")
        renamed = replace(f, var=Var(name, f.var.dtype), body=subst(store, {f.var.name: Var(name, f.var.dtype)}))
        body = map_stmt(func.body, lambda s, f=f, new=renamed: new if s is f else None)
        padded = pad_remainders(replace(func, body=body), name, lanes, guard=False)
        try:
            func = vectorize(padded, name)
        except TccScheduleError:
            continue
        cond = Binary("ge", f.extent, const(1), dtypes.boolean)  # (an empty remainder gathers nothing)
        func = replace(func, body=_guard_nest(func.body, name, cond))
    return func


def _guard_nest(s: Stmt, loop: str, cond: Expr) -> Stmt:
    """``s`` with the outermost perfect loop nest that holds ``loop`` run only where ``cond``."""
    if isinstance(s, For) and any(f.var.name == loop for f in nest_loops(s)[0]):
        return If(cond, s)
    if isinstance(s, Seq):
        return seq(*(_guard_nest(c, loop, cond) for c in s.stmts))
    if isinstance(s, For | Allocate | Let):
        return replace(s, body=_guard_nest(s.body, loop, cond))
    if isinstance(s, If):
        return replace(s, then=_guard_nest(s.then, loop, cond),
                       otherwise=None if s.otherwise is None else _guard_nest(s.otherwise, loop, cond))
    return s
