"""``tcc.compile``: a library of ops from source, each a callable that specialises on shapes.

Calling an op binds and checks the arguments, finds (or builds) the kernel for these shapes,
dtypes and parameters in the memory cache, then the disk cache, then the compiler, and runs
it. ``op.lower(...)`` returns the text of any stage for the same arguments.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tcc.errors import Source, Span, TccArgumentError, TccCompileError, TccError, TccRuntimeError, TccSyntaxError
from tcc.frontend import ast
from tcc.frontend.ast import OpDef, format_ast
from tcc.frontend.generic import type_params
from tcc.frontend.parser import parse
from tcc.frontend.schedules import Schedule, module_schedules, schedule_from_text
from tcc.frontend.sema import analyze
from tcc.generic_op import GenericOp
from tcc.index_guard import RESULT, guard_source
from tcc.ir.loops import DETERMINISTIC, GUARDED, STAGED_STORES, STORE_MODES, format_func
from tcc.ir.te import OpTE, format_op
from tcc.opdoc import docstring, header, signature
from tcc.passes.pipeline import Lowered, lower_op
from tcc.passes.te.check_fp8 import check_fp8
from tcc.passes.te.fusion import format_fused
from tcc.passes.te.im2col import CHOICES as CONV_CHOICES
from tcc.passes.te.specialize import specialize
from tcc.passes.trace import Trace
from tcc.runtime import cache
from tcc.runtime.backend import Backend, backend_for, kinds, kinds_taking
from tcc.runtime.binding import BoundCall, bind, bind_cparams
from tcc.runtime.dynamic import (
    AUTOMATIC,
    STATIC,
    DynamicSpec,
    check_multiples,
    check_names,
    parse_dynamic,
    parse_tune,
    prove_call,
    requested,
    stream_symbols,
    window_symbols,
)
from tcc.runtime.index_checks import IndexGuard, checked_op, reads_data, run_checks
from tcc.runtime.plans import Plans
from tcc.stack import deep
from tcc.target import Target

MAX_SOURCE_BYTES = 64 << 20
_BUILT = [0]  # kernels built by every op of this process (Op.compiles counts one op's)


def kernels_built() -> int:
    """How many kernels this process has compiled (not found in the memory or disk cache), by any
    op: the count that a front door's "no recompiles" is measured by (``tcc.kernels_built()``)."""
    return _BUILT[0]
# the options of tcc.compile, each taken by some backend
OPTIONS = ("conv", "arch", "tf32", "constant_params", "deterministic", "staged_stores")


def check_options(options: dict[str, Any], target: str | Target) -> None:
    """Every keyword of ``tcc.compile`` beyond target and tune is known and fits the target."""
    backend = backend_for(target)
    for name in options:
        if name not in OPTIONS:
            raise TccArgumentError(f"tcc.compile has no option {name!r}",
                                   hint=f"options: target, tune, {', '.join(OPTIONS)}")
        if name not in backend.options:
            takers = kinds_taking(name)
            raise TccArgumentError(f"option {name}= is for target {' or '.join(takers)}, not {backend.kind!r}",
                                   hint=f"drop {name}= or use target={takers[0]!r}")
    if "conv" in options and options["conv"] not in CONV_CHOICES:
        raise TccArgumentError(f"unknown convolution lowering {options['conv']!r} (conv=)",
                               hint=f"use one of {', '.join(CONV_CHOICES)}")
    if "constant_params" in options and (isinstance(options["constant_params"], str) or not all(
            isinstance(n, str) for n in options["constant_params"])):
        raise TccArgumentError(f"constant_params= must be a list of parameter names, not "
                               f"{options['constant_params']!r}", hint="e.g. constant_params=['W', 'b']")
    if "deterministic" in options and not isinstance(options["deterministic"], bool):
        raise TccArgumentError(f"deterministic= must be True or False, not {options['deterministic']!r}",
                               hint="deterministic=True makes += statements add in the same order on every run")
    if "staged_stores" in options and not (isinstance(options["staged_stores"], bool)
                                           or options["staged_stores"] in STORE_MODES):
        raise TccArgumentError(f"staged_stores= must be True, False or one of {', '.join(STORE_MODES)}, not "
                               f"{options['staged_stores']!r}",
                               hint="'auto' (True) sends 16-bit tensor-core GEMM results through shared memory, "
                                    "'all' f32 ones too, 'off' (False) none")
    if "tf32" in options and not isinstance(options["tf32"], bool):
        raise TccArgumentError(f"tf32= must be True or False, not {options['tf32']!r}",
                               hint="tf32=True lets f32 contractions round their operands to TF32 on tensor cores")


