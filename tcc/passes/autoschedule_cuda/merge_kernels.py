"""Consecutive one-block kernels merged into one kernel, a barrier between their bodies.

A small op with an intermediate (``T[i] = exp(X[i])`` then ``Y[i] = T[i] + T[N - 1 - i]`` at
N = 256) schedules as two kernels of one block each: the second reads what other threads of the
first wrote, so they could not share a kernel of many blocks. With one block they can: a
``__syncthreads()`` makes the first body's global writes visible to every thread of the block
before the second body reads them. One launch instead of two is most of such a call's cost
(an H100 runs each tiny kernel in a few microseconds, a launch costs about as much again).

Merged: a kernel ``for b in 0..1 (block.x) { for t in 0..B (thread.x) { body } }`` with nothing
else in it (no annotation, no shared memory, no warp-wide or asynchronous statement) and the one
after it of the same shape and thread count B; their thread loops become one, the second body's
block and thread variables renamed to the first's. An aligned variant and its fallback are
never merged (the launcher picks one of the two).
"""

from __future__ import annotations

from tcc.ir.expr import Const
from tcc.ir.loopnest import subst
from tcc.ir.loops import Allocate, Barrier, For, If, Let, Seq, Stmt, Store, walk_stmts

PASS = "merge one-block kernels"  # its name in the trace
_PLAIN = (Seq, Let, If, Store, Barrier)  # what a merged body may hold (and serial loops, local buffers)


def merge_one_block_kernels(kernels: list[Stmt]) -> list[Stmt]:
    """``kernels`` (a function's top-level statements, in launch order) with each run of mergeable
    one-block kernels made one."""
    out: list[Stmt] = []
    for i, kernel in enumerate(kernels):
        previous = out[-1] if out else None
        if (previous is not None and _mergeable(kernel) and _mergeable(previous)
                and not _aligned(kernels[i - 1]) and (i < 2 or not _aligned(kernels[i - 2]))
                and _threads(previous).extent == _threads(kernel).extent):
            out[-1] = _merge(previous, kernel)
        else:
            out.append(kernel)
    return out


def _aligned(kernel: Stmt) -> bool:
    return isinstance(kernel, For) and any(key == "aligned" for key, _ in kernel.annotations)


def _threads(kernel: Stmt) -> For:
    assert isinstance(kernel, For) and isinstance(kernel.body, For)
    return kernel.body


def _mergeable(kernel: Stmt) -> bool:
    """Whether ``kernel`` is one block of one thread loop holding plain statements only."""
    if not (isinstance(kernel, For) and kernel.kind == "block.x" and isinstance(kernel.extent, Const)
            and kernel.extent.value == 1
            and not kernel.annotations and isinstance(kernel.body, For)):
        return False
    threads = kernel.body
    if threads.kind != "thread.x" or threads.annotations or not isinstance(threads.extent, Const):
        return False
    for s in walk_stmts(threads.body):
        if isinstance(s, For):
            if s.kind not in ("serial", "unroll"):
                return False
        elif isinstance(s, Allocate):
            if s.buffer.scope != "local":
                return False
        elif not isinstance(s, _PLAIN):
            return False
    return True


def _merge(first: Stmt, second: Stmt) -> For:
    """One kernel: ``first``'s body, a barrier, ``second``'s body in ``first``'s variables."""
    assert isinstance(first, For) and isinstance(second, For)
    t1, t2 = _threads(first), _threads(second)
    renamed = subst(t2.body, {second.var.name: first.var, t2.var.name: t1.var})
    body = Seq((*(t1.body.stmts if isinstance(t1.body, Seq) else (t1.body,)), Barrier(), renamed))
    return For(first.var, first.extent, For(t1.var, t1.extent, body, t1.kind, (), t1.span), first.kind, (),
               first.span)
