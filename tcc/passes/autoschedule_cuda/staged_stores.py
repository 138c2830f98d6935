"""Staged stores: a tensor-core GEMM's result tile leaves through shared memory, 16 bytes a thread.

Stored straight from the accumulator fragments, a 16-bit result went out an element at a time
(a warp's store: 2 bytes in each of 32 places over 8 rows), and converting each accumulator on
its own made ptxas serialise every wgmma of the main loop (its note C7514): on an H200 the f16-out
GEMM ran 0.61 of cuBLAS where the f32-out one ran 0.91. Here, once the main loop is done, the
epilogue (bias, activation, residual, the cast: whatever the final store computes) still runs on
the accumulators in registers, but its values go to a shared tile ``[BM][BN + pad]`` of the
result's type, placed over the operand tiles (``Allocate.reuses``), two columns at a time (a
2-lane ``vector`` loop: one conversion of two floats, one 4-byte shared store); a barrier; then
each thread copies 16-byte pieces of the tile's rows to the result (``vector`` loops of 8 halves
or 4 floats): whole sectors, coalesced. The pad (16 bytes a row for 2-byte results, 32 for
f32) keeps both the pair writes and the 16-byte reads free of bank conflicts.

The auto-scheduler decides (:func:`plan`, by the result's type and layout and the
``staged_stores=`` option of ``tcc.compile``): ``"auto"`` stages 16-bit float results,
``"all"`` f32 ones too, ``"off"`` none. Only the copy-engine kernels stage (their launcher
checks that every pointer is 16-byte aligned; the register-staged fallback stores element by
element), and only a result contiguous along N whose rows are whole 16-byte pieces; the last
tiles of a ragged M or N mask whole pieces. A 16-bit result not staged whose rows are whole
column pairs (``"off"``, or rows of 250 halves) is stored straight from the accumulators a pair
at a time (one conversion, one 4-byte store); odd rows, element by element.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tcc import dtypes
from tcc.dtypes import DType
from tcc.ir.expr import Cast, Const, Expr, Load, Select, Var, free_vars, substitute, transform
from tcc.ir.loopnest import add_index, div_index, mod_index, mul_index
from tcc.ir.loops import Allocate, Barrier, Buffer, For, If, Let, Stmt, Store, seq
from tcc.passes.autoschedule_cuda import gemm
from tcc.passes.autoschedule_cuda.indexing import Size
from tcc.target import CudaTarget

I64, F32 = dtypes.i64, dtypes.f32


class Builder(Protocol):
    """What the staged epilogue reads of a tensor-core kernel's builder (``tensorcore.Builder``)."""

    c: gemm.Contraction
    target: CudaTarget
    fresh: Callable[[str], Var]
    decompose: Callable[..., Stmt]
    m: Size
    n: Size
    bm: int
    bn: int
    wm: int  # the accumulator tile of one warp (or warpgroup)
    wn: int
    xs: Buffer  # the shared operand tiles
    ys: Buffer
    acct: Buffer

    def _warp_origin(self, ty: Var) -> tuple[Expr, Expr]: ...


