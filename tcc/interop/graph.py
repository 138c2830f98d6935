"""The graph engine's program: the tcc op a graph of tensor operators becomes.

Both front doors (``tcc.onnx``, ``torch.compile(backend="tcc")``) speak the engine's operator
vocabulary, ONNX's operator set: a front door walks its graph in order and calls, for each of its
operators, the handler (``onnx_ops``, ``onnx_nn``, ``onnx_shapes``, ...) of the equivalent ONNX
operator with a :class:`Node` (attributes as Python values). The handlers write one tcc ``op``:
graph inputs and weights are its parameters, every computing node a statement (an intermediate
the fusion pass may inline), and shape-only nodes (Transpose, Reshape, Slice, ...) *views*:
functions from an output index to a read of their source, so they cost nothing at run time.
Values known at import (initializers, Constant, Shape) stay NumPy arrays until a statement reads
them. ``graph_model.GraphModel`` compiles and runs the result.

Nothing here imports ``onnx``: the handlers see nodes through ``Node``.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tcc.errors import TccError
from tcc.frontend.unparse import Ex, access, call, num, unparse, var

Read = Callable[[Sequence[Ex]], Ex]
RESERVED = {"op", "pad", "value", "and", "or", "not", "sum", "max", "min", "prod", "select", "exp", "log",
            "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "floor", "ceil", "pow",
            "f16", "bf16", "f32", "f64", "i8", "i32", "i64", "bool", "f8e4m3", "f8e5m2", "schedule"}
INLINE_LIMIT = 1  # constants with at most this many elements are written into the source as literals
NUMPY_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "i32": np.int32,
                "i64": np.int64, "bool": np.bool_}


class OnnxImportError(TccError):
    """A graph tcc cannot import: an operator, attribute or element type it does not have (its
    name is the ONNX front door's, where users catch it; the torch front door leaves such a node
    to PyTorch)."""

    kind = "onnx import error"


class NeedsValue(OnnxImportError):
    """A node needs, at import, the value of a graph input (a Reshape's shape, say)."""

    def __init__(self, message: str, input_name: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.input_name = input_name


@dataclass
class Node:
    """One operator as the handlers see it (an ONNX node, or an ATen call mapped onto one):
    ``op_type`` the ONNX operator, attributes already decoded to Python values."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    opset: int

    def where(self) -> str:
        return f"node {self.name or '(unnamed)'} ({self.op_type})"

    def error(self, what: str, hint: str | None = None) -> OnnxImportError:
        return OnnxImportError(f"{self.where()}: {what}", hint=hint)


@dataclass
class Value:
    """A tensor of the graph: its shape, its tcc dtype and how to read one element.

    ``const`` holds the value when it is known at import; ``tensor`` names the tcc tensor that
    stores it (a parameter or a statement's result) when there is one, else ``read`` is a view.
    """

    shape: tuple[int, ...]
    dtype: str
    read: Read
    const: np.ndarray | None = None
    tensor: str | None = None
    input_name: str | None = None  # the graph input it is, for a NeedsValue

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Statement:
    """One statement of the op's body, printed: ``text`` defines ``name`` (after ``decl``, the
    declaration line of an intermediate), adds into it (``accumulates``: a scatter-add after its
    definition), or ``name`` is a ``pad`` view of ``pad_of``."""

    name: str
    text: str
    decl: str | None = None
    pad_of: str | None = None
    accumulates: bool = False

    def lines(self) -> list[str]:
        return [self.decl, self.text] if self.decl else [self.text]

    def reads(self) -> list[str]:
        """The names read, in order of first read: the pad's source, or every ``name[`` right of
        the ``=`` (a superset of the tensors read: the reductions ``sum[``, ``max[`` are in it);
        of a scatter-add, every one after its target (its position reads data)."""
        if self.pad_of is not None:
            return [self.pad_of]
        read = self.text[len(self.name):] if self.accumulates else self.text.split("=", 1)[1]
        return list(dict.fromkeys(re.findall(r"([A-Za-z_]\w*)\[", read)))


@dataclass
class Program:
    """The tcc op under construction: parameters (with the arrays bound to weights), statements."""

    name: str = "model"
    params: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # parameter name -> its array
    inputs: dict[str, str] = field(default_factory=dict)  # graph input name -> parameter name
    results: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    statements: list[Statement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the import decided (folds, views)
    winograd: bool = False  # 3x3 convolutions by Winograd's F(2x2, 3x3) where it pays (CPU)
    _names: set[str] = field(default_factory=set)
    _statements: int = 0

    # ------------------------------------------------------------ names
    def fresh(self, hint: str) -> str:
        """A tcc name from an ONNX one: letters, digits and ``_``, unique, not a keyword."""
        base = re.sub(r"\W", "_", hint) or "t"
        if base[0].isdigit() or base in RESERVED or keyword.iskeyword(base) or re.fullmatch(r"[ikcr]\d*(_\d+)?", base):
            base = "t_" + base
        name, n = base, 1
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._names.add(name)
        return name

    # ------------------------------------------------------------ values
    def tensor_value(self, name: str, shape: tuple[int, ...], dtype: str) -> Value:
        return Value(tuple(shape), dtype, lambda idx, n=name: access(n, idx), tensor=name)

    def add_input(self, onnx_name: str, shape: tuple[int, ...], dtype: str) -> Value:
        name = self.fresh(onnx_name)
        self.params.append((name, dtype, tuple(shape)))
        self.inputs[onnx_name] = name
        value = self.tensor_value(name, shape, dtype)
        value.input_name = onnx_name
        return value

    def constant(self, array: np.ndarray, dtype: str, hint: str = "c") -> Value:
        """A value known at import: a literal when it is one finite number, else a parameter
        bound to the array (made when a statement first reads it), C-contiguous: the model's
        calls hand the kernels its buffer as it is (a strided view of the weights, given through
        ``constants=`` or made at import, was read as if contiguous)."""
        array = np.asarray(array, dtype=NUMPY_DTYPES[dtype])
        first = array.flat[0] if array.size else None
        # (a broadcast view, all strides 0, is uniform unread: torch's zeros of an embedding's
        # gradient is 154 MB, made, copied and compared in seconds)
        uniform = array.size > 0 and (array.size <= INLINE_LIMIT or not any(array.strides)
                                      or bool(np.all(array == first)))
        if uniform and (literal := _literal(first, dtype)) is not None:
            return Value(array.shape, dtype, lambda idx, t=literal: t, const=array)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            array = array.copy(order="C")
        value = Value(array.shape, dtype, lambda idx: num(0), const=array)

        def read(idx: Sequence[Ex]) -> Ex:
            if value.tensor is None:
                value.tensor = self.fresh(hint)
                self.params.append((value.tensor, dtype, array.shape))
                self.weights[value.tensor] = array
            return access(value.tensor, idx)

        value.read = read
        return value

    def emit(self, hint: str, shape: Sequence[int], dtype: str, body: Callable[[list[Ex]], Ex]) -> Value:
        """A statement ``T[i0, ...] = body(i0, ...)`` defining a new intermediate."""
        name = self.fresh(hint)
        idx = self.index_names(len(shape))
        decl = f"{name}: {dtype}[{', '.join(map(str, shape))}]"
        self.statements.append(Statement(name, f"{unparse(access(name, idx).node)} = {body(idx)}", decl))
        return self.tensor_value(name, tuple(shape), dtype)

    def accumulate(self, target: Value, shape: Sequence[int], position: Callable[[list[Ex]], list[Ex]],
                   body: Callable[[list[Ex]], Ex]) -> None:
        """A statement ``T[position(i0, ...)] += body(i0, ...)`` over the index space ``shape``:
        a scatter-add into ``target``, an intermediate ``emit`` defined just before (every index
        must appear alone in one of ``body``'s reads, which gives its range)."""
        idx = self.index_names(len(shape))
        lhs = unparse(access(target.tensor, position(idx)).node)  # type: ignore[arg-type]
        self.statements.append(Statement(target.tensor, f"{lhs} += {body(idx)}", accumulates=True))  # type: ignore

    def materialize(self, value: Value, hint: str) -> str:
        """The name of a tcc tensor holding ``value`` (a copy statement for a view)."""
        if value.const is not None and value.tensor is None and value.size > INLINE_LIMIT:
            value.read([num(0)] * value.rank)  # makes the parameter
        if value.tensor is not None:
            return value.tensor
        copy = self.emit(hint, value.shape, value.dtype, value.read)
        return copy.tensor  # type: ignore[return-value]

    def pad(self, value: Value, lo: Sequence[int], hi: Sequence[int], hint: str, fill: Ex | None = None) -> Value:
        """A ``pad`` view of ``value``: reads outside it give ``fill`` (0 by default)."""
        source = self.materialize(value, hint)
        name = self.fresh(hint + "_pad")
        fill_text = f", value={fill}" if fill is not None else ""
        lists = f"[{', '.join(map(str, lo))}], [{', '.join(map(str, hi))}]"
        self.statements.append(Statement(name, f"{name} = pad({source}, {lists}{fill_text})", pad_of=source))
        shape = tuple(n + a + b for n, a, b in zip(value.shape, lo, hi))
        return Value(shape, value.dtype, lambda idx: access(name, idx))

    def add_result(self, onnx_name: str, value: Value) -> None:
        name = self.fresh(onnx_name)
        idx = self.index_names(value.rank)
        self.results.append((name, value.dtype, value.shape))
        self.statements.append(Statement(name, f"{access(name, idx)} = {value.read(idx)}"))

    def index_names(self, rank: int) -> list[Ex]:
        """Each statement's own index names (``i0_7, i1_7``): the CPU auto-scheduler transforms
        same-named loops of different statements together, which breaks on big programs."""
        self._statements += 1
        return [var(f"i{d}_{self._statements}") for d in range(rank)]

    # ------------------------------------------------------------ text
    def source(self) -> str:
        def decl(p: tuple[str, str, tuple[int, ...]]) -> str:
            return f"{p[0]}: {p[1]}[{', '.join(map(str, p[2]))}]"

        params = ",\n    ".join(decl(p) for p in self.params)
        results = ", ".join(decl(r) for r in self.results)
        results = results if len(self.results) == 1 else f"({results})"
        body = "\n".join("    " + line for s in self.statements for line in s.lines())
        return f"op {self.name}(\n    {params}\n) -> {results} {{\n{body}\n}}\n"




def _literal(x, dtype: str) -> Ex | None:
    """``x`` as an expression of dtype ``dtype``, or None when it has no literal (NaN)."""
    if dtype == "bool":
        return num(1).eq(1 if bool(x) else 0)
    if dtype.startswith("i"):
        return call(dtype, int(x))
    x = float(x)
    return None if math.isnan(x) else call(dtype, x)


def float_literal(x: float) -> Ex:
    """A weak float literal (keeps the other operand's dtype): ``0.5``, ``-0.5``."""
    return num(float(x))


def broadcast_shape(node: Node, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(rank):
        dims = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise node.error(f"cannot broadcast shapes {', '.join(str(list(s)) for s in shapes)}")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_read(value: Value, idx: Sequence[Ex], shape: Sequence[int]) -> Ex:
    """Read ``value`` at the index ``idx`` of a result of ``shape``, under NumPy broadcasting
    (a dim of 1 against a longer one reads 0; matching dims keep their index, so fusion sees
    every loop index)."""
    offset = len(idx) - value.rank
    return value.read([idx[offset + d] if value.shape[d] == shape[offset + d] else num(0) for d in range(value.rank)])


def view(source: Value, shape: Sequence[int], read: Read) -> Value:
    """A value defined by reads of ``source`` (no statement); folded when ``source`` is known."""
    return Value(tuple(shape), source.dtype, read, input_name=source.input_name)
