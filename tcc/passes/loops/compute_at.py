"""compute_at: compute an intermediate inside the loop of its consumer that uses it.

``m[n] = max[c](X[n, c])`` followed by ``for n: for c: e[n, c] = exp(X[n, c] - m[n])`` becomes
one loop over ``n`` computing ``m[n]`` then ``e[n, :]``. When every access to the intermediate
then sits inside that loop at index ``n``, its storage folds away that dim (one row, in cache,
per thread) and its buffer moves inside the loop.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Expr, Load, Var, free_vars, transform, walk
from tcc.ir.loopnest import allocated, loads, loop_names, map_exprs, stores, subst
from tcc.ir.loops import Allocate, For, LoopFunc, Seq, Stmt, Store, map_stmt, seq, stmt_exprs, walk_stmts

LOCAL_BYTES = 32 * 1024


def compute_at(func: LoopFunc, tensor: str, loop: str, span: Span | None = None) -> LoopFunc:
    allocs, items = _top_level(func.body)
    pi = next((i for i, s in enumerate(items) if any(st.buffer == tensor for st in stores(s))), None)
    if pi is None:
        raise TccScheduleError(f"op {func.name} computes no tensor {tensor!r}", span)
    producer = items[pi]
    ci = next((i for i in range(pi + 1, len(items)) if _reads(items[i], tensor)), None)
    if ci is None or not isinstance(producer, For):
        raise TccScheduleError(f"nothing after {tensor} reads it; there is no consumer loop to compute it in", span)
    target = next((s for s in walk_stmts(items[ci]) if isinstance(s, For) and s.var.name == loop), None)
    if target is None:
        raise TccScheduleError(f"the consumer of {tensor} has no loop {loop!r}", span)
    dim = _check(producer, items[ci], target, tensor, span)
    _check_dependences(producer, items[pi + 1:ci], items[ci], target, tensor, span)
    moved = _rename_clashes(func, subst(producer.body, {producer.var.name: target.var}), items[ci], target)
    consumer = map_stmt(items[ci], lambda s: replace(s, body=seq(moved, s.body)) if s == target else None)
    items = items[:pi] + items[pi + 1:ci] + [consumer] + items[ci + 1:]
    body = seq(*items)
    fold = next((a for a in allocs if a.name == tensor), None)
    if fold is not None and not any(_reads(s, tensor) for s in items if s is not consumer):
        allocs = [a for a in allocs if a.name != tensor]
        body = map_stmt(body, lambda s: _fold(s, fold, dim) if isinstance(s, For) and s.var == target.var
                        and _reads(s, tensor) else None)
    for a in reversed(allocs):
        body = Allocate(a, body)
    return replace(func, body=body)


def _top_level(body: Stmt):
    allocs = []
    while isinstance(body, Allocate):
        allocs.append(body.buffer)
        body = body.body
    return allocs, list(body.stmts) if isinstance(body, Seq) else [body]


def _reads(s: Stmt, tensor: str) -> bool:
    return any(isinstance(n, Load) and n.buffer == tensor for st in walk_stmts(s) for e in stmt_exprs(st)
               for n in walk(e))


def _check(producer: For, consumer: Stmt, target: For, tensor: str, span: Span | None) -> int:
    if producer.extent != target.extent:
        raise TccScheduleError(f"loop {target.var.name} runs {target.extent} times but {tensor}'s outer loop "
                               f"{producer.extent}", span)
    dims = {i for st in stores(producer) if st.buffer == tensor for i, x in enumerate(st.indices)
            if x == producer.var}
    if len(dims) != 1:
        raise TccScheduleError(f"{tensor} is not indexed by its outer loop {producer.var.name}", span)
    dim = dims.pop()
    for st in walk_stmts(consumer):
        for e in stmt_exprs(st):
            for n in walk(e):
                if isinstance(n, Load) and n.buffer == tensor and n.indices[dim] != target.var:
                    raise TccScheduleError(f"the consumer reads {tensor} at other values of {target.var.name}; "
                                           "computing it inside that loop would change the result", span)
    if any(target.var.name in free_vars(x) for st in stores(producer) for x in st.indices
           if producer.var.name not in free_vars(x)):
        raise TccScheduleError(f"{target.var.name} is used inside {tensor}'s computation", span)
    return dim


def _check_dependences(producer: For, between: list[Stmt], consumer: Stmt, target: For, tensor: str,
                       span: Span | None) -> None:
    """The producer moves past ``between`` and into ``consumer``: refuse when that changes what
    any statement reads. Nothing in between may touch what the producer writes, nor write what it
    reads; the consumer may read the producer's other results only at the moved loop's index."""
    private = allocated(producer)
    written = {st.buffer for st in stores(producer)} - private
    read = {ld.buffer for ld in loads(producer)} - private
    for s in between:
        touched = {st.buffer for st in stores(s)} | {ld.buffer for ld in loads(s)}
        clash = sorted(written & touched) or sorted(read & {st.buffer for st in stores(s)})
        if clash:
            raise TccScheduleError(f"computing {tensor} later would reorder it with a statement that uses "
                                   f"{clash[0]}; that would change the result", span)
    if {st.buffer for st in stores(consumer)} & read:
        raise TccScheduleError(f"the consumer of {tensor} writes what {tensor} reads", span)
    dims = {name: {i for st in stores(producer) if st.buffer == name for i, x in enumerate(st.indices)
                   if x == producer.var} for name in written if name != tensor}
    for ld in loads(consumer):
        if ld.buffer in dims and (len(dims[ld.buffer]) != 1
                                  or ld.indices[next(iter(dims[ld.buffer]))] != target.var):
            raise TccScheduleError(f"the consumer reads {ld.buffer} (also computed in {tensor}'s loop) at other "
                                   f"values of {target.var.name}; that would change the result", span)


def _rename_clashes(func: LoopFunc, moved: Stmt, consumer: Stmt, target: For) -> Stmt:
    """Rename the moved loops whose names a loop around (or at) the target already uses."""
    around = {f.var.name for f in walk_stmts(consumer) if isinstance(f, For) and _encloses(f, target)}
    taken = loop_names(func.body) | set(func.buffers()) | {p.name for p in func.params}
    for name in sorted(loop_names(moved) & around):
        new = next(f"{name}{n}" for n in range(2, len(taken) + 3) if f"{name}{n}" not in taken)
        taken.add(new)
        moved = map_stmt(subst(moved, {name: Var(new)}),
                         lambda s, name=name, new=new: replace(s, var=Var(new))
                         if isinstance(s, For) and s.var.name == name else None)
    return moved


def _encloses(outer: For, inner: For) -> bool:
    return outer is inner or any(n is inner for n in walk_stmts(outer.body))


def _fold(loop: For, buf, dim: int) -> Stmt:
    """Drop dim ``dim`` (always the loop variable here) and allocate the buffer inside the loop."""
    shape = buf.shape[:dim] + buf.shape[dim + 1:]
    new = replace(buf, shape=shape)
    small = new.static and buf.dtype.itemsize * max(1, math.prod(shape)) <= LOCAL_BYTES  # (dynamic: the heap)
    new = replace(new, scope="local" if small else "global")

    def expr(e: Expr) -> Expr:
        return transform(e, lambda n: Load(n.buffer, n.indices[:dim] + n.indices[dim + 1:], n.dtype)
                         if isinstance(n, Load) and n.buffer == buf.name else None)

    def node(s: Stmt) -> Stmt | None:
        if isinstance(s, Store) and s.buffer == buf.name:
            return replace(s, indices=s.indices[:dim] + s.indices[dim + 1:])
        return None
    body = map_stmt(map_exprs(loop.body, expr), node)
    return replace(loop, body=Allocate(new, body))



