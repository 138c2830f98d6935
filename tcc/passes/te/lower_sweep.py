"""Lowering of a :class:`~tcc.ir.te.Sweep`: one loop nest over tiles of (row, key) pairs.

For every point of the outer axes (batch x heads):

    C[...] = 0 for each sum over the keys (a value per row: dQ)
    for each tile of keys (in order):
        acc = 0 for each sum over the rows (a value per key: dK, dV)
        for each tile of rows:
            P[ii, jj] = its statement, for each pair intermediate in order (locals)
            part[ii, x] = sum[jj](term);  C[row, x] += part[ii, x]     (each sum over the keys)
            part[jj, x] = sum[ii](term);  acc[jj, x] += part[jj, x]    (each sum over the rows)
        C[key, x] = acc[jj, x]

Each ``part`` is a small matrix product (a tile of pairs times a tile of an operand: ``ds . K``),
which the CPU schedule tiles as a GEMM, as it does the pairs' own sums (the scores ``Q . K^T``).
Where the outer points (heads) are fewer than twice the threads, or on the GPU, the sweep is
``split``: the sums over the rows in one nest whose parallel work is heads x tiles of keys (each
going over every tile of rows), the sums over the keys in another, heads x tiles of rows: the
pairs the two share are computed twice (7 small products for 5), the price of the parallelism.
A short last tile computes its pairs at the last row or key (in bounds) and makes those a sum
reads 0 there, or guards the term. Where every sum's term is 0 at keys past a limit of the row (a
causal mask), each tile of keys starts at the first tile of rows that reaches it. Nothing over
rows x keys outlives a tile.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    IterVar,
    Load,
    Read,
    Reduce,
    Select,
    Var,
    cast,
    iadd,
    imul,
    substitute,
    transform,
    walk,
)
from tcc.ir.loopnest import subst
from tcc.ir.loops import MATRIX_SWEEP, SEQUENTIAL, SWEPT_BY_MATRIX, Allocate, Buffer, For, If, Stmt, Store, seq
from tcc.ir.te import Compute, OpTE, Sweep
from tcc.passes.simplify import simplify
from tcc.passes.te.lower_stream import ROWS, STREAM, ExprLowering
from tcc.passes.te.matrix_sweep import matrix_form

I64 = dtypes.i64
BOOL = dtypes.boolean


def sweep_nest(sweep: Sweep, op: OpTE, lw: ExprLowering) -> Stmt:
    """The loop nest that computes every sum of ``sweep`` (see the module docstring)."""
    return _Nest(sweep, op, lw).build()


def _const(e: Expr) -> int:
    return int(e.value)  # type: ignore[attr-defined]


class _Nest:
    def __init__(self, sweep: Sweep, op: OpTE, lw: ExprLowering):
        self.s, self.op, self.lw = sweep, op, lw
        self.defs = {c.tensor: c for c in op.computes if c.tensor in sweep.statements}
        self.rows, self.keys = _const(sweep.row.extent), _const(sweep.key.extent)
        self.ti, self.tj = max(1, min(sweep.tile_rows, self.rows)), max(1, min(sweep.tile_keys, self.keys))
        self.outer = tuple(self._var(ax.var.name) for ax in sweep.outer)
        self.it, self.jt = self._var(f"{sweep.row.var.name}_o"), self._var(f"{sweep.key.var.name}_o")
        self.row_tile: Expr = self.it  # the tile of rows: ``it``, or where a causal limit starts them ``first + it``
        self.tiles = {p: Buffer(self.lw.fresh(p), op.tensors[p].dtype, (self.ti, self.tj), "local")
                      for p in sweep.pairs}
        extra = {c: tuple(_const(ax.extent) for ax in self.defs[c].axes[len(self.outer) + 1:]) for c in sweep.sums}
        acc = {c: self.defs[c].body.acc_dtype for c in sweep.sums}  # (a sum's own type: f32 where it stores f16)
        self.parts = {c: Buffer(self.lw.fresh(f"{c}_part"), acc[c],
                                (self.tj if c in sweep.by_key else self.ti, *extra[c]), "local") for c in sweep.sums}
        self.summed = {r.tensor for c in sweep.sums for r in walk(self.defs[c].body) if isinstance(r, Read)}
        self.accs = {c: Buffer(self.lw.fresh(f"{c}_acc"), acc[c], (self.tj, *extra[c]), "local")
                     for c in sweep.by_key}  # a tile of keys' sums over every tile of rows

    def _var(self, base: str) -> Var:
        return Var(self.lw.fresh(base), I64)

    def _loop(self, base: str, extent: int | Expr, body, notes: tuple = ()) -> Stmt:
        v = self._var(base)
        return For(v, Const(extent, I64) if isinstance(extent, int) else extent, body(v), annotations=notes)

    def _at(self, tile: Expr, size: int, extent: int, k: Expr, clamp: bool = True) -> Expr:
        """Position ``k`` of ``tile``; past the end, the last (when ``clamp``)."""
        at = iadd(imul(tile, size), k)
        return Binary("min", at, Const(extent - 1, I64), I64) if clamp and extent % size else at

    def _row(self, ii: Expr, clamp: bool = True) -> Expr:
        return self._at(self.row_tile, self.ti, self.rows, ii, clamp)

    def _key(self, jj: Expr, clamp: bool = True) -> Expr:
        return self._at(self.jt, self.tj, self.keys, jj, clamp)

    def _valid(self, ii: Expr, jj: Expr) -> Expr | None:
        """Whether row ``ii`` and key ``jj`` of the tiles exist (None: always)."""
        conds = []
        if self.rows % self.ti:
            conds.append(Binary("lt", self._row(ii, clamp=False), Const(self.rows, I64), BOOL))
        if self.keys % self.tj:
            conds.append(Binary("lt", self._key(jj, clamp=False), Const(self.keys, I64), BOOL))
        if not conds:
            return None
        return conds[0] if len(conds) == 1 else Binary("and", conds[0], conds[1], BOOL)

    def _inside(self, ii: Expr | None, jj: Expr | None, body: Stmt) -> Stmt:
        """``body`` where row ``ii`` and key ``jj`` of the tiles exist (those past the end skipped)."""
        conds = []
        if ii is not None and self.rows % self.ti:
            conds.append(Binary("lt", self._row(ii, clamp=False), Const(self.rows, I64), BOOL))
        if jj is not None and self.keys % self.tj:
            conds.append(Binary("lt", self._key(jj, clamp=False), Const(self.keys, I64), BOOL))
        for cond in conds:
            body = If(cond, body)
        return body

    def build(self) -> Stmt:
        by_row = [c for c in self.s.sums if c not in self.s.by_key]
        if not self.s.split:
            return self._keys_outer(list(self.s.by_key), by_row)
        nests = []  # (each its own nest: the tiles of keys, then those of rows, are parallel work)
        if self.s.by_key:
            nests.append(self._keys_outer(list(self.s.by_key), []))
        if by_row:
            nests.append(self._rows_outer(by_row))
        return seq(*self._with_matrix_form(nests))

    def _with_matrix_form(self, nests: list[Stmt]) -> list[Stmt]:
        """``nests`` carrying the sweep's matrix form (:mod:`.matrix_sweep`), where it has one: the
        first as ``MATRIX_SWEEP``, the others as ``SWEPT_BY_MATRIX`` (a schedule that takes the form
        drops them)."""
        form = matrix_form(self.s, self.op, self._plain_expr, self.lw.fresh)
        if isinstance(form, str) or not all(isinstance(n, For) for n in nests):
            return nests
        return [replace(n, annotations=(*n.annotations, (MATRIX_SWEEP if k == 0 else SWEPT_BY_MATRIX, form)))
                for k, n in enumerate(nests)]

    def _plain_expr(self, e: Expr) -> Expr | None:
        """``e`` in the loop IR, None where that needs loops of its own (a reduction)."""
        if any(isinstance(n, Reduce) for n in walk(e)):
            return None
        return self.lw.expr(e, [], [])

    def _fresh_nest(self, sums: list[str]) -> list[str]:
        """New variables and locals for a nest that computes ``sums``; the pairs they need, in order."""
        self.outer = tuple(self._var(ax.var.name) for ax in self.s.outer)
        self.it, self.jt = self._var(f"{self.s.row.var.name}_o"), self._var(f"{self.s.key.var.name}_o")
        self.row_tile = self.it
        needed = {r.tensor for c in sums for r in walk(self.defs[c].body)
                  if isinstance(r, Read) and r.tensor in self.tiles}
        pending = list(needed)
        while pending:
            for r in walk(self.defs[pending.pop()].body):
                if isinstance(r, Read) and r.tensor in self.tiles and r.tensor not in needed:
                    needed.add(r.tensor)
                    pending.append(r.tensor)
        self.tiles = {p: replace(b, name=self.lw.fresh(p)) for p, b in self.tiles.items()}
        self.parts = {c: replace(b, name=self.lw.fresh(f"{c}_part")) for c, b in self.parts.items()}
        self.accs = {c: replace(b, name=self.lw.fresh(f"{c}_acc")) for c, b in self.accs.items()}
        return [p for p in self.s.pairs if p in needed]

    def _keys_outer(self, by_key: list[str], by_row: list[str]) -> Stmt:
        """Tiles of keys outside tiles of rows: the sums over the rows in locals for a tile of keys;
        those over the keys (unless ``split``: then there are none) added into their tensors, which
        makes the tiles of keys sequential. Split, the tiles of keys are parallel work."""
        pairs = self._fresh_nest([*by_key, *by_row])
        count: Expr = Const(-(-self.rows // self.ti), I64)
        first = self._first_row_tile()
        if first is not None:  # the tiles of rows before it add 0 to this tile of keys
            self.row_tile = iadd(first, self.it)
            count = Binary("max", Binary("sub", count, first, I64), Const(0, I64), I64)
        tile: Stmt = seq(*(self._pair(p) for p in pairs), *(self._add_by_row(c) for c in by_row),
                         *(self._add_by_key(c) for c in by_key))
        if self.s.limit is not None and first is None:  # a tile of rows whose last row stops before the keys adds 0
            names = {ax.var.name: v for ax, v in zip(self.s.outer, self.outer)}
            names[self.s.row.var.name] = self._last_row()
            tile = If(Binary("lt", imul(self.jt, self.tj), substitute(self.s.limit, names), BOOL), tile)
        rows = For(self.it, count, tile, annotations=(SEQUENTIAL, STREAM) if self.s.split else (ROWS,))
        keys: Stmt = seq(*(self._zero_acc(c) for c in by_key), rows, *(self._store_by_key(c) for c in by_key))
        locals_ = [*(self.tiles[p] for p in pairs), *(self.parts[c] for c in [*by_key, *by_row]),
                   *(self.accs[c] for c in by_key)]
        if self.s.split:
            return self._over_outer_and(self.jt, -(-self.keys // self.tj), _allocated(locals_, keys))
        else:
            body = _allocated(locals_, seq(*(self._zero(c) for c in by_row), For(
                self.jt, Const(-(-self.keys // self.tj), I64), keys, annotations=(SEQUENTIAL, STREAM))))
        return self._over_outer(body)

    def _rows_outer(self, by_row: list[str]) -> Stmt:
        """Tiles of rows (parallel work) outside tiles of keys: the sums over the keys in locals for
        a tile of rows, stored as it ends; under a causal limit, the tiles of keys stop at the last
        row's."""
        pairs = self._fresh_nest(by_row)
        count: Expr = Const(-(-self.keys // self.tj), I64)
        if self.s.limit is not None:
            names = {ax.var.name: v for ax, v in zip(self.s.outer, self.outer)}
            names[self.s.row.var.name] = self._last_row()
            needed = Binary("floordiv", iadd(substitute(self.s.limit, names), self.tj - 1), Const(self.tj, I64), I64)
            count = Binary("min", count, Binary("max", needed, Const(0, I64), I64), I64)
        sums = {c: Buffer(self.lw.fresh(f"{c}_rows"), self.parts[c].dtype, self.parts[c].shape, "local")
                for c in by_row}
        tile = seq(*(self._pair(p) for p in pairs), *(self._add_part(c, sums[c]) for c in by_row))
        keys = For(self.jt, count, tile, annotations=(SEQUENTIAL, STREAM))
        rows = seq(*(self._fill(sums[c], c, None) for c in by_row), keys, *(self._fill(sums[c], c, c) for c in by_row))
        locals_ = [*(self.tiles[p] for p in pairs), *(self.parts[c] for c in by_row), *sums.values()]
        return self._over_outer_and(self.it, -(-self.rows // self.ti), _allocated(locals_, rows))

    def _add_part(self, name: str, into: Buffer) -> Stmt:
        part = self.parts[name]

        def add(ii: Var) -> Stmt:
            return self._extra(self.defs[name], lambda xs: Store(into.name, (ii, *xs), Binary(
                "add", Load(into.name, (ii, *xs), into.dtype), Load(part.name, (ii, *xs), into.dtype), into.dtype)))
        return seq(self._part(name, self.ti, "row"), self._loop(f"{name}_a", self.ti, add))

    def _fill(self, buf: Buffer, name: str, result: str | None) -> Stmt:
        """``buf = 0`` (``result`` None), or the sum's rows of the tile from ``buf``."""
        def one(ii: Var) -> Stmt:
            def put(xs: tuple[Var, ...]) -> Stmt:
                if result is None:
                    return Store(buf.name, (ii, *xs), Const(0, buf.dtype))
                at = (*self.outer, self._row(ii, clamp=False), *xs)
                return Store(result, at, cast(Load(buf.name, (ii, *xs), buf.dtype), self.op.tensors[result].dtype))
            loops = self._extra(self.defs[name], put)
            return loops if result is None else self._inside(ii, None, loops)
        return self._loop(f"{name}_f", self.ti, one)

    def _last_row(self) -> Expr:
        return Binary("min", iadd(imul(self.row_tile, self.ti), self.ti - 1), Const(self.rows - 1, I64), I64)

    def _over_outer_and(self, tile: Var, count: int, body: Stmt) -> Stmt:
        """``body`` for every outer point and ``tile`` in ``0..count``, as one loop (the parallel work
        of a split sweep: heads x tiles, where the heads alone are fewer than the threads)."""
        points = math.prod(_const(ax.extent) for ax in self.s.outer) * count
        flat = self._var("pair_tiles")
        mapping: dict[str, Expr] = {tile.name: Binary("mod", flat, Const(count, I64), I64)}
        rest: Expr = Binary("floordiv", flat, Const(count, I64), I64)
        for v, ax in reversed(list(zip(self.outer, self.s.outer))):
            mapping[v.name] = Binary("mod", rest, ax.extent, I64)
            rest = Binary("floordiv", rest, ax.extent, I64)
        return For(flat, Const(points, I64), subst(body, mapping))

    def _over_outer(self, body: Stmt) -> Stmt:
        for v, ax in reversed(list(zip(self.outer, self.s.outer))):
            body = For(v, ax.extent, body)
        return body

    def _first_row_tile(self) -> Expr | None:
        """The first tile of rows whose last row's limit ``a * row + c`` (``a`` a positive constant)
        passes the tile of keys' first key, or one before it: ``(jt * tj - c - a * (ti - 1)) // (a * ti)``,
        at least 0. None where the limit is not of that form (an ``if`` then skips each tile)."""
        if self.s.limit is None:
            return None
        outer = {ax.var.name: v for ax, v in zip(self.s.outer, self.outer)}
        at = [simplify(substitute(self.s.limit, outer | {self.s.row.var.name: Const(x, I64)})) for x in (0, 1)]
        slope = simplify(Binary("sub", at[1], at[0], I64))
        if not (isinstance(slope, Const) and slope.value > 0):
            return None
        a = int(slope.value)
        top = Binary("sub", imul(self.jt, self.tj), iadd(at[0], a * (self.ti - 1)), I64)
        return Binary("max", Binary("floordiv", top, Const(a * self.ti, I64), I64), Const(0, I64), I64)

    # ------------------------------------------------------------ pieces

    def _names(self, c: Compute, row: Expr, key: Expr) -> dict[str, Expr]:
        """A pair statement's variables at the outer point, row ``row`` and key ``key``."""
        k = len(self.outer)
        return {ax.var.name: v for ax, v in zip(c.axes[:k], self.outer)} | \
            {c.axes[k].var.name: row, c.axes[k + 1].var.name: key}

    def _tiled(self, e: Expr, ii: Expr, jj: Expr) -> Expr:
        """``e`` with its reads of pair intermediates at its own pair read from their tiles."""
        return transform(e, lambda n: Load(self.tiles[n.tensor].name, (ii, jj), n.dtype)
                         if isinstance(n, Read) and n.tensor in self.tiles else None)

    def _pair(self, name: str) -> Stmt:
        c = self.defs[name]
        tile = self.tiles[name]

        def one(ii: Var, jj: Var) -> Stmt:
            body = substitute(self._tiled(c.body, ii, jj), self._names(c, self._row(ii), self._key(jj)))
            valid = self._valid(ii, jj)
            if valid is not None and name in self.summed:  # (a sum's product with it adds 0 there)
                body = Select(valid, body, Const(0, tile.dtype), tile.dtype)
            return self._assign(tile, body, (ii, jj))
        return self._loop(f"{name}_i", self.ti, lambda ii: self._loop(f"{name}_j", self.tj, lambda jj: one(ii, jj)),
                          (ROWS,))

    def _term(self, c: Compute, row: Expr, key: Expr, ii: Expr, jj: Expr, at: tuple[Expr, ...]) -> Expr:
        """The summed term of sum statement ``c`` at row ``ii`` and key ``jj`` of the tiles, its own
        leading axis at ``at[0]`` and its extra axes at ``at[1:]``."""
        red = c.body
        assert isinstance(red, Reduce)
        k = len(self.outer)
        r = red.axes[0].var.name
        y = c.axes[k].var.name
        by_key = c.tensor in self.s.by_key
        tiled = self._tiled(red.body, ii, jj)  # (a sum reads its pairs at (r, y) or (y, r): a tile's position)
        names = {ax.var.name: v for ax, v in zip(c.axes[:k], self.outer)}
        names |= {r: row if by_key else key, y: key if by_key else row}
        names |= {ax.var.name: v for ax, v in zip(c.axes[k + 1:], at[1:])}
        return cast(substitute(tiled, names), red.acc_dtype)

    def _extra(self, c: Compute, body) -> Stmt:
        """``body(extra variables)`` in loops over the sum's axes after its own."""
        axes = c.axes[len(self.outer) + 1:]
        vs = [self._var(ax.var.name) for ax in axes]
        stmt = body(tuple(vs))
        for v, ax in reversed(list(zip(vs, axes))):
            stmt = For(v, ax.extent, stmt)
        return stmt

    def _zero(self, name: str) -> Stmt:
        c = self.defs[name]
        dt = self.op.tensors[name].dtype
        return self._loop(f"{name}_z", self.rows, lambda y: self._extra(
            c, lambda xs: Store(name, (*self.outer, y, *xs), Const(0, dt))))

    def _part(self, name: str, over: int, axis: str) -> Stmt:
        """``part[y, x] = sum over the tile's other axis of the term``: ``y`` the tile's row
        (``axis`` "row", a sum over the keys) or key. A matrix product of a tile of pairs with a
        tile of an operand, which the CPU schedule tiles as a GEMM; past the end of the rows or
        keys the pairs are 0 (or the term is guarded)."""
        c = self.defs[name]
        part = self.parts[name]
        dt = part.dtype

        def one(y: Var) -> Stmt:
            def put(xs: tuple[Var, ...]) -> Stmt:
                r = self._var(f"{name}_k")
                ii, jj = (y, r) if axis == "row" else (r, y)
                term = self._term(c, self._row(ii), self._key(jj), ii, jj, (y, *xs))
                valid = self._valid(ii, jj)
                if valid is not None and not _zero_with_pairs(term, {b.name for b in self.tiles.values()}):
                    term = Select(valid, term, Const(0, dt), dt)
                extent = self.tj if axis == "row" else self.ti
                return self._assign(part, Reduce("sum", (IterVar(r, Const(extent, I64)),), term, dt, dt), (y, *xs))
            return self._extra(c, put)
        return self._loop(f"{name}_p", over, one, (ROWS,))

    def _add_by_row(self, name: str) -> Stmt:
        c = self.defs[name]
        dt = self.op.tensors[name].dtype
        part = self.parts[name]

        def add(ii: Var) -> Stmt:
            def one(xs: tuple[Var, ...]) -> Stmt:
                at = (*self.outer, self._row(ii, clamp=False), *xs)
                return Store(name, at, Binary("add", Load(name, at, dt), Load(part.name, (ii, *xs), dt), dt))
            return self._inside(ii, None, self._extra(c, one))
        return seq(self._part(name, self.ti, "row"), self._loop(f"{name}_a", self.ti, add))

    def _zero_acc(self, name: str) -> Stmt:
        acc = self.accs[name]
        return self._loop(f"{name}_z", self.tj, lambda jj: self._extra(
            self.defs[name], lambda xs: Store(acc.name, (jj, *xs), Const(0, acc.dtype))))

    def _add_by_key(self, name: str) -> Stmt:
        acc, part = self.accs[name], self.parts[name]

        def add(jj: Var) -> Stmt:
            def one(xs: tuple[Var, ...]) -> Stmt:
                at = (jj, *xs)
                return Store(acc.name, at, Binary("add", Load(acc.name, at, acc.dtype), Load(part.name, at, acc.dtype),
                                                  acc.dtype))
            return self._extra(self.defs[name], one)
        return seq(self._part(name, self.tj, "key"), self._loop(f"{name}_a", self.tj, add))

    def _store_by_key(self, name: str) -> Stmt:
        acc = self.accs[name]

        def one(jj: Var) -> Stmt:
            return self._inside(None, jj, self._extra(self.defs[name], lambda xs: Store(
                name, (*self.outer, self._key(jj, clamp=False), *xs),
                cast(Load(acc.name, (jj, *xs), acc.dtype), self.op.tensors[name].dtype))))
        return self._loop(f"{name}_s", self.tj, one)

    def _assign(self, buf: Buffer, e: Expr, at: tuple[Expr, ...]) -> Stmt:
        """``buf[at] = e``, with the loops of the reductions in ``e`` ahead of it."""
        prelude: list[Stmt] = []
        allocs: list[Buffer] = []
        value = self.lw.expr(e, prelude, allocs)
        body: Stmt = seq(*prelude, Store(buf.name, at, value))
        for b in reversed(allocs):
            body = Allocate(b, body)
        return body



def _zero_with_pairs(e: Expr, tiles: set[str]) -> bool:
    """Whether ``e`` is a product with a tile of pairs (0 where the tile is)."""
    while isinstance(e, Cast):
        e = e.a
    if isinstance(e, Select) and isinstance(e.b, Const) and e.b.value == 0:
        return _zero_with_pairs(e.a, tiles)
    if isinstance(e, Binary) and e.op == "mul":
        return any(isinstance(x, Load) and x.buffer in tiles or _zero_with_pairs(x, tiles) for x in (e.a, e.b))
    return False


def _allocated(buffers: list[Buffer], body: Stmt) -> Stmt:
    for buf in reversed(buffers):
        body = Allocate(buf, body)
    return body
