"""Lower a specialised TE op to the loop IR: one plain loop nest per statement.

Results and inputs become function parameters; intermediates become global allocations
that live until the end of the function; reductions become a local accumulator and a
loop nest ahead of the store that uses them. Reads of a ``pad`` view become a guarded load
of the padded tensor whose index is clamped, so the load itself is always in bounds.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

from tcc import dtypes
from tcc.dtypes import DType
from tcc.ir.expr import Binary, Const, Expr, Load, Read, Reduce, Select, Var, cast, substitute, walk
from tcc.ir.loops import SEQUENTIAL, Allocate, Buffer, For, LoopFunc, Stmt, Store, map_stmt, seq
from tcc.ir.te import Compute, OpTE, Pad
from tcc.passes.simplify import simplify
from tcc.passes.te.lower_stream import stream_nest
from tcc.passes.te.lower_sweep import sweep_nest

I64 = dtypes.i64
LOCAL_LIMIT = 64 * 1024  # bytes: a per-row intermediate up to this size lives on the stack


def lower(op: OpTE) -> LoopFunc:
    """Loop nests for a specialised, bounds-checked op."""
    return _Lowering(op).run()


def reduce_identity(op: str, dtype: DType) -> Const:
    """The value a reduction starts from."""
    if op == "sum":
        return Const(False if dtype.is_bool else 0, dtype)
    if op == "prod":
        return Const(1, dtype)
    if dtype.is_bool:
        return Const(op == "min", dtype)
    if dtype.is_float:
        return Const(-math.inf if op == "max" else math.inf, dtype)
    info = (1 << (dtype.bits - 1))
    return Const(-info if op == "max" else info - 1, dtype)


def combine(op: str, acc: Expr, value: Expr) -> Expr:
    """One reduction step."""
    binop = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}[op]
    return Binary(binop, acc, value, acc.dtype)


def _index_names(op: OpTE) -> set[str]:
    """Every index variable the op's statements and reductions use."""
    names = set()
    for c in op.computes:
        names |= {ax.var.name for ax in c.axes}
        names |= {ax.var.name for n in walk(c.body) if isinstance(n, Reduce) for ax in n.axes}
    return names


def _drop_empty_loops(body: Stmt) -> Stmt:
    """Loops that run zero times (a zero-size dim) go: what they would store touches no element,
    and passes and code generators need not reason about tensors without elements."""
    return map_stmt(body, lambda s: seq() if isinstance(s, For) and isinstance(s.extent, Const)
                    and s.extent.value == 0 else None)


