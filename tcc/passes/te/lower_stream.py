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

With ``splits`` the keys come in parts, each with its own maxima and sums per row in a global
buffer (parts x rows, allocated for the whole function), and a second nest combines them per
row before the stores (:meth:`_Nest._split`); with ``keys_outside`` each part walks its tiles
outside the blocks of rows, so a tile of keys too large for any cache in total (a vocabulary's
weights) is read and copied once, not once per block of rows.
"""

from __future__ import annotations

import math
from dataclasses import replace
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
from tcc.ir.loops import MATRIX_STREAM, SEQUENTIAL, Allocate, Buffer, For, If, Stmt, Store, seq
from tcc.ir.te import Compute, OpTE, Stream
from tcc.passes.te.matrix_stream import matrix_form

I64 = dtypes.i64
BOOL = dtypes.boolean
STREAM = ("stream", True)  # the annotation of a stream's tile loop, which the CPU schedule looks for
ROWS = ("rows", True)  # a loop over the rows of a block (or its groups): each row's work is what vectorises
GROUP = ("group", True)  # a loop over a few rows whose sums the CPU keeps in registers (unrolled there)


class ExprLowering(Protocol):
    """What this needs of the statement lowering: expressions with their reductions' loops, and
    names that clash with nothing, and buffers for the whole function."""

    def expr(self, e: Expr, prelude: list[Stmt], allocs: list[Buffer]) -> Expr: ...

    def fresh(self, base: str) -> str: ...

    def global_buffer(self, buf: Buffer) -> None: ...


def stream_nest(stream: Stream, op: OpTE, lw: ExprLowering) -> Stmt:
    """The loop nest that computes every tensor of ``stream`` (see the module docstring)."""
    return _Nest(stream, op, lw).build()


# A call with fewer keys than 3/8 of a tile runs one tile of just those keys, in vectors of SHORT_KEYS
# (the last masked): a whole tile of 128 masked keys for 1 to 7 ran at 0.13-0.18 of the specialised
# kernel's throughput. From 3/8 of a tile up, whole tiles (their scores in registers) were faster:
# at 70 keys 0.85-0.92 against 0.55 as short vectors; at 33-47 the short tile 1.1-1.7 against 0.9.
SHORT_KEYS = 8


def _const(e: Expr) -> int:
    return int(e.value)  # type: ignore[attr-defined]


def _extent(e: Expr) -> int | Expr:
    """A constant extent as an int; a dynamic shape symbol's (known at the call) as it is."""
    return int(e.value) if isinstance(e, Const) else e


def _expr(n: int | Expr) -> Expr:
    return Const(n, I64) if isinstance(n, int) else n


