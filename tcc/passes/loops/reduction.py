"""decompose_reduction: turn a reduction into a scalar accumulator into updates of a tensor.

Lowering gives ``for i, j: acc = init; for k: acc = acc + f; C[i, j] = g(acc)``: the k loop
cannot leave the i/j loops. This pass rewrites it as an initialisation nest, an update nest
``for i, j, k: C[i, j] = C[i, j] + f`` (a perfect nest that split/reorder/cache can tile) and,
when ``g`` is not the identity, an epilogue from an accumulator tensor ``{C}_acc``. The order of
the additions for each element is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Expr, Load, Var, const, free_vars, transform
from tcc.ir.loopnest import linear_coeff, stores, subst
from tcc.ir.loops import Allocate, Buffer, For, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts


def decompose_reduction(func: LoopFunc, tensor: str, span: Span | None = None) -> LoopFunc:
    buffers = func.buffers()
    if tensor not in buffers:
        raise TccScheduleError(f"op {func.name} has no tensor {tensor!r}", span)
    for s in walk_stmts(func.body):  # outer loops first: the whole output nest, not its inner loops
        if isinstance(s, For) and _stores_to(s, tensor):
            out = _decompose(s, buffers[tensor], span)
            if out is not None:
                return replace(func, body=map_stmt(func.body, lambda n, s=s, out=out: out if n == s else None))
    raise TccScheduleError(f"{tensor} is not computed by a single reduction", span,
                           "decompose applies to statements like C[i, j] = sum[k](...)")


def _stores_to(s: For, tensor: str) -> bool:
    return any(st.buffer == tensor for st in stores(s))


def _decompose(nest: For, out: Buffer, span: Span | None) -> Stmt | None:
    axes: list[For] = []
    s: Stmt = nest
    while isinstance(s, For):
        axes.append(s)
        s = s.body
    if not (isinstance(s, Allocate) and isinstance(s.body, Seq) and len(s.body.stmts) == 3):
        return None
    acc = s.buffer
    init, red, final = s.body.stmts
    if not (isinstance(init, Store) and isinstance(final, Store) and final.buffer == out.name):
        return None
    rloops: list[For] = []
    r: Stmt = red
    while isinstance(r, For):
        rloops.append(r)
        r = r.body
    if not (isinstance(r, Store) and r.buffer == acc.name):
        return None
    idx = final.indices
    names = {a.var.name for a in axes}
    reduced = {f.var.name for f in rloops}
    used = set().union(*(free_vars(i) for i in idx))
    if not names <= used or used & reduced \
            or not all(any(linear_coeff(i, n) not in (0, None) for i in idx) for n in names):
        return None  # the output loops (and loops around them: a group's), each output loop moving the element
    direct = final.value == Load(acc.name, (_zero(),), acc.dtype) and out.dtype == acc.dtype
    target = out if direct else Buffer(f"{out.name}_acc", acc.dtype, out.shape, "global")

    def to_target(e: Expr) -> Expr:
        return transform(e, lambda n: Load(target.name, idx, acc.dtype)
                         if isinstance(n, Load) and n.buffer == acc.name else None)

    update: Stmt = Store(target.name, idx, to_target(r.value), r.span)
    for f in reversed(rloops):
        update = replace(f, body=update)
    parts = [_nest(axes, "init", Store(target.name, idx, init.value)), _rebuild(axes, update)]
    if not direct:
        parts.append(_nest(axes, "post", Store(out.name, idx, to_target(final.value), final.span)))
        return Allocate(target, seq(*parts))
    return seq(*parts)


def _zero() -> Expr:
    return const(0)


def _rebuild(axes: list[For], body: Stmt) -> Stmt:
    for f in reversed(axes):
        body = replace(f, body=body)
    return body


def _nest(axes: list[For], suffix: str, body: Stmt) -> Stmt:
    """A copy of the output loops under new names (``i_init``), so schedules of ``i`` skip it."""
    mapping = {a.var.name: Var(f"{a.var.name}_{suffix}") for a in axes}
    body = subst(body, mapping)
    for f in reversed(axes):
        body = replace(f, var=mapping[f.var.name], body=body)
    return body
