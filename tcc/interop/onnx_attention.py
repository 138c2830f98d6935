"""ONNX's transformer operators of opset 23: RMSNormalization, RotaryEmbedding and Attention.

Each is what a hand-written op would say: RMSNorm one reduction and one elementwise statement;
the rotation one statement whose two halves (or interleaved pairs) read each other under a
``select`` on the position, which the bounds proof narrows (``x[d + H]`` where ``d < H``).
Position ids index the cos/sin caches by data, checked at the call like Gather's indices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tcc.frontend.unparse import Ex, call, num, reduction, select, var
from tcc.interop.graph import Node, Program, Value, broadcast_read, float_literal, view
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
        return cache.read([position(p, node, ids, [b, s], cache.shape[0], negative=False), k])

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


# ---------------------------------------------------------------- Attention

NEG_INF = num(float("-inf"))


@dataclass
class _Heads:
    """One of Q, K, V read as [batch, heads, sequence, head size], whatever its layout (3-D
    ``[batch, sequence, heads * size]`` with the head counts as attributes, or 4-D)."""

    value: Value
    heads: int
    length: int
    size: int

    def read(self, b: Ex, h: Ex, i: Ex, d: Ex) -> Ex:
        if self.value.rank == 4:
            return self.value.read([b, h, i, d])
        return self.value.read([b, i, h * self.size + d])


def _heads(node: Node, x: Value, attr: str) -> _Heads:
    if x.rank == 4:
        return _Heads(x, x.shape[1], x.shape[2], x.shape[3])
    heads = node.attrs.get(attr, 0)
    if x.rank != 3 or not heads or x.shape[2] % heads:
        raise node.error(f"a {x.rank}-D input needs {attr} dividing its {x.shape[-1]} features")
    return _Heads(x, heads, x.shape[1], x.shape[2] // heads)


def _with_past(p: Program, node: Node, past: Value | None, now: _Heads, name: str) -> _Heads:
    """The keys (values) of the past then of this call: the present_key (present_value) output."""
    def read(idx: list[Ex]) -> Ex:
        b, h, j, d = idx
        if past is None:
            return now.read(b, h, j, d)
        start = past.shape[2]
        return select(j.lt(start), past.read([b, h, j, d]), now.read(b, h, j - start, d))

    length = now.length + (past.shape[2] if past is not None else 0)
    shape = (now.value.shape[0], now.heads, length, now.size)
    value = p.emit(name, shape, now.value.dtype, read) if past is not None else \
        now.value if now.value.rank == 4 else view(now.value, shape, read)  # no copy without a past
    return _Heads(value, now.heads, length, now.size)


def _bias(node: Node, args: list[Value | None], shape: tuple[int, int, int, int], past: int) -> \
        Callable[[list[Ex]], Ex] | None:
    """What the mask, causality, the sliding window and the unpadded lengths add to a score
    (0 or -inf, or the float mask's value), or None when nothing is added."""
    mask = args[3] if len(args) > 3 else None
    lengths = args[6] if len(args) > 6 else None
    causal = bool(node.attrs.get("is_causal", 0))
    left, right = node.attrs.get("left_window_size", -1), node.attrs.get("right_window_size", -1)
    if mask is None and lengths is None and not causal and left < 0 and right < 0:
        return None
    batch, heads, queries, keys = shape

    def bias(idx: list[Ex]) -> Ex:
        b, h, i, j = idx
        blocked: list[Ex] = []
        total: Ex = num(0.0)
        if mask is not None:
            width = mask.shape[-1]
            target = (batch, heads, queries, width)[4 - mask.rank:]
            read = broadcast_read(mask, [b, h, i, call("min", j, width - 1)][4 - mask.rank:], target)
            if mask.dtype == "bool":
                blocked.append(read.not_() if width >= keys else read.not_().or_(j.ge(width)))
            else:
                total = read if width >= keys else select(j.lt(width), read, NEG_INF)
        offset: Ex = num(past) if lengths is None else lengths.read([b]) - queries
        if causal:
            blocked.append(j.gt(i + offset))
        if left >= 0:
            blocked.append((i + offset - j).gt(left))
        if right >= 0:
            blocked.append((j - i - offset).gt(right))
        if lengths is not None:
            blocked.append(j.ge(lengths.read([b])))
        for condition in blocked:
            total = select(condition, NEG_INF, total)
        return total

    return bias


def attention(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """``softmax(Q K^T * scale + bias) V`` per head, keys and values shared by groups of query
    heads, in the form whose reductions the compiler streams (a running max and sum)."""
    q = _heads(node, args[0], "q_num_heads")
    k_now, v_now = _heads(node, args[1], "kv_num_heads"), _heads(node, args[2], "kv_num_heads")
    past_k, past_v = (args[4] if len(args) > 4 else None), (args[5] if len(args) > 5 else None)
    if not is_float(q.value.dtype) or q.heads % k_now.heads or k_now.size != q.size:
        raise node.error("Attention needs float Q, K, V with query heads a multiple of the key heads")
    name = node.outputs[0]
    keys = _with_past(p, node, past_k, k_now, name + "_present_key")
    values = _with_past(p, node, past_v, v_now, name + "_present_value")
    group = q.heads // keys.heads
    batch = q.value.shape[0]
    shape = (batch, q.heads, q.length, keys.length)
    scale = node.attrs.get("scale", 1.0 / math.sqrt(q.size))
    softcap = node.attrs.get("softcap", 0.0)
    wide = "f64" if q.value.dtype == "f64" else "f32"
    bias = _bias(node, args, shape, past_k.shape[2] if past_k is not None else 0)

    def widen(e: Ex) -> Ex:
        return e if q.value.dtype == wide else call(wide, e)

    def scores(idx: list[Ex]) -> Ex:
        b, h, i, j = idx
        s = reduction("sum", [("k0", q.size)], widen(q.read(b, h, i, var("k0"))) * widen(
            keys.read(b, h // group, j, var("k0")))) * float_literal(scale)
        return float_literal(softcap) * call("tanh", s / float_literal(softcap)) if softcap > 0 else s

    s = p.emit(name + "_scores", shape, wide, scores if bias is None else lambda idx: scores(idx) + bias(idx))
    rows = shape[:3]
    m = p.emit(name + "_max", rows, wide,
               lambda idx: reduction("max", [("k0", keys.length)], s.read([*idx, var("k0")])))
    # a mask, unpadded lengths or a window may mask a whole row (whose result is 0); without them
    # (causality keeps key 0) the chain is the plain one the compiler streams (a running max and sum)
    guarded = any(a is not None for a in args[3:4] + args[6:7]) or \
        node.attrs.get("left_window_size", -1) >= 0 or node.attrs.get("right_window_size", -1) >= 0
    e = p.emit(name + "_exp", shape, wide, lambda idx: call("exp", s.read(idx) - (select(
        m.read(idx[:3]).eq(NEG_INF), num(0.0), m.read(idx[:3])) if guarded else m.read(idx[:3]))))
    total = p.emit(name + "_sum", rows, wide,
                   lambda idx: reduction("sum", [("k0", keys.length)], e.read([*idx, var("k0")])))
    masked = None if not guarded else p.emit(name + "_masked", rows, "bool", lambda idx: reduction(
        "max", [("k0", keys.length)], bias([*idx, var("k0")])).eq(NEG_INF))

    def probability(idx: list[Ex]) -> Ex:
        if not guarded:
            return e.read(idx) / total.read(idx[:3])
        value = e.read(idx) / select(total.read(idx[:3]).eq(0.0), num(1.0), total.read(idx[:3]))
        return select(masked.read(idx[:3]), num(0.0), value)

    out_shape = (batch, q.heads, q.length, values.size)

    def output(idx: list[Ex]) -> Ex:
        b, h, i, d = idx
        if guarded:
            y = reduction("sum", [("k0", keys.length)], probability([b, h, i, var("k0")]) * widen(
                values.read(b, h // group, var("k0"), d)))
        else:
            y = reduction("sum", [("k0", keys.length)], e.read([b, h, i, var("k0")]) * widen(
                values.read(b, h // group, var("k0"), d))) / total.read([b, h, i])
        return y if q.value.dtype == wide else call(q.value.dtype, y)

    per_head = p.emit(name + "_heads", out_shape, q.value.dtype, output)
    y = per_head if q.value.rank == 4 else view(per_head, (batch, q.length, q.heads * values.size), lambda idx: (
        per_head.read([idx[0], idx[2] // values.size, idx[1], idx[2] % values.size])))
    results = [y, keys.value, values.value]
    if len(node.outputs) > 3 and node.outputs[3]:
        mode = node.attrs.get("qk_matmul_output_mode", 0)
        chosen = {0: scores, 1: scores, 2: s.read, 3: probability}[mode]
        results.append(p.emit(node.outputs[3], shape, q.value.dtype,
                              lambda idx: chosen(idx) if q.value.dtype == wide else call(q.value.dtype, chosen(idx))))
    return results
