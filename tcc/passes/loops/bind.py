"""bind: run a loop's iterations on the GPU's blocks or threads (``blockIdx.x`` / ``threadIdx.x``),
or on the warps (warpgroups) of a block (:mod:`tcc.passes.loops.bind_lanes`).

``bind(io, block)`` makes every iteration of ``io`` one block of a kernel; ``bind(ii, thread)`` one
thread of its block. The iterations then run at once, so, as for ``parallel``, they must write
disjoint elements (a loop that reduces cannot be bound). A statement nest whose outermost loop is
bound to blocks becomes one kernel, exactly as scheduled; nests left unbound go to the CUDA
auto-scheduler. :func:`check_kernels` checks the whole schedule's shape once every step ran, so
that each error points at the ``bind`` step it is about.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tcc import dtypes
from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Var
from tcc.ir.loopnest import const_extent, on_loops, require_loop
from tcc.ir.loops import Allocate, Barrier, For, If, Let, LoopFunc, Seq, Stmt, Store, walk_stmts
from tcc.passes.loops.bind_lanes import LANES, bind_lanes
from tcc.passes.loops.parallel import check_parallel

AXES = {"block": "block.x", "thread": "thread.x", "warp": "thread.x", "warpgroup": "thread.x"}
MAX_BLOCKS = 2**31 - 1
I64 = dtypes.i64


def bind(func: LoopFunc, loop: str, axis: str, span: Span | None, max_threads: int) -> LoopFunc:
    """Bind every loop named ``loop`` to the GPU axis ``axis`` (``block``, ``thread``, ``warp`` or
    ``warpgroup``); a block holds at most ``max_threads`` threads (the target's
    ``max_threads_per_block``)."""
    kind = AXES.get(axis)
    if kind is None:
        raise TccScheduleError(f"unknown GPU axis {axis!r}", span,
                               "write bind(LOOP, block), bind(LOOP, thread), bind(LOOP, warp) or "
                               "bind(LOOP, warpgroup)")
    for found in require_loop(func, loop, span):
        n = const_extent(found, span)
        if found.kind != "serial":
            raise TccScheduleError(f"loop {loop} is already {found.kind}", span)
        limit = MAX_BLOCKS if kind == "block.x" else max_threads // LANES.get(axis, 1)
        if n > limit:
            raise TccScheduleError(f"loop {loop} has {n} iterations, more than the {limit} {axis}s CUDA allows"
                                   + (" in a block" if axis in LANES else ""),
                                   span, f"split {loop} first and bind a part of it")
        check_parallel(func, found, span)
    if axis in LANES:
        return bind_lanes(func, loop, axis, span, max_threads)
    return on_loops(func, loop, lambda s: replace(s, kind=kind))


def check_kernels(func: LoopFunc, spans: dict[str, Span | None]) -> None:
    """Every bound nest must be a kernel: its outermost loop bound to blocks, its thread loops
    inside that one, one thread count per kernel, and no store to memory shared by the block's
    threads outside its thread loops. ``spans`` gives the ``bind`` step of each bound loop."""
    body = func.body
    while isinstance(body, Allocate) and body.buffer.scope == "global":
        body = body.body
    for nest in top_level_nests(body):
        bound = [s for s in walk_stmts(nest) if isinstance(s, For) and s.kind in ("block.x", "thread.x")]
        if not bound:
            continue
        root = nest
        if not (isinstance(root, For) and root.kind == "block.x"):
            first = bound[0]
            raise TccScheduleError(f"loop {first.var.name} is bound to {first.kind.split('.')[0]}s but is not the "
                                   "outermost loop of its statement nest", spans.get(first.var.name),
                                   "bind the outermost loop of the nest to blocks (fuse or reorder first)")
        inner_blocks = [s for s in bound[1:] if s.kind == "block.x"]
        if inner_blocks:
            raise TccScheduleError(f"loop {inner_blocks[0].var.name} is bound to blocks inside loop "
                                   f"{root.var.name}, also bound to blocks", spans.get(inner_blocks[0].var.name),
                                   "bind one loop of a nest to blocks (fuse them first)")
        threads = [s for s in bound if s.kind == "thread.x"]
        extents = {const_extent(s) for s in threads}
        if len(extents) > 1:
            raise TccScheduleError(f"the thread loops of kernel {root.var.name} have different extents "
                                   f"{sorted(extents)}", spans.get(threads[-1].var.name),
                                   "bind loops of one extent to threads (split them by the same factor)")
        if threads:
            _check_outside_threads(root.body, root, spans)


def top_level_nests(body: Stmt) -> list[Stmt]:
    """The statement nests of a function body (a split of an outermost loop leaves a Seq of its
    main part and tail there: both are nests)."""
    if isinstance(body, Seq):
        return [n for s in body.stmts for n in top_level_nests(s)]
    return [body]


def _check_outside_threads(s: Stmt, root: For, spans: dict[str, Span | None], private: frozenset = frozenset()) -> None:
    """Statements between the block loop and its thread loops run on every thread: they may only
    bind names, loop, or write the thread's own local buffers."""
    if isinstance(s, For) and s.kind == "thread.x":
        return
    if isinstance(s, Store) and s.buffer not in private:
        raise TccScheduleError(f"the store to {s.buffer} in kernel {root.var.name} is outside its thread loops: "
                               "every thread of the block would run it", spans.get(root.var.name),
                               "bind a loop that encloses the store to threads")
    if isinstance(s, Allocate):
        private = private | ({s.buffer.name} if s.buffer.scope == "local" else set())
    elif not isinstance(s, (For, Seq, Let, If, Barrier)):
        raise TccScheduleError(f"kernel {root.var.name} has a {type(s).__name__} outside its thread loops",
                               spans.get(root.var.name))
    for child in s.children():
        _check_outside_threads(child, root, spans, private)


