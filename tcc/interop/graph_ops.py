"""The graph engine's operators: one handler per operator of its vocabulary, ONNX's operator set.

A handler takes the program, the node (``graph.Node``: the ONNX operator and its attributes) and
its input values, writes statements or views, and returns its output values. Both front doors
call them: ``tcc.onnx`` for each ONNX node, ``torch.compile(backend="tcc")`` for the ONNX
operator each ATen call maps onto (``torch_aten``).
"""

from __future__ import annotations

from collections.abc import Callable

from tcc.interop import onnx_attention as attention
from tcc.interop import onnx_einsum as einsum
from tcc.interop import onnx_index as index
from tcc.interop import onnx_math as math_ops
from tcc.interop import onnx_nn as nn
from tcc.interop import onnx_ops as ops
from tcc.interop import onnx_resize as resize
from tcc.interop import onnx_scatter as scatter
from tcc.interop import onnx_shapes as shapes
from tcc.interop.graph import Node, Program

__all__ = ["HANDLERS", "Handler"]

Handler = Callable[[Program, Node, list], list]
HANDLERS: dict[str, Handler] = {
    **{name: ops.unary for name in ops.UNARY},
    **{name: ops.binary for name in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater")},
    "Sum": ops.variadic_sum, "Where": ops.where, "LeakyRelu": ops.leaky_relu, "Gelu": ops.gelu,
    "Clip": ops.clip, "Cast": ops.cast, "Identity": ops.identity, "Dropout": ops.dropout,
    "Constant": ops.constant, "ConstantOfShape": ops.constant_of_shape, "Shape": ops.shape_of,
    "ReduceSum": ops.reduce, "ReduceMean": ops.reduce, "ReduceMax": ops.reduce,
    "Softmax": ops.softmax, "LogSoftmax": ops.softmax,
    "Transpose": shapes.transpose, "Reshape": shapes.reshape, "Flatten": shapes.flatten,
    "Unsqueeze": shapes.unsqueeze, "Squeeze": shapes.squeeze, "Slice": shapes.slice_, "Split": shapes.split,
    "Gather": index.gather, "GatherElements": index.gather_elements, "GatherND": index.gather_nd,
    "CumSum": index.cumsum, "Concat": shapes.concat,
    "MatMul": nn.matmul, "Gemm": nn.gemm, "Conv": nn.conv, "ConvTranspose": nn.conv_transpose,
    "MaxPool": nn.max_pool, "AveragePool": nn.average_pool, "GlobalAveragePool": nn.global_average_pool,
    "BatchNormalization": nn.batch_norm, "LayerNormalization": nn.layer_norm,
    "InstanceNormalization": nn.instance_norm,
    **{name: ops.reduce for name in ops.REDUCTIONS}, "ArgMax": ops.arg_extreme, "ArgMin": ops.arg_extreme,
    **{name: math_ops.logic for name in math_ops.LOGIC}, "Not": math_ops.not_,
    "IsNaN": math_ops.is_nan, "IsInf": math_ops.is_inf, "Mod": math_ops.mod, "Sign": math_ops.sign,
    "Reciprocal": math_ops.reciprocal, "Round": math_ops.round_,
    **{name: math_ops.variadic for name in ("Min", "Max", "Mean")},
    **{name: math_ops.activation for name in math_ops.ACTIVATIONS}, "PRelu": math_ops.prelu,
    "Expand": shapes.expand, "Tile": shapes.tile, "Pad": shapes.pad, "Range": shapes.range_,
    "Trilu": shapes.trilu,
    "ScatterElements": scatter.scatter_elements, "ScatterND": scatter.scatter_nd,
    "TopK": scatter.top_k, "Einsum": einsum.einsum, "Resize": resize.resize,
    "RMSNormalization": attention.rms_norm, "RotaryEmbedding": attention.rotary_embedding,
    "Attention": attention.attention,
}
