"""The matrix-unit form of a sweep: attention's backward, described for a GPU schedule.

A :class:`~tcc.ir.te.Sweep` (:mod:`.sweeps`) whose three sums are, once its pair statements and
the element-wise tensors they read are written out,

    dV[.., key, c] = sum[row](f32(dO[.., row, c]) / l[row] * E)
    dK[.., key, c] = sum[row](G * E * a * f32(Q[.., row, c]))
    dQ[.., row, c] = sum[key](G * E * a * f32(K[.., key, c]))

with ``E = exp(score(dot) - m[row])``, ``dot = sum[d](f32(Q[.., row, d]) * f32(K[.., key, d]))``,
``G = sum[d](f32(dO[.., row, d]) / l[row] * f32(V[.., key, d])) + c[row]`` and ``a`` the derivative
of the score in the dot product, is FlashAttention-2's backward pass (what ``tcc.grad`` derives
for DSL.md's attention): with ``P = E / l`` the probabilities, ``lse = m + log(l)``, ``Delta =
-c * l`` (the program's own ``rowsum(dO * O)``, which it computes before the sweep) and ``dS = P
(dP - Delta)``, the sums are ``P^T dO``, ``a dS^T Q`` and ``a dS K``. The loop nests of
:mod:`.lower_sweep` compute it a scalar at a time; this module describes the same sweep as a
:class:`~tcc.ir.loops.MatrixSweep` statement, which the nests carry as their annotation
``MATRIX_SWEEP`` and a GPU schedule with matrix units puts in their place
(:mod:`tcc.passes.autoschedule_cuda.attention_backward`).

A gradient op of some of the inputs (``tcc.torch`` derives one per input) has some of the three
sums: the kernel computes them all and stores those the program has (a dQ alone costs the whole
backward, still a fraction of the generic schedule's time); dV alone has no ``G`` and reads K in
V's place. What it takes: 16-bit Q, K, V and dO of whole contiguous rows of one length, a score linear in
the dot product (``a`` the same for every pair: a scale, plus terms without the dot product such
as a bias), and masks that are all one key limit of the row (a causal mask). Anything else (a
mask read from data, a soft cap: ``a`` varies with the pair) keeps the nests, and the fused
stage says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    Unary,
    Var,
    cast,
    format_expr,
    free_vars,
    substitute,
    transform,
    walk,
)
from tcc.ir.loops import Store, seq
from tcc.ir.matrix_loops import MatrixSweep
from tcc.ir.te import OpTE, Sweep
from tcc.passes.te.matrix_stream import HALVES, whole_rows
from tcc.passes.te.streaming import key_limit
from tcc.target import Target

I64, F32 = dtypes.i64, dtypes.f32
DEPTHS = (64, 128)  # row lengths the backward template is tuned for


class _NoMatch(Exception):
    """The sweep is not attention's backward in the form above (the message says where)."""


def matrix_form(sweep: Sweep, op: OpTE, to_loops: Callable[[Expr], Expr | None],
                fresh: Callable[[str], str]) -> MatrixSweep | str:
    """``sweep`` as one :class:`MatrixSweep`, or why not. ``to_loops`` turns a TE expression without
    reductions into a loop-IR one (None if it holds one); ``fresh`` gives names that clash with nothing."""
    try:
        return _Matcher(sweep, op, fresh).form(to_loops)
    except _NoMatch as e:
        return str(e)


def note_matrix_sweeps(op: OpTE, target: Target) -> OpTE:
    """``op`` with a fused-stage note per sweep on a GPU: whether it runs as FlashAttention-2's
    backward where the target has matrix units, or why not (after the streams, which decide what
    is stored)."""
    if not target.is_gpu or not op.sweeps:
        return op
    notes = []
    names = iter(range(1 << 30))
    for sweep in op.sweeps:
        form = matrix_form(sweep, op, lambda e: e, lambda base: f"{base}_{next(names)}")
        where = f"sweep over {sweep.row.var.name} x {sweep.key.var.name}"
        notes.append(f"{where}: no matrix form ({form}), the generic schedule" if isinstance(form, str) else
                     f"{where}: FlashAttention-2's backward on the matrix units where the target has them "
                     f"(16-bit rows of {form.depth}, scale {format_expr(form.scale)})")
    return replace(op, fusion_notes=[*op.fusion_notes, *notes])


def _check(cond: bool, why: str) -> None:
    if not cond:
        raise _NoMatch(why)


