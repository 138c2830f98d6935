"""vectorize: run a loop's iterations as the lanes of LLVM vectors.

The loop must have a constant extent (its lane count) and each iteration must write its own
elements. Two rewrites make common bodies vectorisable, both explicit in the IR:

* buffers allocated inside the loop (per-iteration scalars such as a max-pool accumulator) get
  one element per lane (a trailing dim indexed by the loop variable);
* a reduction into an accumulator allocated outside the loop is reassociated on purpose: it
  accumulates into a vector of partial results (``{acc}_v``, one per lane) initialised before the
  reduction's loops (a split's tail copy, narrower, adds into the first lanes) and folded into
  the accumulator after them (halving vector steps, then the last few lanes in order); a tail
  whose length is known only at the call adds into the accumulator after the fold, and the
  partial results are made only where the vector loop runs at all (a row shorter than a vector
  costs no fold). This is
  the one place tcc reorders a floating-point reduction; no global fast-math flag is ever set.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, const, free_vars, iadd, transform, walk
from tcc.ir.loopnest import (
    allocated,
    const_extent,
    dynamic_remainder,
    in_vector_loop,
    linear_coeff,
    loops_named,
    map_exprs,
    on_loops,
    require_loop,
    stores,
)
from tcc.ir.loops import (
    Allocate,
    Buffer,
    For,
    If,
    Let,
    LoopFunc,
    Seq,
    Stmt,
    Store,
    map_stmt,
    seq,
    stmt_exprs,
    walk_stmts,
)
from tcc.passes.loops.scatter import check_scatter
from tcc.passes.loops.split import split
from tcc.passes.te.lower import reduce_identity

MAX_LANES = 256
FOLD_SERIAL = 4  # partial results folded one by one; wider power-of-two vectors fold as a tree
_COMBINE = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}


def vectorize(func: LoopFunc, loop: str, lanes: int | None = None, span: Span | None = None) -> LoopFunc:
    """Vectorise ``loop`` (or, with ``lanes``, its inner part after a split ``{loop}_v``)."""
    if lanes is not None:
        func = split(func, loop, lanes, outer=f"{loop}_o", inner=f"{loop}_v", span=span)
        loop = f"{loop}_v"
    found = [f for f in require_loop(func, loop, span) if not dynamic_remainder(func, f)]
    if not found:
        raise TccScheduleError(f"loop {loop} runs a number of times known only at the call", span,
                               f"vectorize by a factor: vectorize {loop} by 16")
    if in_vector_loop(func, loop):
        raise TccScheduleError(f"loop {loop} is already (inside) a vector loop", span)
    width = 0
    for f in found:
        n = const_extent(f, span)
        if n > MAX_LANES:
            raise TccScheduleError(f"loop {loop} has {n} iterations, too many lanes for one vector", span,
                                   f"vectorize by a factor: vectorize {loop} by 16")
        if any(isinstance(s, For) and s.kind in ("vector", "parallel") for s in walk_stmts(f.body)):
            raise TccScheduleError(f"loop {loop} contains a vector or parallel loop", span)
        check_scatter(f, "vectorise", span)
        width = max(width, n)
    func = on_loops(func, loop, lambda s: None if dynamic_remainder(func, s) else
                    replace(s, body=_privatize(s.body, s.var.name, const_extent(s))))
    for acc in sorted(_reduction_buffers(func, loop)):
        func = _rfactor(func, loop, acc, width, span)  # (a dynamic remainder adds into the first lanes)
    for f in loops_named(func.body, loop):
        if not dynamic_remainder(func, f):
            _check(f, span)
    return on_loops(func, loop, lambda s: None if dynamic_remainder(func, s) else replace(s, kind="vector"))


def _privatize(body: Stmt, var: str, lanes: int) -> Stmt:
    """Give each buffer allocated inside the loop one element per lane."""
    names = allocated(body)
    if not names:
        return body
    v = Var(var)

    def widen_load(e: Expr) -> Expr:
        return transform(e, lambda n: Load(n.buffer, (*n.indices, v), n.dtype)
                         if isinstance(n, Load) and n.buffer in names else None)

    def node(n: Stmt) -> Stmt | None:
        if isinstance(n, Allocate) and n.buffer.name in names:
            return replace(n, buffer=replace(n.buffer, shape=(*n.buffer.shape, lanes)))
        if isinstance(n, Store) and n.buffer in names:
            return replace(n, indices=(*n.indices, v))
        return None

    return map_stmt(map_exprs(body, widen_load), node)


def _reduction_buffers(func: LoopFunc, loop: str) -> set[str]:
    out = set()
    for f in loops_named(func.body, loop):
        private = allocated(f.body)
        for st in stores(f.body):
            if st.buffer not in private and all(linear_coeff(i, loop) == 0 for i in st.indices):
                out.add(st.buffer)
    return out


def _rfactor(func: LoopFunc, loop: str, acc: str, lanes: int, span: Span | None) -> LoopFunc:
    """Partial results per lane in ``{acc}_v``; fold them into ``acc`` after the reduction."""
    buffers = func.buffers()
    buf = buffers[acc]
    op = _reduction_op(func, loop, acc, span)
    accv = Buffer(f"{acc}_v", buf.dtype, (lanes,), "local")
    v = Var(loop)

    def rewrite_loop(f: For) -> Stmt:
        def to_vec(e: Expr) -> Expr:
                return transform(e, lambda n: Load(accv.name, (v,), n.dtype)
                             if isinstance(n, Load) and n.buffer == acc else None)

        def node(n: Stmt) -> Stmt | None:
            if isinstance(n, Store) and n.buffer == acc:
                return replace(n, buffer=accv.name, indices=(v,))
            return None
        return replace(f, body=map_stmt(map_exprs(f.body, to_vec), node))

    lane = Var(f"{acc}_lane")
    init = For(lane, const(lanes), Store(accv.name, (lane,), reduce_identity(op, buf.dtype)), kind="vector")

    def place(s: Stmt) -> Stmt:
        """Partial sums start right before the reduction loops and fold right after them, in
        the sequence that holds the loops (inside any buffers allocated between), so that no
        statement after the loops reads the accumulator before its lanes are folded."""
        children = list(s.stmts) if isinstance(s, Seq) else [s]
        hits = [i for i, c in enumerate(children) if loops_named(c, loop)]
        if not hits or hits != list(range(hits[0], hits[-1] + 1)):
            raise TccScheduleError(f"cannot vectorize the reduction into {acc} over {loop}", span)
        only = children[hits[0]]
        if len(hits) == 1 and isinstance(only, Allocate | Let):
            children[hits[0]] = replace(only, body=place(only.body))
            return seq(*children)
        tails = [children[i] for i in hits if _dynamic_tail(func, children[i], loop)]
        bodies = [on_loops(replace(func, body=children[i]), loop, rewrite_loop).body for i in hits
                  if children[i] not in tails]
        partial: Stmt = seq(init, *bodies, *_fold(acc, accv, buf, op, lanes))
        if tails and len(bodies) == 1 and isinstance(bodies[0], For) and not isinstance(bodies[0].extent, Const):
            partial = If(Binary("ge", bodies[0].extent, const(1), dtypes.boolean), partial)
        children[hits[0]:hits[-1] + 1] = [partial, *tails]
        return seq(*children)

    def wrap(n: Stmt) -> Stmt | None:
        if not (isinstance(n, Allocate) and n.buffer.name == acc):
            return None
        return replace(n, body=Allocate(accv, place(n.body)))

    found = [n for n in walk_stmts(func.body) if isinstance(n, Allocate) and n.buffer.name == acc]
    if not found or buf.scope != "local" or buf.size != 1:
        raise TccScheduleError(f"loop {loop} accumulates into {acc}, which is not a reduction accumulator",
                               span, "vectorize a loop whose iterations write different elements")
    return replace(func, body=map_stmt(func.body, wrap))


def _dynamic_tail(func: LoopFunc, s: Stmt, loop: str) -> bool:
    """Whether ``s`` runs ``loop`` only as a remainder of a length known at the call (``C % 32``)."""
    found = loops_named(s, loop)
    return bool(found) and all(dynamic_remainder(func, f) for f in found)


def _fold(acc: str, accv: Buffer, buf: Buffer, op: str, lanes: int) -> list[Stmt]:
    """Fold the partial results into ``acc``: halving vector steps while the width is a power of
    two above ``FOLD_SERIAL`` lanes (a tree: log2 steps, not one dependent add per lane), then
    the last lanes one by one."""
    lane = Var(f"{acc}_lane")
    combine = _op_binary(op)
    steps: list[Stmt] = []
    while lanes > FOLD_SERIAL and lanes & (lanes - 1) == 0:
        lanes //= 2
        steps.append(For(lane, const(lanes), Store(accv.name, (lane,), Binary(
            combine, Load(accv.name, (lane,), buf.dtype), Load(accv.name, (iadd(lane, lanes),), buf.dtype),
            buf.dtype)), kind="vector"))
    zero = (const(0),) * len(buf.shape)
    steps.append(For(lane, const(lanes), Store(acc, zero, Binary(
        combine, Load(acc, zero, buf.dtype), Load(accv.name, (lane,), buf.dtype), buf.dtype))))
    return steps


def _op_binary(op: str) -> str:
    return {"sum": "add", "prod": "mul", "max": "max", "min": "min"}[op]


def _reduction_op(func: LoopFunc, loop: str, acc: str, span: Span | None) -> str:
    ops = set()
    for f in loops_named(func.body, loop):
        for st in stores(f.body):
            if st.buffer != acc:
                continue
            value = st.value
            ok = (isinstance(value, Binary) and value.op in _COMBINE and isinstance(value.a, Load)
                  and value.a.buffer == acc and acc not in {n.buffer for n in walk(value.b) if isinstance(n, Load)})
            if not ok:
                raise TccScheduleError(f"loop {loop} writes {acc} in a way that is not a reduction", span)
            ops.add(_COMBINE[value.op])
    if len(ops) != 1:
        raise TccScheduleError(f"loop {loop} mixes reductions into {acc}", span)
    return ops.pop()


def _own_lane(read: tuple[Expr, ...], write: tuple[Expr, ...], name: str) -> bool:
    """Whether each lane reads only elements that no other lane writes: some dim indexes both with
    one expression that moves with the lane (a recurrence's ``H[t - 1, d]`` against ``H[t, d]``)."""
    return any(r == w and linear_coeff(r, name) not in (0, None) for r, w in zip(read, write))


def _check(f: For, span: Span | None) -> None:
    name = f.var.name
    written: dict[str, set] = {}
    for n in walk_stmts(f.body):
        if isinstance(n, For) and name in free_vars(n.extent):
            raise TccScheduleError(f"loop {n.var.name} runs a number of times that depends on {name}; "
                                   f"{name} cannot be vectorised", span)
        if isinstance(n, If) and name in free_vars(n.cond):
            raise TccScheduleError(f"loop {name} branches on its own index; it cannot be vectorised", span)
        if isinstance(n, Store):
            if all(linear_coeff(i, name) == 0 for i in n.indices):
                raise TccScheduleError(f"all lanes of loop {name} would write the same element of {n.buffer}",
                                       span, "vectorize a loop whose variable indexes the result")
            written.setdefault(n.buffer, set()).add(n.indices)
    for n in walk_stmts(f.body):
        for e in stmt_exprs(n):
            for ld in walk(e):
                if isinstance(ld, Load) and ld.buffer in written and ld.indices not in written[ld.buffer] \
                        and not all(_own_lane(ld.indices, w, name) for w in written[ld.buffer]):
                    raise TccScheduleError(f"loop {name} reads {ld.buffer} at other lanes' elements while "
                                           "writing it", span)


