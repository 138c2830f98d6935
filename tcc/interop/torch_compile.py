"""``torch.compile(model, backend="tcc")``: Dynamo's graphs compiled by the graph engine.

Dynamo captures the model's Python as FX graphs; AOTAutograd traces each into a forward and (when
something needs gradients) a backward graph of core ATen calls, after the core decompositions
(``torch._decomp.core_aten_decompositions``: ``gelu_backward`` or ``native_layer_norm_backward``
become elementwise calls and sums). Each of those graphs comes to :func:`compile_graph`:

1. every call is tried on the engine (``torch_aten``: ATen calls onto the handlers the ONNX front
   door uses); the ones it refuses stay PyTorch's and are listed once (a warning per operator);
2. ``CapabilityBasedPartitioner`` joins the accepted calls into subgraphs between the refused
   ones; each subgraph becomes one ``graph.Program``, compiled by ``graph_model.GraphModel``
   (kernels cut where fusion joins nothing, built once per machine, buffers kept between calls);
3. the FX graph then runs as before, its subgraphs replaced by the compiled programs.

A graph Dynamo captures with static shapes compiles for them (Dynamo recompiles for others). A
graph it captures with symbolic shapes (``dynamic=True``, or its automatic dynamic shapes after a
second size) is traced by AOTAutograd for each call's shapes, and each subgraph's program joins
a ``graph_dynamic.GenericGraph`` over Dynamo's shape symbols: the first size of a family (the
symbols at 1) also translates the subgraphs at a few probe sizes (PyTorch runs those), so its
kernels compile once with every symbol dynamic, and a later size compiles no kernel.
:func:`explain` compiles a model and tells which operators run where.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import operator
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch  # the optional dependency of the torch front door
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from tcc.errors import TccError
from tcc.interop.graph import Program
from tcc.interop.graph_dynamic import GenericGraph, near
from tcc.interop.graph_model import GraphModel
from tcc.interop.torch import is_registered
from tcc.interop.torch_aten import lower_node, operator_name, supported
from tcc.interop.torch_lowering import Lowering, Unsupported, static_shape, tcc_dtype
from tcc.runtime.backend import backend_for

aten = torch.ops.aten  # (PyTorch's operator namespace: its private-looking names are its own)

__all__ = ["Explanation", "backend", "compile_graph", "explain", "recording"]

_WARNED: set[str] = set()  # operators already reported as left to PyTorch (once per process)
_RECORDS: list[Explanation] = []  # where explain() collects what the backend did


@dataclass
class Explanation:
    """Which operators of the compiled graphs run in tcc and which in PyTorch (and why)."""

    graphs: int = 0
    partitions: int = 0
    tcc: Counter = field(default_factory=Counter)
    eager: Counter = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"tcc.torch.explain: {self.graphs} graph(s), {self.partitions} tcc program(s)",
                 f"  in tcc ({sum(self.tcc.values())} calls): "
                 + (", ".join(f"{op} x{n}" for op, n in sorted(self.tcc.items())) or "none"),
                 f"  in PyTorch ({sum(self.eager.values())} calls): "
                 + (", ".join(f"{op} x{n}" for op, n in sorted(self.eager.items())) or "none")]
        lines += [f"    {op}: {why}" for op, why in sorted(self.reasons.items())]
        return "\n".join(lines)


# ---------------------------------------------------------------- which calls the engine takes


def _trial(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """The calls the engine refuses, with the reason: every call is lowered once into a scratch
    program, a refused call's result standing in as an input of the calls that read it."""
    t = Lowering(Program())
    env: dict[torch.fx.Node, Any] = {}
    refused: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            if node.op != "output":
                env[node] = _stand_in(t.p, node)
            continue
        if node.target is operator.getitem and node.args[0] in refused:
            refused[node] = refused[node.args[0]]  # a result of a call left to PyTorch
            env[node] = _stand_in(t.p, node)
            continue
        if not supported(node):
            refused[node] = "a tcc.torch op: its own compiled kernel" if is_registered(node.target) else \
                f"{operator_name(node)} has no tcc lowering" if node.op == "call_function" else node.op
            env[node] = _stand_in(t.p, node)
            continue
        try:
            env[node] = lower_node(t, node, env)
        except (TccError, KeyError, IndexError, ValueError, TypeError, AttributeError, ZeroDivisionError) as exc:
            refused[node] = str(exc).splitlines()[0] if isinstance(exc, TccError) else f"{type(exc).__name__}: {exc}"
            env[node] = _stand_in(t.p, node)
    return refused