def thread_extents(s: Stmt) -> set[int]:
    """The extents of the loops bound to threads in ``s``."""
    return {const_extent(f) for f in walk_stmts(s) if isinstance(f, For) and f.kind == "thread.x"}


def cooperative(copy: Stmt, threads: int, names: tuple[str, str, str]) -> Stmt:
    """A copy nest (perfectly nested loops around one store) shared out among a block's
    ``threads``: its iterations flattened, thread ``t`` running every ``threads``-th one, so
    consecutive threads take consecutive iterations (coalesced where the innermost loop walks the
    source with unit stride). ``names``: fresh names for the thread, step and flat index."""
    t = Var(names[0], I64)
    return For(t, Const(threads, I64), shared_out(copy, threads, t, names[1:]), "thread.x")


def shared_out(copy: Stmt, threads: int, t: Var, names: tuple[str, str]) -> Stmt:
    """Thread ``t``'s share of ``copy`` (see :func:`cooperative`), for code that already runs on
    each of the block's ``threads``. ``names``: fresh names for the step and flat index."""
    loops: list[For] = []
    while isinstance(copy, For):
        loops.append(copy)
        copy = copy.body
    extents = [const_extent(f) for f in loops]
    total = math.prod(extents)
    step, flat = (Var(n, I64) for n in names)
    body: Stmt = copy
    stride = 1
    for f, n in reversed(list(zip(loops, extents))):
        digit: Expr = flat if stride == 1 else Binary("floordiv", flat, Const(stride, I64), I64)
        body = Let(f.var, Binary("mod", digit, Const(n, I64), I64) if f is not loops[0] else digit, body)
        stride *= n
    steps = -(-total // threads)
    if steps * threads != total:
        body = If(Binary("lt", flat, Const(total, I64), dtypes.boolean), body)
    index = Binary("add", Binary("mul", step, Const(threads, I64), I64), t, I64)
    return For(step, Const(steps, I64), Let(flat, index, body), "unroll" if steps <= 8 else "serial")
