"""inline: replace reads of an elementwise intermediate by the expression that defines it.

Trades memory traffic for recomputation; the intermediate's loop nest and buffer disappear.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Expr, Load, substitute, walk
from tcc.ir.loopnest import replace_loads, stores
from tcc.ir.loops import Allocate, For, LoopFunc, Stmt, Store, is_sequential, map_stmt, seq, stmt_exprs, walk_stmts


def inline(func: LoopFunc, tensor: str, span: Span | None = None) -> LoopFunc:
    if tensor not in func.buffers():
        raise TccScheduleError(f"op {func.name} has no tensor {tensor!r}", span)
    if any(p.name == tensor for p in func.params):
        raise TccScheduleError(f"{tensor} is an input or result of {func.name}; only intermediates inline", span)
    nest = elementwise_producer(func.body, tensor)
    if nest is None:
        raise TccScheduleError(f"{tensor} is not defined by a plain elementwise statement; it cannot be inlined",
                               span, "reductions stay materialised; use compute_at to fuse them")
    loops, store = nest
    if any(is_sequential(f) for f in loops):
        raise TccScheduleError(f"{tensor} is a recurrence (each element reads the one before); it cannot be "
                               "inlined", span)
    if len([st for st in stores(func.body) if st.buffer == tensor]) > 1:
        raise TccScheduleError(f"{tensor} is written by more than one statement (a decomposed reduction?); "
                               "it cannot be inlined", span)
    names = [f.var.name for f in loops]

    def expand(ld) -> Expr | None:
        if ld.buffer != tensor:
            return None
        return substitute(store.value, dict(zip(names, ld.indices)))

    def drop(s: Stmt) -> Stmt | None:
        if isinstance(s, Allocate) and s.buffer.name == tensor:
            return s.body
        if s == loops[0]:  # the producer's nest, wherever it sits (alone in a body or in a sequence)
            return seq()
        return None

    body = replace_loads(map_stmt(func.body, drop), expand)
    allocated = {b for b in _allocated(func.body)} & {ld.buffer for ld in walk(store.value) if isinstance(ld, Load)}
    outside = _read_outside(body, allocated, set())
    if outside:
        raise TccScheduleError(f"{tensor} reads {outside}, allocated around its own statements only (a decomposed "
                               f"reduction's accumulator?); its readers cannot see it, so it cannot be inlined", span)
    return replace(func, body=body)


def _allocated(s: Stmt) -> set[str]:
    return {a.buffer.name for a in walk_stmts(s) if isinstance(a, Allocate)}


def _read_outside(s: Stmt, buffers: set[str], scope: set[str]) -> str | None:
    """The first of ``buffers`` that ``s`` loads outside its allocation (``scope``: those around
    ``s``); None if every load is inside (CUDA fuzz seed 90581: decompose, then inline, moved reads
    of the accumulator past its allocation: an internal error in the verifier)."""
    if isinstance(s, Allocate):
        return _read_outside(s.body, buffers, scope | {s.buffer.name})
    for e in stmt_exprs(s):
        for n in walk(e):
            if isinstance(n, Load) and n.buffer in buffers and n.buffer not in scope:
                return n.buffer
    for c in s.children():
        found = _read_outside(c, buffers, scope)
        if found:
            return found
    return None


def _defines(s: For, tensor: str) -> bool:
    return any(st.buffer == tensor for st in stores(s))


def elementwise_producer(body: Stmt, tensor: str) -> tuple[list[For], Store] | None:
    """The loops and store of the plain elementwise nest defining ``tensor`` (one store at the loop
    variables, in order), which :func:`inline` may substitute into its readers; None if none."""
    for s in walk_stmts(body):  # outer loops first: a group loop around the nest is skipped
        if isinstance(s, For) and _defines(s, tensor):
            loops = []
            n: Stmt = s
            while isinstance(n, For):
                loops.append(n)
                n = n.body
            if isinstance(n, Store) and n.indices == tuple(f.var for f in loops):
                return loops, n
            if isinstance(n, Store):
                return None
    return None
