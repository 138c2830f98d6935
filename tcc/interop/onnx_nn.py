"""ONNX neural-network operators as tcc statements: matrix products, convolutions, pooling and
normalisation.

Convolutions are written the way a user writes them in tcc (a ``pad`` view and a ``sum`` over
the window), so fusion, im2col and the GEMM scheduler treat them exactly as they treat
``examples/conv2d.tc``; a following bias, BatchNormalization (folded at import) and Relu inline
into the convolution's statement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tcc.frontend.unparse import Ex, all_of, call, num, reduction, select, var
from tcc.interop import onnx_winograd
from tcc.interop.graph import Node, Program, Value, broadcast_read, broadcast_shape, float_literal
from tcc.interop.onnx_ops import cast_to, is_float, reduce_over, zero
from tcc.interop.onnx_shapes import reshape_view

# ---------------------------------------------------------------- matrix products


def _sum_cast(total: Ex, dtype: str) -> Ex:
    """A sum of ``dtype`` values; tcc sums small ints (and rounds f16 once) into the wider type."""
    return total if dtype in ("f32", "f64", "i64") else cast_to(total, dtype)


def gemm_operand(p: Program, v: Value, hint: str) -> Value:
    """``v`` as a GEMM operand: a view whose reads divide or wrap indices (a reshape that merges
    dims) is copied first, so that the product reads affine indices the GEMM scheduler tiles.
    (Fusion may still inline the producer of the view into the copy.)"""
    probe = str(v.read([var(f"i{d}") for d in range(v.rank)]))
    if v.tensor is None and v.const is None and ("//" in probe or "%" in probe):
        return p.tensor_value(p.materialize(v, hint), v.shape, v.dtype)
    return v


def matmul(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    a = gemm_operand(p, args[0], node.outputs[0] + "_lhs")
    b = gemm_operand(p, args[1], node.outputs[0] + "_rhs")
    a_shape = (1, *a.shape) if a.rank == 1 else a.shape
    b_shape = (*b.shape, 1) if b.rank == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise node.error(f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    batch = broadcast_shape(node, a_shape[:-2], b_shape[:-2])
    shape = (*batch, a_shape[-2], b_shape[-1])
    k = a_shape[-1]

    def read(v: Value, vshape: tuple[int, ...], idx: Sequence[Ex], row: Ex, col: Ex, lhs: bool) -> Ex:
        if v.rank == 1:  # a vector on the left is a row (read along its columns), on the right a column
            return v.read([col if lhs else row])
        nb = len(vshape) - 2
        batch_idx = [idx[len(batch) - nb + d] if vshape[d] == batch[len(batch) - nb + d] else num(0)
                     for d in range(nb)]
        return v.read([*batch_idx, row, col])

    def body(idx: list[Ex]) -> Ex:
        i, j, k0 = idx[-2], idx[-1], var("k0")
        product = read(a, a_shape, idx, i, k0, lhs=True) * read(b, b_shape, idx, k0, j, lhs=False)
        return _sum_cast(reduction("sum", [("k0", k)], product), a.dtype)

    out_shape = shape[:-2] + (() if a.rank == 1 else (shape[-2],)) + (() if b.rank == 1 else (shape[-1],))
    if out_shape == shape:
        return [p.emit(node.outputs[0], shape, a.dtype, body)]
    full = p.emit(node.outputs[0] + "_mm", shape, a.dtype, body)
    return [reshape_view(p, full, out_shape, node.outputs[0])]


def gemm(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    a = gemm_operand(p, args[0], node.outputs[0] + "_lhs")
    b = gemm_operand(p, args[1], node.outputs[0] + "_rhs")
    c = args[2] if len(args) > 2 else None
    ta, tb = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if k != k2:
        raise node.error(f"inner dimensions differ: {list(a.shape)} and {list(b.shape)} (transA={ta}, transB={tb})")

    def body(idx: list[Ex]) -> Ex:
        i, j, k0 = idx[0], idx[1], var("k0")
        lhs = a.read([k0, i] if ta else [i, k0])
        rhs = b.read([j, k0] if tb else [k0, j])
        total = _sum_cast(reduction("sum", [("k0", k)], lhs * rhs), a.dtype)
        if alpha != 1.0:
            total = total * float_literal(alpha)
        if c is not None and beta != 0.0:
            bias = broadcast_read(c, idx, (m, n))
            total = total + (bias if beta == 1.0 else bias * float_literal(beta))
        return total

    return [p.emit(node.outputs[0], (m, n), a.dtype, body)]


# ---------------------------------------------------------------- windows


def _window(node: Node, spatial: Sequence[int], kernel: Sequence[int], ceil_mode: bool = False
            ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Strides, dilations, low and high pads and output sizes of a window op (auto_pad too)."""
    nd = len(spatial)
    strides = list(node.attrs.get("strides", [1] * nd))
    dilations = list(node.attrs.get("dilations", [1] * nd))
    pads = list(node.attrs.get("pads", [0] * 2 * nd))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    lo, hi = pads[:nd], pads[nd:]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for d in range(nd):
            out = -(-spatial[d] // strides[d])
            total = max(0, (out - 1) * strides[d] + extent[d] - spatial[d])
            small, large = total // 2, total - total // 2
            lo[d], hi[d] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    elif auto_pad == "VALID":
        lo, hi = [0] * nd, [0] * nd
    elif auto_pad != "NOTSET":
        raise node.error(f"auto_pad={auto_pad!r} is not supported")
    outs = []
    for d in range(nd):
        span = spatial[d] + lo[d] + hi[d] - extent[d]
        if ceil_mode:
            out = -(-span // strides[d]) + 1
            if (out - 1) * strides[d] >= spatial[d] + lo[d]:
                out -= 1
        else:
            out = span // strides[d] + 1
        outs.append(max(out, 0))
    return strides, dilations, lo, hi, outs


def _tap(out: Ex, r: Ex, stride: int, dilation: int) -> Ex:
    """The input position of window tap ``r`` of output position ``out``."""
    return out * stride + r * dilation


def _extents(names: Sequence[str], sizes: Sequence[int]) -> list[tuple[str, int]]:
    return list(zip(names, sizes))


def _padded(p: Program, x: Value, lo: Sequence[int], hi: Sequence[int], hint: str, fill: Ex | None = None) -> Value:
    if not any(lo) and not any(hi):
        return x
    return p.pad(x, [0, 0, *lo], [0, 0, *hi], hint, fill)


def conv(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    group = node.attrs.get("group", 1)
    nd = x.rank - 2
    kernel = list(w.shape[2:])
    if node.attrs.get("kernel_shape", kernel) != kernel:
        raise node.error(f"kernel_shape {node.attrs['kernel_shape']} differs from the weights' {kernel}")
    channels, filters = x.shape[1], w.shape[0]
    if channels != w.shape[1] * group or filters % group:
        raise node.error(f"{channels} input channels, weights {list(w.shape)} and group={group} do not fit")
    strides, dilations, lo, hi, outs = _window(node, x.shape[2:], kernel)
    if p.winograd and onnx_winograd.applies(node, x, w, bias, strides, dilations, lo, hi):
        return [onnx_winograd.conv(p, node, x, w, bias)]
    xp = _padded(p, x, lo, hi, node.outputs[0] + "_in")
    cg, fg = w.shape[1], filters // group
    rs = [f"r{d}" for d in range(nd)]

    def body(idx: list[Ex]) -> Ex:
        n, f, ys, c = idx[0], idx[1], idx[2:], var("c")
        channel = c if group == 1 else f // fg * cg + c if cg > 1 else f // fg
        taps = [_tap(y, var(r), s, dl) for y, r, s, dl in zip(ys, rs, strides, dilations)]
        product = xp.read([n, channel, *taps]) * w.read([f, c, *map(var, rs)])
        total = _sum_cast(reduction("sum", [("c", cg), *_extents(rs, kernel)], product), x.dtype)
        return total + bias.read([f]) if bias is not None else total

    return [p.emit(node.outputs[0], (x.shape[0], filters, *outs), x.dtype, body)]


def conv_transpose(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    group = node.attrs.get("group", 1)
    nd = x.rank - 2
    kernel = list(w.shape[2:])
    spatial = x.shape[2:]
    strides = list(node.attrs.get("strides", [1] * nd))
    dilations = list(node.attrs.get("dilations", [1] * nd))
    out_pad = list(node.attrs.get("output_padding", [0] * nd))
    pads = list(node.attrs.get("pads", [0] * 2 * nd))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    full = [strides[d] * (spatial[d] - 1) + out_pad[d] + (kernel[d] - 1) * dilations[d] + 1 for d in range(nd)]
    if "output_shape" in node.attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        shape = list(node.attrs.get("output_shape", [spatial[d] * strides[d] for d in range(nd)]))[-nd:]
        total = [full[d] - shape[d] for d in range(nd)]
        upper = auto_pad == "SAME_UPPER"
        lo = [t // 2 if upper else t - t // 2 for t in total]
        outs = shape
    elif auto_pad in ("NOTSET", "VALID"):
        lo = pads[:nd] if auto_pad == "NOTSET" else [0] * nd
        hi = pads[nd:] if auto_pad == "NOTSET" else [0] * nd
        outs = [full[d] - lo[d] - hi[d] for d in range(nd)]
    else:
        raise node.error(f"auto_pad={auto_pad!r} is not supported")
    channels = x.shape[1]
    cg, fg = channels // group, w.shape[1]
    # Output position y reads input (y + lo - r*D) / S where that is a whole number in range;
    # the input is padded so that every such read is in bounds (the pad reads 0).
    qmin = [(lo[d] - (kernel[d] - 1) * dilations[d]) // strides[d] for d in range(nd)]
    qmax = [(outs[d] - 1 + lo[d]) // strides[d] for d in range(nd)]
    pad_lo = [max(0, -q) for q in qmin]
    pad_hi = [max(0, q - (spatial[d] - 1)) for d, q in enumerate(qmax)]
    xp = _padded(p, x, pad_lo, pad_hi, node.outputs[0] + "_in")
    rs = [f"r{d}" for d in range(nd)]

    def body(idx: list[Ex]) -> Ex:
        n, f, ys, c = idx[0], idx[1], idx[2:], var("c")
        channel = c if group == 1 else f // fg * cg + c
        reads, conds = [], []
        for d, (y, r) in enumerate(zip(ys, rs)):
            pos = y + lo[d] - var(r) * dilations[d]
            if strides[d] == 1:
                reads.append(pos + pad_lo[d])
            else:
                reads.append(pos // strides[d] + pad_lo[d])
                conds.append((pos % strides[d]).eq(0))
        wf = f if group == 1 else f % fg
        term = xp.read([n, channel, *reads]) * w.read([channel, wf, *map(var, rs)])
        if conds:
            term = select(all_of(conds), term, zero(x.dtype))
        total = _sum_cast(reduction("sum", [("c", cg), *_extents(rs, kernel)], term), x.dtype)
        return total + bias.read([f]) if bias is not None else total

    return [p.emit(node.outputs[0], (x.shape[0], fg * group, *outs), x.dtype, body)]


def _reach(hi: list[int], outs: list[int], strides: list[int], kernel: list[int], dilations: list[int],
           spatial: Sequence[int], lo: list[int]) -> list[int]:
    """High pads that keep every window in bounds (ceil_mode windows may overhang the pads)."""
    return [max(h, (o - 1) * s + (k - 1) * d + 1 - n - low)
            for h, o, s, k, d, n, low in zip(hi, outs, strides, kernel, dilations, spatial, lo)]


def max_pool(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    kernel = list(node.attrs["kernel_shape"])
    strides, dilations, lo, hi, outs = _window(node, x.shape[2:], kernel, bool(node.attrs.get("ceil_mode", 0)))
    hi = _reach(hi, outs, strides, kernel, dilations, x.shape[2:], lo)
    low = num(float("-inf")) if is_float(x.dtype) else num(int(np.iinfo(x.dtype.replace("i", "int")).min))
    xp = _padded(p, x, lo, hi, node.outputs[0] + "_in", low)
    rs = [f"r{d}" for d in range(len(kernel))]
    with_indices = len(node.outputs) > 1 and bool(node.outputs[1])
    if not with_indices and separable(kernel, dilations):
        return [_separable_max(p, node.outputs[0], xp, kernel, strides, outs)]

    def body(idx: list[Ex]) -> Ex:
        taps = [_tap(y, var(r), s, dl) for y, r, s, dl in zip(idx[2:], rs, strides, dilations)]
        return reduction("max", _extents(rs, kernel), xp.read([idx[0], idx[1], *taps]))

    y = p.emit(node.outputs[0], (*x.shape[:2], *outs), x.dtype, body)
    if not with_indices:
        return [y]
    column_major = bool(node.attrs.get("storage_order", 0))

    def argmax(idx: list[Ex]) -> Ex:
        """The flat index of the first input element equal to the window's maximum."""
        taps = [_tap(o, var(r), s, dl) for o, r, s, dl in zip(idx[2:], rs, strides, dilations)]
        spatial = x.shape[2:]
        pos = [t - before for t, before in zip(taps, lo)]
        order = list(range(len(pos)))[::-1] if column_major else list(range(len(pos)))
        flat = call("i64", idx[0]) * x.shape[1] + idx[1]
        for d in order:
            flat = flat * spatial[d] + pos[d]
        hit = xp.read([idx[0], idx[1], *taps]).eq(y.read(idx))
        return reduction("min", _extents(rs, kernel), select(hit, flat, call("i64", 2**62)))

    return [y, p.emit(node.outputs[1], y.shape, "i64", argmax)]


def separable(kernel: Sequence[int], dilations: Sequence[int]) -> bool:
    """Whether a max pool is taken as a max along each row, then down each column: 2-D windows of
    at least 2 x 2 taps, undilated."""
    return len(kernel) == 2 and min(kernel) > 1 and all(d == 1 for d in dilations)


def _separable_max(p: Program, name: str, xp: Value, kernel: Sequence[int], strides: Sequence[int],
                   outs: Sequence[int]) -> Value:
    """A 2-D max pool as two statements: the max of each row's ``kw`` taps for every padded input
    row, then of ``kh`` of those rows. A 3x3/2 window then costs 3 strided taps per input row and
    3 unit-stride ones per output row, not 9 strided taps per output (ResNet's stem pool: each
    strided tap is a wide masked load and a shuffle). Max is exact, so the result is the same.
    Fusion keeps the row maxima apart (a reduction read inside a reduction)."""
    n, c, rows = xp.shape[0], xp.shape[1], xp.shape[2]
    across = p.emit(name + "_rows", (n, c, rows, outs[1]), xp.dtype, lambda idx: reduction(
        "max", [("r1", kernel[1])], xp.read([idx[0], idx[1], idx[2], _tap(idx[3], var("r1"), strides[1], 1)])))
    return p.emit(name, (n, c, *outs), xp.dtype, lambda idx: reduction(
        "max", [("r0", kernel[0])], across.read([idx[0], idx[1], _tap(idx[2], var("r0"), strides[0], 1), idx[3]])))


def average_pool(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    kernel = list(node.attrs["kernel_shape"])
    spatial = x.shape[2:]
    strides, dilations, lo, hi, outs = _window(node, spatial, kernel, bool(node.attrs.get("ceil_mode", 0)))
    ext_hi = _reach(hi, outs, strides, kernel, dilations, spatial, lo)
    xp = _padded(p, x, lo, ext_hi, node.outputs[0] + "_in")
    include_pad = bool(node.attrs.get("count_include_pad", 0))
    divisors = []
    for d in range(len(kernel)):  # how many taps of each window count, per dimension
        first, last = (-lo[d], spatial[d] + hi[d]) if include_pad else (0, spatial[d])
        taps = np.arange(outs[d])[:, None] * strides[d] + np.arange(kernel[d])[None, :] * dilations[d] - lo[d]
        counts = ((taps >= first) & (taps < last)).sum(axis=1)
        divisors.append(p.constant(counts.astype(np.float64), x.dtype, node.outputs[0] + f"_count{d}"))
    rs = [f"r{d}" for d in range(len(kernel))]

    def body(idx: list[Ex]) -> Ex:
        taps = [_tap(y, var(r), s, dl) for y, r, s, dl in zip(idx[2:], rs, strides, dilations)]
        total = _sum_cast(reduction("sum", _extents(rs, kernel), xp.read([idx[0], idx[1], *taps])), x.dtype)
        count = divisors[0].read([idx[2]])
        for v, y in zip(divisors[1:], idx[3:]):
            count = count * v.read([y])
        return total / count

    return [p.emit(node.outputs[0], (*x.shape[:2], *outs), x.dtype, body)]


def global_average_pool(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    axes = list(range(2, x.rank))
    count = math.prod(x.shape[2:])
    shape = (*x.shape[:2], *([1] * len(axes)))
    return [p.emit(node.outputs[0], shape, x.dtype,
                   lambda idx: _sum_cast(reduce_over("sum", x, axes, idx, x.read), x.dtype) / count)]


# ---------------------------------------------------------------- normalisation


def batch_norm(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, scale, bias, mean, variance = args[:5]
    if node.attrs.get("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        raise node.error("training mode is not supported", hint="export the model in inference mode")
    eps = node.attrs.get("epsilon", 1e-5)

    def channel(v: Value, idx: Sequence[Ex]) -> Ex:
        return v.read([idx[1]]) if x.rank > 1 else v.read([num(0)])

    if all(v.const is not None for v in (scale, bias, mean, variance)):
        s = scale.const.astype(np.float64) / np.sqrt(variance.const.astype(np.float64) + eps)
        t = bias.const.astype(np.float64) - mean.const.astype(np.float64) * s
        sv = p.constant(s, x.dtype, node.outputs[0] + "_scale")
        tv = p.constant(t, x.dtype, node.outputs[0] + "_shift")
        p.notes.append(f"{node.where()}: scale and shift precomputed from constant statistics")
        return [p.emit(node.outputs[0], x.shape, x.dtype,
                       lambda idx: x.read(idx) * channel(sv, idx) + channel(tv, idx))]

    def body(idx: list[Ex]) -> Ex:
        deviation = (x.read(idx) - channel(mean, idx)) / call("sqrt", channel(variance, idx) + float_literal(eps))
        return deviation * channel(scale, idx) + channel(bias, idx)

    return [p.emit(node.outputs[0], x.shape, x.dtype, body)]


def layer_norm(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    axis = node.attrs.get("axis", -1)
    axis = axis + x.rank if axis < 0 else axis
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    stash = {1: "f32", 11: "f64"}.get(node.attrs.get("stash_type", 1), "f32")
    axes = list(range(axis, x.rank))
    count = math.prod(x.shape[axis:])
    kept = tuple(n if d < axis else 1 for d, n in enumerate(x.shape))
    name = node.outputs[0] or "layernorm"

    def xs(idx: Sequence[Ex]) -> Ex:
        return x.read(idx) if x.dtype == stash else call(stash, x.read(idx))

    mu = p.emit(name + "_mean", kept, stash, lambda idx: reduce_over("sum", x, axes, idx, xs) / count)
    variance = p.emit(name + "_var", kept, stash, lambda idx: reduce_over(
        "sum", x, axes, idx, lambda full: (xs(full) - mu.read(idx)) ** 2) / count)
    inv = p.emit(name + "_inv", kept, stash, lambda idx: 1.0 / call("sqrt", variance.read(idx) + eps))
    tail = x.shape[axis:]

    def affine(v: Value, idx: Sequence[Ex]) -> Ex:
        return broadcast_read(v, idx[axis:], tail) if v.rank <= len(tail) else broadcast_read(v, idx, x.shape)

    def body(idx: list[Ex]) -> Ex:
        kept_idx = [i if d < axis else num(0) for d, i in enumerate(idx)]
        norm = (xs(idx) - mu.read(kept_idx)) * inv.read(kept_idx)
        norm = norm if x.dtype == stash else call(x.dtype, norm)
        scaled = norm * affine(scale, idx)
        return scaled + affine(bias, idx) if bias is not None else scaled

    outputs = [p.emit(name, x.shape, x.dtype, body)]
    if len(node.outputs) > 1 and node.outputs[1]:
        outputs.append(mu)
    if len(node.outputs) > 2 and node.outputs[2]:
        outputs.append(inv)
    return outputs


def instance_norm(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    """Each image's channel normalised over its spatial positions, then scaled and shifted."""
    x, scale, bias = args[0], args[1], args[2]
    if x.rank < 3 or not is_float(x.dtype):
        raise node.error(f"InstanceNormalization takes float inputs [N, C, ...], got {x.dtype}{list(x.shape)}")
    axes = list(range(2, x.rank))
    count = math.prod(x.shape[2:])
    kept = (*x.shape[:2], *[1] * len(axes))
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    name = node.outputs[0]

    def wide(idx: Sequence[Ex]) -> Ex:
        return x.read(idx) if x.dtype in ("f32", "f64") else call("f32", x.read(idx))

    stash = x.dtype if x.dtype in ("f32", "f64") else "f32"
    mu = p.emit(name + "_mean", kept, stash, lambda idx: reduce_over("sum", x, axes, idx, wide) / count)
    variance = p.emit(name + "_var", kept, stash, lambda idx: reduce_over(
        "sum", x, axes, idx, lambda full: (wide(full) - mu.read(idx)) ** 2) / count)

    def body(idx: list[Ex]) -> Ex:
        stats = [*idx[:2], *[num(0)] * len(axes)]
        norm = (wide(idx) - mu.read(stats)) / call("sqrt", variance.read(stats) + eps)
        y = norm * scale.read([idx[1]]) + bias.read([idx[1]])
        return y if x.dtype == stash else call(x.dtype, y)

    return [p.emit(name, x.shape, x.dtype, body)]
