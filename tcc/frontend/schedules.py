"""The schedule spelling: ``schedule OP TARGET { step(args) ... }`` blocks and ``op.schedule("...")``.

Each step is a call ``prim(arg, ...)`` whose arguments are loop names (the op's index variables,
and the names earlier steps created), tensor names, keywords or positive integers. This module
checks the spelling (primitive, argument count and kinds) and turns each call into the
:class:`tcc.passes.loops.schedule.Step` that the loop-IR passes apply; whether the named loops and
tensors exist, and whether a step keeps the result, is checked when the step runs on the loops
of concrete shapes. ``conv(im2col|direct|auto)`` is not a loop step: it picks the lowering of
convolutions before loops exist, so it travels beside the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from tcc.errors import TccScheduleError
from tcc.frontend import ast
from tcc.frontend.parser import parse_steps
from tcc.ir.step import Step

CONV_CHOICES = ("im2col", "direct", "auto")
CACHE_SCOPES = ("local", "global", "shared")
SHARED_OPTIONS = ("pad", "async", "swizzle")  # of cache(T, L, shared, ...): see tcc/passes/loops/cache_shared.py
LOCAL_OPTIONS = ("init",)  # of cache(T, L, local, ...): see tcc/passes/loops/init_tiles.py

# primitive -> (usage, allowed argument kinds: N a name, I a positive integer)
SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "split": ("split(LOOP, FACTOR[, OUTER, INNER])", ("NI", "NINN")),
    "tile": ("tile(LOOP1, LOOP2, FACTOR1, FACTOR2[, OUTER1, OUTER2, INNER1, INNER2])", ("NNII", "NNIINNNN")),
    "reorder": ("reorder(LOOP, LOOP, ...): outermost first", ()),
    "fuse": ("fuse(OUTER, INNER[, NAME])", ("NN", "NNN")),
    "unroll": ("unroll(LOOP[, FACTOR])", ("N", "NI")),
    "vectorize": ("vectorize(LOOP[, LANES])", ("N", "NI")),
    "parallel": ("parallel(LOOP)", ("N",)),
    "cache": ("cache(TENSOR, LOOP[, local[, init]|global|shared[, pad|swizzle][, async]])",
              ("NN", "NNN", "NNNN", "NNNNN")),
    "pack": ("pack(TENSOR, LOOP): another name of cache(TENSOR, LOOP)", ("NN",)),
    "compute_at": ("compute_at(TENSOR, LOOP)", ("NN",)),
    "inline": ("inline(TENSOR)", ("N",)),
    "decompose": ("decompose(TENSOR): split a reduction into init and update nests", ("N",)),
    "conv": ("conv(im2col|direct|auto)", ("N",)),
    "bind": ("bind(LOOP, block|thread|warp|warpgroup)", ("NN",)),
    "tensorize": ("tensorize(LOOP, mma.sync|mma.sync.tf32|wgmma|wgmma.tf32)", ("NN",)),
}
GPU_AXES = ("block", "thread", "warp", "warpgroup")
MATRIX_INSTRUCTIONS = ("mma.sync", "mma.sync.tf32", "wgmma", "wgmma.tf32")


class ScheduleRules(Protocol):
    """What a target kind's schedules may say: its backend (``tcc.runtime.backend``) answers."""

    kind: str
    primitives: frozenset[str]
    cache_scopes: frozenset[str]


# why a primitive or a cache scope is missing from a target kind, and what to write there instead
_NOT_OFFERED = {
    "parallel": ("parallel is a CPU primitive", "bind(LOOP, thread) runs a loop's iterations on the GPU's threads"),
    "vectorize": ("vectorize is a CPU primitive", "bind(LOOP, thread) runs a loop's iterations on the GPU's threads"),
    "bind": ("bind is a GPU primitive", "parallel(LOOP) runs a loop's iterations on the CPU's cores"),
    "tensorize": ("tensorize maps a tile onto the GPU's matrix units",
                  "vectorize(LOOP) and unroll(LOOP) build the CPU's register tiles"),
}
_NO_SCOPE = {
    "global": ("cache(..., global) is not supported on {kind}: it would allocate device memory inside a kernel",
               "cache into local memory"),
    "shared": ("shared memory is a GPU scope; a {kind} schedule cannot use it", "cache into local or global memory"),
}


