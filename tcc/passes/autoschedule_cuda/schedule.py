"""The default GPU schedule: every statement nest of a loop function becomes one CUDA kernel.

The lowered function is ``Allocate(global temps) -> Seq(nest, nest, ...)``. Each nest is
rewritten so that its outermost loop is bound to ``block.x``; the CUDA code generator turns
every such top-level loop into one kernel, launched in order on one stream, and every global
intermediate into a device allocation that lives for the call.

Three schedules, chosen per nest:

* **gemm** (:mod:`tcc.passes.autoschedule_cuda.gemm`): contractions (matmul, batched matmul, convolution
  as an implicit GEMM) as shared-memory tiles and per-thread register tiles; a tensor-core
  kernel's 16-bit result leaves through shared memory in 16-byte stores (:mod:`.staged_stores`).
* **flat**: the nest's spatial loops are fused into one index, one thread per output
  element (``block.x`` x ``thread.x``), with a guard where the block size does not divide
  the element count. Reductions stay serial inside the thread. Where the innermost extent is
  a multiple of 4, a first kernel gives each thread 4 consecutive elements and assumes
  16-byte aligned pointers (its loads and stores become 16-byte ones); the launcher runs it
  when every pointer is aligned, else the one-element kernel after it (annotation ``aligned``).
* **row**: for nests whose inner loops are long next to the number of outputs (softmax,
  layernorm rows, fused or not), one block per output row. The row's loops are strided
  over the block's threads; a reduction loop carries the annotation ``allreduce=ACC:OP``
  that tells codegen to combine the local accumulator ``ACC`` across the block with the
  binary operator ``OP`` (warp shuffles, then shared memory); per-row arrays that fusion
  made local become each thread's registers (:mod:`.row_registers`) or, too large for those,
  shared memory, with a barrier after each loop that writes them (:mod:`.rows`).

An extent may be a dynamic shape symbol's (``tcc.compile(..., dynamic=...)``): each schedule
counts its blocks, steps and tiles at the call (:mod:`.indexing`) and guards or masks the
tails; an aligned variant may also require a condition of the symbols (``requires``: a
multiple of 4), which the launcher checks. A dynamic row's length, and a contraction's one
dynamic output size, get kernels per range of their values (:mod:`.ranges`: each range's as a
constant size there gets them, every kernel requiring its range). Split-K takes a constant
reduction; the TF32 warpgroup and implicit-convolution GEMMs and split reductions constant
shapes only.

A nest carrying attention's matrix form (two products of 16-bit operands, see
:mod:`tcc.passes.te.matrix_stream`) becomes a FlashAttention kernel on the matrix units
(:mod:`.attention`; with split keys, the nests merging the splits after it); the nests of a sweep
carrying the matrix form of attention's backward (:mod:`tcc.passes.te.matrix_sweep`) become
FlashAttention-2's backward kernels (:mod:`.attention_backward`).

Before them an element-wise nest over a reduction's result joins the reduction's final store
(:mod:`.epilogue`); a recurrence that is a prefix scan along rows gets a block per row
(:mod:`.scan`).

Last, consecutive kernels of one block each merge into one (:mod:`merge_kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.errors import TccCompileError, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, free_vars, walk
from tcc.ir.loopnest import shared_layout, stores
from tcc.ir.loops import (
    DETERMINISTIC,
    MATRIX_STREAM,
    STAGED_STORES,
    Allocate,
    Buffer,
    For,
    Let,
    LoopFunc,
    Seq,
    Stmt,
    Store,
    holds_sequential,
    seq,
    stmt_exprs,
    walk_stmts,
)
from tcc.passes.autoschedule_cuda import (
    attention,
    attention_backward,
    epilogue,
    gemm,
    hoist_rows,
    implicit_conv,
    merge_kernels,
    ranges,
    recurrence,
    rows,
    scan,
    scatter,
    split_k,
    split_reduction,
    staged_stores,
    tensorcore,
    transpose,
    unread,
    warpgroup,
)
from tcc.passes.autoschedule_cuda.indexing import (
    Size,
    as_expr,
    assumed,
    block_size,
    decompose,
    exact_div,
    grid,
    guarded,
    hint,
    linear,
    product,
)
from tcc.passes.autoschedule_cuda.nests import Names, Nest, spatial_axes
from tcc.passes.loops.bind import top_level_nests
from tcc.passes.trace import SILENT, Trace
from tcc.target import CudaTarget

I64 = dtypes.i64
FLAT_THREADS = 256
MAX_ROW_THREADS = 256
# a row loop at least this long, and long next to the output count, gets one block per row
ROW_MIN_REDUCTION = 64
ROW_RATIO = 16


@dataclass(frozen=True)
class CudaTuning:
    """The knobs of this auto-scheduler that the tuner (tcc.tune) searches: the FMA GEMM's tile
    ``(BM, BN, BK)`` (None: :func:`gemm.choose_tile`'s pick for the grid), its pipeline depth
    (``stages``: 2 overlaps the next k-step's loads with this one's products, 1 does not), and
    the warps of a block in the flat and row kernels."""

    tile: tuple[int, int, int] | None = None
    stages: int = 2
    warps: int = FLAT_THREADS // 32
    stores: str = "auto"  # which tensor-core GEMM results leave through shared memory (loops.STORE_MODES)

    def __str__(self) -> str:
        tile = "auto" if self.tile is None else "x".join(map(str, self.tile))
        stores = "" if self.stores == "auto" else f" stores={self.stores}"
        return f"tile={tile} stages={self.stages} warps={self.warps}{stores}"


KERNEL_KINDS = "kernel kinds"  # the scheduled function's attribute: which schedule made each nest's kernels


def schedule_cuda(func: LoopFunc, target: CudaTarget, tuning: CudaTuning = CudaTuning(),
                  trace: Trace = SILENT, tf32: bool = False) -> LoopFunc:
    """Bind every statement nest of ``func`` to a grid of blocks and threads, sized for ``target``
    (``tf32``: f32 contractions may run on tensor cores, rounding their operands to TF32); the
    trace shows the function after each nest becomes its kernels, and its attribute
    ``KERNEL_KINDS`` says which schedule made them (``gemm``, ``flat``, ``row``, ...: what the
    tuner may vary)."""
    if STAGED_STORES in func.attrs:  # tcc.compile(..., staged_stores=...)
        tuning = replace(tuning, stores=str(func.attrs[STAGED_STORES]))
    temps, private, body = _peel_allocates(func.body)
    body = _sink_private(body, private)
    names = Names(func)
    shapes = {name: buf.shape for name, buf in func.buffers().items()}
    nests = epilogue.fuse(top_level_nests(body), temps)  # element-wise consumers of a reduction join its final store
    kernels: list[Stmt] = []
    kinds: list[str] = []
    buffers = func.buffers()
    for i, nest in enumerate(nests):
        if scatter.accumulates(nest):
            kernel, how = _scatter_nest(nest, names, buffers, _threads(tuning, target),
                                        bool(func.attrs.get(DETERMINISTIC)))
        else:
            kernel, how = _schedule_nest(nest, names, shapes, temps, target, tuning, tf32)
        if kernel is not None:
            kernels.append(kernel)
            kinds.append(how)
        written = sorted({s.buffer for s in stores(nest)} & ({p.name for p in func.params} | {b.name for b in temps}))
        trace(f"{how}: {', '.join(written)}", _function(func, temps, [*kernels, *nests[i + 1:]]))
    kernels, temps = unread.drop_unread(kernels, temps)  # (what a kernel in the place of several nests left unread)
    scheduled = _function(func, temps, merge_kernels.merge_one_block_kernels(kernels))
    scheduled.attrs[KERNEL_KINDS] = tuple(kinds)
    return trace(merge_kernels.PASS, scheduled)


def _function(func: LoopFunc, temps: list[Buffer], stmts: list[Stmt]) -> LoopFunc:
    """``func`` with ``stmts`` as its body, inside the allocations of the global ``temps``."""
    body: Stmt = seq(*stmts) if stmts else Seq(())
    for buf in reversed(temps):
        body = Allocate(buf, body)
    return LoopFunc(func.name, list(func.params), body, dict(func.attrs))


def _peel_allocates(s: Stmt) -> tuple[list[Buffer], list[Buffer], Stmt]:
    """(global buffers, thread-private buffers, the rest) of a function body's allocations."""
    temps, private = [], []
    while isinstance(s, Allocate):
        (temps if s.buffer.scope == "global" else private).append(s.buffer)
        s = s.body
    return temps, private, s


def _sink_private(body: Stmt, private: list[Buffer]) -> Stmt:
    """A function-level local buffer (a user's ``cache`` with no parallel loop to stop at) moves
    into the one nest that uses it, around the smallest statement holding every use: on the GPU
    each thread of a kernel has its own, so it cannot outlive a kernel."""
    nests = top_level_nests(body)
    for buf in private:
        users = [i for i, n in enumerate(nests) if _uses(n, buf.name)]
        if len(users) > 1:
            raise TccScheduleError(f"{buf.name} is used by {len(users)} statement nests; on cuda a local buffer "
                                   "belongs to the threads of one kernel", hint="cache at a loop inside one nest")
        if users:
            nests[users[0]] = _sink(nests[users[0]], buf)
    return seq(*nests) if nests else body


def _uses(s: Stmt, name: str) -> bool:
    for t in walk_stmts(s):
        if isinstance(t, Store) and t.buffer == name:
            return True
        if any(isinstance(n, Load) and n.buffer == name for e in stmt_exprs(t) for n in walk(e)):
            return True
    return False


def _sink(s: Stmt, buf: Buffer) -> Stmt:
    """``Allocate(buf)`` around the smallest part of ``s`` that holds every use of ``buf``."""
    if isinstance(s, Seq):
        users = [i for i, c in enumerate(s.stmts) if _uses(c, buf.name)]
        if len(users) == 1:
            parts = list(s.stmts)
            parts[users[0]] = _sink(parts[users[0]], buf)
            return Seq(tuple(parts))
    elif isinstance(s, (For, Let, Allocate)) and not _uses_directly(s, buf.name):
        return replace(s, body=_sink(s.body, buf))
    return Allocate(buf, s)


def _uses_directly(s: Stmt, name: str) -> bool:
    return any(isinstance(n, Load) and n.buffer == name for e in stmt_exprs(s) for n in walk(e))


def _schedule_nest(stmt: Stmt, names: Names, shapes: dict[str, tuple[int, ...]], temps: list,
                   target: CudaTarget, tuning: CudaTuning, tf32: bool) -> tuple[Stmt | None, str]:
    """The kernels of one nest and which schedule made them; global intermediates they need are
    appended to ``temps``."""
    if not assumed() and (symbol := _ranged_size(stmt, names, tf32)) is not None:  # kernels per range of its size
        return ranges.by_samples(symbol, lambda: _schedule_nest(stmt, names, shapes, temps, target, tuning, tf32),
                                 temps)
    unhoisted = stmt  # (a dynamic row's registers variants keep its per-row arrays: rows.by_length)
    inner = next((s for s in walk_stmts(stmt) if isinstance(s, Allocate) and s.buffer.scope == "global"), None)
    if inner is not None:  # a per-row intermediate too large for the stack: a global row per iteration
        hoisted = hoist_rows.hoist(stmt, temps)
        if hoisted is None:
            raise TccCompileError(f"the CUDA backend cannot schedule {inner.buffer.name}, a global buffer made "
                                  "inside a loop nest (from the im2col lowering)",
                                  hint="use conv='direct' on target='cuda'")
        shapes.update({b.name: b.shape for b in temps})
        stmt = hoisted
    if isinstance(stmt, For) and stmt.kind == "block.x":
        return stmt, "bound by the user"  # (checked by tcc.passes.loops.bind.check_kernels)
    if (swept := attention_backward.form(stmt, target)) is not None:  # attention's backward on the matrix units
        if not swept[1]:
            return None, "matrix sweep: computed with its first nest"
        found = attention_backward.kernels(swept[0], names.fresh, temps)
        shapes.update({b.name: b.shape for b in temps})
        plain = [n if isinstance(n, For) and n.kind == "block.x" else  # (the plain nests: scheduled as any)
                 _schedule_nest(n, names, shapes, temps, target, tuning, tf32)[0] for n in found]
        return seq(*(k for k in plain if k is not None)), "matrix sweep"
    stmt = attention_backward.without_form(stmt)
    if (matrix := attention.form(stmt, target)) is not None:  # attention's products on the matrix units
        found = attention.kernels(stmt, matrix, target, names.fresh, temps)
        if found is not None:
            shapes.update({b.name: b.shape for b in temps})
            merges = [_schedule_nest(n, names, shapes, temps, target, tuning, tf32)[0] for n in found[2:]]
            return seq(*found[:2], *(m for m in merges if m is not None)), "matrix stream"
        stmt = replace(stmt, annotations=tuple(a for a in stmt.annotations if a[0] != MATRIX_STREAM))
    threads = _threads(tuning, target)
    if holds_sequential(stmt):  # a recurrence: threads over its independent axes, each walking the other
        nest = spatial_axes(recurrence.sink_sequential(stmt), names.symbols)
        if (prefix := scan.match(nest.body)) is not None:  # an associative one along rows: a block scans each
            return scan.kernel(prefix, nest.axes, nest.extents, names.fresh, decompose), "block scan"
        return _flat_kernel(nest, names, threads), "recurrence"
    nest = spatial_axes(stmt, names.symbols)
    total = product(nest.extents)
    if total == 0:
        return None, "empty: no launch"
    contraction = gemm.match(nest.axes, nest.body)
    if contraction is not None and (tiled := _contraction(contraction, nest, names, shapes, temps, target, tuning,
                                                          tf32)) is not None:
        return tiled
    reduction = split_reduction.match(nest.body) if nest.static() else None  # (a dynamic row: the row kernel)
    if reduction is not None:
        split = split_reduction.schedule(nest.axes, nest.extents, reduction, target, names.fresh, decompose)
        if split is not None:
            temps.append(split[0])
            return split[1], "split reduction"
    work = rows.row_work(nest.body, target.shared_memory_per_block, names.symbols)
    if work is not None and work >= ROW_MIN_REDUCTION and work * ROW_RATIO >= hint(total):
        cap = min(threads, MAX_ROW_THREADS)
        kernel = rows.row_schedule(nest, names, cap, work, shapes)
        return rows.by_length(kernel, spatial_axes(unhoisted, names.symbols), names, cap, shapes,
                              target.shared_memory_per_block, names.symbols), "row"
    return _flat_schedule(nest, names, threads), "flat"


def _ranged_size(stmt: Stmt, names: Names, tf32: bool) -> Var | None:
    """The shape symbol ``S`` whose ranges get kernels of their own (:mod:`.ranges`), where ``stmt``
    is a contraction (not on TF32, whose kernels want constant shapes) with a constant reduction
    whose output sizes read one dynamic symbol, ``S`` (a matmul's M, a convolution's batch): a
    GEMM of few rows splits its reduction across blocks or takes mma.sync tiles, one of many
    takes large tiles, and a matrix-vector product is a row kernel, as at constant sizes."""
    if holds_sequential(stmt):
        return None
    nest = spatial_axes(stmt, names.symbols)
    c = gemm.match(nest.axes, nest.body)
    if c is None or tf32 or not isinstance(c.size(c.k_axes), int):
        return None
    sizes = [c.size(axes) for axes in (c.m_axes, c.n_axes, c.batch_axes)]
    symbols = set().union(*(free_vars(s) for s in sizes if not isinstance(s, int)))
    return Var(symbols.pop(), I64) if len(symbols) == 1 else None


def _threads(tuning: CudaTuning, target: CudaTarget) -> int:
    """The threads of a flat or row kernel's block: the tuner's warps, as many as the target allows."""
    return min(32 * tuning.warps, target.max_threads_per_block)


def _scatter_nest(stmt: Stmt, names: Names, buffers: dict[str, Buffer], threads: int,
                  deterministic: bool) -> tuple[Stmt | None, str]:
    """A ``+=`` nest: its iterations over threads, adding atomically, or one thread in a fixed
    order (see :mod:`.scatter`)."""
    nest = spatial_axes(stmt, names.symbols)
    if product(nest.extents) == 0:
        return None, "empty: no launch"
    if scatter.needs_serial(stmt, buffers, deterministic):
        return scatter.serial_kernel(stmt, names.fresh), "scatter in order"
    return _flat_kernel(nest, names, threads), "scatter atomic"


def _contraction(c: gemm.Contraction, nest: Nest, names: Names, shapes: dict[str, tuple[int, ...]], temps: list,
                 target: CudaTarget, tuning: CudaTuning, tf32: bool) -> tuple[Stmt, str] | None:
    """A contraction's tiled kernels within the target's budgets: the fastest kind that fits
    (:func:`_contraction_kernels`), else the FMA GEMM in the largest tile that fits, else None
    (the flat schedule then gives each thread an output: no shared memory)."""
    made = len(temps)
    try:
        kernels, how = _contraction_kernels(c, nest, names, shapes, temps, target, tuning, tf32)
        if shared_bytes(kernels) <= target.shared_memory_per_block:
            return kernels, how
    except gemm.OverBudget:
        pass
    del temps[made:]  # the intermediates of kernels not used
    fma = gemm.fitting(gemm.Builder, c, names.fresh, decompose, target, None, tuning.stages)
    return None if fma is None else (fma.kernel(), "gemm")


def _contraction_kernels(c: gemm.Contraction, nest: Nest, names: Names, shapes: dict[str, tuple[int, ...]],
                         temps: list, target: CudaTarget, tuning: CudaTuning, tf32: bool) -> tuple[Stmt, str]:
    """A contraction's tiled kernel: on tensor cores where its operands are 16- or 8-bit floats
    widened to f32, or f32 with ``tf32`` (two kernels where an aligned copy-engine variant exists: it comes
    first, on warpgroup MMA where the architecture has it), else on FMA with the tuner's tile and
    pipeline depth, split-K where its tiles are too few for the chip (:mod:`.split_k`). Each
    kind sizes its tiles by the target's budgets; a warpgroup kernel none of whose tiles fits
    gives way to ``mma.sync`` ones, and :class:`gemm.OverBudget` from a kind that must fit
    reaches :func:`_contraction`."""
    stores = staged_stores.plan(c, shapes, tuning.stores)  # (for the copy-engine kernels)
    if tf32 and (f32 := tensorcore.tf32_operands(c)) is not None:
        wide = gemm.fitting(warpgroup.StagedBuilder, c, names.fresh, decompose, f32, target) \
            if c.static and warpgroup.fits(c, target) else None  # (TF32 transposes: constant shapes)
        if wide is not None:
            staged = wide.kernel()
            fast = _k_major_copy_engine(c, f32, warpgroup.Tf32Builder, names, shapes, temps, target, stores)
            return seq(*fast, staged) if fast else staged, "tf32 warpgroup gemm"
        return tensorcore.Builder(c, names.fresh, decompose, f32, None, target).kernel(), "tf32 tensor-core gemm"
    values = tensorcore.operands(c)
    if values is None:
        if (split := split_k.plan(c, target, tuning.tile)) is not None:
            return _split_k_kernels(c, nest, split, names, temps, target, tuning), "split-K gemm"
        return gemm.Builder(c, names.fresh, decompose, target, tuning.tile, tuning.stages).kernel(), "gemm"
    fast = tensorcore.fast_layout(c, values, shapes)
    eight = values[0].dtype.is_fp8
    if fast is None and not eight and (conv := implicit_conv.plan(c, values, names.fresh)) is not None:
        return implicit_conv.kernels(c, values, conv, names.fresh, decompose, temps, target), "implicit-gemm conv"
    staged = tensorcore.Builder(c, names.fresh, decompose, values, None, target).kernel()
    if fast is None and eight:  # 8-bit operands are read K-major only: a B[k, n] is transposed first
        wide_kind = warpgroup.Builder if warpgroup.fits(c, target) else tensorcore.Builder
        made = _k_major_copy_engine(c, values, wide_kind, names, shapes, temps, target, stores)
        if made:
            return seq(*made, staged), "fp8 gemm on a transposed operand"
    if fast is None:
        return staged, "tensor-core gemm"
    wide = gemm.fitting(warpgroup.Builder, c, names.fresh, decompose, values, fast, target, stores) \
        if warpgroup.fits(c, target) else None
    if wide is not None:
        return seq(wide.kernel(), staged), "warpgroup gemm"
    fast_kernel = tensorcore.Builder(c, names.fresh, decompose, values, fast, target, stores).kernel()
    return seq(fast_kernel, staged), "tensor-core gemm"


def _split_k_kernels(c: gemm.Contraction, nest: Nest, split: split_k.Plan, names: Names, temps: list,
                     target: CudaTarget, tuning: CudaTuning) -> Stmt:
    """The tiled GEMM over chunks of the reduction into a partials intermediate, then the flat
    schedule's kernel that adds them up and runs the epilogue."""
    partial = split_k.partials(c, nest.axes, split, names.fresh)
    temps.append(partial)
    tiles = split_k.Builder(c, names.fresh, decompose, split, nest.axes, partial, target, tuning.stages).kernel()
    combine = split_k.combine(c, nest.axes, split, partial, names.fresh)
    return seq(tiles, _flat_schedule(Nest(nest.axes, combine), names, _threads(tuning, target)))


def _k_major_copy_engine(c: gemm.Contraction, values: tuple[Expr, Expr], builder: type[tensorcore.Builder],
                         names: Names, shapes: dict[str, tuple[int, ...]], temps: list,
                         target: CudaTarget, stores: staged_stores.Plan | None = None) -> list[Stmt]:
    """A GEMM whose matrix units read both operands K-major (TF32 and 8-bit floats) on ``cp.async``
    copies (an aligned variant) by ``builder``, preceded by the transpose of a ``B[k, n]`` operand
    into a K-major intermediate (:mod:`.transpose`); nothing when the operands do not fit the copy
    engine's layout."""
    x, y = values
    before: list[Stmt] = []
    batch = {f.var.name for f in c.batch_axes}
    if (len(c.n_axes) == 1 and len(c.k_axes) == 1 and isinstance(y, Load)
            and transpose.k_rows(y, c.k_axes[0].var, c.n_axes[0].var, batch, shapes)):
        buf, y = transpose.transposed(y, names.fresh, shapes)
        shapes = {**shapes, buf.name: buf.shape}
        before = [transpose.kernel(values[1], buf, shapes, names.fresh, c.final.span)]
    fast = tensorcore.fast_layout(c, (x, y), shapes)
    wide = gemm.fitting(builder, c, names.fresh, decompose, (x, y), fast, target, stores) \
        if fast is not None and fast.k_fast else None
    if wide is None:
        return []
    if before:
        temps.append(buf)
    return [*before, wide.kernel()]


# ---------------------------------------------------------------- flat: one thread per output element

VECTOR = 4  # elements per thread in the aligned flat kernel
VECTOR_MIN = 1024  # fewer elements: the one-element kernel alone
# an aligned variant's annotation: a condition of the dynamic shape symbols that must hold for it to
# run (else its fallback runs; codegen also lets the compiler assume it)
REQUIRES = "requires"


def _flat_schedule(nest: Nest, names: Names, cap: int) -> Stmt:
    """One thread per element; first, where the innermost extent is a multiple of ``VECTOR``, the
    aligned variant with ``VECTOR`` elements a thread. A dynamic innermost extent not declared a
    multiple gets it too, run only for calls where it is one (annotation ``requires``)."""
    plain = _flat_kernel(nest, names, cap)
    extents = nest.extents
    if not extents or hint(product(extents)) < VECTOR_MIN:
        return plain
    whole, requires = exact_div(extents[-1], VECTOR), None
    if whole is None and not isinstance(extents[-1], int):
        last = extents[-1]
        whole = Binary("floordiv", last, Const(VECTOR, I64), I64)
        requires = Binary("eq", Binary("mod", last, Const(VECTOR, I64), I64), Const(0, I64), dtypes.boolean)
    if whole is None:
        return plain
    return seq(_flat_vector_kernel(nest, names, cap, whole, requires), plain)


def _flat_vector_kernel(nest: Nest, names: Names, cap: int, whole: Size, requires: Expr | None) -> Stmt:
    """``VECTOR`` consecutive elements of the innermost axis per thread (``whole``: its extent over
    ``VECTOR``), pointers assumed aligned, the shape symbols' ``requires`` too."""
    extents = [*nest.extents[:-1], whole]
    total = product(extents)
    threads = block_size(total, cap)
    span = nest.axes[0].span
    blocks = grid(total, threads, span)
    bx, tx, gid, quad, lane = (names.fresh(s) for s in ("bx", "tx", "gid", "quad", "vl"))
    last = nest.axes[-1]
    inner = Let(last.var, linear(quad, VECTOR, lane), nest.body)
    body: Stmt = For(lane, Const(VECTOR, I64), inner, "unroll", span=span)
    body = decompose([*nest.axes[:-1], replace(last, var=quad)], extents, gid, body)
    body = guarded(gid, linear(bx, threads, tx), total, product([blocks, threads]), body)
    notes = (("aligned", True),) + (((REQUIRES, requires),) if requires is not None else ())
    return For(bx, as_expr(blocks), For(tx, Const(threads, I64), body, "thread.x", span=span),
               "block.x", annotations=notes, span=span)


def _flat_kernel(nest: Nest, names: Names, cap: int) -> Stmt:
    extents = nest.extents
    total = product(extents)
    threads = block_size(total, cap)
    blocks = grid(total, threads, nest.axes[0].span if nest.axes else None)
    bx, tx, gid = names.fresh("bx"), names.fresh("tx"), names.fresh("gid")
    body = decompose(nest.axes, extents, gid, nest.body)
    body = guarded(gid, linear(bx, threads, tx), total, product([blocks, threads]), body)
    span = nest.axes[0].span if nest.axes else None
    return For(bx, as_expr(blocks), For(tx, Const(threads, I64), body, "thread.x", span=span),
               "block.x", span=span)


# ---------------------------------------------------------------- shared memory

def shared_bytes(kernels: Stmt) -> int:
    """The most shared memory one of ``kernels`` takes, counted as codegen places it when dynamic
    (a buffer over others that it reuses counts once: ``shared_layout``)."""
    return max((_kernel_shared(kernel) for kernel in (kernels.stmts if isinstance(kernels, Seq) else [kernels])),
               default=0)


def _kernel_shared(kernel: Stmt) -> int:
    total = shared_layout(kernel, gemm.DYNAMIC_ALIGN)[1]
    return total + gemm.DYNAMIC_ALIGN if total else 0
