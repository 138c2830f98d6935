"""Kernels by the range of a dynamic size: each range of a shape symbol's extent its own schedule.

A kernel compiled for every size of a dynamic shape symbol cannot be the one a constant size gets
at every size: a row of 1000 elements wants 4 steps of 256 threads in registers, a row of 8000
32 steps; a GEMM of 8 rows wants its reduction split across blocks, one of 8192 rows 128 x 128
tiles. So a schedule builds the kernels of a few ranges ``(lo, hi]`` of the extent, each as a
constant size near ``hi`` would get them but with the extent a variable (tails guarded or
masked), and marks every kernel of a range with the condition ``lo < E <= hi`` (annotation
``requires``: the launch checks it, the compiler assumes it), so that one range's kernels run
per call. The ranges cover every size: the last one is open above.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr
from tcc.ir.loops import REQUIRES, For, Seq, Stmt, seq

I64 = dtypes.i64


def by_range(extent: Expr, ranged: list[tuple[int, Stmt]], rest: Stmt) -> Stmt:
    """``ranged``'s kernels ``(hi, kernels)`` (``hi`` ascending) for the calls with ``extent`` in
    ``(previous hi, hi]``, then ``rest`` for the calls past the last ``hi``: every kernel
    annotated with its range's condition."""
    out: list[Stmt] = []
    low: int | None = None
    for high, kernels in ranged:
        out.append(_requiring(kernels, _within(extent, low, high)))
        low = high
    out.append(rest if low is None else _requiring(rest, _within(extent, low, None)))
    return seq(*out)


def _within(extent: Expr, low: int | None, high: int | None) -> Expr:
    """``low < extent <= high``, either side left out where None."""
    parts = ([Binary("lt", Const(low, I64), extent, dtypes.boolean)] if low is not None else []) + \
        ([Binary("le", extent, Const(high, I64), dtypes.boolean)] if high is not None else [])
    cond = parts[0]
    for part in parts[1:]:
        cond = Binary("and", cond, part, dtypes.boolean)
    return cond


def _requiring(kernels: Stmt, cond: Expr) -> Stmt:
    """Each kernel of ``kernels`` with ``cond`` and'ed to what it already requires."""
    def one(kernel: Stmt) -> Stmt:
        assert isinstance(kernel, For) and kernel.kind == "block.x"
        own = next((v for k, v in kernel.annotations if k == REQUIRES), None)
        both = cond if own is None else Binary("and", own, cond, dtypes.boolean)
        return replace(kernel, annotations=(*((k, v) for k, v in kernel.annotations if k != REQUIRES),
                                            (REQUIRES, both)))
    return seq(*map(one, kernels.stmts if isinstance(kernels, Seq) else (kernels,)))
