"""The graph engine's compiled model: a ``graph.Program`` run as kernels, each distinct one built once.

Both front doors end here: ``tcc.onnx.load`` (an ONNX graph) and ``torch.compile(backend="tcc")``
(the FX graphs of Dynamo and AOTAutograd) translate their operators into one ``Program``, and a
:class:`GraphModel` compiles and runs it. On the CPU the program is cut into kernels where fusion
joins nothing (``graph_kernels``), each distinct kernel compiled once per machine (the disk cache),
in worker processes when there is much to build (``graph_build``); weights are constant
parameters (their GEMM panels packed once, ``_prepare``); intermediates live in buffers planned on
the first call and kept between calls (``graph_memory``). On CUDA the program is one kernel.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm import tqdm

from tcc import cuda as tcc_cuda
from tcc.compiler import Library, Op, check_options
from tcc.compiler import compile as tcc_compile
from tcc.errors import TccArgumentError
from tcc.interop import graph_kernels as kernels
from tcc.interop.graph import Program
from tcc.interop.graph_build import Workers
from tcc.interop.graph_kernels import Kernel
from tcc.interop.graph_memory import Arena, Arenas, BufferPlan
from tcc.runtime import cache
from tcc.runtime.backend import backend_for
from tcc.runtime.binding import as_host_array
from tcc.target import Target, host_cores

__all__ = ["PARALLEL_AFTER_S", "GraphModel"]

PARALLEL_AFTER_S = 4.0  # CPU seconds of compiling left (estimated) from which a worker helps (~1 s to start)



class GraphModel:
    """A compiled graph: call it with the graph's inputs (positionally, or by name).

    On the CPU the program runs as a sequence of kernels (``tcc.interop.graph_kernels``), each
    distinct one compiled once; on CUDA as one kernel. ``label`` names the front door in the
    progress bar.
    """

    label = "tcc"

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
        key = cache.make_key(cache.compiler_fingerprint(), "graph-kernels", self.source)
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

    def compile(self, progress: bool | None = None, jobs: int | None = None) -> GraphModel:
        """Build every distinct kernel now (from the disk cache when it is there); a progress bar
        appears when this takes more than a second. When the kernels left look like more than
        ``PARALLEL_AFTER_S`` of work (the time of those built so far, per kernel), ``jobs - 1``
        worker processes (default: one per CPU this process may use, less this one) build from
        the other end of the list, through the disk cache."""
        start = time.perf_counter()
        distinct = list(dict.fromkeys((k.source, self._constants(k)) for k in self.kernels))
        with tqdm(total=len(distinct), desc=f"{self.label}: compiling", unit="kernel", delay=1.0,
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
            outputs = copy_out(outputs, out)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _plan_buffers(self, calls: list[tuple[Op, tuple[str, ...], tuple[str, ...]]],
                      values: dict[str, Any]) -> Arenas:
        """The buffer plan for the intermediates, from the shapes and dtypes of one call's ``values``."""
        layouts = {name: (values[name].shape, values[name].dtype) for _, _, results in calls for name in results}
        return Arenas(BufferPlan([(params, results) for _, params, results in calls], layouts, self._results))

    def release_buffers(self) -> None:
        """Let go of the intermediates' buffers kept between calls (``tcc.interop.graph_memory``:
        96 MB for ResNet-18 at batch 8); the next call runs without them and plans them again."""
        self._arenas = None

    def _run_kernels(self, calls: list[tuple[Op, tuple[str, ...], tuple[str, ...]]], values: dict[str, Any],
                     arena: Arena | None, out: Any) -> None:
        """Run the kernels in order, adding their results to ``values``; intermediates go to the
        arena's buffers where there is one (``tcc.interop.graph_memory``)."""
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

    @property
    def compiles(self) -> int:
        """Kernels this model built (not found in the memory or disk cache)."""
        return sum(op.compiles for op in self._ops.values())

    def notes(self) -> list[str]:
        """What the import decided (BatchNorm folds, precomputed scales)."""
        return list(self.program.notes)


def copy_out(outputs: list[Any], out: Any) -> list[Any]:
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
