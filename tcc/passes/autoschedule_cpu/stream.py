"""The CPU schedule of a streaming nest (:mod:`tcc.passes.te.lower_stream`): each row's work in
a tile, vectorised.

Within a block of rows the nest's loops over the tile's keys and over the output's columns
are what vectorise: the staged key tile ``K_tile[d, jj]``, the scores summed over ``d`` into a
vector of the tile's keys, the tile's maximum, exponentials and sum, and ``P . V`` along the
output's columns (``V[key, d]`` at unit stride, a probability broadcast). The generic choice
(the outermost loop storing at unit stride) would take the loop over the block's rows, whose
running maxima are stored at unit stride, and fail on everything inside it. The loops are
chosen here, from the inside of each row: a loop that stores at unit stride in its own body,
else an innermost loop that reads or writes at unit stride (up to 64 lanes one vector, longer
loops vectors of 32).
The loops over a group's few rows are unrolled: each row's sums sit at constant offsets of a
small buffer, which LLVM then keeps in vector registers (a matrix product's register tile), and
products added to sums are fused multiply-adds, as in the GEMM schedule.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Const
from tcc.ir.loopnest import fresh, linear_coeff, loads, on_loops, stores
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, Store, walk_stmts
from tcc.passes.autoschedule_cpu.gemm import items
from tcc.passes.loops.fuse import fuse
from tcc.passes.loops.parallel import parallel
from tcc.passes.loops.schedule import contract
from tcc.passes.loops.vectorize import vectorize
from tcc.passes.te.lower_stream import GROUP, ROWS, SHORT_KEYS, STREAM
from tcc.passes.trace import SILENT, Trace

LANES = 32  # a longer loop is split into vectors of this many lanes
WHOLE = 64  # a loop up to this long is one vector: a group's sums at constant offsets stay in registers


def vectorize_streams(func: LoopFunc, trace: Trace = SILENT) -> LoopFunc:
    """Every streaming nest of ``func`` with its rows' loops vectorised (see the module doc)."""
    nests = [f for f in walk_stmts(func.body) if isinstance(f, For) and any(
        isinstance(n, For) and STREAM in n.annotations for n in walk_stmts(f.body)) and ROWS not in f.annotations]
    picked: list[For] = []
    unrolled: list[str] = []
    for nest in nests:
        _pick(nest.body, picked, unrolled)
    for g in picked:
        try:
            if not isinstance(g.extent, Const):  # a short tile's keys, a multiple of SHORT_KEYS
                func = trace(f"vectorize {g.var.name} by {SHORT_KEYS}", vectorize(func, g.var.name, SHORT_KEYS))
            elif int(g.extent.value) <= WHOLE:
                func = trace(f"vectorize {g.var.name}", vectorize(func, g.var.name))
            else:
                func = trace(f"vectorize {g.var.name} by {LANES}", vectorize(func, g.var.name, LANES))
        except TccScheduleError:
            continue
    for name in unrolled:
        func = trace(f"unroll {name}", on_loops(func, name, lambda f: replace(f, kind="unroll")))
    return trace("contract", contract(func)) if nests else func


def parallel_streams(func: LoopFunc, trace: Trace = SILENT) -> LoopFunc:
    """Each streaming nest's loops over the rows' outer axes and blocks of rows (batch x heads x
    query blocks) fused into one parallel loop: hundreds of chunks for the thread team to take as
    they come, where heads alone (8) left a thread that the OS preempts holding up the call. A
    stream with its keys in parts runs its parts in parallel."""
    for item in items(func.body):
        if not (isinstance(item, For) and any(isinstance(n, For) and STREAM in n.annotations
                                              for n in walk_stmts(item))):
            continue
        names = [item.var.name]
        loop: Stmt = item
        while isinstance(loop, For) and isinstance(loop.body, For) and STREAM not in loop.body.annotations \
                and ROWS not in loop.body.annotations:
            loop = loop.body
            names.append(loop.var.name)
        name = names[0]
        for inner in names[1:]:
            fused = fresh(func, f"{name}_{inner}")
            try:
                func = trace(f"fuse {name}, {inner}", fuse(func, name, inner, name=fused))
            except TccScheduleError:
                break  # (another statement shares the outer loop: the rows' loops so far)
            name = fused
        try:
            func = trace(f"parallel {name}", parallel(func, name))
        except TccScheduleError:
            continue  # (the generic step parallelises what it can)
    return func


def _pick(s: Stmt, out: list[For], unrolled: list[str]) -> None:
    for g in _loops_under(s):
        if GROUP in g.annotations:
            unrolled.append(g.var.name)
            _pick(g.body, out, unrolled)
        elif ROWS in g.annotations or STREAM in g.annotations:
            _pick(g.body, out, unrolled)
        elif isinstance(g.extent, Const) and int(g.extent.value) < 4:
            continue
        elif _stores_unit(g, direct=True) or (not _loops_under(g.body) and (_stores_unit(g) or _loads_unit(g))):
            out.append(g)
        else:
            _pick(g.body, out, unrolled)


def _loops_under(s: Stmt) -> list[For]:
    """The loops directly under ``s`` (through sequences, allocations, conditions)."""
    if isinstance(s, For):
        return [s]
    if isinstance(s, Seq):
        return [f for c in s.stmts for f in _loops_under(c)]
    if isinstance(s, (Allocate, Let)):
        return _loops_under(s.body)
    if isinstance(s, If):
        return [f for c in s.children() for f in _loops_under(c)]
    return []


def _stores_unit(g: For, direct: bool = False) -> bool:
    found = _direct_stores(g.body) if direct else stores(g.body)
    return any(st.indices and linear_coeff(st.indices[-1], g.var.name) == 1 for st in found)


def _loads_unit(g: For) -> bool:
    return any(ld.indices and linear_coeff(ld.indices[-1], g.var.name) == 1 for ld in loads(g.body))


def _direct_stores(s: Stmt) -> list[Store]:
    if isinstance(s, Store):
        return [s]
    if isinstance(s, For):
        return []
    return [st for c in s.children() for st in _direct_stores(c)]
