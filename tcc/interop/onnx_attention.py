"""ONNX's transformer operators of opset 23: RMSNormalization and RotaryEmbedding.

Each is what a hand-written op would say: RMSNorm one reduction and one elementwise statement;
the rotation one statement whose two halves (or interleaved pairs) read each other under a
``select`` on the position, which the bounds proof narrows (``x[d + H]`` where ``d < H``).
Position ids index the cos/sin caches by data, checked at the call like Gather's indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tcc.frontend.unparse import Ex, call, num, select
from tcc.interop.graph import Node, Program, Value, broadcast_read, float_literal
from tcc.interop.onnx_index import position
from tcc.interop.onnx_ops import is_float, norm_axis, reduce_over
from tcc.interop.onnx_shapes import reshape_view


def rms_norm(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """``x / sqrt(mean(x^2) + eps) * scale`` over the axes from ``axis`` on, in ``stash_type``."""
    x, scale = args[0], args[1]
    if not is_float(x.dtype):
        raise node.error(f"RMSNormalization takes floats, got {x.dtype}")
    axis = norm_axis(node, node.attrs.get("axis", -1), x.rank)
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    stash = {1: "f32", 11: "f64"}.get(node.attrs.get("stash_type", 1), "f32")
    axes = list(range(axis, x.rank))
    count = math.prod(x.shape[axis:])
    kept = tuple(n if d < axis else 1 for d, n in enumerate(x.shape))

    def wide(idx: Sequence[Ex]) -> Ex:
        return x.read(idx) if x.dtype == stash else call(stash, x.read(idx))

    inv = p.emit(node.outputs[0] + "_inv", kept, stash, lambda idx: call("rsqrt", reduce_over(
        "sum", x, axes, idx, lambda full: wide(full) * wide(full)) / count + eps))
    tail = x.shape[axis:]

    def body(idx: list[Ex]) -> Ex:
        norm = wide(idx) * inv.read([i if d < axis else num(0) for d, i in enumerate(idx)])
        norm = norm if x.dtype == stash else call(x.dtype, norm)
        g = broadcast_read(scale, idx[axis:], tail) if scale.rank <= len(tail) else broadcast_read(scale, idx, x.shape)
        return norm * g

    return [p.emit(node.outputs[0], x.shape, x.dtype, body)]


def rotary_embedding(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Rotate pairs of the first ``rotary_embedding_dim`` features of each head by the angle of
    its position: the two halves (``interleaved=0``) or even/odd neighbours (``interleaved=1``)."""
    x, cos, sin = args[0], args[1], args[2]
    ids = args[3] if len(args) > 3 else None
    if x.rank == 3:
        heads = node.attrs.get("num_heads", 0)
        if not heads or x.shape[2] % heads:
            raise node.error(f"a 3-D input needs num_heads dividing its {x.shape[2]} features")
        x4 = reshape_view(p, x, (*x.shape[:2], heads, x.shape[2] // heads), node.outputs[0])
        seq_dim = 1
    elif x.rank == 4:
        x4, seq_dim = x, 2
    else:
        raise node.error(f"RotaryEmbedding takes a 3-D or 4-D input, got rank {x.rank}")
    head = x4.shape[3]
    rotary = node.attrs.get("rotary_embedding_dim", 0) or head
    half = rotary // 2
    if rotary % 2 or rotary > head or cos.shape[-1] != half or sin.shape[-1] != half:
        raise node.error(f"caches {list(cos.shape)} do not fit rotary_embedding_dim {rotary} of heads of {head}")

    def angle(cache: Value, idx: Sequence[Ex], k: Ex) -> Ex:
        b, s = idx[0], idx[seq_dim]
        if ids is None:
            return cache.read([b, s, k])
        return cache.read([position(p, node, ids, [b, s], cache.shape[0]), k])

    def body(idx: list[Ex]) -> Ex:
        d = idx[3]

        def at(j: Ex) -> Ex:
            return x4.read([*idx[:3], j])

        if node.attrs.get("interleaved", 0):
            k = d // 2
            pair_even = angle(cos, idx, k) * at(d) - angle(sin, idx, k) * at(call("min", d + 1, rotary - 1))
            pair_odd = angle(sin, idx, k) * at(call("max", d - 1, 0)) + angle(cos, idx, k) * at(d)
            rotated = select((d % 2).eq(0), pair_even, pair_odd)
        else:
            first = angle(cos, idx, d) * at(d) - angle(sin, idx, d) * at(d + half)
            second = angle(sin, idx, d - half) * at(d - half) + angle(cos, idx, d - half) * at(d)
            rotated = select(d.lt(half), first, second)
        return rotated if rotary == head else select(d.lt(rotary), rotated, at(d))

    out = p.emit(node.outputs[0], x4.shape, x.dtype, body)
    return [out if x.rank == 4 else reshape_view(p, out, x.shape, node.outputs[0])]