class _Matcher:
    def __init__(self, sweep: Sweep, op: OpTE, fresh: Callable[[str], str]):
        self.s, self.op = sweep, op
        self.defs = {c.tensor: c for c in op.computes}
        self.v = {n: Var(fresh(n), t) for n, t in (("row", I64), ("key", I64), ("dot", F32), ("col", I64),
                                                   ("value", F32))}
        self.outer = tuple(Var(fresh(ax.var.name), I64) for ax in sweep.outer)
        self.masks: list[Expr] = []
        self._do: Read | None = None  # dO's row and l, as the sums read them
        self._l: Read | None = None
        self._v_read: Read | None = None

    # ------------------------------------------------------------ the sums' terms, written out

    def _term(self, name: str) -> Expr:
        """The summed term of ``name`` in the statement's variables, pairs and element-wise tensors
        written out, masks and roundings of products taken off (the masks kept in ``self.masks``)."""
        c = self.defs[name]
        red = c.body
        _check(isinstance(red, Reduce) and len(c.axes) == len(self.outer) + 2, f"{name} is not a sum of one axis")
        assert isinstance(red, Reduce)
        k = len(self.outer)
        row, key = self.v["row"], self.v["key"]
        own, summed = (key, row) if name in self.s.by_key else (row, key)
        names = {ax.var.name: v for ax, v in zip(c.axes[:k], self.outer)}
        names |= {c.axes[k].var.name: own, red.axes[0].var.name: summed, c.axes[k + 1].var.name: self.v["col"]}
        return self._strip(self._inline(substitute(red.body, names)))

    def _inline(self, e: Expr) -> Expr:
        """``e`` with its reads of the sweep's pairs and of element-wise temps written out."""
        def visit(n: Expr) -> Expr | None:
            if not isinstance(n, Read):
                return None
            c = self.defs.get(n.tensor)
            if c is None or c.accumulate or c.sequential or self.op.tensors[n.tensor].kind != "temp":
                return None
            if n.tensor not in self.s.pairs and any(isinstance(x, Reduce) for x in walk(c.body)):
                return None
            return self._inline(substitute(c.body, {ax.var.name: i for ax, i in zip(c.axes, n.indices)}))
        return transform(e, visit)

    def _strip(self, e: Expr) -> Expr:
        """``e`` without ``select(cond, x, 0 or -inf)`` (``cond`` kept) and the rounding of a product
        to a narrower type and back (the matrix units round its operands instead)."""
        def visit(n: Expr) -> Expr | None:
            if isinstance(n, Select) and isinstance(n.b, (Const, Cast)) and _constant(n.b) in (0.0, float("-inf")):
                self.masks.append(n.cond)
                return n.a
            if isinstance(n, Cast) and isinstance(n.a, Cast) and n.dtype == n.a.a.dtype \
                    and n.a.dtype.is_float and n.a.dtype.itemsize < n.dtype.itemsize:
                return n.a.a
            if isinstance(n, Cast) and n.a.dtype == n.dtype:
                return n.a
            return None
        return transform(e, visit)

    # ------------------------------------------------------------ pieces

    def _operand(self, e: Expr, along: Var, last: Var) -> Read:
        """``T[.., along, last]`` of ``f32(T[..])``: a 16-bit input's row."""
        _check(isinstance(e, Cast) and e.dtype == F32 and isinstance(e.a, Read) and e.a.dtype.name in HALVES,
               f"{format_expr(e)} is not a 16-bit input widened to f32")
        read = e.a  # type: ignore[attr-defined]
        outside = {v.name for v in self.outer} | set(self.op.scalars) | set(self.op.symbols)
        _check(whole_rows(read, self.op, along.name, last.name, outside, self.depth)
               and read.indices[-2] == along, f"{read.tensor} is not read a whole row at a time")
        return read

    def _row_read(self, e: Expr, what: str) -> Read:
        at = (*self.outer, self.v["row"])
        _check(isinstance(e, Read) and tuple(e.indices) == at and e.dtype == F32, f"no row value {what}")
        internal = {t for stream in self.op.streams for t in stream.internal}
        _check(e.tensor not in internal, f"{e.tensor} is never stored (a stream's own)")  # type: ignore[attr-defined]
        return e  # type: ignore[return-value]

    def _exp(self, factors: list[Expr]) -> tuple[Expr, Expr, Read]:
        """(the exp factor, its score, its shift ``m``): ``exp(score - m[row])``."""
        found = [f for f in factors if isinstance(f, Call) and f.fn == "exp" and isinstance(f.args[0], Binary)
                 and f.args[0].op == "sub"]
        _check(len(found) == 1, "no exp(score - max) among the factors")
        arg = found[0].args[0]  # type: ignore[attr-defined]
        return found[0], arg.a, self._row_read(arg.b, "(the shift of the exponentials)")

    def form(self, to_loops: Callable[[Expr], Expr | None]) -> MatrixSweep:
        s = self.s
        by_row = [x for x in s.sums if x not in s.by_key]
        _check(len(by_row) <= 1 and len(s.by_key) <= 2, "more sums than dQ, dK and dV")
        self.depth = _const(self.defs[s.sums[0]].axes[-1].extent)
        _check(self.depth in DEPTHS, f"rows of {self.depth}, not {' or '.join(map(str, DEPTHS))}")
        row, key, col = self.v["row"], self.v["key"], self.v["col"]
        terms = {x: _factors(self._term(x)) for x in s.sums}
        dv = next((x for x in s.by_key if len(terms[x][1]) == 1), None)
        dk = next((x for x in s.by_key if x != dv), None)
        _check(len(s.by_key) - (dv is not None) <= 1, "two sums over the rows that are not dK and dV")
        e, score, m = self._exp(terms[s.sums[0]][0])
        if dv is not None:
            num, den = terms[dv]
            _check(len(num) == 2 and _key(e) in {_key(f) for f in num}, f"{dv} is not dO / l times the exponentials")
            self._do = self._operand(next(f for f in num if _key(f) != _key(e)), row, col)
            self._l = self._row_read(den[0], "(the sum of the exponentials)")
        dot, q, k = self._dot(score)
        scale = _coefficient(transform(score, lambda n: self.v["dot"] if n is dot else None), self.v["dot"])
        _check(scale is not None, "the score is not linear in the dot product")
        assert scale is not None
        outside = {v.name for v in self.outer} | set(self.op.scalars) | set(self.op.symbols)
        _check(free_vars(scale) <= outside, "the score's derivative varies with the pair")
        c: Expr = Const(0.0, F32)  # (dV alone: no dS is stored, and K stands in for V)
        self._v_read = k
        for name, operand in ((dk, Read(q.tensor, (*q.indices[:-2], row, col), q.dtype)),
                              (by_row[0] if by_row else None, Read(k.tensor, (*k.indices[:-2], key, col), k.dtype))):
            if name is not None:
                c = self._gradient_term(terms[name], e, scale, operand)
        score_expr = transform(score, lambda n: self.v["dot"] if n is dot else None)
        zero = Const(0, I64)
        refs = [to_loops(Read(t.tensor, (*t.indices[:-1], zero), t.dtype)) for t in (q, k, self._v_read, self._do)]
        lse = Binary("add", m, Call("log", (self._l,), F32), F32)
        delta = Unary("neg", Binary("mul", c, self._l, F32), F32)
        exprs = [to_loops(x) for x in (score_expr, self._limit(), lse, delta, scale)]
        _check(None not in refs and None not in exprs, "an expression needs loops of its own")
        value = self.v["value"]
        out = []
        for x, at in ((by_row[0] if by_row else None, row), (dk, key), (dv, key)):
            stored = None if x is None else to_loops(cast(value, self.op.tensors[x].dtype))
            _check(x is None or stored is not None, "a store needs loops of its own")
            out.append(seq() if x is None or stored is None else Store(x, (*self.outer, at, col), stored))
        return MatrixSweep(*refs, row, key, self.v["dot"], col, value, *exprs, *out,  # type: ignore[arg-type]
                           rows=_const(s.row.extent), keys=_const(s.key.extent), depth=self.depth, outer=self.outer,
                           outer_extents=tuple(_const(ax.extent) for ax in s.outer))

    def _dot(self, score: Expr) -> tuple[Reduce, Read, Read]:
        """The score's one sum of widened 16-bit products: (the sum, Q's row, K's row)."""
        sums = [n for n in walk(score) if isinstance(n, Reduce)]
        _check(len(sums) == 1 and sums[0].op == "sum" and len(sums[0].axes) == 1, "the score is not one dot product")
        red = sums[0]
        d = red.axes[0].var
        num, den = _factors(red.body)
        _check(len(num) == 2 and not den and _const(red.axes[0].extent) == self.depth, "the score is not Q . K")
        a, b = num
        if self.v["key"].name in free_vars(a):
            a, b = b, a
        q, k = self._operand(a, self.v["row"], d), self._operand(b, self.v["key"], d)
        self._dot_axis = d
        return red, q, k

    def _gradient_term(self, term: tuple[list[Expr], list[Expr]], e: Expr, scale: Expr, operand: Read) -> Expr:
        """The row term ``c`` of a gradient sum ``G * E * a * f32(operand)`` (see the module
        docstring); dO, l and V as G reads them (the same as the other sums')."""
        num, den = term
        _check(not den, "a gradient sum divides")
        rest = [f for f in num if _key(f) not in (_key(e), _key(Cast(operand, F32)))]
        _check(len(rest) == len(num) - 2, "a gradient sum is not G * exp * scale * Q (or K)")
        g = [f for f in rest if isinstance(f, Binary) and f.op == "add"]
        _check(len(g) == 1, "no dO . V + c factor")
        others = sorted(_key(f) for f in rest if f is not g[0])
        _check(others == sorted(_key(f) for f in _factors(scale)[0]) and not _factors(scale)[1],
               "a gradient's scale is not the score's derivative")
        a, b = g[0].a, g[0].b  # type: ignore[attr-defined]
        if not isinstance(a, Reduce):
            a, b = b, a
        _check(isinstance(a, Reduce) and a.op == "sum" and len(a.axes) == 1, "no dO . V in the gradient")
        d = a.axes[0].var
        pnum, pden = _factors(a.body)
        _check(len(pnum) == 2 and len(pden) == 1, "dO . V is not divided by a row's sum")
        x, y = pnum if self.v["key"].name in free_vars(pnum[1]) else pnum[::-1]
        do = self._operand(x, self.v["row"], d)
        l_ = self._row_read(pden[0], "(the sum of the exponentials)")
        if self._do is not None and self._l is not None:
            _check(do.tensor == self._do.tensor and tuple(do.indices[:-1]) == tuple(self._do.indices[:-1])
                   and _key(l_) == _key(self._l), "the gradients read different dO or l")
        self._do, self._l = replace(do, indices=(*do.indices[:-1], self.v["col"])), l_
        self._v_read = self._operand(y, self.v["key"], d)
        return self._row_read(b, "(the row term of the score gradient)")

    def _limit(self) -> Expr:
        """The key limit every mask spells (``key < limit(row)``), or the key count."""
        rows = (*(IterVar(v, Const(1, I64)) for v in self.outer), IterVar(self.v["row"], Const(1, I64)))
        limits = [key_limit([m], IterVar(self.v["key"], Const(1, I64)), rows) for m in self.masks]
        found = {format_expr(x): x for x in limits if x is not None}
        _check(None not in limits and len(found) <= 1, "a mask that is not one key limit of the row")
        return next(iter(found.values()), Const(_const(self.s.key.extent), I64))


