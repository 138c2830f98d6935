"""init_in_registers: register tiles of a one-k-block GEMM start at the reduction's identity.

After ``decompose`` and ``cache C at ir`` a GEMM zeroes C in a nest of its own (``i_init``: one
more pass over C, and one more fork when it runs in parallel), then every register tile loads
its block of C, accumulates and stores it back. When the reduction fits one k block, each tile
is loaded exactly once, right after that zeroing, so it may start from the identity instead: the
init nest and the loads go, and C is written once. The additions per element are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Const, Load
from tcc.ir.loops import For, LoopFunc, Seq, Stmt, Store, map_stmt, walk_stmts
from tcc.passes.loops.loopnest import stores


def init_in_registers(func: LoopFunc, target: str, tiles: set[str]) -> LoopFunc:
    """Drop ``target``'s init nest and fill its register tiles (the local buffers ``tiles``) with
    the init value (the caller guarantees that every element's tile is loaded once: a single k
    block). Only the tiles: another local buffer filled from ``target`` (a group's per-image
    slice of a convolution whose GEMM runs over the whole batch) reads the finished result."""
    init = _init_nest(func, target)
    value = stores(init)[0].value
    local = {b.name for b in func.buffers().values() if b.scope == "local"} & tiles

    def node(s: Stmt) -> Stmt | None:
        if s == init:
            return Seq(())
        if isinstance(s, Store) and s.buffer in local and isinstance(s.value, Load) and s.value.buffer == target:
            return replace(s, value=value)
        return None

    return replace(func, body=map_stmt(func.body, node))


def _init_nest(func: LoopFunc, target: str) -> For:
    """The nest ``decompose`` made to set ``target`` to the identity (its loops end in ``_init``)."""
    for s in walk_stmts(func.body):
        if isinstance(s, For) and s.var.name.endswith("_init"):
            written = stores(s)
            if written and all(st.buffer == target and isinstance(st.value, Const) for st in written):
                return s
    raise TccScheduleError(f"{target} has no init nest to fold into its register tiles")
