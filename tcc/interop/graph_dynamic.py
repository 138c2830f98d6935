"""Graphs with symbolic dims: one set of shape-generic kernels for every size, no recompiles.

A :class:`GenericGraph` serves a graph whose inputs have symbolic dims (an ONNX ``dim_param``,
a SymInt of Dynamo's). Each binding of the symbols gets the graph's program translated for it
(Python work, no compile) and compared with the :class:`~tcc.interop.graph_fit.Template` fitted
on the programs of earlier bindings (or of probes: ``tcc.onnx.load`` translates a few at once):

- when it is the template at this binding, the template's kernels run. They were cut from the
  template (``graph_kernels``) and compiled once with every shape symbol dynamic
  (``tcc.compile(dynamic=True)``), so a new size compiles nothing; a kernel that names a symbol
  no parameter's dim gives takes a *carrier* parameter ``d_S: i8[S]`` (an unread array of that
  length), since a kernel binds its symbols from its arguments' shapes;
- otherwise the template is fitted again with this binding too, and where no template explains
  the programs (a number no ``c * m + d`` of the symbols gives) the graph is compiled for this
  binding alone (``GraphModel``), as is a kernel that cannot be dynamic (a pass that needs a
  constant extent): both said in a debug log (``logging.getLogger("tcc.interop.graph_dynamic")``),
  never silently wrong.

Weights that are the same array at every binding seen are constant parameters (GEMM panels packed
once); a weight that changes with the size (a position-id range folded at import) comes from the
binding's program. ``compiles`` counts the kernels built.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tcc.compiler import Op
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccArgumentError, TccBoundsError, TccCompileError, TccShapeError
from tcc.interop import graph_kernels as kernels
from tcc.interop.graph import Program
from tcc.interop.graph_fit import Binding, NotGeneric, Template, fields, fit, skeleton
from tcc.interop.graph_model import GraphModel, copy_out
from tcc.passes.te.specialize import specialize
from tcc.runtime.binding import as_host_array

__all__ = ["GenericGraph", "GenericKernel", "near", "probe_bindings", "solve"]

log = logging.getLogger(__name__)
PRIMES = (5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43)
NOT_DYNAMIC = (TccCompileError, TccShapeError, TccBoundsError)  # a dynamic kernel refused (build or call's proof)
MAX_SEEN = 8  # programs (their text) kept to fit a template on
MAX_BOUND = 1024  # bindings whose weights and carriers are kept (then forgotten, translated again)


def probe_bindings(symbols: Sequence[str]) -> list[dict[str, int]]:
    """Bindings to translate a graph at before its first call: small distinct primes, then each
    symbol changing alone and all changing (no 1: a dim of 1 broadcasts, a family of its own)."""
    base = {s: PRIMES[n % len(PRIMES)] + 12 * (n // len(PRIMES)) for n, s in enumerate(symbols)}
    return [base, *({**base, s: base[s] + 6} for s in symbols), {s: v + 10 for s, v in base.items()}]


def near(binding: Binding, symbols: Sequence[str]) -> list[dict[str, int]]:
    """Bindings around ``binding`` to probe its family at: each symbol not at 1 one more and one
    less (not down to 1), then all of them two more; those at 1 stay 1."""
    free = [s for s in symbols if binding[s] != 1]
    out = [{**binding, s: binding[s] + d} for s in free for d in (1, -1) if binding[s] + d > 1]
    return out + ([{s: v + 2 if s in free else v for s, v in binding.items()}] if free else [])


class GenericKernel:
    """One kernel's op with every shape symbol dynamic; the first call it cannot serve (a pass
    that needs a constant extent, a read the call's proof refuses) makes it specialise per
    binding from then on (said in the debug log)."""

    def __init__(self, source: str, target: Any, options: dict[str, Any]):
        self.source = source
        self._target, self._options = target, options
        self.op: Op = next(iter(tcc_compile(source, target=target, dynamic=True, **options)))
        self.static: Op | None = None

    @property
    def compiles(self) -> int:
        return self.op.compiles + (self.static.compiles if self.static is not None else 0)

    def build(self, binding: Binding) -> None:
        """Compile the dynamic kernel now (the op's symbols taken from ``binding``)."""
        if self.static is None:
            try:
                self.op.kernel({s: binding[s] for s in self.op.te.symbols})
            except NOT_DYNAMIC as exc:
                self._specialise(exc)

    def __call__(self, *args: Any, out: Any = None) -> Any:
        if self.static is None:
            try:
                return self.op(*args, out=out)
            except NOT_DYNAMIC as exc:
                self._specialise(exc)
        return self.static(*args, out=out)  # type: ignore[misc]

    def _specialise(self, exc: Exception) -> None:
        log.debug("a kernel is specialised per size (%s: %s):\n%s", type(exc).__name__, exc, self.source)
        self.static = next(iter(tcc_compile(self.source, target=self._target, dynamic=False, **self._options)))


@dataclass
class _Bound:
    """What a call at one binding runs: the kernels with their arguments' names, and the values
    that are not the caller's inputs (weights, carriers); or a model compiled for it alone."""

    calls: list[tuple[GenericKernel, tuple[str, ...], tuple[str, ...]]]
    values: dict[str, Any]
    template: Template | None = None
    model: GraphModel | None = None


@dataclass
class _Family:
    """The bindings whose programs have the same skeleton (their text less the numbers) and the
    same symbols at 1 (a dim of 1 broadcasts; a fold at import has a size limit): the programs
    seen, the weights the same at all of them, the template and its kernels."""

    seen: list[tuple[Binding, list[tuple[str, str]]]] = field(default_factory=list)
    fixed: dict[str, np.ndarray] | None = None
    template: Template | None = None
    calls: list[tuple[GenericKernel, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    constants: set[str] = field(default_factory=set)  # the weights the kernels take as constants

    def see(self, binding: Binding, program: Program) -> None:
        if not any(dict(b) == dict(binding) for b, _ in self.seen):
            self.seen = [*self.seen[-(MAX_SEEN - 1):], (dict(binding), fields(program))]
        if self.fixed is None:
            self.fixed = dict(program.weights)
        else:
            self.fixed = {n: a for n, a in self.fixed.items() if n in program.weights and _same(program.weights[n], a)}

    def why_not(self, binding: Binding, program: Program) -> str | None:
        """None when the kernels serve ``program`` at ``binding``, else why not."""
        if self.template is None:
            return "no template yet"
        if not self.constants <= set(self.fixed or ()):
            return "a weight the kernels take as a constant changes with the size"
        return self.template.matches(program, binding)


Probe = Callable[[Sequence[Binding]], list[tuple[Binding, Program]]]


class GenericGraph:
    """A graph over the shape symbols ``symbols``, run at any binding of them (module docstring).
    ``probe``, when given, translates the graph at bindings; a family's first call then has it
    translated at a few bindings around the call's (``near``), so that the family's generic
    kernels compile at once."""

    def __init__(self, symbols: Sequence[str], target: Any, output_names: Sequence[str], options: dict[str, Any],
                 label: str = "tcc", probe: Probe | None = None, defer: bool = False):
        self.symbols = tuple(symbols)
        self.target = target
        self.output_names = list(output_names)
        self.label = label
        self._options = options
        self._probe = probe
        self._defer = defer  # a new family's first binding is left to the caller (bound() gives None) once
        self._deferred: set[tuple[int, ...]] = set()
        self._families: dict[tuple[frozenset[str], int], _Family] = {}
        self._kernels: dict[tuple[str, tuple[str, ...]], GenericKernel] = {}
        self._bound: dict[tuple[int, ...], _Bound] = {}
        self._static: list[GraphModel] = []
        self.specialised: list[Binding] = []  # the bindings compiled alone (no template fits them)

    def _key(self, binding: Binding, program: Program) -> tuple[frozenset[str], int]:
        return frozenset(s for s in self.symbols if binding[s] == 1), skeleton(program)

    def family(self, binding: Binding, program: Program) -> _Family:
        """The family of ``program`` (at ``binding``); a new one is probed around the binding."""
        key = self._key(binding, program)
        family = self._families.get(key)
        if family is None:
            family = self._families[key] = _Family()
            if self._probe is not None:
                around = [(b, p) for b, p in self._probe(near(binding, self.symbols)) if self._key(b, p) == key]
                self.learn([(binding, program), *around])
        return family

    @property
    def template(self) -> Template | None:
        """The template of the first family fitted."""
        return next((f.template for f in self._families.values() if f.template is not None), None)

    # ------------------------------------------------------------ fitting
    def learn(self, seen: Sequence[tuple[Binding, Program]]) -> None:
        """Fit the family of ``seen[0]`` on the programs ``seen`` translated at their bindings
        (probes; those of other families are only seen by theirs)."""
        key = self._key(*seen[0])
        family = self._families.setdefault(key, _Family())
        for binding, program in seen:
            self._families.setdefault(self._key(binding, program), _Family()).see(binding, program)
        try:
            self._refit(family, seen[0][1], seen[0][0])
        except NotGeneric as exc:
            log.debug("%s: no shape-generic kernels at %s: %s", self.label, _text(seen[0][0]), exc)

    def observe(self, binding: Binding, program: Program) -> None:
        """See the program of a binding (a probe's) without compiling anything."""
        self._families.setdefault(self._key(binding, program), _Family()).see(binding, program)

    def _refit(self, family: _Family, like: Program, binding: Binding) -> None:
        if len(family.seen) < 2:
            raise NotGeneric("one size seen: nothing to fit yet")
        template = _fit_most(family.seen, self.symbols, like)
        fixed = set(family.fixed or ())
        calls, constants = [], set()
        for k in _split(template.program, like, binding):
            source, carried = _with_carriers(k.source, self.symbols)
            taken = tuple(f"x{n}" for n, name in enumerate(k.params) if name in fixed)  # (the kernel's names)
            constants |= {name for name in k.params if name in fixed}
            options = {**self._options, "constant_params": taken} if taken else self._options
            kernel = self._kernels.get((source, taken))
            if kernel is None:
                kernel = self._kernels[(source, taken)] = GenericKernel(source, self.target, options)
            calls.append((kernel, (*(f"#{s}" for s in carried), *k.params), k.results))
        family.template, family.calls, family.constants = template, calls, constants

    # ------------------------------------------------------------ calling
    def bound(self, binding: Binding, program: Callable[[], Program]) -> _Bound | None:
        """What a call at ``binding`` runs (``program``: the graph translated for it, asked for
        on the binding's first call only). None (with ``defer``): the first binding of a family
        no template serves yet, which the caller runs itself this once (its program seen), so
        that the family's next size compiles generic kernels rather than this one compiling
        its own; that binding's next call compiles."""
        key = tuple(binding[s] for s in self.symbols)
        bound = self._bound.get(key)
        if bound is None:
            if len(self._bound) >= MAX_BOUND:
                self._bound.clear()
            bound = self._bind(dict(binding), program(), self._defer and key not in self._deferred)
            if bound is None:
                self._deferred.add(key)
                return None
            self._bound[key] = bound
        return bound

    def _bind(self, binding: dict[str, int], program: Program, defer: bool = False) -> _Bound | None:
        family = self.family(binding, program)
        family.see(binding, program)
        if defer and family.template is None and len(family.seen) < 2:
            return None
        why = family.why_not(binding, program)
        if why is not None:
            try:
                self._refit(family, program, binding)
                why = family.why_not(binding, program)
            except NotGeneric as exc:
                why = str(exc)
        if why is None:
            fixed = family.fixed or {}
            values = {n: fixed.get(n, a) for n, a in program.weights.items()}
            values |= {f"#{s}": np.empty(v, np.int8) for s, v in binding.items()}
            return _Bound(list(family.calls), values, template=family.template)
        log.debug("%s: compiled for %s alone: %s", self.label, _text(binding), why)
        self.specialised.append(binding)
        model = GraphModel(program, self.target, list(program.inputs), self.output_names, self._options)
        model.label = self.label
        self._static.append(model.compile(progress=False))
        return _Bound([], {}, model=model)

    def build(self) -> None:
        """Compile every kernel fitted so far now (each for a binding its family has seen)."""
        for family in self._families.values():
            for kernel in dict.fromkeys(k for k, _, _ in family.calls):
                kernel.build(family.seen[0][0])

    def run(self, bound: _Bound, inputs: Sequence[Any], input_params: Sequence[str], out: Any = None) -> Any:
        """The graph's outputs at ``bound`` for ``inputs`` (the program's parameters ``input_params``)."""
        if bound.model is not None:
            return bound.model(*inputs, out=out)
        values = {**bound.values, **dict(zip(input_params, inputs))}
        results = tuple(name for name, _, _ in bound.template.program.results)  # type: ignore[union-attr]
        last = len(bound.calls) - 1
        for n, (kernel, params, written) in enumerate(bound.calls):
            got = kernel(*[values[p] for p in params], out=out if n == last and written == results else None)
            values.update(zip(written, got if len(written) > 1 else (got,)))
        outputs = [values[name] for name in results]
        if out is not None and not (bound.calls and bound.calls[-1][2] == results):
            outputs = copy_out(outputs, out)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @property
    def compiles(self) -> int:
        """Kernels built (not found in a cache) for this graph: the generic ones and any specialised."""
        return sum(k.compiles for k in self._kernels.values()) + sum(m.compiles for m in self._static)

    def kernels(self) -> list[GenericKernel]:
        """The distinct kernels of every family's template."""
        return list(dict.fromkeys(k for f in self._families.values() for k, _, _ in f.calls))


def _fit_most(seen: list[tuple[Binding, list[tuple[str, str]]]], symbols: Sequence[str], like: Program) -> Template:
    """The template through every program seen, else through all but one (a probe past a
    Slice's clamp, say), the latest always among them."""
    try:
        return fit(seen, symbols, like)
    except NotGeneric as exc:
        for n in range(len(seen) - 1):
            if len(seen) > 2:
                try:
                    return fit([*seen[:n], *seen[n + 1:]], symbols, like)
                except NotGeneric:
                    pass
        raise exc from None


def solve(shapes: Sequence[tuple[int | str, ...]], args: Sequence[Any], names: Sequence[str]) -> dict[str, int]:
    """The symbols' values from the inputs' shapes; a dim that disagrees is a TccShapeError."""
    binding: dict[str, int] = {}
    where: dict[str, str] = {}
    for name, shape, arg in zip(names, shapes, args):
        got = tuple(as_host_array(arg, f"input {name}").shape) if not hasattr(arg, "shape") else tuple(arg.shape)
        if len(got) != len(shape):
            raise TccShapeError(f"input {name} has {len(got)} dims, the model takes {len(shape)} "
                                f"({', '.join(map(str, shape))})")
        for d, (want, size) in enumerate(zip(shape, got)):
            if isinstance(want, int) and want != size:
                raise TccShapeError(f"input {name} has {size} in dim {d}, the model takes {want}")
            if isinstance(want, str):
                if binding.setdefault(want, int(size)) != size:
                    raise TccShapeError(f"shape symbol {want} is {binding[want]} in {where[want]} but {size} in "
                                        f"dim {d} of input {name}", hint="inputs that share a symbol share its size")
                where.setdefault(want, f"dim {d} of input {name}")
                if size < 1:
                    raise TccArgumentError(f"input {name} has an empty dim {d} ({want} = 0)")
    return binding


def _split(template: Program, like: Program, binding: Binding) -> list[kernels.Kernel]:
    """The template's kernels, partitioned by its TE with the symbols dynamic (GEMMs sized by the
    cost models' hint for a dynamic extent), else by the TE of ``like`` (the program at
    ``binding``): the partition is a structural choice, correct at any size."""
    try:
        te = next(iter(tcc_compile(template.source()))).te
        return kernels.split(template, specialize(te, dict(binding), frozenset(te.symbols)))
    except Exception as exc:  # noqa: BLE001 - an analysis that needs constant extents
        log.debug("the template is partitioned as at %s (%s: %s)", _text(binding), type(exc).__name__, exc)
        return kernels.split(template, next(iter(tcc_compile(like.source()))).te)


HEADER = re.compile(r"^op \w+\((.*?)\) -> ", re.S)
DECLARED = re.compile(r"\w+: \w+\[([^\]]*)\]")


def _with_carriers(source: str, symbols: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The kernel's source with a carrier parameter ``d_S: i8[S]`` for each symbol it names that no
    parameter's dim is or that a parameter's compound dim (``batch * seq``) reads (a dim reads
    only symbols bound before it), and those symbols."""
    header = HEADER.match(source)
    assert header is not None  # (graph_kernels writes every kernel's header so)
    dims = [d.strip() for found in DECLARED.findall(header[1]) for d in found.split(",")]
    compound = set(re.findall(r"\b[A-Za-z_]\w*\b", " ".join(d for d in dims if not d.isidentifier())))
    named = set(re.findall(r"\b[A-Za-z_]\w*\b", source))
    carried = tuple(s for s in symbols if s in named and (s not in dims or s in compound))
    if not carried:
        return source, ()
    extra = ", ".join(f"d_{s}: i8[{s}]" for s in carried)  # first: a dim (batch * seq) reads them
    at = header.start(1)
    return source[:at] + extra + (", " if header[1] else "") + source[at:], carried


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def _text(binding: Mapping[str, int]) -> str:
    return ", ".join(f"{s}={v}" for s, v in binding.items())
