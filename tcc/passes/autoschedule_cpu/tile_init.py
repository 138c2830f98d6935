"""init_in_registers: register tiles start at the reduction's identity, not at a zeroed C.

After ``decompose`` and ``cache C at ir`` a GEMM zeroes C in a nest of its own (``i_init``: one
more pass over C, and one more fork when it runs in parallel), then every register tile loads
its block of C, accumulates and stores it back. When the reduction fits one k block, each tile
is loaded exactly once, right after that zeroing, so it may start from the identity instead: the
init nest and the loads go, and C is written once. With several k blocks
(``init_in_first_block``) the tiles of the first block start from the identity and the later
blocks load what the block before stored. The additions per element are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tcc import dtypes
from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load
from tcc.ir.loopnest import stores
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts


def init_in_registers(func: LoopFunc, target: str, tiles: set[str]) -> LoopFunc:
    """Drop ``target``'s init nest and fill its register tiles (the local buffers ``tiles``) with
    the init value (the caller guarantees that every element's tile is loaded once: a single k
    block). Only the tiles: another local buffer filled from ``target`` (a group's per-image
    slice of a convolution whose GEMM runs over the whole batch) reads the finished result."""
    init, value, tile_load = _tile_loads(func, target, tiles)

    def node(s: Stmt) -> Stmt | None:
        if s == init:
            return Seq(())
        return replace(s, value=value) if tile_load(s) else None

    return replace(func, body=map_stmt(func.body, node))


def init_in_first_block(func: LoopFunc, target: str, tiles: set[str], k_block: str) -> LoopFunc:
    """Drop ``target``'s init nest; in the first k block (``k_block == 0``) its register tiles
    (the local buffers ``tiles``) start at the init value instead of loading ``target``. A k
    tail (a second ``k_block`` loop after the first in one sequence) keeps its loads."""
    init, value, tile_load = _tile_loads(func, target, tiles)

    def branch(s: Stmt, cond: Expr) -> Stmt:
        """The outermost nests that only load tiles, as ``if cond: tiles = identity else: as before``."""
        if isinstance(s, For) and stores(s) and all(tile_load(st) for st in stores(s)):
            return If(cond, map_stmt(s, lambda n: replace(n, value=value) if tile_load(n) else None), s)
        if isinstance(s, Seq):
            return seq(*(branch(c, cond) for c in s.stmts))
        if isinstance(s, For | Allocate | Let):
            return replace(s, body=branch(s.body, cond))
        return s

    def first(k: For) -> For:
        return replace(k, body=branch(k.body, Binary("eq", k.var, Const(0, k.var.dtype), dtypes.boolean)))

    def rewrite(s: Stmt) -> Stmt:
        if s == init:
            return Seq(())
        if isinstance(s, For) and s.var.name == k_block:
            return first(s)
        if isinstance(s, Seq):
            parts, seen = [], False
            for c in s.stmts:
                if isinstance(c, For) and c.var.name == k_block:
                    parts.append(c if seen else first(c))
                    seen = True
                else:
                    parts.append(rewrite(c))
            return seq(*parts)
        if isinstance(s, For | Allocate | Let):
            return replace(s, body=rewrite(s.body))
        if isinstance(s, If):
            return replace(s, then=rewrite(s.then), otherwise=None if s.otherwise is None else rewrite(s.otherwise))
        return s

    return replace(func, body=rewrite(func.body))


def _tile_loads(func: LoopFunc, target: str, tiles: set[str]) -> tuple[For, Expr, Callable[[Stmt], bool]]:
    """``target``'s init nest, the value it stores, and a test for a store that loads a register
    tile (one of the local buffers ``tiles``) from ``target``."""
    init = _init_nest(func, target)
    local = {b.name for b in func.buffers().values() if b.scope == "local"} & tiles

    def tile_load(s: Stmt) -> bool:
        return isinstance(s, Store) and s.buffer in local and isinstance(s.value, Load) and s.value.buffer == target
    return init, stores(init)[0].value, tile_load


def _init_nest(func: LoopFunc, target: str) -> For:
    """The nest ``decompose`` made to set ``target`` to the identity (its loops end in ``_init``)."""
    for s in walk_stmts(func.body):
        if isinstance(s, For) and s.var.name.endswith("_init"):
            written = stores(s)
            if written and all(st.buffer == target and isinstance(st.value, Const) for st in written):
                return s
    raise TccScheduleError(f"{target} has no init nest to fold into its register tiles")
