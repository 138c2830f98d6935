"""The row schedule: one block per output row, its threads striding over the row.

For nests whose inner loops are long next to the number of outputs (softmax, layernorm rows,
fused or not). The row's loops are strided over the block's threads; a reduction loop carries
the annotation ``allreduce=ACC:OP`` that tells codegen to combine the local accumulator ``ACC``
across the block with the binary operator ``OP``; per-row arrays that fusion made local become
each thread's registers (:mod:`.row_registers`) or, too large for those, shared memory, with a
barrier after each loop that writes them. A row whose length is a dynamic shape symbol's is
strided in steps counted at the call, the last guarded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load, walk
from tcc.ir.loopnest import stores
from tcc.ir.loops import Allocate, Barrier, Buffer, For, If, Let, Seq, Stmt, Store, map_stmt, seq, walk_stmts
from tcc.passes.autoschedule_cuda import gemm, ranges, row_registers
from tcc.passes.autoschedule_cuda.indexing import (
    I64,
    as_expr,
    block_size,
    ceil_div,
    decompose,
    grid,
    guarded,
    hint,
    invariant,
    linear,
    product,
    size_of,
)
from tcc.passes.autoschedule_cuda.nests import Names, Nest, spatial_axes, split_axes


def row_work(body: Stmt, shared_limit: int, symbols: frozenset[str]) -> int | None:
    """The longest loop a row's threads would share, or None if the body does not fit the row form.

    The row form is what ``lower`` gives for a reduction (local accumulators, an initialising
    store, the reduction loops, the final store) and, after fusion, a sequence of such pieces
    and element-wise loops over per-row arrays. A row's length may be a dynamic shape symbol's
    (its :func:`hint` counted); per-row arrays must have constant sizes (shared memory).
    """
    longest = 0
    shared: list[Buffer] = []  # the per-row arrays, which go to shared memory
    for s in row_items(body):
        if isinstance(s, Allocate):
            if s.buffer.scope != "local" or not s.buffer.static:
                return None
            if s.buffer.size > 1:
                shared.append(s.buffer)
        elif isinstance(s, For):
            nest = split_axes(s)
            if not nest.axes or (reduction_loop(s) is None
                                 and len(spatial_axes(s, symbols).axes) < len(nest.axes)):
                return None  # threads striding over it would race on what its iterations share
            if any(not invariant(f.extent, symbols) for f in nest.axes):
                return None  # a triangular loop (sum[k: j + 1]): each thread walks its own row's
            longest = max(longest, hint(product(nest.extents)))
        elif not isinstance(s, Store):
            return None
    return longest if longest and gemm.shared_footprint(shared) <= shared_limit else None


def row_items(body: Stmt) -> list[Stmt]:
    """The allocations, stores and loops at the top level of a row's body."""
    out: list[Stmt] = []
    for s in (body.stmts if isinstance(body, Seq) else (body,)):
        if isinstance(s, Allocate):
            out.append(s)
            out.extend(row_items(s.body))
        else:
            out.append(s)
    return out


class RowLimit(NamedTuple):
    """The elements of a row whose loops run over more (:func:`by_length`'s variants)."""

    length: Expr  # the row's length
    least: int  # what it is at least (the variant's range starts above it): no guard below


def row_schedule(nest: Nest, names: Names, cap: int, work: int, shapes: dict[str, tuple[int, ...]],
                 cache: row_registers.RowCache | None = None, limit: RowLimit | None = None) -> Stmt:
    """A block per row (``cache``: the thread's registers, planned here unless given; ``limit``:
    the row's length where its loops run further, for :func:`by_length`)."""
    extents = nest.extents
    total = product(extents)
    threads = block_size(work, cap)
    span = nest.axes[0].span if nest.axes else None
    grid(total, 1, span)
    bx = names.fresh("bx")
    loops = [s for s in row_items(nest.body) if isinstance(s, For)]
    cache = cache or row_registers.plan(nest.body, loops, threads, names.fresh, shapes)
    body = row_body(nest.body, threads, names, cache, limit)
    for buf in cache.inputs.values() if cache else ():
        body = Allocate(buf, body)
    return For(bx, as_expr(total), decompose(nest.axes, extents, bx, body), "block.x", span=span)