@dataclass(frozen=True)
class Plan:
    """How a result is stored: its type, the elements of one 16-byte piece, and whether it goes
    through shared memory (else straight from the accumulators, a 16-bit result's column pairs
    converted and stored together: see ``pairs``)."""

    dtype: DType
    chunk: int
    staged: bool

    @property
    def pairs(self) -> bool:
        """Whether a direct store writes the lanes' column pairs as one 4-byte store (16-bit
        results: converting an accumulator alone made ptxas serialise the wgmma instructions)."""
        return self.dtype.itemsize == 2

    @property
    def pad(self) -> int:
        """Elements added to each row of the shared tile: 16 bytes for 2-byte results, 32 for
        4-byte ones (the lanes' pair writes then fall in distinct banks)."""
        return 16 * (self.dtype.itemsize // 2) // self.dtype.itemsize

    def tile(self, name: str, bm: int, bn: int) -> Buffer:
        return Buffer(name, self.dtype, (bm, bn + self.pad), "shared")


def plan(c: gemm.Contraction, shapes: dict[str, tuple], mode: str) -> Plan | None:
    """How the copy-engine kernels store ``c``'s result, for a result of one M and one N axis whose
    last index is N's variable alone (rows contiguous along N): through shared memory by ``mode``
    where its rows are whole 16-byte pieces, else, 16-bit, in column pairs where its rows are
    whole pairs; None: element by element."""
    dtype = c.final.value.dtype
    if len(c.m_axes) != 1 or len(c.n_axes) != 1:
        return None
    shape, indices, n = shapes.get(c.final.buffer), c.final.indices, c.n_axes[0].var.name
    width = c.size(c.n_axes)
    if shape is None or not indices or not isinstance(shape[-1], int) or not isinstance(width, int):
        return None  # (a dynamic row stride: its alignment is not known)
    last = indices[-1]
    if not (isinstance(last, Var) and last.name == n) or any(n in free_vars(i) for i in indices[:-1]):
        return None
    chunk = 16 // dtype.itemsize
    wanted = dtype.name in ("f16", "bf16") or (mode == "all" and dtype == F32)
    staged = mode != "off" and wanted and shape[-1] % chunk == 0 and width % chunk == 0
    if staged or (dtype.itemsize == 2 and dtype.is_float and shape[-1] % 2 == 0 and width % 2 == 0):
        return Plan(dtype, chunk, staged)
    return None


def fits(p: Plan, b: Builder) -> bool:
    """Whether the staged tile, over the operand tiles, keeps ``b``'s kernel within its target's
    shared memory."""
    operands = gemm.shared_footprint([b.xs, b.ys])
    staged = gemm.shared_footprint([p.tile("t", b.bm, b.bn)])
    return max(operands, staged) <= b.target.shared_memory_per_block


def epilogue(p: Plan, b: Builder, tid: Var, ty: Var, tm0: Var, tn0: Var) -> Stmt:
    """A barrier (the operand tiles are done with), the epilogue's values into the shared tile,
    a barrier, the tile's 16-byte pieces to the result."""
    tile = p.tile(b.fresh("ot").name, b.bm, b.bn)
    body = seq(_writes(p, b, tile, ty, tm0, tn0), Barrier(), _copies(p, b, tile, tid, tm0, tn0))
    return seq(Barrier(), Allocate(tile, body, reuses=(b.xs.name, b.ys.name)))


def _writes(p: Plan, b: Builder, tile: Buffer, ty: Var, tm0: Var, tn0: Var) -> Stmt:
    """The warp's accumulator tile, through the final store's expression, into ``tile``; the
    columns a vector loop, which tensorize makes the lanes' column pairs."""
    c = b.c
    gm, gn = b.fresh("gm"), b.fresh("gn")
    wr, wc = b._warp_origin(ty)
    cond = gemm._in_range([(gm, b.m, gemm._divides(b.bm, b.m)), (gn, b.n, gemm._divides(b.bn, b.n))])

    def write(a: Var, col: Var) -> Stmt:
        acc = Load(b.acct.name, (a, col), F32)
        value = transform(c.final.value, lambda x: acc if gemm._is_acc(x, c.acc) else None)
        body: Stmt = Store(tile.name, (add_index(wr, a), add_index(wc, col)), _masked(value, cond), c.final.span)
        body = b.decompose(c.n_axes, [gemm._const(f) for f in c.n_axes], gn, body)
        body = b.decompose(c.m_axes, [gemm._const(f) for f in c.m_axes], gm, body)
        return Let(gm, add_index(tm0, add_index(wr, a)), Let(gn, add_index(tn0, add_index(wc, col)), body))
    a, col = b.fresh("wa"), b.fresh("wb")
    return For(a, Const(b.wm, I64), For(col, Const(b.wn, I64), write(a, col), "vector"))


def _masked(value: Expr, cond: Expr | None) -> Expr:
    """``value`` where ``cond`` holds, else zero (an element past the problem's edge: never copied
    out, and its epilogue must not read past a bias or residual)."""
    if cond is None:
        return value
    if isinstance(value, Cast) and value.a.dtype == F32:  # (the cast stays outermost: one conversion)
        return Cast(Select(cond, value.a, Const(0.0, F32), F32), value.dtype)
    return Select(cond, value, Const(0, value.dtype), value.dtype)


def _copies(p: Plan, b: Builder, tile: Buffer, tid: Var, tm0: Var, tn0: Var) -> Stmt:
    """Each thread copies 16-byte pieces of the tile's rows (consecutive threads along a row) to
    the result; a piece past the problem's last row or column is skipped whole."""
    c = b.c
    per_row = b.bn // p.chunk
    rows = gemm.THREADS // per_row  # rows a pass of the block's threads covers
    step, lane = b.fresh("so"), b.fresh("sv")
    r, col, gm, gn = (b.fresh(s) for s in ("sr", "sc", "gm", "gn"))
    n = c.n_axes[0].var.name
    where = tuple(substitute(i, {n: add_index(gn, lane)}) for i in c.final.indices)
    copy: Stmt = For(lane, Const(p.chunk, I64), Store(c.final.buffer, where, Load(
        tile.name, (r, add_index(col, lane)), p.dtype), c.final.span), "vector")
    copy = b.decompose(c.m_axes, [gemm._const(f) for f in c.m_axes], gm, copy)
    cond = gemm._in_range([(gm, b.m, gemm._divides(b.bm, b.m)), (gn, b.n, gemm._divides(b.bn, b.n))])
    if cond is not None:
        copy = If(cond, copy)
    body = Let(gm, add_index(tm0, r), Let(gn, add_index(tn0, col), copy))
    body = Let(r, add_index(mul_index(step, rows), div_index(tid, per_row)),
               Let(col, mul_index(mod_index(tid, per_row), p.chunk), body))
    return For(step, Const(b.bm // rows, I64), body, "unroll")
