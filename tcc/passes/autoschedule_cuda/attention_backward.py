"""Attention's backward on the matrix units: the nests of a sweep carrying a
:class:`~tcc.ir.loops.MatrixSweep` form (annotations ``MATRIX_SWEEP`` on the first,
``SWEPT_BY_MATRIX`` on the others, from :mod:`tcc.passes.te.matrix_sweep`) become FlashAttention-2's
backward kernels (:mod:`tcc.codegen_cuda.flash_backward`) in the first one's place:

1. a plain nest zeroing an f32 accumulator of ``dQ`` (outer points x rows x depth);
2. one block per tile of ``16 * warps`` keys of one outer point (the tiles of a point in consecutive
   blocks, the first, which a causal limit gives the most rows, first): ``dK`` and ``dV`` in
   registers, its share of ``dQ`` added into the accumulator; twice, its ``aligned`` variant
   first (the launcher runs it where every operand is 16-byte aligned);
3. a plain nest storing ``dQ`` as the sweep's own store of ``scale`` times the accumulator.

The later nests of the sweep (its sums over the keys) are then computed already and give no kernel.
A program that wants no dQ (a gradient op of K or V alone) gets the second kernel alone.

The tiles, by row length, measured with ``scripts/flash_bwd_probe.py`` on an H200 (f16, B4 H16,
S 2048 and 8192, causal and not; throughput against SDPA's backward): D 64 takes 64 rows a step
and 4 warps (64 keys a block: 0.56 / 0.61 causal at S 2048, ~0.41 / 0.45 at 8192), D 128 64 rows
and 8 warps (128 keys: 0.46 / 0.54 and 0.35 / 0.40; ptxas spills 12-24 bytes, and 32 rows, which
spill none, were slower).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load, Var
from tcc.ir.loops import (
    ALIGNED,
    MATRIX_SWEEP,
    SWEPT_BY_MATRIX,
    Allocate,
    Buffer,
    For,
    Let,
    Seq,
    Stmt,
    Store,
    map_stmt,
)
from tcc.ir.matrix_loops import MatrixSweep
from tcc.passes.autoschedule_cuda.indexing import linear
from tcc.target import CudaTarget

I64, F32 = dtypes.i64, dtypes.f32
# row length -> (rows a step, warps: 16 keys each), see the module docstring
TILES: dict[int, tuple[int, int]] = {64: (64, 4), 128: (64, 8)}


def shared_bytes(d: int, bm: int, warps: int) -> int:
    """The dynamic shared memory the backward's block needs: the K and V tiles, two slots of Q and
    dO tiles and of the rows' statistics, and the block's dS."""
    bn = 16 * warps
    return 2 * bn * d * 2 + 4 * bm * d * 2 + bm * bn * 2 + 4 * bm * 4


def form(nest: Stmt, target: CudaTarget) -> tuple[MatrixSweep, bool] | None:
    """(the nest's sweep form, whether the nest is the sweep's first) where this target runs it on
    its matrix units."""
    if not (isinstance(nest, For) and target.half_mma):
        return None
    notes = dict(nest.annotations)
    found = notes.get(MATRIX_SWEEP, notes.get(SWEPT_BY_MATRIX))
    if not isinstance(found, MatrixSweep) or found.depth not in TILES:
        return None
    if shared_bytes(found.depth, *TILES[found.depth]) > target.shared_memory_per_block:
        return None
    return found, MATRIX_SWEEP in notes


def without_form(nest: Stmt) -> Stmt:
    """``nest`` without the sweep's annotations (a schedule that does not take the form)."""
    if not isinstance(nest, For):
        return nest
    return replace(nest, annotations=tuple(a for a in nest.annotations if a[0] not in (MATRIX_SWEEP, SWEPT_BY_MATRIX)))


def kernels(sweep: MatrixSweep, fresh: Callable[[str], Var], temps: list[Buffer]) -> list[Stmt]:
    """The nest zeroing the dQ accumulator, the block-per-key-tile kernel and its fallback, the
    nest storing dQ; the accumulator is appended to ``temps``. The plain nests (the first and the
    last, none where the program wants no dQ: the kernel's additions then go nowhere anyone reads)
    are the caller's to schedule."""
    bm, warps = TILES[sweep.depth]
    bn = 16 * warps
    points = math.prod(sweep.outer_extents)
    ktiles = -(-sweep.keys // bn)
    acc = Buffer(fresh("dq_acc").name, F32, (points, sweep.rows, sweep.depth))
    temps.append(acc)
    point = _point(sweep)
    block, thread, tile = fresh("bx"), fresh("tx"), fresh("kt")
    smem = Buffer(fresh("flash_bwd_smem").name, dtypes.f16, (shared_bytes(sweep.depth, bm, warps) // 2,), "shared",
                  swizzle=128)
    shaped = replace(sweep, dq=Load(acc.name, (point, sweep.row, Const(0, I64)), F32),
                     first=Binary("mul", tile, Const(bn, I64), I64), block_m=bm, warps=warps, shared=smem.name)
    body: Stmt = For(thread, Const(32 * warps, I64), shaped, "thread.x")
    body = Let(tile, Binary("mod", block, Const(ktiles, I64), I64), Allocate(smem, body))
    body = _outer_lets(sweep, Binary("floordiv", block, Const(ktiles, I64), I64), body)
    kernel = For(block, Const(points * ktiles, I64), body, "block.x")
    aligned = map_stmt(kernel, lambda n: replace(n, aligned=True) if isinstance(n, MatrixSweep) else None)
    main = [replace(aligned, annotations=((ALIGNED, True),)), kernel]
    if isinstance(sweep.dq_out, Seq) and not sweep.dq_out.stmts:
        return main
    zero = _over_rows(sweep, Store(acc.name, (point, sweep.row, sweep.col), Const(0.0, F32)))
    scaled = Binary("mul", Load(acc.name, (point, sweep.row, sweep.col), F32), sweep.scale, F32)
    return [zero, *main, _over_rows(sweep, Let(sweep.value, scaled, sweep.dq_out))]


def _point(sweep: MatrixSweep) -> Expr:
    """The row-major index of the outer variables' point."""
    index: Expr = Const(0, I64)
    for v, extent in zip(sweep.outer, sweep.outer_extents):
        index = linear(index, extent, v)
    return index


def _outer_lets(sweep: MatrixSweep, flat: Expr, body: Stmt) -> Stmt:
    """``Let`` each outer variable be its digit of the row-major ``flat`` index."""
    stride = 1
    for k in reversed(range(len(sweep.outer))):
        value: Expr = flat if stride == 1 else Binary("floordiv", flat, Const(stride, I64), I64)
        if k > 0:
            value = Binary("mod", value, Const(sweep.outer_extents[k], I64), I64)
        body = Let(sweep.outer[k], value, body)
        stride *= sweep.outer_extents[k]
    return body


def _over_rows(sweep: MatrixSweep, body: Stmt) -> Stmt:
    """``body`` in loops over the outer variables, the rows and the columns."""
    body = For(sweep.row, Const(sweep.rows, I64), For(sweep.col, Const(sweep.depth, I64), body))
    for v, extent in reversed(list(zip(sweep.outer, sweep.outer_extents))):
        body = For(v, Const(extent, I64), body)
    return body
