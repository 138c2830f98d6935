"""The CPU schedule of a streaming nest (:mod:`tcc.passes.te.lower_stream`): each row's work in
a tile, vectorised.

Within a block of rows the nest's loops over the tile's keys and over the output's columns
are what vectorise: the staged key tile ``K_tile[d, jj]``, the scores summed over ``d`` into a
vector of the tile's keys, the tile's maximum, exponentials and sum, and ``P . V`` along the
output's columns (``V[key, d]`` at unit stride, a probability broadcast). The generic choice
(the outermost loop storing at unit stride) would take the loop over the block's rows, whose
running maxima are stored at unit stride, and fail on everything inside it. The loops are
chosen here, from the inside of each row: a loop that stores at unit stride in its own body,
else an innermost loop that reads or writes at unit stride.
"""

from __future__ import annotations

from tcc.errors import TccScheduleError
from tcc.ir.loopnest import linear_coeff, loads, stores
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, Store, walk_stmts
from tcc.passes.loops.vectorize import vectorize
from tcc.passes.te.lower_stream import ROWS, STREAM
from tcc.passes.trace import SILENT, Trace

LANES = 32


def vectorize_streams(func: LoopFunc, trace: Trace = SILENT) -> LoopFunc:
    """Every streaming nest of ``func`` with its rows' loops vectorised (see the module doc)."""
    nests = [f for f in walk_stmts(func.body) if isinstance(f, For) and any(
        isinstance(n, For) and STREAM in n.annotations for n in walk_stmts(f.body)) and ROWS not in f.annotations]
    picked: list[str] = []
    for nest in nests:
        _pick(nest.body, picked)
    for name in dict.fromkeys(picked):
        try:
            func = trace(f"vectorize {name} by {LANES}", vectorize(func, name, LANES))
        except TccScheduleError:
            continue
    return func


def _pick(s: Stmt, out: list[str]) -> None:
    for g in _loops_under(s):
        if ROWS in g.annotations or STREAM in g.annotations:
            _pick(g.body, out)
        elif int(getattr(g.extent, "value", 0)) < 4:
            continue
        elif _stores_unit(g, direct=True) or (not _loops_under(g.body) and (_stores_unit(g) or _loads_unit(g))):
            out.append(g.var.name)
        else:
            _pick(g.body, out)


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
