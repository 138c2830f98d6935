"""Prefix scans on the GPU: one block per row, the whole block scanning each chunk of the row.

The scans pass (:mod:`tcc.passes.te.scans`) makes ``sum[j: i + 1](X[b, j])`` a recurrence,
``P[b, i] = select(i == 0, X[b, 0], P[b, i - 1] + X[b, i])``, which the recurrence schedule runs
as one thread per row: a row of 65536 elements is 65536 dependent steps of one thread, its
loads 256 KB apart from its neighbours'. A recurrence whose step is an associative operator
(``+``, ``*``, ``max``, ``min``) of its previous value and a term that does not read it is a
prefix scan of the terms ``v[i] = select(first, start, term)``, and a scan runs in parallel:

* one block of ``T`` threads per row; the row in chunks of ``T * K`` elements, in order;
* the block loads a chunk's terms coalesced (thread ``t`` takes elements ``t, t + T, ...``)
  into shared memory, and each thread scans its ``K`` consecutive ones in registers;
* a block-wide exclusive scan of the threads' totals (:class:`~tcc.ir.loops.BlockScan`: warp
  shuffles, then the warps' totals) gives each thread what comes before its elements;
* each thread writes ``carry (+) before (+) its running value`` back to shared memory, the block
  stores the chunk coalesced, and ``carry`` grows by the chunk's total.

Linear work, coalesced memory, and two barriers and one block scan per ``T * K`` elements. The
scan reassociates the operator, as every parallel reduction here does: floating-point sums
agree with the sequential ones to rounding. Applies where the scan axis is the innermost index
of the stored tensor (a row of contiguous elements); a scan down the columns of a row-major
tensor keeps the recurrence schedule, whose thread per column is already coalesced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Load, Select, Var, free_vars, substitute, walk
from tcc.ir.loopnest import add_index, div_index, mul_index
from tcc.ir.loops import Allocate, Barrier, BlockScan, Buffer, For, If, Let, Stmt, Store, is_sequential, seq
from tcc.passes.autoschedule_cuda.indexing import Size, as_expr, product
from tcc.passes.simplify import evaluate_int, simplify
from tcc.passes.te.lower import reduce_identity

I64 = dtypes.i64
THREADS = 256  # threads of a block (a multiple of 32: the block scan goes warp by warp)
PER_THREAD = 8  # consecutive elements a thread scans in registers per chunk
MIN_LENGTH = 32  # shorter rows keep one thread per row
_REDUCTION = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}

Fresh = Callable[[str], Var]
Decompose = Callable[[list[For], list[int], Expr, Stmt], Stmt]


@dataclass
class Scan:
    """``buffer[..., i] = select(first, start, buffer[..., i - 1] (op) term)`` along ``loop``."""

    loop: For  # the sequential loop of the scan axis
    store: Store  # the recurrence's statement
    op: str  # add, mul, max or min
    value: Expr  # the term v[i] the scan combines: select(first, start, term)
    identity: Const

    @property
    def length(self) -> int:
        return int(self.loop.extent.value)  # type: ignore[attr-defined]


def match(body: Stmt) -> Scan | None:
    """The scan that ``body`` (what a recurrence's independent loops enclose) is, if it is one."""
    if not (is_sequential(body) and isinstance(body.extent, Const) and isinstance(body.body, Store)):
        return None
    loop, store = body, body.body
    i = loop.var.name
    length = int(loop.extent.value)
    if store.accumulate or length < MIN_LENGTH or not store.indices or store.indices[-1] != loop.var \
            or any(i in free_vars(x) for x in store.indices[:-1]) or not isinstance(store.value, Select):
        return None
    first, start, step = store.value.cond, store.value.a, store.value.b
    if not (isinstance(step, Binary) and step.op in _REDUCTION):
        return None
    previous, term = _split_step(step, store, i, length)
    if previous is None or _reads(term, store.buffer) or _reads(start, store.buffer) or _reads(first, store.buffer):
        return None
    identity = reduce_identity(_REDUCTION[step.op], store.value.dtype)
    if not (_is_first(first, i) or (start == identity and _prefix_only(first, i, length))):
        return None
    return Scan(loop, store, step.op, Select(first, start, term, store.value.dtype), identity)


def _split_step(step: Binary, store: Store, i: str, length: int) -> tuple[Load | None, Expr]:
    """(the read of the previous element, the term) of ``previous (op) term``, either order."""
    for previous, term in ((step.a, step.b), (step.b, step.a)):
        if isinstance(previous, Load) and previous.buffer == store.buffer and _is_previous(previous, store, i, length):
            return previous, term
    return None, step


def _is_previous(load: Load, store: Store, i: str, length: int) -> bool:
    """Whether ``load`` reads the stored element one step back along ``i`` (clamped or not)."""
    if load.indices[:-1] != store.indices[:-1]:
        return False
    last = load.indices[-1]
    return free_vars(last) <= {i} and all(
        evaluate_int(simplify(substitute(last, {i: Const(k, I64)}))) == k - 1 for k in (1, 2, length // 2, length - 1))


def _is_first(cond: Expr, i: str) -> bool:
    """``i == 0``."""
    return isinstance(cond, Binary) and cond.op == "eq" and isinstance(cond.a, Var) and cond.a.name == i \
        and isinstance(cond.b, Const) and cond.b.value == 0


def _prefix_only(cond: Expr, i: str, length: int) -> bool:
    """Whether ``cond`` (of ``i`` alone) holds on a prefix of ``0..length`` and nowhere after it
    (checked on the first 64 positions and the last)."""
    if free_vars(cond) != {i}:
        return False
    held = [evaluate_int(simplify(substitute(cond, {i: Const(k, I64)}))) for k in (*range(min(length, 64)), length - 1)]
    return None not in held and all(a or not b for a, b in zip(held, held[1:]))


def _reads(e: Expr, buffer: str) -> bool:
    return any(isinstance(n, Load) and n.buffer == buffer for n in walk(e))


def kernel(scan: Scan, axes: list[For], extents: list[Size], fresh: Fresh, decompose: Decompose) -> Stmt:
    """One block per row of the independent ``axes`` (as many as the call's dynamic shape symbols
    give): the row, of a constant length, scanned chunk by chunk."""
    span = scan.store.span
    threads = min(THREADS, 32 * -(-scan.length // 32))
    per = max(1, min(PER_THREAD, scan.length // threads))
    bx, tx = fresh("bx"), fresh("tx")
    body = _row(scan, threads, per, tx, fresh)
    body = decompose(axes, extents, bx, body)
    return For(bx, as_expr(product(extents)), For(tx, Const(threads, I64), body, "thread.x", span=span),
               "block.x", span=span)


def _row(scan: Scan, threads: int, per: int, tx: Var, fresh: Fresh) -> Stmt:
    """A thread's part of one row: the chunks in order, ``carry`` the scan of those before."""
    dtype = scan.store.value.dtype
    chunk = threads * per
    stage = Buffer(fresh("scan_stage").name, dtype, (chunk + chunk // 32,), "shared")
    carry = Buffer(fresh("scan_carry").name, dtype, (1,), "local")
    run = Buffer(fresh("scan_run").name, dtype, (per,), "local")
    block = Buffer(fresh("scan_block").name, dtype, (2,), "local")
    c = fresh("chunk")
    zero, one = Const(0, I64), Const(1, I64)

    def cell(flat: Expr) -> Expr:  # padded: a thread's K consecutive cells fall in distinct banks
        return add_index(flat, div_index(flat, 32))

    def at(buf: Buffer, index: Expr) -> Load:
        return Load(buf.name, (index,), dtype)

    def op(a: Expr, b: Expr) -> Expr:
        return Binary(scan.op, a, b, dtype)

    def each(count: int, fn: Callable[[Var], Stmt]) -> Stmt:
        k = fresh("k")
        return For(k, Const(count, I64), fn(k), "unroll")

    def strided(k: Var) -> Expr:  # element k * T + t of the chunk: the block's accesses coalesced
        return add_index(mul_index(k, threads), tx)

    def own(k: Expr) -> Expr:  # the thread's k-th consecutive element of the chunk
        return add_index(mul_index(tx, per), k)

    def in_row(k: Var, then: Stmt, otherwise: Stmt | None = None) -> Stmt:
        i = scan.loop.var
        return Let(i, add_index(mul_index(c, chunk), strided(k)),
                   If(Binary("lt", i, Const(scan.length, I64), dtypes.boolean), then, otherwise))

    load = each(per, lambda k: in_row(k, Store(stage.name, (cell(strided(k)),), scan.value),
                                      Store(stage.name, (cell(strided(k)),), scan.identity)))
    def running(k: Var) -> Stmt:  # run[k + 1] = run[k] (op) the thread's element k + 1
        return Store(run.name, (add_index(k, one),), op(at(run, k), at(stage, cell(own(add_index(k, one))))))

    local = seq(Store(run.name, (zero,), at(stage, cell(own(zero)))), *([each(per - 1, running)] if per > 1 else []))
    back = each(per, lambda k: Store(stage.name, (cell(own(k)),), op(at(carry, zero), op(at(block, zero), at(run, k)))))
    out = each(per, lambda k: in_row(k, Store(scan.store.buffer, scan.store.indices, at(stage, cell(strided(k))),
                                              span=scan.store.span)))
    step = seq(load, Barrier(), local, Store(block.name, (zero,), at(run, Const(per - 1, I64))),
               BlockScan(block.name, scan.op, scan.identity), back, Barrier(), out,
               Store(carry.name, (zero,), op(at(carry, zero), at(block, one))), Barrier())
    body: Stmt = seq(Store(carry.name, (zero,), scan.identity), For(c, Const(-(-scan.length // chunk), I64), step))
    for buf in (block, run, carry, stage):
        body = Allocate(buf, body)
    return body
