"""Lowering of a :class:`~tcc.ir.te.Stream`: one loop nest that walks the stream axis in tiles.

For every point of the rows but the last, and every tile of ``tile_rows`` values of the last
(a block of queries), the nest keeps per row a running maximum and the running sums (locals),
and for each tile of ``tile`` keys in order:

    p[r, jj] = score                        (a tile of scores; past the last key: -inf)
    new = max(run_max[r], max over jj of p[r, jj])
    c = exp(run_max[r] - new);  p[r, jj] = exp(p[r, jj] - new)
    run_sum[r, x] = run_sum[r, x] * c + sum over jj of p[r, jj] * weight
    run_max[r] = new

then stores the maxima and sums. A row whose scores are all ``-inf`` so far subtracts 0
instead of ``-inf`` (``exp(-inf - -inf)`` is NaN): its exponentials are 0 and its sums stay 0
until a finite score comes. The tile loop is sequential (each tile rescales what the earlier
ones summed); with a ``limit`` it stops at the last tile holding a key below the block's
largest limit, so a causal mask's upper triangle of tiles is never computed. The keys of one
tile are read once per block of queries, which is what keeps them in cache.
"""

from __future__ import annotations

import math
from typing import Protocol

from tcc import dtypes
from tcc.ir.expr import (
    Binary,
    Call,
    Const,
    Expr,
    IterVar,
    Load,
    Read,
    Reduce,
    Select,
    Var,
    cast,
    free_vars,
    iadd,
    imul,
    substitute,
    transform,
    walk,
)
from tcc.ir.loopnest import map_exprs
from tcc.ir.loops import SEQUENTIAL, Allocate, Buffer, For, If, Stmt, Store, seq
from tcc.ir.te import OpTE, Stream

I64 = dtypes.i64
BOOL = dtypes.boolean
STREAM = ("stream", True)  # the annotation of a stream's tile loop, which the CPU schedule looks for
ROWS = ("rows", True)  # a loop over the rows of a block: each row's work is what vectorises


class ExprLowering(Protocol):
    """What this needs of the statement lowering: expressions with their reductions' loops, and
    names that clash with nothing."""

    def expr(self, e: Expr, prelude: list[Stmt], allocs: list[Buffer]) -> Expr: ...

    def fresh(self, base: str) -> str: ...


def stream_nest(stream: Stream, op: OpTE, lw: ExprLowering) -> Stmt:
    """The loop nest that computes every tensor of ``stream`` (see the module docstring)."""
    return _Nest(stream, op, lw).build()


def _const(e: Expr) -> int:
    return int(e.value)  # type: ignore[attr-defined]


