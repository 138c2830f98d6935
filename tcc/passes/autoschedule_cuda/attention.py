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

Measured on an H200 (f16, ``benchmarks/attention.py``'s shapes): 4 warps and 64 keys a step
were fastest for D 64 and 128 of (4, 64), (8, 64), (8, 32).
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
WARPS = 4  # a warp per 16 query rows
TILES = (64, 32)  # keys a step, the first whose slots fit shared memory
DEPTHS = (64, 128)  # the row lengths whose 16-byte chunks the kernel's swizzle spreads over 8 banks


def form(nest: Stmt, target: CudaTarget) -> MatrixStream | None:
    """The nest's matrix form, where this target runs it on its matrix units."""
    if not (isinstance(nest, For) and target.half_mma):
        return None
    found = dict(nest.annotations).get(MATRIX_STREAM)
    if not isinstance(found, MatrixStream) or found.depth not in DEPTHS:
        return None
    if any(ref.dtype != found.q.dtype for ref in (found.k, found.v)):
        return None
    return found


def kernel(nest: For, stream: MatrixStream, target: CudaTarget, fresh: Callable[[str], Var]) -> Stmt | None:
    """The block-per-query-tile kernel of ``stream`` (None: its tiles fit no shared memory)."""
    rows = 16 * WARPS
    tile = next((t for t in TILES if _shared_bytes(rows, t, stream.depth) <= target.shared_memory_per_block), None)
    if tile is None:
        return None
    loops = _outer_loops(nest, stream)
    extents = [int(f.extent.value) for f in loops]  # type: ignore[attr-defined]
    tiles = -(-stream.rows // rows)
    block, thread, which = fresh("bx"), fresh("tx"), fresh("qt")
    smem = Buffer(fresh("flash_smem").name, dtypes.f16, (_shared_bytes(rows, tile, stream.depth) // 2,), "shared")
    first = Binary("mul", which, Const(rows, I64), I64)
    body: Stmt = For(thread, Const(32 * WARPS, I64),
                     replace(stream, first=first, tile=tile, warps=WARPS, shared=smem.name), "thread.x")
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
