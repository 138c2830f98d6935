"""cache(T, L, local, init): a register tile of a decomposed reduction starts at its identity.

After ``decompose(C)`` and ``cache(C, L, local)``, C is set to the reduction's identity by a nest of
its own (its loops end in ``_init``: on the GPU one more kernel and one more pass over C), then
each tile loads its part of C, accumulates and stores it back. When every tile is loaded once
(each loop around ``L`` picks a different part of C, so the whole reduction runs inside ``L``)
and every read of C is such a load, the tiles may start at the identity instead: the init nest
and the loads go, and C is written once. The additions are the same, in the same order.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Const, Expr, Load, free_vars, walk
from tcc.ir.loopnest import stores
from tcc.ir.loops import For, Let, LoopFunc, Seq, Stmt, Store, map_stmt, stmt_exprs, walk_stmts


def start_at_init(func: LoopFunc, tensor: str, tiles: set[str], span: Span | None) -> LoopFunc:
    """``func`` with the local ``tiles`` of ``tensor`` (just made by a cache step) filled with the
    value of ``tensor``'s init nest, which goes."""
    init = _init_nest(func, tensor, span)
    value = stores(init)[0].value
    _check_loads(func.body, tensor, tiles, frozenset(), {}, span)

    def node(s: Stmt) -> Stmt | None:
        if s == init:
            return Seq(())
        if _is_tile_load(s, tensor, tiles):
            return replace(s, value=value)
        return None
    return replace(func, body=map_stmt(func.body, node))


def _init_nest(func: LoopFunc, tensor: str, span: Span | None) -> For:
    """The nest ``decompose`` made to set ``tensor`` to the identity (its loops end in ``_init``)."""
    for s in walk_stmts(func.body):
        if isinstance(s, For) and s.var.name.endswith("_init"):
            written = stores(s)
            if written and all(st.buffer == tensor and isinstance(st.value, Const) for st in written):
                return s
    raise TccScheduleError(f"cache({tensor}, ..., local, init): {tensor} has no init nest", span,
                           f"decompose({tensor}) first")


def _is_tile_load(s: Stmt, tensor: str, tiles: set[str]) -> bool:
    return isinstance(s, Store) and s.buffer in tiles and isinstance(s.value, Load) and s.value.buffer == tensor


def _check_loads(s: Stmt, tensor: str, tiles: set[str], loops: frozenset[str], lets: dict[str, frozenset[str]],
                 span: Span | None) -> None:
    """Every read of ``tensor`` outside its init nest is a copy into a tile, and every loop around
    that copy (but its own) picks a different part of ``tensor``: ``lets`` gives the loops each
    ``let``-bound name is computed from."""
    if _is_tile_load(s, tensor, tiles):
        assert isinstance(s, Store) and isinstance(s.value, Load)
        own = {n for i in s.indices for n in free_vars(i)}
        used = _depends(s.value.indices, lets) | own
        if loops - used:
            raise TccScheduleError(f"cache({tensor}, ..., local, init): loop {sorted(loops - used)[0]} around the "
                                   f"tile does not pick a part of {tensor}, so its tiles would start at the identity "
                                   "more than once", span, "cache at a loop outside every loop of the reduction")
        return
    if isinstance(s, For) and s.var.name.endswith("_init"):
        return
    if any(isinstance(n, Load) and n.buffer == tensor for e in stmt_exprs(s) for n in walk(e)):
        raise TccScheduleError(f"cache({tensor}, ..., local, init): {tensor} is also read outside its tiles", span,
                               f"cache {tensor} at the same loop in every nest that reads it")
    if isinstance(s, For) and not (isinstance(s.extent, Const) and s.extent.value == 1):  # (one pass: no repeat)
        loops = loops | {s.var.name}
        lets = {**lets, s.var.name: frozenset((s.var.name,))}
    elif isinstance(s, Let):
        lets = {**lets, s.var.name: _depends((s.value,), lets)}
    for c in s.children():
        _check_loads(c, tensor, tiles, loops, lets, span)


def _depends(exprs: tuple[Expr, ...], lets: dict[str, frozenset[str]]) -> frozenset[str]:
    """The loops ``exprs`` are computed from."""
    return frozenset().union(*(lets.get(n, frozenset()) for e in exprs for n in free_vars(e)))
