"""Reductions with few outputs, split across blocks in two kernels (an ``rfactor`` in the loop IR).

The row schedule gives each output one block, so ``Y[z] = sum[i, j](X[i, j])`` runs on one
block of the whole chip. Here, when the outputs are too few to fill the chip, each output's
reduction is cut into ``S`` chunks:

* kernel 1: one block per (output, chunk); its threads stride over the chunk and combine their
  partial results across the block (``allreduce``), and the block stores its partial to a
  global intermediate ``partial[output * S + chunk]``;
* kernel 2: one block per output combines its ``S`` partials the same way, then runs the
  nest's final stores (the epilogue, e.g. a division for a mean).

Both start from the operator's identity (what ``lower`` initialises the accumulator with), so
the split changes only the order of the combination. A chunk is a range of *rows*, the
reduction's outer axes, whose trailing axes (at least ``ROW_MIN`` elements) its threads stride
over: unit-stride, coalesced reads and no division per element when the trailing axis alone is
long enough. Reductions whose trailing axes are short or whose rows are too few for the chunks
take one flattened index per element instead (a division per axis).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load, Var, walk
from tcc.ir.loopnest import add_index, div_index, mod_index
from tcc.ir.loops import Allocate, Buffer, For, If, Let, Seq, Stmt, Store, seq
from tcc.passes.autoschedule_cuda.indexing import guarded
from tcc.target import CudaTarget

I64 = dtypes.i64
THREADS = 256
MIN_CHUNK = THREADS * 16  # elements a chunk reads at least: fewer and the second kernel dominates
ROW_MIN = 128  # trailing reduction elements a row needs to be strided over by the block's threads

Fresh = Callable[[str], Var]
Decompose = Callable[[list[For], list[int], Expr, Stmt], Stmt]


@dataclass
class PureReduction:
    """A nest that only reduces: ``acc = identity; for r...: acc = op(acc, v); stores of acc``."""

    acc: Buffer
    init: Store
    axes: list[For]  # the reduction loops, outermost first
    update: Store  # acc[0] = op(acc[0], value)
    op: str
    finals: list[Stmt]  # the final stores, which read acc

    @property
    def extents(self) -> list[int]:
        return [int(f.extent.value) for f in self.axes]  # type: ignore[attr-defined]


def match(body: Stmt) -> PureReduction | None:
    """The pure reduction that ``body`` (what the output loops enclose) is, if it is one."""
    if not (isinstance(body, Allocate) and body.buffer.scope == "local" and body.buffer.size == 1
            and isinstance(body.body, Seq) and len(body.body.stmts) >= 3):
        return None
    acc = body.buffer
    init, loop, *finals = body.body.stmts
    axes = []
    while isinstance(loop, For) and loop.kind == "serial" and isinstance(loop.extent, Const):
        axes.append(loop)
        loop = loop.body
    if not (axes and isinstance(init, Store) and init.buffer == acc.name and isinstance(loop, Store)
            and loop.buffer == acc.name and all(isinstance(s, Store) and s.buffer != acc.name for s in finals)):
        return None
    value = loop.value
    if not (isinstance(value, Binary) and value.op in ("add", "mul", "max", "min") and _is_acc(value.a, acc)
            and not _reads(value.b, acc) and not _reads(init.value, acc)):
        return None
    return PureReduction(acc, init, axes, loop, value.op, finals)


def _is_acc(e: Expr, acc: Buffer) -> bool:
    return isinstance(e, Load) and e.buffer == acc.name and all(isinstance(i, Const) and i.value == 0
                                                                for i in e.indices)


def _reads(e: Expr, acc: Buffer) -> bool:
    return any(isinstance(n, Load) and n.buffer == acc.name for n in walk(e))


def chunks(outputs: int, length: int, sms: int, per_sm: int, min_chunk: int = MIN_CHUNK) -> int:
    """Chunks per output: enough blocks to fill ``sms`` multiprocessors (``per_sm`` blocks on
    each: 8 of 256 threads fill an H100's), each chunk at least ``min_chunk`` long (else the
    combining kernel dominates). Split-K (:mod:`.split_k`) cuts a contraction's k-steps by its
    own rule: its blocks are heavier."""
    want = -(-sms * per_sm // max(outputs, 1))
    return max(1, min(want, length // min_chunk))


def schedule(axes: list[For], extents: list[int], red: PureReduction, target: CudaTarget, fresh: Fresh,
             decompose: Decompose) -> tuple[Buffer, Stmt] | None:
    """(the partials buffer, the two kernels) for the output loops ``axes`` over ``red``, or None
    when one block per output already fills ``target``'s multiprocessors (or its blocks hold
    fewer than ``THREADS`` threads)."""
    if THREADS > target.max_threads_per_block:
        return None
    outputs = math.prod(extents)
    length = math.prod(red.extents)
    s = chunks(outputs, length, target.sms, target.max_threads_per_sm // THREADS)
    if s < 2:
        return None
    span = red.axes[0].span
    partial = Buffer(fresh("partial").name, red.acc.dtype, (outputs * s,))
    first = _partial_kernel(axes, extents, red, s, partial, fresh, decompose, span)
    second = _combine_kernel(axes, extents, red, s, partial, fresh, decompose, span)
    return partial, seq(first, second)


def _accumulate(red: PureReduction, value_body: Stmt, tx: Var, span) -> Stmt:
    """``acc = identity; <threads run value_body>; combined across the block``."""
    threads = For(tx, Const(THREADS, I64), value_body, "thread.x",
                  annotations=(("allreduce", f"{red.acc.name}:{red.op}"),), span=span)
    return seq(red.init, threads)


def _partial_kernel(axes: list[For], extents: list[int], red: PureReduction, s: int, partial: Buffer,
                    fresh: Fresh, decompose: Decompose, span) -> Stmt:
    """Block ``bx`` reduces chunk ``bx % s`` of output ``bx // s`` into ``partial[bx]``."""
    bx, tx, out, chunk = fresh("bx"), fresh("tx"), fresh("out"), fresh("chunk")
    body = _chunk_loops(red, s, chunk, tx, fresh, decompose)
    store = Store(partial.name, (bx,), Load(red.acc.name, (Const(0, I64),), red.acc.dtype))
    inner: Stmt = Allocate(red.acc, seq(_accumulate(red, body, tx, span), store))
    inner = Let(out, div_index(bx, s), Let(chunk, mod_index(bx, s), decompose(axes, extents, out, inner)))
    return For(bx, Const(math.prod(extents) * s, I64), inner, "block.x", span=span)