def _stand_in(p: Program, node: torch.fx.Node) -> Any:
    """An input of the program with the shape and dtype FX recorded for ``node`` (a tuple for a
    call with several results), or None for what is no tensor of tcc's."""
    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        return [_input(p, node.name, v) for v in val]
    return _input(p, node.name, val)


def _input(p: Program, name: str, val: Any) -> Any:
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return p.add_input(name, static_shape(val.shape), tcc_dtype(val.dtype))
    except Unsupported:
        return None


class _Accepted(OperatorSupport):
    def __init__(self, refused: dict[torch.fx.Node, str]):
        super().__init__()
        self.refused = refused

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node not in self.refused


# ---------------------------------------------------------------- one subgraph as a tcc program


class _Program(torch.nn.Module):
    """A subgraph's compiled program in the place of the subgraph: torch tensors in and out.

    It compiles on its first call, from the tensors it is given. In an inference graph
    (``frozen``) on the CPU, the parameters it reads are the program's weights (constant
    parameters: their GEMM panels packed once, uniform ones written as literals, as ``tcc.onnx``
    binds a model's initializers); a parameter changed since (its version counter, or another
    tensor in its place) compiles the program again from the new values. A program tcc fails to
    compile (an error of tcc's) leaves its subgraph to PyTorch, with a warning."""

    def __init__(self, sub: torch.fx.GraphModule, device: torch.device, frozen: bool, generic: _Part | None = None):
        super().__init__()
        self.sub = sub
        self.generic = generic  # its place among the subgraphs of a graph with symbolic shapes
        self.device = device
        # weights baked in where the backend packs constant parameters once (the CPU's GEMMs)
        self.frozen = frozen and "constant_params" in backend_for(device.type).options
        self.model: GraphModel | None = None
        self.failed = False  # tcc could not compile it: the subgraph runs in PyTorch
        self.weights: dict[int, tuple[torch.Tensor, int]] = {}  # argument position -> (parameter, its version)
        self.built = False
        self.placeholders = [node for node in sub.graph.nodes if node.op == "placeholder"]
        out = next(node for node in sub.graph.nodes if node.op == "output").args[0]
        self.single = not isinstance(out, list | tuple)
        self.results: list[torch.fx.Node] = [out] if self.single else list(out)
        # what the program computes: each result once, less the views of inputs (a saved
        # input, a transposed weight) that PyTorch makes without a copy
        self.computed = list(dict.fromkeys(r for r in self.results if not _input_view(r)))

    def _build(self, args: Sequence[torch.Tensor]) -> None:
        rebuilt = self.built  # (a weight changed since)
        p = Program()
        t = Lowering(p)
        env: dict[torch.fx.Node, Any] = {}
        inputs = []
        self.weights = {n: (a, a._version) for n, a in enumerate(args) if self.frozen and
                        isinstance(a, torch.nn.Parameter)}
        for n, node in enumerate(self.placeholders):
            val = node.meta["val"]
            dtype = tcc_dtype(val.dtype)
            if n in self.weights:
                env[node] = p.constant(args[n].detach().numpy(), dtype, node.name)
            else:
                env[node] = p.add_input(node.name, static_shape(val.shape), dtype)
                inputs.append(node.name)
        for node in self.sub.graph.nodes:
            if node.op == "call_function":
                env[node] = lower_node(t, node, env)
        for n, r in enumerate(self.computed):
            p.add_result(f"out{n}", env[r])
        self.built = True
        outputs = [f"out{n}" for n in range(len(p.results))]
        if self.computed and self.generic is not None:
            self.model = self.generic.model(p, self.device.type, inputs, outputs, fresh=rebuilt)
        elif self.computed:
            self.model = GraphModel(p, self.device.type, inputs, outputs, {})  # (torch's device names are tcc's)
            self.model.label = "tcc.torch"
            self.model.compile()

    def _stale(self, args: Sequence[torch.Tensor]) -> bool:
        return any(args[n] is not w or w._version != version for n, (w, version) in self.weights.items())

    def forward(self, *args: torch.Tensor) -> Any:
        if self.failed:
            return self.sub(*args)
        if not self.built or self.weights and self._stale(args):
            try:
                self._build(args)
            except TccError as exc:  # a program tcc cannot compile: the subgraph runs in PyTorch
                self.failed = True
                warnings.warn(f"tcc.torch: a program of {len(self.sub.graph.nodes)} nodes runs in PyTorch: "
                              f"{str(exc).splitlines()[0]}", stacklevel=2)
                return self.sub(*args)
        if self.generic is not None and self.generic.probe:
            return self.sub(*args)  # a probe's program is seen, not compiled: PyTorch runs it
        if self.model is EAGER:  # the first size of a new family: seen, run by PyTorch this once
            self.built = False
            return self.sub(*args)
        weights = self.weights
        got = self.model(*[a.detach().contiguous() for n, a in enumerate(args) if n not in weights]) \
            if self.model is not None else ()
        computed = dict(zip(self.computed, (_to_torch(g, self.device) for g in (got if isinstance(got, tuple)
                                                                                 else (got,)))))
        inputs = dict(zip(self.placeholders, args))
        outs = [computed[r] if r in computed else _replay(r, inputs) for r in self.results]
        return outs[0] if self.single else tuple(outs)


