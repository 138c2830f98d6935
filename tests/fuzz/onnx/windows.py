"""Generators of the window operators: Conv, ConvTranspose, MaxPool (with its Indices output),
AveragePool and GlobalAveragePool, with strides, dilations, pads, auto_pad and ceil_mode.

Their input is an image ``[N, C, *spatial]``: a value of rank 3 to 5 when there is one, else
any value reshaped or unsqueezed into one, so that windows read views (the composition where
the importer's index expressions go wrong).
"""

from __future__ import annotations

import math

from fuzz.onnx.graph import Graph, Val, factor

IMAGE_DTYPES = ("f32", "f32", "f16")


def image(g: Graph, ranks: tuple[int, ...] = (3, 4, 5)) -> Val | None:
    """A float value of one of ``ranks``, made into one by a Reshape or Unsqueeze if needed."""
    x = g.pick(lambda v: v.dtype in IMAGE_DTYPES and v.rank in ranks and max(v.shape[2:], default=1) <= 16)
    if x is not None and g.rng.random() < 0.7:
        return x
    x = g.pick(lambda v: v.dtype in IMAGE_DTYPES and 0 < v.size <= 4096)
    if x is None:
        return None
    rank = g.rng.choice([r for r in ranks if r <= 4] or list(ranks))
    if g.rng.random() < 0.3 and 0 < rank - x.rank <= 2:
        axes = sorted(g.rng.sample(range(rank), rank - x.rank))
        shape, rest = [], iter(x.shape)
        for i in range(rank):
            shape.append(1 if i in axes else next(rest))
        args = [x, g.ints(axes)] if g.opset >= 13 else [x]
        return g.node("Unsqueeze", args, [(x.dtype, shape)], **({} if g.opset >= 13 else {"axes": axes}))[0]
    dims = [1] + factor(g.rng, x.size, rank - 1)
    return g.node("Reshape", [x, g.ints(dims)], [(x.dtype, dims)])[0]


def _window_attrs(g: Graph, spatial: tuple[int, ...], pool: bool) -> tuple[dict, list[int]] | None:
    """Random kernel, strides, dilations and pads that fit ``spatial``; the output's dims."""
    nd = len(spatial)
    kernel = [g.rng.randint(1, min(4, n + 1)) for n in spatial]
    strides = [g.rng.choice((1, 1, 2, 3)) for _ in spatial]
    dil = [g.rng.choice((1, 1, 2)) for _ in spatial]
    attrs = {"kernel_shape": kernel}
    if any(s != 1 for s in strides) or g.rng.random() < 0.3:
        attrs["strides"] = strides
    if any(d != 1 for d in dil) and (not pool or g.opset >= 19 or g.rng.random() < 0.5):
        attrs["dilations"] = dil
    else:
        dil = [1] * nd
    # a dilated pool window may hold only padding: no value to take (-inf or the lowest float)
    ceil = pool and dil == [1] * nd and g.rng.random() < 0.3
    if ceil:
        attrs["ceil_mode"] = 1
    if g.rng.random() < 0.2:
        attrs["auto_pad"] = g.rng.choice(("SAME_UPPER", "SAME_LOWER", "VALID"))
        outs = [-(-n // s) if attrs["auto_pad"] != "VALID" else (n - (k - 1) * d - 1) // s + 1
                for n, k, s, d in zip(spatial, kernel, strides, dil)]
        if attrs["auto_pad"] != "VALID" and (ceil or any(d != 1 for d in dil)):
            return None  # onnxruntime and the ONNX shape rules disagree on these
        return (attrs, outs) if min(outs) > 0 else None
    limit = [(k - 1 if d == 1 else 0) if pool else 2 for k, d in zip(kernel, dil)]  # pad < kernel
    pads = [g.rng.randint(0, lim) for lim in limit * 2]
    if any(pads) or g.rng.random() < 0.3:
        attrs["pads"] = pads
    outs = []
    for i, (n, k, s, d) in enumerate(zip(spatial, kernel, strides, dil)):
        span = n + pads[i] + pads[i + nd] - (k - 1) * d - 1
        out = (math.ceil(span / s) if ceil else span // s) + 1
        if ceil and (out - 1) * s >= n + pads[i]:
            out -= 1
        outs.append(out)
    return (attrs, outs) if min(outs) > 0 and min(o - 1 for o in outs) >= 0 else None


def conv(g: Graph) -> bool:
    x = image(g)
    if x is None:
        return False
    window = _window_attrs(g, x.shape[2:], pool=False)
    if window is None:
        return False
    attrs, outs = window
    c = x.shape[1]
    group = g.rng.choice([d for d in (1, c) if c % d == 0]) if g.rng.random() < 0.3 else 1
    m = group * g.rng.choice((1, 2, 3))
    w_shape = (m, c // group, *attrs["kernel_shape"])
    w = g.const(g.random_array(x.dtype, w_shape), x.dtype, node=False) if g.rng.random() < 0.8 else g.input(
        x.dtype, w_shape)
    args = [x, w] + ([g.const(g.random_array(x.dtype, (m,)), x.dtype)] if g.rng.random() < 0.5 else [])
    if group > 1:
        attrs["group"] = group
    g.node("Conv", args, [(x.dtype, (x.shape[0], m, *outs))], **attrs)
    return True


def conv_transpose(g: Graph) -> bool:
    x = image(g, (3, 4))
    if x is None:
        return False
    spatial = x.shape[2:]
    kernel = [g.rng.randint(1, 3) for _ in spatial]
    strides = [g.rng.choice((1, 2)) for _ in spatial]
    pads = [g.rng.randint(0, k - 1) for k in kernel] * 2
    out_pad = [g.rng.randint(0, s - 1) for s in strides]
    c, m = x.shape[1], g.rng.choice((1, 2, 3))
    w = g.const(g.random_array(x.dtype, (c, m, *kernel)), x.dtype, node=False)
    outs = [s * (n - 1) + op + k - 2 * p for n, s, op, k, p in zip(spatial, strides, out_pad, kernel, pads)]
    if min(outs) < 1:
        return False
    g.node("ConvTranspose", [x, w], [(x.dtype, (x.shape[0], m, *outs))], kernel_shape=kernel, strides=strides,
           pads=pads, output_padding=out_pad)
    return True


def pool(g: Graph) -> bool:
    x = image(g)
    if x is None:
        return False
    if g.rng.random() < 0.15:
        g.node("GlobalAveragePool", [x], [(x.dtype, x.shape[:2] + (1,) * (x.rank - 2))])
        return True
    window = _window_attrs(g, x.shape[2:], pool=True)
    if window is None:
        return False
    attrs, outs = window
    shape = x.shape[:2] + tuple(outs)
    if g.rng.random() < 0.5:
        outputs = [(x.dtype, shape)]
        if x in g.inputs and g.rng.random() < 0.3:  # indices: only where no two taps can tie (no Relu zeros)
            outputs.append(("i64", shape))
            attrs["storage_order"] = g.rng.choice((0, 1)) if x.rank == 4 else 0
        g.node("MaxPool", [x], outputs, **attrs)
    else:
        if "dilations" in attrs and g.opset < 19:
            return False
        attrs["count_include_pad"] = g.rng.choice((0, 1))
        g.node("AveragePool", [x], [(x.dtype, shape)], **attrs)
    return True
