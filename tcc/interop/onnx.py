"""ONNX models as one tcc op: ``tcc.onnx.load("model.onnx")`` returns a compiled callable.

The graph becomes tcc source (``model.source``): one ``op`` whose parameters are the graph's
inputs and weights and whose statements are its nodes, so the fusion pass fuses across nodes
exactly as it fuses a hand-written op (conv + bias + BatchNorm folded into the weights + relu
become one kernel; chains of elementwise nodes one loop nest), and every stage prints
(``model.lower(stage="fused")``). On the CPU the op then runs as the kernels
``graph_kernels`` cuts it into where fusion joins nothing, each distinct one compiled once.
Shapes come from the model or from ``input_shapes``. Dims the model leaves symbolic
(``dim_param``) that ``input_shapes`` does not fix stay shape symbols on the CPU: the model is
translated at a few sizes and served by shape-generic kernels (``graph_dynamic``), so a call at
a new size compiles nothing. A node tcc cannot import is an ``OnnxImportError`` naming it,
raised before anything is compiled or run.

``onnx`` is an optional dependency (``pip install onnx``): it is imported only when a model is
loaded, so ``import tcc`` never needs it.
"""

from __future__ import annotations

import keyword
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from tcc.compiler import check_options
from tcc.errors import TccArgumentError
from tcc.interop.graph import NUMPY_DTYPES, RESERVED, NeedsValue, Node, OnnxImportError, Program, Value
from tcc.interop.graph_dynamic import GenericGraph, probe_bindings, solve
from tcc.interop.graph_model import GraphModel
from tcc.interop.graph_ops import HANDLERS
from tcc.interop.onnx_ops import ONNX_DTYPES, tcc_dtype
from tcc.runtime.backend import backend_for
from tcc.target import Target

__all__ = ["HANDLERS", "NeedsValue", "OnnxGenericModel", "OnnxImportError", "OnnxModel", "load", "translate"]

def _onnx():
    """The ``onnx`` package (optional dependency, imported on first use)."""
    try:
        import onnx  # optional dependency: only needed to read models
    except ImportError:
        raise TccArgumentError("tcc.onnx needs the onnx package", hint="pip install onnx") from None
    return onnx


# ---------------------------------------------------------------- reading the graph


def _read_model(model: Any):
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        try:
            return onnx.load_from_string(model)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise TccArgumentError(f"these bytes are not an ONNX model: {exc}") from None
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        if not os.path.isfile(path):  # a directory or a device (/dev/zero) is refused before reading
            raise TccArgumentError(f"cannot read ONNX model {path!r}: not a file", hint="check the path")
        try:
            return onnx.load(path)
        except Exception as exc:  # OSError, protobuf's DecodeError, onnx's external-data errors
            raise TccArgumentError(f"cannot read ONNX model {path!r}: {exc}") from None
    raise TccArgumentError(f"tcc.onnx.load takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def _attrs(proto) -> dict:
    """A node's attributes as Python values; tensors become (array, element type)."""
    onnx = _onnx()
    attrs = {}
    for a in proto.attribute:
        if a.type == onnx.AttributeProto.TENSOR:
            attrs[a.name] = (onnx.numpy_helper.to_array(a.t), a.t.data_type)
        elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.SPARSE_TENSOR):
            attrs[a.name] = None  # refused by the handlers that would need them
        else:
            value = onnx.helper.get_attribute_value(a)
            attrs[a.name] = value.decode() if isinstance(value, bytes) else list(value) \
                if isinstance(value, list | tuple) else value
    return attrs


def _nodes(graph, opset: int) -> list[Node]:
    missing: dict[str, list[str]] = {}
    for proto in graph.node:
        if proto.domain in ("", "ai.onnx") and proto.op_type not in HANDLERS:
            missing.setdefault(proto.op_type, []).append(proto.name or "(unnamed)")
    if missing:  # every one at once: a user converting a model sees the whole list
        listed = "; ".join(f"{op} ({len(names)} node{'s' * (len(names) > 1)}: {', '.join(names[:3])}"
                           f"{', ...' if len(names) > 3 else ''})" for op, names in sorted(missing.items()))
        raise OnnxImportError(f"operators not supported by tcc: {listed}",
                              hint=f"supported: {', '.join(sorted(HANDLERS))}")
    nodes = []
    for proto in graph.node:
        node = Node(proto.op_type, proto.name, list(proto.input), list(proto.output), _attrs(proto), opset)
        if proto.domain not in ("", "ai.onnx"):
            raise node.error(f"operator domain {proto.domain!r} is not supported", hint="tcc imports ai.onnx only")
        if any(v is None for v in node.attrs.values()):
            bad = [k for k, v in node.attrs.items() if v is None]
            raise node.error(f"attribute {', '.join(bad)} (a graph or sparse tensor) is not supported")
        nodes.append(node)
    return nodes