# the row lengths a dynamic row's register variants are built for, one kernel each (the threads of
# a block up to the cap, then steps of them): a call runs the shortest that holds its row
BOUNDED_ROWS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def by_length(plain: Stmt, nest: Nest, names: Names, cap: int, shapes: dict[str, tuple[int, ...]],
              shared_limit: int, symbols: frozenset[str]) -> Stmt:
    """The row kernel ``plain`` of a row whose length ``E`` is a dynamic shape symbol's, after
    variants that keep the row in registers (:mod:`.ranges`): for each ``R`` of ``BOUNDED_ROWS``
    whose arrays fit a thread's registers, the row kernel of a constant row of ``R`` elements
    (``threads * steps``) with its loops guarded by ``E``, so that its per-row arrays and the
    inputs it reads again stay in registers (:mod:`.row_registers`) and its threads and steps
    are those a constant row of about that length gets, for the calls with ``E`` in
    ``(R / 2, R]`` (a row of 1000: 4 steps of 256 threads, not 16 steps mostly idle, whose
    registers would halve the blocks a multiprocessor holds); ``plain`` for longer rows. Just
    ``plain`` where the row's loops are not all one loop over ``E``, or nothing would be kept in
    registers."""
    loops = [s for s in row_items(nest.body) if isinstance(s, For)]
    lengths = {f.extent for f in loops}
    if not loops or len(lengths) != 1 or any(isinstance(f.body, For) for f in loops):
        return plain
    length = lengths.pop()
    if isinstance(size_of(loops[0]), int) or not invariant(length, symbols):
        return plain
    variants: list[tuple[int, Stmt]] = []
    for whole in BOUNDED_ROWS:
        least = variants[-1][0] if variants else 0
        kernel = _bounded_row(nest, names, cap, shapes, shared_limit, symbols, RowLimit(length, least), whole)
        if kernel is None:
            break  # (a longer row keeps more values a thread)
        variants.append((whole, kernel))
    return ranges.by_range(length, variants, plain)


def _bounded_row(nest: Nest, names: Names, cap: int, shapes: dict[str, tuple[int, ...]], shared_limit: int,
                 symbols: frozenset[str], limit: RowLimit, whole: int) -> Stmt | None:
    """The row kernel of a row of ``whole`` elements guarded by ``limit``, its arrays in registers;
    None where they do not all fit."""
    threads = block_size(whole, cap)
    length = limit.length
    body = _bounded(nest.body, length, whole)
    planned = {n: tuple(whole if d == length else d for d in shape) for n, shape in shapes.items()}
    arrays = {s.buffer.name for s in row_items(body) if isinstance(s, Allocate) and s.buffer.size > 1}
    if row_work(body, shared_limit, symbols) is None:
        return None
    cache = row_registers.plan(body, [s for s in row_items(body) if isinstance(s, For)], threads, names.fresh,
                               planned)
    if cache is None or not arrays <= set(cache.arrays):
        return None
    return row_schedule(Nest(nest.axes, body), names, cap, whole, shapes, cache, limit)


def _bounded(body: Stmt, length: Expr, whole: int) -> Stmt:
    """``body`` with its loops over ``length`` running ``whole`` times (guarded by the caller) and
    its per-row arrays of ``length`` elements local arrays of ``whole``."""
    def stmt(s: Stmt) -> Stmt | None:  # (bottom-up: its children are done)
        if isinstance(s, For) and s.extent == length:
            return replace(s, extent=Const(whole, I64))
        if isinstance(s, Allocate) and s.buffer.shape == (length,):
            return Allocate(replace(s.buffer, shape=(whole,), scope="local"), s.body)
        return None
    return map_stmt(body, stmt)


def row_body(s: Stmt, threads: int, names: Names, cache: row_registers.RowCache | None,
             limit: RowLimit | None = None, continued: bool = False) -> Stmt:
    """Loops become block-strided (reductions combined across the block); per-row arrays go
    to registers where each thread touches only its own elements (``cache``), else to shared
    memory, with a barrier after each loop that writes one."""
    if isinstance(s, Allocate):
        if cache and s.buffer.name in cache.arrays:
            return Allocate(cache.arrays[s.buffer.name], row_body(s.body, threads, names, cache, limit))
        per_thread = s.buffer.size <= 1 and each_thread_computes(s.buffer.name, s.body)
        buf = s.buffer if per_thread else replace(s.buffer, scope="shared")
        return Allocate(buf, row_body(s.body, threads, names, cache, limit))
    if isinstance(s, Seq):
        done = [row_body(c, threads, names, cache, limit, _continued(c, s.stmts[k + 1:]))
                for k, c in enumerate(s.stmts)]
        return seq(*done)
    if isinstance(s, For):
        red = reduction_loop(s)
        combine = f"{red[0]}:{red[1]}" if red and not continued else None
        looped = block_strided(s, threads, names, combine, cache, limit)
        return looped if red else seq(looped, Barrier())
    return s