def _factors(e: Expr) -> tuple[list[Expr], list[Expr]]:
    """(numerator, denominator) factors of a product and quotient tree."""
    while isinstance(e, Cast) and e.a.dtype == e.dtype:
        e = e.a
    if isinstance(e, Binary) and e.op == "mul":
        (an, ad), (bn, bd) = _factors(e.a), _factors(e.b)
        return an + bn, ad + bd
    if isinstance(e, Binary) and e.op in ("div", "truediv"):
        (an, ad), (bn, bd) = _factors(e.a), _factors(e.b)
        return an + bd, ad + bn
    return [e], []


def _coefficient(e: Expr, x: Var) -> Expr | None:
    """``a`` where ``e`` is ``a * x + b`` with neither ``a`` nor ``b`` reading ``x``; None otherwise."""
    if x.name not in free_vars(e):
        return Const(0.0, F32)
    if isinstance(e, Var):
        return Const(1.0, F32)
    if isinstance(e, Cast) and e.dtype == F32:
        return _coefficient(e.a, x)
    if isinstance(e, Unary) and e.op == "neg":
        a = _coefficient(e.a, x)
        return None if a is None else Unary("neg", a, F32)
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _coefficient(e.a, x), _coefficient(e.b, x)
        if a is None or b is None:
            return None
        return a if _constant(b) == 0.0 else b if e.op == "add" and _constant(a) == 0.0 else Binary(e.op, a, b, F32)
    if isinstance(e, Binary) and e.op == "mul":
        inner, other = (e.a, e.b) if x.name in free_vars(e.a) else (e.b, e.a)
        if x.name in free_vars(other):
            return None
        a = _coefficient(inner, x)
        return None if a is None else other if _constant(a) == 1.0 else Binary("mul", a, other, F32)
    if isinstance(e, Binary) and e.op in ("div", "truediv") and x.name not in free_vars(e.b):
        a = _coefficient(e.a, x)
        return None if a is None else Binary(e.op, a, e.b, F32)
    return None


def _constant(e: Expr) -> float | None:
    while isinstance(e, Cast):
        e = e.a
    return float(e.value) if isinstance(e, Const) else None


def _key(e: Expr) -> str:
    """``e`` printed with its reductions' variables renamed alike (equal expressions, equal keys)."""
    def visit(n: Expr) -> Expr | None:
        if isinstance(n, Reduce):
            axes = tuple(IterVar(Var(f"_r{k}", ax.var.dtype), ax.extent) for k, ax in enumerate(n.axes))
            names = {ax.var.name: a.var for ax, a in zip(n.axes, axes)}
            return Reduce(n.op, axes, substitute(n.body, names), n.dtype, n.acc_dtype)
        return None
    return format_expr(transform(e, visit))


def _const(e: Expr) -> int:
    return int(e.value)  # type: ignore[attr-defined]