VIEWS = {aten.view.default, aten._unsafe_view.default, aten.permute.default, aten.t.default, aten.transpose.int,
         aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
         aten.alias.default, aten.slice.Tensor, aten.select.int}


def _input_view(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an input of the subgraph or a chain of views of one."""
    while node.op == "call_function" and node.target in VIEWS:
        node = node.args[0]
    return node.op == "placeholder"


def _replay(node: torch.fx.Node, inputs: dict[torch.fx.Node, torch.Tensor]) -> torch.Tensor:
    """The view of an input that ``node`` is, made by PyTorch."""
    if node.op == "placeholder":
        return inputs[node]
    return node.target(_replay(node.args[0], inputs), *node.args[1:], **node.kwargs)  # type: ignore


def _to_torch(x: Any, device: torch.device) -> torch.Tensor:
    """A result as a torch tensor, without a copy: CPU results are NumPy arrays; CUDA ones torch
    tensors (the inputs were) or ``tcc.cuda.Array`` (DLPack keeps it alive)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray | np.generic):
        return torch.from_numpy(np.asarray(x))
    return torch.from_dlpack(x)


# ---------------------------------------------------------------- the backend


def _device(example_inputs: Sequence[Any]) -> torch.device:
    devices = {a.device for a in example_inputs if isinstance(a, torch.Tensor)}
    return next(iter(devices)) if len(devices) == 1 else torch.device("cpu")


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], inference: bool = False,
                  generic: _Generic | None = None) -> Callable:
    """One AOTAutograd graph (forward, backward, or ``inference``: a forward that records no
    graph, whose parameters become constants) with its accepted calls in tcc programs (a boxed
    callable, as AOTAutograd calls it); ``generic``: the graph is one size of a graph with
    symbolic shapes, its programs run by shape-generic kernels."""
    refused = _trial(gm)
    record = _RECORDS[-1] if _RECORDS else None
    for node, why in refused.items():
        if node.target is operator.getitem:
            continue  # its call is listed
        name = operator_name(node)
        if record is not None:
            record.eager[name] += 1
            record.reasons.setdefault(name, why)
        if name not in _WARNED and not is_registered(node.target):
            _WARNED.add(name)
            warnings.warn(f"tcc.torch: {name} runs in PyTorch ({why})", stacklevel=2)
    partitioner = CapabilityBasedPartitioner(gm, _Accepted(refused), allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    device = _device(example_inputs)
    for position, node in enumerate(n for n in list(fused.graph.nodes)
                                    if n.op == "call_module" and n.target.startswith("fused_")):
        sub = getattr(fused, node.target)
        if record is not None:
            record.partitions += 1
            record.tcc.update(operator_name(n) for n in sub.graph.nodes if n.op == "call_function")
        part = _Part(generic, (generic.kind, position)) if generic is not None else None
        setattr(fused, node.target, _Program(sub, device, inference, part))
    if record is not None:
        record.graphs += 1
    fused.recompile()
    return make_boxed_func(fused.forward)


_aot = aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph,
                    inference_compiler=functools.partial(compile_graph, inference=True),
                    decompositions=core_aten_decompositions())


