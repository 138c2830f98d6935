"""Hopper GEMMs: the tensor-core contraction of :mod:`.tensorcore` on ``wgmma``.

Where the copy-engine layout fits (:func:`tensorcore.fast_layout`) and the chip is sm_90, each
block of two warpgroups (256 threads) computes a ``128 x BN`` tile, each warpgroup a ``64 x BN``
piece through ``wgmma.m64nBNk16`` reading both operands straight from shared memory. The tiles
are 128-byte swizzled (``Buffer.swizzle``: the layout the descriptors describe, free of bank
conflicts), ``BK = 64`` halves deep (one swizzle atom per row), in ``STAGES`` slots.

Every thread both copies and multiplies. Per k-step ``kt``: wait for this thread's copies of
tile ``kt``, make them visible to the matrix units (``fence.proxy.async``), block barrier; copy
tile ``kt + STAGES - 2`` into the slot tile ``kt - 2`` used (its products finished before the
barrier: each warpgroup waits until only its latest group is in flight), then issue tile
``kt``'s products. (A producer warpgroup handing slots over through mbarriers, with
``setmaxnreg``, measured slower on an H100: 0.41 of cuBLAS against 0.65, and is not kept.)

Everything here is loop IR: the copies, fences, barriers and waits are statements, and the
products are the plain warpgroup nest that :mod:`tcc.passes.loops.tensorize` turns into
``WarpgroupMma``.
"""

from __future__ import annotations

from tcc import dtypes
from tcc.ir.expr import Binary, Cast, Const, Expr, Load, Var
from tcc.ir.loopnest import add_index, div_index, mod_index, mul_index
from tcc.ir.loops import (
    AsyncCommit,
    AsyncWait,
    Barrier,
    Buffer,
    For,
    If,
    ProxyFence,
    Stmt,
    Store,
    WarpgroupSync,
    seq,
)
from tcc.passes.autoschedule_cuda import gemm, staged_stores, tensorcore
from tcc.passes.autoschedule_cuda.indexing import hint, size_of
from tcc.target import CudaTarget

I64 = dtypes.i64
F32 = dtypes.f32
BK = 64  # halves: one 128-byte swizzle atom per row
STAGES = 4
TILES = ((128, 256, BK), (128, 128, BK))
WARPGROUP = 128
SLOTS = 3  # of the register-staged kernel
MIN_SIDE = 128  # smaller problems stay on mma.sync (a mostly empty 128-row tile wastes the block)


def fits(c: gemm.Contraction, target: CudaTarget) -> bool:
    """Whether the warpgroup kernel suits ``c`` on ``target`` (the caller has checked the layout;
    the builder checks that a tile fits the target's budgets)."""
    return target.warpgroup_mma and isinstance(c.size(c.k_axes), int) and all(isinstance(size_of(f), int)
                                                                               for f in c.batch_axes) \
        and hint(c.size(c.m_axes)) >= MIN_SIDE and hint(c.size(c.n_axes)) >= MIN_SIDE


