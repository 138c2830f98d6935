"""Core ATen's neural-network operators onto the graph engine: matrix products, convolutions and
their gradients, normalisation, pooling, embeddings and their gradient (a scatter-add).

Part of the torch front door's operator table (``torch_aten.ATEN`` takes :data:`NN`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch  # the optional dependency of the torch front door

from tcc.frontend.unparse import call, select
from tcc.interop.graph import Value
from tcc.interop.torch_lowering import Lowering, Unsupported, target_name

aten = torch.ops.aten  # (PyTorch's operator namespace: its private-looking names are its own)


def _mm(t: Lowering, a: Value, b: Value) -> Value:
    return t.one("MatMul", a, b)


def _addmm(t: Lowering, bias: Value, a: Value, b: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    product = t.one("MatMul", a, b)
    if alpha != 1:
        product = t.one("Mul", product, t.const(alpha, product.dtype))
    if beta != 1:
        bias = t.one("Mul", bias, t.const(beta, bias.dtype))
    return t.one("Add", product, bias)


def _convolution(t: Lowering, x: Value, w: Value, bias: Value | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Value:
    nd = x.rank - 2
    pads = list(padding) * 2 if len(padding) == nd else list(padding)
    attrs = {"strides": list(stride), "pads": pads, "dilations": list(dilation), "group": groups}
    if transposed:
        attrs["output_padding"] = list(output_padding)
    return t.onnx("ConvTranspose" if transposed else "Conv", [x, w, bias], **attrs)[0]


def _layer_norm(t: Lowering, x: Value, shape: Sequence[int], weight: Value | None, bias: Value | None,
                eps: float) -> list[Value]:
    tail = tuple(shape)
    weight = weight if weight is not None else t.const(np.ones(tail), x.dtype)
    axis = x.rank - len(tail)
    return t.onnx("LayerNormalization", [x, weight, bias], outputs=3, axis=axis, epsilon=float(eps))


def _embedding(t: Lowering, weight: Value, indices: Value, *rest: Any) -> Value:
    return t.one("Gather", weight, indices, axis=0)


def _index_select(t: Lowering, x: Value, dim: int, index: Value) -> Value:
    return t.one("Gather", x, index, axis=dim % x.rank)


def _first_only(t: Lowering) -> None:
    """Refuse a call whose results after the first (indices, saved statistics) something reads."""
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in t.node.users):  # type: ignore[union-attr]
        raise Unsupported(f"{target_name(t.node.target)} with its later results read")  # type: ignore[union-attr]


def _channel(t: Lowering, v: Value | None, rank: int, fill: float, dtype: str, channels: int) -> Value:
    """A per-channel vector shaped to broadcast over (N, C, ...)."""
    v = v if v is not None else t.const(np.full(channels, fill), dtype)
    return t.one("Reshape", v, t.ints([1, channels] + [1] * (rank - 2)))


def _batch_norm_inference(t: Lowering, x: Value, w: Value | None, b: Value | None, mean: Value, var: Value,
                          momentum: float, eps: float) -> list[Value | None]:
    _first_only(t)
    c = x.shape[1]
    w = w if w is not None else t.const(np.ones(c), x.dtype)
    b = b if b is not None else t.const(np.zeros(c), x.dtype)
    return [t.one("BatchNormalization", x, w, b, mean, var, epsilon=float(eps)), None, None]


def _batch_norm_training(t: Lowering, x: Value, w: Value | None, b: Value | None, running_mean: Value,
                         running_var: Value, training: bool, momentum: float, eps: float) -> list[Value]:
    """Batch statistics, the normalised output, and the running statistics updated as PyTorch
    does (the variance unbiased)."""
    if not training:
        raise Unsupported("functional batch norm outside training")
    axes = [0, *range(2, x.rank)]
    c, n = x.shape[1], math.prod(x.shape) // x.shape[1]
    mean = t.one("ReduceMean", x, t.ints(axes), keepdims=0)
    centred = t.one("Sub", x, _channel(t, mean, x.rank, 0, x.dtype, c))
    var = t.one("ReduceMean", t.one("Mul", centred, centred), t.ints(axes), keepdims=0)
    rstd = t.one("Reciprocal", t.one("Sqrt", t.one("Add", var, t.const(eps, x.dtype))))
    out = t.one("Mul", centred, _channel(t, rstd, x.rank, 0, x.dtype, c))
    out = t.one("Add", t.one("Mul", out, _channel(t, w, x.rank, 1, x.dtype, c)), _channel(t, b, x.rank, 0, x.dtype, c))

    def update(old: Value, new: Value) -> Value:
        return t.one("Add", t.one("Mul", old, t.const(1 - momentum, old.dtype)),
                     t.one("Mul", new, t.const(momentum, old.dtype)))

    unbiased = t.one("Mul", var, t.const(n / max(n - 1, 1), var.dtype))
    return [out, mean, rstd, update(running_mean, mean), update(running_var, unbiased)]


def _pool_window(kernel: Sequence[int], stride: Sequence[int], padding: Any, nd: int) -> dict[str, Any]:
    pads = [padding] * nd if isinstance(padding, int) else list(padding) * (2 if len(padding) == nd else 1)
    pads = pads * 2 if len(pads) == nd else pads
    return {"kernel_shape": list(kernel), "strides": list(stride or kernel), "pads": pads}


def _max_pool(t: Lowering, x: Value, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> list[Value | None]:
    _first_only(t)
    nd = x.rank - 2
    dilations = [dilation] * nd if isinstance(dilation, int) else list(dilation)
    attrs = _pool_window(kernel, stride, padding, nd)
    return [t.one("MaxPool", x, dilations=dilations, ceil_mode=int(ceil_mode), **attrs), None]


def _avg_pool(t: Lowering, x: Value, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Value:
    if divisor_override is not None:
        raise Unsupported("average pooling with divisor_override")
    attrs = _pool_window(kernel, stride, padding, x.rank - 2)
    return t.one("AveragePool", x, ceil_mode=int(ceil_mode), count_include_pad=int(count_include_pad), **attrs)


def _adaptive_avg_pool(t: Lowering, x: Value, size: Sequence[int]) -> Value:
    spatial = x.shape[2:]
    if any(n % s for n, s in zip(spatial, size)):
        raise Unsupported(f"adaptive average pooling of {list(spatial)} to {list(size)}")
    kernel = [n // s for n, s in zip(spatial, size)]
    return t.one("AveragePool", x, kernel_shape=kernel, strides=kernel)


def _convolution_backward(t: Lowering, grad: Value, x: Value, w: Value, bias_sizes: Any, stride: Sequence[int],
                          padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                          output_padding: Sequence[int], groups: int, mask: Sequence[bool]) -> list[Value | None]:
    """The gradients of a convolution as convolutions: the input's a transposed convolution of
    the output's gradient, the weights' a convolution of the input (batch as channels) by the
    output's gradient (strides and dilations swapped), cropped to the kernel."""
    if transposed or (groups != 1 and mask[1]):
        raise Unsupported("the gradient of a transposed or grouped convolution")
    nd = x.rank - 2
    kernel = w.shape[2:]
    pads = list(padding) * 2
    results: list[Value | None] = [None, None, None]
    if mask[0]:
        extra = [x.shape[2 + d] - ((grad.shape[2 + d] - 1) * stride[d] - 2 * padding[d]
                                   + (kernel[d] - 1) * dilation[d] + 1) for d in range(nd)]
        results[0] = t.one("ConvTranspose", grad, w, strides=list(stride), pads=pads, dilations=list(dilation),
                           output_padding=extra, group=groups)
    if mask[1]:
        swap = [1, 0, *range(2, x.rank)]
        full = t.one("Conv", t.one("Transpose", x, perm=swap), t.one("Transpose", grad, perm=swap),
                     strides=list(dilation), dilations=list(stride), pads=pads)
        crop = t.one("Slice", full, t.ints([0] * nd), t.ints(kernel), t.ints(range(2, x.rank)))
        results[1] = t.one("Transpose", crop, perm=swap)
    if mask[2]:
        results[2] = t.one("ReduceSum", grad, t.ints([0, *range(2, x.rank)]), keepdims=0)
    return results


