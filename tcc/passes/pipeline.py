"""The pipeline: every pass in order, one line each (Halide's ``src/Lower.cpp`` is the model).

Two halves. :func:`lower_op` is the same for every target: a checked TE op and concrete
bindings down to plain loop nests. The schedule is the target's: the user's schedule steps, then
the target's auto-scheduler (:func:`cpu_schedule`: tiles, packing, vectors, threads;
:func:`cuda_schedule`: kernels bound to blocks and threads). Each backend names its own
(``tcc.runtime.backend``), so this module never asks which kind of target it has. Every pass
reports through one :class:`~tcc.passes.trace.Trace`, so
``--print-after-all`` shows the IR after each, ``(unchanged)`` where a pass changed nothing, and
the auto-schedulers report each of their steps the same way.

Scheduling runs on first use (:attr:`Lowered.scheduled`): a warm start finds the kernel in the
disk cache and never needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tcc.ir.loops import LoopFunc, verify_func
from tcc.ir.step import Step
from tcc.ir.te import OpTE, verify_op
from tcc.passes.loops.hoist_constants import hoist_constants
from tcc.passes.loops.schedule import apply_schedule, check_gpu_schedule
from tcc.passes.loops.tensorize import tensorize_marked
from tcc.passes.te.bounds import prove_bounds
from tcc.passes.te.fusion import group_statements, inline_intermediates
from tcc.passes.te.im2col import im2col
from tcc.passes.te.lower import lower
from tcc.passes.te.matrix_sweep import note_matrix_sweeps
from tcc.passes.te.phases import split_phases
from tcc.passes.te.scans import prefix_scans
from tcc.passes.te.specialize import specialize
from tcc.passes.te.streaming import stream_reductions
from tcc.passes.te.sweeps import sweep_pairs
from tcc.passes.trace import SILENT, Trace
from tcc.target import CpuTarget, CudaTarget, Target

if TYPE_CHECKING:
    from tcc.passes.autoschedule_cuda.schedule import CudaTuning

GEMM_K_LOOP = "kk"  # the micro-kernel's k loop in the CPU auto-scheduler's GEMM nest, unrolled by tuning


@dataclass(frozen=True)
class Tuning:
    """What the tuner may change in an auto-schedule. CPU: GEMM tiles by result tensor
    (``gemm_params`` keys) and an unroll factor for the micro-kernel's k loop; CUDA: the GEMM
    tile, pipeline depth and block size of :class:`CudaTuning`."""

    tiles: dict[str, dict[str, int]] = field(default_factory=dict)
    unroll: int = 1
    cuda: CudaTuning | None = None

    def __str__(self) -> str:
        if self.cuda is not None:
            return str(self.cuda)
        tiles = "; ".join(f"{t}: " + " ".join(f"{k}={v}" for k, v in sorted(p.items()))
                          for t, p in sorted(self.tiles.items()))
        return f"{tiles}; unroll={self.unroll}"


# a target's half of the pipeline: (loops, target, user steps, tuning, trace, tf32, constant params) -> loops
Scheduler = Callable[[LoopFunc, Target, tuple[Step, ...], Tuning, Trace, bool, frozenset[str]], LoopFunc]


@dataclass
class Lowered:
    """What the target-independent half produced for one specialisation; the target's schedule
    (its backend's ``schedule``) runs on first use of :attr:`scheduled`."""

    te: OpTE  # specialised and fused TE (its fusion decisions in ``fusion_notes``)
    loops: LoopFunc  # plain loop nests, straight from the TE
    target: Target  # the machine the schedule sizes its work for
    scheduler: Scheduler  # the target's half of the pipeline
    trace: Trace = SILENT
    steps: tuple[Step, ...] = ()  # the user's schedule; empty: the auto-scheduler alone
    tuning: Tuning | None = None  # the tuner's choice for the auto-scheduler (tcc.tune)
    tf32: bool = False  # f32 contractions may round their operands to TF32 (tensor cores; opted in)
    constants: frozenset[str] = frozenset()  # parameters whose values stay the same between calls
    _scheduled: LoopFunc | None = field(default=None, repr=False)

    @property
    def scheduled(self) -> LoopFunc:
        """The loops after the target's schedule."""
        if self._scheduled is None:
            self._scheduled = self.scheduler(self.loops, self.target, self.steps, self.tuning or Tuning(),
                                             self.trace, self.tf32, self.constants)
        return self._scheduled


def lower_op(op: OpTE, bindings: dict[str, int | float], target: Target, scheduler: Scheduler,
             conv: str = "auto", trace: Trace = SILENT, steps: tuple[Step, ...] = (), tf32: bool = False,
             constants: frozenset[str] = frozenset(), dynamic: frozenset[str] = frozenset(),
             multiples: dict[str, int] | None = None) -> Lowered:
    """The passes every target shares: a checked TE op down to loop nests for ``bindings``; the
    shape symbols in ``dynamic`` stay variables (kernel arguments; ``multiples``: what each is a
    multiple of at every call)."""
    te = trace("specialize", specialize(op, bindings, dynamic, multiples))
    te = trace("phases", split_phases(te) if not te.dynamic else te)  # (splits constant strides)
    te = trace("scans", prefix_scans(te))  # prefix reductions (sum[j: i + 1]) as recurrences: linear work
    verify_op(te)
    te = trace("bounds", prove_bounds(te))  # every read proved; those proved under a select clamped
    te = trace("sweep pairs", sweep_pairs(te, target))  # pairs read only by sums over one axis: tiles, no S x L
    te = trace("stream reductions", stream_reductions(te, target))  # max, sum of exp, weighted sums: one pass, no S x L
    te = trace("matrix sweeps", note_matrix_sweeps(te, target))  # which sweeps run as FlashAttention-2's backward
    te = trace("inline", inline_intermediates(te))
    te = trace("im2col", im2col(te, conv))
    te = trace("group", group_statements(te, gemms=not target.is_gpu))  # GPU contractions stay fused
    loops = trace("lower", lower(te))
    verify_func(loops)
    return Lowered(te, loops, target, scheduler, trace, steps, tf32=tf32, constants=constants)


# Each target's half is imported when a schedule runs: a warm start (its kernels in the disk cache)
# never schedules, and a CPU compile does not load the CUDA scheduler (11 ms).

def cpu_schedule(func: LoopFunc, target: CpuTarget, steps: tuple[Step, ...] = (), tuning: Tuning = Tuning(),
                 trace: Trace = SILENT, tf32: bool = False, constants: frozenset[str] = frozenset()) -> LoopFunc:
    """The CPU's half: the user's steps (each a loop primitive), else the auto-scheduler; then work
    on the parameters ``constants`` alone (weight packing) moves into a prepare function run once
    per set of their values."""
    from tcc.passes.autoschedule_cpu.schedule import autoschedule

    scheduled = apply_schedule(func, list(steps), trace, target)
    if not steps:
        scheduled = autoschedule(scheduled, target, tuning.tiles, trace)
        if tuning.unroll > 1:
            scheduled = apply_schedule(scheduled, [Step("unroll", (GEMM_K_LOOP, "by", tuning.unroll))], trace, target)
    if constants:
        scheduled = trace("hoist constants", hoist_constants(scheduled, constants))
    verify_func(scheduled)
    return scheduled


def cuda_schedule(func: LoopFunc, target: CudaTarget, steps: tuple[Step, ...] = (), tuning: Tuning = Tuning(),
                  trace: Trace = SILENT, tf32: bool = False, constants: frozenset[str] = frozenset()) -> LoopFunc:
    """The GPU's half: the user's steps, the tiles they marked for the matrix units, then the
    auto-scheduler for every nest the user did not bind to blocks (f32 contractions on TF32
    tensor cores when ``tf32``). ``constants`` changes nothing here yet."""
    from tcc.passes.autoschedule_cuda.schedule import CudaTuning, schedule_cuda

    scheduled = apply_schedule(func, list(steps), trace, target)
    if steps:
        check_gpu_schedule(func, scheduled, list(steps))
    marks = [s for s in steps if s.prim == "tensorize"]
    if marks:  # the user's marked tiles on matrix units, now that their operands are staged
        scheduled = trace("tensorize", tensorize_marked(scheduled, marks[0].span))
    scheduled = schedule_cuda(scheduled, target, tuning.cuda or CudaTuning(), trace, tf32)
    verify_func(scheduled)
    return scheduled
