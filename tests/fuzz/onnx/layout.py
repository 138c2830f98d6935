"""Generators of the operators that move or repeat elements: Expand (broadcasting either way),
Tile, Pad (constant, edge, reflect and wrap, negative pads that crop, an axes subset), Range and
Trilu. tcc makes most of them views, so they compose with the views of ``views``.

Left out, where onnxruntime refuses what another implementation may accept: reflect padding
at least as wide as the (cropped) axis (the ONNX reference reflects again; onnxruntime raises),
and edge, reflect or wrap padding of an axis cropped to nothing. Negative pads in those modes
are cropped first, then padded (onnxruntime's reading; the ONNX reference refuses them).
"""

from __future__ import annotations

import math

import numpy as np

from fuzz.onnx.graph import FLOATS, Graph, broadcast_shape

LIMIT = 2048  # elements of a result: repeats and broadcasts multiply sizes


def expand(g: Graph) -> bool:
    """Expand to a shape whose dims are the input's, 1 (the input's dim is kept) or a
    broadcast of an input's 1, with up to two new leading dims."""
    x = g.pick()
    target = [g.rng.choice((1, 2, 3)) if d == 1 else g.rng.choice((d, d, 1)) for d in x.shape]
    target = [g.rng.choice((1, 2, 3)) for _ in range(g.rng.randint(0, 2))] + target
    shape = broadcast_shape(x.shape, target)
    if math.prod(shape) > LIMIT:
        return False
    g.node("Expand", [x, g.ints(target)], [(x.dtype, shape)])
    return True


def tile(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0)
    if x is None:
        return False
    repeats = [g.rng.choice((1, 1, 2, 3)) for _ in x.shape]
    shape = [d * r for d, r in zip(x.shape, repeats)]
    if math.prod(shape) > LIMIT:
        return False
    g.node("Tile", [x, g.ints(repeats)], [(x.dtype, shape)])
    return True


def pad(g: Graph) -> bool:
    """Pad some axes (all of them, or those an ``axes`` input names from opset 18) by amounts
    from -(n - 1) to 3 on each side, in one of the modes (wrap from opset 19)."""
    x = g.pick(lambda v: v.rank > 0 and v.dtype != "bool")
    if x is None:
        return False
    modes = ("constant", "constant", "edge", "reflect") + (("wrap",) if g.opset >= 19 else ())
    mode = g.rng.choice(modes)
    axes = list(range(x.rank))
    if g.opset >= 18 and g.rng.random() < 0.4:
        axes = sorted(g.rng.sample(axes, g.rng.randint(1, x.rank)))
    lo = [_amount(g, x.shape[a]) for a in axes]
    hi = [_amount(g, x.shape[a] + min(b, 0)) for a, b in zip(axes, lo)]
    shape = list(x.shape)
    for a, b, e in zip(axes, lo, hi):
        kept = x.shape[a] + min(b, 0) + min(e, 0)
        if kept < 1 or mode == "reflect" and max(b, e) >= kept:
            return False
        shape[a] += b + e
    if math.prod(shape) > LIMIT:
        return False
    args = [x, g.ints(lo + hi)]
    if mode == "constant" and g.rng.random() < 0.5:
        fill = g.rng.choice((0.0, 1.5, -3.0)) if x.dtype in FLOATS else g.rng.choice((0, 7, -2))
        args.append(g.const(np.array(fill), x.dtype))
    if axes != list(range(x.rank)):
        spelled = [a - x.rank if g.rng.random() < 0.3 else a for a in axes]
        args += [None] * (3 - len(args)) + [g.ints(spelled)]
    attrs = {"mode": mode} if mode != "constant" or g.rng.random() < 0.3 else {}
    g.node("Pad", args, [(x.dtype, shape)], **attrs)
    return True


def _amount(g: Graph, n: int) -> int:
    """A pad of one side: positive, zero, or a crop that leaves at least one element."""
    return g.rng.randint(-(n - 1), 3) if g.rng.random() < 0.4 else g.rng.randint(0, 3)


def range_(g: Graph) -> bool:
    """Range of ints or of floats stepping by binary fractions (each element exact), up or down."""
    dtype = g.rng.choice(("i64", "i32", "f32", "f64"))
    delta = g.rng.choice((1, 2, 3, -1, -2)) * (g.rng.choice((1, 0.5, 0.25)) if dtype in FLOATS else 1)
    start = g.rng.randint(-5, 5)
    count = g.rng.randint(1, 12)
    limit = start + delta * count - (g.rng.choice((0, 0.5)) if dtype in FLOATS else 0) * delta
    bounds = [g.const(np.array(v), dtype) for v in (start, limit, delta)]
    g.node("Range", bounds, [(dtype, [len(np.arange(start, limit, delta))])])
    return True


def trilu(g: Graph) -> bool:
    """The upper or lower triangle (from diagonal k in -3..3) of the last two axes."""
    x = g.pick(lambda v: v.rank >= 2 and v.dtype != "i8")
    if x is None:
        return False
    args = [x] + ([g.const(np.array(g.rng.randint(-3, 3)), "i64")] if g.rng.random() < 0.6 else [])
    attrs = {"upper": g.rng.choice((0, 1))} if g.rng.random() < 0.7 else {}
    g.node("Trilu", args, [(x.dtype, x.shape)], **attrs)
    return True