@dataclass(frozen=True)
class Schedule:
    """A user's schedule for one op and target: the loop steps and the convolution choice."""

    steps: tuple[Step, ...] = ()
    conv: str | None = None

    def __str__(self) -> str:
        """The canonical text; it is part of the kernel cache key."""
        parts = [f"conv {self.conv}"] if self.conv else []
        return "; ".join(parts + [str(s) for s in self.steps])

    def __bool__(self) -> bool:
        return bool(self.steps) or self.conv is not None


def schedule_from_text(text: str, target: ScheduleRules) -> Schedule:
    """``op.schedule("split(i, 32); vectorize(i_i)")``: steps separated by ``;`` or newlines."""
    return schedule_from_steps(parse_steps(text), target)


def schedule_from_steps(steps: list[ast.SchedStep], target: ScheduleRules) -> Schedule:
    conv: str | None = None
    loop_steps: list[Step] = []
    for step in steps:
        _check_signature(step)
        _check_target(step, target)
        if step.prim == "conv":
            if conv is not None:
                raise TccScheduleError("the convolution lowering is chosen twice", step.span,
                                       "keep one conv(...) step")
            conv = _conv_choice(step)
        else:
            loop_steps.append(_TO_STEP[step.prim](step, _values(step)))
    return Schedule(tuple(loop_steps), conv)


def module_schedules(module: ast.Module, ops: set[str], target: ScheduleRules,
                     kinds: Collection[str]) -> dict[str, Schedule]:
    """The schedules of ``target`` by op; blocks for the other ``kinds`` are checked for op and
    target only."""
    found: dict[str, Schedule] = {}
    seen: set[tuple[str, str]] = set()
    for block in module.schedules:
        op, block_target = _name(block.op, "an op name"), _name(block.target, "a target")
        if op not in ops:
            raise TccScheduleError(f"schedule for unknown op {op!r}", block.op.span,
                                   f"ops in this file: {', '.join(sorted(ops)) or 'none'}")
        if block_target not in kinds:
            raise TccScheduleError(f"unknown target {block_target!r}", block.target.span,
                                   f"write one of: {', '.join(kinds)}")
        if (op, block_target) in seen:
            raise TccScheduleError(f"a second schedule for {op} on {block_target}", block.op.span,
                                   "merge the two blocks into one")
        seen.add((op, block_target))
        if block_target == target.kind:
            found[op] = schedule_from_steps(block.steps, target)
    return found


# ---------------------------------------------------------------- checking one step

def _check_signature(step: ast.SchedStep) -> None:
    signature = SIGNATURES.get(step.prim)
    if signature is None:
        raise TccScheduleError(f"unknown schedule primitive {step.prim!r}", step.span,
                               "primitives: " + ", ".join(SIGNATURES))
    usage, shapes = signature
    kinds = "".join("I" if isinstance(a.value, int | float) else "N" for a in step.args)
    if not shapes:  # reorder: two or more names
        shapes = ("N" * max(2, len(step.args)),)
    match = next((s for s in shapes if len(s) == len(kinds)), None)
    if match is None:
        counts = " or ".join(str(len(s)) for s in shapes)
        raise TccScheduleError(f"{step.prim} takes {counts} arguments, got {len(step.args)}", step.span,
                               f"write it as {usage}")
    for arg, want in zip(step.args, match):
        _check_arg(step, arg, want, usage)


def _check_target(step: ast.SchedStep, target: ScheduleRules) -> None:
    if step.prim not in target.primitives:
        offered = ", ".join(sorted(target.primitives))
        what, hint = _NOT_OFFERED.get(step.prim, (f"{step.prim} is not a {target.kind} primitive",
                                                  f"primitives on {target.kind}: {offered}"))
        raise TccScheduleError(f"{what}; a {target.kind} schedule cannot use it", step.span, hint)
    if step.prim == "cache" and len(step.args) == 3 and step.args[2].value not in target.cache_scopes \
            and step.args[2].value in _NO_SCOPE:
        what, hint = _NO_SCOPE[str(step.args[2].value)]
        raise TccScheduleError(what.format(kind=target.kind), step.args[2].span, hint)
    if step.prim == "bind" and step.args[1].value not in GPU_AXES:
        raise TccScheduleError(f"unknown GPU axis {step.args[1].value!r}", step.args[1].span,
                               f"write bind(LOOP, AXIS) with AXIS one of: {', '.join(GPU_AXES)}")
    if step.prim == "tensorize" and step.args[1].value not in MATRIX_INSTRUCTIONS:
        raise TccScheduleError(f"unknown matrix instruction {step.args[1].value!r}", step.args[1].span,
                               f"write one of: {', '.join(MATRIX_INSTRUCTIONS)}")


