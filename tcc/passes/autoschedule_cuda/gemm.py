"""The GPU schedule for contractions: ``C[...] = g(sum[k...](x * y))`` as a tiled GEMM.

A nest qualifies when its body is what ``lower`` gives for one reduction (a local accumulator,
its initialising store, the reduction loops over ``acc[0] = acc[0] + x * y``, the final store)
and the output axes split into **M** axes (read by ``x`` only), **N** axes (read by ``y`` only)
and batch axes (read by both or neither). Matmul, batched matmul and convolution (implicit
GEMM: output channels x output pixels, reduction over ``c, r, s``) all take this form.

Each block computes a ``BM x BN`` tile of one batch element with 256 threads, each thread a
``TM x TN`` register tile whose rows and columns come in runs of 4 consecutive ones, the runs
64 apart (so each run is one 16-byte shared-memory load, conflict-free, and the final stores
coalesce; single rows strided by 16 where TM or TN is not a multiple of 4). Per step of ``BK``
along the flattened reduction, the threads fill ``xs[BK][BM+4]`` and ``ys[BK][BN+4]`` in shared
memory cooperatively (the reduction index fastest where the operand is contiguous along it), with zeros outside the
problem, then ``__syncthreads()``, then rank-1 updates from registers, then a barrier again.
The epilogue (bias, relu, casts: whatever the final store computes) runs per register element,
guarded at the tile edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tcc import dtypes
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, cast, free_vars, transform, walk
from tcc.ir.loopnest import add_index, div_index, mod_index, mul_index
from tcc.ir.loops import MIN_BLOCKS, Allocate, Barrier, Buffer, For, If, Let, Seq, Stmt, Store, seq
from tcc.passes.autoschedule_cuda.indexing import Size, as_expr, ceil_div, hint, product, size_of
from tcc.target import CudaTarget

I64 = dtypes.i64
I32 = dtypes.i32
THREADS = 256
SIDE = 16  # threads along each side of a tile: THREADS == SIDE * SIDE
PAD = 4  # floats added to each shared row: the transposed fills then avoid bank conflicts
RUN = 4  # consecutive tile rows (and columns) a thread owns: one 16-byte shared-memory load
DYNAMIC_ALIGN = 1024  # dynamic shared buffers start on this boundary, plus one alignment slack (cuda_c)
# registers of a GEMM thread beside its accumulators (operand fragments, staging, addresses): the
# 128 x 256 wgmma tile's 128 accumulators make 192, which NVRTC fits in the 255 of one thread
REGISTER_OVERHEAD = 64
# registers of one FMA GEMM thread as NVRTC compiles it: two 256-thread blocks fit one H100
# multiprocessor at once (its 65536 registers), which split-K's single wave is sized by
FMA_REGISTERS = 128
# (BM, BN, BK): the largest tile that still gives a full grid is chosen; TM = BM / 16, TN = BN / 16
TILES = ((128, 128, 16), (128, 64, 16), (64, 128, 16), (64, 64, 16), (32, 32, 8))
MIN_K = 4  # shorter reductions stay one thread per output
# the tiles the tuner may try besides TILES: every side a multiple of SIDE * RUN or SIDE, and each
# operand's BK x tile slice a whole number of loads per thread
SEARCH_TILES = (*TILES, (128, 128, 8), (64, 64, 32), (128, 32, 16), (32, 128, 16), (64, 32, 16), (32, 64, 16))


@dataclass
class Contraction:
    """A nest recognised as a contraction, by the role of each loop."""

    m_axes: list[For]
    n_axes: list[For]
    batch_axes: list[For]
    k_axes: list[For]
    acc: Buffer
    init: Expr
    add: Binary  # acc[0] + x * y
    x: Expr
    y: Expr
    final: Store

    @property
    def static(self) -> bool:
        """Whether every extent is a constant. The split-K, TF32 warpgroup and implicit-convolution
        kernels are sized for constant shapes only (their waves, transposed operands and channel
        layouts are chosen by the problem's size); with a dynamic M, N or batch the 16-bit
        warpgroup (constant K), ``mma.sync`` and FMA kernels, whose tiles mask their tails, serve
        every size."""
        return all(isinstance(size_of(f), int) for f in (*self.m_axes, *self.n_axes, *self.batch_axes, *self.k_axes))

    def size(self, axes: list[For]) -> Size:
        """The elements of ``axes``: an expression where a dynamic shape symbol's extent takes part."""
        return product([size_of(f) for f in axes])


def _const(f: For) -> Size:
    """A loop's extent: a constant, or an expression of the dynamic shape symbols."""
    return size_of(f)


def _moving(axes: list[For]) -> bool:
    """Whether an extent of ``axes`` moves with one of their indices (a triangular nest)."""
    names = {f.var.name for f in axes}
    return any(free_vars(f.extent) & names for f in axes)


def match(axes: list[For], body: Stmt) -> Contraction | None:
    """The contraction that ``axes`` (the output loops) over ``body`` compute, if any."""
    if not (isinstance(body, Allocate) and body.buffer.scope == "local" and body.buffer.size == 1
            and isinstance(body.body, Seq) and len(body.body.stmts) == 3):
        return None
    acc = body.buffer
    init, red, final = body.body.stmts
    k_axes = []
    while isinstance(red, For) and red.kind == "serial":
        k_axes.append(red)
        red = red.body
    if not (k_axes and isinstance(init, Store) and init.buffer == acc.name and isinstance(red, Store)
            and red.buffer == acc.name and isinstance(final, Store) and final.buffer != acc.name):
        return None
    add = red.value
    if not (isinstance(add, Binary) and add.op == "add" and _is_acc(add.a, acc)
            and isinstance(add.b, Binary) and add.b.op == "mul"):
        return None
    x, y = add.b.a, add.b.b
    if any(_reads(e, acc) for e in (init.value, x, y)) or _moving(axes + k_axes):
        return None
    in_x, in_y = free_vars(x), free_vars(y)
    m_axes = [f for f in axes if f.var.name in in_x and f.var.name not in in_y]
    n_axes = [f for f in axes if f.var.name in in_y and f.var.name not in in_x]
    if axes and axes[-1] in m_axes:  # the innermost output axis becomes N: the stores coalesce
        m_axes, n_axes, x, y = n_axes, m_axes, y, x
    batch = [f for f in axes if f not in m_axes and f not in n_axes]
    c = Contraction(m_axes, n_axes, batch, k_axes, acc, init.value, add, x, y, final)
    if hint(c.size(m_axes)) < 2 or hint(c.size(n_axes)) < 2 or hint(c.size(k_axes)) < MIN_K:
        return None  # matrix-vector products and short reductions: one thread per output
    return c


def _is_acc(e: Expr, acc: Buffer) -> bool:
    return isinstance(e, Load) and e.buffer == acc.name and all(isinstance(i, Const) and i.value == 0
                                                                for i in e.indices)


def _reads(e: Expr, acc: Buffer) -> bool:
    return any(isinstance(n, Load) and n.buffer == acc.name for n in walk(e))


def fits(tile: tuple[int, int, int]) -> bool:
    """Whether the kernel can be built with ``tile``: each thread owns whole rows and columns of
    the register tile, and the fills give every thread the same number of elements."""
    bm, bn, bk = tile
    return bm % SIDE == 0 and bn % SIDE == 0 and bk * bm % THREADS == 0 and bk * bn % THREADS == 0


def choose_tile(m: Size, n: Size, batch: Size, tiles: tuple[tuple[int, int, int], ...] = TILES,
                sms: int = CudaTarget.sms) -> tuple[int, int, int]:
    """The largest (BM, BN, BK) of ``tiles`` that fits the problem and still fills the ``sms``
    multiprocessors of the chip (a grid smaller than that leaves it idle); a dynamic size counts
    as its :func:`hint`."""
    m, n, batch = hint(m), hint(n), hint(batch)
    fitting = [t for t in tiles if t[0] <= max(m, 32) and t[1] <= max(n, 32)]
    for tile in fitting:
        if batch * -(-m // tile[0]) * -(-n // tile[1]) >= sms:
            return tile
    return fitting[-1] if fitting else tiles[-1]


def shared_footprint(buffers: list[Buffer] | tuple[Buffer, ...]) -> int:
    """The shared memory ``buffers`` take in one block, placed as codegen places dynamic ones (each
    on a ``DYNAMIC_ALIGN`` boundary, plus one alignment's slack); nothing for no buffers."""
    sizes = [b.size * b.dtype.itemsize for b in buffers]
    return sum(-(-n // DYNAMIC_ALIGN) * DYNAMIC_ALIGN for n in sizes) + DYNAMIC_ALIGN if sizes else 0


def resident_blocks(target: CudaTarget) -> int:
    """The 256-thread FMA GEMM blocks one multiprocessor of ``target`` holds at once: as many as
    its threads and registers allow (two on an A100 or H100)."""
    return max(1, min(target.max_threads_per_sm // THREADS, target.registers_per_sm // (THREADS * FMA_REGISTERS)))


class OverBudget(Exception):
    """No tile and pipeline depth of a kernel fits the target's shared memory, registers or
    threads per block: the caller tries a smaller kind of kernel."""


def fitting(builder: type[Builder], *args: Any) -> Builder | None:
    """``builder(*args)``, or None where none of its tiles fits the target (:class:`OverBudget`)."""
    try:
        return builder(*args)
    except OverBudget:
        return None


# ---------------------------------------------------------------- building the kernel

class Builder:
    """Builds the kernel of one contraction for ``target``; ``fresh`` names new variables.

    The tile and pipeline depth are the largest that fit the target (:meth:`_configuration`):
    each kind of kernel lists its ``tiles``, largest first, and the depths it can be built with,
    deepest first (``stage_options``: the slots of its shared operand tiles); a kind none of
    whose configurations fits raises :class:`OverBudget` before it names anything."""

    tiles = TILES
    # double-buffered where it fits, else one slot: the next k-step's loads in flight during this
    # step's products (measured on an H100 with BK = 16: f32 GEMM 8192 0.76 -> 0.81 of cuBLAS; 3x3
    # conv 0.79 -> 0.85 of cuDNN once the fills' index arithmetic was hoisted, 0.64 -> 0.56 before)
    stage_options: tuple[int, ...] = (2, 1)
    group_rows = 1  # tile rows per band of the grid's order (see ``kernel``)
    narrow = True  # tile-to-tensor index digits in 32-bit arithmetic where they fit
    resident = True  # within FMA_REGISTERS a thread where its tile needs them all (_at_register_limit)

    def __init__(self, c: Contraction, fresh, decompose, target: CudaTarget,
                 tile: tuple[int, int, int] | None = None, stages: int | None = None):
        self.c = c
        self.fresh = fresh
        self.target = target
        self.decompose = self._narrow(decompose) if self.narrow else decompose
        # sizes: a dynamic one's k-steps or tiles are counted at the call, its last one masked
        self.m, self.n, self.k = c.size(c.m_axes), c.size(c.n_axes), c.size(c.k_axes)
        _check_window(c)
        (self.bm, self.bn, self.bk), self.stages = self._configuration(tile, stages)
        self.double_buffered = self.stages > 1
        self.k_axes = _k_order(c.k_axes, self.bk)
        self.tm, self.tn = self.bm // SIDE, self.bn // SIDE
        names = [fresh(s).name for s in ("xs", "ys", "acct", "xr", "yr", "xst", "yst")]
        self.k_inner = False  # shared tiles are [slot][BK][tile]
        self.xs, self.ys = self.shared_tiles((self.bm, self.bn, self.bk), self.stages, names[0], names[1])
        self.xst = Buffer(names[5], c.x.dtype, (self.bk * self.bm // THREADS,), "local")
        self.yst = Buffer(names[6], c.y.dtype, (self.bk * self.bn // THREADS,), "local")
        self.acct = Buffer(names[2], c.acc.dtype, (self.tm, self.tn), "local")
        self.xr = Buffer(names[3], c.x.dtype, (self.tm,), "local")
        self.yr = Buffer(names[4], c.y.dtype, (self.tn,), "local")

    def _configuration(self, tile: tuple[int, int, int] | None,
                       stages: int | None) -> tuple[tuple[int, int, int], int]:
        """(tile, pipeline depth): the deepest of ``stage_options`` (at most ``stages``, the
        tuner's) at which some tile fits the target, with the largest such tile that still fills
        the chip (:func:`choose_tile`); the tuner's ``tile`` where given, at the deepest depth it
        fits. :class:`OverBudget` where nothing fits, or the block's threads are too many."""
        depths = [d for d in self.stage_options if stages is None or d <= stages] or self.stage_options[-1:]
        if THREADS <= self.target.max_threads_per_block:
            for depth in depths:
                tiles = tuple(t for t in ((tile,) if tile else self.tiles) if self.fits(t, depth))
                if tiles:
                    return tiles[0] if tile else choose_tile(self.m, self.n, self.c.size(self.c.batch_axes), tiles,
                                                             self.target.sms), depth
        raise OverBudget(f"{type(self).__name__}: no tile fits {self.target}")

    def fits(self, tile: tuple[int, int, int], depth: int) -> bool:
        """Whether ``tile`` in ``depth`` slots fits the target: its shared operand tiles, and its
        accumulators (one per output element of the tile, shared out over the block's threads)
        with ``REGISTER_OVERHEAD`` in each thread's registers."""
        registers = tile[0] * tile[1] // THREADS + REGISTER_OVERHEAD
        return (shared_footprint(self.shared_tiles(tile, depth, "x", "y")) <= self.target.shared_memory_per_block
                and registers <= self.target.thread_registers(THREADS))

    def shared_tiles(self, tile: tuple[int, int, int], depth: int, x: str, y: str) -> tuple[Buffer, Buffer]:
        """The shared operand tiles ``x``, ``y`` of ``tile`` in ``depth`` slots: ``[slot][BK][tile + PAD]``."""
        bm, bn, bk = tile
        return (Buffer(x, self.c.x.dtype, (depth, bk, bm + PAD), "shared"),
                Buffer(y, self.c.y.dtype, (depth, bk, bn + PAD), "shared"))

    def kernel(self) -> Stmt:
        """Blocks over the tiles of every batch element; with a dynamic M or N the tile counts are
        computed at the call, and the fills and the epilogue mask the last tiles' tails."""
        c = self.c
        tiles_m, tiles_n = ceil_div(self.m, self.bm), ceil_div(self.n, self.bn)
        tiles = product([tiles_m, tiles_n])
        batch = c.size(c.batch_axes)
        bx, tid, tm0, tn0 = (self.fresh(s) for s in ("bx", "tx", "tm0", "tn0"))
        ty, tx = self.fresh("ty"), self.fresh("tx")
        body = self._allocate(seq(self._init(), self._main_loop(tid, ty, tx, tm0, tn0),
                                  self._epilogue(tid, ty, tx, tm0, tn0)))
        row, col = self.thread_coords(tid)
        body = Let(ty, row, Let(tx, col, body))
        span = c.final.span
        inner: Stmt = For(tid, Const(THREADS, I64), body, "thread.x", span=span)
        tile = mod_size(bx, tiles)
        group = self.group_rows if isinstance(tiles_m, int) and isinstance(tiles_n, int) \
            and tiles_m % self.group_rows == 0 else 1
        if group > 1:  # bands of ``group`` tile rows, column by column: a wave of blocks shares operand panels in L2
            band, within = div_index(tile, group * tiles_n), mod_index(tile, group * tiles_n)
            row, col = add_index(mul_index(band, group), mod_index(within, group)), div_index(within, group)
        else:
            row, col = div_size(tile, tiles_n), mod_size(tile, tiles_n)
        inner = Let(tm0, mul_index(row, self.bm), Let(tn0, mul_index(col, self.bn), inner))
        if c.batch_axes:
            inner = self.decompose(c.batch_axes, [_const(f) for f in c.batch_axes], div_size(bx, tiles), inner)
        notes = ((MIN_BLOCKS, resident_blocks(self.target)),) if self.resident and self._at_register_limit() else ()
        return For(bx, as_expr(product([batch, tiles])), inner, "block.x", annotations=notes, span=span)

    def _at_register_limit(self) -> bool:
        """Whether the compiler is to keep each thread within ``FMA_REGISTERS``: a tile whose
        accumulators fill them, with a dynamic M, N or batch (its guards took the 128 x 128 tile
        one register over: one block a multiprocessor, two waves where split-K counted one; at
        constant sizes NVRTC stays within them by itself)."""
        dynamic = not all(isinstance(s, int) for s in (self.m, self.n, self.c.size(self.c.batch_axes)))
        return dynamic and self.bm * self.bn // THREADS + REGISTER_OVERHEAD >= FMA_REGISTERS

    def _narrow(self, decompose):
        """``decompose`` with the digits of a flat index computed in 32 bits (a 64-bit ``//`` by
        a constant costs several times a 32-bit one), then widened: the operand reads of an
        implicit-GEMM convolution take three to five digits per element and k-step."""
        def narrowed(axes: list[For], extents: list[Size], flat: Expr, body: Stmt) -> Stmt:
            if len(axes) < 2 or not all(isinstance(e, int) for e in extents) or math.prod(extents) >= 2**31:
                return decompose(axes, extents, flat, body)  # (a dynamic extent's may not fit 32 bits)
            short = Var(self.fresh("n32").name, I32)
            stride = 1
            for ax, ext in reversed(list(zip(axes, extents))):
                digit: Expr = short if stride == 1 else Binary("floordiv", short, Const(stride, I32), I32)
                if ax is not axes[0]:
                    digit = Binary("mod", digit, Const(ext, I32), I32)
                body = Let(ax.var, cast(digit, I64), body)
                stride *= ext
            return Let(short, cast(flat, I32), body)
        return narrowed

    def thread_coords(self, tid: Var) -> tuple[Expr, Expr]:
        """(ty, tx): the thread's place in the block, as the products and the epilogue use it."""
        return div_index(tid, SIDE), mod_index(tid, SIDE)

    def local_buffers(self) -> tuple[Buffer, ...]:
        """The kernel's shared and register buffers, innermost first."""
        stages = (self.yst, self.xst) if self.double_buffered else ()
        return (*stages, self.yr, self.xr, self.acct, self.ys, self.xs)

    def _allocate(self, body: Stmt) -> Stmt:
        for buf in self.local_buffers():
            body = Allocate(buf, body)
        return body

    def _tile_loops(self, body_fn) -> Stmt:
        a, b = self.fresh("ta"), self.fresh("tb")
        return For(a, Const(self.tm, I64), For(b, Const(self.tn, I64), body_fn(a, b), "unroll"), "unroll")

    def _init(self) -> Stmt:
        return self._tile_loops(lambda a, b: Store(self.acct.name, (a, b), self.c.init))

    def _main_loop(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        """Per k-step: fill, barrier, products, barrier; or, ``double_buffered``, while the products of
        step ``kt`` read one slot of the shared tiles, the next step's operands come from global
        memory into registers, then go to the other slot, with one barrier per step."""
        kt = self.fresh("kt")
        steps = self.k_steps()
        if not self.double_buffered:
            fill = self.fills(tid, tm0, tn0, self.k_start(mul_index(kt, self.bk)), Const(0, I64))[0]
            products = self._products(ty, tx, Const(0, I64))
            return For(kt, as_expr(steps), seq(fill, Barrier(), products, Barrier()))
        first = self.fills(tid, tm0, tn0, self.k_start(Const(0, I64)), Const(0, I64))
        if steps == 1:
            return seq(*first, Barrier(), self._products(ty, tx, Const(0, I64)))
        products = self._products(ty, tx, mod_index(kt, 2))
        loads, stores = self.fills(tid, tm0, tn0, self.k_start(mul_index(add_index(kt, Const(1, I64)), self.bk)),
                                   mod_index(add_index(kt, Const(1, I64)), 2))
        more = Binary("lt", add_index(kt, Const(1, I64)), as_expr(steps), dtypes.boolean)
        step = seq(If(more, loads), products, If(more, stores), Barrier())
        return seq(*first, Barrier(), For(kt, as_expr(steps), step))

    def k_steps(self) -> Size:
        """The k-steps of one block: the whole reduction (a split-K block walks only its chunk)."""
        return ceil_div(self.k, self.bk)

    def k_start(self, k0: Expr) -> Expr:
        """The flat reduction index where a k-step starting ``k0`` into the block's range begins."""
        return k0

    def k_covered(self) -> bool:
        """Whether every k-step of every block lies wholly inside the reduction (no guard on it)."""
        return _divides(self.bk, self.k)

    def fills(self, tid: Var, tm0: Var, tn0: Var, k0: Expr, slot: Expr) -> tuple[Stmt, Stmt]:
        """Both operands' tiles of one k-step: (global to registers, registers to shared ``slot``)."""
        x = self._fill(self.xs, self.xst, self.c.x, self.c.m_axes, self.m, tid, tm0, k0, slot)
        y = self._fill(self.ys, self.yst, self.c.y, self.c.n_axes, self.n, tid, tn0, k0, slot)
        return seq(x[0], y[0]), seq(x[1], y[1])

    def _fill(self, buf: Buffer, stage: Buffer, value: Expr, axes: list[For], size: Size, tid: Var, base: Var,
              k0: Expr, slot: Expr) -> tuple[Stmt, Stmt]:
        """The threads read ``value`` over a ``BK x tile`` slice into their registers ``stage``
        (zeros outside the problem), then store those to ``buf[slot]``, which is ``[BK][tile]``,
        or ``[tile][BK]`` with ``k_inner``."""
        tile = buf.shape[1] if self.k_inner else buf.shape[2] - PAD
        k_fast = _k_fastest(value, axes, self.c.k_axes)
        fast_n = self.bk if k_fast else tile
        steps = self.bk * tile // THREADS

        def indexed(make) -> Stmt:
            step, lid, kk, ss = self.fresh("ld"), self.fresh("lid"), self.fresh("kk"), self.fresh("ss")
            fast, slow = (kk, ss) if k_fast else (ss, kk)
            if THREADS % fast_n == 0:  # lid = step * THREADS + tid, tid < THREADS: the fast digit is
                # the thread's own, the same at every step and k-tile (its index arithmetic hoists)
                body = Let(fast, mod_index(tid, fast_n), Let(slow, add_index(mul_index(step, THREADS // fast_n),
                                                                   div_index(tid, fast_n)), make(step, kk, ss)))
                return For(step, Const(steps, I64), body, "unroll")
            body = Let(fast, mod_index(lid, fast_n), Let(slow, div_index(lid, fast_n), make(step, kk, ss)))
            return For(step, Const(steps, I64), Let(lid, add_index(mul_index(step, THREADS), tid), body), "unroll")

        def load(step: Var, kk: Var, ss: Var) -> Stmt:
            gs, gk = self.fresh("gs"), self.fresh("gk")
            if self.double_buffered:
                name, where = stage.name, (step,)
            else:  # straight to shared memory
                name, where = buf.name, (slot, ss, kk) if self.k_inner else (slot, kk, ss)
            target = Store(name, where, value)
            compute = self._k_digits(k0, kk, gk, self.decompose(axes, [_const(f) for f in axes], gs, target))
            cond = _in_range([(gs, size, _divides(tile, size)), (gk, self.k, self.k_covered())])
            guarded = compute if cond is None else If(cond, compute, Store(name, where, Const(0, stage.dtype)))
            return Let(gs, add_index(base, ss), Let(gk, add_index(k0, kk), guarded))

        def store(step: Var, kk: Var, ss: Var) -> Stmt:
            where = (slot, ss, kk) if self.k_inner else (slot, kk, ss)
            return Store(buf.name, where, Load(stage.name, (step,), stage.dtype))
        return indexed(load), indexed(store)

    def _k_digits(self, k0: Expr, kk: Var, gk: Var, body: Stmt) -> Stmt:
        """``body`` with the reduction axes bound to their digits of ``gk = k0 + kk``. When BK steps
        divide the innermost axis, a k-step spans one value of the others: those come from the
        step's start ``k0`` (once per step, shared by all of a thread's elements) and the
        innermost one is ``k0 % E + kk`` (no division per element)."""
        extents = [_const(f) for f in self.k_axes]
        if len(extents) > 1 and _divides(self.bk, extents[-1]):
            inner = Let(self.k_axes[-1].var, add_index(mod_index(k0, extents[-1]), kk), body)
            return self.decompose(self.k_axes[:-1], extents[:-1], div_index(k0, extents[-1]), inner)
        return self.decompose(self.k_axes, extents, gk, body)

    def _products(self, ty: Var, tx: Var, slot: Expr) -> Stmt:
        kk, a, b = self.fresh("kk"), self.fresh("ra"), self.fresh("rb")
        load_x = For(a, Const(self.tm, I64), Store(self.xr.name, (a,), Load(self.xs.name, (
            slot, kk, _owned(ty, a, self.tm)), self.xs.dtype)), "unroll")
        load_y = For(b, Const(self.tn, I64), Store(self.yr.name, (b,), Load(self.ys.name, (
            slot, kk, _owned(tx, b, self.tn)), self.ys.dtype)), "unroll")
        mul = self.c.add.b

        def update(i: Var, j: Var) -> Stmt:
            prod = Binary("mul", Load(self.xr.name, (i,), self.xr.dtype), Load(self.yr.name, (j,), self.yr.dtype),
                          mul.dtype)
            acc = Load(self.acct.name, (i, j), self.acct.dtype)
            return Store(self.acct.name, (i, j), Binary("add", acc, prod, self.c.add.dtype))
        return For(kk, Const(self.bk, I64), seq(load_x, load_y, self._tile_loops(update)), "unroll")

    def _epilogue(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        c = self.c
        gm, gn = self.fresh("gm"), self.fresh("gn")

        def store(a: Var, b: Var) -> Stmt:
            body = self.result(Load(self.acct.name, (a, b), self.acct.dtype))
            body = self.decompose(c.n_axes, [_const(f) for f in c.n_axes], gn, body)
            body = self.decompose(c.m_axes, [_const(f) for f in c.m_axes], gm, body)
            cond = _in_range([(gm, self.m, _divides(self.bm, self.m)), (gn, self.n, _divides(self.bn, self.n))])
            if cond is not None:
                body = If(cond, body)
            row, col = add_index(tm0, _owned(ty, a, self.tm)), add_index(tn0, _owned(tx, b, self.tn))
            return Let(gm, row, Let(gn, col, body))
        return self._tile_loops(store)


    def result(self, acc: Expr) -> Stmt:
        """The store of one accumulated element ``acc``: the nest's final store (its epilogue)."""
        c = self.c
        value = transform(c.final.value, lambda e: acc if _is_acc(e, c.acc) else None)
        return Store(c.final.buffer, c.final.indices, value, c.final.span)


def _owned(t: Var, i: Var, count: int) -> Expr:
    """The tile row (or column) of a thread's ``i``-th register, for thread coordinate ``t``: runs
    of ``RUN`` consecutive rows, the runs ``SIDE * RUN`` apart (``i`` is an unrolled loop, so the
    run's reads of shared memory merge into one 16-byte load); single rows ``SIDE`` apart where
    ``count`` is not a multiple of ``RUN``."""
    run = RUN if count % RUN == 0 else 1
    if run == 1:
        return add_index(t, mul_index(i, SIDE))
    return add_index(add_index(mul_index(div_index(i, run), SIDE * run), mul_index(t, run)), mod_index(i, run))


def _check_window(c: Contraction) -> None:
    """Refuse a dynamic extent on a reduction axis after the first (a convolution's window
    ``KH``, ``KW``): every element a thread fills divides its reduction index by it at run
    time, and NVRTC took minutes over those divisions in the unrolled fills. A dynamic batch,
    image or channel count is fine."""
    inner = [f for f in c.k_axes[1:] if not isinstance(size_of(f), int)]
    if inner:
        raise TccCompileError(f"a tiled GEMM on the GPU cannot take a dynamic extent ({inner[0].extent}) on a "
                              "reduction axis after the first (a convolution's window)", c.final.span,
                              "leave the window's shape symbols out of dynamic= (they stay specialised)")


def _k_order(k_axes: list[For], bk: int) -> list[For]:
    """The reduction axes in the order a k-step walks them: the longest one whose extent BK divides
    goes innermost (a convolution's channels rather than its 3-wide window), so that a step spans
    one value of the others (see ``Builder._k_digits``). The sum is the same; only the order of
    its additions changes."""
    fitting = [f for f in k_axes if _divides(bk, _const(f))]
    if len(k_axes) < 2 or not fitting:
        return list(k_axes)
    inner = max(fitting, key=lambda f: hint(_const(f)))
    return [f for f in k_axes if f is not inner] + [inner]


def _k_fastest(value: Expr, axes: list[For], k_axes: list[For]) -> bool:
    """Whether ``value``'s main read is contiguous along the reduction rather than the tile's axis."""
    load = next((n for n in walk(value) if isinstance(n, Load)), None)
    if load is None or not load.indices:
        return False
    last = free_vars(load.indices[-1])
    return axes[-1].var.name not in last and any(k.var.name in last for k in k_axes)


def _divides(tile: int, size: Size) -> bool:
    """Whether tiles of ``tile`` cover ``size`` exactly (never known of a dynamic size: its tail
    is masked)."""
    return isinstance(size, int) and size % tile == 0


def div_size(e: Expr, d: Size) -> Expr:
    """``e // d`` for a size ``d`` (an expression where dynamic)."""
    return e if d == 1 else Binary("floordiv", e, as_expr(d), I64)


def mod_size(e: Expr, d: Size) -> Expr:
    """``e % d`` for a size ``d`` (an expression where dynamic)."""
    return Const(0, I64) if d == 1 else Binary("mod", e, as_expr(d), I64)


def _in_range(checks: list[tuple[Var, Size, bool]]) -> Expr | None:
    cond = None
    for var, size, covered in checks:
        if covered:
            continue
        test = Binary("lt", var, as_expr(size), dtypes.boolean)
        cond = test if cond is None else Binary("and", cond, test, dtypes.boolean)
    return cond
