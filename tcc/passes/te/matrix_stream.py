"""The matrix-unit form of a stream: attention's two products, described for a GPU schedule.

A :class:`~tcc.ir.te.Stream` whose score is one sum of products of two 16-bit tensors widened
to f32 (``sum[d](f32(Q[.., i, d]) * f32(K[.., j, d]))``, wrapped in any elementwise work: a
scale, a mask, a bias, a soft cap) and whose one weighted sum weighs by a third
(``f32(V[.., j, d])``) is FlashAttention's forward pass: both products fit the matrix units. The
loop nest :mod:`tcc.passes.te.lower_stream` builds computes it one score at a time, which is
what a CPU vectorises well; this module describes the same stream as a
:class:`~tcc.ir.loops.MatrixStream` statement and the nest carries it as its annotation
``MATRIX_STREAM``. A GPU schedule with matrix units replaces the nest by it
(:mod:`tcc.passes.autoschedule_cuda.attention`); every other schedule ignores the annotation, so
this pass decides nothing about the target.

The description holds where each operand's row starts (the rows must be whole, contiguous
16-bit rows of the product's length, so the copy engine can move them 16 bytes at a time), the
score as an expression of the dot product, the key limit, and the stores of the stream's
tensors that others read and of its epilogues, all in variables the statement binds.
"""

from __future__ import annotations

from collections.abc import Callable

from tcc import dtypes
from tcc.ir.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    Read,
    Reduce,
    Select,
    Var,
    cast,
    free_vars,
    substitute,
    transform,
    walk,
)
from tcc.ir.loops import Stmt, Store, seq
from tcc.ir.matrix_loops import MatrixStream
from tcc.ir.te import Compute, OpTE, Stream

I64 = dtypes.i64
F32 = dtypes.f32
HALVES = ("f16", "bf16")


def matrix_form(stream: Stream, op: OpTE, to_loops: Callable[[Expr], Expr | None], fresh: Callable[[str], str],
                outer: dict[str, Var]) -> MatrixStream | None:
    """``stream`` as one :class:`MatrixStream` (its outer rows' variables renamed by ``outer``), or
    None where it is not attention's shape. ``to_loops`` turns a TE expression without reductions
    into a loop-IR one (None if it holds one); ``fresh`` gives names that clash with nothing."""
    weighted = [x for x in stream.sums if x.weight is not None]
    plain = [x for x in stream.sums if x.weight is None]
    if len(weighted) != 1 or len(plain) > 1 or len(weighted[0].extra) != 1:
        return None
    if any(op.tensors[t].dtype != F32 for t in stream.tensors):
        return None
    product = _product(stream)
    if product is None:
        return None
    reduce, q, k = product
    v = _widened(weighted[0].weight)
    if v is None or v.dtype != q.dtype:
        return None
    depth_axis, col_axis = reduce.axes[0], weighted[0].extra[0]
    depth = _int(depth_axis.extent)
    if depth is None or depth != _int(col_axis.extent):
        return None
    row_name, key_name = stream.rows[-1].var.name, stream.axis.var.name
    outside = set(outer) | set(op.scalars) | set(op.symbols)
    for read, along, last in ((q, row_name, depth_axis), (k, key_name, depth_axis), (v, key_name, col_axis)):
        if not whole_rows(read, op, along, last.var.name, outside, depth):
            return None
    names = {n: Var(fresh(n), t) for n, t in (("row", I64), ("key", I64), ("dot", F32), ("col", I64),
                                              ("w", F32), ("total", F32), ("top", F32))}
    rename = {**outer, row_name: names["row"], key_name: names["key"]}

    def loops(e: Expr) -> Expr | None:
        return to_loops(substitute(e, rename))

    refs = [loops(substitute(r, {last: Const(0, I64)})) for r, last in
            ((q, depth_axis.var.name), (k, depth_axis.var.name), (v, col_axis.var.name))]
    score = loops(transform(stream.score, lambda n: names["dot"] if n is reduce else None))
    limit = loops(stream.limit) if stream.limit is not None else Const(_int(stream.axis.extent), I64)
    at_row = (*(outer[ax.var.name] for ax in stream.rows[:-1]), names["row"])
    stores = _stores(stream, op, names, at_row, weighted[0].tensor, plain, loops)
    if None in refs or score is None or limit is None or stores is None:
        return None
    return MatrixStream(*refs, names["row"], names["key"], names["dot"], score, limit, names["col"], names["w"],
                        names["total"], names["top"], stores[0], stores[1], _int(stream.rows[-1].extent),
                        _int(stream.axis.extent), depth, outer=tuple(outer.values()))


def _int(e: Expr) -> int | None:
    return e.value if isinstance(e, Const) and isinstance(e.value, int) else None


