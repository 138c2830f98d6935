"""unroll: mark loops for full unrolling, or split them first and unroll the inner part."""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.loopnest import const_extent, dynamic_remainder, on_loops, require_loop
from tcc.ir.loops import LoopFunc
from tcc.passes.loops.split import split

MAX_UNROLL = 256


def unroll(func: LoopFunc, loop: str, factor: int | None = None, span: Span | None = None) -> LoopFunc:
    """Unroll ``loop`` fully, or by ``factor`` (then the inner loop ``{loop}_u`` is unrolled)."""
    if factor is not None:
        func = split(func, loop, factor, outer=f"{loop}_o", inner=f"{loop}_u", span=span)
        loop = f"{loop}_u"
    for found in require_loop(func, loop, span):
        if dynamic_remainder(func, found):
            continue  # (the remainder of a split of a dynamic extent stays a loop)
        n = const_extent(found, span)
        if n > MAX_UNROLL:
            raise TccScheduleError(f"loop {loop} has {n} iterations; unrolling it fully would bloat the code",
                                   span, f"unroll by a factor: unroll {loop} by 4")
        if found.kind not in ("serial", "unroll"):
            raise TccScheduleError(f"loop {loop} is already {found.kind}", span)
    return on_loops(func, loop, lambda s: None if dynamic_remainder(func, s) else replace(s, kind="unroll"))
