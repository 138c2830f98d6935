"""Prove every tensor read in bounds by interval analysis, for concrete shapes.

Each index variable ranges over ``[0, extent - 1]``; intervals propagate through index
arithmetic. A read whose interval may leave its tensor is an error at the read's span
(reads of a ``pad`` view are checked against the padded shape: the view guards the rest).

Inside ``select(c, a, b)`` the reads of ``a`` are proved under ``c`` and those of ``b`` under
``not c`` (``select(d < H, X[d + H], X[d - H])`` is in bounds for ``d < 2 * H``). Both sides of a
select may still be evaluated (a vector select computes both), so a read proved only under its
condition has its index clamped into the tensor: where the condition holds the clamp changes
nothing, and elsewhere the load stays inside the tensor and its value is discarded. A side that
no index satisfies becomes a constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tcc import dtypes
from tcc.errors import Span, TccBoundsError
from tcc.ir.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    Read,
    Reduce,
    Select,
    Unary,
    Var,
    format_expr,
    free_vars,
    substitute,
    walk,
)
from tcc.ir.te import Compute, OpTE

Interval = tuple[float, float]  # integer bounds; -inf / inf where a side is unknown
Ranges = dict[str, Interval]
UNKNOWN: Interval = (-math.inf, math.inf)


def interval(e: Expr, ranges: Ranges) -> Interval | None:
    """The range of values ``e`` takes, or None when it cannot be bounded at all."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if not e.dtype.is_float else None
    if isinstance(e, Var):
        return ranges.get(e.name)
    if isinstance(e, Cast) and e.dtype.is_int and (e.a.dtype.is_int or e.a.dtype.is_bool):
        return interval(e.a, ranges)
    if isinstance(e, Unary) and e.op == "neg":
        a = interval(e.a, ranges)
        return None if a is None else (-a[1], -a[0])
    if isinstance(e, Select):
        a, b = interval(e.a, refine(e.cond, ranges, True)), interval(e.b, refine(e.cond, ranges, False))
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, Binary):
        span = _binary(e, ranges)
        if KEYED in ranges and span is not None and (known := ranges.get(_key(e))) is not None:
            return (max(span[0], known[0]), min(span[1], known[1]))
        return span
    return None


KEYED = "("  # present in ranges once a condition bounded an expression rather than one variable


def _key(e: Expr) -> str:
    return f"({format_expr(e)})"