def read_source(source: str | os.PathLike) -> tuple[str, str]:
    """(text, filename) from source text or a path to a ``.tc`` file.

    A string is a path when it does not look like a program: one line, without a ``{`` (every
    op has a body) and not starting with ``op`` or ``schedule``. A path that does not exist is
    reported as such, not parsed as source.
    """
    if isinstance(source, bytes | bytearray):
        raise TccArgumentError("tcc.compile needs source text (str) or a path, got bytes",
                               hint="decode it first: source.decode('utf-8')")
    if not isinstance(source, str | os.PathLike):
        raise TccArgumentError(f"tcc.compile needs source text or a path, got {type(source).__name__}")
    if isinstance(source, str) and _looks_like_source(source):
        return source, "<string>"
    path = Path(source)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)  # bounded: the path may be /dev/zero or a pipe
    except FileNotFoundError:
        raise TccArgumentError(f"file not found: {path}",
                               hint="check the path (source text must contain an op with a { ... } body)"
                               ) from None
    except OSError as exc:
        raise TccArgumentError(f"cannot read {path}: {exc.strerror or exc}", hint="check the path") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise TccArgumentError(f"{path} is larger than {MAX_SOURCE_BYTES >> 20} MiB; it is not tcc source",
                               hint="check the path")
    return decode_source(data, str(path)), str(path)


def _looks_like_source(text: str) -> bool:
    first = text.split(None, 1)[0] if text.strip() else ""
    return "\n" in text or "{" in text or not first or first in ("op", "schedule")


