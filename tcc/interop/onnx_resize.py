"""ONNX Resize (nearest, linear and cubic; every coordinate mode, antialias, axes and aspect
policies) as one statement of taps.

Resizing is separable, and the shapes are static: for each resized axis the output position
``o`` reads a few input positions ``I[o, t]`` with weights ``C[o, t]``, both known at import
(computed here as ONNX's reference computes them). The statement sums, over the taps of every
resized axis, the product of the weights times the input read at the taps' positions: one read
for nearest, 2 per axis for linear, 4 for cubic (more with antialias). The tap tables are small
constants; their positions are clamped into the axis, so no check runs at the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tcc.frontend.unparse import Ex, call, num, reduction, select, var
from tcc.interop.graph import Node, Program, Value, float_literal
from tcc.interop.onnx_ops import const_of, is_float

Coefficients = Callable[[float, float], np.ndarray]


def _nearest(mode: str) -> Coefficients:
    def coefficients(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}[mode]
        return np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])

    return coefficients


def _linear(antialias: bool) -> Coefficients:
    def coefficients(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        taps = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * scale), 0, 1)
        return taps / taps.sum()

    return coefficients


def _cubic(a: float, antialias: bool) -> Coefficients:
    def kernel(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0

    def coefficients(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])
        scale = min(scale, 1.0)
        start = int(np.floor(-2 / scale) + 1)
        taps = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
        return taps / taps.sum()

    return coefficients


def _source(mode: str, y: np.ndarray, scale: float, n: int, out: int, roi: tuple[float, float]) -> np.ndarray:
    """Where each output position ``y`` of an axis of ``n`` resized to ``out`` reads from."""
    width = scale * n
    if mode == "align_corners":
        return np.zeros(out) if width == 1 else y * (n - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        x = np.full(out, (end - start) * (n - 1) / 2) if width == 1 else y * (end - start) * (n - 1) / (width - 1)
        return x + start * (n - 1)
    if mode == "pytorch_half_pixel":  # the spec's 0 for a length of 1 (ONNX's reference says -0.5)
        return np.zeros(out) if out == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        return n / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5  # half_pixel


def taps(n: int, scale: float, out: int, coefficients: Coefficients, mode: str, roi: tuple[float, float],
         exclude_outside: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The positions ``[out, t]`` (clamped into the axis) and weights each output reads, and which
    outputs lie outside the crop (tf_crop_and_resize): ONNX's reference, tap by tap."""
    x = _source(mode, np.arange(out, dtype=np.float64), scale, n, out, roi)
    whole = np.floor(x)
    ratios = np.where(x == whole, 1.0, x - whole)
    weights = np.stack([coefficients(float(r), scale) for r in ratios]) if out else np.zeros((0, 2))
    width = weights.shape[1]
    pad = math.ceil(width / 2)
    shifted = x + pad
    base = np.floor(shifted)
    fraction = shifted - base
    if width % 2 == 0:
        offset = np.where(fraction == 0, -(width // 2), -(width // 2) + 1)
    else:
        offset = np.where(fraction <= 0.5, -((width - 1) // 2), -((width - 1) // 2) + 1)
    positions = (base + offset).astype(np.int64)[:, None] + np.arange(width)[None, :] - pad
    if exclude_outside:
        weights = np.where((positions < 0) | (positions >= n), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    outside = (x < 0) | (x > n - 1) if mode == "tf_crop_and_resize" else np.zeros(out, bool)
    return _compact(np.clip(positions, 0, n - 1), weights) + (outside,)


def _compact(positions: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The taps with a nonzero weight, merged by position, left-aligned (nearest: one per output)."""
    rows = []
    for pos, w in zip(positions, weights):
        merged: dict[int, float] = {}
        for q, c in zip(pos.tolist(), w.tolist()):
            if c != 0:
                merged[q] = merged.get(q, 0.0) + c
        rows.append(sorted(merged.items()) or [(0, 0.0)])
    width = max((len(r) for r in rows), default=1)
    compact_pos = np.zeros((len(rows), width), np.int64)
    compact_w = np.zeros((len(rows), width), np.float64)
    for o, row in enumerate(rows):
        for t, (q, c) in enumerate(row):
            compact_pos[o, t], compact_w[o, t] = q, c
    return compact_pos, compact_w


def _plan(node: Node, args: list[Value | None], x: Value) -> tuple[list[float], list[int], list[float]]:
    """Each axis's scale and output size, and the region of interest (start, then end, per axis)."""
    rank = x.rank

    def given(k: int) -> np.ndarray | None:
        return const_of(node, args[k], "scales/sizes").reshape(-1) if len(args) > k and args[k] is not None \
            and args[k].size else None

    axes = [a % rank for a in node.attrs.get("axes", range(rank))]
    scales_in, sizes_in = (given(1), None) if node.opset < 11 else (given(2), given(3))
    roi = [0.0] * rank + [1.0] * rank
    if node.opset >= 11 and (roi_in := given(1)) is not None:
        for k, a in enumerate(axes):
            roi[a], roi[rank + a] = float(roi_in[k]), float(roi_in[len(axes) + k])
    scales, sizes = [1.0] * rank, list(x.shape)
    if sizes_in is not None:
        for k, a in enumerate(axes):
            scales[a], sizes[a] = int(sizes_in[k]) / x.shape[a], int(sizes_in[k])
        policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(scales[a] for a in axes)
            for a in axes:
                scales[a], sizes[a] = scale, int(scale * x.shape[a] + 0.5)
    elif scales_in is not None:
        for k, a in enumerate(axes):
            scales[a], sizes[a] = float(scales_in[k]), int(float(scales_in[k]) * x.shape[a])
    else:
        raise node.error("Resize needs scales or sizes")
    return scales, sizes, roi


def resize(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    x = args[0]
    mode = node.attrs.get("mode", "nearest")
    antialias = bool(node.attrs.get("antialias", 0))
    if mode == "nearest":
        if antialias:
            raise node.error("antialias with mode='nearest'")
        legacy = node.opset < 11
        coefficients = _nearest(node.attrs.get("nearest_mode", "floor" if legacy else "round_prefer_floor"))
    elif mode == "linear":
        coefficients = _linear(antialias)
    elif mode == "cubic":
        coefficients = _cubic(node.attrs.get("cubic_coeff_a", -0.75), antialias)
    else:
        raise node.error(f"mode={mode!r} is not a Resize mode")
    if mode != "nearest" and not is_float(x.dtype):
        raise node.error(f"{mode} Resize of {x.dtype}", hint="Cast to a float type first")
    transform = node.attrs.get("coordinate_transformation_mode", "asymmetric" if node.opset < 11 else "half_pixel")
    scales, sizes, roi = _plan(node, args, x)
    per_axis: dict[int, tuple[Value, Value, np.ndarray]] = {}
    for a in range(x.rank):
        if math.isclose(scales[a], 1.0) and sizes[a] == x.shape[a] and math.isclose(roi[a], 0.0) \
                and math.isclose(roi[x.rank + a], 1.0):
            continue  # this axis stays as it is
        where, weights, outside = taps(x.shape[a], scales[a], sizes[a], coefficients, transform,
                                       (roi[a], roi[x.rank + a]), bool(node.attrs.get("exclude_outside", 0)))
        per_axis[a] = (p.constant(where, "i64", f"{node.outputs[0]}_taps{a}"),
                       p.constant(weights.astype(np.float32 if x.dtype != "f64" else np.float64),
                                  "f64" if x.dtype == "f64" else "f32", f"{node.outputs[0]}_weights{a}"),
                       outside)
    if not per_axis:
        return [x]
    return [p.emit(node.outputs[0], sizes, x.dtype, lambda idx: _body(x, idx, per_axis, mode, node))]


def _body(x: Value, idx: list[Ex], per_axis: dict[int, tuple[Value, Value, np.ndarray]], mode: str,
          node: Node) -> Ex:
    """The weighted sum over the taps of every resized axis (one read for nearest)."""
    at: list[Ex] = list(idx)
    weight: Ex | None = None
    extents: list[tuple[str, int]] = []
    for a, (where, weights, _) in per_axis.items():
        width = where.shape[1]
        t = var(f"k{a}") if width > 1 else num(0)
        if width > 1:
            extents.append((f"k{a}", width))
        at[a] = call("min", call("max", where.read([idx[a], t]), 0), x.shape[a] - 1)
        if mode != "nearest":
            w = weights.read([idx[a], t])
            weight = w if weight is None else weight * w
    value = x.read(at)
    if weight is not None:
        value = (weight if x.dtype in ("f32", "f64") else call(x.dtype, weight)) * value
    total = reduction("sum", extents, value) if extents else value
    crops = [a for a, (_, _, outside) in per_axis.items() if outside.any()]
    if not crops:
        return total
    fill = float_literal(node.attrs.get("extrapolation_value", 0.0))
    for a in crops:
        mask = per_axis[a][2]
        total = select(_outside(idx[a], mask), fill, total)
    return total


def _outside(i: Ex, mask: np.ndarray) -> Ex:
    """Whether position ``i`` is one of the masked ones: the crop leaves a run at each end."""
    inside = np.flatnonzero(~mask)
    if inside.size == 0:
        return num(0).eq(0)
    return i.lt(int(inside[0])).or_(i.gt(int(inside[-1])))