def _binary(e: Binary, ranges: Ranges) -> Interval | None:
    a, b = interval(e.a, ranges), interval(e.b, ranges)
    if e.op in ("max", "min"):  # a clamp bounds a side even of an unknown value
        a, b = a or UNKNOWN, b or UNKNOWN
        pick = max if e.op == "max" else min
        return (pick(a[0], b[0]), pick(a[1], b[1]))
    if a is None or b is None:
        return None
    if e.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if not all(map(math.isfinite, (*a, *b))):
        return None
    if e.op == "mul":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if e.op == "floordiv" and b[0] > 0:
        quotients = [x // y for x in a for y in b]
        return (min(quotients), max(quotients))
    if e.op == "mod" and b[0] > 0:
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return (0, b[1] - 1)
    return None


# ---------------------------------------------------------------- conditions

_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def refine(cond: Expr, ranges: Ranges, holds: bool) -> Ranges:
    """``ranges`` narrowed by knowing that ``cond`` is ``holds``: comparisons of an index variable
    with a bounded expression, and their ``and``/``or``/``not`` compositions."""
    if isinstance(cond, Unary) and cond.op == "not":
        return refine(cond.a, ranges, not holds)
    if not isinstance(cond, Binary):
        return ranges
    if cond.op in ("and", "or"):
        if (cond.op == "and") == holds:  # both sides are known: a and b true, or a or b false
            return refine(cond.b, refine(cond.a, ranges, holds), holds)
        return ranges
    if cond.op not in _NEGATED:
        return ranges
    op = cond.op if holds else _NEGATED[cond.op]
    for side, other, relation in ((cond.a, cond.b, op), (cond.b, cond.a, _FLIPPED[op])):
        isolated = _isolate(side, ranges)
        bound = interval(other, ranges)
        if isolated is not None and bound is not None:
            name, offset, sign = isolated
            if sign > 0:
                return _narrow(ranges, name, relation, (bound[0] - offset, bound[1] - offset))
            return _narrow(ranges, name, _FLIPPED[relation], (offset - bound[1], offset - bound[0]))
    for side, other, relation in ((cond.a, cond.b, op), (cond.b, cond.a, _FLIPPED[op])):
        # an expression of several variables or a clamp (``min(K*q + t, N - 1) >= 2``, as a gradient's
        # split index makes): the bound holds for that expression wherever it appears under the select
        span, bound = interval(side, ranges), interval(other, ranges)
        if isinstance(side, Binary) and free_vars(side) & ranges.keys() and span is not None and bound is not None:
            key = _key(side)
            return _narrow({**ranges, KEYED: (0, 0), key: span}, key, relation, bound)
    return ranges


def _isolate(e: Expr, ranges: Ranges) -> tuple[str, int, int] | None:
    """``(v, c, s)`` when ``e`` is ``s*v + c`` with ``s`` 1 or -1 (``v``, ``v + c``, ``c + v``,
    ``v - c``, ``c - v``: the last from reversed reads, as a gradient of a recurrence makes) of an
    index variable."""
    if isinstance(e, Var) and e.name in ranges:
        return e.name, 0, 1
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        for var, const, sign in ((e.a, e.b, 1 if e.op == "add" else -1), (e.b, e.a, 1)):
            if isinstance(var, Var) and var.name in ranges and isinstance(const, Const) \
                    and not const.dtype.is_float:
                if e.op == "add" or var is e.a:
                    return var.name, sign * int(const.value), 1
                return var.name, int(const.value), -1  # c - v
    return None


def _narrow(ranges: Ranges, name: str, op: str, bound: Interval | None) -> Ranges:
    """``name op bound``: the variable's range cut to where that can hold."""
    if bound is None:
        return ranges
    lo, hi = ranges[name]
    if op == "lt":
        hi = min(hi, bound[1] - 1)
    elif op == "le":
        hi = min(hi, bound[1])
    elif op == "gt":
        lo = max(lo, bound[0] + 1)
    elif op == "ge":
        lo = max(lo, bound[0])
    elif op == "eq":
        lo, hi = max(lo, bound[0]), min(hi, bound[1])
    elif op == "ne" and bound[0] == bound[1]:  # select(t == 0, ..., H[t - 1]): an end cut off
        lo, hi = lo + (lo == bound[0]), hi - (hi == bound[0])
    return {**ranges, name: (lo, hi)}


def _empty(ranges: Ranges) -> bool:
    return any(lo > hi for lo, hi in ranges.values())


# ---------------------------------------------------------------- the pass


@dataclass(frozen=True)
class IndexCheck:
    """An index of ``tensor`` (dim ``dim``, of size ``size``) that reads data or a runtime scalar,
    so no interval proves it: the call evaluates ``index`` at every point of ``ranges`` (the index
    variables it uses, as the selects around it narrow them) before anything runs."""

    tensor: str
    dim: int
    size: int
    index: Expr
    ranges: tuple[tuple[str, int, int], ...]
    span: Span | None = field(default=None, compare=False)


def prove_bounds(op: OpTE) -> OpTE:
    """``op`` with every read proved in bounds (else :class:`TccBoundsError` at the first read
    that may leave its tensor), reads proved only under a select's condition clamped, and the
    indices that read data listed in ``index_checks`` for the call to check.

    An op with dynamic shape symbols is proved for each call's values instead, by this pass on the
    op specialised for them (``tcc.runtime.dynamic``, which refuses an index check); here every
    read under a select is clamped into its tensor (:func:`clamp_under_selects`), since the call's
    values decide which of them the proof needs clamped."""
    if op.dynamic:
        return clamp_under_selects(op)
    computes, checks = [], []
    for c in op.computes:
        ranges: Ranges = {}
        for ax in c.axes:
            ranges[ax.var.name] = (0, int(ax.extent.value) - 1)  # type: ignore[attr-defined]
        prover = _Prover(op)
        body = c.body if _empty(ranges) else prover.prove(c.body, ranges, ranges)
        lhs = c.lhs if c.lhs is None or _empty(ranges) else prover.target(c, ranges)
        computes.append(replace(c, body=body, lhs=lhs))
        checks += prover.checks
    return replace(op, computes=computes, index_checks=_distinct(checks))


def _distinct(checks: list[IndexCheck]) -> list[IndexCheck]:
    """The checks less those that test the same values as an earlier one: the same index of the
    same tensor over the same ranges, its variables renamed in order (an embedding's row read by
    a layer norm's sum of squares twice and by its output once is checked once, not three times)."""
    seen: set[tuple] = set()
    kept = []
    for check in checks:
        names = {v: Var(f"_{k}", dtypes.i64) for k, (v, _, _) in enumerate(check.ranges)}
        key = (check.tensor, check.dim, check.size, substitute(check.index, names),
               tuple((lo, hi) for _, lo, hi in check.ranges))
        if key not in seen:
            seen.add(key)
            kept.append(check)
    return kept


class _Prover:
    """One walk of a statement: ``ranges`` as refined by the selects around a node, ``plain``
    without them (a read that needs the refinement is clamped)."""

    def __init__(self, op: OpTE):
        self.op = op
        self.checks: list[IndexCheck] = []

    def prove(self, e: Expr, ranges: Ranges, plain: Ranges) -> Expr:
        if isinstance(e, Reduce):
            inner = {ax.var.name: (0, _largest(ax.extent, ranges) - 1) for ax in e.axes}
            if _empty(inner):
                return e
            return replace(e, body=self.prove(e.body, {**ranges, **inner}, {**plain, **inner}))
        if isinstance(e, Select):
            cond = self.prove(e.cond, ranges, plain)
            taken, other = refine(e.cond, ranges, True), refine(e.cond, ranges, False)
            a = _unused(e.a) if _empty(taken) else self.prove(e.a, taken, plain)
            b = _unused(e.b) if _empty(other) else self.prove(e.b, other, plain)
            return replace(e, cond=cond, a=a, b=b)
        if isinstance(e, Read):
            indices = tuple(self.prove(i, ranges, plain) for i in e.indices)
            return replace(e, indices=self._read(e, indices, ranges, plain))
        children = e.children()
        if not children:
            return e
        rebuilt = {id(c): self.prove(c, ranges, plain) for c in children}
        if all(rebuilt[id(c)] is c for c in children):
            return e
        return _with_children(e, rebuilt)

    def target(self, c: Compute, ranges: Ranges) -> tuple[Expr, ...]:
        """An accumulation's left-hand indices, proved like a read of its tensor: those that read
        data become index checks, so an out-of-range position fails before anything is written."""
        dtype = self.op.tensors[c.tensor].dtype
        return self.prove(Read(c.tensor, c.lhs, dtype, c.span), ranges, ranges).indices

    def _read(self, e: Read, indices: tuple[Expr, ...], ranges: Ranges, plain: Ranges) -> tuple[Expr, ...]:
        shape = self.op.tensors[e.tensor].concrete_shape()
        proved = []
        for dim, (idx, size) in enumerate(zip(indices, shape)):
            span = interval(idx, ranges)
            if not _finite(span) and self._reads_data(e, dim, idx):
                used = sorted(free_vars(idx) & set(ranges))
                self.checks.append(IndexCheck(e.tensor, dim, size, idx, tuple(
                    (v, int(ranges[v][0]), int(ranges[v][1])) for v in used), e.span))
                narrowed = any(ranges[v] != plain.get(v) for v in used)  # checked only where a select takes it
                proved.append(_clamp(idx, size) if narrowed else idx)  # (both sides may be computed)
                continue
            _require(e, dim, idx, size, span)
            within = interval(idx, plain)
            needs_clamp = within is None or within[0] < 0 or within[1] >= size
            proved.append(_clamp(idx, size) if needs_clamp else idx)
        return tuple(proved)


    def _reads_data(self, e: Read, dim: int, idx: Expr) -> bool:
        """Whether ``idx`` depends on data only the call knows: an input tensor's values or a
        runtime scalar. One that reads a tensor the op computes cannot be checked before the call."""
        scalars = {n.name for n in walk(idx) if isinstance(n, Var) and n.name in self.op.scalars}
        reads = [n for n in walk(idx) if isinstance(n, Read)]
        computed = [r.tensor for r in reads if r.tensor not in self.op.inputs]
        if computed:
            raise TccBoundsError(
                f"index {dim} of {e.tensor} ({format_expr(idx)}) reads {computed[0]}, which this op computes: "
                "its values cannot be checked before the call", e.span,
                f"clamp it into range: min(max(..., 0), size - 1), or pass {computed[0]} as an input")
        return bool(scalars or reads)


def _largest(extent: Expr, ranges: Ranges) -> int:
    """The largest value of a reduction's extent: a constant, or one that moves with the statement's
    indices (``sum[j: i + 1]``), over their ranges."""
    span = interval(extent, ranges)
    if not _finite(span):
        raise TccBoundsError(f"cannot bound the extent {format_expr(extent)}", None,
                             "an extent may use the statement's indices, shape symbols and integers")
    return int(span[1])  # type: ignore[index]


def _finite(span: Interval | None) -> bool:
    return span is not None and all(map(math.isfinite, span))


def _require(e: Read, dim: int, idx: Expr, size: int, span: Interval | None) -> None:
    if not _finite(span):
        raise TccBoundsError(
            f"cannot prove index {dim} of {e.tensor} ({format_expr(idx)}) in bounds", e.span,
            "use affine indices of index variables, or pad the tensor: Xp = pad(X, [...])")
    lo, hi = span
    if lo < 0 or hi >= size:
        raise TccBoundsError(
            f"index {dim} of {e.tensor} ({format_expr(idx)}) takes values in [{int(lo)}, {int(hi)}] but "
            f"{e.tensor} has size {size} in that dim", e.span,
            "pad the tensor (Xp = pad(X, [...])) or shrink the result's shape")


def _unused(e: Expr) -> Expr:
    """A select's side that is never chosen: a constant, so that it reads nothing (its reads may
    leave their tensors, and both sides of a select may be evaluated)."""
    return Const(False if e.dtype.is_bool else 0.0 if e.dtype.is_float else 0, e.dtype)


def _clamp(idx: Expr, size: int | Expr) -> Expr:
    low = Binary("max", idx, Const(0, idx.dtype), idx.dtype)
    last = Const(size - 1, idx.dtype) if isinstance(size, int) else Binary("sub", size, Const(1, idx.dtype), idx.dtype)
    return Binary("min", low, last, idx.dtype)


def clamp_under_selects(op: OpTE) -> OpTE:
    """``op`` (of dynamic shape symbols) with each index of a read under a select clamped into its
    tensor's dim, unless it is an index variable running over exactly that dim: where the
    select's condition holds the clamp changes nothing (the call's proof shows the read in
    range there), elsewhere both sides may be computed and the load must stay inside."""
    def clamp(e: Expr, under: bool, extents: dict[str, Expr]) -> Expr:
        if isinstance(e, Reduce):
            inner = {**extents, **{ax.var.name: ax.extent for ax in e.axes}}
            return replace(e, body=clamp(e.body, under, inner))
        if isinstance(e, Select):
            return replace(e, cond=clamp(e.cond, under, extents), a=clamp(e.a, True, extents),
                           b=clamp(e.b, True, extents))
        if isinstance(e, Read):
            dims = op.tensors[e.tensor].shape
            indices = tuple(clamp(i, under, extents) for i in e.indices)
            if under:
                indices = tuple(i if isinstance(i, Var) and extents.get(i.name) == d else _clamp(i, _dim(d))
                                for i, d in zip(indices, dims))
            return replace(e, indices=indices)
        children = e.children()
        if not children:
            return e
        return _with_children(e, {id(c): clamp(c, under, extents) for c in children})

    computes = [replace(c, body=clamp(c.body, False, {ax.var.name: ax.extent for ax in c.axes}))
                for c in op.computes]
    return replace(op, computes=computes)


def _dim(d: Expr) -> int | Expr:
    return int(d.value) if isinstance(d, Const) else d


def _with_children(e: Expr, rebuilt: dict[int, Expr]) -> Expr:
    """``e`` with each child replaced by its rebuilt form (fields that hold expressions)."""
    changes = {}
    for name, value in vars(e).items():
        if isinstance(value, Expr):
            changes[name] = rebuilt.get(id(value), value)
        elif isinstance(value, tuple) and value and all(isinstance(v, Expr) for v in value):
            changes[name] = tuple(rebuilt.get(id(v), v) for v in value)
    return replace(e, **changes)
