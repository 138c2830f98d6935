"""fuse: two perfectly nested loops become one over the product of their extents.

Both must still be plain serial loops: the fused loop takes no kind from either (a vector loop
fused with its neighbour would be a vector of their product's lanes, 4096 in one fuzzed
schedule, which LLVM took minutes to lower; a parallel one would run iterations in parallel that
were never checked to be independent). Fuse first, then vectorize, unroll, parallelise or bind.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Var, const
from tcc.ir.loopnest import const_extent, fresh, on_loops, require_loop, subst
from tcc.ir.loops import For, LoopFunc, Stmt, is_sequential

_AFTER = {kind: f"{verb} the fused loop" for kind, verb in
          (("vector", "vectorize"), ("parallel", "parallelise"), ("unroll", "unroll"))}


def fuse(func: LoopFunc, outer: str, inner: str, name: str | None = None, span: Span | None = None) -> LoopFunc:
    """``for outer: for inner: body`` -> ``for name: body[outer := name // Ei, inner := name % Ei]``."""
    for loop in require_loop(func, outer, span):
        if not (isinstance(loop.body, For) and loop.body.var.name == inner):
            raise TccScheduleError(f"cannot fuse {outer} and {inner}: {inner} is not the only statement "
                                   f"directly inside {outer}", span, "fuse a loop with the loop right inside it")
        for part in (loop, loop.body):
            if is_sequential(part):  # the fused loop would be free to run in parallel, out of order
                raise TccScheduleError(f"cannot fuse {outer} and {inner}: {part.var.name} runs in order (a recurrence "
                                       "reads what its earlier iterations stored)", span,
                                       f"leave {part.var.name} as it is; parallelise the other loops")
            if part.kind != "serial":
                then = _AFTER.get(part.kind, f"bind it to {part.kind}")
                raise TccScheduleError(f"cannot fuse {outer} and {inner}: {part.var.name} is already {part.kind}",
                                       span, f"fuse {outer} and {inner} first, then {then}")
        const_extent(loop, span)
        const_extent(loop.body, span)
    fused = name or fresh(func, f"{outer}_{inner}")
    return on_loops(func, outer, lambda s: _fuse(s, fused))


def _fuse(s: For, name: str) -> Stmt:
    """A loop of one iteration contributes ``0``, the other loop the fused index whole: a unit
    batch loop fused with the rows leaves the rows' indices plain (``v``, not ``v % 64``), which
    the epilogue fold of a GEMM can invert (GPT-2's GELU into its MLP's first GEMM)."""
    inner: For = s.body  # type: ignore[assignment]
    m, n = int(s.extent.value), int(inner.extent.value)  # type: ignore[attr-defined]
    v = Var(name)
    high = const(0) if m == 1 else v if n == 1 else Binary("floordiv", v, const(n), v.dtype)
    low = const(0) if n == 1 else v if m == 1 else Binary("mod", v, const(n), v.dtype)
    body = subst(inner.body, {s.var.name: high, inner.var.name: low})
    return replace(s, var=v, extent=const(m * n), body=body)
