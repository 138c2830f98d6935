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
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Var, const, free_vars
from tcc.ir.loopnest import loads, stores
from tcc.ir.loops import Buffer, For, If, LoopFunc, Stmt, map_stmt


def pad_remainders(func: LoopFunc, loop: str, rows: int) -> LoopFunc:
    """``func`` with each loop named ``loop`` over a remainder ``E % rows`` run over ``rows``
    (see the module docstring); its cached tiles are ``rows`` long (``cache``'s remainder bound)."""
    buffers = {**func.buffers(), **{p.name: p for p in func.params if isinstance(p, Buffer)}}

    def visit(s: Stmt) -> Stmt | None:
        if not (isinstance(s, For) and s.var.name == loop and _remainder_of(s, rows)):
            return None
        padded = all(_within(buffers[a.buffer], a.indices, loop, rows) for a in (*loads(s.body), *stores(s.body)))
        body = s.body if padded else If(Binary("lt", s.var, s.extent, dtypes.boolean), s.body)
        return replace(s, extent=const(rows), body=body)

    return replace(func, body=map_stmt(func.body, visit))


def _within(buf: Buffer, indices: tuple, loop: str, rows: int) -> bool:
    """Whether an access stays inside ``buf`` for every value of ``loop`` up to ``rows``: a
    register tile (local), or a dim indexed by the loop alone that has ``rows`` elements (a packed
    panel's rows). An access to anything else (an argument, the accumulator of C) is guarded."""
    if buf.scope == "local":
        return True
    uses = [d for d, i in enumerate(indices) if loop in free_vars(i)]
    return all(indices[d] == Var(loop) and isinstance(buf.shape[d], int) and buf.shape[d] >= rows for d in uses) \
        and bool(uses)


def _remainder_of(s: For, rows: int) -> bool:
    e = s.extent
    return isinstance(e, Binary) and e.op == "mod" and isinstance(e.b, Const) and int(e.b.value) == rows
