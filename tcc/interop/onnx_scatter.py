"""ONNX ScatterElements, ScatterND and TopK as the language's accumulating statements.

A scatter writes ``updates`` into a copy of ``data`` at positions read from ``indices``. The
language adds into a tensor at a data position (``Y[I[j, k], k] += U[j, k]``), so:

- ``reduction="add"``: the copy, then one ``+=`` of the updates;
- ``reduction="none"``: a ``+=`` of each update's own number (plus one) into a zeroed ``i64``
  tensor ``W`` over the positions, then ``Y = select(W > 0, U[unravel(W - 1)], data)``. Exact for
  every dtype (bool included), where adding the updates into zeros would turn ``-0.0`` into 0;
  ONNX leaves duplicate positions undefined here, and they read one update's neighbour;
- ``mul``, ``max``, ``min``: the language has no multiplying or maximising ``+=``, so a count of
  hits (a ``+=``) gates a reduction over the updates that land on each position. That
  reduction is masked (its work grows as positions times updates along the scattered axes):
  these reductions are rare in exported models.

Indices given at the call are checked by it (a ``TccIndexError`` before anything is written),
as Gather's are; constant indices at import; computed ones are clamped into the axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tcc.frontend import ast
from tcc.frontend.unparse import Ex, access, all_of, call, num, reduction, select, unparse, var
from tcc.interop.graph import Node, Program, Value
from tcc.interop.onnx_index import component, position, readable_at_computed
from tcc.interop.onnx_ops import cast_to, const_of, is_float, norm_axis

COMBINE: dict[str, Callable[[Ex, Ex], Ex]] = {
    "mul": lambda a, b: a * b, "max": lambda a, b: call("max", a, b), "min": lambda a, b: call("min", a, b)}
REDUCER = {"mul": "prod", "max": "max", "min": "min"}


def _reduction(node: Node, dtype: str) -> str:
    kind = node.attrs.get("reduction", "none")
    if kind not in ("none", "add", *COMBINE):
        raise node.error(f"reduction={kind!r} is not an ONNX scatter reduction")
    if kind != "none" and dtype == "bool":
        raise node.error(f"reduction={kind!r} on bool data", hint="Cast the data to a number first")
    return kind


def _identity(kind: str, dtype: str) -> Ex:
    """What a masked-out update contributes to the ``mul``/``max``/``min`` reduction."""
    if kind == "mul":
        return num(1.0) if is_float(dtype) else num(1)
    if is_float(dtype):
        return num(float("-inf") if kind == "max" else float("inf"))
    info = np.iinfo(np.dtype(dtype.replace("i", "int")))
    if kind == "min":
        return num(int(info.max))
    return Ex(ast.BinOp("sub", num(int(info.min) + 1).node, num(1).node))  # -2^63 has no literal (unfolded)


def _add_into(p: Program, target: Value, lhs: Sequence[Ex], rhs: Ex) -> None:
    """Append ``target[lhs] += rhs`` to the statement that defines ``target``: one statement
    for the kernel split, which cuts the program at statements."""
    statement = next(s for s in p.statements if s.name == target.tensor)
    statement.text += f"\n    {unparse(access(target.tensor, lhs).node)} += {unparse(rhs.node)}"


def _flat(idx: Sequence[Ex], shape: Sequence[int]) -> Ex:
    """The row-major number of the position ``idx`` in ``shape``."""
    total: Ex = num(0)
    for i, n in zip(idx, shape):
        total = total * n + i
    return total


def _unravel(number: Ex, shape: Sequence[int]) -> list[Ex]:
    """The position of a row-major number in ``shape``, each index clamped into its dim (the
    number is read from data: the select that uses it computes both its sides)."""
    idx = []
    for d, n in enumerate(shape):
        stride = math.prod(shape[d + 1:])
        i = number // stride if stride > 1 else number
        idx.append(call("min", call("max", i % n if d else i, 0), n - 1))
    return idx


def _clamped(idx: Sequence[Ex], box: Sequence[int], shape: Sequence[int]) -> tuple[list[Ex], Ex | None]:
    """``idx`` (over ``shape``) clamped into ``box``, and the condition that it was inside (None:
    the box is the whole shape)."""
    inside = [i.lt(b) for i, b, n in zip(idx, box, shape) if b < n]
    clamped = [call("min", i, b - 1) if b < n else i for i, b, n in zip(idx, box, shape)]
    return clamped, (all_of(inside) if inside else None)


def _updates(p: Program, node: Node, updates: Value, shape: Sequence[int], data: Value) -> Value:
    """The updates as a tensor (its plain reads give the ``+=`` its index ranges)."""
    if tuple(updates.shape) != tuple(shape):
        raise node.error(f"updates have shape {list(updates.shape)}, expected {list(shape)}")
    if updates.dtype != data.dtype:
        raise node.error(f"updates are {updates.dtype}, data {data.dtype}")
    return p.tensor_value(p.materialize(updates, node.outputs[0] + "_updates"), updates.shape, updates.dtype)


def _check_constant(node: Node, indices: Value, sizes: Sequence[int]) -> None:
    """Constant indices out of range are an import error (component ``c`` of the last dim, or
    the single axis, against ``sizes[c]``)."""
    if indices.const is None or not indices.const.size:
        return
    data = indices.const if len(sizes) == 1 else indices.const.reshape(-1, len(sizes))
    limits = np.array(sizes)
    if np.any(data < -limits) or np.any(data >= limits):
        raise node.error(f"indices out of range for dims of sizes {list(sizes)}")


def _plain(p: Program, node: Node, indices: Value) -> Value:
    """The indices as reads whose every index is a variable of the ``+=``, which is how the
    statement learns their ranges: a graph input as it is (its positions checked at the call),
    anything else (a constant, a broadcast view) copied into a tensor first."""
    probe = [var(f"i{d}") for d in range(indices.rank)]
    read = indices.read(probe).node
    if isinstance(read, ast.Access) and all(isinstance(i, ast.Name) for i in read.indices) \
            and [i.id for i in read.indices] == [v.node.id for v in probe]:
        return indices
    return p.tensor_value(p.materialize(indices, node.outputs[0] + "_indices"), indices.shape, indices.dtype)


def _finish(p: Program, node: Node, x: Value, kind: str, box: Sequence[int], lead: int, positions: Value | None,
            scattered: Callable[[list[Ex]], Ex]) -> Value:
    """``Y = select(hit, scattered, data)`` for none/mul/max/min, or ``data + A`` for add, where
    ``positions`` (over the first ``lead`` dims, within ``box``) counts or numbers the hits."""
    def body(idx: list[Ex]) -> Ex:
        at, inside = _clamped(idx, box, x.shape)
        hit = positions.read(at[:lead]).gt(0)
        cond = hit if inside is None else inside.and_(hit)
        return select(cond, scattered(idx), x.read(idx))

    return p.emit(node.outputs[0], x.shape, x.dtype, body)


def scatter_elements(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, indices, updates = args[0], args[1], args[2]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    kind = _reduction(node, x.dtype)
    if indices.rank != x.rank or any(a > b for d, (a, b) in enumerate(zip(indices.shape, x.shape)) if d != axis):
        raise node.error(f"indices {list(indices.shape)} do not fit data {list(x.shape)} along axis {axis}")
    u = _updates(p, node, updates, indices.shape, x)
    n = x.shape[axis]
    _check_constant(node, indices, [n])
    indices = _plain(p, node, indices)
    box = [n if d == axis else s for d, s in enumerate(indices.shape)]

    def lhs(idx: list[Ex]) -> list[Ex]:
        return [position(p, node, indices, idx, n) if d == axis else i for d, i in enumerate(idx)]

    if kind == "add" and tuple(box) == x.shape:
        y = p.emit(node.outputs[0], x.shape, x.dtype, x.read)
        j = p.index_names(x.rank)
        _add_into(p, y, lhs(j), u.read(j))
        return [y]
    if kind == "add":
        total = p.emit(node.outputs[0] + "_added", box, x.dtype, lambda idx: num(0.0) if is_float(x.dtype) else num(0))
        j = p.index_names(x.rank)
        _add_into(p, total, lhs(j), u.read(j))

        def added(idx: list[Ex]) -> Ex:
            at, inside = _clamped(idx, box, x.shape)
            return select(inside, x.read(idx) + total.read(at), x.read(idx))

        return [p.emit(node.outputs[0], x.shape, x.dtype, added)]
    hits = p.emit(node.outputs[0] + "_hits", box, "i64", lambda idx: num(0))
    j = p.index_names(x.rank)
    _add_into(p, hits, lhs(j), _flat(j, indices.shape) + 1 if kind == "none" else num(1))
    if kind == "none":
        def scattered(idx: list[Ex]) -> Ex:
            at, _ = _clamped(idx, box, x.shape)
            return u.read(_unravel(hits.read(at) - 1, indices.shape))
    else:
        def reduced(idx: list[Ex]) -> Ex:
            along = list(idx)
            along[axis] = var("k0")
            picked = select(position(p, node, indices, along, n).eq(idx[axis]), u.read(along),
                            _identity(kind, x.dtype))
            total = reduction(REDUCER[kind], [("k0", indices.shape[axis])], picked)
            return total if kind != "mul" or x.dtype in ("f32", "f64", "i64") else cast_to(total, x.dtype)

        combined = p.emit(node.outputs[0] + "_" + kind, box, x.dtype, reduced)

        def scattered(idx: list[Ex]) -> Ex:
            at, _ = _clamped(idx, box, x.shape)
            return COMBINE[kind](x.read(idx), combined.read(at))
    return [_finish(p, node, x, kind, box, x.rank, hits, scattered)]


def scatter_nd(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, indices, updates = args[0], args[1], args[2]
    kind = _reduction(node, x.dtype)
    q = indices.shape[-1] if indices.rank else 0
    if indices.rank < 1 or not 1 <= q <= x.rank:
        raise node.error(f"indices {list(indices.shape)} do not fit data {list(x.shape)}")
    rows = tuple(indices.shape[:-1])
    u = _updates(p, node, updates, (*rows, *x.shape[q:]), x)
    _check_constant(node, indices, x.shape[:q])
    indices = _plain(p, node, indices)
    components = [component(indices, c) for c in range(q)]

    def lhs(row: list[Ex]) -> list[Ex]:
        return [position(p, node, components[c], row, x.shape[c]) for c in range(q)]

    if kind == "add":
        y = p.emit(node.outputs[0], x.shape, x.dtype, x.read)
        j = p.index_names(len(rows) + x.rank - q)
        _add_into(p, y, [*lhs(j[:len(rows)]), *j[len(rows):]], u.read(j))
        return [y]
    hits = p.emit(node.outputs[0] + "_hits", x.shape[:q], "i64", lambda idx: num(0))
    j = p.index_names(len(rows))
    _add_into(p, hits, lhs(j), _flat(j, rows) + 1 if kind == "none" else num(1))
    if kind == "none":
        def scattered(idx: list[Ex]) -> Ex:
            return u.read([*_unravel(hits.read(idx[:q]) - 1, rows), *idx[q:]])
    else:
        def reduced(idx: list[Ex]) -> Ex:
            row = [var(f"k{d}") for d in range(len(rows))]
            match = all_of([position(p, node, components[c], row, x.shape[c]).eq(idx[c]) for c in range(q)])
            picked = select(match, u.read([*row, *idx[q:]]), _identity(kind, x.dtype))
            if not rows:
                return picked
            total = reduction(REDUCER[kind], [(f"k{d}", s) for d, s in enumerate(rows)], picked)
            return total if kind != "mul" or x.dtype in ("f32", "f64", "i64") else cast_to(total, x.dtype)

        combined = p.emit(node.outputs[0] + "_" + kind, x.shape, x.dtype, reduced)

        def scattered(idx: list[Ex]) -> Ex:
            return COMBINE[kind](x.read(idx), combined.read(idx))
    return [_finish(p, node, x, kind, x.shape, q, hits, scattered)]


def top_k(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """The ``k`` largest (or smallest) along an axis, sorted, ties to the lower index (ONNX's
    order). Each element's rank is the count of those before it in that order (a masked count:
    work n^2 per row, fine for the small axes exported models sort); a ``+=`` of each element's
    position (plus one) at its rank then lists the positions in order, and the first ``k`` are
    the indices, whose reads are the values."""
    x = args[0]
    if x.dtype == "bool":
        raise node.error("TopK of bools is not supported", hint="Cast them first")
    x = readable_at_computed(p, x, node.outputs[0] + "_input")  # read at the positions it ranks
    k = int(node.attrs["k"]) if node.opset < 10 else int(const_of(node, args[1], "k").reshape(-1)[0])
    axis = norm_axis(node, node.attrs.get("axis", -1), x.rank)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise node.error(f"k={k} for an axis of {n}")
    largest = bool(node.attrs.get("largest", 1))

    def rank(idx: list[Ex]) -> Ex:
        other = [var("k0") if d == axis else i for d, i in enumerate(idx)]
        a, b = x.read(other), x.read(idx)
        before = (a.gt(b) if largest else a.lt(b)).or_(a.eq(b).and_(var("k0").lt(idx[axis])))
        return reduction("sum", [("k0", n)], select(before, call("i64", 1), call("i64", 0)))

    ranks = p.emit(node.outputs[0] + "_rank", x.shape, "i64", rank)
    order = p.emit(node.outputs[0] + "_order", x.shape, "i64", lambda idx: num(0))
    j = p.index_names(x.rank)
    at = call("min", call("max", ranks.read(j), 0), n - 1)
    _add_into(p, order, [at if d == axis else i for d, i in enumerate(j)], call("i64", j[axis]) + 1)
    shape = tuple(k if d == axis else s for d, s in enumerate(x.shape))
    indices = p.emit(node.outputs[-1] if len(node.outputs) > 1 else "indices", shape, "i64",
                     lambda idx: order.read(idx) - 1)

    def value(idx: list[Ex]) -> Ex:
        source = call("min", call("max", order.read(idx) - 1, 0), n - 1)
        return x.read([source if d == axis else i for d, i in enumerate(idx)])

    return [p.emit(node.outputs[0], shape, x.dtype, value), indices]
