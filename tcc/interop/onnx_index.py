"""ONNX operators that index by data, and running sums: Gather, GatherElements, GatherND and
CumSum, as the language writes them.

A gather is a view whose index reads the indices tensor (``x[idx[i]]``): no statement, no copy,
no masked sum over the axis. Negative indices count from the end, as ONNX says. Indices the call
gives (a graph input, or a view of one) are checked by every call before anything runs, so an
index out of range is a ``TccIndexError`` as onnxruntime's is an error; constant indices are
checked at import, and indices the model computes are clamped into the axis (a tcc op cannot
check a tensor it computes itself before the call). CumSum is a prefix sum, ``sum[j: i + 1]``,
which the compiler computes as a scan in linear work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tcc.frontend import ast
from tcc.frontend.unparse import Ex, call, num, reduction, select, var
from tcc.interop.graph import Node, Program, Value, view
from tcc.interop.onnx_ops import cast_to, const_of, norm_axis
from tcc.interop.onnx_shapes import affine_index


def _checked_at_call(p: Program, indices: Value) -> bool:
    """Whether ``indices`` reads only the op's parameters (graph inputs, weights): then the call
    checks the positions it gives."""
    probe = indices.read([var(f"i{d}") for d in range(indices.rank)])
    params = {name for name, _, _ in p.params}
    stack = [probe.node]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Access):
            if node.tensor not in params:
                return False
            stack += node.indices
        elif isinstance(node, ast.Node):
            stack += [v for v in vars(node).values() if isinstance(v, ast.Node)]
            stack += [x for v in vars(node).values() if isinstance(v, list) for x in v if isinstance(x, ast.Node)]
    return indices.const is None


def _indexes_by_data(x: Value) -> bool:
    """Whether reading ``x`` reads some tensor at a position read from data (a Gather's view)."""
    probe = x.read([var(f"i{d}") for d in range(x.rank)]).node
    return any(isinstance(n, ast.Access) and any(isinstance(m, ast.Access) for i in n.indices for m in _nodes(i))
               for n in _nodes(probe))


def _nodes(root: ast.Node) -> list[ast.Node]:
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack += [v for v in vars(node).values() if isinstance(v, ast.Node)]
        stack += [c for v in vars(node).values() if isinstance(v, list) for c in v if isinstance(c, ast.Node)]
    return found


def readable_at_computed(p: Program, x: Value, hint: str) -> Value:
    """``x``, stored first when it is a view that indexes by data: read at positions the op
    computes, its own data index would be read at those positions too, where the call's check
    cannot see it (a bounds error)."""
    if x.tensor is not None or x.const is not None or not _indexes_by_data(x):
        return x
    return p.tensor_value(p.materialize(x, hint), x.shape, x.dtype)


def position(p: Program, node: Node, indices: Value, idx: Sequence[Ex], n: int, negative: bool = True) -> Ex:
    """Where an index read at ``idx`` points along an axis of size ``n`` (``negative``: values
    below 0 count from the end, else they are out of range)."""
    if indices.const is not None:
        flat = indices.const.reshape(-1)
        if flat.size and (flat.min() < (-n if negative else 0) or flat.max() >= n):
            raise node.error(f"indices out of range for an axis of size {n}")
    i = indices.read(idx)
    at = select(i.lt(0), i + n, i) if negative else i
    if _checked_at_call(p, indices):
        return at
    return call("min", call("max", at, 0), n - 1)


def gather(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, indices = args[0], args[1]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    n = x.shape[axis]
    shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]
    k = indices.rank
    if indices.const is not None:
        flat = indices.const.reshape(-1).astype(np.int64)
        if np.any((flat < -n) | (flat >= n)):
            raise node.error(f"indices out of range for axis {axis} of size {n}")
        flat = np.where(flat < 0, flat + n, flat)
        if x.const is not None:
            return [p.constant(np.take(x.const, flat.reshape(indices.shape), axis=axis), x.dtype, node.outputs[0])]
        if flat.size == 1 or k == 1 and flat.size > 1 and len(set(np.diff(flat).tolist())) == 1:
            start, step = int(flat[0]), int(flat[1] - flat[0]) if flat.size > 1 else 0

            def affine(idx: Sequence[Ex]) -> Ex:  # a slice in disguise: an affine view
                pos = num(start) if k == 0 or step == 0 else affine_index(start, step, idx[axis])
                return x.read([*idx[:axis], pos, *idx[axis + k:]])

            return [view(x, shape, affine)]
    if n == 0:
        raise node.error(f"Gather from an empty axis {axis}")
    if not _checked_at_call(p, indices):
        x = readable_at_computed(p, x, node.outputs[0] + "_data")

    def read(idx: Sequence[Ex]) -> Ex:
        return x.read([*idx[:axis], position(p, node, indices, idx[axis:axis + k], n), *idx[axis + k:]])

    return [view(x, shape, read)]


def gather_elements(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, indices = args[0], args[1]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    if indices.rank != x.rank:
        raise node.error(f"indices have rank {indices.rank}, data rank {x.rank}")
    n = x.shape[axis]
    if n == 0 and indices.size:
        raise node.error(f"GatherElements from an empty axis {axis}")
    if not _checked_at_call(p, indices):
        x = readable_at_computed(p, x, node.outputs[0] + "_data")

    def read(idx: Sequence[Ex]) -> Ex:
        return x.read([position(p, node, indices, idx, n) if d == axis else i for d, i in enumerate(idx)])

    return [view(x, indices.shape, read)]


def gather_nd(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, indices = args[0], args[1]
    b = node.attrs.get("batch_dims", 0)
    q = indices.shape[-1] if indices.rank else 0
    if indices.rank < 1 or b + q > x.rank or indices.shape[:b] != x.shape[:b]:
        raise node.error(f"indices {list(indices.shape)} do not fit data {list(x.shape)} with batch_dims={b}")
    middle = indices.shape[b:-1]
    shape = (*x.shape[:b], *middle, *x.shape[b + q:])
    if not _checked_at_call(p, indices):
        x = readable_at_computed(p, x, node.outputs[0] + "_data")

    def read(idx: Sequence[Ex]) -> Ex:
        batch, inner, rest = idx[:b], idx[b:b + len(middle)], idx[b + len(middle):]
        picked = [position(p, node, component(indices, c), [*batch, *inner], x.shape[b + c])
                  for c in range(q)]
        return x.read([*batch, *picked, *rest])

    return [view(x, shape, read)]


def component(indices: Value, c: int) -> Value:
    """Component ``c`` of the index tuples (the last dim of GatherND's indices)."""
    part = view(indices, indices.shape[:-1], lambda idx: indices.read([*idx, num(c)]))
    part.const = indices.const[..., c] if indices.const is not None else None
    return part


def cumsum(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """A running sum along an axis (``exclusive``: of the elements before; ``reverse``: from the
    end), a prefix reduction the compiler turns into a scan."""
    x = args[0]
    axis = norm_axis(node, int(const_of(node, args[1], "axis").reshape(-1)[0]), x.rank)
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    n = x.shape[axis]
    if x.const is not None:
        data = np.flip(x.const, axis) if reverse else x.const
        total = np.cumsum(data, axis=axis, dtype=data.dtype)
        if exclusive:
            total = np.concatenate([np.zeros_like(np.take(total, [0], axis)), np.delete(total, -1, axis)], axis) \
                if n else total
        return [p.constant(np.flip(total, axis) if reverse else total, x.dtype, node.outputs[0])]
    source = _flipped(x, axis) if reverse else x

    def body(idx: list[Ex]) -> Ex:
        i, j = idx[axis], var("j0")
        extent = i if exclusive else i + 1
        total = reduction("sum", [("j0", extent)], source.read([j if d == axis else e for d, e in enumerate(idx)]))
        return total if x.dtype in ("f32", "f64", "i64") else cast_to(total, x.dtype)

    scanned = p.emit(node.outputs[0] + ("_reversed" if reverse else ""), x.shape, x.dtype, body)
    return [_flipped(scanned, axis) if reverse else scanned]


def _flipped(x: Value, axis: int) -> Value:
    n = x.shape[axis]
    return view(x, x.shape, lambda idx: x.read([(n - 1) - i if d == axis else i for d, i in enumerate(idx)]))
