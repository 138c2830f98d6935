"""ONNX models as one tcc op: ``tcc.onnx.load("model.onnx")`` returns a compiled callable.

The graph becomes tcc source (``model.source``): one ``op`` whose parameters are the graph's
inputs and weights and whose statements are its nodes, so the fusion pass fuses across nodes
exactly as it fuses a hand-written op (conv + bias + BatchNorm folded into the weights + relu
become one kernel; chains of elementwise nodes one loop nest), and every stage prints
(``model.lower(stage="fused")``). On the CPU the op then runs as the kernels
``onnx_kernels`` cuts it into where fusion joins nothing, each distinct one compiled once.
Shapes are static: they come from the model or from ``input_shapes``. A node tcc cannot
import is an ``OnnxImportError`` naming it, raised before anything is compiled or run.

``onnx`` is an optional dependency (``pip install onnx``): it is imported only when a model is
loaded, so ``import tcc`` never needs it.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from tcc import cuda as tcc_cuda
from tcc.compiler import Library, Op, check_options
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccArgumentError
from tcc.interop import onnx_attention as attention
from tcc.interop import onnx_einsum as einsum
from tcc.interop import onnx_index as index
from tcc.interop import onnx_kernels as kernels
from tcc.interop import onnx_math as math_ops
from tcc.interop import onnx_nn as nn
from tcc.interop import onnx_ops as ops
from tcc.interop import onnx_resize as resize
from tcc.interop import onnx_scatter as scatter
from tcc.interop import onnx_shapes as shapes
from tcc.interop.onnx_build import Workers
from tcc.interop.onnx_graph import NUMPY_DTYPES, NeedsValue, Node, OnnxImportError, Program, Value
from tcc.interop.onnx_kernels import Kernel
from tcc.interop.onnx_memory import Arena, Arenas, BufferPlan
from tcc.interop.onnx_ops import ONNX_DTYPES, tcc_dtype
from tcc.runtime import cache
from tcc.runtime.backend import backend_for
from tcc.runtime.binding import as_host_array
from tcc.target import Target, host_cores

__all__ = ["HANDLERS", "NeedsValue", "OnnxImportError", "OnnxModel", "load", "translate"]

PARALLEL_AFTER_S = 4.0  # CPU seconds of compiling left (estimated) from which a worker helps (~1 s to start)
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
    "ScatterElements": scatter.scatter_elements, "ScatterND": scatter.scatter_nd,
    "TopK": scatter.top_k,
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
    "Einsum": einsum.einsum, "Resize": resize.resize,
    "RMSNormalization": attention.rms_norm, "RotaryEmbedding": attention.rotary_embedding,
    "Attention": attention.attention,
}


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
            raise OnnxImportError(f"input {vi.name!r}: dimension {n} is {d.dim_param or 'unknown'}; tcc compiles "
                                  "for static shapes",
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


class OnnxModel:
    """A compiled ONNX model: call it with the graph's inputs (positionally, or by name).

    On the CPU the program runs as a sequence of kernels (``tcc.interop.onnx_kernels``), each
    distinct one compiled once; on CUDA as one kernel.
    """

    def __init__(self, program: Program, target: str | Target, input_names: list[str], output_names: list[str],
                 options: dict[str, Any]):
        self.program = program
        self.source = program.source()
        self.target = backend_for(target).kind  # a tcc.target value goes on to tcc.compile
        self._gpu = backend_for(target).is_gpu
        self.input_names = input_names
        self.output_names = output_names
        self._compile_target = target
        self._options = options
        check_options(options, self.target)
        self.kernels: list[Kernel] = self._split()
        self._ops: dict[tuple[str, tuple[str, ...]], Op] = {}  # by source and constants: the distinct kernels
        self._inputs = [program.inputs[name] for name in input_names]
        self._weights = dict(program.weights)
        self._results = tuple(name for name, _, _ in program.results)
        self._on_device = not self._gpu  # CUDA weights are copied over once, on the first call
        self._arenas: Arenas | None = None  # buffers for the intermediates, planned on the first call (CPU)
        self.compile_seconds = 0.0

    def __repr__(self) -> str:
        return f"<tcc.onnx model ({', '.join(self.input_names)}) -> ({', '.join(self.output_names)}) on {self.target}>"

    @functools.cached_property
    def library(self) -> Library:
        """The whole graph as one op (checked; its stages up to ``fused`` print the graph)."""
        return tcc_compile(self.source, target=self._compile_target, **self._options)

    @property
    def op(self) -> Op:
        return self.library.model

    def _split(self) -> list[Kernel]:
        """The kernels, from the disk cache when this compiler split the same program before."""
        if self._gpu:
            return [kernels.whole(self.program)]
        disk = cache.DiskCache(cache.cache_dir())
        key = cache.make_key(cache.compiler_fingerprint(), "onnx-kernels", self.source)
        stored = disk.get_json(key)
        if stored is not None:
            try:
                return [Kernel.from_json(k) for k in stored["kernels"]]
            except (KeyError, TypeError, ValueError):
                pass  # a stale entry: split again
        split = kernels.split(self.program, self.op.te)
        disk.put_json(key, {"kernels": [k.to_json() for k in split]})
        return split

    def _constants(self, k: Kernel) -> tuple[str, ...]:
        """The kernel's parameters that are weights (constant_params of tcc.compile on the CPU:
        their packing is done once, not per call), by their names in its source."""
        if self._gpu:
            return ()
        return tuple(f"x{n}" for n, name in enumerate(k.params) if name in self._weights)

    def _kernel_op(self, distinct: tuple[str, tuple[str, ...]]) -> Op:
        """The op of a kernel's source compiled with these constant parameters."""
        op = self._ops.get(distinct)
        if op is None:
            source, constants = distinct
            options = {**self._options, "constant_params": constants} if constants else self._options
            op = self._ops[distinct] = next(iter(tcc_compile(source, target=self._compile_target, **options)))
        return op

    def compile(self, progress: bool | None = None, jobs: int | None = None) -> OnnxModel:
        """Build every distinct kernel now (from the disk cache when it is there); a progress bar
        appears when this takes more than a second. When the kernels left look like more than
        ``PARALLEL_AFTER_S`` of work (the time of those built so far, per kernel), ``jobs - 1``
        worker processes (default: one per CPU this process may use, less this one) build from
        the other end of the list, through the disk cache."""
        start = time.perf_counter()
        distinct = list(dict.fromkeys((k.source, self._constants(k)) for k in self.kernels))
        with tqdm(total=len(distinct), desc="tcc.onnx: compiling", unit="kernel", delay=1.0,
                  disable=progress is False, leave=False) as bar:
            self._build(distinct, jobs if jobs is not None else host_cores(), lambda: bar.update(1))
            for item in distinct:  # the workers' kernels, from the disk cache (or built here if one failed)
                self._kernel_op(item).kernel({})
        self._calls = [(self._kernel_op((k.source, self._constants(k))), k.params, k.results) for k in self.kernels]
        self._prepare()
        self.compile_seconds = time.perf_counter() - start
        return self

    def _prepare(self) -> None:
        """Run each kernel's prepare function on its weights now (packed GEMM panels), once per
        layer, rather than on the first call."""
        for op, params, _ in self._calls:
            prepared = getattr(op.kernel({}), "prepared", None)
            if prepared is not None:
                weights = [self._weights[params[int(n[1:])]] for n in prepared.sources]
                prepared.arrays(tuple(weights), [np.ascontiguousarray(w).ctypes.data for w in weights])

    def _build(self, todo: list[tuple[str, tuple[str, ...]]], jobs: int, done: Callable[[], None]) -> None:
        """Build the kernels ``todo`` here, from the front; from the point where those left look
        like more than ``PARALLEL_AFTER_S`` of work, with workers taking from the back."""
        parallel = jobs > 1 and not self._gpu and cache.cache_dir() is not None
        todo, workers, built, start = list(todo), None, 0, time.process_time()
        try:
            while (item := workers.take() if workers else todo.pop(0) if todo else None) is not None:
                self._kernel_op(item).kernel({})
                built += 1
                done()
                left = (time.process_time() - start) / built * len(todo)  # CPU time: what a worker takes over
                if parallel and workers is None and len(todo) > 1 and left > PARALLEL_AFTER_S:
                    workers = Workers(todo, self._options, jobs - 1, done)
        except BaseException:
            if workers is not None:
                workers.join(kill=True)
            raise
        if workers is not None:
            workers.join()

    def __call__(self, *args: Any, out: Any = None, **named: Any) -> Any:
        """Run on the inputs (NumPy arrays, DLPack or torch tensors); ``out=`` an array (a tuple
        for several outputs) to write into."""
        if named:
            missing = [n for n in self.input_names[len(args):] if n not in named]
            if missing:
                raise TccArgumentError(f"missing model input(s) {', '.join(missing)}")
            args = (*args, *(named[n] for n in self.input_names[len(args):]))
        if len(args) != len(self.input_names):
            raise TccArgumentError(f"the model takes {len(self.input_names)} input(s) "
                                   f"({', '.join(self.input_names)}), got {len(args)}")
        if not self._on_device:
            self._weights = {n: tcc_cuda.to_device(np.ascontiguousarray(w)) for n, w in self._weights.items()}
            self._on_device = True
        calls = self.__dict__.get("_calls") or self.compile()._calls
        values = {**self._weights, **dict(zip(self._inputs, args))}
        arena = self._arenas.take() if self._arenas is not None else None
        try:
            self._run_kernels(calls, values, arena, out)
        finally:
            if arena is not None:
                self._arenas.give_back(arena)
        if self._arenas is None and not self._gpu:  # the first call: plan the buffers of the next ones
            self._arenas = self._plan_buffers(calls, values)
        outputs = [values[name] for name in self._results]
        if out is not None and not (calls and calls[-1][2] == self._results):
            outputs = _copy_out(outputs, out)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _plan_buffers(self, calls: list[tuple[Op, tuple[str, ...], tuple[str, ...]]],
                      values: dict[str, Any]) -> Arenas:
        """The buffer plan for the intermediates, from the shapes and dtypes of one call's ``values``."""
        layouts = {name: (values[name].shape, values[name].dtype) for _, _, results in calls for name in results}
        return Arenas(BufferPlan([(params, results) for _, params, results in calls], layouts, self._results))

    def release_buffers(self) -> None:
        """Let go of the intermediates' buffers kept between calls (``tcc.interop.onnx_memory``:
        96 MB for ResNet-18 at batch 8); the next call runs without them and plans them again."""
        self._arenas = None

    def _run_kernels(self, calls: list[tuple[Op, tuple[str, ...], tuple[str, ...]]], values: dict[str, Any],
                     arena: Arena | None, out: Any) -> None:
        """Run the kernels in order, adding their results to ``values``; intermediates go to the
        arena's buffers where there is one (``tcc.interop.onnx_memory``)."""
        last = len(calls) - 1
        for n, (op, params, results) in enumerate(calls):
            if n == last and results == self._results:  # the last kernel writes the outputs
                into = out
            else:
                into = arena.outputs(results) if arena is not None else None
            got = op(*[values[p] for p in params], out=into)
            got = got if len(results) > 1 else (got,)
            if arena is not None:
                arena.keep(results, got)
            values.update(zip(results, got))

    def lower(self, stage: str = "fused") -> str:
        """The text of any compilation stage (``te fused loops scheduled llvm asm cuda ptx``): up to
        ``fused`` the whole graph as one op (with the kernels it is cut into), after that each
        distinct kernel."""
        if stage in ("ast", "te") or len(self.kernels) == 1 and self.kernels[0].source == self.source:
            return self.op.stage_text({}, stage)
        if stage == "fused":
            return self.op.stage_text({}, stage) + "\n" + self._describe_kernels()
        distinct = list(dict.fromkeys((k.source, self._constants(k)) for k in self.kernels))
        return "\n".join(f"# kernel {n + 1} of {len(distinct)}\n" + self._kernel_op(item).stage_text({}, stage)
                         for n, item in enumerate(distinct))

    def _describe_kernels(self) -> str:
        first: dict[str, int] = {}
        lines = [f"kernels: {len(self.kernels)}, {len(set(k.source for k in self.kernels))} distinct"]
        for n, k in enumerate(self.kernels):
            same = first.setdefault(k.source, n + 1)
            again = f" (the same code as kernel {same})" if same != n + 1 else ""
            lines.append(f"    kernel {n + 1}: {', '.join(k.results)} from {', '.join(k.params) or 'nothing'}{again}")
        return "\n".join(lines)

    def notes(self) -> list[str]:
        """What the import decided (BatchNorm folds, precomputed scales)."""
        return list(self.program.notes)


