"""Generators of the operators transformers and detection heads add: Sin, Cos, Floor, Ceil,
ScatterElements and ScatterND (every reduction), TopK, Einsum, Resize, and opset 23's
RMSNormalization, RotaryEmbedding and Attention (only in graphs of opset 23).

What two correct implementations may compute differently is kept out, each for its reason:
- Floor and Ceil read exact values (a value rounded differently may cross an integer); TopK reads
  exact values (its order, and its ties, depend on them);
- a scatter without reduction writes distinct positions (ONNX leaves duplicates undefined), so
  its indices are constants; with a reduction they are run-time inputs, duplicates included;
- Resize scales are 0.5, 2 and 3 on sizes they divide, with half_pixel or asymmetric
  coordinates: onnxruntime rounds other source positions across a nearest tie in f32 where ONNX's
  reference does not; its linear and cubic modes take 2-D inputs or 4-D ones resized in the last
  two dims, and f32 only.
"""

from __future__ import annotations

import numpy as np

from fuzz.onnx.graph import FLOATS, Graph, Val
from fuzz.onnx.indexing import index_input


def trig_and_rounding(g: Graph) -> bool:
    op = g.rng.choice(("Sin", "Cos", "Floor", "Ceil"))
    x = g.pick(lambda v: v.dtype in FLOATS and (v.exact or op in ("Sin", "Cos")))
    if x is None:
        return False
    g.node(op, [x], [(x.dtype, x.shape)])
    return True


def scatter_elements(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and min(v.shape) > 0 and v.dtype in ("f32", "f64", "i32", "i64"))
    if x is None:
        return False
    reduction = _reduction(g, x)
    axis = g.rng.randrange(x.rank)
    n = x.shape[axis]
    shape = tuple(g.rng.randint(1, s) if d != axis else g.rng.randint(1, n if reduction == "none" else 5)
                  for d, s in enumerate(x.shape))
    if reduction == "none":  # distinct positions along the axis for each line
        count = int(np.prod(shape)) // shape[axis]
        lines = np.stack([np.array(g.rng.sample(range(n), shape[axis])) for _ in range(count)])
        indices = g.const(np.moveaxis(lines.reshape(*shape[:axis], *shape[axis + 1:], shape[axis]), -1, axis), "i64")
    else:
        indices = index_input(g, n, shape)
    updates = g.const(g.random_array(x.dtype, shape), x.dtype)
    attrs = {"reduction": reduction} if reduction != "none" or g.rng.random() < 0.5 else {}
    g.node("ScatterElements", [x, indices, updates], [(x.dtype, x.shape)], axis=axis, **attrs)
    return True


def scatter_nd(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and min(v.shape) > 0 and v.dtype in ("f32", "f64", "i32", "i64"))
    if x is None:
        return False
    reduction = _reduction(g, x)
    q = g.rng.randint(1, x.rank)
    rows = tuple(g.rng.choice((1, 2, 3)) for _ in range(g.rng.choice((0, 1, 2))))
    count = int(np.prod(rows))
    if reduction == "none" or len(set(x.shape[:q])) != 1:
        if count > int(np.prod(x.shape[:q])):
            return False
        flat = g.rng.sample(range(int(np.prod(x.shape[:q]))), count)
        indices = g.const(np.stack(np.unravel_index(flat, x.shape[:q]), -1).reshape(*rows, q), "i64")
    else:  # one input's values serve every component: a range they all fit
        indices = index_input(g, x.shape[0], (*rows, q))
    updates = g.const(g.random_array(x.dtype, (*rows, *x.shape[q:])), x.dtype)
    attrs = {"reduction": reduction} if reduction != "none" or g.rng.random() < 0.5 else {}
    g.node("ScatterND", [x, indices, updates], [(x.dtype, x.shape)], **attrs)
    return True


def _reduction(g: Graph, x: Val) -> str:
    kinds = ["none", "add"] + (["mul"] if x.dtype in ("i32", "i64") else []) + (["max", "min"] if g.opset >= 18 else [])
    return g.rng.choice(kinds)


