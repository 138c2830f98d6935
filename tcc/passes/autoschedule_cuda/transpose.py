"""A TF32 GEMM's ``[k][n]`` operand turned K-major by a transpose kernel of its own.

``wgmma`` reads TF32 operands from shared memory only K-major (a ``[n][k]`` tile); a GEMM's
``B[k, n]`` is N-major. Transposing each tile on its way through registers at every k-step
(:class:`warpgroup.StagedBuilder`) leaves the matrix units idle most of the time (0.27 of
cuBLAS on an H100). Here a first kernel writes ``Bt[.., n, k] = B[.., k, n]`` to a global
intermediate once (a memory-bound pass: at 4096^2 f32 it moves 128 MB, about a tenth of the
GEMM's time), and the GEMM then reads both operands with 16-byte ``cp.async`` copies, as the
16-bit GEMM does.

The kernel is the usual shared-memory transpose: a block of 256 threads reads a ``32 x 32``
tile along ``n`` (coalesced), stores it to a ``32 x 33`` shared tile (``32 x 34`` for 16-bit
elements: the pad keeps the column reads conflict-free), and after a barrier writes it along ``k`` (coalesced again).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load, Var
from tcc.ir.loopnest import add_index, div_index, mod_index, mul_index
from tcc.ir.loops import Allocate, Barrier, Buffer, For, If, Let, Stmt, Store, seq

I64 = dtypes.i64
TILE = 32  # the side of a block's square tile (64 measured no faster on an H100)
THREADS = 256

Fresh = Callable[[str], Var]


def k_rows(value: Expr, k: Var, n: Var, batch: set[str], shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether ``value`` is a plain read ``T[b.., k, n]`` of a contiguous tensor: batch indices
    (bare loop variables) first, then the reduction index, then the column index."""
    if not isinstance(value, Load) or value.buffer not in shapes or len(value.indices) < 2:
        return False
    names = [i.name if isinstance(i, Var) else None for i in value.indices]
    return (names[-2:] == [k.name, n.name] and all(name in batch for name in names[:-2])
            and len(set(names)) == len(names) and len(shapes[value.buffer]) == len(names))


def transposed(value: Load, fresh: Fresh, shapes: dict[str, tuple[int, ...]]) -> tuple[Buffer, Load]:
    """The global intermediate ``Bt[b.., n, k]`` for ``value = B[b.., k, n]``, and the read of it
    that replaces ``value``."""
    *lead, rows, cols = shapes[value.buffer]
    buf = Buffer(fresh(f"{value.buffer}_t").name, value.dtype, (*lead, cols, rows), "global")
    *lead_ix, k, n = value.indices
    return buf, Load(buf.name, (*lead_ix, n, k), value.dtype)


def kernel(value: Load, out: Buffer, shapes: dict[str, tuple[int, ...]], fresh: Fresh, span=None) -> Stmt:
    """The kernel writing ``out[b.., n, k] = value.buffer[b.., k, n]`` through shared tiles."""
    *lead, rows, cols = shapes[value.buffer]

    def read(lead_ix: list[Expr], r: Expr, c: Expr) -> Expr:
        return Load(value.buffer, (*lead_ix, r, c), value.dtype)

    def write(lead_ix: list[Expr], r: Expr, c: Expr, v: Expr) -> Stmt:
        return Store(out.name, (*lead_ix, c, r), v)
    return tiled(read, write, list(lead), rows, cols, value.dtype, fresh, span)


Read = Callable[[list[Expr], Expr, Expr], Expr]
Write = Callable[[list[Expr], Expr, Expr, Expr], Stmt]


def tiled(read: Read, write: Write, lead: list[int], rows: int, cols: int, dtype, fresh: Fresh, span=None,
          side: int = TILE) -> Stmt:
    """A kernel over ``lead x rows x cols`` that moves ``read(b, r, c)`` (coalesced when it is
    contiguous along ``c``) to ``write(b, r, c, value)`` (coalesced when that is contiguous along
    ``r``), through a shared tile per block."""
    passes = THREADS // side  # tile rows one pass of the block covers
    tiles_r, tiles_c = -(-rows // side), -(-cols // side)
    batch = math.prod(lead)
    bx, tid, r0, c0, s = (fresh(n) for n in ("bx", "tx", "tr0", "tc0", "ts"))
    lanes, row = fresh("tl"), fresh("trow")
    pad = max(1, 4 // dtype.itemsize)  # rows 4 bytes past a multiple of 128: the column reads hit 32 banks
    tile = Buffer(fresh("tt").name, dtype, (side, side + pad), "shared")
    b = fresh("tb")
    lead_ix: list[Expr] = []
    flat: Expr = b
    for extent in reversed(lead):
        lead_ix.insert(0, mod_index(flat, extent) if len(lead_ix) < len(lead) - 1 else flat)
        flat = div_index(flat, extent)

    def guarded(r: Expr, c: Expr, stmt: Stmt) -> Stmt:
        checks = [Binary("lt", e, Const(n, I64), dtypes.boolean) for e, n, whole in
                  ((r, rows, rows % side == 0), (c, cols, cols % side == 0)) if not whole]
        if not checks:
            return stmt
        cond = checks[0] if len(checks) == 1 else Binary("and", checks[0], checks[1], dtypes.boolean)
        return If(cond, stmt)

    def rows_of(body) -> Stmt:
        return For(s, Const(side // passes, I64), Let(row, add_index(div_index(tid, side), mul_index(s, passes)),
                                                      body), "unroll")

    gr, gc = add_index(r0, row), add_index(c0, lanes)
    into_tile = guarded(gr, gc, Store(tile.name, (row, lanes), read(lead_ix, gr, gc)))
    wr, wc = add_index(r0, lanes), add_index(c0, row)
    out_of_tile = guarded(wr, wc, write(lead_ix, wr, wc, Load(tile.name, (lanes, row), dtype)))
    body: Stmt = Allocate(tile, Let(lanes, mod_index(tid, side), seq(rows_of(into_tile), Barrier(),
                                                                      rows_of(out_of_tile))))
    per = tiles_r * tiles_c
    inner: Stmt = For(tid, Const(THREADS, I64), body, "thread.x", span=span)
    inner = Let(r0, mul_index(div_index(mod_index(bx, per), tiles_c), side),
                Let(c0, mul_index(mod_index(bx, tiles_c), side), inner))
    if lead:
        inner = Let(b, div_index(bx, per), inner)
    return For(bx, Const(batch * per, I64), inner, "block.x", span=span)