def _continued(s: Stmt, rest: tuple[Stmt, ...]) -> bool:
    """Whether the reduction loop ``s`` is followed at once by another into the same accumulator
    (a split loop's main part and its tail): its threads' partial values then go on into that
    one, and the block combines once, after the last (combined after each, the tail's
    reduction summed every thread's copy of the whole: fuzzer seed 80263 on CUDA)."""
    red = reduction_loop(s) if isinstance(s, For) else None
    return bool(red and rest and isinstance(rest[0], For) and reduction_loop(rest[0]) == red)


def each_thread_computes(name: str, body: Stmt) -> bool:
    """Whether every thread holds a one-element buffer's value itself: it is stored outside
    loops, or as the accumulator of a block-wide reduction. Stored in any other loop, one
    thread writes it for all (a row of one element: fuzzer seed 2991 on CUDA read it unset)."""
    for f in walk_stmts(body):
        if isinstance(f, For) and any(st.buffer == name for st in stores(f)):
            red = reduction_loop(f)
            if not (red and red[0] == name):
                return False
    return True


def reduction_loop(s: Stmt) -> tuple[str, str] | None:
    """(accumulator, combining operator) when ``s`` is a loop nest that only reduces into one
    accumulator ``acc[0] = op(acc[0], value)`` (``value`` may come from an inner reduction into
    an accumulator of its own, made inside the loop)."""
    nest = split_axes(s)
    inner = {t.buffer.name for t in walk_stmts(nest.body) if isinstance(t, Allocate)}
    stores = [t for t in walk_stmts(nest.body) if isinstance(t, Store) and t.buffer not in inner]
    if len(stores) != 1:
        return None
    upd = stores[0]
    value = upd.value
    if not (isinstance(value, Binary) and value.op in ("add", "mul", "max", "min")
            and isinstance(value.a, Load) and value.a.buffer == upd.buffer and value.a.indices == upd.indices
            and all(isinstance(i, Const) and i.value == 0 for i in upd.indices)):
        return None
    if any(isinstance(n, Load) and n.buffer == upd.buffer for n in walk(value.b)):
        return None
    return upd.buffer, value.op


def block_strided(loop: Stmt, threads: int, names: Names, allreduce: str | None,
                  cache: row_registers.RowCache | None = None, limit: RowLimit | None = None) -> Stmt:
    """The block's threads stride over the (flattened) loop nest; a reduction then combines.
    With a ``cache`` the step loop is unrolled: the thread's register arrays index by it.
    ``limit``: the elements that exist, where the loop runs over more (the steps past its least
    guarded)."""
    red = split_axes(loop)
    extents = red.extents
    length = product(extents)
    tx, step, rid = names.fresh("tx"), names.fresh("rstep"), names.fresh("rid")
    steps = ceil_div(length, threads)  # (a dynamic row: its steps computed at the call, the last guarded)
    inner = row_registers.rewrite(red.body, red.axes, step, cache) if cache else red.body
    inner = decompose(red.axes, extents, rid, inner)
    span = red.axes[0].span
    notes = (("allreduce", allreduce),) if allreduce else ()
    if limit is not None and steps != 1:  # a step's guard tests the thread's count of steps, not its element
        valid = names.fresh("rvalid")
        cond = Binary("lt", step, valid, dtypes.boolean)
        if (sure := limit.least // threads) > 0:  # (the unrolled steps below it: no test left)
            cond = Binary("or", Binary("lt", step, Const(sure, I64), dtypes.boolean), cond, dtypes.boolean)
        inner = Let(rid, linear(step, threads, tx), If(cond, inner))
        count = Binary("floordiv", Binary("add", Binary("sub", limit.length, tx, I64), Const(threads - 1, I64), I64),
                       Const(threads, I64), I64)
        return For(tx, Const(threads, I64), Let(valid, count, For(step, as_expr(steps), inner, "unroll", span=span)),
                   "thread.x", annotations=notes, span=span)
    inner = guarded(rid, linear(step, threads, tx), length if limit is None else limit.length,
                    product([steps, threads]), inner)
    body: Stmt = Let(step, Const(0, I64), inner) if steps == 1 else \
        For(step, as_expr(steps), inner, "unroll" if cache else "serial", span=span)
    return For(tx, Const(threads, I64), body, "thread.x", annotations=notes, span=span)