def decode_source(data: bytes, filename: str) -> str:
    """UTF-8 text of a source file (a byte-order mark is dropped); a bad byte is a syntax error
    at its line and column."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        good = data[:exc.start].decode("utf-8-sig")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        text = good + data[exc.start:].decode("utf-8", errors="replace")
        raise TccSyntaxError(f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                             Span(Source(text, filename), line, col, line, col + 1),
                             "save the file as UTF-8") from None


def compile(source: str | os.PathLike, target: str | Target = "cpu",  # noqa: A001
            tune: bool | int | Mapping[str, Any] = False, **options: Any) -> Library:
    """Parse and check every op of ``source`` and its ``schedule`` blocks for ``target``; kernels
    are built on first call per shape. ``tune=True`` (or a number of trials) searches the
    auto-scheduler's knobs (CPU: GEMM tiles; CUDA: GEMM tile, pipeline depth, block size) on the
    first call per shape, or reuses the winner from the disk cache; ``tune={"S": (64, 4096)}``
    tunes a kernel with ``S`` dynamic for those sizes at once (``runtime.dynamic.parse_tune``);
    an op with a user's schedule is not tuned. ``target`` is a kind's name (its machine found
    here) or a Target value; either way one value describes the machine from here on, and it is
    part of every cache key."""
    backend = backend_for(target)
    if not isinstance(tune, bool | int | Mapping) or isinstance(tune, int) and tune < 0:
        raise TccArgumentError(f"tune={tune!r}: expected True, False, a number of trials or a dict of sizes")
    spec = parse_dynamic(options.pop("dynamic", None))
    check_options(options, target)
    machine = backend.resolve(None if isinstance(target, str) else target, options)
    options.pop("arch", None)  # the machine holds it now
    text, filename = read_source(source)
    module, ops, schedules = deep(_check_module, text, filename, backend)
    if "constant_params" in options:
        options["constant_params"] = _constant_params(options["constant_params"], ops)
    asts = {o.name: o for o in module.ops}
    check_names(spec, ops)
    if machine.is_gpu and spec.automatic:  # CUDA's dynamic kernels ran at 0.31-0.76 of the specialised
        spec = STATIC  # ones' throughput on an H200 (benchmarks/dynamic.py): there dynamic= opts in
    tune, points = parse_tune(tune, ops)
    return Library(ops, asts, backend, machine, {**backend.defaults, **options}, schedules, tune, spec, points)


def _constant_params(names: Any, ops: dict[str, OpTE]) -> tuple[str, ...]:
    """The names of ``constant_params=``, sorted (they are part of the cache key), each a tensor
    parameter of some op: the runtime may assume their values stay the same between calls
    with the same array, so work on them alone (weight packing) is done once."""
    tensors = {p for op in ops.values() for p in op.inputs if p in op.tensors}
    unknown = sorted(set(names) - tensors)
    if unknown:
        raise TccArgumentError(f"constant_params= names {', '.join(unknown)}, which no op takes as a tensor",
                               hint=f"tensor parameters: {', '.join(sorted(tensors)) or 'none'}")
    return tuple(sorted(set(names)))


def _check_module(text: str, filename: str, backend: Backend
                  ) -> tuple[ast.Module, dict[str, OpTE], dict[str, Schedule]]:
    module = parse_cached(text, filename)
    ops = analyze(module, module.span.source if module.span else None)
    return module, ops, module_schedules(module, set(ops), backend, kinds())


def parse_cached(text: str, filename: str) -> ast.Module:
    """The AST of a source file, from the disk cache when this compiler parsed the same text before
    (a warm start builds no parser), else parsed and stored."""
    disk = cache.DiskCache(cache.cache_dir())
    key = cache.make_key(cache.compiler_fingerprint(), "ast", filename, text)
    stored = disk.get(key, ".ast")
    if stored is not None:
        try:
            module = pickle.loads(stored)
            if isinstance(module, ast.Module):
                return module
        except Exception:  # noqa: BLE001 - a stale entry (an older AST class) of any kind is a miss
            pass
    module = parse(text, filename)
    disk.put(key, pickle.dumps(module), ".ast")
    return module


class Library:
    """The ops of one source file, as attributes: ``lib.matmul(A, B)``."""

    def __init__(self, ops: dict[str, OpTE], asts: dict[str, OpDef], backend: Backend, target: Target,
                 options: dict[str, Any], schedules: dict[str, Schedule] | None = None, tune: bool | int = False,
                 dynamic: DynamicSpec = AUTOMATIC, tune_points: tuple[dict[str, int], ...] = ()):
        self.backend = backend
        self.dynamic = dynamic
        self.tune_points = tune_points
        self.target = target
        self.options = dict(options)
        self._ops = {name: self._op(te, asts[name], (schedules or {}).get(name), tune) for name, te in ops.items()}
        for name, op in self._ops.items():  # plain attributes: ``lib.axpy`` in a loop costs no __getattr__
            if name not in self.__dict__ and not hasattr(type(self), name):
                self.__dict__[name] = op

    def _op(self, te: OpTE, definition: OpDef, schedule: Schedule | None, tune: bool | int) -> Op | GenericOp:
        """An op, or one generic over dtypes that makes an op per binding of its type parameters."""
        if not type_params(definition):
            return Op(te, definition, self.backend, self.target, self.options, schedule, tune, self.dynamic,
                      self.tune_points)
        source = definition.span.source if definition.span is not None else None
        return GenericOp(definition, source, lambda bound_te, bound: Op(
            bound_te, bound, self.backend, self.target, self.options, schedule, tune, self.dynamic, self.tune_points))

    def __getattr__(self, name: str) -> Op:
        ops = self.__dict__.get("_ops", {})
        if name in ops:
            return ops[name]
        raise AttributeError(f"no op {name!r} in this library (it has: {', '.join(ops) or 'none'})")

    def __getitem__(self, name: str) -> Op:
        return self.__getattr__(name)

    def __iter__(self):
        return iter(self._ops.values())

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._ops})  # each op once: most are instance attributes too

    def __repr__(self) -> str:
        sources = {op.ast.span.source.filename for op in self._ops.values() if op.ast.span is not None}
        where = f" from {sources.pop()}" if len(sources) == 1 and "<string>" not in sources else ""
        return f"<tcc library{where} on {self.backend.kind}: {', '.join(self._ops) or 'no ops'}>"

    @property
    def ops(self) -> dict[str, Op]:
        return dict(self._ops)


class Op:
    """One op of a library, compiled by ``backend`` for the machine ``target``. Call it on arrays;
    ``lower`` shows any stage of its compilation."""

    def __init__(self, te: OpTE, ast: OpDef, backend: Backend, target: Target, options: dict[str, Any],
                 schedule: Schedule | None = None, tune: bool | int = False, dynamic: DynamicSpec = STATIC,
                 tune_points: tuple[dict[str, int], ...] = ()):
        self.te = check_fp8(te, target)  # refused at compile time where the target has no 8-bit floats
        self.tune_points = tune_points  # sizes of dynamic symbols to tune a dynamic kernel at (tune={...})
        self.dynamic = dynamic
        self.dynamic_symbols = requested(dynamic, te)  # given by dynamic=; the automatic policy adds to them
        self._seen: dict[str, set[int | float]] = {}  # the automatic policy: values per symbol (up to two)
        # symbols the automatic policy keeps specialised: convolution images, streamed attention
        self._refused: set[str] = set(window_symbols(te) | stream_symbols(te))
        self._proved: set[tuple] = set()  # bindings a dynamic kernel was proved for
        self.compiles = 0  # kernels this op built (not found in a cache): see Op.kernel
        self.loads = 0  # kernels this op loaded from the disk cache
        self.ast = ast
        self.name = te.name
        self.backend = backend
        self.target = target
        self.library_options = options  # the keywords of tcc.compile, for ops derived from this one (tcc.grad)
        self.user_schedule = schedule or Schedule()
        self.options = {**options, "conv": self.user_schedule.conv} if self.user_schedule.conv else options
        self.tune = tune if not self.user_schedule.steps else False  # a user's schedule leaves nothing to tune
        self._keys: dict[tuple, str] = {}  # bindings -> cache key, so repeat calls skip the pipeline
        self._solved: dict[tuple, tuple[dict, dict]] = {}  # shapes + parameters -> symbols, result shapes
        self._checks: dict[tuple, OpTE | None] = {}  # bindings -> the op with its index checks
        self._guards: dict[tuple, IndexGuard | None] = {}  # bindings -> the guard running the index checks
        self._host_checked: set[tuple] = set()  # bindings whose first call was checked on the host
        self.plans = Plans(backend.make_plan)  # repeat calls with a checked signature skip binding
        # help(lib.NAME), lib.NAME.__doc__ and inspect.signature(lib.NAME) describe this op, not the class
        self.__doc__ = docstring(te, ast, backend.kind)
        self.__signature__ = signature(te)

    def __repr__(self) -> str:
        return f"<tcc op {header(self.ast).removeprefix('op ')} on {self.backend.kind}>"

    def schedule(self, text: str) -> Op:
        """A new op with this schedule (steps separated by ``;`` or newlines, spelled as in a
        ``schedule`` block); it replaces any schedule of the file. ``""`` means the auto-scheduler."""
        if not isinstance(text, str):
            raise TccArgumentError(f"{self.name}.schedule takes the schedule's text, got {type(text).__name__}",
                                   hint='e.g. op.schedule("split(i, 32, io, ii); vectorize(ii)")')
        schedule = schedule_from_text(text, self.backend)
        return Op(self.te, self.ast, self.backend, self.target, self.library_options, schedule, self.tune,
                  self.dynamic, self.tune_points)

    # ------------------------------------------------------------ calling
    def __call__(self, *args: Any, out: Any = None, **cparams: Any) -> Any:
        results = self.plans.run(args, cparams, out)
        if results is None:
            bound = self.bind(args, cparams)
            guard, repeat = self._call_guard(bound)
            kernel = self.kernel(bound.bindings)
            results = self.backend.invoke(kernel, self.te, bound, out, guard)
            if results is None:  # an index out of range: nothing was written
                self._raise_index_error(bound)
            if repeat:  # (the plan runs the guard too)
                self.plans.learn(kernel, self.te, bound, args, cparams, out, guard)
        return results[0] if len(results) == 1 else tuple(results)

    def _call_guard(self, bound: BoundCall) -> tuple[IndexGuard | None, bool]:
        """The guard a checked call runs (None: none), and whether a plan may repeat the call.
        On the CPU the first call of a binding is checked on the host instead, and leaves no plan:
        a guard op costs a compile (~0.1 s), which pays for shapes that come again, not for a
        stream of new ones (sequence lengths), whose kernel is dynamic and compiles once."""
        checked = self._index_checks(bound.bindings)
        if checked is None:
            return None, True
        memo = tuple(sorted(bound.bindings.items()))
        if memo not in self._guards and not self.target.is_gpu and memo not in self._host_checked:
            if len(self._host_checked) >= 4096:
                self._host_checked.clear()
            self._host_checked.add(memo)
            run_checks(checked, bound)
            return None, False
        guard = self.index_guard(bound.bindings)
        if guard is None:  # no guard op can check these indices: the host pass, every call
            run_checks(checked, bound)
            return None, False
        return guard, True

    def index_guard(self, bindings: dict[str, int | float]) -> IndexGuard | None:
        """The index checks of calls with these bindings as a guard op's kernel, compiled for this
        op's target (``tcc.index_guard``); None when no index reads data or all are proved, and
        when an index reads data at an index read from data (``E[idx[jdx[n]]]``): the guard op
        would read ``idx`` where ``jdx`` may leave it, so the host pass checks those calls."""
        checked = self._index_checks(bindings)
        if checked is None:
            return None
        memo = tuple(sorted(bindings.items()))
        if memo not in self._guards:
            source, names = guard_source(checked)
            op = compile(source, target=self.target).index_guard
            self._guards[memo] = None if op._reads_data else IndexGuard(op.kernel({}), names, RESULT)
        return self._guards[memo]

    def _raise_index_error(self, bound: BoundCall) -> None:
        """Name the index the guard found out of range (its position and value), from a host pass."""
        checked = self._index_checks(bound.bindings)
        if checked is not None:
            run_checks(checked, bound)  # raises TccIndexError
        raise TccRuntimeError(f"internal error: op {self.name}'s index guard found an index out of range, "
                              "which the host pass did not", self.te.span, "please report it")

    def _index_checks(self, bindings: dict[str, int | float]) -> OpTE | None:
        """The op specialised with the index checks its calls need (None: none), per binding."""
        if not self._reads_data:
            return None
        memo = tuple(sorted(bindings.items()))
        if memo not in self._checks:
            self._checks[memo] = deep(checked_op, self.te, bindings)
        return self._checks[memo]

    @functools.cached_property
    def _reads_data(self) -> bool:
        return reads_data(self.te)

    def bind(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> BoundCall:
        """The checked call: arrays (as the backend takes them), scalars, bindings, result shapes."""
        te = self.te
        if len(args) != len(te.params):
            names = ", ".join(te.params)
            raise TccArgumentError(f"{self.name} takes {len(te.params)} argument(s) ({names}), got {len(args)}",
                                   te.span, "pass tensors and scalars positionally, compile-time parameters "
                                            "as keywords")
        arrays = {name: self.backend.as_array(value, f"argument {name} of {self.name}")
                  for name, value in zip(te.params, args) if name in te.tensors}
        return bind(te, args, cparams, arrays, self._solved)

    def kernel(self, bindings: dict[str, int | float]) -> Any:
        """The loaded kernel for these bindings: from memory, else from the disk cache by a key that
        the call itself knows (a warm start runs no pass), else freshly built. The dynamic shape
        symbols' values are no part of the key: one kernel serves them all."""
        symbols = self._dynamic_for(bindings)
        memo = tuple(sorted((k, None if k in symbols else v) for k, v in bindings.items()))
        key = self._keys.get(memo)
        lowered = None
        if key is None:
            if self._tunes(symbols):  # the stored winner may change between processes: key by it
                lowered = deep(self.lowered, bindings, None, symbols)
            key = self._keys[memo] = self.cache_key(bindings, lowered, symbols)
        kernel = cache.MEMORY.get(key)
        if kernel is not None:
            return kernel
        disk = cache.DiskCache(cache.cache_dir())
        artifact = disk.get(key)
        if artifact is not None:
            try:
                kernel = self.backend.load(self.name, artifact)
                self.loads += 1
            except TccError:
                kernel = None  # a stale or unusable entry: rebuild it below
        if kernel is None:
            try:
                artifact = deep(self._build, bindings, lowered, symbols)
            except Exception as exc:  # noqa: BLE001 - a pass that cannot take a symbolic extent yet
                if not symbols:
                    raise
                return self._without_dynamic(bindings, symbols, exc)
            disk.put(key, artifact)
            kernel = self.backend.load(self.name, artifact)
            self.compiles += 1
            _BUILT[0] += 1
        cache.MEMORY.put(key, kernel)
        return kernel

    def _dynamic_for(self, bindings: dict[str, int | float]) -> frozenset[str]:
        """The symbols this call's kernel leaves variable: those of ``dynamic=``, and under the
        automatic policy each that has taken two distinct values; checked for this call's values
        (once per binding). The automatic policy specialises where the dynamic kernel cannot serve."""
        if self.dynamic.automatic:
            for name in self.te.symbols:
                seen = self._seen.setdefault(name, set())
                if len(seen) < 2:
                    seen.add(bindings[name])
            symbols = frozenset(n for n, seen in self._seen.items() if len(seen) > 1) - self._refused
        else:
            symbols = self.dynamic_symbols
            check_multiples(self.dynamic, self.te, symbols, bindings)
        memo = tuple(sorted(bindings.items()))
        if not symbols or memo in self._proved:
            return symbols
        try:
            deep(prove_call, self.te, bindings, symbols)
        except TccError:
            if not self.dynamic.automatic:
                raise
            self._refused |= symbols
            return frozenset()
        if len(self._proved) >= 4096:
            self._proved.clear()
        self._proved.add(memo)
        return symbols

    def _without_dynamic(self, bindings: dict[str, int | float], symbols: frozenset[str], exc: Exception) -> Any:
        """The automatic policy specialises where a dynamic kernel cannot be built (``exc``);
        ``dynamic=`` that asked for one is refused, naming the symbols."""
        if not self.dynamic.automatic:
            raise TccCompileError(f"op {self.name} cannot be compiled with {', '.join(sorted(symbols))} dynamic yet "
                                  f"({type(exc).__name__}: {exc})", self.te.span,
                                  "compile it with dynamic=False, or leave those symbols out of dynamic=") from exc
        self._refused |= symbols
        self._keys.clear()
        return self.kernel(bindings)

    def _build(self, bindings: dict[str, int | float], lowered: Lowered | None, symbols: frozenset[str]) -> bytes:
        return self.backend.build((lowered or self.lowered(bindings, dynamic=symbols)).scheduled, self.target)

    def lowered(self, bindings: dict[str, int | float],
                after_pass: Callable[[str, str], None] | None = None, dynamic: frozenset[str] | None = None) -> Lowered:
        """The op through the target-independent passes; ``dynamic`` (default: those of
        ``dynamic=``) are the shape symbols left variables."""
        symbols = self.dynamic_symbols if dynamic is None else dynamic
        lowered = lower_op(self.te, bindings, self.target, self.backend.schedule, self.options.get("conv", "auto"),
                           Trace(after_pass), self.user_schedule.steps, bool(self.options.get("tf32")),
                           frozenset(self.options.get("constant_params", ())), symbols, dict(self.dynamic.multiples))
        if self.options.get("deterministic"):  # (read by the schedules of += statements)
            lowered.loops.attrs[DETERMINISTIC] = True
        if "staged_stores" in self.options:  # (read by the CUDA GEMM schedules; True is "auto", False "off")
            stores = self.options["staged_stores"]
            lowered.loops.attrs[STAGED_STORES] = {True: "auto", False: "off"}.get(stores, stores)
        if self.target.is_gpu and self.index_guard(bindings) is not None:  # (its kernels read the guard's count)
            lowered.loops.attrs[GUARDED] = True
        if self._tunes(symbols):
            # a downward import (tune knows ops by a Protocol), made here because the tuner loads
            # every target's auto-scheduler: an op that is not tuned never needs it
            from tcc.tune import tuning_for

            lowered.tuning = tuning_for(self, lowered, [{**bindings, **p} for p in self.tune_points] if symbols else [])
        return lowered

    def _tunes(self, symbols: frozenset[str]) -> bool:
        """Whether a kernel with these dynamic symbols is tuned: a specialised one with ``tune=``,
        a dynamic one when ``tune={...}`` gives sizes for one of its symbols."""
        return bool(self.tune) and (not symbols or any(symbols & set(p) for p in self.tune_points))

    def cache_key(self, bindings: dict[str, int | float], lowered: Lowered | None = None,
                  dynamic: frozenset[str] = frozenset()) -> str:
        """The kernel's key, from what a call knows: the compiler, target, host and options, the op's
        source, shapes and parameters (less the ``dynamic`` symbols' values: the kernel reads them),
        the user's schedule, and (given ``lowered``) the tuner's choice. Inputs are made
        C-contiguous before a kernel runs, so strides are not part of it."""
        options = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        tuning = f"tuning={lowered.tuning or ''}" if lowered is not None else "untuned"
        static = sorted((k, v) for k, v in bindings.items() if k not in dynamic)
        return cache.make_key(cache.compiler_fingerprint(), self.backend.kind, self.machine_key(),
                              options, self._te_text, repr(static), f"dynamic={self.dynamic.key(dynamic)}",
                              f"schedule={self.user_schedule}", tuning)

    @functools.cached_property
    def _te_text(self) -> str:
        """What the op's checked TE is a pure function of: its name, its file's text and its
        parameters' dtypes (which differ between the bindings of a generic op's type parameters).
        (Printing the TE instead would recurse as deep as its expressions: a deep-stack thread per
        warm start.)"""
        span = self.ast.span
        if span is not None:
            types = ",".join(f"{p.name}:{p.dtype}" for p in [*self.ast.params, *self.ast.results])
            return f"{self.name}\0{types}\0{span.source.text}"
        return deep(format_op, self.te)

    def machine_key(self) -> str:
        """The key of the machine this op compiles for (target, host or device, compiler of the
        backend): what per-machine measurements, such as the roofline's peaks, are kept under."""
        return self.backend.cache_key(self.target)

    def base_key(self, lowered: Lowered) -> str:
        """The key of the op's specialisation without its schedule (the tuner stores its winner under it)."""
        options = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return cache.make_key(cache.compiler_fingerprint(), self.backend.kind, self.machine_key(),
                              options, format_op(lowered.te))

    # ------------------------------------------------------------ inspecting
    def bindings_for(self, args: tuple[Any, ...], cparams: dict[str, Any]) -> dict[str, int | float]:
        if not args:
            return bind_cparams(self.te, cparams)
        return self.bind(args, cparams).bindings

    def lower(self, *args: Any, stage: str = "loops", **cparams: Any) -> str:
        """The text of ``stage`` for these arguments (see ``STAGES`` of the target)."""
        bindings = self.bindings_for(args, cparams)
        if not args and self.te.symbols and stage not in ("ast", "te"):
            raise TccArgumentError(f"stage {stage!r} needs the arguments (or shapes) of {self.name}",
                                   self.te.span, f"call {self.name}.lower(A, B, ..., stage={stage!r})")
        return self.stage_text(bindings, stage)

    def stage_text(self, bindings: dict[str, int | float], stage: str,
                   after_pass: Callable[[str, str], None] | None = None) -> str:
        return deep(self._stage_text, bindings, stage, after_pass)

    def _stage_text(self, bindings: dict[str, int | float], stage: str,
                    after_pass: Callable[[str, str], None] | None) -> str:
        stages = self.backend.stages
        if stage not in stages:
            raise TccArgumentError(f"unknown stage {stage!r} for target {self.backend.kind}",
                                   hint=f"stages: {', '.join(stages)}")
        if stage == "ast":
            return format_ast(self.ast)
        if stage == "te" and not (set(self.te.symbols) <= set(bindings)):
            return format_op(self.te)
        lowered = self.lowered(bindings, after_pass)
        if after_pass is not None:
            lowered.scheduled  # noqa: B018 - run the schedule so that every pass is printed
        if stage == "te":
            if not (lowered.te.bindings or lowered.te.dynamic):
                return format_op(self.te)
            return format_op(specialize(self.te, bindings, frozenset(lowered.te.dynamic), self.dynamic.multiples))
        if stage == "fused":
            return format_fused(lowered.te)
        if stage == "loops":
            return format_func(lowered.loops)
        if stage == "scheduled":
            return format_func(lowered.scheduled)
        return self.backend.stage_text(lowered.scheduled, stage, self.target)