def _ceil_div(n: int | Expr, d: int) -> Expr:
    return Const(-(-n // d), I64) if isinstance(n, int) else Binary("floordiv", iadd(n, d - 1), Const(d, I64), I64)


def _last(n: int | Expr) -> Expr:
    return Const(n - 1, I64) if isinstance(n, int) else Binary("sub", n, Const(1, I64), I64)


class _Nest:
    def __init__(self, stream: Stream, op: OpTE, lw: ExprLowering):
        self.s, self.op, self.lw = stream, op, lw
        # rows and keys: dynamic ones (known at the call) take whole tiles and a ragged last one
        self.rows, self.keys = _extent(stream.rows[-1].extent), _extent(stream.axis.extent)
        group = max(1, stream.group)
        rows = self.rows if isinstance(self.rows, int) else stream.tile_rows
        self.ti = max(1, min(stream.tile_rows, -(-rows // group) * group))
        self.g = group if self.ti % group == 0 else 1  # rows whose sums stay in registers together
        self.tj = max(1, min(stream.tile, self.keys if isinstance(self.keys, int) else stream.tile))
        self.q, self.j = stream.rows[-1].var.name, stream.axis.var.name
        self.it, self.jt = self._var(f"{self.q}_o"), self._var(f"{self.j}_o")
        self.ragged = not isinstance(self.keys, int) or self.keys % self.tj != 0
        self.short = not isinstance(self.rows, int) or self.rows % self.ti != 0  # a last block of fewer rows
        self.span: int | Expr = self.tj  # the keys a tile's loops run over
        self.dtype = op.tensors[stream.maximum].dtype
        self.run_max = self._local("run_max", self.dtype, (self.ti,))
        self.rescale = self._local("rescale", self.dtype, (self.ti,))
        self.p = self._local("p", stream.score.dtype, (self.ti, self.tj))
        self.run = [self._local(f"run_{x.tensor}", op.tensors[x.tensor].dtype,
                                (self.ti, *(_const(ax.extent) for ax in x.extra))) for x in stream.sums]
        self.part = self._var(f"{self.j}_p")  # with the keys in parts: which part
        self.per, self.nparts, self.parts = 0, 0, []
        if stream.splits and isinstance(self.rows, int) and isinstance(self.keys, int):  # (constant sizes only)
            padded = -(-self.rows // self.ti) * self.ti
            tiles = -(-self.keys // self.tj)
            self.per = -(-tiles // stream.splits)  # tiles of keys in a part
            self.nparts = -(-tiles // self.per)  # (none empty)
            self.parts = [  # each part's maxima and sums per row (padded to whole blocks)
                Buffer(self.lw.fresh(f"part_{name}"), op.tensors[name].dtype, (self.nparts, padded), "global")
                for name in stream.tensors]

    def _var(self, base: str) -> Var:
        return Var(self.lw.fresh(base), I64)

    def _local(self, base: str, dtype, shape: tuple[int, ...]) -> Buffer:
        return Buffer(self.lw.fresh(base), dtype, shape, "local")

    def _row(self, ii: Expr, clamp: bool = True) -> Expr:
        """The row at position ``ii`` of the block; past the last row (a short last block), the last
        one when ``clamp``: such rows are computed on real data and never stored."""
        row = iadd(imul(self.it, self.ti), ii)
        return Binary("min", row, _last(self.rows), I64) if clamp and self.short else row

    def _key(self, jj: Expr) -> Expr:
        """The key at position ``jj`` of the tile; past the last key, the last (its score masked)."""
        key = iadd(imul(self.jt, self.tj), jj)
        return Binary("min", key, _last(self.keys), I64) if self.ragged else key

    def _valid(self, jj: Var) -> Expr | None:
        return Binary("lt", iadd(imul(self.jt, self.tj), jj), _expr(self.keys), BOOL) if self.ragged else None

    def _at(self, e: Expr, ii: Expr, jj: Expr) -> Expr:
        """``e`` (in the stream's variables) at row ``ii`` of the block and key ``jj`` of the tile."""
        return substitute(e, {self.q: self._row(ii), self.j: self._key(jj)})

    def build(self) -> Stmt:
        if self.parts:
            return self._split()
        body: Stmt = seq(self._init(), self._tiles(), self._store())
        if not isinstance(self.keys, int):  # far fewer keys than a tile: one tile of just those, in short vectors
            self.span = imul(_ceil_div(self.keys, SHORT_KEYS), SHORT_KEYS) if self.tj % SHORT_KEYS == 0 else self.keys
            short = seq(self._init(), self._tiles(), self._store())
            self.span = self.tj
            body = If(Binary("ge", self.keys, Const(self.tj * 3 // 8, I64), BOOL), body, short)
        for buf in reversed([self.run_max, self.rescale, self.p, *self.run]):
            body = Allocate(buf, body)
        body = For(self.it, _ceil_div(self.rows, self.ti), body)
        outer = {ax.var.name: self._var(ax.var.name) for ax in self.s.rows[:-1]}
        nest = self._over(self.s.rows[:-1], body, outer)  # (loops of their own: nothing is computed at them)
        form = matrix_form(self.s, self.op, self._plain_expr, self.lw.fresh, outer)
        if form is None or not isinstance(nest, For):
            return nest
        return replace(nest, annotations=(*nest.annotations, (MATRIX_STREAM, form)))

    def _split(self) -> Stmt:
        """The keys in parts (``splits`` of them at most, run in parallel), each part's maxima and
        sums per row left in its row of the partial values; then for each block of rows the
        parts combined (the largest maximum, each sum rescaled from its part's maximum to it, as
        split-KV attention's combine does) into the block's running values, which the stores and
        epilogues read as they do without parts. Within a part either the tiles of keys run
        outside the blocks of rows (``keys_outside``: each tile of keys copied key-last once, then
        every block's scores against it and their online-softmax step on the part's values), or
        each block of rows walks the part's tiles with its running values in locals, as without
        parts, and leaves them in the part's rows (more blocks for a GPU short of rows)."""
        blocks = -(-self.rows // self.ti)
        work = self._keys_outside(blocks) if self.s.keys_outside else self._rows_outside(blocks)
        after = self._var(f"{self.q}_c")
        finish = seq(self._each_row(self._combine), self._store())
        for buf in reversed([self.run_max, *self.run]):
            finish = Allocate(buf, finish)
        finish = map_exprs(finish, lambda e: substitute(e, {self.it.name: after}))
        for buf in self.parts:
            self.lw.global_buffer(buf)
        return seq(For(self.part, Const(self.nparts, I64), work), For(after, Const(blocks, I64), finish))

    def _keys_outside(self, blocks: int) -> Stmt:
        """A part's work with its tiles of keys outside the blocks of rows (see :meth:`_split`)."""
        staged, copies, scores = self._scores()
        body: Stmt = seq(*copies, For(self.it, Const(blocks, I64), seq(scores, self._each_row(self._softmax))))
        for buf in reversed(staged):
            body = Allocate(buf, body)
        body = seq(self._init_parts(blocks * self.ti), self._part_tiles(body))
        for buf in (self.rescale, self.p):
            body = Allocate(buf, body)
        return body

    def _rows_outside(self, blocks: int) -> Stmt:
        """A part's work with each block of rows walking its tiles (see :meth:`_split`)."""
        staged, copies, scores = self._scores()
        tile: Stmt = seq(*copies, scores, self._each_row(self._softmax))
        for buf in reversed(staged):
            tile = Allocate(buf, tile)
        body: Stmt = seq(self._init(), self._part_tiles(tile), self._each_row(self._leave))
        for buf in reversed([self.run_max, self.rescale, self.p, *self.run]):
            body = Allocate(buf, body)
        return For(self.it, Const(blocks, I64), body)

    def _part_tiles(self, body: Stmt) -> For:
        """``body`` (written for the tile ``jt``) for each tile of keys of the part."""
        tiles, per = -(-self.keys // self.tj), self.per
        count = Binary("min", Const(per, I64), Binary("sub", Const(tiles, I64), imul(self.part, per), I64), I64)
        tile_var = self._var(f"{self.j}_t")
        at = iadd(imul(self.part, per), tile_var)
        return For(tile_var, count, map_exprs(body, lambda e: substitute(e, {self.jt.name: at})),
                   annotations=(SEQUENTIAL, STREAM))

    def _leave(self, ii: Var) -> Stmt:
        """Row ``ii``'s running maximum and sums into its row of the part's values."""
        at = (self.part, iadd(imul(self.it, self.ti), ii))
        return seq(*(Store(part.name, at, Load(buf.name, (ii,), buf.dtype))
                     for part, buf in zip(self.parts, [self.run_max, *self.run])))

    def _init_parts(self, rows: int) -> Stmt:
        """The part's maxima at -inf and its sums at 0, over every row of every block."""
        def row(r: Var) -> Stmt:
            first, *rest = self.parts
            return seq(Store(first.name, (self.part, r), Const(-math.inf, first.dtype)),
                       *(Store(b.name, (self.part, r), Const(0, b.dtype)) for b in rest))
        return self._loop(f"{self.q}_z", rows, row)

    def _combine(self, ii: Var) -> Stmt:
        """Row ``ii``'s maximum over the parts, and each sum: its parts' sums rescaled by
        ``exp(part maximum - maximum)`` (0 where the maximum is still -inf: no finite score)."""
        d = self.dtype
        row = iadd(imul(self.it, self.ti), ii)
        first, *rest = self.parts

        def over_parts(op: str, term, dtype) -> Reduce:
            k = self._var(f"{self.j}_k")
            return Reduce(op, (IterVar(k, Const(self.nparts, I64)),), term(k), dtype, dtype)
        top = over_parts("max", lambda k: Load(first.name, (k, row), d), d)
        parts = [self._assign(self.run_max, top, (ii,))]
        at_top = Load(self.run_max.name, (ii,), d)
        safe = Select(Binary("eq", at_top, Const(-math.inf, d), BOOL), Const(0.0, d), at_top, d)
        for part, buf in zip(rest, self.run):
            dt = buf.dtype
            total = over_parts("sum", lambda k, part=part, dt=dt: Binary(
                "mul", Load(part.name, (k, row), dt),
                cast(_exp(Binary("sub", Load(first.name, (k, row), d), safe, d)), dt), dt), dt)
            parts.append(self._assign(buf, total, (ii,)))
        return seq(*parts)

    def _plain_expr(self, e: Expr) -> Expr | None:
        """``e`` in the loop IR, None where that needs loops of its own (a reduction)."""
        if any(isinstance(n, Reduce) for n in walk(e)):
            return None
        return self.lw.expr(e, [], [])

    # ------------------------------------------------------------ loops

    def _loop(self, base: str, extent: int | Expr, body, notes: tuple = ()) -> Stmt:
        """``for v in 0..extent: body(v)`` with a variable of its own (schedules address loops by name)."""
        v = self._var(base)
        return For(v, _expr(extent), body(v), annotations=notes)

    def _block_rows(self, per: int) -> int | Expr:
        """Steps of ``per`` rows that the block holds: all of its ``ti`` rows, or with a dynamic
        row count only those up to the last row (a call of one query row computes one, not 64)."""
        if isinstance(self.rows, int):
            return self.ti // per
        left = Binary("sub", self.rows, imul(self.it, self.ti), I64)
        return Binary("min", Const(self.ti // per, I64), _ceil_div(left, per), I64)

    def _each_row(self, body) -> Stmt:
        return self._loop(f"{self.q}_i", self._block_rows(1), body, (ROWS,))

    def _each_group(self, body) -> Stmt:
        """``body(first row, rows)`` for each group of ``g`` rows; ``rows(f)`` loops ``f(row)``
        over the group (unrolled by the CPU schedule: its sums stay in registers)."""
        def group(ig: Var) -> Stmt:
            def rows(f) -> Stmt:
                return self._loop(f"{self.q}_u", self.g, lambda ru: f(iadd(imul(ig, self.g), ru), ru), (GROUP,))
            return body(rows)
        return self._loop(f"{self.q}_g", self._block_rows(self.g), group, (ROWS,))

    def _over(self, axes: tuple[IterVar, ...], body: Stmt, names: dict[str, Var] | None = None) -> Stmt:
        """``body`` in loops over ``axes``, each with a variable of its own (or of ``names``)."""
        names = names if names is not None else {ax.var.name: self._var(ax.var.name) for ax in axes}
        body = map_exprs(body, lambda e: substitute(e, names))
        for ax in reversed(axes):
            body = For(names[ax.var.name], ax.extent, body)
        return body

    def _keys(self, base: str, body) -> Stmt:
        return self._loop(f"{self.j}_{base}", self.span, body)

    # ------------------------------------------------------------ phases

    def _init(self) -> Stmt:
        def row(ii: Var) -> Stmt:
            parts: list[Stmt] = [Store(self.run_max.name, (ii,), Const(-math.inf, self.dtype))]
            for x, buf in zip(self.s.sums, self.run):
                parts.append(self._over(x.extra, Store(buf.name, (ii, *(ax.var for ax in x.extra)),
                                                       Const(0, buf.dtype))))
            return seq(*parts)
        return self._each_row(row)

    def _tiles(self) -> Stmt:
        count: Expr = _ceil_div(self.keys, self.tj)
        if self.s.limit is not None:
            last = Binary("min", iadd(imul(self.it, self.ti), self.ti - 1), _last(self.rows), I64)
            limit = substitute(self.s.limit, {self.q: last})
            needed = Binary("floordiv", iadd(limit, self.tj - 1), Const(self.tj, I64), I64)
            count = Binary("min", count, Binary("max", needed, Const(0, I64), I64), I64)
        tiles, copies, scores = self._scores()
        weighted = [self._weighted(x, buf) for x, buf in zip(self.s.sums, self.run) if x.weight is not None]
        body: Stmt = seq(*copies, scores, self._each_row(self._softmax), *weighted)
        for buf in tiles:
            body = Allocate(buf, body)
        return For(self.jt, count, body, annotations=(SEQUENTIAL, STREAM))

    def _softmax(self, ii: Var) -> Stmt:
        """Row ``ii``: the tile's maximum, the rescale of what earlier tiles summed, the tile's
        exponentials (in place of its scores), and the plain sums."""
        d = self.dtype
        (mx, *running), at = self._running(ii)
        p = self.p.name
        new, safe = (self._local(n, d, (1,)) for n in ("new_max", "safe_max"))
        zero = (Const(0, I64),)
        at_new, at_safe = Load(new.name, zero, d), Load(safe.name, zero, d)
        tile_max = self._reduce("max", lambda jj: cast(Load(p, (ii, jj), self.p.dtype), d), d)
        parts: list[Stmt] = [self._assign(new, Binary("max", Load(mx, at, d), tile_max, d))]
        minus_inf = Binary("eq", at_new, Const(-math.inf, d), BOOL)
        parts.append(Store(safe.name, zero, Select(minus_inf, Const(0.0, d), at_new, d)))
        parts.append(Store(self.rescale.name, (ii,), _exp(Binary("sub", Load(mx, at, d), at_safe, d))))
        parts.append(self._keys("e", lambda jj: Store(p, (ii, jj), _exp(
            Binary("sub", Load(p, (ii, jj), self.p.dtype), cast(at_safe, self.p.dtype), self.p.dtype)))))
        for x, buf, name in zip(self.s.sums, self.run, running):
            if x.weight is None:
                dt = buf.dtype
                total = self._reduce("sum", lambda jj, dt=dt: cast(Load(p, (ii, jj), self.p.dtype), dt), dt)
                kept = Binary("mul", Load(name, at, dt), cast(Load(self.rescale.name, (ii,), d), dt), dt)
                parts.append(self._assign(Buffer(name, dt, ()), Binary("add", kept, total, dt), at))
        parts.append(Store(mx, at, at_new))
        return Allocate(new, Allocate(safe, seq(*parts)))

    def _running(self, ii: Var) -> tuple[list[str], tuple[Expr, ...]]:
        """The buffers of row ``ii``'s running maximum and sums, and where in them its values are:
        the block's locals, or with the tiles of keys outside the rows the part's row of its values."""
        if not self.s.keys_outside:
            return [self.run_max.name, *(b.name for b in self.run)], (ii,)
        return [b.name for b in self.parts], (self.part, iadd(imul(self.it, self.ti), ii))

    def _weighted(self, x, buf: Buffer) -> Stmt:
        """``run[r, extra] = run[r, extra] * rescale[r] + sum over the tile of p[r, jj] * weight``,
        a group of rows at a time: their sums in a small buffer, each key's weights read once
        for all of them."""
        dt = buf.dtype
        shape = tuple(_const(ax.extent) for ax in x.extra)
        extra = tuple(ax.var for ax in x.extra)

        def group(rows) -> Stmt:
            acc = self._local(f"sum_{x.tensor}", dt, (self.g, *shape))
            start = rows(lambda ii, ru: self._over(x.extra, Store(acc.name, (ru, *extra), Binary(
                "mul", Load(buf.name, (ii, *extra), dt), cast(Load(self.rescale.name, (ii,), self.dtype), dt), dt))))

            def add(jj: Var) -> Stmt:
                def one(ii: Expr, ru: Var) -> Stmt:
                    term = Binary("mul", cast(Load(self.p.name, (ii, jj), self.p.dtype), dt),
                                  cast(self._at(x.weight, ii, jj), dt), dt)
                    step = Binary("add", Load(acc.name, (ru, *extra), dt), term, dt)
                    return self._over(x.extra, self._assign(acc, step, (ru, *extra)))
                return rows(one)
            back = rows(lambda ii, ru: self._over(x.extra, Store(buf.name, (ii, *extra),
                                                                 Load(acc.name, (ru, *extra), dt))))
            return Allocate(acc, seq(start, self._keys("v", add), back))
        return self._each_group(group)

    def _reduce(self, op: str, term, dtype) -> Reduce:
        jj = self._var(f"{self.j}_r")
        return Reduce(op, (IterVar(jj, _expr(self.span)),), term(jj), dtype, dtype)

    def _assign(self, buf: Buffer, e: Expr, at: tuple[Expr, ...] = (Const(0, I64),)) -> Stmt:
        """``buf[at] = e``, with the loops of the reductions in ``e`` ahead of it."""
        prelude: list[Stmt] = []
        allocs: list[Buffer] = []
        value = self.lw.expr(e, prelude, allocs)
        body: Stmt = seq(*prelude, Store(buf.name, at, value))
        for b in reversed(allocs):
            body = Allocate(b, body)
        return body

    def _scores(self) -> tuple[list[Buffer], list[Stmt], Stmt]:
        """The tile's scores, ``p[r, jj]``, ``-inf`` past the last key. Where the score is one sum
        wrapped in elementwise work (``sum[d](Q * K) * scale``) and the stream stages keys, its
        reads that follow the key but not the row (``K``) are first copied into a tile laid out
        key-last, and each group of rows sums over ``d`` outside a loop over the tile's keys that
        reads that copy at unit stride (a small matrix product). Else each score on its own."""
        red = [n for n in walk(self.s.score) if isinstance(n, Reduce)]
        plain = [], [], self._each_row(lambda ii: self._keys("s", lambda jj: self._score_store(self.s.score, ii, jj)))
        if not (self.s.stage_keys and len(red) == 1 and red[0].op == "sum"
                and not any(isinstance(n, Reduce) for n in walk(red[0].body))):
            return plain
        r = red[0]
        own = {ax.var.name for ax in r.axes}
        outer = {ax.var.name for ax in self.s.rows[:-1]} | set(self.op.scalars) | set(self.op.symbols)
        staged = {id(n): n for n in walk(r.body) if isinstance(n, Read) and self.j in free_vars(n)
                  and self.q not in free_vars(n) and free_vars(n) <= {self.j, *own, *outer}}
        if not staged:
            return plain
        tiles = {k: self._local(f"{n.tensor}_tile", n.dtype, (*(_const(ax.extent) for ax in r.axes), self.tj))
                 for k, n in staged.items()}
        copies = [self._copy(n, tiles[k], r.axes) for k, n in staged.items()]
        return list(tiles.values()), copies, self._product(r, {k: (tiles[k], n) for k, n in staged.items()})

    def _copy(self, read: Read, tile: Buffer, axes: tuple[IterVar, ...]) -> Stmt:
        """``tile[d, jj] = K[..., key(jj), d]``: the tile's keys, key-last."""
        def copy(jj: Var) -> Stmt:
            value = self.lw.expr(substitute(read, {self.j: self._key(jj)}), [], [])
            return Store(tile.name, (*(ax.var for ax in axes), jj), value)
        return self._over(axes, self._keys("c", copy))

    def _product(self, r: Reduce, staged: dict) -> Stmt:
        """For each group of rows: ``acc[ru, jj] += body`` with the sum's loops outside the
        group's rows and the tile's keys, then each score from its sum."""
        axes = tuple(ax.var for ax in r.axes)

        def group(rows) -> Stmt:
            acc = self._local("score_acc", r.acc_dtype, (self.g, self.tj))
            init = rows(lambda ii, ru: self._keys("z", lambda jj: Store(acc.name, (ru, jj), Const(0, r.acc_dtype))))

            def add(ii: Expr, ru: Var) -> Stmt:
                def one(jj: Var) -> Stmt:
                    body = transform(r.body, lambda n: None if id(n) not in staged else
                                     Load(staged[id(n)][0].name, (*axes, jj), n.dtype))
                    value = self.lw.expr(substitute(body, {self.q: self._row(ii), self.j: self._key(jj)}), [], [])
                    return Store(acc.name, (ru, jj), Binary("add", Load(acc.name, (ru, jj), r.acc_dtype),
                                                             cast(value, r.acc_dtype), r.acc_dtype))
                return self._keys("k", one)
            loops = self._over(r.axes, rows(add))

            def final(ii: Expr, ru: Var) -> Stmt:
                def one(jj: Var) -> Stmt:
                    summed = cast(Load(acc.name, (ru, jj), r.acc_dtype), r.dtype)
                    return self._score_store(transform(self.s.score, lambda n: summed if n is r else None), ii, jj)
                return self._keys("w", one)
            return Allocate(acc, seq(init, loops, rows(final)))
        return self._each_group(group)

    def _score_store(self, score: Expr, ii: Expr, jj: Var) -> Stmt:
        """``p[ii, jj] = score`` at row ``ii`` and key ``jj``, ``-inf`` past the last key."""
        value = self._at(score, ii, jj)
        valid = self._valid(jj)
        if valid is not None:
            value = Select(valid, value, Const(-math.inf, value.dtype), value.dtype)
        return self._assign(self.p, value, (ii, jj))

    def _store(self) -> Stmt:
        """Each finished row: the stream's tensors that others read, and its epilogues computed
        from the running values in place of those tensors."""
        outer = tuple(ax.var for ax in self.s.rows[:-1])
        local = {self.s.maximum: self.run_max, **{x.tensor: buf for x, buf in zip(self.s.sums, self.run)}}

        def row(ii: Var) -> Stmt:
            at = (*outer, self._row(ii, clamp=False))
            parts: list[Stmt] = []
            for name, buf in local.items():
                if name not in self.s.internal:
                    extra = next((x.extra for x in self.s.sums if x.tensor == name), ())
                    value = Load(buf.name, (ii, *(ax.var for ax in extra)), buf.dtype)
                    parts.append(self._over(extra, Store(name, (*at, *(ax.var for ax in extra)), value)))
            parts += [self._epilogue(c, ii, at, local) for c in self.op.computes if c.tensor in self.s.epilogues]
            body: Stmt = seq(*parts)
            if self.short:
                body = If(Binary("lt", self._row(ii, clamp=False), _expr(self.rows), BOOL), body)
            return body
        return self._each_row(row)

    def _epilogue(self, c: Compute, ii: Var, at: tuple[Expr, ...], local: dict[str, Buffer]) -> Stmt:
        """``c`` for row ``ii``: its reads of the stream's tensors are reads of the running values."""
        k = len(self.s.rows)

        def visit(n: Expr) -> Expr | None:
            if isinstance(n, Read) and n.tensor in local:
                return Load(local[n.tensor].name, (ii, *n.indices[k:]), n.dtype)
            return None
        body = substitute(transform(c.body, visit), {ax.var.name: v for ax, v in zip(c.axes, at)})
        extra = c.axes[k:]
        return self._over(extra, self._assign(Buffer(c.tensor, self.op.tensors[c.tensor].dtype, ()),
                                              body, (*at, *(ax.var for ax in extra))))


def _exp(e: Expr) -> Expr:
    return Call("exp", (e,), e.dtype)