def top_k(g: Graph) -> bool:
    x = g.pick(lambda v: v.rank > 0 and min(v.shape) > 0 and v.exact and v.dtype in ("f32", "f64", "i32", "i64"))
    if x is None:
        return False
    axis = g.rng.randrange(x.rank)
    k = g.rng.randint(1, x.shape[axis])
    shape = tuple(k if d == axis else s for d, s in enumerate(x.shape))
    g.node("TopK", [x, g.ints([k])], [(x.dtype, shape), ("i64", shape)], axis=axis - x.rank if g.rng.random() < 0.3
           else axis, largest=g.rng.choice((0, 1)))
    return True


def einsum(g: Graph) -> bool:
    """A batched contraction with a constant (``...ij,jk->...ik``), a transpose (``ij->ji``) or a
    sum over a dim (``ij->i``)."""
    x = g.pick(lambda v: v.rank >= 2 and v.dtype in ("f32", "f64"))
    if x is None:
        return False
    letters = "abcde"[:x.rank]
    kind = g.rng.random()
    if kind < 0.5:
        w = g.const(g.random_array(x.dtype, (x.shape[-1], g.rng.choice((1, 3, 5)))), x.dtype)
        equation, shape, args = f"...{letters[-1]},{letters[-1]}z->...z", (*x.shape[:-1], w.shape[1]), [x, w]
    elif kind < 0.75:
        out = letters[::-1]
        equation, shape, args = f"{letters}->{out}", x.shape[::-1], [x]
    else:
        equation, shape, args = f"{letters}->{letters[:-1]}", x.shape[:-1], [x]
    g.node("Einsum", args, [(x.dtype, shape)], exact=False, equation=equation)
    return True


def resize(g: Graph) -> bool:
    x = g.pick(lambda v: v.dtype == "f32" and v.rank in (2, 4) and min(v.shape) > 0)
    if x is None:
        return False
    mode = g.rng.choice(("nearest", "linear", "cubic"))
    scales, shape = [1.0] * x.rank, list(x.shape)
    for d in range(x.rank - 2, x.rank):
        choices = [s for s in (0.5, 2.0, 3.0, 1.0) if s >= 1 or x.shape[d] % 2 == 0]
        scales[d] = g.rng.choice(choices)
        shape[d] = int(x.shape[d] * scales[d])
    transform = g.rng.choice(("half_pixel", "asymmetric", "pytorch_half_pixel"))
    g.node("Resize", [x, None, g.const(np.array(scales, np.float32), "f32")], [("f32", shape)],
           exact=mode == "nearest" and x.exact, mode=mode, coordinate_transformation_mode=transform)
    return True


def rms_norm(g: Graph) -> bool:
    x = g.pick(lambda v: v.dtype in ("f32", "f16") and v.rank >= 1) if g.opset >= 23 else None
    if x is None:
        return False
    axis = g.rng.randint(-x.rank, x.rank - 1)
    scale = g.const(g.random_array(x.dtype, x.shape[axis:]), x.dtype)
    g.node("RMSNormalization", [x, scale], [(x.dtype, x.shape)], axis=axis, epsilon=g.rng.choice((1e-5, 1e-3)))
    return True


def rotary_embedding(g: Graph) -> bool:
    x = g.pick(lambda v: v.dtype == "f32" and v.rank == 4 and v.shape[3] % 2 == 0) if g.opset >= 23 else None
    if x is None:
        return False
    b, _, s, d = x.shape
    half = d // 2
    angles = g.random_array("f32", (7, half))
    cos, sin = g.const(np.cos(angles), "f32"), g.const(np.sin(angles), "f32")
    ids = g.const(np.array([[g.rng.randrange(7) for _ in range(s)] for _ in range(b)]), "i64")  # ids are >= 0
    g.node("RotaryEmbedding", [x, cos, sin, ids], [("f32", x.shape)], interleaved=g.rng.choice((0, 1)))
    return True


def attention(g: Graph) -> bool:
    """Self-attention of a 4-D value with itself as queries, keys and values (or a constant
    keys and values of its own length), causal half the time."""
    q = g.pick(lambda v: v.dtype == "f32" and v.rank == 4 and min(v.shape) > 0) if g.opset >= 23 else None
    if q is None:
        return False
    kv = q if g.rng.random() < 0.5 else g.const(g.random_array("f32", (q.shape[0], q.shape[1], 5, q.shape[3])), "f32")
    g.node("Attention", [q, kv, kv], [("f32", q.shape)], exact=False, is_causal=g.rng.choice((0, 1)))
    return True
