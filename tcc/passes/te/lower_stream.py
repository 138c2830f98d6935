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
from tcc.ir.expr import Binary, Call, Const, Expr, IterVar, Load, Reduce, Select, Var, cast, iadd, imul, substitute
from tcc.ir.loops import SEQUENTIAL, Allocate, Buffer, For, If, Stmt, Store, seq
from tcc.ir.te import OpTE, Stream

I64 = dtypes.i64
BOOL = dtypes.boolean


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
        q, j = stream.rows[-1].var.name, stream.axis.var.name
        self.it, self.ii = self._var(f"{q}_o"), self._var(f"{q}_i")
        self.jt, self.jj = self._var(f"{j}_o"), self._var(f"{j}_i")
        self.row = iadd(imul(self.it, self.ti), self.ii)
        key = iadd(imul(self.jt, self.tj), self.jj)
        ragged = self.keys % self.tj != 0
        self.key = Binary("min", key, Const(self.keys - 1, I64), I64) if ragged else key  # always a real key
        self.valid = Binary("lt", key, Const(self.keys, I64), BOOL) if ragged else None
        self.dtype = op.tensors[stream.maximum].dtype
        self.run_max = self._local("run_max", self.dtype, (self.ti,))
        self.p = self._local("p", stream.score.dtype, (self.ti, self.tj))
        self.step = self._local("step", self.dtype, (3,))  # the tile's new maximum, it made safe, the rescale
        self.run = [self._local(f"run_{x.tensor}", op.tensors[x.tensor].dtype,
                                (self.ti, *(_const(ax.extent) for ax in x.extra))) for x in stream.sums]

    def _var(self, base: str) -> Var:
        return Var(self.lw.fresh(base), I64)

    def _local(self, base: str, dtype, shape: tuple[int, ...]) -> Buffer:
        return Buffer(self.lw.fresh(base), dtype, shape, "local")

    def build(self) -> Stmt:
        body: Stmt = seq(self._init(), self._tiles(), self._store())
        for buf in reversed([self.run_max, self.p, self.step, *self.run]):
            body = Allocate(buf, body)
        body = For(self.it, Const(-(-self.rows // self.ti), I64), body)
        for ax in reversed(self.s.rows[:-1]):
            body = For(ax.var, ax.extent, body)
        return body

    # ------------------------------------------------------------ pieces

    def _each_row(self, body: Stmt) -> Stmt:
        """``body`` for each row of the block that exists (the last block may be short)."""
        if self.rows % self.ti:
            body = If(Binary("lt", self.row, Const(self.rows, I64), BOOL), body)
        return For(self.ii, Const(self.ti, I64), body)

    def _over(self, axes: tuple[IterVar, ...], body: Stmt) -> Stmt:
        for ax in reversed(axes):
            body = For(ax.var, ax.extent, body)
        return body

    def _init(self) -> Stmt:
        parts: list[Stmt] = [Store(self.run_max.name, (self.ii,), Const(-math.inf, self.dtype))]
        for x, buf in zip(self.s.sums, self.run):
            zero = Store(buf.name, (self.ii, *(ax.var for ax in x.extra)), Const(0, buf.dtype))
            parts.append(self._over(x.extra, zero))
        return For(self.ii, Const(self.ti, I64), seq(*parts))

    def _tiles(self) -> Stmt:
        count: Expr = Const(-(-self.keys // self.tj), I64)
        if self.s.limit is not None:
            last = Binary("min", iadd(imul(self.it, self.ti), self.ti - 1), Const(self.rows - 1, I64), I64)
            limit = substitute(self.s.limit, {self.s.rows[-1].var.name: last})
            needed = Binary("floordiv", iadd(limit, self.tj - 1), Const(self.tj, I64), I64)
            count = Binary("min", count, Binary("max", needed, Const(0, I64), I64), I64)
        return For(self.jt, count, self._each_row(self._row_tile()), annotations=(SEQUENTIAL,))

    def _row_tile(self) -> Stmt:
        d = self.dtype
        mx, p, step = self.run_max.name, self.p.name, self.step.name
        at = (self.ii, self.jj)
        zero = (Const(0, I64),)
        new, safe, rescale = (Load(step, (Const(k, I64),), d) for k in range(3))
        parts: list[Stmt] = [self._scores(), Store(step, zero, Load(mx, (self.ii,), d))]
        parts.append(For(self.jj, Const(self.tj, I64),
                         Store(step, zero, Binary("max", new, cast(Load(p, at, self.p.dtype), d), d))))
        minus_inf = Binary("eq", new, Const(-math.inf, d), BOOL)
        parts.append(Store(step, (Const(1, I64),), Select(minus_inf, Const(0.0, d), new, d)))
        parts.append(Store(step, (Const(2, I64),), _exp(Binary("sub", Load(mx, (self.ii,), d), safe, d))))
        exps = _exp(Binary("sub", Load(p, at, self.p.dtype), cast(safe, self.p.dtype), self.p.dtype))
        parts.append(For(self.jj, Const(self.tj, I64), Store(p, at, exps)))
        parts += [self._sum(x, buf, rescale) for x, buf in zip(self.s.sums, self.run)]
        parts.append(Store(mx, (self.ii,), new))
        return seq(*parts)

    def _scores(self) -> Stmt:
        """``p[r, jj]`` for the tile: the score at each key, ``-inf`` past the last one."""
        score = substitute(self.s.score, {self.s.rows[-1].var.name: self.row, self.s.axis.var.name: self.key})
        prelude: list[Stmt] = []
        allocs: list[Buffer] = []
        value = self.lw.expr(score, prelude, allocs)
        if self.valid is not None:
            value = Select(self.valid, value, Const(-math.inf, value.dtype), value.dtype)
        body: Stmt = seq(*prelude, Store(self.p.name, (self.ii, self.jj), value))
        for buf in reversed(allocs):
            body = Allocate(buf, body)
        return For(self.jj, Const(self.tj, I64), body)

    def _sum(self, x, buf: Buffer, rescale: Expr) -> Stmt:
        """``run[r, extra] = run[r, extra] * c + sum over the tile of p * weight``."""
        dt = buf.dtype
        term: Expr = cast(Load(self.p.name, (self.ii, self.jj), self.p.dtype), dt)
        if x.weight is not None:
            weight = substitute(x.weight, {self.s.rows[-1].var.name: self.row, self.s.axis.var.name: self.key})
            term = Binary("mul", term, cast(weight, dt), dt)
        total = Reduce("sum", (IterVar(self.jj, Const(self.tj, I64)),), term, dt, dt)
        at = (self.ii, *(ax.var for ax in x.extra))
        prelude: list[Stmt] = []
        allocs: list[Buffer] = []
        value = self.lw.expr(Binary("add", Binary("mul", Load(buf.name, at, dt), cast(rescale, dt), dt), total, dt),
                             prelude, allocs)
        body: Stmt = seq(*prelude, Store(buf.name, at, value))
        for b in reversed(allocs):
            body = Allocate(b, body)
        return self._over(x.extra, body)

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