def _aot_for(generic: _Generic) -> Callable:
    """AOTAutograd with the engine for one size of a graph with symbolic shapes."""
    return aot_autograd(fw_compiler=functools.partial(compile_graph, generic=replace(generic, kind="forward")),
                        bw_compiler=functools.partial(compile_graph, generic=replace(generic, kind="backward")),
                        inference_compiler=functools.partial(compile_graph, inference=True,
                                                             generic=replace(generic, kind="inference")),
                        decompositions=core_aten_decompositions())


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
    """The ``torch.compile`` backend (``backend="tcc"`` once ``tcc.torch`` is imported, or
    ``backend=tcc.torch.backend``). A graph Dynamo made with symbolic shapes is traced again for
    each set of shapes it is called with, its programs served by shape-generic kernels
    (:class:`_Specialised`)."""
    if _symbolic(gm):
        return _Specialised(gm, kwargs)
    return _aot(gm, example_inputs, **kwargs)


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(value, torch.SymInt | torch.SymFloat) or isinstance(value, torch.Tensor) and \
                not all(isinstance(d, int) for d in value.shape):
            return True
    return False


EAGER = object()  # a program that PyTorch runs this once (GenericGraph.bound)


@dataclass
class _Generic:
    """One size of a graph with symbolic shapes: the binding of Dynamo's shape symbols, the
    graph's :class:`GenericGraph` per subgraph (shared by every size), and whether this size is a
    probe (its programs are seen, not compiled)."""

    symbols: tuple[str, ...]
    binding: dict[str, int]
    graphs: dict[tuple[str, int], GenericGraph]
    probe: bool = False
    kind: str = ""  # of the AOTAutograd graph: forward, backward or inference


@dataclass
class _Part:
    """A subgraph's place (forward/backward/inference, position) in one size of such a graph."""

    of: _Generic
    key: tuple[str, int]

    @property
    def probe(self) -> bool:
        return self.of.probe

    def model(self, p: Program, target: str, inputs: list[str], outputs: list[str], fresh: bool = False
              ) -> Callable | None:
        """The program ``p`` (this size's) run by the subgraph's shape-generic kernels; a probe's
        program is only seen. ``fresh``: a weight baked into the kernels changed, so they start
        over."""
        graph = None if fresh else self.of.graphs.get(self.key)
        if graph is None:
            graph = self.of.graphs[self.key] = GenericGraph(self.of.symbols, target, outputs, {}, "tcc.torch",
                                                            defer=True)
        if self.of.probe:
            graph.observe(self.of.binding, p)
            return None
        bound = graph.bound(self.of.binding, lambda: p)
        if bound is None:
            return EAGER
        params = [p.inputs[name] for name in inputs]
        return lambda *args: graph.run(bound, args, params)


class _Specialised:
    """A graph with symbolic shapes, traced by AOTAutograd for the shapes (and integer values)
    of each call; its programs are served by shape-generic kernels over Dynamo's symbols (the
    first size of a family of sizes probes a few others first: see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, kwargs: dict[str, Any]):
        self.gm, self.kwargs = gm, kwargs
        self.compiled: dict[tuple, Callable] = {}
        self.where = _symbol_places(gm)
        self.symbols = tuple(dict.fromkeys(name for name, _, _ in self.where))
        self.graphs: dict[tuple[str, int], GenericGraph] = {}
        self.families: set[frozenset[str]] = set()
        self.items = {n for n, node in enumerate(node for node in gm.graph.nodes if node.op == "placeholder")
                      if any(u.op == "call_method" and u.target == "item" for u in node.users)}

    def __call__(self, *args: Any) -> Any:
        key = (torch.is_grad_enabled(), *((tuple(a.shape), a.dtype, a.requires_grad, a.device,
                                            a.item() if n in self.items else None)
                                           if isinstance(a, torch.Tensor) else a for n, a in enumerate(args)))
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.compiled[key] = self._trace(args)
        return fn(*args)

    def _trace(self, args: Sequence[Any]) -> Callable:
        """The graph traced by AOTAutograd for the shapes of ``args``, its programs shape-generic
        on the CPU (CUDA kernels specialise on shapes: there each shape compiles its own)."""
        if backend_for(_device(args).type).is_gpu:
            return _aot(_floats_fixed(self.gm, args), list(args), **self.kwargs)
        binding = {name: int(args[n].shape[d] if d is not None else args[n]) for name, n, d in self.where}
        ones = frozenset(s for s, v in binding.items() if v == 1)
        if self.symbols and ones not in self.families:
            self.families.add(ones)
            self._probe(args, binding)
        generic = _Generic(self.symbols, binding, self.graphs)
        return _aot_for(generic)(_floats_fixed(self.gm, args), list(args), **self.kwargs)

    def _probe(self, args: Sequence[Any], around: dict[str, int]) -> None:
        """Trace and run the graph at a few sizes around the call's (inputs resized from ``args``),
        so that the subgraphs' programs are seen at several bindings before the first compiles."""
        for binding in near(around, self.symbols):
            resized = [_resized(a, self._shape(n, binding)) if isinstance(a, torch.Tensor)
                       and not isinstance(a, torch.nn.Parameter) else self._value(n, binding, a)
                       for n, a in enumerate(args)]
            try:
                gm = _floats_fixed(self.gm, resized)  # (in the call's grad mode: a forward graph is probed)
                _aot_for(_Generic(self.symbols, binding, self.graphs, probe=True))(gm, resized)(*resized)
            except Exception:  # noqa: BLE001 - a size the model refuses: the calls' own sizes are fitted instead
                return

    def _placeholder(self, n: int) -> Any:
        return [node for node in self.gm.graph.nodes if node.op == "placeholder"][n].meta.get("example_value")

    def _shape(self, n: int, binding: dict[str, int]) -> tuple[int, ...]:
        return tuple(_evaluate(d, binding) for d in self._placeholder(n).shape)

    def _value(self, n: int, binding: dict[str, int], arg: Any) -> Any:
        value = self._placeholder(n)
        return _evaluate(value, binding) if isinstance(value, torch.SymInt) else arg


