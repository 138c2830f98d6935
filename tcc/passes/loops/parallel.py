"""parallel: run a loop's iterations on the CPU's cores (tcc's thread pool, codegen_cpu.pool).

A loop may run in parallel when its iterations write disjoint elements: every store inside to a
buffer that outlives the loop indexes it with the loop variable, and every such buffer is read
only through the loop variable too. Nested parallel loops are refused (one fork per region).
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import const, free_vars
from tcc.ir.loopnest import allocated, linear_coeff, loads, on_loops, require_loop, stores
from tcc.ir.loops import For, LoopFunc, is_sequential, walk_stmts
from tcc.passes.loops.scatter import check_scatter


def parallel(func: LoopFunc, loop: str, span: Span | None = None) -> LoopFunc:
    for found in require_loop(func, loop, span):
        check_parallel(func, found, span)
    return on_loops(func, loop, lambda s: replace(s, kind="parallel"))


def check_parallel(func: LoopFunc, loop: For, span: Span | None) -> None:
    name = loop.var.name
    if loop.extent == const(1):
        return  # the tail copy of a split: one iteration cannot race
    if is_sequential(loop):
        raise TccScheduleError(f"loop {name} runs a recurrence in order (each iteration reads what the one "
                               "before stored): it cannot run in parallel", span)
    check_scatter(loop, "run in parallel", span)
    if any(isinstance(n, For) and n.kind == "parallel" and n is not loop for n in walk_stmts(loop.body)):
        raise TccScheduleError(f"loop {name} contains a parallel loop; parallel loops do not nest", span)
    for outer in walk_stmts(func.body):
        if isinstance(outer, For) and outer.kind == "parallel" and outer.var.name != name \
                and any(n is loop for n in walk_stmts(outer.body)):
            raise TccScheduleError(f"loop {name} is inside parallel loop {outer.var.name}", span)
    private = allocated(loop.body)
    written = set()
    for st in stores(loop.body):
        if st.buffer in private:
            continue
        written.add(st.buffer)
        if not any(linear_coeff(i, name) not in (0,) for i in st.indices):
            raise TccScheduleError(f"iterations of loop {name} all write the same elements of {st.buffer} "
                                   "(a reduction): running them in parallel would race", span,
                                   "parallelise a loop whose variable indexes every result")
    for ld in loads(loop.body):
        if ld.buffer in written and not any(name in free_vars(i) for i in ld.indices):
            raise TccScheduleError(f"loop {name} reads {ld.buffer} across iterations while writing it", span)
