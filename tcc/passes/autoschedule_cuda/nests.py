"""The loop nests the GPU schedules share out: fresh names, and a nest's spatial axes (those
whose iterations write disjoint elements, which blocks and threads may take), with extents
that may be the dynamic shape symbols' (:mod:`.indexing`)."""

from __future__ import annotations

from dataclasses import dataclass

from tcc import dtypes
from tcc.ir.expr import Var, free_vars, walk
from tcc.ir.loops import Allocate, For, Let, LoopFunc, Stmt, Store, is_sequential, stmt_exprs, walk_stmts
from tcc.passes.autoschedule_cuda.indexing import Size, invariant, size_of

I64 = dtypes.i64


class Names:
    """Fresh variable names that clash with nothing in the function."""

    def __init__(self, func: LoopFunc):
        taken = {p.name for p in func.params} | set(func.buffers())
        # the dynamic shape symbols: scalar parameters an extent may read (kernel arguments)
        self.symbols = frozenset(p.name for p in func.params if isinstance(p, Var))
        for s in walk_stmts(func.body):
            if isinstance(s, (For, Let)):
                taken.add(s.var.name)
            for e in stmt_exprs(s):
                taken.update(n.name for n in walk(e) if isinstance(n, Var))
        self.taken = taken

    def fresh(self, base: str) -> Var:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}{i}"
        self.taken.add(name)
        return Var(name, I64)


@dataclass
class Nest:
    axes: list[For]  # the perfectly nested spatial loops, outermost first
    body: Stmt  # what they enclose

    @property
    def extents(self) -> list[Size]:
        """Each axis's extent: a constant, or an expression of the dynamic shape symbols."""
        return [size_of(f) for f in self.axes]

    def static(self) -> bool:
        return all(isinstance(e, int) for e in self.extents)


def split_axes(nest: Stmt) -> Nest:
    axes = []
    while isinstance(nest, For) and nest.kind == "serial":
        axes.append(nest)
        nest = nest.body
    return Nest(axes, nest)


def spatial_axes(nest: Stmt, symbols: frozenset[str]) -> Nest:
    """The perfectly nested loops whose iterations write disjoint elements, outermost first: the
    ones threads may share. A user's ``decompose`` leaves reduction loops perfectly nested inside
    the output loops (``Y[i] = Y[i] + ...`` under ``for i, k``); those stay serial in a thread, and
    so does a loop whose extent moves with an outer index (a triangular reduction). An extent of
    the dynamic shape ``symbols`` is the same for the whole call: its loop is shared out too."""
    axes = []
    while isinstance(nest, For) and nest.kind == "serial" and not is_sequential(nest) \
            and invariant(nest.extent, symbols) and disjoint(nest):
        axes.append(nest)
        nest = nest.body
    return Nest(axes, nest)


def disjoint(loop: For) -> bool:
    """Whether every store inside ``loop`` to a buffer made outside it indexes with its variable."""
    if size_of(loop) == 1:
        return True
    inner = {t.buffer.name for t in walk_stmts(loop.body) if isinstance(t, Allocate)}
    return all(any(loop.var.name in free_vars(i) for i in t.indices)
               for t in walk_stmts(loop.body) if isinstance(t, Store) and t.buffer not in inner)
