"""ONNX shape operators as views: Transpose, Reshape, Flatten, Unsqueeze, Squeeze, Slice, Split,
Expand, Tile and Pad become index expressions over their input (no statement, no copy); Concat is
one statement. On values known at import they fold with NumPy. (Gather and its kin, which index
by data, are in ``onnx_index``.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tcc.frontend.unparse import Ex, add_all, call, num, select
from tcc.interop.graph import NUMPY_DTYPES, Node, Program, Value, broadcast_read, broadcast_shape, view
from tcc.interop.onnx_ops import axes_of, const_of, is_float, norm_axis, zero


def transpose(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    perm = list(node.attrs.get("perm", range(x.rank - 1, -1, -1)))
    if sorted(perm) != list(range(x.rank)):
        raise node.error(f"perm {perm} is not a permutation of the {x.rank} axes")
    if x.const is not None:
        return [p.constant(np.transpose(x.const, perm), x.dtype, node.outputs[0])]
    inverse = [perm.index(d) for d in range(x.rank)]
    return [view(x, [x.shape[d] for d in perm], lambda idx: x.read([idx[inverse[d]] for d in range(x.rank)]))]


def reshape_view(p: Program, x: Value, shape: Sequence[int], hint: str) -> Value:
    """``x`` with a new shape of the same size: an index expression per dimension group."""
    shape = tuple(int(d) for d in shape)
    if x.const is not None or math.prod(shape) == 0:
        array = x.const if x.const is not None else np.zeros(x.shape, NUMPY_DTYPES[x.dtype])
        return p.constant(array.reshape(shape), x.dtype, hint)
    if shape == x.shape:
        return x
    groups = _reshape_groups(x.shape, shape)

    def read(idx: Sequence[Ex]) -> Ex:
        src: list[Ex] = []
        for ins, outs in groups:
            terms, stride = [], 1
            for d in reversed(outs):
                if shape[d] != 1 and idx[d].int_value != 0:
                    terms.append((idx[d], stride))
                stride *= shape[d]
            bounds = {math.prod(shape[e] for e in outs[n:]) for n in range(len(outs) + 1)}
            flat = add_all([i * s for i, s in terms[::-1]])
            stride, outer = math.prod(x.shape[d] for d in ins), 1
            for d in ins:
                stride //= x.shape[d]
                top = stride * x.shape[d] if outer > 1 else None
                if x.shape[d] == 1:
                    src.append(num(0))
                elif stride in bounds and (top is None or top in bounds):
                    src.append(_digits(terms, stride, top))
                else:
                    part = flat if stride == 1 else flat // stride
                    # the flat index runs past this dim only when a larger one sits outside it
                    src.append(part % x.shape[d] if top is not None else part)
                outer *= x.shape[d]
        return x.read(src)

    return view(x, shape, read)


def _digits(terms: list[tuple[Ex, int]], low: int, top: int | None) -> Ex:
    """``(sum(i * s) // low) % (top // low)`` (no ``%`` for ``top`` None) where ``low`` and ``top``
    are strides of the result's dims: each index ``i`` is below its dim's extent, so the terms of
    smaller strides add up to less than ``low`` and those of ``top`` and above to a multiple of it,
    and the digit is the middle terms alone. ``(h * 64 + s) % 64`` is ``s``: a GEMM's row index
    that moves with one loop, where the division hid it (Llama's grouped V projection was
    scheduled one row at a time, 5x slower)."""
    return add_all([i if s == low else i * (s // low) for i, s in reversed(terms)
                    if s >= low and (top is None or s < top)])


def _reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Runs of source and result dims with equal products (size-1 dims join a neighbour)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        ins, outs = [], []
        a = b = 1
        while True:
            if (a <= b or j >= len(dst)) and i < len(src):
                a *= src[i]
                ins.append(i)
                i += 1
            elif j < len(dst):
                b *= dst[j]
                outs.append(j)
                j += 1
            if a == b and (i >= len(src) or src[i] != 1 or not ins) and (j >= len(dst) or dst[j] != 1 or not outs) \
                    and ins and outs:
                break
            if i >= len(src) and j >= len(dst):
                break
        groups.append((ins, outs))
    return groups


def reshape(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if node.opset < 5:
        target = list(node.attrs["shape"])
    else:
        target = [int(d) for d in const_of(node, args[1], "shape").reshape(-1)]
    allowzero = node.attrs.get("allowzero", 0)
    shape = [x.shape[d] if n == 0 and not allowzero else n for d, n in enumerate(target)]
    if shape.count(-1) > 1:
        raise node.error(f"shape {target} has more than one -1")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape[shape.index(-1)] = x.size // known if known else 0
    if math.prod(shape) != x.size:
        raise node.error(f"cannot reshape {list(x.shape)} to {target}")
    return [reshape_view(p, x, shape, node.outputs[0])]


def flatten(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axis = node.attrs.get("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    return [reshape_view(p, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), node.outputs[0])]


def unsqueeze(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    rank = x.rank + len(node.attrs.get("axes", ())) if "axes" in node.attrs else \
        x.rank + const_of(node, args[1], "axes").size
    axes = axes_of(node, args, 1, rank) or []
    shape, it = [], iter(x.shape)
    for d in range(rank):
        shape.append(1 if d in axes else next(it))
    return [reshape_view(p, x, shape, node.outputs[0])]


def squeeze(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axes = axes_of(node, args, 1, x.rank)
    if axes is None:
        axes = [d for d, n in enumerate(x.shape) if n == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise node.error(f"cannot squeeze axes {axes} of shape {list(x.shape)}")
    return [reshape_view(p, x, [n for d, n in enumerate(x.shape) if d not in axes], node.outputs[0])]


def slice_(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    if node.opset < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts = const_of(node, args[1], "starts").reshape(-1).tolist()
        ends = const_of(node, args[2], "ends").reshape(-1).tolist()
        axes = const_of(node, args[3], "axes").reshape(-1).tolist() if len(args) > 3 and args[3] is not None else None
        steps = const_of(node, args[4], "steps").reshape(-1).tolist() if len(args) > 4 and args[4] is not None \
            else None
    axes = [norm_axis(node, int(a), x.rank) for a in (axes if axes is not None else range(len(starts)))]
    steps = steps or [1] * len(axes)
    first = [0] * x.rank
    step = [1] * x.rank
    shape = list(x.shape)
    for a, s, e, k in zip(axes, starts, ends, steps):
        n = x.shape[a]
        if k == 0:
            raise node.error("a slice step is 0")
        s, e = int(s), int(e)
        s, e = s + n if s < 0 else s, e + n if e < 0 else e
        if k > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
            shape[a] = max(0, -(-(e - s) // k))
        else:
            s, e = min(max(s, -1), n - 1), min(max(e, -1), n - 1)
            shape[a] = max(0, -(-(s - e) // -k))
        first[a], step[a] = s, k
    if x.const is not None:
        index = tuple(slice(first[d], first[d] + step[d] * shape[d] if first[d] + step[d] * shape[d] >= 0 else None,
                            step[d]) for d in range(x.rank))
        return [p.constant(x.const[index].reshape(shape), x.dtype, node.outputs[0])]

    def read(idx: Sequence[Ex]) -> Ex:
        return x.read([affine_index(first[d], step[d], idx[d]) if x.shape[d] != 1 else num(0) for d in range(x.rank)])

    return [view(x, shape, read)]


def affine_index(start: int, step: int, index: Ex) -> Ex:
    """``start + step * index``, the source position of a slice's ``index``."""
    return index * step + start if step > 0 else start - index * -step


def concat(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    parts = [a for a in args if a is not None]
    axis = norm_axis(node, node.attrs["axis"], parts[0].rank)
    if all(a.const is not None for a in parts):
        return [p.constant(np.concatenate([a.const for a in parts], axis=axis), parts[0].dtype, node.outputs[0])]
    total = sum(a.shape[axis] for a in parts)
    shape = list(parts[0].shape)
    shape[axis] = total
    live = [a for a in parts if a.shape[axis] > 0]
    if len(live) == 1:
        return [live[0]]
    padded, offsets, offset = [], [], 0
    for a in live:
        lo = [0] * a.rank
        hi = [0] * a.rank
        lo[axis], hi[axis] = offset, total - offset - a.shape[axis]
        padded.append(p.pad(a, lo, hi, node.outputs[0] + "_part"))
        offset += a.shape[axis]
        offsets.append(offset)

    def body(idx: list[Ex]) -> Ex:
        picked = padded[-1].read(idx)
        for a, end in zip(reversed(padded[:-1]), reversed(offsets[:-1])):
            picked = select(idx[axis].lt(end), a.read(idx), picked)
        return picked

    joined = p.emit(node.outputs[0], shape, parts[0].dtype, body)
    joined.input_name = next((a.input_name for a in parts if a.const is None and a.input_name), None)
    return [joined]


def split(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Split along an axis: each output a view (a slice) of the input."""
    x = args[0]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    n, count = x.shape[axis], len(node.outputs)
    if "split" in node.attrs:
        sizes = list(node.attrs["split"])
    elif len(args) > 1 and args[1] is not None:
        sizes = const_of(node, args[1], "split").reshape(-1).tolist()
    else:
        chunk = -(-n // node.attrs.get("num_outputs", count))
        sizes = [min(chunk, n - k * chunk) for k in range(count)]
    if sum(sizes) != n or len(sizes) != count:
        raise node.error(f"split sizes {sizes} do not cover axis {axis} of size {n} in {count} outputs")
    outputs, start = [], 0
    for size in sizes:
        shape = list(x.shape)
        shape[axis] = int(size)
        if x.const is not None:
            outputs.append(p.constant(np.take(x.const, range(start, start + size), axis=axis), x.dtype, "split"))
        else:
            outputs.append(view(x, shape, lambda idx, s=start: x.read(
                [affine_index(s, 1, i) if d == axis else i for d, i in enumerate(idx)])))
        start += int(size)
    return outputs


def expand(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Broadcast to a shape (NumPy's rules, either side may be 1): a view."""
    x = args[0]
    target = tuple(int(d) for d in const_of(node, args[1], "shape").reshape(-1))
    shape = broadcast_shape(node, x.shape, target)
    if x.const is not None:
        return [p.constant(np.broadcast_to(x.const, shape), x.dtype, node.outputs[0])]
    return [view(x, shape, lambda idx: broadcast_read(x, idx, shape))]


def tile(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    repeats = [int(r) for r in const_of(node, args[1], "repeats").reshape(-1)]
    if len(repeats) != x.rank or min(repeats, default=1) < 0:
        raise node.error(f"repeats {repeats} do not fit rank {x.rank}")
    if x.const is not None:
        return [p.constant(np.tile(x.const, repeats), x.dtype, node.outputs[0])]
    shape = [n * r for n, r in zip(x.shape, repeats)]
    return [view(x, shape, lambda idx: x.read([i % n if r > 1 else i for i, n, r in zip(idx, x.shape, repeats)]))]


def pad(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """constant, edge, reflect and wrap padding. Negative pads crop first, then the rest pads
    what is left (onnxruntime's reading: wrap repeats the cropped axis, edge repeats its ends)."""
    x = args[0]
    lo, hi = _pads(node, args, x.rank)
    mode = node.attrs.get("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise node.error(f"mode={mode!r} is not supported", hint="tcc pads in constant, edge, reflect and wrap modes")
    cut_lo, cut_hi = [max(-a, 0) for a in lo], [max(-b, 0) for b in hi]
    grow_lo, grow_hi = [max(a, 0) for a in lo], [max(b, 0) for b in hi]
    kept = [n - a - b for n, a, b in zip(x.shape, cut_lo, cut_hi)]
    if not all(_pad_fits(mode, m, a, b) for m, a, b in zip(kept, grow_lo, grow_hi)):
        raise node.error(f"pads {lo + hi} do not fit shape {list(x.shape)} in mode {mode!r}")
    cropped = x if not any(cut_lo + cut_hi) else view(
        x, kept, lambda idx: x.read([i + c if c else i for i, c in zip(idx, cut_lo)]))
    if not any(grow_lo + grow_hi):
        return [cropped]
    if mode == "constant":
        return [p.pad(cropped, grow_lo, grow_hi, node.outputs[0], _fill_literal(_pad_value(node, args), x.dtype))]
    shape = [m + a + b for m, a, b in zip(kept, grow_lo, grow_hi)]
    return [view(cropped, shape, lambda idx: cropped.read([_pad_source(mode, i - a, m) if a or b else i
                                                           for i, m, a, b in zip(idx, kept, grow_lo, grow_hi)]))]


def _pads(node: Node, args: list[Value | None], rank: int) -> tuple[list[int], list[int]]:
    """The pads before and after each axis (0 for an axis the ``axes`` input leaves out)."""
    pads = list(node.attrs["pads"]) if node.opset < 11 else \
        [int(v) for v in const_of(node, args[1], "pads").reshape(-1)]
    axes = list(range(rank))
    if len(args) > 3 and args[3] is not None:
        axes = [norm_axis(node, int(a), rank) for a in const_of(node, args[3], "axes").reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise node.error(f"pads {pads} do not fit {len(axes)} axes")
    lo, hi = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        lo[a], hi[a] = pads[k], pads[k + len(axes)]
    return lo, hi


def _pad_fits(mode: str, kept: int, before: int, after: int) -> bool:
    """Whether an axis cropped to ``kept`` elements can be padded so: edge, reflect and wrap
    need an element to repeat, and reflect one more than it pads (onnxruntime's limits)."""
    if kept < 0:
        return False
    if mode == "constant" or not before and not after:
        return True
    return kept > 0 and (mode != "reflect" or max(before, after) < kept)


def _pad_value(node: Node, args: list[Value | None]):
    """The constant mode's fill: an attribute before opset 11, an optional input from 11 on."""
    if node.opset < 11:
        return node.attrs.get("value", 0.0)
    if len(args) > 2 and args[2] is not None:
        return const_of(node, args[2], "constant_value").reshape(-1)[0]
    return 0


def _pad_source(mode: str, j: Ex, m: int) -> Ex:
    """The position in an axis of ``m`` that padding reads for the position ``j`` (from -pad to
    m - 1 + pad). Reflect's is clamped into the axis, where it already is: the bounds prover
    narrows an index by a select's condition only when that index is one variable plus a constant."""
    if mode == "edge":
        return call("min", call("max", j, 0), m - 1)
    if mode == "wrap":
        return j % m
    folded = select(j.lt(0), -j, select(j.gt(m - 1), 2 * (m - 1) - j, j))
    return call("min", call("max", folded, 0), m - 1)


def _fill_literal(value, dtype: str) -> Ex | None:
    value = float(value) if is_float(dtype) else int(value)
    if value == 0:
        return None
    return call(dtype, value) if not is_float(dtype) else num(value)


def range_(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """``start + i * delta``: an index expression, no stored array. Its scalar inputs decide
    its length, so they are needed at import (``constants=``, or the call's values through the
    backend); the values stay known too, for the shape arithmetic that reads them."""
    start, limit, delta = (const_of(node, a, what).reshape(-1)[0]
                           for a, what in zip(args, ("start", "limit", "delta")))
    if delta == 0:
        raise node.error("Range with delta 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    dtype = args[0].dtype
    values = (start + np.arange(count) * delta).astype(args[0].const.dtype)
    if count <= 1 or not is_float(dtype) and dtype != "i64":
        return [p.constant(values, dtype, node.outputs[0])]
    first, step = _fill_literal(start, dtype) or num(0), _fill_literal(delta, dtype)
    counter = (lambda i: call(dtype, i)) if is_float(dtype) else (lambda i: i)
    return [Value((count,), dtype, lambda idx: first + counter(idx[0]) * step, const=values)]


def trilu(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """The upper (or lower) triangle of the last two dims, from diagonal ``k``; 0 elsewhere."""
    x = args[0]
    k = int(const_of(node, args[1], "k").reshape(-1)[0]) if len(args) > 1 and args[1] is not None else 0
    upper = node.attrs.get("upper", 1)
    if x.rank < 2:
        raise node.error(f"Trilu needs rank 2 or more, got {x.rank}")
    if x.const is not None:
        return [p.constant(np.triu(x.const, k) if upper else np.tril(x.const, k), x.dtype, node.outputs[0])]

    def body(idx: list[Ex]) -> Ex:
        diagonal = idx[-1] - idx[-2]
        kept = diagonal.ge(k) if upper else diagonal.le(k)
        empty = num(1).eq(0) if x.dtype == "bool" else zero(x.dtype)
        return select(kept, x.read(idx), empty)

    return [p.emit(node.outputs[0], x.shape, x.dtype, body)]
