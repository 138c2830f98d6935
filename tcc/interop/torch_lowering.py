"""The torch front door's lowering context: what each ATen call's lowering sees and uses.

A :class:`Lowering` translates one FX graph into a ``graph.Program``: an entry of the operator
table (``torch_aten.ATEN``) gets it with the call's arguments as engine values and builds the
engine's operators through :meth:`Lowering.onnx` (the handler of an ONNX operator). Shapes and
dtypes come from the fake tensors FX records on each node. ``Unsupported`` refuses a call: the
partitioner then leaves it to PyTorch.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch  # the optional dependency of the torch front door

from tcc.errors import TccError
from tcc.interop.graph import NUMPY_DTYPES, Node, Program, Value
from tcc.interop.graph_ops import HANDLERS
from tcc.interop.onnx_ops import ONNX_DTYPES

aten = torch.ops.aten
TCC_DTYPES = {torch.float16: "f16", torch.float32: "f32", torch.float64: "f64", torch.int8: "i8",
              torch.int32: "i32", torch.int64: "i64", torch.bool: "bool"}
ONNX_TYPE = {dtype: elem for elem, dtype in ONNX_DTYPES.items() if dtype != "bf16"}
OPSET = 21


class Unsupported(TccError):
    """An ATen call the engine does not take (this op, or these arguments): PyTorch runs it."""

    kind = "unsupported"


class Lowering:
    """The translation of one FX graph into a ``Program``: what the operator table's entries see."""

    def __init__(self, program: Program):
        self.p = program
        self.node: torch.fx.Node | None = None

    # ------------------------------------------------------------ what the node records
    def meta(self, n: int | None = None) -> Any:
        val = self.node.meta.get("val")  # type: ignore[union-attr]
        return val if n is None else val[n]

    def dtype(self, n: int | None = None) -> str:
        return tcc_dtype(self.meta(n).dtype)

    def shape(self, n: int | None = None) -> tuple[int, ...]:
        return static_shape(self.meta(n).shape)

    # ------------------------------------------------------------ building
    def onnx(self, op_type: str, args: Sequence[Value | None], outputs: int = 1, **attrs: Any) -> list[Value]:
        """The engine's ``op_type`` (an ONNX operator's handler) on ``args``."""
        name = self.node.name  # type: ignore[union-attr]
        node = Node(op_type, name, [f"{name}_in{k}" for k in range(len(args))],
                    [name if k == 0 else f"{name}_{k}" for k in range(outputs)], attrs, OPSET)
        return HANDLERS[op_type](self.p, node, list(args))

    def one(self, op_type: str, *args: Value | None, **attrs: Any) -> Value:
        return self.onnx(op_type, args, **attrs)[0]

    def const(self, value: Any, dtype: str) -> Value:
        return self.p.constant(np.asarray(value, dtype=NUMPY_DTYPES[dtype]), dtype, self.node.name)  # type: ignore

    def ints(self, values: Sequence[int]) -> Value:
        return self.const(np.asarray(list(values), np.int64), "i64")

    def cast(self, x: Value, dtype: str) -> Value:
        return x if x.dtype == dtype else self.one("Cast", x, to=ONNX_TYPE[dtype])

    def operand(self, x: Value | float | int | bool, dtype: str) -> Value:
        """A tensor or Python number as a ``dtype`` operand."""
        return self.cast(x, dtype) if isinstance(x, Value) else self.const(x, dtype)


def tcc_dtype(dtype: torch.dtype) -> str:
    if dtype not in TCC_DTYPES:
        raise Unsupported(f"element type {dtype} is not one of tcc's")
    return TCC_DTYPES[dtype]


def static_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"shape {list(shape)} is symbolic; tcc compiles for static shapes")
    return tuple(int(d) for d in shape)


def axis_list(dims: Any, rank: int) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    return [d % rank if rank else 0 for d in dims]


def target_name(target: Any) -> str:
    """An FX call's operator as the user reads it (``addmm.default``)."""
    return str(getattr(target, "__name__", target)) if target is not operator.getitem else "getitem"