def _widened(e: Expr | None) -> Read | None:
    """``T[..]`` of ``f32(T[..])`` with ``T`` a 16-bit float tensor."""
    if isinstance(e, Cast) and e.dtype == F32 and isinstance(e.a, Read) and e.a.dtype.name in HALVES:
        return e.a
    return None


def _product(stream: Stream) -> tuple[Reduce, Read, Read] | None:
    """The score's one sum of widened 16-bit products: (the sum, the row's operand, the key's)."""
    sums = [n for n in walk(stream.score) if isinstance(n, Reduce)]
    if len(sums) != 1 or sums[0].op != "sum" or len(sums[0].axes) != 1 or sums[0].acc_dtype != F32:
        return None
    body = sums[0].body
    if isinstance(body, Select) and _masked(stream.score, body.cond) and _zero(body.b) \
            and sums[0].axes[0].var.name not in free_vars(body.cond):
        body = body.a  # (the products of a pair the score masks anyway: a gradient's spelling)
    if not (isinstance(body, Binary) and body.op == "mul"):
        return None
    a, b = _widened(body.a), _widened(body.b)
    if a is None or b is None or a.dtype != b.dtype:
        return None
    key = stream.axis.var.name
    if key in free_vars(a):
        a, b = b, a
    if key in free_vars(a) or key not in free_vars(b):
        return None
    return sums[0], a, b


def _masked(score: Expr, cond: Expr) -> bool:
    """Whether ``score`` is ``-inf`` where ``cond`` fails: ``select(cond, x, -inf)`` at its top."""
    while isinstance(score, Cast):
        score = score.a
    if not isinstance(score, Select):
        return False
    b = score.b.a if isinstance(score.b, Cast) else score.b
    return isinstance(b, Const) and b.value == float("-inf") and (score.cond == cond or _masked(score.a, cond))


def _zero(e: Expr) -> bool:
    while isinstance(e, Cast):
        e = e.a
    return isinstance(e, Const) and e.value == 0


def whole_rows(read: Read, op: OpTE, along: str, last: str, outside: set[str], depth: int) -> bool:
    """Whether ``read`` is an input's row of ``depth`` contiguous values: its last index is ``last``,
    its others use only ``along`` and the variables ``outside`` the stream."""
    tensor = op.tensors.get(read.tensor)
    if read.tensor not in op.inputs or tensor is None:
        return False
    shape = tensor.concrete_shape()
    if shape[-1] != depth or not (isinstance(read.indices[-1], Var) and read.indices[-1].name == last):
        return False
    return all(free_vars(i) <= outside | {along} for i in read.indices[:-1])


def _stores(stream: Stream, op: OpTE, names: dict[str, Var], at_row: tuple[Var, ...], weighted: str, plain: list,
            loops: Callable[[Expr], Expr | None]) -> tuple[Stmt, Stmt] | None:
    """(the stores of a finished element, of a finished row): the stream's tensors others read,
    and its epilogues, with its tensors read as the statement's variables."""
    values = {stream.maximum: names["top"], weighted: names["w"], **{x.tensor: names["total"] for x in plain}}
    k = len(stream.rows)
    element: list[Store] = []
    row: list[Store] = []
    for name in stream.tensors:
        if name not in stream.internal:
            at = (*at_row, names["col"]) if name == weighted else at_row
            (element if name == weighted else row).append(Store(name, at, values[name]))
    for c in op.computes:
        if c.tensor in stream.epilogues:
            store = _epilogue(c, k, values, (*at_row, names["col"]))
            if store is None:
                return None
            (element if len(c.axes) > k else row).append(store)
    converted = []
    for group in (element, row):
        parts: list[Stmt] = []
        for s in group:
            value = loops(s.value)
            if value is None:
                return None
            parts.append(Store(s.buffer, s.indices, cast(value, op.tensors[s.buffer].dtype)))
        converted.append(seq(*parts))
    return converted[0], converted[1]


def _epilogue(c: Compute, k: int, values: dict[str, Var], where: tuple[Var, ...]) -> Store | None:
    """``c`` stored at the stream's row (and column: ``where``) with the stream's tensors read as
    variables; None where it reads them anywhere but at its own point, or has more than one axis
    beyond the rows."""
    if c.accumulate or len(c.axes) > k + 1:
        return None
    axes = [ax.var.name for ax in c.axes]
    ok = True

    def visit(n: Expr) -> Expr | None:
        nonlocal ok
        if isinstance(n, Read) and n.tensor in values:
            if [i.name if isinstance(i, Var) else None for i in n.indices] != axes[:len(n.indices)]:
                ok = False
            return values[n.tensor]
        return None
    body = transform(c.body, visit)
    at = where[:len(axes)]
    return Store(c.tensor, at, substitute(body, dict(zip(axes, at)))) if ok else None
