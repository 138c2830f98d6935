"""The CPU auto-scheduler: the schedule every op gets unless its user wrote one.

* Contractions (a sum of products of two tensors: matmul, batched matmul, convolutions) get the
  BLIS structure (:mod:`tcc.passes.autoschedule_cpu.gemm`), tiled for the target's caches and
  split over its cores.
* Row-wise chains (softmax, layernorm) are fused into one loop per row (compute_at), so the
  intermediates fold into per-thread rows; the rows run in parallel.
* Window reductions over a padded tensor (pooling) run their interior without bound checks;
  only the border rows and columns keep them (:mod:`.borders`).
* Every other loop nest gets its unit-stride innermost loop vectorised (reductions with vector
  partial sums) and its outermost loop parallelised when there is enough work.
* Streaming nests (attention) get each row's loops over keys and columns vectorised (:mod:`.stream`).
* Large results the kernel only writes are marked for non-temporal stores (:mod:`.streaming`).

Every step is a loop primitive or one of this folder's rewrites, reported through the trace.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Const, Load, Select, free_vars, walk
from tcc.ir.loopnest import fresh, linear_coeff, loads, loop_names, on_loops, stores
from tcc.ir.loops import (
    Allocate,
    Buffer,
    For,
    LoopFunc,
    Stmt,
    Store,
    holds_sequential,
    is_sequential,
    map_stmt,
    stmt_exprs,
    walk_stmts,
)
from tcc.passes.autoschedule_cpu.borders import peel_borders
from tcc.passes.autoschedule_cpu.gemm import (
    PARALLEL_MIN_WORK,
    contractions,
    find_loop,
    gemm_params,
    is_group,
    items,
    merge_contraction_pixels,
    schedule_gemm,
)
from tcc.passes.autoschedule_cpu.pack_gather import gather_into_packs
from tcc.passes.autoschedule_cpu.remainders import pad_gathers
from tcc.passes.autoschedule_cpu.small_serial import serial_when_small
from tcc.passes.autoschedule_cpu.stream import parallel_streams, vectorize_streams
from tcc.passes.autoschedule_cpu.streaming import stream_results
from tcc.passes.autoschedule_cpu.unflatten import divmod_width, rows_of, unflatten
from tcc.passes.loops.compute_at import compute_at
from tcc.passes.loops.fuse import fuse
from tcc.passes.loops.parallel import parallel
from tcc.passes.loops.vectorize import vectorize
from tcc.passes.te.fusion import GEMM_MIN_FLOPS
from tcc.passes.trace import SILENT, Trace
from tcc.target import CpuTarget


def autoschedule(func: LoopFunc, target: CpuTarget, params: dict[str, dict[str, int]] | None = None,
                 trace: Trace = SILENT) -> LoopFunc:
    """The default CPU schedule; ``params`` (by result tensor) override the contraction tiles."""
    func = trace("merge contraction pixels", merge_contraction_pixels(func))
    for tensor, info in contractions(func).items():
        if info.flops >= GEMM_MIN_FLOPS:
            chosen = (params or {}).get(tensor) or gemm_params(info.m, info.n, info.k, info.itemsize,
                                                              target)
            func = schedule_gemm(func, tensor, info, chosen, target, trace)
    func = trace("gather into packs", gather_into_packs(func))
    func = trace("pad gathers", pad_gathers(func))
    func = fuse_rows(func, trace)
    func = trace("unflatten gathers", unflatten_gathers(func))
    func = trace("peel borders", peel_borders(func))
    func = vectorize_streams(func, trace)
    if target.cores > 1:
        func = parallel_streams(func, trace)
    func = vectorize_and_parallelize(func, target, trace)
    func = trace("serial when small", serial_when_small(func))  # (dynamic kernels' parallel loops)
    return trace("streaming stores", stream_results(func, target))


# ---------------------------------------------------------------- rows and elementwise

def fuse_rows(func: LoopFunc, trace: Trace = SILENT) -> LoopFunc:
    """compute_at each intermediate into the outer loop of its first consumer, where legal."""
    temps = [b.name for b in func.buffers().values() if b.scope == "global"
             and b.name not in {p.name for p in func.params}]
    for t in temps:
        body = items(func.body)
        producer = next((s for s in body if isinstance(s, For) and any(st.buffer == t for st in stores(s))), None)
        if producer is None or producer.kind != "serial" or holds_sequential(producer):
            continue
        consumer = next((s for s in body[body.index(producer) + 1:] if t in {ld.buffer for ld in loads(s)}), None)
        if not (isinstance(consumer, For) and consumer.var.name == producer.var.name):
            continue  # only into the consumer's outer loop: deeper, it would be recomputed per outer iteration
        if any(st.accumulate for st in stores(consumer)):
            continue  # a += nest (of t itself, or of another tensor) keeps its own order
        try:
            func = trace(f"compute_at {t} at {producer.var.name}", compute_at(func, t, producer.var.name))
        except TccScheduleError:
            continue
    return func


def unflatten_gathers(func: LoopFunc) -> LoopFunc:
    """Innermost loops over a flattened index (im2col's patch gather) become row x column loops,
    so that the column loop vectorises with unit-stride (masked) loads."""
    for f in list(walk_stmts(func.body)):
        if not (isinstance(f, For) and f.kind == "serial") or any(isinstance(n, For) for n in walk_stmts(f.body)):
            continue
        width = divmod_width(f)
        if isinstance(width, int) and 1 < width < int(getattr(f.extent, "value", 0)) \
                or width is not None and not isinstance(width, int) and rows_of(f, width) is not None:
            func = unflatten(func, f.var.name, width)
    return func


DYNAMIC_EXTENT = 1024  # what the schedule assumes of an extent known only at the call (a dynamic shape symbol's)
VECTOR_LANES = 32


def extent_hint(f: For, indices: set[str], default: int = 0) -> int:
    """A loop's extent; :data:`DYNAMIC_EXTENT` where it is an expression of dynamic shape symbols
    (none of its variables is one of the loop ``indices`` around it): the schedule sizes its work
    by that, and tails handle the rest; ``default`` for one that moves with a loop index."""
    if isinstance(f.extent, Const):
        return int(f.extent.value)
    return default if free_vars(f.extent) & indices else DYNAMIC_EXTENT


def vector_lanes(f: For) -> int:
    """Lanes to vectorise ``f`` by: 32, or the multiple a dynamic extent is declared to be
    (``dynamic={"N": 8}``: ``8 * (N // 8)``) where that is smaller, so that no remainder is left."""
    e = f.extent
    if isinstance(e, Binary) and e.op == "mul" and isinstance(e.a, Const) and 4 <= int(e.a.value) < VECTOR_LANES:
        return int(e.a.value)
    return VECTOR_LANES


def vectorize_and_parallelize(func: LoopFunc, target: CpuTarget, trace: Trace = SILENT) -> LoopFunc:
    for name in _vector_candidates(func):
        lanes = min(vector_lanes(f) for f in walk_stmts(func.body) if isinstance(f, For) and f.var.name == name)
        try:
            func = trace(f"vectorize {name} by {lanes}", vectorize(func, name, lanes))
        except TccScheduleError:
            continue
    func = trace("unroll masked rows", unroll_masked_rows(func))
    func = trace("unroll masked windows", unroll_masked_windows(func))
    if target.cores > 1:
        func = _parallelize_items(func, func.body, target, trace)
    return func


MASKED_ROW_UNROLL = 4


def unroll_masked_rows(func: LoopFunc) -> LoopFunc:
    """Unroll the few vectors of a row whose lanes read through a pad (``x_o`` of a depthwise
    conv: 3 vectors of 32 and a tail): each unrolled copy's padding masks are constants, and
    LLVM, left to itself, kept the loop once the body held an epilogue and computed the masks
    with 64-bit vector compares per vector (the fused depthwise layer ran 1.6x its bare one)."""
    for f in list(walk_stmts(func.body)):
        if isinstance(f, For) and f.kind == "serial" and not is_sequential(f) and isinstance(f.body, For) \
                and f.body.kind == "vector" \
                and 1 < int(getattr(f.extent, "value", 0)) <= MASKED_ROW_UNROLL \
                and any(isinstance(n, Select) for st in walk_stmts(f.body) for e in stmt_exprs(st) for n in walk(e)):
            func = on_loops(func, f.var.name,
                            lambda s, body=f.body: replace(s, kind="unroll") if s.body == body else None)
    return func


MASKED_WINDOW_UNROLL = 3


def unroll_masked_windows(func: LoopFunc) -> LoopFunc:
    """Unroll the small window loops (``r0, r1`` of a 3x3 pooling window or depthwise conv) inside
    a vector loop whose body reads through a pad: each unrolled tap's padding mask then depends
    on the loops outside the window only, and LLVM hoists it out of the row loop; kept as loops,
    the 32-lane masks were recomputed per tap and output row in 64-bit vector compares (a 3x3
    stride-2 max pool at 112x112 ran 1.85 ms unrolled 0.41, onnxruntime 0.30)."""
    def small_window(f: Stmt) -> bool:
        return isinstance(f, For) and f.kind == "serial" and 1 < int(getattr(f.extent, "value", 0)) <= \
            MASKED_WINDOW_UNROLL and any(isinstance(n, Select) for st in walk_stmts(f.body)
                                         for e in stmt_exprs(st) for n in walk(e))

    def unroll_inside(n: Stmt) -> Stmt | None:
        if not (isinstance(n, For) and n.kind == "vector" and any(small_window(f) for f in walk_stmts(n.body))):
            return None
        return map_stmt(n, lambda f: replace(f, kind="unroll") if small_window(f) else None)

    return replace(func, body=map_stmt(func.body, unroll_inside))


def _parallelize_items(func: LoopFunc, body: Stmt, target: CpuTarget, trace: Trace) -> LoopFunc:
    """Parallelise each statement's outer loop; a group loop that cannot run in parallel (it holds
    a parallel GEMM, or has fewer iterations than threads) gets its own statements parallelised
    instead, one fork per statement per iteration."""
    cores = target.cores
    for item in items(body):
        if not (isinstance(item, For) and item.kind == "serial") or is_sequential(item):
            continue  # (a recurrence's outer loop runs in order)
        whole = _whole_group(item)
        work = _work(item) * (MISS_WORK if _misses(func, item, target) else 1)
        if not _has_parallel(item) and (whole or work >= PARALLEL_MIN_WORK):
            try:
                func = _parallel_widened(func, item, cores, trace, whole=whole)
                continue
            except TccScheduleError:
                pass
        group = find_loop(func, item.var.name) if is_group(item) else None
        if group is not None:  # (None: an earlier step renamed it, fusing it with another loop)
            func = _parallelize_items(func, group.body, target, trace)
    return func


MISS_WORK = 16  # iterations of plain work that one cache miss costs, for the fork's threshold


def _misses(func: LoopFunc, item: For, target: CpuTarget) -> bool:
    """Whether ``item`` reads a tensor larger than the L2 cache at indices loaded from data (an
    embedding's rows, a loss's label pick): each such read is a cache miss, whose latency a
    second thread hides, so 4096 of them are worth the fork that 4096 additions are not (a label
    pick of 4096 rows of 32000 ran 1.4x torch's time serial, 0.6x on two cores)."""
    limit = target.cache_bytes(2)
    big = {p.name for p in func.params if isinstance(p, Buffer) and p.static and p.size * p.dtype.itemsize > limit}
    return any(ld.buffer in big and any(isinstance(n, Load) for i in ld.indices for n in walk(i))
               for ld in loads(item))


def _parallel_widened(func: LoopFunc, item: For, cores: int, trace: Trace, whole: bool = False) -> LoopFunc:
    """``item``'s loop in parallel; with fewer iterations than the threads take chunks (a batch of
    one) it is first fused with the loop right inside it (``n`` x ``c`` of a depthwise conv).
    A ``whole`` group's loop must give every thread an iteration, else its statements are
    parallelised one by one instead (the caller's fallback)."""
    extent = extent_hint(item, set())
    if extent < 4 * cores and isinstance(item.body, For) and not is_sequential(item.body):
        name = fresh(func, f"{item.var.name}_{item.body.var.name}")
        try:
            fused = fuse(func, item.var.name, item.body.var.name, name=name)
            threaded = parallel(fused, name)
            trace(f"fuse {item.var.name}, {item.body.var.name}", fused)
            return trace(f"parallel {name}", threaded)
        except TccScheduleError:
            pass
    if whole and extent < cores:
        raise TccScheduleError(f"group loop {item.var.name} has fewer iterations than threads")
    return trace(f"parallel {item.var.name}", parallel(func, item.var.name))


def _has_parallel(s: Stmt) -> bool:
    return any(isinstance(n, For) and n.kind == "parallel" for n in walk_stmts(s))


def _vector_candidates(func: LoopFunc) -> list[str]:
    """Loops whose variable walks the last dim of what they store (or, innermost, of what they load)."""
    picked: list[str] = []
    indices = loop_names(func.body)
    for f in walk_stmts(func.body):
        if not isinstance(f, For) or f.kind != "serial" or is_sequential(f):
            continue
        if extent_hint(f, indices) < 4 or f.var.name in picked:
            continue
        inner_loops = [n for n in walk_stmts(f.body) if isinstance(n, For)]
        if any(n.kind == "vector" for n in inner_loops):
            continue
        if _unit_store(f) or (not inner_loops and _unit_load(f)):
            picked.append(f.var.name)
    around = _loops_around(func.body)
    return [n for n in picked if not around.get(n, set()) & (set(picked) - {n})]


def _unit_store(f: For) -> bool:
    return any(st.indices and linear_coeff(st.indices[-1], f.var.name) == 1 for st in stores(f.body))


def _unit_load(f: For) -> bool:
    return any(ld.indices and linear_coeff(ld.indices[-1], f.var.name) == 1 for ld in loads(f.body))


def _loops_around(s: Stmt) -> dict[str, set[str]]:
    """The names of the loops around each loop (by name), from one walk: asking of every pair of
    candidates walked the function once per pair (a model's last kernel of 120 copies: a minute)."""
    around: dict[str, set[str]] = {}
    stack: list[tuple[Stmt, frozenset[str]]] = [(s, frozenset())]
    while stack:
        node, outer = stack.pop()
        if isinstance(node, For):
            around.setdefault(node.var.name, set()).update(outer)
            outer = outer | {node.var.name}
        stack.extend((c, outer) for c in node.children())
    return around


def _whole_group(item: For) -> bool:
    """A group loop (several statements with their buffers: Winograd's rows and the tiles read
    from them) with enough work in all its statements to fork once for all of them, each thread
    keeping its own buffers. ``_work`` (extents times the *sum* of the inner loops' extents) rates
    such a group far too small, and its statements forked one by one, per row of B^T: 73 forks a
    ResNet-18 call, 43 with this. Counting stores this way for every statement would also fork small
    GEMMs that ``_work`` keeps serial (a 1x1 conv of 174 kFLOP), so it is used for groups only."""
    return is_group(item) and _holds_buffers(item) and _store_work(item) >= PARALLEL_MIN_WORK


def _holds_buffers(f: For) -> bool:
    """Whether the perfect nest of loops from ``f`` allocates buffers (a group's intermediates)."""
    s: Stmt = f
    while isinstance(s, For):
        s = s.body
    return isinstance(s, Allocate)


def _store_work(f: Stmt) -> int:
    """The stores ``f`` makes: each store statement times the extents of the loops around it."""
    indices = loop_names(f)

    def count(s: Stmt, trips: int) -> int:
        if isinstance(s, Store):
            return trips
        if isinstance(s, For):
            return count(s.body, trips * extent_hint(s, indices, 1))
        return sum(count(c, trips) for c in s.children())
    return count(f, 1)


def _work(f: For) -> int:
    total = 0
    for n in walk_stmts(f):
        if isinstance(n, Store):
            total += 1
    size = 1
    s: Stmt = f
    indices = loop_names(f)
    while isinstance(s, For):
        size *= extent_hint(s, indices, 1)
        s = s.body
    inner = sum(extent_hint(n, indices, 1) for n in walk_stmts(s) if isinstance(n, For)) or 1
    return size * inner * total

