"""Tensor-core GEMMs: contractions of f16, bf16 or 8-bit float operands, accumulated in f32.

A contraction qualifies (see :func:`operands`) when both factors are 16-bit floats of one type
widened to f32 (``sum[k](f32(A[i, k]) * f32(B[k, j]))``), or 8-bit floats of one format (FP8:
``f8e4m3``, ``f8e5m2``): their products are exact in f32, so the result is the f32 sum. A scaled
FP8 GEMM, ``f16(sa * sb * sum[k](f32(A[i, k]) * f32(B[j, k])))``, is such a contraction whose
epilogue applies the scales to the accumulator tile in registers. A sum written over f16 or
bf16 tensors (``sum[k](A[i, k] * B[k, j])``) rounds every product to 16 bits before adding in
f32, which tensor cores cannot reproduce; it stays on the FMA path.

The kernel keeps the tiled GEMM's structure (:mod:`tcc.passes.autoschedule_cuda.gemm`): 256 threads fill
``BM x BK`` and ``BN x BK`` tiles of the 16-bit operands in shared memory (the reduction index
innermost, zeros outside the problem, so odd sizes need no other path). The products are
written as plain loops over each warp's ``BM/2 x BN/4`` piece of the tile, marked for
:mod:`tcc.passes.loops.tensorize`, which turns them into ``ldmatrix`` fragment loads and
``mma.sync.m16n8k16`` statements of the loop IR and the accumulator and epilogue into the
lanes' fragments. A row of ``BK + 8`` halves keeps the fragment loads conflict-free.

**The copy-engine kernel.** Where each operand is one tensor read with unit stride along the
reduction (``A[.., i, k]``) or, for ``y``, along ``N`` (``B[.., k, j]``), with every row 16-byte
aligned (:func:`fast_layout`), the fills are ``AsyncCopy`` statements (16-byte ``cp.async``
straight from global to shared memory, zero-filled outside the problem), two stages so the next
tile's copy overlaps this tile's products. It assumes 16-byte aligned base pointers; the
launcher checks them and runs the register-staged kernel (scheduled right after it) when they
are not.

**FP8.** The matrix units read 8-bit operands K-major only (``mma.sync.m16n8k32`` fragments from
a non-transposing ``ldmatrix``, ``wgmma`` without its transpose bits), so the copy-engine kernel
takes them only with ``y`` contiguous along the reduction (``B[n, k]``); the register-staged
kernel stores both tiles K-major whatever the layout. Tiles are twice as deep in elements (the
same bytes per row: BK = 64 for ``mma.sync``, 128 for ``wgmma``), and everything else (fills,
swizzle, descriptors, fragments) is the 16-bit kernel's, byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.ir.expr import Binary, Cast, Const, Expr, Load, Var, cast, substitute, transform
from tcc.ir.loopnest import add_index, div_index, mod_index, mul_index
from tcc.ir.loops import AsyncCommit, AsyncCopy, AsyncWait, Barrier, Buffer, For, If, Let, Stmt, Store, seq
from tcc.passes.autoschedule_cuda import gemm, staged_stores
from tcc.passes.autoschedule_cuda.indexing import Size, as_expr, ceil_div, product
from tcc.passes.loops.tensorize import tensorize
from tcc.target import CudaTarget

I64 = dtypes.i64
I32 = dtypes.i32
F32 = dtypes.f32
BK = 32
WARPS_M, WARPS_N = 2, 4  # the 8 warps of a block, as a grid over its tile
TILES = ((128, 128, BK), (128, 64, BK), (64, 128, BK), (64, 64, BK))
MATRIX_TYPES = ("f16", "bf16", "f8e4m3", "f8e5m2")  # operand types the matrix units multiply exactly in f32


def chunk(dtype) -> int:
    """Elements of ``dtype`` per 16-byte copy (8 halves, 4 floats)."""
    return 16 // dtype.itemsize


@dataclass(frozen=True)
class FastLayout:
    """How the copy-engine kernel reads its operands: x along the reduction, y along it or along N."""

    k_fast: bool  # y contiguous along k (an [n][k] tile) rather than along n (a [k][n] tile)
    narrow: bool = False  # both operands have fewer than 2^31 elements: copy indices in 32 bits


def fast_layout(c: gemm.Contraction, values: tuple[Expr, Expr],
                shapes: dict[str, tuple[int, ...]]) -> FastLayout | None:
    """The copy-engine layout of ``c``'s operands, or None when its loads do not fit it."""
    if len(c.m_axes) != 1 or len(c.n_axes) != 1 or len(c.k_axes) != 1:
        return None
    m, n, k = c.m_axes[0].var, c.n_axes[0].var, c.k_axes[0].var
    batch = {f.var.name for f in c.batch_axes}
    step = chunk(values[0].dtype)
    x = _strides(values[0], shapes, m, k, batch, step)
    y = _strides(values[1], shapes, n, k, batch, step)
    size_k, size_n = c.size(c.k_axes), c.size(c.n_axes)
    if x is None or y is None or x[1] != 1 or not gemm._divides(step, size_k):
        return None
    k_fast = y[1] == 1
    if not k_fast and values[1].dtype.is_fp8:
        return None  # 8-bit operands are read K-major only
    if not k_fast and (y[0] != 1 or not gemm._divides(step, size_n)):
        return None  # y must be contiguous along k, or along n in whole 16-byte pieces
    # (a dynamic shape's elements may pass 2^31)
    narrow = all(all(isinstance(d, int) for d in shapes[v.buffer]) and math.prod(shapes[v.buffer]) < 2**31
                 for v in values if isinstance(v, Load))
    return FastLayout(k_fast, narrow)