class Builder(tensorcore.Builder):
    """The copy-engine tensor-core kernel on warpgroups (``wgmma``)."""

    tiles = TILES
    # STAGES slots where they fit, else 3 (the fewest the loop below keeps one copy ahead with)
    stage_options = (STAGES, 3)
    group_rows = 8

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Expr, Expr],
                 fast: tensorcore.FastLayout | None, target: CudaTarget, stores: staged_stores.Plan | None = None):
        super().__init__(c, fresh, decompose, values, fast, target, stores)
        self.wm, self.wn = WARPGROUP // 2, self.bn  # two warpgroups over the tile's rows
        self.acct = Buffer(self.acct.name, F32, (self.wm, self.wn), "local")

    def shared_tiles(self, tile: tuple[int, int, int], depth: int, x: str, y: str) -> tuple[Buffer, Buffer]:
        """128-byte swizzled ``[slot][tile][BK]`` tiles (``[slot][BK][BN]`` for a ``y`` read along N)."""
        bm, bn, bk = tile
        half = self.xv.dtype
        y_rows = self.fast is not None and not self.fast.k_fast
        return (Buffer(x, half, (depth, bm, bk), "shared", 128),
                Buffer(y, half, (depth, bk, bn) if y_rows else (depth, bn, bk), "shared", 128))

    def thread_coords(self, tid: Var) -> tuple[Expr, Expr]:
        return div_index(tid, WARPGROUP), mod_index(tid, WARPGROUP)  # (warpgroup, its lane)

    def _warp_origin(self, ty: Var) -> tuple[Expr, Expr]:
        return mul_index(ty, self.wm), Const(0, I64)

    def _main_loop(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        kt, s = self.fresh("kt"), self.fresh("st")
        steps = -(-self.k // self.bk)
        ahead = self.stages - 2
        first = For(s, Const(ahead, I64), seq(self._copies_if(tid, tm0, tn0, s, steps), AsyncCommit()), "unroll")
        nxt = add_index(kt, Const(ahead, I64))
        step = seq(AsyncWait(ahead - 1), ProxyFence(), Barrier(), self._products(ty, tx, mod_index(kt, self.stages)),
                   self._copies_if(tid, tm0, tn0, nxt, steps), AsyncCommit(), WarpgroupSync("wait", 1))
        return seq(first, For(kt, Const(steps, I64), step), WarpgroupSync("wait", 0))

    def _copies_if(self, tid: Var, tm0: Var, tn0: Var, tile: Expr, steps: int) -> Stmt:
        """The copies of k-step ``tile`` into its slot, when there is such a step."""
        copies = self._copies(tid, tm0, tn0, mul_index(tile, self.bk), mod_index(tile, self.stages))
        return If(Binary("lt", tile, Const(steps, I64), dtypes.boolean), copies)

    def _products(self, ty: Var, tx: Var, slot: Expr) -> Stmt:
        wr, _ = self._warp_origin(ty)
        i, j, k = self.fresh("wi"), self.fresh("wj"), self.fresh("wk")
        half = self.xs.dtype
        x: Expr = Load(self.xs.name, (slot, add_index(wr, i), k), half)
        y: Expr = Load(self.ys.name, (slot, j, k) if self.ys.shape[1] == self.bn else (slot, k, j), half)
        if half != F32:  # 16-bit operands widened; f32 ones are read as TF32 by the instruction
            x, y = Cast(x, F32), Cast(y, F32)
        acc = Load(self.acct.name, (i, j), F32)
        update = Store(self.acct.name, (i, j), Binary("add", acc, Binary("mul", x, y, F32), F32))
        what = "wgmma.tf32" if half == F32 else "wgmma"
        return For(i, Const(self.wm, I64), For(j, Const(self.wn, I64), For(k, Const(self.bk, I64), update)),
                   annotations=(("tensorize", what), ("lane", tx)))


class Tf32Builder(Builder):
    """The copy-engine warpgroup kernel on f32 operands read as TF32: 32 floats make a row's
    128-byte swizzle atom. Both operands must be K-major (a ``[k][n]`` one is transposed first:
    :mod:`.transpose`)."""

    tiles = ((128, 256, 32), (128, 128, 32))


class StagedBuilder(Builder):
    """The TF32 warpgroup kernel where :class:`Tf32Builder` does not run (misaligned pointers,
    rows not in whole 16-byte pieces): descriptors must be K-major, so a ``[k][n]`` operand is
    transposed on its way through registers. The threads load the next k-step's tiles into
    registers while the matrix units multiply this one, then store them into the other slot of
    the swizzled tiles (on an H100 0.27 of cuBLAS TF32, against 0.75-0.79 for the other)."""

    tiles = ((128, 128, 32),)  # f32: 32 elements make the 128-byte atom
    stage_options = (SLOTS,)

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Expr, Expr], target: CudaTarget):
        super().__init__(c, fresh, decompose, values, None, target)

    def _main_loop(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        """Three slots: tile ``kt + 1`` goes to the slot tile ``kt - 2`` used (done: each warpgroup
        waits until only its latest products are in flight, before the barrier), so the products
        of ``kt`` run on while the threads store."""
        kt = self.fresh("kt")
        steps = -(-self.k // self.bk)
        zero, one = Const(0, I64), Const(1, I64)
        first = self.fills(tid, tm0, tn0, zero, zero)
        nxt = add_index(kt, one)
        more = Binary("lt", nxt, Const(steps, I64), dtypes.boolean)
        loads, stores = self.fills(tid, tm0, tn0, mul_index(nxt, self.bk), mod_index(nxt, self.stages))
        step = seq(If(more, loads), self._products(ty, tx, mod_index(kt, self.stages)), WarpgroupSync("wait", 1),
                   If(more, stores), ProxyFence(), Barrier())
        return seq(*first, ProxyFence(), Barrier(), For(kt, Const(steps, I64), step), WarpgroupSync("wait", 0))
