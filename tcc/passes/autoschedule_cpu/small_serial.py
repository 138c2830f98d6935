"""Small calls of a dynamic kernel run serial.

The schedule parallelises a loop by its work; where that work depends on dynamic shape symbols
(known only at the call), it cannot tell a call of 7 rows from one of 7000. Each such parallel
loop becomes ``if work >= PARALLEL_MIN_WORK: the parallel loop; else: the same loop, serial``:
the threads' fork and join (about a microsecond) is not paid by calls too small to gain from
it (an elementwise op on 7 x 1024 floats ran 0.8x the specialised kernel, which stays serial).
The serial copy allocates its rows' heap buffers once, not per row (as the threads do).

A loop of one iteration at the call stays serial whatever its work: a dynamic conv's GEMM over
a 7x7 image forked twice per row tile, for the one register tile of its remainders each, and
ran at 0.6 of the specialised kernel's throughput, which forks once.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, const, free_vars, iadd, imul
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, Store, map_stmt
from tcc.passes.autoschedule_cpu.gemm import PARALLEL_MIN_WORK


def serial_when_small(func: LoopFunc) -> LoopFunc:
    """``func`` with each parallel loop whose work is an expression of the kernel's arguments
    (dynamic shape symbols) run serial below :data:`PARALLEL_MIN_WORK`."""
    arguments = {p.name for p in func.params}

    def visit(s: Stmt) -> Stmt | None:
        if not (isinstance(s, For) and s.kind == "parallel"):
            return None
        work = _work(s)
        if work is None or isinstance(work, Const) or not free_vars(work) <= arguments:
            return None
        enough = Binary("and", Binary("ge", work, const(PARALLEL_MIN_WORK), dtypes.boolean),
                        Binary("ge", s.extent, const(2), dtypes.boolean), dtypes.boolean)
        return If(enough, s, _serial(s))

    return replace(func, body=map_stmt(func.body, visit))


def _serial(loop: For) -> Stmt:
    """``loop`` run serial, the heap buffers of a dynamic size that its iterations allocate (a
    softmax row's ``e``) allocated once around it rather than per iteration (each iteration
    writes them before it reads them, as the parallel loop's threads assume of theirs)."""
    body, hoisted = loop.body, []
    while isinstance(body, Allocate):
        hoisted.append(body.buffer)
        body = body.body
    kept = [b for b in hoisted if b.static or b.scope != "global"]
    for buf in reversed(kept):
        body = Allocate(buf, body)
    out: Stmt = replace(loop, kind="serial", body=body)
    for buf in reversed([b for b in hoisted if b not in kept]):
        out = Allocate(buf, out)
    return out


def _work(s: Stmt) -> Expr | None:
    """The stores ``s`` makes: each store times the extents of the loops around it (None where
    ``s`` holds something this does not count)."""
    if isinstance(s, Store):
        return const(1)
    if isinstance(s, For):
        inner = _work(s.body)
        return None if inner is None else imul(s.extent, inner)
    if isinstance(s, Allocate | Let):
        return _work(s.body)
    if isinstance(s, Seq | If):
        total: Expr = const(0)
        for c in s.children():
            part = _work(c)
            if part is None:
                return None
            total = iadd(total, part)
        return total
    return const(0)