def _strides(value: Expr, shapes: dict[str, tuple[int, ...]], row: Var, k: Var,
             batch: set[str], step: int) -> tuple[int, int] | None:
    """(stride of ``row``, stride of ``k``) for a plain read ``T[..]`` indexed by bare loop
    variables, every stride but 1 a multiple of ``step`` elements (16 bytes)."""
    if not isinstance(value, Load) or value.buffer not in shapes:
        return None
    shape = shapes[value.buffer]
    names = [i.name if isinstance(i, Var) else None for i in value.indices]
    if None in names or len(set(names)) != len(names) or len(shape) != len(names):
        return None
    strides: list[Size] = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = product([strides[d + 1], shape[d + 1]])
    if not all(isinstance(s, int) for s in strides):
        return None  # a row stride of a dynamic shape symbol: its rows' alignment is not known
    where = {name: s for name, s in zip(names, strides)}
    if row.name not in where or k.name not in where or any(
            name not in batch | {row.name, k.name} for name in names):
        return None
    if any(s % step for s in strides if s != 1):
        return None
    return where[row.name], where[k.name]


def operands(c: gemm.Contraction) -> tuple[Expr, Expr] | None:
    """The 16- or 8-bit values whose products ``c`` sums, when tensor cores can compute it."""
    if c.acc.dtype != F32 or c.add.b.dtype != F32:
        return None
    x, y = _widened(c.x), _widened(c.y)
    return (x, y) if x is not None and y is not None and x.dtype == y.dtype else None


def _narrowed(e: Expr, dtype) -> Expr:
    """``a + b`` in ``dtype``: a 64-bit operand is cast, a ``dtype`` one kept."""
    assert isinstance(e, Binary) and e.op == "add"
    return Binary("add", cast(e.a, dtype), cast(e.b, dtype), dtype)


def tf32_operands(c: gemm.Contraction) -> tuple[Expr, Expr] | None:
    """The f32 factors of ``c``, for TF32 tensor cores (which the caller opted into: they round
    each operand to 10 mantissa bits before multiplying)."""
    if c.acc.dtype != F32 or c.add.b.dtype != F32 or c.x.dtype != F32 or c.y.dtype != F32:
        return None
    return c.x, c.y


def _widened(e: Expr) -> Expr | None:
    if isinstance(e, Cast) and e.dtype == F32 and e.a.dtype.name in MATRIX_TYPES:
        return e.a
    return None


