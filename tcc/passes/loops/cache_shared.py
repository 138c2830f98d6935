"""cache(T, L, shared[, pad|swizzle][, async]) at a loop the block's threads run together (inside
their thread loop): the block's tile of ``T`` in shared memory, copied by all its threads.

Inside the thread loop, what ``L``'s body reads of ``T`` differs between warps (a warp grid's
``wi``, ``wj`` from ``bind(L, warp)``); the shared tile must hold every warp's part. So its
layout is the *box* the reads cover, one dim per dim of ``T`` that moves: a read
``A[blk*64 + wi*32 + mi, ko*32 + ki]`` with ``wi < 2``, ``mi < 32``, ``ki < 32`` gives a ``64 x 32``
tile read as ``A_c[wi*32 + mi, ki]``, the block tile a tensor-core GEMM wants (``B[k, n]`` gives
``[k][n]``, which ``tensorize`` reads transposed). Indices must be affine in the tile's variables
with non-negative steps; anything else that differs between threads (a lane) is refused.

Each thread copies every ``threads``-th element of the flattened box, so consecutive threads read
consecutive elements of ``T``'s last dim; a barrier follows the copy and another ends the body
(before the next copy overwrites the tile).

``pad`` adds 16 bytes to each row of the tile (``ldmatrix`` then reads eight rows from eight
different bank groups); ``swizzle`` lays it out in 128-byte swizzled atoms instead
(``Buffer.swizzle``: what ``wgmma`` reads through descriptors), and fences the copies for the
matrix units' (async) view of shared memory before the barrier.

``async`` copies with ``cp.async`` (16 bytes each, straight from global to shared memory) into
two slots: step ``L = l`` first issues the copies of step ``l + 1`` into the other slot, then
waits for its own (issued one step before) and computes, so copies overlap products. 16-byte
copies need 16-byte aligned rows and pointers: the kernel becomes an aligned variant
(``aligned=True``: the launcher checks every pointer) followed by the same kernel with plain
copies, which runs when a pointer is not aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcc import dtypes
from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, free_vars, substitute
from tcc.ir.loopnest import add_index, const_extent, linear_coeff, mod_index, mul_index, replace_loads
from tcc.ir.loops import (
    AsyncCommit,
    AsyncCopy,
    AsyncWait,
    Barrier,
    Buffer,
    For,
    If,
    ProxyFence,
    Seq,
    Stmt,
    Store,
    seq,
)
from tcc.passes.loops.bind import shared_out
from tcc.passes.simplify import simplify

I64 = dtypes.i64
OPTIONS = ("pad", "async", "swizzle")


@dataclass(frozen=True)
class Box:
    """The part of ``T`` a block reads inside the cached loop: per moving dim of ``T``, its start
    (free of the tile's variables), extent, and the read's offset in it (``wi*32 + mi``)."""

    dims: tuple[int, ...]  # which dims of T move
    starts: tuple[Expr, ...]  # every dim of T
    extents: tuple[int, ...]  # the moving ones
    offsets: tuple[Expr, ...]  # the moving ones


def box(indices: tuple[Expr, ...], tile: dict[str, int], what: str, span: Span | None) -> Box:
    """The box of a read ``T[indices]`` over the variables ``tile`` (name -> extent)."""
    dims, starts, extents, offsets = [], [], [], []
    for d, index in enumerate(indices):
        moving = [v for v in tile if v in free_vars(index)]
        coeffs = {v: linear_coeff(index, v) for v in moving}
        if any(c is None or c < 0 for c in coeffs.values()):
            raise TccScheduleError(f"{what}: index {d} of the read is not affine with non-negative steps in "
                                   f"{', '.join(moving)}", span, "cache at a loop whose reads are plain tiles")
        starts.append(simplify(substitute(index, {v: Const(0, I64) for v in moving})))
        if not moving:
            continue
        ordered = sorted(moving, key=lambda v: -coeffs[v])  # type: ignore[operator]
        offset: Expr = _term(Var(ordered[0], I64), coeffs[ordered[0]])
        for v in ordered[1:]:
            offset = add_index(offset, _term(Var(v, I64), coeffs[v]))
        dims.append(d)
        extents.append(sum(c * (tile[v] - 1) for v, c in coeffs.items()) + 1)  # type: ignore[operator]
        offsets.append(offset)
    return Box(tuple(dims), tuple(starts), tuple(extents), tuple(offsets))


def _term(v: Var, c: int | None) -> Expr:
    return v if c == 1 else mul_index(v, int(c or 0))


def tile_variables(loop: For, chain: tuple[For, ...], warps: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """The variables a block's tile at ``loop`` spans: the warp grid's and the loops inside it."""
    tile = dict(warps)
    tile.update({f.var.name: const_extent(f) for f in chain})
    return tile


@dataclass
class TileCopy:
    """One cached read: its buffer, the box, and how the body now reads it."""

    buf: Buffer
    source: Buffer
    box: Box
    slots: int  # 2 with async (the buffer's first dim), else 1 (no slot dim)

    def read(self, slot: Expr | None) -> tuple[Expr, ...]:
        return ((slot,) if self.slots > 1 else ()) + self.box.offsets

    def copy(self, at: Var, step: Expr | None, slot: Expr | None, threads: int, thread: Var, names) -> Stmt:
        """The block's copy of the tile, this thread's share: at loop value ``step`` (None: the
        current one) into ``slot``; 16-byte ``cp.async`` pieces when ``slot`` is given."""
        where = {} if step is None else {at.name: step}
        starts = [substitute(s, where) for s in self.box.starts]
        chunk = 16 // self.buf.dtype.itemsize if slot is not None else 1
        loops = [Var(names(f"{self.buf.name}_d{n}"), I64) for n in range(len(self.box.dims))]
        src = list(starts)
        dst: list[Expr] = []
        for n, (d, v) in enumerate(zip(self.box.dims, loops)):
            pos: Expr = mul_index(v, chunk) if n == len(loops) - 1 and chunk > 1 else v
            src[d] = add_index(starts[d], pos)
            dst.append(pos)
        load = Load(self.source.name, tuple(src), self.source.dtype)
        body: Stmt = AsyncCopy(Load(self.buf.name, (slot, *dst), self.buf.dtype), load, 16) if chunk > 1 else \
            Store(self.buf.name, tuple(dst), load)
        extents = list(self.box.extents)
        if chunk > 1:
            extents[-1] //= chunk
        for v, n in reversed(list(zip(loops, extents))):
            body = For(v, Const(n, I64), body)
        return shared_out(body, threads, thread, (names(f"{self.buf.name}_s"), names(f"{self.buf.name}_f")))


def check_async(t: TileCopy, what: str, span: Span | None) -> None:
    """cp.async copies 16 bytes: the tile's rows must be whole pieces of ``T``'s last dim, each
    starting 16 bytes into a row of ``T`` (with an aligned pointer: checked at launch)."""
    chunk = 16 // t.buf.dtype.itemsize
    last = len(t.source.shape) - 1
    ok = (t.box.dims and t.box.dims[-1] == last and t.box.extents[-1] % chunk == 0
          and t.source.shape[-1] % chunk == 0 and _multiple_of(t.box.starts[last], chunk))
    if not ok:
        raise TccScheduleError(f"{what}: async copies move 16 bytes ({chunk} elements of {t.source.name}) at a time "
                               f"along its last dim; the tile's rows there are not whole aligned pieces", span,
                               f"tile the last dim of {t.source.name} by a multiple of {chunk}, or drop async")


def _multiple_of(e: Expr, m: int) -> bool:
    """Whether integer ``e`` is a multiple of ``m`` whatever its variables are."""
    if isinstance(e, Const):
        return int(e.value) % m == 0
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        return _multiple_of(e.a, m) and _multiple_of(e.b, m)
    if isinstance(e, Binary) and e.op == "mul":
        return _multiple_of(e.a, m) or _multiple_of(e.b, m)
    return False


def pipelined(loop: For, body: Stmt, copies: list[TileCopy], threads: int, thread: Var, names) -> For:
    """``loop`` (its body reading the tiles at slot ``loop % 2``) with the async copies double-buffered:
    the first step's copies before it, the next step's at its start, waits before the barrier.
    A body already pipelined by an earlier async cache at this loop takes the new copies in."""
    at = loop.var
    n = const_extent(loop)
    one = Const(1, I64)
    nxt = add_index(at, one)
    first = [c.copy(at, Const(0, I64), Const(0, I64), threads, thread, names) for c in copies]
    ahead = [c.copy(at, nxt, mod_index(nxt, 2), threads, thread, names) for c in copies]
    parts = list(body.stmts) if isinstance(body, Seq) else [body]
    if len(parts) >= 2 and _is_prologue(parts[0]) and _is_ahead(parts[1]):
        prologue, step = parts[0], parts[1]
        assert isinstance(prologue, If) and isinstance(step, If) and isinstance(prologue.then, Seq)
        prologue = If(prologue.cond, seq(*first, *prologue.then.stmts))
        assert isinstance(step.then, Seq)
        step = If(step.cond, seq(*ahead, *step.then.stmts), step.otherwise)
        rest = parts[2:]
        if any(c.buf.swizzle for c in copies) and not isinstance(rest[0], ProxyFence):
            rest = [ProxyFence(), *rest]
        return For(at, loop.extent, seq(prologue, step, *rest), loop.kind, loop.annotations, loop.span)
    is_first = Binary("eq", at, Const(0, I64), dtypes.boolean)
    more = Binary("lt", nxt, Const(n, I64), dtypes.boolean)
    prologue = If(is_first, seq(*first, AsyncCommit()))
    step = If(more, seq(*ahead, AsyncCommit(), AsyncWait(1)), AsyncWait(0))
    tail = () if isinstance(parts[-1], Barrier) else (Barrier(),)
    fence = (ProxyFence(),) if any(c.buf.swizzle for c in copies) else ()
    return For(at, loop.extent, seq(prologue, step, *fence, Barrier(), *parts, *tail), loop.kind,
               loop.annotations, loop.span)


def _is_prologue(s: Stmt) -> bool:
    return isinstance(s, If) and isinstance(s.then, Seq) and isinstance(s.then.stmts[-1], AsyncCommit)


def _is_ahead(s: Stmt) -> bool:
    return isinstance(s, If) and isinstance(s.then, Seq) and isinstance(s.then.stmts[-1], AsyncWait) \
        and isinstance(s.otherwise, AsyncWait)


def retarget(body: Stmt, name: str, reads: dict[tuple[Expr, ...], tuple[str, tuple[Expr, ...]]]) -> Stmt:
    """``body`` reading each cached ``name[indices]`` from its tile instead."""
    return replace_loads(body, lambda n: Load(reads[n.indices][0], reads[n.indices][1], n.dtype)
                         if n.buffer == name and n.indices in reads else None)
