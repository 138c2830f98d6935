"""Attention on the matrix units: a nest carrying a :class:`~tcc.ir.loops.MatrixStream` form
(its annotation ``MATRIX_STREAM``, from :mod:`tcc.passes.te.matrix_stream`) becomes one kernel
of FlashAttention-2's shape, followed by the nest's ordinary schedule as its fallback.

One block per tile of ``16 * WARPS`` query rows of one point of the outer rows (batch, heads),
the tiles of one point in consecutive blocks (they share their keys in L2), the last tile of
each point first: with a causal limit it has the most keys, and the short ones then fill the
machine's tail. Each block streams the keys ``TILE`` at a time through two shared-memory slots
of K and V next to its tile of Q; the tile shrinks where the target's shared memory is short.
The kernel comes twice: its ``aligned`` variant promises 16-byte aligned operands (the launcher
checks the pointers, and runs the other where one is not), which drops a test from every copy
(10-15 % at D 128 on an H200).

Decoding shapes (a few query rows, many keys: too few blocks for the machine) split the keys
among several blocks per tile, each leaving its partial maximum and sums in global scratch, and
a plain nest after the kernel merges them (FlashDecoding's split-KV).

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
from tcc.ir.expr import Binary, Call, Const, Expr, Load, Select, Var
from tcc.ir.loops import MATRIX_STREAM, Allocate, Buffer, For, Let, Seq, Stmt, Store, map_stmt, seq
from tcc.ir.matrix_loops import MatrixStream
from tcc.passes.autoschedule_cuda.indexing import decompose, linear
from tcc.target import CudaTarget

I64 = dtypes.i64
WARPS = 4
# row length -> (keys a step, each the first whose slots fit shared memory; row tiles a warp; Q in registers)
SHAPES = {64: ((128, 64, 32), 1, True), 128: ((64, 32), 2, False)}
# on sm_90's warpgroup MMA: row length -> keys a step (one warpgroup of 64 rows a block). At 128 a
# row, 48 keys leave 65 KB of shared memory and ~140 registers: three blocks a multiprocessor,
# where 64 keys fit two (0.45-0.51 -> 0.48-0.53 of SDPA's throughput on an H200)
WARPGROUP_TILES = {64: (128, 64), 128: (48,)}


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


def kernels(nest: For, stream: MatrixStream, target: CudaTarget, fresh: Callable[[str], Var],
            temps: list[Buffer]) -> list[Stmt] | None:
    """The block-per-query-tile kernel of ``stream`` (None: its tiles fit no shared memory). Where
    its blocks would leave most of the machine idle (decoding: a few query rows, many keys), the
    keys are split among several blocks per tile, each leaving its partial maximum, sum and
    weighted sums in global ``temps``, and the nests after the kernel combine them (plain loop
    nests: the caller schedules them)."""
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
    splits, chunk = _splits(math.prod(extents) * tiles, stream.keys, tile, target)
    block, thread, which, part = fresh("bx"), fresh("tx"), fresh("qt"), fresh("split")
    # (128-byte swizzled: in dynamic shared memory, 1024-byte aligned as wgmma's layout needs)
    smem = Buffer(fresh("flash_smem").name, dtypes.f16, (_shared_bytes(rows, tile, stream.depth) // 2,), "shared",
                  swizzle=128)
    shaped = replace(stream, first=Binary("mul", which, Const(rows, I64), I64), tile=tile, warps=WARPS,
                     row_tiles=row_tiles, q_registers=q_registers, warpgroups=warpgroups, shared=smem.name)
    combine: list[Stmt] = []
    if splits > 1:
        shaped, combine = _split(shaped, loops, extents, part, splits, chunk, fresh, temps)
    body: Stmt = For(thread, Const(128 * warpgroups or 32 * WARPS, I64), shaped, "thread.x")
    rest: Expr = block
    if splits > 1:
        body = Let(part, Binary("mod", block, Const(splits, I64), I64), body)
        rest = Binary("floordiv", block, Const(splits, I64), I64)
    body = Let(which, Binary("sub", Const(tiles - 1, I64), Binary("mod", rest, Const(tiles, I64), I64), I64),
               Allocate(smem, body))
    body = decompose(loops, extents, Binary("floordiv", rest, Const(tiles, I64), I64), body)
    kernel = For(block, Const(math.prod(extents) * tiles * splits, I64), body, "block.x")
    aligned = map_stmt(kernel, lambda n: replace(n, aligned=True) if isinstance(n, MatrixStream) else None)
    return [replace(aligned, annotations=(("aligned", True),)), kernel, *combine]


def _splits(blocks: int, keys: int, tile: int, target: CudaTarget) -> tuple[int, int]:
    """(splits, keys a split): up to two blocks a multiprocessor (one wave: a third split of 128
    heads' blocks would start a second, mostly idle wave) where the tiles alone leave it idle,
    each split at least four steps of keys."""
    want = min(2 * target.sms // blocks, keys // (4 * tile))
    if want < 2:
        return 1, keys
    per_split = -(-keys // want)
    chunk = -(-per_split // tile) * tile
    return -(-keys // chunk), chunk


def _split(stream: MatrixStream, loops: list[For], extents: list[int], part: Var, splits: int, chunk: int,
           fresh: Callable[[str], Var], temps: list[Buffer]) -> tuple[MatrixStream, list[Stmt]]:
    """``stream`` over split ``part`` of the keys, storing its partial results, and the nests that
    combine them into the stream's own stores (``out``, ``row_out``)."""
    f32 = dtypes.f32
    point = _point(loops, extents)
    partial = Buffer(fresh("flash_partial").name, f32, (math.prod(extents), splits, stream.rows, stream.depth))
    stats = Buffer(fresh("flash_stats").name, f32, (math.prod(extents), splits, stream.rows, 2))
    temps += [partial, stats]
    at = (point, part, stream.row)
    begin = Binary("mul", part, Const(chunk, I64), I64)
    end = Binary("min", Binary("add", begin, Const(chunk, I64), I64), Const(stream.keys, I64), I64)
    split = replace(stream, key_begin=begin, key_end=end, out=Store(partial.name, (*at, stream.col), stream.w),
                    row_out=seq(Store(stats.name, (*at, Const(0, I64)), stream.top),
                                Store(stats.name, (*at, Const(1, I64)), stream.total)))
    nests = [_combine(stream, loops, point, partial, stats, splits, fresh, stream.out, with_col=True)]
    if not (isinstance(stream.row_out, Seq) and not stream.row_out.stmts):
        nests.append(_combine(stream, loops, point, partial, stats, splits, fresh, stream.row_out, with_col=False))
    return split, nests


def _combine(stream: MatrixStream, loops: list[For], point: Expr, partial: Buffer, stats: Buffer, splits: int,
             fresh: Callable[[str], Var], stores: Stmt, with_col: bool) -> Stmt:
    """``for outer, row[, col]``: the maximum over the splits, then each split's sum and weighted
    sum rescaled to it and added, then ``stores`` of the results (the online softmax's merge)."""
    f32 = dtypes.f32
    acc = Buffer(fresh("merged").name, f32, (3,), "local")
    s = fresh("s")
    zero, one, two = (Const(v, I64) for v in (0, 1, 2))
    top_s = Load(stats.name, (point, s, stream.row, zero), f32)
    merged = [Load(acc.name, (Const(k, I64),), f32) for k in range(3)]
    safe = Select(Binary("eq", merged[0], Const(-math.inf, f32), dtypes.boolean), Const(0.0, f32), merged[0], f32)
    weight = Call("exp", (Binary("sub", top_s, safe, f32),), f32)
    adds = [Store(acc.name, (one,), Binary("add", merged[1], Binary(
        "mul", Load(stats.name, (point, s, stream.row, one), f32), weight, f32), f32))]
    if with_col:
        adds.append(Store(acc.name, (two,), Binary("add", merged[2], Binary(
            "mul", Load(partial.name, (point, s, stream.row, stream.col), f32), weight, f32), f32)))
    body = seq(Store(acc.name, (zero,), Const(-math.inf, f32)), Store(acc.name, (one,), Const(0.0, f32)),
               Store(acc.name, (two,), Const(0.0, f32)),
               For(s, Const(splits, I64), Store(acc.name, (zero,), Binary("max", merged[0], top_s, f32))),
               For(s, Const(splits, I64), seq(*adds)),
               Let(stream.top, merged[0], Let(stream.total, merged[1], Let(stream.w, merged[2], stores))))
    nest: Stmt = Allocate(acc, body)
    if with_col:
        nest = For(stream.col, Const(stream.depth, I64), nest)
    nest = For(stream.row, Const(stream.rows, I64), nest)
    for loop in reversed(loops):
        nest = For(loop.var, loop.extent, nest)
    return nest


def _point(loops: list[For], extents: list[int]) -> Expr:
    """The row-major index of the outer loops' point."""
    index: Expr = Const(0, I64)
    for loop, extent in zip(loops, extents):
        index = linear(index, extent, loop.var)
    return index


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