def _check_arg(step: ast.SchedStep, arg: ast.Word, want: str, usage: str) -> None:
    value = arg.value
    if want == "N" and not isinstance(value, str):
        raise TccScheduleError(f"{step.prim}: expected a name here, got {value!r}", arg.span,
                               f"write it as {usage}")
    if want == "I" and not (isinstance(value, int) and value > 0):
        what = "a positive integer" if isinstance(value, int) else "an integer"
        raise TccScheduleError(f"{step.prim}: expected {what} here, got {value!r}", arg.span,
                               f"write it as {usage}")


def _values(step: ast.SchedStep) -> list[str | int]:
    return [a.value for a in step.args]  # type: ignore[misc]


def _name(word: ast.Word, what: str) -> str:
    if not isinstance(word.value, str):
        raise TccScheduleError(f"expected {what}, got {word.value!r}", word.span)
    return word.value


def _conv_choice(step: ast.SchedStep) -> str:
    choice = str(step.args[0].value)
    if choice not in CONV_CHOICES:
        raise TccScheduleError(f"unknown convolution lowering {choice!r}", step.args[0].span,
                               f"write one of: {', '.join(CONV_CHOICES)}")
    return choice


def _cache_step(step: ast.SchedStep, v: list) -> Step:
    if len(v) >= 3 and v[2] not in CACHE_SCOPES:
        raise TccScheduleError(f"unknown buffer scope {v[2]!r}", step.args[2].span,
                               f"write one of: {', '.join(CACHE_SCOPES)}")
    for arg in step.args[3:]:
        allowed = SHARED_OPTIONS if v[2] == "shared" else LOCAL_OPTIONS if v[2] == "local" else ()
        if arg.value not in allowed:
            what = f"unknown cache option {arg.value!r}" if arg.value not in SHARED_OPTIONS + LOCAL_OPTIONS else \
                f"cache option {arg.value} does not apply to {v[2]} tiles"
            raise TccScheduleError(what, arg.span, f"options: cache(T, L, shared, {'|'.join(SHARED_OPTIONS)}), "
                                                   f"cache(T, L, local, {'|'.join(LOCAL_OPTIONS)})")
    if len(set(v[3:])) != len(v[3:]):
        raise TccScheduleError("a cache option is given twice", step.span)
    return Step("cache", (v[0], "at", *v[1:]), span=step.span)


def _mk(build: Callable[[list], tuple[str, tuple, tuple]]) -> Callable[[ast.SchedStep, list], Step]:
    def make(step: ast.SchedStep, v: list) -> Step:
        prim, words, names = build(v)
        return Step(prim, words, names, span=step.span)
    return make


_TO_STEP: dict[str, Callable[[ast.SchedStep, list], Step]] = {
    "split": _mk(lambda v: ("split", (v[0], "by", v[1]), tuple(v[2:]))),
    # tile names its loops in nest order (outers, then inners); Step takes (outer, inner) pairs
    "tile": _mk(lambda v: ("tile", (v[0], v[1], "by", v[2], v[3]), (v[4], v[6], v[5], v[7]) if v[4:] else ())),
    "reorder": _mk(lambda v: ("reorder", tuple(v), ())),
    "fuse": _mk(lambda v: ("fuse", (v[0], v[1]), tuple(v[2:]))),
    "unroll": _mk(lambda v: ("unroll", (v[0], "by", v[1]) if len(v) > 1 else (v[0],), ())),
    "vectorize": _mk(lambda v: ("vectorize", (v[0], "by", v[1]) if len(v) > 1 else (v[0],), ())),
    "parallel": _mk(lambda v: ("parallel", (v[0],), ())),
    "cache": _cache_step,
    "pack": _mk(lambda v: ("cache", (v[0], "at", v[1]), ())),
    "compute_at": _mk(lambda v: ("compute_at", (v[0], "at", v[1]), ())),
    "inline": _mk(lambda v: ("inline", (v[0],), ())),
    "decompose": _mk(lambda v: ("decompose", (v[0],), ())),
    "bind": _mk(lambda v: ("bind", (v[0], v[1]), ())),
    "tensorize": _mk(lambda v: ("tensorize", (v[0], v[1]), ())),
}