def _index_put(t: Lowering, x: Value, indices: Sequence[Value | None], values: Value,
               accumulate: bool = False) -> Value:
    """``x`` with ``values`` added at the positions one index tensor gives along the first axis
    (the gradient of an embedding): a copy of ``x``, then a scatter-add statement. A negative
    index counts from the end; the position is clamped into the axis, since an index computed in
    the program cannot be checked before the call (the embedding's decomposition clamps its
    indices the same way, and its forward checked them)."""
    if not accumulate or len(indices) != 1 or indices[0] is None:
        raise Unsupported("index_put other than an accumulation along the first axis")
    index, n = indices[0], x.shape[0]
    if index.dtype not in ("i32", "i64") or values.shape != index.shape + x.shape[1:]:
        raise Unsupported(f"index_put of values {list(values.shape)} at indices {list(index.shape)}")
    out = t.p.emit(t.node.name, x.shape, x.dtype, x.read)  # type: ignore[union-attr]
    k = index.rank
    values = t.cast(values, x.dtype)
    source = t.p.tensor_value(t.p.materialize(values, t.node.name + "_values"), values.shape, x.dtype)  # type: ignore

    def position(idx: list[Any]) -> list[Any]:
        i = index.read(idx[:k])
        return [call("min", call("max", select(i.lt(0), i + n, i), 0), n - 1), *idx[k:]]

    t.p.accumulate(out, values.shape, position, source.read)
    return out


NN: dict[Any, Callable[..., Any]] = {
    aten.mm.default: _mm, aten.bmm.default: _mm, aten.addmm.default: _addmm,
    aten.convolution.default: _convolution, aten.native_layer_norm.default: _layer_norm,
    aten.embedding.default: _embedding, aten.index_select.default: _index_select,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_inference,
    aten._native_batch_norm_legit_functional.default: _batch_norm_training,
    aten.max_pool2d_with_indices.default: _max_pool, aten.avg_pool2d.default: _avg_pool,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool, aten.convolution_backward.default: _convolution_backward,
    aten.index_put.default: _index_put,
}
