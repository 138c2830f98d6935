"""The pipeline of each target: named stages, each a pure pass over an IR value.

``run_pipeline`` takes a checked TE op and concrete bindings to a scheduled loop function,
calling ``after_pass(name, text)`` after each pass so that ``--print-after-all`` and
``lower(stage=...)`` show exactly what the compiler did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tcc.ir.loops import LoopFunc, format_func, verify_func
from tcc.ir.te import OpTE, format_op, verify_op
from tcc.passes.loops.schedule import Step, apply_schedule, check_gpu_schedule
from tcc.passes.te.bounds import check_bounds
from tcc.passes.te.fusion import format_fused, fuse
from tcc.passes.te.im2col import im2col
from tcc.passes.te.lower import lower
from tcc.passes.te.specialize import specialize
from tcc.target import CudaTarget, Target, default_target

AfterPass = Callable[[str, str], None]
GEMM_K_LOOP = "kk"  # the micro-kernel's k loop in the auto-scheduler's GEMM nest, unrolled by tuning


@dataclass(frozen=True)
class Tuning:
    """What the tuner may change in the CPU auto-schedule: GEMM tiles by result tensor
    (``gemm_params`` keys) and an unroll factor for the micro-kernel's k loop."""

    tiles: dict[str, dict[str, int]] = field(default_factory=dict)
    unroll: int = 1

    def __str__(self) -> str:
        tiles = "; ".join(f"{t}: " + " ".join(f"{k}={v}" for k, v in sorted(p.items()))
                          for t, p in sorted(self.tiles.items()))
        return f"{tiles}; unroll={self.unroll}"


@dataclass
class Lowered:
    """What the pipeline produced for one specialisation; the schedule runs on first use.

    A warm start (the kernel is in the disk cache) never needs the scheduled loops, so they are
    built only when code is generated or a stage after ``loops`` is printed.
    """

    te: OpTE  # specialised and fused TE (its fusion decisions in ``fusion_notes``)
    loops: LoopFunc  # plain loop nests, straight from the TE
    target: Target  # the machine the schedule sizes its work for
    after_pass: AfterPass | None = None
    steps: tuple = ()  # the user's schedule (tcc.passes.loops.schedule.Step); empty: the auto-scheduler
    tuning: Tuning | None = None  # the tuner's choice for the auto-scheduler (tcc.tune)
    tf32: bool = False  # f32 contractions may round their operands to TF32 (tensor cores; opted in)
    _scheduled: LoopFunc | None = field(default=None, repr=False)

    @property
    def scheduled(self) -> LoopFunc:
        """The loops after the target's schedule."""
        if self._scheduled is None:
            tuning = self.tuning or Tuning()
            scheduled = schedule_for_target(self.loops, self.target, list(self.steps), tuning.tiles, tuning.unroll,
                                            self.tf32)
            verify_func(scheduled)
            if self.after_pass is not None:
                self.after_pass("schedule", format_func(scheduled))
            self._scheduled = scheduled
        return self._scheduled


def run_pipeline(op: OpTE, bindings: dict[str, int | float], target: str | Target,
                 after_pass: AfterPass | None = None, options: dict | None = None, steps: tuple = ()) -> Lowered:
    def report(name: str, text: str) -> None:
        if after_pass is not None:
            after_pass(name, text)

    te = specialize(op, bindings)
    verify_op(te)
    report("specialize", format_op(te))
    check_bounds(te)
    report("bounds", "all reads proved in bounds")
    conv = (options or {}).get("conv", "auto")
    te = fuse(te, before_grouping=lambda t: im2col(t, conv))
    report("fusion", format_fused(te))
    loops = lower(te)
    verify_func(loops)
    report("lower", format_func(loops))
    return Lowered(te, loops, default_target(target), after_pass, steps, tf32=bool((options or {}).get("tf32")))


def schedule_for_target(func: LoopFunc, target: str | Target, steps: list | None = None,
                        params: dict | None = None, unroll: int = 1, tf32: bool = False) -> LoopFunc:
    """The user's schedule when there is one, else the target's auto-scheduler (with the tuner's
    GEMM tiles ``params`` by result tensor, and its k-loop unroll factor; on CUDA, f32
    contractions on TF32 tensor cores when ``tf32``)."""
    machine = default_target(target)
    if isinstance(machine, CudaTarget):
        from tcc.passes.autoschedule_cuda.schedule import schedule_cuda

        if steps:  # the nests the user bound are kernels as they are; the others are auto-scheduled
            scheduled = apply_schedule(func, steps)
            check_gpu_schedule(func, scheduled, steps)
            func = scheduled
        return schedule_cuda(func, machine, tf32)

    if steps:
        return apply_schedule(func, steps)
    from tcc.passes.autoschedule_cpu.schedule import autoschedule

    func = autoschedule(func, params)
    return apply_schedule(func, [Step("unroll", (GEMM_K_LOOP, "by", unroll))]) if unroll > 1 else func