def _fold_batch_norms(nodes: list[Node], weights: dict[str, np.ndarray], outputs: set[str]) -> list[Node]:
    """Conv followed only by an inference BatchNormalization with constant statistics: the
    normalisation is folded into the convolution's weights and bias, and the BN node removed."""
    readers: dict[str, int] = {}
    for node in nodes:
        for name in node.inputs:
            readers[name] = readers.get(name, 0) + 1
    producer = {node.outputs[0]: node for node in nodes if node.op_type == "Conv"}
    kept = []
    for node in nodes:
        conv = producer.get(node.inputs[0]) if node.op_type == "BatchNormalization" else None
        params = node.inputs[1:5]
        if conv is None or readers.get(conv.outputs[0]) != 1 or conv.outputs[0] in outputs \
                or len([o for o in node.outputs if o]) != 1 or node.attrs.get("training_mode", 0) \
                or not all(n in weights for n in [*params, *conv.inputs[1:]] if n):
            kept.append(node)
            continue
        scale, bias, mean, var = (weights[n].astype(np.float64) for n in params)
        w = weights[conv.inputs[1]]
        b = weights[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
        s = scale / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
        wname, bname = conv.outputs[0] + "_folded_w", conv.outputs[0] + "_folded_b"
        weights[wname] = (w * s.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
        weights[bname] = ((b - mean) * s + bias).astype(w.dtype)
        conv.inputs = [conv.inputs[0], wname, bname]
        conv.outputs = [node.outputs[0]]
        conv.attrs = {**conv.attrs, "folded": node.name or "BatchNormalization"}
    return kept


def _input_shape(vi, given: dict[str, Sequence[int]]) -> tuple[int, ...]:
    if vi.name in given:
        return tuple(int(d) for d in given[vi.name])
    dims = vi.type.tensor_type.shape.dim
    shape = []
    for n, d in enumerate(dims):
        if not d.HasField("dim_value"):
            raise OnnxImportError(f"input {vi.name!r}: dimension {n} is {d.dim_param or 'unknown'}; a translation "
                                  "(and a CUDA model: its kernels specialise on shapes) needs every dim",
                                  hint=f"pass input_shapes={{{vi.name!r}: (...)}} to tcc.onnx.load")
        shape.append(d.dim_value)
    return tuple(shape)


def translate(model: Any, input_shapes: dict[str, Sequence[int]] | None = None,
              constants: dict[str, Any] | None = None, winograd: bool = False) -> Program:
    """The tcc program of an ONNX model (no compilation). ``constants`` fixes graph inputs to
    values known at import (a Reshape's shape given as an input, say); ``winograd``: 3x3
    convolutions by Winograd's F(2x2, 3x3) where that is faster (tcc.interop.onnx_winograd)."""
    onnx = _onnx()
    model = _read_model(model)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    program = Program(winograd=winograd)
    env: dict[str, Value | None] = {"": None}
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for name, value in (constants or {}).items():
        weights[name] = np.asarray(value)
    nodes = _fold_batch_norms(_nodes(graph, opset), weights, {o.name for o in graph.output})
    for vi in graph.input:
        if vi.name in weights:
            continue
        if not vi.type.HasField("tensor_type"):
            raise OnnxImportError(f"input {vi.name!r} is not a tensor", hint="tcc imports tensor graphs only")
        dtype = tcc_dtype(None, vi.type.tensor_type.elem_type, f"input {vi.name!r}")
        env[vi.name] = program.add_input(vi.name, _input_shape(vi, input_shapes or {}), dtype)
    for name, array in weights.items():
        dtype = _numpy_dtype(array, name)
        env[name] = program.constant(array, dtype, name)
    for node in nodes:
        args = []
        for name in node.inputs:
            if name not in env:
                raise node.error(f"input {name!r} is not defined before the node")
            args.append(env[name])
        while args and args[-1] is None:
            args.pop()
        try:
            results = HANDLERS[node.op_type](program, node, args)
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
            # a node the ONNX checker would refuse (a required attribute or input missing)
            raise node.error(f"malformed node ({type(exc).__name__}: {exc})",
                             hint="check the model with onnx.checker.check_model") from None
        if "folded" in node.attrs:
            program.notes.append(f"{node.where()}: BatchNormalization {node.attrs['folded']} folded into its "
                                 "weights and bias")
        for name, value in zip(node.outputs, results):
            if name:
                env[name] = value
    for vi in graph.output:
        if env.get(vi.name) is None:
            raise OnnxImportError(f"graph output {vi.name!r} is not computed by any node")
        program.add_result(vi.name, env[vi.name])
    return program


def _numpy_dtype(array: np.ndarray, name: str) -> str:
    for dtype, np_dtype in NUMPY_DTYPES.items():
        if array.dtype == np_dtype:
            return dtype
    raise OnnxImportError(f"initializer {name!r} has element type {array.dtype}, which tcc does not have",
                          hint=f"tcc's types: {', '.join(sorted(set(ONNX_DTYPES.values())))}")


# ---------------------------------------------------------------- the compiled model


class OnnxModel(GraphModel):
    """A compiled ONNX model (``tcc.interop.graph_model.GraphModel``): call it with the graph's
    inputs (positionally, or by name)."""

    label = "tcc.onnx"

    def __repr__(self) -> str:
        return f"<tcc.onnx model ({', '.join(self.input_names)}) -> ({', '.join(self.output_names)}) on {self.target}>"


class OnnxGenericModel:
    """A compiled ONNX model whose inputs have symbolic dims: one set of shape-generic kernels
    serves every size (``tcc.interop.graph_dynamic``). Call it as an :class:`OnnxModel`;
    ``compiles`` counts the kernels built, ``symbols`` the dims' symbols (the ``dim_param``
    names, made identifiers), ``shapes`` each input's shape over them."""

    label = "tcc.onnx"

    def __init__(self, proto: Any, target: str | Target, shapes: dict[str, tuple[int | str, ...]],
                 constants: dict[str, Any] | None, output_names: list[str], options: dict[str, Any]):
        self._proto, self._constants = proto, constants
        self.input_names = list(shapes)
        self.output_names = output_names
        self.target = backend_for(target).kind
        names = list(dict.fromkeys(d for shape in shapes.values() for d in shape if isinstance(d, str)))
        self.shapes = shapes
        first = self._translate(probe_bindings(names)[0])  # (the names it uses: no symbol may be one)
        taken = set(re.findall(r"[A-Za-z_]\w*", first.source()))
        symbol = {n: _symbol(n, taken) for n in names}
        self.symbols = tuple(symbol.values())
        self.shapes = {k: tuple(symbol[d] if isinstance(d, str) else d for d in v) for k, v in shapes.items()}
        self.program = first  # the program at one probe size (what `tcc onnx --run` makes inputs for)
        self._params = [first.inputs[n] for n in self.input_names]
        self._notes = list(first.notes)
        self.graph = GenericGraph(self.symbols, target, output_names, options, self.label,
                                  lambda bindings: [(b, self._translate(b)) for b in bindings])
        probes = probe_bindings(self.symbols)
        self._probe = probes[0]
        self.graph.learn([(probes[0], first), *((b, self._translate(b)) for b in probes[1:])])
        template = self.graph.template
        self.source = template.program.source() if template is not None else first.source()

    def _translate(self, binding: dict[str, int]) -> Program:
        """The graph translated for one binding of its symbols."""
        concrete = {k: tuple(binding[d] if isinstance(d, str) else d for d in v) for k, v in self.shapes.items()}
        return translate(self._proto, concrete, self._constants, winograd=True)

    def compile(self, progress: bool | None = None, jobs: int | None = None) -> OnnxGenericModel:
        """Build the shape-generic kernels now (a size no template fits compiles on its call)."""
        self.graph.build()
        return self

    @property
    def compiles(self) -> int:
        """Kernels built (not found in a cache) by this model so far, at every size."""
        return self.graph.compiles

    def __call__(self, *args: Any, out: Any = None, **named: Any) -> Any:
        """Run on the inputs (positionally, or by name) at any size their symbols take."""
        if named:
            missing = [n for n in self.input_names[len(args):] if n not in named]
            if missing:
                raise TccArgumentError(f"missing model input(s) {', '.join(missing)}")
            args = (*args, *(named[n] for n in self.input_names[len(args):]))
        if len(args) != len(self.input_names):
            raise TccArgumentError(f"the model takes {len(self.input_names)} input(s) "
                                   f"({', '.join(self.input_names)}), got {len(args)}")
        binding = solve([self.shapes[n] for n in self.input_names], args, self.input_names)
        bound = self.graph.bound(binding, lambda: self._translate(binding))
        return self.graph.run(bound, args, self._params, out)

    def lower(self, stage: str = "scheduled") -> str:
        """The text of ``stage`` for each distinct shape-generic kernel (its symbols left variables)."""
        kernels = self.graph.kernels()
        return "\n".join(f"# kernel {n + 1} of {len(kernels)}\n" + k.op.stage_text(
            {s: self._probe[s] for s in k.op.te.symbols}, stage) for n, k in enumerate(kernels))

    def notes(self) -> list[str]:
        return list(self._notes)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}[{', '.join(map(str, self.shapes[n]))}]" for n in self.input_names)
        return f"<tcc.onnx model ({shapes}) -> ({', '.join(self.output_names)}) on {self.target}, shape-generic>"


def _symbol(name: str, taken: set[str]) -> str:
    """A shape symbol's name from a ``dim_param``: an identifier that names nothing else."""
    symbol = re.sub(r"\W", "_", name) or "d"
    if symbol[0].isdigit() or symbol in RESERVED or keyword.iskeyword(symbol) or \
            re.fullmatch(r"[xytdik]\d*(_\d+)?", symbol):
        symbol = "n_" + symbol
    while symbol in taken:
        symbol += "_"
    taken.add(symbol)
    return symbol


def _symbolic_shapes(proto: Any, given: dict[str, Sequence[int]], fixed: set[str]) -> dict[str, tuple[int | str, ...]]:
    """Each input's shape: its ints, and the names of the dims the model leaves symbolic (an
    unnamed one gets ``input_dim``); an input of ``given`` has the shape given."""
    shapes: dict[str, tuple[int | str, ...]] = {}
    for vi in proto.graph.input:
        if vi.name in fixed:
            continue
        if vi.name in given:
            shapes[vi.name] = tuple(int(d) for d in given[vi.name])
            continue
        shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or f"{vi.name}_{n}"
                                for n, d in enumerate(vi.type.tensor_type.shape.dim))
    return shapes


