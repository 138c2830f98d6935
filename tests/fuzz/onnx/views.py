"""Generators of the shape-only operators, which tcc turns into index expressions instead of
copies: Transpose, Reshape, Flatten, Unsqueeze, Squeeze, Slice (negative and strided steps),
Gather with constant indices, Split, Concat, Identity, Dropout, Shape and ConstantOfShape.

Each takes the graph, appends one node (with its constant operands) and returns False when no
value fits. Their operands are usually the newest value, so views compose with views.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from fuzz.onnx.graph import Graph, Val, factor


def transpose(g: Graph) -> bool:
    x = g.pick()
    perm = list(range(x.rank))
    g.rng.shuffle(perm)
    attrs = {"perm": perm} if perm and g.rng.random() < 0.8 else {}  # default: reversed
    perm = perm if attrs else list(reversed(range(x.rank)))
    g.node("Transpose", [x], [(x.dtype, [x.shape[p] for p in perm])], **attrs)
    return True


def reshape(g: Graph) -> bool:
    x = g.pick()
    dims = factor(g.rng, x.size, g.rng.randint(0, 4) if x.size == 1 else g.rng.randint(1, 4))
    spelled = list(dims)
    if dims and g.rng.random() < 0.3:
        spelled[g.rng.randrange(len(dims))] = -1
    for i, d in enumerate(dims):  # 0 copies the input's dim (allowzero=0)
        if i < x.rank and x.shape[i] == d and spelled[i] != -1 and g.rng.random() < 0.3:
            spelled[i] = 0
    g.node("Reshape", [x, g.ints(spelled)], [(x.dtype, dims)])
    return True


def flatten(g: Graph) -> bool:
    x = g.pick()
    axis = g.rng.randint(-x.rank, x.rank)
    cut = axis + x.rank if axis < 0 else axis
    outer = int(np.prod(x.shape[:cut]))
    g.node("Flatten", [x], [(x.dtype, [outer, x.size // outer])], axis=axis)
    return True


def unsqueeze(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank < 5)
    if x is None:
        return False
    rank = x.rank + g.rng.randint(1, 2)
    axes = g.rng.sample(range(rank), rank - x.rank)
    shape, rest = [], iter(x.shape)
    for i in range(rank):
        shape.append(1 if i in axes else next(rest))
    spelled = [a - rank if g.rng.random() < 0.3 else a for a in axes]
    _with_axes(g, "Unsqueeze", x, spelled, 13, [(x.dtype, shape)])
    return True


def squeeze(g: Graph) -> bool:
    x = g.pick(lambda v: 1 in v.shape)
    if x is None:
        return False
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    axes = g.rng.sample(ones, g.rng.randint(1, len(ones)))
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    if len(axes) == len(ones) and g.rng.random() < 0.3:
        g.node("Squeeze", [x], [(x.dtype, shape)])  # no axes: every dim of 1
        return True
    _with_axes(g, "Squeeze", x, [a - x.rank if g.rng.random() < 0.3 else a for a in axes], 13, [(x.dtype, shape)])
    return True


def _with_axes(g: Graph, op: str, x: Val, axes: list[int], since: int, outs: list) -> None:
    """Axes as an input from opset ``since`` on, as an attribute before."""
    if g.opset >= since:
        g.node(op, [x, g.ints(axes)], outs)
    else:
        g.node(op, [x], outs, axes=axes)


def slice_(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0)
    if x is None:
        return False
    axes = g.rng.sample(range(x.rank), g.rng.randint(1, x.rank))
    starts, ends, steps, shape = [], [], [], list(x.shape)
    for a in axes:
        n = x.shape[a]
        step = g.rng.choice((1, 1, 2, 3, -1, -1, -2))
        start, end = _bound(g, n, step, True), _bound(g, n, step, False)
        length = len(range(*slice(start, end, step).indices(n)))
        if length == 0:  # an empty tensor: take the whole axis in this direction instead
            start, end = (0, n) if step > 0 else (n - 1, -n - 1)
            length = len(range(*slice(start, end, step).indices(n)))
        starts.append(start), ends.append(end), steps.append(step)
        shape[a] = length
    spelled_axes = [a - x.rank if g.rng.random() < 0.3 else a for a in axes]
    args = [x, g.ints(starts), g.ints(ends), g.ints(spelled_axes)]
    if steps != [1] * len(axes) or g.rng.random() < 0.5:
        args.append(g.ints(steps))
    g.node("Slice", args, [(x.dtype, shape)])
    return True


def _bound(g: Graph, n: int, step: int, start: bool) -> int:
    """A start or end: in range, negative, or past either end (ONNX clamps)."""
    r = g.rng.random()
    if r < 0.15:
        return (2**62 if (step > 0) != start else -(2**62))
    if r < 0.3:
        return g.rng.randint(-n - 2, -1)
    return g.rng.randint(0, n + 1)


def gather(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0)
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    n = x.shape[axis]
    rank = g.rng.choice((0, 1, 1, 2))
    idx_shape = tuple(g.rng.choice((1, 2, 3)) for _ in range(rank))
    idx = np.array([g.rng.randint(-n, n - 1) for _ in range(int(np.prod(idx_shape)))]).reshape(idx_shape)
    indices = g.const(idx, g.rng.choice(("i64", "i32")))
    shape = x.shape[:axis] + idx_shape + x.shape[axis + 1:]
    g.node("Gather", [x, indices], [(x.dtype, shape)], axis=axis - x.rank if g.rng.random() < 0.3 else axis)
    return True


def split(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and max(v.shape) > 1)
    if x is None:
        return False
    axis = g.rng.choice([a for a in range(x.rank) if x.shape[a] > 1])
    n = x.shape[axis]
    attrs = {"axis": axis - x.rank if g.rng.random() < 0.3 else axis}
    form = g.rng.choice(("sizes", "equal", "num_outputs" if g.opset >= 18 else "sizes"))
    if form == "sizes":
        cuts = sorted(g.rng.sample(range(1, n), g.rng.randint(1, min(3, n - 1))))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
        args = [x, g.ints(sizes)] if g.opset >= 13 else [x]
        if g.opset < 13:
            attrs["split"] = sizes
    elif form == "equal":
        count = g.rng.choice([c for c in (1, 2, 3, 5, 7) if n % c == 0])
        sizes, args = [n // count] * count, [x]
        if g.opset >= 18:
            attrs["num_outputs"] = count
    else:
        count = g.rng.randint(2, n)
        chunk = -(-n // count)
        sizes = [min(chunk, n - i) for i in range(0, n, chunk)]
        if len(sizes) != count:
            return False
        args, attrs["num_outputs"] = [x], count
    outs = [(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes]
    g.node("Split", args, outs, **attrs)
    return True


def concat(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0)
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    parts, total = [x], x.shape[axis]
    for _ in range(g.rng.randint(1, 2)):
        same = g.pick(lambda v: v.dtype == x.dtype and v.rank == x.rank and all(
            d == e for i, (d, e) in enumerate(zip(v.shape, x.shape)) if i != axis))
        if same is None or g.rng.random() < 0.3:
            shape = list(x.shape)
            shape[axis] = g.rng.choice((1, 2, 3))
            same = g.input(x.dtype, shape)
        parts.append(same)
        total += same.shape[axis]
    shape = list(x.shape)
    shape[axis] = total
    g.node("Concat", parts, [(x.dtype, shape)], axis=axis - x.rank if g.rng.random() < 0.3 else axis)
    return True


def identity(g: Graph) -> bool:
    x = g.pick()
    if g.rng.random() < 0.5 or x.dtype not in ("f32", "f16", "f64"):
        g.node("Identity", [x], [(x.dtype, x.shape)])
    else:
        g.node("Dropout", [x], [(x.dtype, x.shape)])
    return True


def shape_of(g: Graph) -> bool:
    """Shape feeding ConstantOfShape (a filled tensor) or a Reshape to another value's shape:
    the shape arithmetic tcc folds at import."""
    x = g.pick(lambda v: v.rank > 0)
    if x is None:
        return False
    shape = g.node("Shape", [x], [("i64", [x.rank])])[0]
    other = g.pick(lambda v: v.size == x.size and v is not x and v.name != shape.name)
    if other is not None and g.rng.random() < 0.5:
        g.node("Reshape", [other, shape], [(other.dtype, x.shape)])
    else:
        fill = g.random_array("f32", [1])
        g.node("ConstantOfShape", [shape], [("f32", x.shape)], value=numpy_helper.from_array(fill))
    return True