class Builder(gemm.Builder):
    """A :class:`gemm.Builder` whose products run on tensor cores."""

    tiles = TILES
    stage_options = (2,)  # the copy engine fills one slot while the warps multiply the other
    resident = False  # (its tiles are sized by the registers of one block, not FMA_REGISTERS)

    def __init__(self, c: gemm.Contraction, fresh, decompose, values: tuple[Expr, Expr],
                 fast: FastLayout | None, target: CudaTarget, stores: staged_stores.Plan | None = None):
        self.xv, self.yv = values  # (the shared tiles' type: set before the tile is chosen)
        self.fast = fast
        if self.xv.dtype.is_fp8:  # the same bytes per tile row: twice the elements
            self.tiles = tuple((bm, bn, 2 * bk) for bm, bn, bk in self.tiles)
        super().__init__(c, fresh, decompose, target)
        half = self.xv.dtype  # f16, bf16 or an 8-bit float; f32 for TF32
        self.wm, self.wn = self.bm // WARPS_M, self.bn // WARPS_N
        self.k_inner = True  # shared tiles are [slot][tile][BK + pad] (but [slot][BK][BN + pad] for a
        # copy-engine y read along N)
        self.xst = Buffer(self.xst.name, half, self.xst.shape, "local")
        self.yst = Buffer(self.yst.name, half, self.yst.shape, "local")
        self.acct = Buffer(self.acct.name, F32, (self.wm, self.wn), "local")
        # the result through shared memory, or in column pairs (the copy-engine kernel only: its
        # pointers are aligned)
        self.stores = stores if fast is not None else None
        self.staged = self.stores is not None and self.stores.staged and staged_stores.fits(self.stores, self)

    def shared_tiles(self, tile: tuple[int, int, int], depth: int, x: str, y: str) -> tuple[Buffer, Buffer]:
        """``[slot][tile][BK + pad]`` of the 16-bit (or TF32) operands, 16 bytes added to each row
        so that the fragment loads stay conflict-free; ``[slot][BK][BN + pad]`` for a copy-engine
        ``y`` read along N."""
        bm, bn, bk = tile
        half = self.xv.dtype
        pad = chunk(half)
        y_rows = self.fast is not None and not self.fast.k_fast
        return (Buffer(x, half, (depth, bm, bk + pad), "shared"),
                Buffer(y, half, (depth, bk, bn + pad) if y_rows else (depth, bn, bk + pad), "shared"))

    def local_buffers(self) -> tuple[Buffer, ...]:
        if self.fast is not None:  # copies go straight to shared memory
            return (self.acct, self.ys, self.xs)
        return (self.yst, self.xst, self.acct, self.ys, self.xs)

    def kernel(self) -> Stmt:
        k = tensorize(super().kernel(), self.fresh)
        return k if self.fast is None else replace(k, annotations=(("aligned", True),))

    def _main_loop(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        """With the copy engine: step ``kt`` copies tile ``kt + 1`` into the other slot while the
        warps multiply tile ``kt`` (each thread waits for its own copies, then a barrier)."""
        if self.fast is None:
            return super()._main_loop(tid, ty, tx, tm0, tn0)
        kt = self.fresh("kt")
        steps = as_expr(ceil_div(self.k, self.bk))
        one = Const(1, I64)
        nxt = add_index(kt, one)
        more = Binary("lt", nxt, steps, dtypes.boolean)
        ahead = seq(self._copies(tid, tm0, tn0, mul_index(nxt, self.bk), mod_index(nxt, self.stages)),
                    AsyncCommit(), AsyncWait(1))
        step = seq(If(more, ahead, AsyncWait(0)), Barrier(), self._products(ty, tx, mod_index(kt, self.stages)),
                   Barrier())
        zero = Const(0, I64)
        return seq(self._copies(tid, tm0, tn0, zero, zero), AsyncCommit(), For(kt, steps, step))

    def _copies(self, tid: Var, tm0: Var, tn0: Var, k0: Expr, slot: Expr) -> Stmt:
        """16-byte copies of both operands' tiles at reduction offset ``k0`` into ``slot``."""
        c = self.c
        m, n, k = c.m_axes[0].var, c.n_axes[0].var, c.k_axes[0].var
        x = self._copy_tile(self.xs, self.xv, m, k, tm0, k0, self.m, tid, slot, k_rows=False)
        y = self._copy_tile(self.ys, self.yv, n, k, tn0, k0, self.n, tid, slot, k_rows=not self.fast.k_fast)
        return seq(x, y)

    def _copy_tile(self, buf: Buffer, value: Expr, row: Var, k: Var, base: Var, k0: Expr, size: Size, tid: Var,
                   slot: Expr, k_rows: bool) -> Stmt:
        """``buf[slot]`` (rows of ``row``, or of ``k`` when ``k_rows``) from ``value``, 8 halves a copy.
        A thread copies the same columns of rows a fixed stride apart, so per k-step its copies
        cost an address increment each; edges are tested only where the problem has them."""
        step_n = chunk(buf.dtype)
        rows, width = buf.shape[1], buf.shape[2] - (0 if buf.swizzle else step_n)
        per_row = width // step_n
        threads = gemm.THREADS
        assert threads % per_row == 0, "a tile row wider than the copying threads"
        index = I32 if self.fast is not None and self.fast.narrow else I64  # a 64-bit op costs two
        step = self.fresh("cp")
        r, col, gr, gk = (Var(self.fresh(s).name, index) for s in ("cr", "cc", "gr", "gk"))
        if k_rows:  # rows are k, columns the tile's n
            where = {k.name: gk, row.name: gr}
            g_row, g_col = (gk, add_index(k0, r)), (gr, add_index(base, col))
        else:
            where = {row.name: gr, k.name: gk}
            g_row, g_col = (gr, add_index(base, r)), (gk, add_index(k0, col))
        src = substitute(value, where)
        assert isinstance(src, Load)
        k_extent = rows if k_rows else width
        valid = None
        for var, bound, covered in ((gr, size, gemm._divides(width if k_rows else rows, size)),
                                    (gk, self.k, gemm._divides(k_extent, self.k))):
            if not covered:  # (a dynamic size is always tested: the last tile's tail)
                test = Binary("lt", var, cast(as_expr(bound), index), dtypes.boolean)
                valid = test if valid is None else Binary("and", valid, test, dtypes.boolean)
        copy = AsyncCopy(Load(buf.name, (slot, r, col), buf.dtype), src, 16, valid)
        body = Let(r, cast(add_index(mul_index(step, threads // per_row), div_index(tid, per_row)), index),
                   Let(col, cast(mul_index(mod_index(tid, per_row), step_n), index),
                       Let(g_row[0], _narrowed(g_row[1], index), Let(g_col[0], _narrowed(g_col[1], index), copy))))
        return For(step, Const(rows * per_row // threads, I64), body, "unroll")

    def _init(self) -> Stmt:
        return self._warp_tile(lambda a, b: Store(self.acct.name, (a, b), self.c.init))

    def _warp_tile(self, body_fn, columns: str = "serial") -> Stmt:
        """``for a in 0..WM: for b in 0..WN``: a nest over the warp's accumulator tile (every lane
        runs all of it until tensorize shares the elements out; ``columns="vector"``: as pairs)."""
        a, b = self.fresh("wa"), self.fresh("wb")
        return For(a, Const(self.wm, I64), For(b, Const(self.wn, I64), body_fn(a, b), columns))

    def fills(self, tid: Var, tm0: Var, tn0: Var, k0: Expr, slot: Expr) -> tuple[Stmt, Stmt]:
        x = self._fill(self.xs, self.xst, self.xv, self.c.m_axes, self.m, tid, tm0, k0, slot)
        y = self._fill(self.ys, self.yst, self.yv, self.c.n_axes, self.n, tid, tn0, k0, slot)
        return seq(x[0], y[0]), seq(x[1], y[1])

    def _products(self, ty: Var, tx: Var, slot: Expr) -> Stmt:
        """The warp's piece of the tile product as plain loops, marked for tensorize (``ty``: the
        warp, ``tx``: its lane)."""
        wr, wc = self._warp_origin(ty)
        i, j, k = self.fresh("wi"), self.fresh("wj"), self.fresh("wk")
        half = self.xs.dtype
        x: Expr = Load(self.xs.name, (slot, add_index(wr, i), k), half)
        ys_index = (slot, k, add_index(wc, j)) if self.ys.shape[1] == self.bk and self.fast is not None \
            and not self.fast.k_fast else (slot, add_index(wc, j), k)
        y: Expr = Load(self.ys.name, ys_index, half)
        if half != F32:  # 16-bit operands widened; f32 ones are rounded to TF32 by the instruction
            x, y = Cast(x, F32), Cast(y, F32)
        acc = Load(self.acct.name, (i, j), F32)
        update = Store(self.acct.name, (i, j), Binary("add", acc, Binary("mul", x, y, F32), F32))
        what = "mma.sync.tf32" if half == F32 else "mma.sync"
        return For(i, Const(self.wm, I64), For(j, Const(self.wn, I64), For(k, Const(self.bk, I64), update)),
                   annotations=(("tensorize", what), ("lane", tx)))

    def _warp_origin(self, ty: Var) -> tuple[Expr, Expr]:
        return (mul_index(div_index(ty, WARPS_N), self.wm), mul_index(mod_index(ty, WARPS_N), self.wn))

    def thread_coords(self, tid: Var) -> tuple[Expr, Expr]:
        return div_index(tid, 32), mod_index(tid, 32)  # (warp, lane)

    def _epilogue(self, tid: Var, ty: Var, tx: Var, tm0: Var, tn0: Var) -> Stmt:
        if self.stores is not None and self.staged:
            return staged_stores.epilogue(self.stores, self, tid, ty, tm0, tn0)
        c = self.c
        gm, gn = self.fresh("gm"), self.fresh("gn")
        wr, wc = self._warp_origin(ty)

        def store(a: Var, b: Var) -> Stmt:
            acc = Load(self.acct.name, (a, b), F32)
            value = transform(c.final.value, lambda x: acc if gemm._is_acc(x, c.acc) else None)
            body: Stmt = Store(c.final.buffer, c.final.indices, value, c.final.span)
            body = self.decompose(c.n_axes, [gemm._const(f) for f in c.n_axes], gn, body)
            body = self.decompose(c.m_axes, [gemm._const(f) for f in c.m_axes], gm, body)
            cond = gemm._in_range([(gm, self.m, gemm._divides(self.bm, self.m)),
                                   (gn, self.n, gemm._divides(self.bn, self.n))])
            if cond is not None:
                body = If(cond, body)
            return Let(gm, add_index(tm0, add_index(wr, a)), Let(gn, add_index(tn0, add_index(wc, b)), body))
        pairs = self.stores is not None and self.stores.pairs  # (the guard is the same for both of a pair)
        return self._warp_tile(store, "vector" if pairs else "serial")