class _Nest:
    def __init__(self, stream: Stream, op: OpTE, lw: ExprLowering):
        self.s, self.op, self.lw = stream, op, lw
        self.rows = _const(stream.rows[-1].extent)
        self.keys = _const(stream.axis.extent)
        self.ti = max(1, min(stream.tile_rows, self.rows))
        self.tj = max(1, min(stream.tile, self.keys))
        self.q, self.j = stream.rows[-1].var.name, stream.axis.var.name
        self.it, self.ii = self._var(f"{self.q}_o"), self._var(f"{self.q}_i")
        self.jt = self._var(f"{self.j}_o")
        self.row = iadd(imul(self.it, self.ti), self.ii)
        self.ragged = self.keys % self.tj != 0
        self.dtype = op.tensors[stream.maximum].dtype
        self.run_max = self._local("run_max", self.dtype, (self.ti,))
        self.p = self._local("p", stream.score.dtype, (self.ti, self.tj))
        self.run = [self._local(f"run_{x.tensor}", op.tensors[x.tensor].dtype,
                                (self.ti, *(_const(ax.extent) for ax in x.extra))) for x in stream.sums]

    def _var(self, base: str) -> Var:
        return Var(self.lw.fresh(base), I64)

    def _local(self, base: str, dtype, shape: tuple[int, ...]) -> Buffer:
        return Buffer(self.lw.fresh(base), dtype, shape, "local")

    def _key(self, jj: Var) -> Expr:
        """The key at position ``jj`` of the tile; past the last key, the last (its score masked)."""
        key = iadd(imul(self.jt, self.tj), jj)
        return Binary("min", key, Const(self.keys - 1, I64), I64) if self.ragged else key

    def _valid(self, jj: Var) -> Expr | None:
        return Binary("lt", iadd(imul(self.jt, self.tj), jj), Const(self.keys, I64), BOOL) if self.ragged else None

    def _at(self, e: Expr, jj: Var) -> Expr:
        """``e`` (in the stream's variables) at this block's row and key ``jj`` of the tile."""
        return substitute(e, {self.q: self.row, self.j: self._key(jj)})

    def build(self) -> Stmt:
        body: Stmt = seq(self._init(), self._tiles(), self._store())
        for buf in reversed([self.run_max, self.p, *self.run]):
            body = Allocate(buf, body)
        body = For(self.it, Const(-(-self.rows // self.ti), I64), body)
        for ax in reversed(self.s.rows[:-1]):
            body = For(ax.var, ax.extent, body)
        return body

    # ------------------------------------------------------------ pieces

    def _each_row(self, body: Stmt, guard: bool = True) -> Stmt:
        """``body`` for each row of the block that exists (the last block may be short)."""
        if guard and self.rows % self.ti:
            body = If(Binary("lt", self.row, Const(self.rows, I64), BOOL), body)
        ii = self._var(self.ii.name)
        body = map_exprs(body, lambda e: substitute(e, {self.ii.name: ii}))
        return For(ii, Const(self.ti, I64), body, annotations=(ROWS,))

    def _over(self, axes: tuple[IterVar, ...], body: Stmt) -> Stmt:
        """``body`` in loops over ``axes``, each with a variable of its own (the schedules
        address loops by name)."""
        names = {ax.var.name: self._var(ax.var.name) for ax in axes}
        body = map_exprs(body, lambda e: substitute(e, names))
        for ax in reversed(axes):
            body = For(names[ax.var.name], ax.extent, body)
        return body

    def _tile_loop(self, base: str, body) -> Stmt:
        jj = self._var(base)
        return For(jj, Const(self.tj, I64), body(jj))

    def _init(self) -> Stmt:
        parts: list[Stmt] = [Store(self.run_max.name, (self.ii,), Const(-math.inf, self.dtype))]
        for x, buf in zip(self.s.sums, self.run):
            zero = Store(buf.name, (self.ii, *(ax.var for ax in x.extra)), Const(0, buf.dtype))
            parts.append(self._over(x.extra, zero))
        return self._each_row(seq(*parts), guard=False)

    def _tiles(self) -> Stmt:
        count: Expr = Const(-(-self.keys // self.tj), I64)
        if self.s.limit is not None:
            last = Binary("min", iadd(imul(self.it, self.ti), self.ti - 1), Const(self.rows - 1, I64), I64)
            limit = substitute(self.s.limit, {self.q: last})
            needed = Binary("floordiv", iadd(limit, self.tj - 1), Const(self.tj, I64), I64)
            count = Binary("min", count, Binary("max", needed, Const(0, I64), I64), I64)
        tiles, copies, score = self._staged()
        body: Stmt = seq(*copies, self._each_row(self._row_tile(score)))
        for buf in tiles:
            body = Allocate(buf, body)
        return For(self.jt, count, body, annotations=(SEQUENTIAL, STREAM))

    def _row_tile(self, score: Stmt) -> Stmt:
        d = self.dtype
        mx, p = self.run_max.name, self.p.name
        new, safe, rescale = (self._local(n, d, (1,)) for n in ("new_max", "safe_max", "rescale"))
        zero = (Const(0, I64),)

        def at(b: Buffer) -> Load:
            return Load(b.name, zero, d)

        tile_max = self._reduce("max", lambda jj: cast(Load(p, (self.ii, jj), self.p.dtype), d), d)
        parts: list[Stmt] = [score, self._assign(new, Binary("max", Load(mx, (self.ii,), d), tile_max, d))]
        minus_inf = Binary("eq", at(new), Const(-math.inf, d), BOOL)
        parts.append(Store(safe.name, zero, Select(minus_inf, Const(0.0, d), at(new), d)))
        parts.append(Store(rescale.name, zero, _exp(Binary("sub", Load(mx, (self.ii,), d), at(safe), d))))
        parts.append(self._tile_loop(f"{self.j}_e", lambda jj: Store(p, (self.ii, jj), _exp(
            Binary("sub", Load(p, (self.ii, jj), self.p.dtype), cast(at(safe), self.p.dtype), self.p.dtype)))))
        parts += [self._sum(x, buf, at(rescale)) for x, buf in zip(self.s.sums, self.run)]
        parts.append(Store(mx, (self.ii,), at(new)))
        body: Stmt = seq(*parts)
        for buf in (rescale, safe, new):
            body = Allocate(buf, body)
        return body

    def _reduce(self, op: str, term, dtype) -> Reduce:
        jj = self._var(f"{self.j}_r")
        return Reduce(op, (IterVar(jj, Const(self.tj, I64)),), term(jj), dtype, dtype)

    def _assign(self, buf: Buffer, e: Expr, at: tuple[Expr, ...] = (Const(0, I64),)) -> Stmt:
        """``buf[at] = e``, with the loops of the reductions in ``e`` ahead of it."""
        prelude: list[Stmt] = []
        allocs: list[Buffer] = []
        value = self.lw.expr(e, prelude, allocs)
        body: Stmt = seq(*prelude, Store(buf.name, at, value))
        for b in reversed(allocs):
            body = Allocate(b, body)
        return body

    def _staged(self) -> tuple[list[Buffer], list[Stmt], Stmt]:
        """The tile's scores, ``p[r, jj]``, ``-inf`` past the last key. Where the score is one sum
        wrapped in elementwise work (``sum[d](Q * K) * scale``), and the stream stages keys, its
        reads that follow the key but not the row (``K``) are first copied into a tile laid out
        key-last, once per block of rows; each row then sums over ``d`` outside a loop over the
        tile's keys that reads that copy at unit stride. Else each score is computed on its own."""
        red = [n for n in walk(self.s.score) if isinstance(n, Reduce)]
        if not (self.s.stage_keys and len(red) == 1 and red[0].op == "sum"
                and not any(isinstance(n, Reduce) for n in walk(red[0].body))):
            return [], [], self._tile_loop(f"{self.j}_s", self._score_at)
        r = red[0]
        own = {ax.var.name for ax in r.axes}
        staged = {id(n): n for n in walk(r.body) if isinstance(n, Read) and self.j in free_vars(n)
                  and self.q not in free_vars(n) and free_vars(n) <= {self.j, *own, *self._outer()}}
        if not staged:
            return [], [], self._tile_loop(f"{self.j}_s", self._score_at)
        tiles = {k: self._local(f"{n.tensor}_tile", n.dtype, (*(_const(ax.extent) for ax in r.axes), self.tj))
                 for k, n in staged.items()}
        copies = [self._copy(n, tiles[k], r.axes) for k, n in staged.items()]
        return list(tiles.values()), copies, self._interchanged(r, {k: (tiles[k], n) for k, n in staged.items()})

    def _copy(self, read: Read, tile: Buffer, axes: tuple[IterVar, ...]) -> Stmt:
        """``tile[d, jj] = K[..., key(jj), d]``: the tile's keys, key-last."""
        jj = self._var(f"{self.j}_c")
        value = self.lw.expr(substitute(read, {self.j: self._key(jj)}), [], [])
        return self._over(axes, For(jj, Const(self.tj, I64), Store(tile.name, (*(ax.var for ax in axes), jj), value)))

    def _outer(self) -> set[str]:
        return {ax.var.name for ax in self.s.rows[:-1]} | set(self.op.scalars) | set(self.op.symbols)

    def _interchanged(self, r: Reduce, staged: dict) -> Stmt:
        """``acc[jj] += body`` with the sum's loops outside the tile's keys, then the score."""
        acc = self._local("score_acc", r.acc_dtype, (self.tj,))
        jj0, jj1, jj2 = (self._var(f"{self.j}_{k}") for k in ("z", "k", "w"))
        init = For(jj0, Const(self.tj, I64), Store(acc.name, (jj0,), Const(0, r.acc_dtype)))
        axes = tuple(ax.var for ax in r.axes)

        def visit(n: Expr) -> Expr | None:
            hit = staged.get(id(n))
            return None if hit is None else Load(hit[0].name, (*axes, jj1), n.dtype)

        body = substitute(transform(r.body, visit), {self.q: self.row, self.j: self._key(jj1)})
        step = Store(acc.name, (jj1,), Binary("add", Load(acc.name, (jj1,), r.acc_dtype),
                                               cast(self.lw.expr(body, [], []), r.acc_dtype), r.acc_dtype))
        loops = self._over(r.axes, For(jj1, Const(self.tj, I64), step))
        summed = cast(Load(acc.name, (jj2,), r.acc_dtype), r.dtype)
        after = transform(self.s.score, lambda n: summed if n is r else None)
        final = For(jj2, Const(self.tj, I64), self._score_store(after, jj2))
        return Allocate(acc, seq(init, loops, final))

    def _score_at(self, jj: Var) -> Stmt:
        return self._score_store(self.s.score, jj)

    def _score_store(self, score: Expr, jj: Var) -> Stmt:
        """``p[r, jj] = score`` at key ``jj``, ``-inf`` past the last key."""
        value = self._at(score, jj)
        valid = self._valid(jj)
        if valid is not None:
            value = Select(valid, value, Const(-math.inf, value.dtype), value.dtype)
        return self._assign(self.p, value, (self.ii, jj))

    def _sum(self, x, buf: Buffer, rescale: Expr) -> Stmt:
        """``run[r, extra] = run[r, extra] * c + sum over the tile of p * weight``."""
        dt = buf.dtype

        def term(jj: Var) -> Expr:
            t: Expr = cast(Load(self.p.name, (self.ii, jj), self.p.dtype), dt)
            if x.weight is not None:
                t = Binary("mul", t, cast(self._at(x.weight, jj), dt), dt)
            return t

        at = (self.ii, *(ax.var for ax in x.extra))
        kept = Binary("mul", Load(buf.name, at, dt), cast(rescale, dt), dt)
        value = Binary("add", kept, self._reduce("sum", term, dt), dt)
        return self._over(x.extra, self._assign(buf, value, at))

    def _store(self) -> Stmt:
        outer = tuple(ax.var for ax in self.s.rows[:-1])
        parts: list[Stmt] = [Store(self.s.maximum, (*outer, self.row), Load(self.run_max.name, (self.ii,), self.dtype))]
        for x, buf in zip(self.s.sums, self.run):
            extra = tuple(ax.var for ax in x.extra)
            parts.append(self._over(x.extra, Store(x.tensor, (*outer, self.row, *extra),
                                                   Load(buf.name, (self.ii, *extra), buf.dtype))))
        return self._each_row(seq(*parts))


def _exp(e: Expr) -> Expr:
    return Call("exp", (e,), e.dtype)
