"""The graph under construction: its values with their element types and shapes, and the
helpers that the operator generators (``views``, ``compute``, ``windows``) share.

Shapes are tracked here, not inferred by ONNX after each node, because a generator must know
them to choose valid attributes (a Reshape's target, a window that fits). A shape rule written
wrong makes an invalid graph, which ``onnx.checker`` rejects and the fuzzer discards and counts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

ELEM = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "f64": TensorProto.DOUBLE, "i8": TensorProto.INT8,
        "i32": TensorProto.INT32, "i64": TensorProto.INT64, "bool": TensorProto.BOOL}
NUMPY = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i8": np.int8, "i32": np.int32,
         "i64": np.int64, "bool": np.bool_}
FLOATS = ("f32", "f16", "f64")
INTS = ("i32", "i64", "i8")
DIMS = (1, 2, 3, 5, 7)  # odd sizes and 1 (broadcasting, squeezable) more than round ones
# operators whose result two correct implementations compute bit for bit from the same operands:
# only such values may be compared, cast from float to int, or tie in a max
EXACT_OPS = {"Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Slice", "Gather", "Split", "Concat",
             "Identity", "Dropout", "Shape", "ConstantOfShape", "Neg", "Abs", "Relu", "Clip", "MaxPool",
             "ReduceMax", "Equal", "Less", "Greater", "Where", "Cast", "Expand", "Tile", "Pad", "Trilu", "Range",
             "ReduceMin", "ArgMax", "ArgMin", "Min", "Max", "Sign", "Round", "Mod", "Not", "And", "Or", "Xor",
             "GreaterOrEqual", "LessOrEqual", "IsNaN", "IsInf"}


@dataclass(frozen=True)
class Val:
    """A value of the graph: an input, an initializer or a node's output."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    exact: bool = True  # see EXACT_OPS

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Graph:
    """An ONNX graph being generated from one seed's random stream."""

    def __init__(self, seed: int, opset: int):
        self.rng = random.Random(seed)
        self.opset = opset
        self.nodes: list = []
        self.inputs: list[Val] = []
        self.initializers: list = []
        self.values: list[Val] = []  # what later nodes may read, oldest first
        self.computed: list[Val] = []  # node outputs (the candidates for graph outputs)
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, dtype: str, shape: Sequence[int]) -> Val:
        v = Val(self.name("in"), dtype, tuple(shape))
        self.inputs.append(v)
        self.values.append(v)
        return v

    def const(self, array: np.ndarray, dtype: str, node: bool | None = None) -> Val:
        """A constant operand: an initializer, or (sometimes) a Constant node."""
        array = np.asarray(array).astype(NUMPY[dtype])
        v = Val(self.name("c"), dtype, tuple(array.shape))
        if node if node is not None else self.rng.random() < 0.2:
            self.nodes.append(helper.make_node("Constant", [], [v.name], value=numpy_helper.from_array(array)))
        else:
            self.initializers.append(numpy_helper.from_array(array, v.name))
        return v

    def ints(self, values: Sequence[int]) -> Val:
        """A constant int64 vector: the shape, axes, starts... operand of a view."""
        return self.const(np.array(list(values), np.int64), "i64")

    def node(self, op: str, args: Sequence[Val | None], outs: Sequence[tuple[str, Sequence[int]]],
             exact: bool | None = None, **attrs) -> list[Val]:
        """Append a node; its outputs become values later nodes may read. ``exact`` overrides
        the rule of EXACT_OPS where the generator knows better (x * 0.5 is exact)."""
        if exact is None:
            exact = all(a.exact for a in args if a is not None) and (
                op in EXACT_OPS or all(a.dtype not in FLOATS for a in args if a is not None))
        results = [Val(self.name(op[:3].lower()), dtype, tuple(shape), exact) for dtype, shape in outs]
        self.nodes.append(helper.make_node(op, ["" if a is None else a.name for a in args],
                                           [r.name for r in results], **attrs))
        self.values.extend(results)
        self.computed.extend(results)
        return results

    def hide(self, v: Val) -> Val:
        """Keep ``v`` from later nodes and from the graph's outputs: an operand made only for the
        node that reads it (a tensor of infinities and NaNs for IsInf)."""
        self.values.remove(v)
        self.computed.remove(v)
        return v

    def pick(self, ok: Callable[[Val], bool] = lambda v: True) -> Val | None:
        """A value that ``ok`` accepts, the newest one half the time: so that nodes chain into
        each other (views of views, windows of views) more than a uniform choice would."""
        found = [v for v in self.values if ok(v)]
        if not found:
            return None
        return found[-1] if self.rng.random() < 0.5 else self.rng.choice(found)

    def random_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(self.rng.choice(DIMS) for _ in range(rank))

    def random_array(self, dtype: str, shape: Sequence[int]) -> np.ndarray:
        return random_values(np.random.default_rng(self.rng.getrandbits(32)), dtype, shape)

    def model(self, outputs: Sequence[Val]) -> ModelProto:
        graph = helper.make_graph(
            self.nodes, "fuzz", [helper.make_tensor_value_info(v.name, ELEM[v.dtype], v.shape) for v in self.inputs],
            [helper.make_tensor_value_info(v.name, ELEM[v.dtype], v.shape) for v in outputs], self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8  # helper writes onnx 1.23's IR version; onnxruntime 1.31 reads up to 13
        return model


def random_values(rng: np.random.Generator, dtype: str, shape: Sequence[int]) -> np.ndarray:
    """Random data that is never zero (no division by zero, no log of zero, no ties in a max
    that an all-zero tensor would make): magnitudes in [0.5, 2) of either sign, ints in ±[1, 9]."""
    shape = tuple(shape)
    sign = np.where(rng.random(shape) < 0.5, -1, 1)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in INTS:
        return np.asarray(sign * rng.integers(1, 10, shape)).astype(NUMPY[dtype])
    return np.asarray(sign * rng.uniform(0.5, 2.0, shape)).astype(NUMPY[dtype])


def factor(rng: random.Random, size: int, rank: int) -> list[int]:
    """A random shape of ``rank`` dims whose product is ``size`` (some dims may be 1)."""
    dims = [1] * rank
    if rank == 0:
        return dims
    for p in _prime_factors(size):
        dims[rng.randrange(rank)] *= p
    return dims


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(tuple(a), tuple(b)))


def broadcastable_to(rng: random.Random, shape: Sequence[int]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape`` to ``shape``: a suffix of it, some dims 1."""
    keep = rng.randint(0, len(shape))
    return tuple(1 if rng.random() < 0.3 else d for d in shape[len(shape) - keep:])