class _Lowering:
    def __init__(self, op: OpTE):
        self.op = op
        self.taken = set(op.tensors) | set(op.scalars) | _index_names(op)  # fresh names never shadow
        self.counter = 0
        self.rows: dict[str, tuple[int, Buffer]] = {}  # per-row intermediates of fusion groups
        self.scratch: list[Buffer] = []  # global buffers nests share (a stream's partial rows), function-wide

    def run(self) -> LoopFunc:
        op = self.op
        params: list[Buffer | Var] = []
        for p in op.params:
            if p in op.tensors:
                params.append(self._buffer(p))
            else:
                params.append(Var(p, op.scalars[p].dtype))
        params.extend(self._buffer(r) for r in op.results)
        params.extend(Var(name, I64) for name in op.dynamic)  # shape symbols the call passes in
        internal = {t for g in op.groups for t in g.internal} | {t for s in op.streams for t in s.internal} \
            | {t for s in op.sweeps for t in s.pairs}
        temps = list(dict.fromkeys(c.tensor for c in op.computes  # (a tensor added into has several statements)
                                   if op.tensors[c.tensor].kind == "temp" and c.tensor not in internal))
        body = _drop_empty_loops(seq(*self._nests()))
        for buf in reversed([*map(self._buffer, temps), *self.scratch]):
            body = Allocate(buf, body)
        return LoopFunc(op.name, params, body)

    def _nests(self) -> list[Stmt]:
        """One loop nest per statement, or per fusion group."""
        starts = {g.tensors[0]: g for g in self.op.groups}
        streams = {s.maximum: s for s in self.op.streams}
        sweeps = {s.statements[0]: s for s in self.op.sweeps}
        computes = self.op.computes
        nests, i = [], 0
        while i < len(computes):
            group = starts.pop(computes[i].tensor, None)  # (once: a later += into it is no group's start)
            stream = streams.get(computes[i].tensor)
            sweep = sweeps.get(computes[i].tensor)
            if sweep is not None:  # its pairs and sums in one nest over tiles of pairs
                nests.append(sweep_nest(sweep, self.op, self))
                i += len(sweep.statements)
            elif stream is not None:  # its statements, one after the other, in one nest
                nests.append(stream_nest(stream, self.op, self))
                i += len(stream.statements)
            elif group is None:
                nests.append(self._statement(computes[i]))
                i += 1
            else:
                nests.append(self._group(group, computes[i:i + len(group.tensors)]))
                i += len(group.tensors)
        return nests

    def _buffer(self, name: str) -> Buffer:
        t = self.op.tensors[name]
        return Buffer(name, t.dtype, t.dims(), "global")

    def global_buffer(self, buf: Buffer) -> None:
        """``buf`` allocated for the whole function (for :mod:`.lower_stream`): the nests that
        write and read it are then separate statements of the body, kernels of their own on a GPU."""
        self.scratch.append(buf)

    def expr(self, e: Expr, prelude: list[Stmt], allocs: list[Buffer]) -> Expr:
        """``e`` lowered (for :mod:`.lower_stream`)."""
        return self._expr(e, prelude, allocs)

    def fresh(self, base: str) -> str:
        """A name no other variable or buffer has (for :mod:`.lower_stream`)."""
        return self._fresh(base)

    def _fresh(self, base: str) -> str:
        while True:
            self.counter += 1
            name = f"{base}_{self.counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def _group(self, group, members: list[Compute]) -> Stmt:
        """Members under ``group.shared`` common outer loops; internal temps shrink to one row."""
        k = group.shared
        first = members[0]
        shared = [Var(self._fresh(ax.var.name), I64) for ax in first.axes[:k]]
        for name in group.internal:
            t = self.op.tensors[name]
            shape = t.dims()[k:]
            size = t.dtype.itemsize
            for d in shape:
                size = size * d if isinstance(d, int) and isinstance(size, int) else None
            scope = "local" if size is not None and size <= LOCAL_LIMIT else "global"
            self.rows[name] = (k, Buffer(name, t.dtype, shape, scope))
        parts = []
        for c in members:
            mapping = {ax.var.name: v for ax, v in zip(c.axes[:k], shared)}
            body = substitute(c.body, mapping)
            parts.append(self._statement(Compute(c.tensor, c.axes[k:], body, c.span), lead=tuple(shared)))
        inner: Stmt = seq(*parts)
        for name in reversed(group.internal):
            inner = Allocate(self.rows[name][1], inner)
        for v, ax in reversed(list(zip(shared, first.axes[:k]))):
            inner = For(v, ax.extent, inner, span=first.span)
        return inner

    def _statement(self, c: Compute, lead: tuple[Expr, ...] = ()) -> Stmt:
        allocs: list[Buffer] = []
        prelude: list[Stmt] = []
        value = self._expr(c.body, prelude, allocs)
        if c.accumulate:
            store = self._accumulate(c, value, prelude, allocs)
        else:
            indices = self._row_indices(c.tensor, (*lead, *(ax.var for ax in c.axes)))
            store = Store(c.tensor, indices, value, c.span)
        inner: Stmt = seq(*prelude, store)
        for buf in reversed(allocs):
            inner = Allocate(buf, inner)
        for ax in reversed(c.axes):
            notes = (SEQUENTIAL,) if ax.var.name in c.sequential else ()
            inner = For(ax.var, ax.extent, inner, annotations=notes, span=c.span)
        return inner

    def _accumulate(self, c: Compute, value: Expr, prelude: list[Stmt], allocs: list[Buffer]) -> Store:
        """``T[lhs] = T[lhs] + value``, marked so that schedules know other iterations may hit the
        same element (a scatter is never in a fusion group: its indices are the tensor's own)."""
        indices = tuple(self._expr(i, prelude, allocs) for i in c.target_indices())
        dtype = self.op.tensors[c.tensor].dtype
        total = Binary("add", Load(c.tensor, indices, dtype), value, dtype)
        return Store(c.tensor, indices, total, c.span, accumulate=True)

    def _row_indices(self, tensor: str, indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        """Indices into a tensor's buffer: a per-row intermediate drops the shared leading ones."""
        row = self.rows.get(tensor)
        return indices[row[0]:] if row else indices

    def _expr(self, e: Expr, prelude: list[Stmt], allocs: list[Buffer]) -> Expr:
        """Lower ``e``; reductions in it append their loops to ``prelude``."""
        if isinstance(e, Reduce):
            return self._reduce(e, prelude, allocs)
        if isinstance(e, Read):  # its indices may read data (E[idx[n], d]): lowered first
            return self._read(replace(e, indices=tuple(self._expr(i, prelude, allocs) for i in e.indices)))
        updates = {}
        for f in fields(e):
            value = getattr(e, f.name)
            if isinstance(value, Expr):
                updates[f.name] = self._expr(value, prelude, allocs)
            elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
                updates[f.name] = tuple(self._expr(v, prelude, allocs) for v in value)
        return replace(e, **updates) if updates else e

    def _reduce(self, r: Reduce, prelude: list[Stmt], allocs: list[Buffer]) -> Expr:
        acc = Buffer(self._fresh("acc"), r.acc_dtype, (1,), "local")
        allocs.append(acc)
        zero = (Const(0, I64),)
        prelude.append(Store(acc.name, zero, reduce_identity(r.op, r.acc_dtype)))
        body_prelude: list[Stmt] = []
        body_allocs: list[Buffer] = []
        value = self._expr(r.body, body_prelude, body_allocs)
        step: Stmt = seq(*body_prelude,
                         Store(acc.name, zero, combine(r.op, Load(acc.name, zero, r.acc_dtype), value), r.span))
        for buf in reversed(body_allocs):
            step = Allocate(buf, step)
        for ax in reversed(r.axes):
            step = For(ax.var, ax.extent, step, span=r.span)
        prelude.append(step)
        return cast(Load(acc.name, zero, r.acc_dtype), r.dtype)

    def _read(self, r: Read) -> Expr:
        pad = self.op.pads.get(r.tensor)
        if pad is None:
            return Load(r.tensor, self._row_indices(r.tensor, r.indices), r.dtype)
        return self._pad_read(pad, r.indices)

    def _pad_read(self, pad: Pad, indices: tuple[Expr, ...]) -> Expr:
        """``select(inside, src[clamp(idx - lo)], value)``: never an out-of-bounds load."""
        src = self.op.tensors[pad.source]
        shape = src.dims()
        if 0 in shape:
            return pad.value
        inner_idx: list[Expr] = []
        inside: Expr | None = None
        for idx, lo, hi, size in zip(indices, pad.lo, pad.hi, shape):
            if _is_zero(lo) and _is_zero(hi):  # unpadded dim: the bounds proof covered it
                inner_idx.append(idx)
                continue
            shifted = idx if _is_zero(lo) else Binary("sub", idx, lo, I64)
            cond = Binary("and", Binary("ge", shifted, Const(0, I64), dtypes.boolean),
                          Binary("lt", shifted, _size(size), dtypes.boolean), dtypes.boolean)
            inside = cond if inside is None else Binary("and", inside, cond, dtypes.boolean)
            last = simplify(Binary("sub", _size(size), Const(1, I64), I64))
            inner_idx.append(Binary("min", Binary("max", shifted, Const(0, I64), I64), last, I64))
        loaded = self._read(Read(pad.source, tuple(inner_idx), src.dtype))
        return loaded if inside is None else Select(inside, loaded, pad.value, src.dtype)


def _size(dim: int | Expr) -> Expr:
    return Const(dim, I64) if isinstance(dim, int) else dim


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0
