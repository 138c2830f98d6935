"""Generators of the operators that index by data and of running sums: Gather, GatherElements
and GatherND with indices given at run time (graph inputs, so tcc checks them at the call, or a
view of one), and CumSum with ``exclusive``/``reverse``.

An index input is named ``idx{n}_{k}``: its feed holds values in [-n, n) (negative ones count
from the end), see ``generate.feeds_for``. Only in-range indices are generated (an out-of-range
index is an error in both tcc and onnxruntime, tested elsewhere).
"""

from __future__ import annotations

from fuzz.onnx.graph import Graph, Val

INDEX_PREFIX = "idx"


def index_input(g: Graph, n: int, shape: tuple[int, ...]) -> Val:
    """An int64 graph input whose values lie in [-n, n) (the feed reads ``n`` from its name)."""
    v = Val(f"{INDEX_PREFIX}{n}_{g.name('')}", "i64", shape)
    g.inputs.append(v)
    return v


def index_range(name: str) -> int | None:
    """The ``n`` of an index input's name, or None for another input."""
    if not name.startswith(INDEX_PREFIX):
        return None
    return int(name[len(INDEX_PREFIX):].split("_")[0])


def gather(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and min(v.shape) > 0)
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    idx_shape = tuple(g.rng.choice((1, 2, 3, 5)) for _ in range(g.rng.choice((0, 1, 1, 2))))
    indices = index_input(g, x.shape[axis], idx_shape)
    shape = x.shape[:axis] + idx_shape + x.shape[axis + 1:]
    g.node("Gather", [x, indices], [(x.dtype, shape)], axis=axis - x.rank if g.rng.random() < 0.3 else axis)
    return True


def gather_elements(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and min(v.shape) > 0)
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    shape = tuple(g.rng.choice((1, n)) if d != axis else g.rng.choice((1, 2, 3, 5)) for d, n in enumerate(x.shape))
    indices = index_input(g, x.shape[axis], shape)
    g.node("GatherElements", [x, indices], [(x.dtype, shape)], axis=axis)
    return True


def gather_nd(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and min(v.shape) > 0)
    if x is None:
        return False
    batch = g.rng.randint(0, x.rank - 1) if x.rank > 1 and g.rng.random() < 0.3 else 0
    q = g.rng.randint(1, x.rank - batch)
    ranges = x.shape[batch:batch + q]
    if len(set(ranges)) != 1:  # one input's values serve every component: a range all fit
        q, ranges = 1, ranges[:1]
    middle = tuple(g.rng.choice((1, 2, 3)) for _ in range(g.rng.choice((0, 1, 2))))
    indices = index_input(g, ranges[0], (*x.shape[:batch], *middle, q))
    shape = (*x.shape[:batch], *middle, *x.shape[batch + q:])
    g.node("GatherND", [x, indices], [(x.dtype, shape)], batch_dims=batch)
    return True


def cumsum(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and v.dtype in ("f32", "f64", "i32", "i64"))
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    axis_value = g.const([axis - x.rank if g.rng.random() < 0.3 else axis], g.rng.choice(("i64", "i32")))
    g.node("CumSum", [x, axis_value], [(x.dtype, x.shape)], exclusive=g.rng.choice((0, 1)),
           reverse=g.rng.choice((0, 1)))
    return True