def _floats_fixed(gm: torch.fx.GraphModule, args: Sequence[Any]) -> torch.fx.GraphModule:
    """``gm`` with each ``.item()`` of an input replaced by the value in ``args``: Dynamo passes
    the floats it leaves unspecialised (a layer norm's eps, an embedding's ``norm_type``) as 0-d
    tensors read back by ``.item()``, which AOTAutograd cannot trace for static shapes. (Their
    values are part of the key a graph is traced again for.)"""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    items = [(node, user) for node in placeholders for user in node.users
             if user.op == "call_method" and user.target == "item"]
    if not items:
        return gm
    graph = copy.deepcopy(gm.graph)
    copies = {node.name: node for node in graph.nodes}
    for node, item in items:
        value = args[placeholders.index(node)].item()
        read = copies[item.name]
        for user in list(read.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, r=read, v=value: v if a is r else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, r=read, v=value: v if a is r else a)
        graph.erase_node(read)
    return torch.fx.GraphModule(gm, graph)


def _symbol_places(gm: torch.fx.GraphModule) -> list[tuple[str, int, int | None]]:
    """Where each of Dynamo's shape symbols is a placeholder's value or one of its dims:
    (symbol, placeholder position, dim or None)."""
    places = []
    for n, node in enumerate(node for node in gm.graph.nodes if node.op == "placeholder"):
        value = node.meta.get("example_value")
        dims = [(None, value)] if isinstance(value, torch.SymInt) else \
            list(enumerate(value.shape)) if isinstance(value, torch.Tensor) else []
        for d, dim in dims:
            if isinstance(dim, torch.SymInt) and dim.node.expr.is_Symbol:
                places.append((str(dim.node.expr), n, d))
    return places


def _evaluate(dim: Any, binding: dict[str, int]) -> int:
    """A dim (an int, or a SymInt over Dynamo's symbols) at ``binding``."""
    if not isinstance(dim, torch.SymInt):
        return int(dim)
    expr = dim.node.expr
    return int(expr.subs({s: binding[str(s)] for s in expr.free_symbols}))


def _resized(a: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``a``'s elements repeated (as ``numpy.resize``) into ``shape``: token ids stay ids."""
    flat = a.detach().reshape(-1)
    count = int(np.prod(shape))
    index = torch.arange(count) % max(flat.numel(), 1)
    return flat[index].reshape(shape).requires_grad_(a.requires_grad)


@contextlib.contextmanager
def recording() -> Iterator[Explanation]:
    """What the backend compiles inside the block, operator by operator (forward and backward
    graphs alike)."""
    _RECORDS.append(Explanation())
    try:
        yield _RECORDS[-1]
    finally:
        _RECORDS.pop()


def explain(model: Callable, *inputs: Any, **kw_inputs: Any) -> Explanation:
    """Compile ``model`` with ``backend="tcc"``, run it once on ``inputs`` (forward only) and say
    which operators ran in tcc and which in PyTorch; printing the result lists them."""
    torch._dynamo.reset()
    try:
        with recording() as record, torch.no_grad():
            torch.compile(model, backend=backend, dynamic=False)(*inputs, **kw_inputs)
        return record
    finally:
        torch._dynamo.reset()


def register() -> None:
    """Make ``backend="tcc"`` name :func:`backend` in ``torch.compile``."""
    if "tcc" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name="tcc")(backend)


register()
