"""pack_gather: gather an intermediate straight into the packed panels that read it.

im2col writes a patch tensor (one image: ``C*R*S x OY*OX`` floats, 7 MiB for a 3x3 64-channel
layer at 56x56), then the GEMM's packing copies it, block by block, into ``[jr, kk, jj]``
panels: the patches go out to L3 and come back. When an intermediate is read only by such
copies and is cheap to compute (loads, selects and arithmetic: no math calls), its expression is
inlined into the copies, which then gather from the input (an image: 0.8 MiB, resident in L2)
into the panel directly; the intermediate's loop nest and buffer disappear.

The copy's loops are then ordered to walk the new source front to back (see
:func:`tcc.passes.loops.cache.source_order`): for a patch panel that puts the pixel blocks ``jr``
outside the rows ``kk``, so the per-lane row and column of each pixel (``j // W``, ``j % W``)
are computed once per block, and each ``kk`` row is one masked contiguous load (the lanes'
flat offsets are consecutive: see :func:`tcc.ir.loopnest.flat_coeff`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from tcc import dtypes
from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Call, Const, Expr, Load, Select, Var, free_vars, transform, walk
from tcc.ir.loopnest import (
    add_index,
    div_index,
    flat_coeff,
    flat_terms,
    fresh,
    loads,
    map_exprs,
    mod_index,
    mul_index,
    nest_loops,
    outermost_nests,
    subst,
)
from tcc.ir.loops import Allocate, For, Let, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts
from tcc.passes.autoschedule_cpu.unflatten import divmod_width, split_flat
from tcc.passes.loops.cache import source_order
from tcc.passes.loops.inline import inline
from tcc.passes.simplify import simplify


def gather_into_packs(func: LoopFunc) -> LoopFunc:
    """Inline every cheap intermediate that only packing copies read into those copies."""
    params = {p.name for p in func.params}
    for buf in list(func.buffers().values()):
        if buf.name in params:
            continue
        copies = _copy_nests(func.body, buf.name)
        targets = {_innermost(c).buffer for c in copies}
        if not copies or targets & params or len(copies) != sum(1 for ld in loads(func.body) if ld.buffer == buf.name):
            continue
        producer = _producer_value(func.body, buf.name)
        if producer is None or any(isinstance(n, Call) for n in walk(producer)):
            continue
        try:
            gathered = inline(func, buf.name)
        except TccScheduleError:
            continue  # not one plain elementwise nest (a GEMM's result, copied out of registers)
        if _contiguous_lanes(gathered, targets):
            func = _reorder_copies(_unflatten_rows(gathered, targets), targets)
    return func


def _copy_nests(body: Stmt, name: str) -> list[Stmt]:
    """Outermost loop nests whose only statement is ``dst[...] = name[...]``."""
    return outermost_nests(body, lambda s: isinstance(s, Store) and isinstance(s.value, Load)
                           and s.value.buffer == name)


def _producer_value(body: Stmt, name: str):
    stores = [s for s in walk_stmts(body) if isinstance(s, Store) and s.buffer == name]
    return stores[0].value if len(stores) == 1 else None


def _innermost(s: Stmt) -> Stmt:
    return nest_loops(s)[1]


def _contiguous_lanes(func: LoopFunc, targets: set[str]) -> bool:
    """Whether each copy's source read walks memory with a constant stride along its innermost
    loop. A strided conv's pixels jump rows at each row's end (``(j // OW) * S * W``), so a block
    of them is a per-lane gather: its patches are better gathered row by row as before. A weight
    gradient's patch columns are ``(r, s, c)`` with ``c`` fastest: a block of lanes stays within
    one ``(r, s)`` (``_lanes_within``), and walks the channels at a constant stride."""
    buffers = func.buffers()
    for s in walk_stmts(func.body):
        if not isinstance(s, For) or not isinstance(s.body, Store) or s.body.buffer not in targets:
            continue
        extent = getattr(s.extent, "value", None)
        for ld in (x for x in walk(s.body.value) if isinstance(x, Load)):
            indices = tuple(transform(i, _unclamp) for i in ld.indices)
            if extent is not None:
                indices = _lanes_apart(indices, s.var.name, int(extent))
            if flat_coeff(indices, buffers[ld.buffer].shape, s.var.name) is None:
                return False
    return True


def _lanes_apart(indices: tuple[Expr, ...], var: str, extent: int) -> tuple[Expr, ...]:
    return tuple(transform(i, lambda e: _lanes_within(e, var, extent)) for i in indices)


def _lanes_within(e: Expr, var: str, extent: int) -> Expr | None:
    """``(R + c*v) % M`` as ``R % M + c*v`` and ``(R + c*v) // M`` as ``R // M`` when the lanes
    ``v < extent`` cannot cross a multiple of ``M``: every term of ``R`` is a multiple of some
    ``g`` dividing ``M``, and ``0 <= c*(extent - 1) < g`` (the channel ``(128*jo + 16*jr + jj) % 64``
    of 16 lanes ``jj``: ``g = 16``). None where that does not hold (the node is kept)."""
    if not (isinstance(e, Binary) and e.op in ("mod", "floordiv") and isinstance(e.b, Const)
            and e.b.dtype.is_int and int(e.b.value) > 0):
        return None
    divisor = int(e.b.value)
    terms = flat_terms((e.a,), (1,))
    lane = next((x for x in walk(e.a) if isinstance(x, Var) and x.name == var), None)
    if terms is None or lane is None:
        return None
    coef, g = 0, math.gcd(terms.constant, divisor)
    for atom, k in terms.atoms.items():
        if isinstance(atom, Var) and atom.name == var:
            coef = k
        elif var in free_vars(atom):
            return None
        else:
            g = math.gcd(g, k)
    if not 0 <= coef * (extent - 1) < g:
        return None
    rest = transform(e.a, lambda x: Const(0, x.dtype) if isinstance(x, Var) and x.name == var else None)
    if e.op == "floordiv":
        return div_index(rest, divisor)
    return add_index(mod_index(rest, divisor), mul_index(lane, coef))


def _unflatten_rows(func: LoopFunc, targets: set[str]) -> LoopFunc:
    """In each copy into ``targets``: loops of one iteration around it become 0, and a row loop
    that covers the whole reduction (one k block) and is read through ``k // W`` and ``k % W``
    (im2col's ``c, r, s``) splits into one loop per index, so no division is left per row and
    the padding masks, which depend on ``r, s`` only, are computed outside the ``c`` loop."""
    def visit(s: Stmt, units: dict[str, Expr]) -> Stmt:
        inner = _innermost(s)
        if isinstance(s, For) and isinstance(inner, Store) and inner.buffer in targets:
            nest = map_exprs(subst(s, units), simplify)
            return _split_divmods(nest, func)
        if isinstance(s, For):
            inner = {**units, s.var.name: Const(0, dtypes.i64)} if getattr(s.extent, "value", None) == 1 else units
            return replace(s, body=visit(s.body, inner))
        if isinstance(s, Seq):
            return seq(*(visit(c, units) for c in s.stmts))
        if isinstance(s, (Allocate, Let)):
            return replace(s, body=visit(s.body, units))
        return s

    return replace(func, body=visit(func.body, {}))


def _split_divmods(nest: For, func: LoopFunc) -> For:
    """Split each loop of ``nest`` read through ``v // W`` and ``v % W`` into ``v_row x v_col``."""
    def node(s: Stmt) -> Stmt | None:
        if not isinstance(s, For) or s.kind != "serial":
            return None
        width = divmod_width(s)
        if width is None or not 1 < width < int(s.extent.value) or int(s.extent.value) % width:  # type: ignore[attr-defined]
            return None
        row, col = fresh(func, f"{s.var.name}_row"), fresh(func, f"{s.var.name}_col")
        split = split_flat(s, width, row, col)
        return replace(split, body=map_exprs(split.body, simplify))

    for _ in range(4):  # c, r, s of a 3-D window: at most a few levels
        nest = map_stmt(nest, node)  # type: ignore[assignment]
    return nest


def _unclamp(e: Expr) -> Expr | None:
    """``min(max(i, 0), n)`` (a read through a pad) as ``i``: strides are those of the interior."""
    if isinstance(e, Binary) and e.op == "min" and isinstance(e.a, Binary) and e.a.op == "max":
        return transform(e.a.a, _unclamp)
    return None


def _reorder_copies(func: LoopFunc, targets: set[str]) -> LoopFunc:
    """Each copy nest into ``targets`` with its loops in the order that reads its source in order."""
    buffers = func.buffers()

    def node(s: Stmt) -> Stmt | None:
        if not isinstance(s, For):
            return None
        loops, store = nest_loops(s)
        if not (isinstance(store, Store) and store.buffer in targets):
            return None
        source = next((x for x in walk(store.value) if isinstance(x, Load)), None)
        if source is None:
            return s
        indices = tuple(transform(i, _unclamp) for i in source.indices)
        order = source_order(loops, indices, buffers[source.buffer].shape)
        masked = set().union(*(free_vars(x.cond) for x in walk(store.value) if isinstance(x, Select)))
        order = sorted(order[:-1], key=lambda f: f.var.name not in masked) + order[-1:]  # stable
        nest: Stmt = store
        for f in reversed(order):
            nest = replace(f, body=nest)
        return nest

    return replace(func, body=map_stmt(func.body, node))
