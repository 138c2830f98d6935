"""cache: copy the tile of a tensor that a loop's body touches into a contiguous buffer.

At each loop named ``at``, every distinct access ``X[indices]`` inside gets a buffer with one dim
per loop (inside ``at``) whose variable the indices use, in nesting order, so the body reads it
contiguously in the order it runs: caching B of a matmul at the K-block loop gives the packed
``[jr, kk, jj]`` panel that a register-blocked micro-kernel streams. A tensor that the body also
writes is copied in before and back after (a register tile of C). Small buffers live on the
stack (``local``), where LLVM keeps them in registers once the loops over them are unrolled and
vectorised; large ones on the heap, allocated once per thread outside the loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, free_vars, substitute, transform, walk
from tcc.ir.loopnest import (
    const_extent,
    dynamic_remainder,
    fresh,
    in_vector_loop,
    linear_coeff,
    loop_names,
    map_exprs,
    mod_index,
    require_loop,
)
from tcc.ir.loops import (
    Allocate,
    Barrier,
    Buffer,
    For,
    If,
    Let,
    LoopFunc,
    ProxyFence,
    Seq,
    Stmt,
    Store,
    map_stmt,
    seq,
    stmt_exprs,
    walk_stmts,
)
from tcc.passes.loops.bind import cooperative, thread_extents, top_level_nests
from tcc.passes.loops.bind_lanes import lanes_of
from tcc.passes.loops.cache_shared import OPTIONS, TileCopy, box, check_async, pipelined, retarget, tile_variables
from tcc.passes.loops.init_tiles import start_at_init
from tcc.passes.simplify import evaluate_int

I64 = dtypes.i64
LOCAL_BYTES = 16 * 1024


def cache(func: LoopFunc, tensor: str, at: str, scope: str | None = None, span: Span | None = None,
          options: tuple[str, ...] = (), shared_bytes: int = 0) -> LoopFunc:
    """Cache the tile of ``tensor`` that loop ``at`` reads; ``options``: ``pad``, ``swizzle``,
    ``async`` for shared tiles inside a thread loop (:mod:`tcc.passes.loops.cache_shared`), ``init``
    for local tiles of a decomposed reduction (:mod:`tcc.passes.loops.init_tiles`). A shared tile
    must fit ``shared_bytes``, the shared memory the target gives one block."""
    require_loop(func, at, span)
    for option in options:
        allowed = OPTIONS if scope == "shared" else ("init",) if scope == "local" else ()
        if option not in allowed:
            raise TccScheduleError(f"cache option {option!r} does not apply to {scope or 'default'} tiles", span,
                                   f"options: shared: {', '.join(OPTIONS)}; local: init")
    if in_vector_loop(func, at):
        raise TccScheduleError(f"loop {at} is (inside) a vector loop: a copy there would run once per lane", span,
                               "cache at a loop outside the vector loop")
    buffers = func.buffers()
    if tensor not in buffers:
        raise TccScheduleError(f"op {func.name} has no tensor {tensor!r}", span,
                               f"its tensors are: {', '.join(sorted(buffers))}")
    if any(isinstance(n, Allocate) and n.buffer.name == tensor for f in require_loop(func, at, span)
           for n in walk_stmts(f.body)):
        raise TccScheduleError(f"{tensor} is allocated inside loop {at}: it has no tile there to copy", span,
                               f"cache it at a loop inside the scope of {tensor}")
    if scope not in (None, "local", "global", "shared"):
        raise TccScheduleError(f"unknown scope {scope!r}", span, "use local, global or (on cuda) shared")
    state = _State(func, buffers[tensor], scope, span, options, shared_bytes)
    body = _doubled(func.body, at) if "async" in options else func.body
    body, pending = _rewrite(body, at, state)
    cached = replace(func, body=_wrap(body, pending))
    return start_at_init(cached, tensor, set(state.made), span) if "init" in options else cached


def _doubled(body: Stmt, at: str) -> Stmt:
    """Each kernel holding loop ``at`` as a pair: an aligned variant (``aligned=True``, for the
    async copies) and itself after it, which the launcher runs when a pointer is not aligned.
    Kernels already paired stay as they are."""
    if isinstance(body, Allocate):
        return replace(body, body=_doubled(body.body, at))
    nests = top_level_nests(body)
    out: list[Stmt] = []
    for n, nest in enumerate(nests):
        paired = _aligned(nest) or (n > 0 and _aligned(nests[n - 1]))
        if not paired and isinstance(nest, For) and nest.kind == "block.x" and at in loop_names(nest):
            out.append(replace(nest, annotations=nest.annotations + (("aligned", True),)))
        out.append(nest)
    return seq(*out)


def _aligned(s: Stmt) -> bool:
    return isinstance(s, For) and any(k == "aligned" for k, _ in s.annotations)


class _State:
    def __init__(self, func: LoopFunc, buf: Buffer, scope: str | None, span: Span | None,
                 options: tuple[str, ...] = (), shared_bytes: int = 0):
        self.func = func
        self.buf = buf
        self.scope = scope
        self.span = span
        self.options = options
        self.shared_bytes = shared_bytes
        self.taken = set(func.buffers())
        self.count = 0
        self.made: list[str] = []  # the buffers this step made
        self.vars: set[str] = set()

    def var(self, base: str) -> str:
        """A variable name unused in the function and by this step so far."""
        name, n = fresh(self.func, base), 1
        while name in self.vars:
            n += 1
            name = fresh(self.func, f"{base}_{n}")
        self.vars.add(name)
        return name

    def name(self) -> str:
        while True:
            self.count += 1
            name = f"{self.buf.name}_c{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                self.made.append(name)
                return name


def _wrap(body: Stmt, bufs: list[Buffer]) -> Stmt:
    for b in reversed(bufs):
        body = Allocate(b, body)
    return body


@dataclass(frozen=True)
class _Gpu:
    """Where a loop sits on the GPU: its innermost enclosing binding ("block.x", "thread.x" or
    ""), the enclosing thread loop, the names that differ between its threads (the thread
    variable and the ``let``s computed from it), and whether a branch lies in between."""

    kind: str = ""
    thread: For | None = None
    varying: frozenset[str] = frozenset()
    guarded: bool = False
    aligned: bool = False  # in a kernel that runs only with 16-byte aligned pointers

    def enter(self, s: Stmt) -> _Gpu:
        if isinstance(s, For) and s.kind == "thread.x":
            return _Gpu("thread.x", s, frozenset((s.var.name,)), aligned=self.aligned)
        if isinstance(s, For) and s.kind == "block.x":
            return _Gpu("block.x", aligned=_aligned(s))
        if self.thread is not None and isinstance(s, Let) and free_vars(s.value) & self.varying:
            return replace(self, varying=self.varying | {s.var.name})
        if self.thread is not None and isinstance(s, If):
            return replace(self, guarded=True)
        return self


def _rewrite(s: Stmt, at: str, st: _State, gpu: _Gpu = _Gpu()) -> tuple[Stmt, list[Buffer]]:
    """Rewrite loops ``at``; buffers float up to the nearest parallel (or GPU block) loop or the
    function."""
    if isinstance(s, For) and s.var.name == at:
        new, bufs = _cache_at(s, st, gpu)
        if new.kind in ("parallel", "block.x"):
            return replace(new, body=_wrap(new.body, bufs)), []
        if gpu.kind:  # in a kernel, a thread's registers live in the loop they serve (its own, if bound later)
            mine = [b for b in bufs if b.scope == "local"]
            return replace(new, body=_wrap(new.body, mine)), [b for b in bufs if b not in mine]
        return new, bufs
    inner = gpu.enter(s)
    if isinstance(s, For):
        body, bufs = _rewrite(s.body, at, st, inner)
        if s.kind in ("parallel", "block.x"):
            return replace(s, body=_wrap(body, bufs)), []
        return replace(s, body=body), bufs
    if isinstance(s, Seq):
        parts, bufs = [], []
        for c in s.stmts:
            p, b = _rewrite(c, at, st, gpu)
            parts.append(p)
            bufs += b
        return seq(*parts), bufs
    if isinstance(s, (Allocate, Let)):
        body, bufs = _rewrite(s.body, at, st, inner)
        return replace(s, body=body), bufs
    if isinstance(s, If):
        then, b1 = _rewrite(s.then, at, st, inner)
        other, b2 = (None, []) if s.otherwise is None else _rewrite(s.otherwise, at, st, inner)
        return replace(s, then=then, otherwise=other), b1 + b2
    return s, []


def _sites(s: Stmt, name: str, chain: tuple[For, ...], out: dict) -> None:
    """Accesses of ``name``: indices -> (enclosing loops, loaded?, stored?)."""
    for e in stmt_exprs(s):
        for n in _loads(e, name):
            entry = out.setdefault(n.indices, [chain, False, False])
            entry[1] = True
    if isinstance(s, Store) and s.buffer == name:
        entry = out.setdefault(s.indices, [chain, False, False])
        entry[2] = True
    inner = chain + (s,) if isinstance(s, For) else chain
    for c in s.children():
        _sites(c, name, inner, out)


def _loads(e: Expr, name: str) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load) and n.buffer == name]


def _cache_at(loop: For, st: _State, gpu: _Gpu) -> tuple[For, list[Buffer]]:
    if st.scope == "shared" and gpu.kind == "thread.x":
        return _cache_block_tile(loop, st, gpu)
    if "async" in st.options:
        raise TccScheduleError(f"cache({st.buf.name}, {loop.var.name}, shared, async): loop {loop.var.name} is not "
                               "inside a thread loop", st.span, "bind the loops around it to threads or warps first")
    threads = _shared_threads(loop, st, gpu) if st.scope == "shared" else 0
    sites: dict = {}
    _sites(loop.body, st.buf.name, (), sites)
    if any(_loads(i, st.buf.name) for indices in sites for i in indices):
        raise TccScheduleError(f"{st.buf.name} is indexed by its own values inside loop {loop.var.name} "
                               f"({st.buf.name}[{st.buf.name}[...]]); it cannot be cached there", st.span)
    if any(isinstance(n, Store) and n.buffer == st.buf.name and n.accumulate for n in walk_stmts(loop.body)):
        raise TccScheduleError(f"{st.buf.name} is added into (+=) inside loop {loop.var.name}: its positions come "
                               "from the data, so no tile of it can be copied", st.span,
                               f"cache the tensors the += reads, not {st.buf.name}")
    if any(stored for _, _, stored in sites.values()) and len(sites) > 1:
        raise TccScheduleError(f"{st.buf.name} is written inside loop {loop.var.name} and accessed at "
                               f"{len(sites)} different places; caching it would change the result", st.span)
    before, after, mapping, bufs = [], [], {}, []
    for indices, (chain, loaded, stored) in sites.items():
        used = set().union(*(free_vars(i) for i in indices)) if indices else set()
        loops = [f for f in chain if f.var.name in used]
        shape = tuple(_tile_extent(f, st) for f in loops)
        if stored:
            _check_injective(indices, loops, st)
        static = all(isinstance(d, int) for d in shape)
        nbytes = st.buf.dtype.itemsize * max(1, math.prod(shape)) if static else None
        scope = st.scope or ("local" if nbytes is not None and nbytes <= LOCAL_BYTES else "global")
        if scope == "shared" and (stored or nbytes is None or nbytes > st.shared_bytes):
            why = "it is written there" if stored else f"its tile takes {nbytes} bytes, over {st.shared_bytes}"
            raise TccScheduleError(f"cannot cache {st.buf.name} in shared memory at {loop.var.name}: {why}",
                                   st.span, "cache a smaller tile (at an inner loop) or a tensor only read")
        buf = Buffer(st.name(), st.buf.dtype, shape, scope)
        bufs.append(buf)
        local_idx = tuple(f.var for f in loops)
        mapping[indices] = (buf.name, local_idx)
        if loaded or not stored:
            order = source_major(loops, indices, st.buf.shape) if threads else source_order(loops, indices,
                                                                                           st.buf.shape)
            before.append(_copy(order, Store(buf.name, local_idx, Load(st.buf.name, indices, st.buf.dtype))))
        if stored:
            after.append(_copy(loops, Store(st.buf.name, indices, Load(buf.name, local_idx, st.buf.dtype))))
    body = _retarget(loop.body, st.buf.name, mapping)
    if threads:  # the block's threads copy together; barriers before the reads and the next copy
        before = [cooperative(c, threads, tuple(fresh(st.func, f"{b.name}_{x}") for x in "tsf"))
                  for c, b in zip(before, bufs)]
        return replace(loop, body=_between_barriers(before, body, st)), bufs
    return replace(loop, body=seq(*before, body, *after)), bufs


def _tile_extent(f: For, st: _State) -> int | Expr:
    """A dim of a cached tile: the loop's extent; for the remainder of a split of a dynamic
    extent (``N % 32``) the split's factor (32; the CPU GEMM may run a remainder of rows as a
    whole tile), so the tile keeps a constant size; an expression of the dynamic shape symbols
    where it has no such bound (the tile then lives on the heap)."""
    e = f.extent
    if isinstance(e, Binary) and e.op == "mod" and isinstance(e.b, Const):
        return int(e.b.value)
    if not isinstance(e, Const) and dynamic_remainder(st.func, f):
        return e
    return const_extent(f, st.span)


def _between_barriers(copies: list[Stmt], body: Stmt, st: _State) -> Stmt:
    """The copies, a barrier, ``body`` and a barrier before the next copies (one barrier after
    several caches' copies; none added where the body already ends with one)."""
    parts = body.stmts if isinstance(body, Seq) else (body,)
    first = () if _copies_to_shared(parts[0], st) else (Barrier(),)
    last = () if isinstance(parts[-1], Barrier) else (Barrier(),)
    return seq(*copies, *first, body, *last)


def _cache_block_tile(loop: For, st: _State, gpu: _Gpu) -> tuple[For, list[Buffer]]:
    """A shared cache at a loop inside the thread loop: the block's tile, in the box layout of
    :mod:`tcc.passes.loops.cache_shared`, copied by all threads (double-buffered with async)."""
    assert gpu.thread is not None
    what = f"cache({st.buf.name}, {loop.var.name}, shared)"
    if gpu.guarded:
        raise TccScheduleError(f"{what}: loop {loop.var.name} is inside a branch of thread loop "
                               f"{gpu.thread.var.name}; every thread of the block must run the copy and its "
                               "barriers", st.span, "cache at a loop outside the branch")
    lanes = lanes_of(gpu.thread)
    warps = lanes.groups if lanes is not None else ()
    threads, thread = const_extent(gpu.thread), gpu.thread.var
    sites: dict = {}
    _sites(loop.body, st.buf.name, (), sites)
    if any(stored for _, _, stored in sites.values()):
        raise TccScheduleError(f"cannot cache {st.buf.name} in shared memory at {loop.var.name}: it is written there",
                               st.span, "cache a tensor only read")
    use_async = "async" in st.options and gpu.aligned
    inside = {t.var.name for t in walk_stmts(loop.body) if isinstance(t, Let)}
    copies, reads = [], {}
    for indices, (chain, _, _) in sites.items():
        used = set().union(*(free_vars(i) for i in indices)) if indices else set()
        if used & inside:
            raise TccScheduleError(f"{what}: the read goes through {', '.join(sorted(used & inside))}, computed "
                                   f"inside {loop.var.name}", st.span, "cache at a loop inside the one that binds it")
        per_thread = sorted((used & gpu.varying) - {name for name, _ in warps})
        if per_thread:
            raise TccScheduleError(f"{what}: the tile read inside {loop.var.name} differs between threads of the "
                                   f"block (through {', '.join(per_thread)})", st.span,
                                   "cache a tensor whose tile depends on the block's loops and the warp grid only")
        tile = {v: e for v, e in tile_variables(loop, chain, warps).items() if v in used}
        region = box(indices, tile, what, st.span)
        shape = list(region.extents)
        if "pad" in st.options and "swizzle" in st.options:
            raise TccScheduleError(f"{what}: pad and swizzle are two layouts of one tile", st.span, "choose one")
        if "pad" in st.options and shape:
            shape[-1] += 16 // st.buf.dtype.itemsize
        slots = 2 if use_async else 1
        buf = Buffer(st.name(), st.buf.dtype, (slots, *shape) if slots > 1 else tuple(shape), "shared",
                     128 if "swizzle" in st.options else 0)
        if buf.size * buf.dtype.itemsize > st.shared_bytes:
            raise TccScheduleError(f"cannot cache {st.buf.name} in shared memory at {loop.var.name}: its tile takes "
                                   f"{buf.size * buf.dtype.itemsize} bytes, over {st.shared_bytes}", st.span,
                                   "cache a smaller tile (at an inner loop)")
        copy = TileCopy(buf, st.buf, region, slots)
        if use_async:
            check_async(copy, what, st.span)
        copies.append(copy)
        reads[indices] = (buf.name, copy.read(mod_index(loop.var, 2) if use_async else None))
    body = retarget(loop.body, st.buf.name, reads)
    bufs = [c.buf for c in copies]
    if use_async:
        return pipelined(loop, body, copies, threads, thread, st.var), bufs
    before = [c.copy(loop.var, None, None, threads, thread, st.var) for c in copies]
    if any(b.swizzle for b in bufs):  # wgmma reads through the async proxy: fence this thread's stores
        before.append(ProxyFence())
    return replace(loop, body=_between_barriers(before, body, st)), bufs


def _copies_to_shared(s: Stmt, st: _State) -> bool:
    """Whether ``s`` is an earlier shared cache's copy (which a barrier follows)."""
    buffers = st.func.buffers()
    written = {t.buffer for t in walk_stmts(s) if isinstance(t, Store)}
    return isinstance(s, For) and bool(written) and all(
        name in buffers and buffers[name].scope == "shared" for name in written) and \
        not any(isinstance(t, Barrier) for t in walk_stmts(s))


def _shared_threads(loop: For, st: _State, gpu: _Gpu) -> int:
    """The thread count of the block that shares a ``shared`` cache at ``loop`` (checked)."""
    if gpu.kind != "block.x":
        raise TccScheduleError(f"cache({st.buf.name}, {loop.var.name}, shared): loop {loop.var.name} is outside "
                               "any loop bound to blocks", st.span,
                               "bind the kernel's loops first, then cache at a loop inside the block loop")
    extents = thread_extents(loop.body)
    if len(extents) != 1:
        raise TccScheduleError(f"cache({st.buf.name}, {loop.var.name}, shared): loop {loop.var.name} must enclose "
                               "the block's thread loop", st.span, "bind a loop inside it to threads first")
    return extents.pop()


def _copy(loops: list[For], store: Store) -> Stmt:
    """The copy nest mirrors the loops it serves (unrolled stays unrolled, the last vector stays vector)."""
    body: Stmt = store
    for pos, f in reversed(list(enumerate(loops))):
        kind = f.kind if f.kind == "unroll" or (f.kind == "vector" and pos == len(loops) - 1) else "serial"
        body = For(f.var, f.extent, body, kind=kind, span=f.span)
    return body


def source_order(loops: list[For], indices: tuple[Expr, ...], shape: tuple[int, ...]) -> list[For]:
    """The copy-in loops ordered to read the source front to back when the innermost loop walks
    both the source and the buffer with unit stride: a packed panel of B ``[jr, kk, jj]`` is
    filled row by row of B (``kk`` outside ``jr``), one contiguous run per row, rather than 32
    floats from each of ``kc`` rows (a new page per row when B is wide) per ``jr``. Strides are
    measured on the flat source offset, so a patch read through ``k // 9, k // 3 % 3, k % 3``
    orders like ``k``."""
    if len(loops) < 3 or loops[-1].kind == "unroll":
        return loops
    strides = _source_strides(loops, indices, shape)
    if strides is None or strides[loops[-1].var.name] != 1:
        return loops
    outer = sorted(loops[:-1], key=lambda f: -strides[f.var.name])
    return [*outer, loops[-1]]


def source_major(loops: list[For], indices: tuple[Expr, ...], shape: tuple[int, ...]) -> list[For]:
    """The copy loops ordered by the source stride each walks, largest outside: a copy shared
    out among threads in this order reads consecutive elements on consecutive threads."""
    strides = _source_strides(loops, indices, shape)
    return loops if strides is None else sorted(loops, key=lambda f: -strides[f.var.name])


def _source_strides(loops: list[For], indices: tuple[Expr, ...], shape: tuple[int, ...]) -> dict[str, int] | None:
    """How far one step of each loop moves the flat source offset; None where it is not constant."""
    base = _flat_offset(indices, shape, {})
    strides = {}
    for f in loops:
        moved = _flat_offset(indices, shape, {f.var.name: 1})
        if base is None or moved is None:
            return None
        strides[f.var.name] = abs(moved - base)
    return strides


def _flat_offset(indices: tuple[Expr, ...], shape: tuple[int, ...], values: dict[str, int]) -> int | None:
    """The row-major element offset of ``indices`` with ``values`` for the named loops, 0 for the rest."""
    total, stride = 0, 1
    for idx, dim in reversed(list(zip(indices, shape))):
        env = {v: Const(values.get(v, 0), dtypes.i64) for v in free_vars(idx)}
        value = evaluate_int(substitute(idx, env))
        if value is None or not isinstance(dim, int):  # (a dynamic shape symbol's dim: no constant stride)
            return None
        total += value * stride
        stride *= dim
    return total


def _retarget(body: Stmt, name: str, mapping: dict) -> Stmt:
    def expr(e: Expr) -> Expr:
        return transform(e, lambda n: Load(mapping[n.indices][0], mapping[n.indices][1], n.dtype)
                         if isinstance(n, Load) and n.buffer == name else None)

    def node(n: Stmt) -> Stmt | None:
        if isinstance(n, Store) and n.buffer == name:
            target, idx = mapping[n.indices]
            return replace(n, buffer=target, indices=idx)
        return None
    return map_stmt(map_exprs(body, expr), node)


def _check_injective(indices: tuple[Expr, ...], loops: list[For], st: _State) -> None:
    """Each loop must move the written element (else copying back would lose updates)."""
    for f in loops:
        if not any(linear_coeff(i, f.var.name) not in (0, None) for i in indices):
            raise TccScheduleError(f"{st.buf.name} is written through a non-affine index of {f.var.name}; "
                                   "caching it could change the result", st.span)