def _copy_out(outputs: list[Any], out: Any) -> list[Any]:
    """The outputs copied into the caller's ``out=`` arrays (NumPy arrays or CPU tensors)."""
    targets = list(out) if isinstance(out, tuple | list) else [out]
    if len(targets) != len(outputs):
        raise TccArgumentError(f"out= needs {len(outputs)} array(s), got {len(targets)}")
    for target, value in zip(targets, outputs):
        view = as_host_array(target, "out=")
        if view.shape != value.shape or view.dtype != value.dtype:
            raise TccArgumentError(f"out= must be {value.dtype}{list(value.shape)}, got {view.dtype}{list(view.shape)}")
        np.copyto(view, value)
    return targets


def load(model: Any, target: str | Target = "cpu", input_shapes: dict[str, Sequence[int]] | None = None,
         constants: dict[str, Any] | None = None, compile_now: bool = True, progress: bool | None = None,
         jobs: int | None = None, **options: Any) -> OnnxModel:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) and compile it for ``target``.

    ``input_shapes`` gives the shapes of inputs whose dims the model leaves symbolic;
    ``constants`` fixes graph inputs to known values. ``jobs`` is how many processes build the
    kernels (see ``OnnxModel.compile``). ``options`` go to ``tcc.compile``.
    """
    proto = _read_model(model)
    program = translate(proto, input_shapes, constants, winograd=not backend_for(target).is_gpu)
    given = set(constants or {}) | {t.name for t in proto.graph.initializer}
    inputs = [vi.name for vi in proto.graph.input if vi.name not in given]
    compiled = OnnxModel(program, target, inputs, [vi.name for vi in proto.graph.output], options)
    return compiled.compile(progress, jobs) if compile_now else compiled