def _chunk_loops(red: PureReduction, s: int, chunk: Var, tx: Var, fresh: Fresh, decompose: Decompose) -> Stmt:
    """What thread ``tx`` of the block for ``chunk`` reduces: rows of the reduction, or a flat range."""
    extents = red.extents
    split = len(extents)
    while split > 0 and math.prod(extents[split - 1:]) < ROW_MIN:
        split -= 1
    split = max(split - 1, 0)  # the trailing axes from ``split`` on make a row of >= ROW_MIN
    rows = math.prod(extents[:split])
    if split == 0 or rows < s:
        return _flat_chunk(red, s, chunk, tx, fresh, decompose)
    per = -(-rows // s)
    row_len = math.prod(extents[split:])
    rr, row = fresh("rr"), fresh("row")
    strided = _block_strided(row_len, tx, fresh, lambda col: decompose(red.axes[split:], extents[split:], col,
                                                                      red.update))
    body = decompose(red.axes[:split], extents[:split], row, strided)
    return For(rr, Const(per, I64), guarded(row, add_index(_mul(chunk, per), rr), rows, per * s, body))


def _block_strided(length: int, tx: Var, fresh: Fresh, body: Callable[[Var], Stmt]) -> Stmt:
    """``body(col)`` for ``col = tx, tx + THREADS, ... < length``: whole steps unguarded (their
    loads can be issued together), then one guarded partial step."""
    whole, rest = divmod(length, THREADS)
    st, col, last = fresh("rstep"), fresh("col"), fresh("col")
    parts = []
    if whole:
        parts.append(For(st, Const(whole, I64), Let(col, add_index(_mul(st, THREADS), tx), body(col))))
    if rest:
        guard = If(Binary("lt", last, Const(length, I64), dtypes.boolean), body(last))
        parts.append(Let(last, add_index(Const(whole * THREADS, I64), tx), guard))
    return seq(*parts)


def _flat_chunk(red: PureReduction, s: int, chunk: Var, tx: Var, fresh: Fresh, decompose: Decompose) -> Stmt:
    length = math.prod(red.extents)
    steps = -(-length // (s * THREADS))
    st, rid = fresh("rstep"), fresh("rid")
    body = decompose(red.axes, red.extents, rid, red.update)
    index = add_index(_mul(add_index(_mul(chunk, steps), st), THREADS), tx)
    return For(st, Const(steps, I64), guarded(rid, index, length, steps * s * THREADS, body))


def _combine_kernel(axes: list[For], extents: list[int], red: PureReduction, s: int, partial: Buffer,
                    fresh: Fresh, decompose: Decompose, span) -> Stmt:
    """Block ``bx`` combines output ``bx``'s ``s`` partials, then runs the nest's final stores."""
    bx, tx, st, q = fresh("bx"), fresh("tx"), fresh("cstep"), fresh("q")
    value = Load(partial.name, (add_index(_mul(bx, s), q),), partial.dtype)
    acc = Load(red.acc.name, (Const(0, I64),), red.acc.dtype)
    update = Store(red.acc.name, (Const(0, I64),), Binary(red.op, acc, value, red.acc.dtype), red.update.span)
    steps = -(-s // THREADS)
    inner = guarded(q, add_index(_mul(st, THREADS), tx), s, steps * THREADS, update)
    body: Stmt = For(st, Const(steps, I64), inner) if steps > 1 else Let(st, Const(0, I64), inner)
    kernel = Allocate(red.acc, seq(_accumulate(red, body, tx, span), *red.finals))
    return For(bx, Const(math.prod(extents), I64), decompose(axes, extents, bx, kernel), "block.x", span=span)



def _mul(a: Expr, n: int) -> Expr:
    return a if n == 1 else Binary("mul", a, Const(n, I64), I64)
