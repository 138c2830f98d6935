"""Attention on the matrix units: a nest carrying a :class:`~tcc.ir.loops.MatrixStream` form
(its annotation ``MATRIX_STREAM``, from :mod:`tcc.passes.te.matrix_stream`) becomes one kernel
of FlashAttention-2's shape, followed by the nest's ordinary schedule as its fallback.

One block per tile of ``16 * WARPS`` query rows of one point of the outer rows (batch, heads),
the tiles of one point in consecutive blocks (they share their keys in L2), the last tile of
each point first: with a causal limit it has the most keys, and the short ones then fill the
machine's tail. Each block streams the keys ``TILE`` at a time through two shared-memory slots
of K and V next to its tile of Q; the tile shrinks where the target's shared memory is short.
The kernel copies with 16-byte ``cp.async``: it is the ``aligned`` variant, and the launcher
runs the fallback when a pointer is not 16-byte aligned.

The shapes, by row length (measured on an H200, f16, B4 H16 S2048 and B1 H16 S8192, causal
and not, of 4 or 8 warps of 16 or 32 rows, 32 to 128 keys a step, Q in registers or re-read):
D 64 keeps Q in registers and takes 128 keys a step; D 128 gives each warp 32 rows (each K and V
fragment feeds two products) and re-reads Q from shared memory, which leaves the registers to
the two 32 x 128 accumulators. Both reached 0.37-0.40 of SDPA's throughput there. On sm_90 the
block is one warpgroup of 64 rows on ``wgmma`` (Q and K from shared memory, the probabilities
from registers, V read N-major): 0.39-0.45, of one or two warpgroups and 64 or 128 keys a step
taking 128 keys for D 64 and 64 for D 128.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Var
from tcc.ir.loops import MATRIX_STREAM, Allocate, Buffer, For, Let, MatrixStream, Stmt
from tcc.passes.autoschedule_cuda.indexing import decompose
from tcc.target import CudaTarget

I64 = dtypes.i64
WARPS = 4
# row length -> (keys a step, each the first whose slots fit shared memory; row tiles a warp; Q in registers)
SHAPES = {64: ((128, 64, 32), 1, True), 128: ((64, 32), 2, False)}
# on sm_90's warpgroup MMA: row length -> keys a step (one warpgroup of 64 rows a block)
WARPGROUP_TILES = {64: (128, 64), 128: (64,)}


def form(nest: Stmt, target: CudaTarget) -> MatrixStream | None:
    """The nest's matrix form, where this target runs it on its matrix units."""
    if not (isinstance(nest, For) and target.half_mma):
        return None
    found = dict(nest.annotations).get(MATRIX_STREAM)
    if not isinstance(found, MatrixStream) or found.depth not in SHAPES:
        return None
    if any(ref.dtype != found.q.dtype for ref in (found.k, found.v)):
        return None
    return found


def kernel(nest: For, stream: MatrixStream, target: CudaTarget, fresh: Callable[[str], Var]) -> Stmt | None:
    """The block-per-query-tile kernel of ``stream`` (None: its tiles fit no shared memory)."""
    tiles_of_keys, row_tiles, q_registers = SHAPES[stream.depth]
    warpgroups = 1 if target.warpgroup_mma else 0
    if warpgroups:
        tiles_of_keys = WARPGROUP_TILES[stream.depth]
    rows = 64 * warpgroups or 16 * row_tiles * WARPS
    tile = next((t for t in tiles_of_keys if _shared_bytes(rows, t, stream.depth) <= target.shared_memory_per_block),
                None)
    if tile is None:
        return None
    loops = _outer_loops(nest, stream)
    extents = [int(f.extent.value) for f in loops]  # type: ignore[attr-defined]
    tiles = -(-stream.rows // rows)
    block, thread, which = fresh("bx"), fresh("tx"), fresh("qt")
    # (128-byte swizzled: in dynamic shared memory, 1024-byte aligned as wgmma's layout needs)
    smem = Buffer(fresh("flash_smem").name, dtypes.f16, (_shared_bytes(rows, tile, stream.depth) // 2,), "shared",
                  swizzle=128)
    first = Binary("mul", which, Const(rows, I64), I64)
    body: Stmt = For(thread, Const(128 * warpgroups or 32 * WARPS, I64),
                     replace(stream, first=first, tile=tile, warps=WARPS, row_tiles=row_tiles,
                             q_registers=q_registers, warpgroups=warpgroups, shared=smem.name), "thread.x")
    body = Let(which, Binary("sub", Const(tiles - 1, I64), Binary("mod", block, Const(tiles, I64), I64), I64),
               Allocate(smem, body))
    point = Binary("floordiv", block, Const(tiles, I64), I64)
    body = decompose(loops, extents, point, body)
    return For(block, Const(math.prod(extents) * tiles, I64), body, "block.x", annotations=(("aligned", True),))


def _shared_bytes(rows: int, tile: int, depth: int) -> int:
    """The block's tile of Q and two slots of K and V tiles, in 16-bit values."""
    return (rows + 4 * tile) * depth * 2


def _outer_loops(nest: For, stream: MatrixStream) -> list[For]:
    """The nest's loops over the outer rows (``stream.outer``), outermost first."""
    loops: list[For] = []
    s: Stmt = nest
    names = {v.name for v in stream.outer}
    while isinstance(s, For) and s.var.name in names:
        loops.append(s)
        s = s.body
    return loops