def load(model: Any, target: str | Target = "cpu", input_shapes: dict[str, Sequence[int]] | None = None,
         constants: dict[str, Any] | None = None, compile_now: bool = True, progress: bool | None = None,
         jobs: int | None = None, **options: Any) -> OnnxModel | OnnxGenericModel:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) and compile it for ``target``.

    ``input_shapes`` gives the shapes of inputs whose dims the model leaves symbolic; without
    it, on the CPU, such dims stay shape symbols (an :class:`OnnxGenericModel`: no recompiles at
    new sizes). ``constants`` fixes graph inputs to known values. ``jobs`` is how many processes
    build the kernels (see ``OnnxModel.compile``). ``options`` go to ``tcc.compile``.
    """
    proto = _read_model(model)
    given = set(constants or {}) | {t.name for t in proto.graph.initializer}
    inputs = [vi.name for vi in proto.graph.input if vi.name not in given]
    outputs = [vi.name for vi in proto.graph.output]
    shapes = _symbolic_shapes(proto, input_shapes or {}, given)
    if not backend_for(target).is_gpu and any(isinstance(d, str) for s in shapes.values() for d in s):
        check_options(options, target)
        generic = OnnxGenericModel(proto, target, shapes, constants, outputs, options)
        return generic.compile(progress, jobs) if compile_now else generic
    program = translate(proto, input_shapes, constants, winograd=not backend_for(target).is_gpu)
    compiled = OnnxModel(program, target, inputs, outputs, options)
    return compiled.compile(progress, jobs) if compile_now else compiled
