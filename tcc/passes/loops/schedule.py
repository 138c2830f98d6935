"""Apply a user's schedule: a list of steps, each one primitive pass, in order.

A step is what one line of a ``schedule OP cpu { ... }`` block says (or one ``;``-separated part
of the text given to ``op.schedule(...)``): a primitive, its words (loop and tensor names,
numbers, the keywords ``by``/``at``), and optionally ``-> names`` for the loops it creates.
Errors point at the step.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Cast, Load
from tcc.ir.loopnest import stores
from tcc.ir.loops import Allocate, For, LoopFunc, verify_func, walk_stmts
from tcc.ir.step import Step
from tcc.passes.loops.bind import bind, check_kernels
from tcc.passes.loops.cache import cache
from tcc.passes.loops.compute_at import compute_at
from tcc.passes.loops.fuse import fuse
from tcc.passes.loops.inline import inline
from tcc.passes.loops.parallel import parallel
from tcc.passes.loops.reduction import decompose_reduction
from tcc.passes.loops.reorder import reorder
from tcc.passes.loops.split import split
from tcc.passes.loops.tensorize import mark as mark_tensorize
from tcc.passes.loops.unroll import unroll
from tcc.passes.loops.vectorize import vectorize
from tcc.passes.trace import Trace
from tcc.target import Target

USAGE = {
    "split": "split LOOP by N [-> OUTER, INNER]",
    "tile": "tile LOOP1, LOOP2 by N1, N2",
    "reorder": "reorder LOOP, LOOP, ...",
    "fuse": "fuse OUTER, INNER [-> NAME]",
    "unroll": "unroll LOOP [by N]",
    "vectorize": "vectorize LOOP [by N]",
    "parallel": "parallel LOOP",
    "cache": "cache TENSOR at LOOP [local [init]|global|shared [pad|swizzle] [async]]",
    "compute_at": "compute_at TENSOR at LOOP",
    "inline": "inline TENSOR",
    "decompose": "decompose TENSOR",
    "bind": "bind LOOP block|thread|warp|warpgroup",
    "tensorize": "tensorize LOOP mma.sync|mma.sync.tf32|wgmma|wgmma.tf32",
}


def apply_schedule(func: LoopFunc, steps: list[Step], trace: Trace, target: Target) -> LoopFunc:
    """``func`` after each step in turn (each reported through ``trace``), sized for ``target``."""
    for step in steps:
        func = trace(str(step), apply_step(func, step, target))
    verify_func(func)
    return func


def apply_step(func: LoopFunc, step: Step, target: Target) -> LoopFunc:
    handler = _HANDLERS.get(step.prim)
    if handler is None:
        raise TccScheduleError(f"unknown schedule primitive {step.prim!r}", step.span,
                               "primitives: " + ", ".join(USAGE))
    try:
        if step.prim == "cache":  # the primitives that size themselves by the machine
            return _cache(func, step, target.shared_memory_per_block)
        if step.prim == "bind":  # (a GPU primitive: the backend offers it on a GPU target only)
            return _bind(func, step, target.max_threads_per_block)  # type: ignore[union-attr]
        return handler(func, step)
    except (ValueError, IndexError, TypeError):
        raise TccScheduleError(f"malformed {step.prim} step: {step}", step.span,
                               f"write it as: {USAGE[step.prim]}") from None


def _names(step: Step, count: int) -> list[str | None]:
    if step.names and len(step.names) != count:
        raise TccScheduleError(f"{step.prim} creates {count} loop(s), {len(step.names)} name(s) given", step.span)
    return list(step.names) if step.names else [None] * count


def _by(step: Step) -> tuple[list[str], list[int]]:
    """``a, b by 4, 8`` -> (["a", "b"], [4, 8])."""
    words = list(step.words)
    if "by" not in words:
        return [str(w) for w in words], []
    k = words.index("by")
    numbers = words[k + 1:]
    if not numbers or not all(isinstance(n, int) for n in numbers):
        raise ValueError("numbers expected after by")
    return [str(w) for w in words[:k]], [int(n) for n in numbers]


def _at(step: Step) -> tuple[str, str, list[str]]:
    words = [str(w) for w in step.words]
    if len(words) < 3 or words[1] != "at":
        raise ValueError("TENSOR at LOOP expected")
    return words[0], words[2], words[3:]


def _split(func: LoopFunc, step: Step) -> LoopFunc:
    (loop,), (factor,) = _by(step)
    outer, inner = _names(step, 2)
    return split(func, loop, factor, outer, inner, step.span)


def _tile(func: LoopFunc, step: Step) -> LoopFunc:
    loops, factors = _by(step)
    if len(loops) != len(factors) or not loops:
        raise ValueError("one factor per loop")
    names = _names(step, 2 * len(loops))
    outers, inners = [], []
    for n, (loop, f) in enumerate(zip(loops, factors)):
        o = names[2 * n] or f"{loop}_o"
        i = names[2 * n + 1] or f"{loop}_i"
        func = split(func, loop, f, o, i, step.span)
        outers.append(o)
        inners.append(i)
    return reorder(func, outers + inners, step.span)


def _reorder(func: LoopFunc, step: Step) -> LoopFunc:
    order = [str(w) for w in step.words]
    try:
        return reorder(func, order, step.span)
    except TccScheduleError as err:
        blocker = _reduction_between(func, order) if "not perfectly nested" in err.message else None
        if blocker is None:
            raise
        raise TccScheduleError(err.message, err.span, f"the reduction into {blocker} sits between these loops; "
                                                      f"decompose({blocker}) as the first step") from None


def _reduction_between(func: LoopFunc, order: list[str]) -> str | None:
    """A tensor stored from a scalar accumulator inside the named loops (for the hint): its
    reduction loop cannot move until the reduction is decomposed."""
    buffers = func.buffers()
    for node in walk_stmts(func.body):
        if isinstance(node, For) and node.var.name in order:
            for st in stores(node.body):
                value = st.value
                while isinstance(value, Cast):
                    value = value.a
                if isinstance(value, Load) and buffers.get(value.buffer) is not None \
                        and buffers[value.buffer].scope == "local" and buffers.get(st.buffer) is not None \
                        and buffers[st.buffer].scope == "global":
                    return st.buffer
    return None


def _fuse(func: LoopFunc, step: Step) -> LoopFunc:
    outer, inner = (str(w) for w in step.words)
    (name,) = _names(step, 1)
    return fuse(func, outer, inner, name, step.span)


def _unroll(func: LoopFunc, step: Step) -> LoopFunc:
    (loop,), factors = _by(step)
    return unroll(func, loop, factors[0] if factors else None, step.span)


def _vectorize(func: LoopFunc, step: Step) -> LoopFunc:
    (loop,), factors = _by(step)
    return vectorize(func, loop, factors[0] if factors else None, step.span)


def _parallel(func: LoopFunc, step: Step) -> LoopFunc:
    (loop,) = (str(w) for w in step.words)
    return parallel(func, loop, step.span)


def _cache(func: LoopFunc, step: Step, shared_bytes: int) -> LoopFunc:
    tensor, loop, rest = _at(step)
    return cache(func, tensor, loop, rest[0] if rest else None, step.span, tuple(rest[1:]), shared_bytes)


def _compute_at(func: LoopFunc, step: Step) -> LoopFunc:
    tensor, loop, rest = _at(step)
    if rest:
        raise ValueError("nothing after the loop")
    return compute_at(func, tensor, loop, step.span)


def _inline(func: LoopFunc, step: Step) -> LoopFunc:
    (tensor,) = (str(w) for w in step.words)
    return inline(func, tensor, step.span)


def _decompose(func: LoopFunc, step: Step) -> LoopFunc:
    (tensor,) = (str(w) for w in step.words)
    return decompose_reduction(func, tensor, step.span)


def _bind(func: LoopFunc, step: Step, max_threads: int) -> LoopFunc:
    loop, axis = (str(w) for w in step.words)
    return bind(func, loop, axis, step.span, max_threads)


def _tensorize(func: LoopFunc, step: Step) -> LoopFunc:
    loop, what = (str(w) for w in step.words)
    return mark_tensorize(func, loop, what, step.span)


def check_gpu_schedule(before: LoopFunc, func: LoopFunc, steps: list[Step]) -> None:
    """After a CUDA schedule's steps (``before`` -> ``func``): every bound nest is a kernel
    (errors at the bind step), and no step made a buffer in device memory: one inside a kernel
    cannot be allocated, one outside would be shared by all its blocks and threads."""
    check_kernels(func, {str(s.words[0]): s.span for s in steps if s.prim == "bind"})
    old, top = before.buffers(), _top_level_buffers(func)
    for buf in func.buffers().values():
        if buf.scope == "global" and (buf.name not in old or buf.name not in top):
            step = next((s for s in steps if s.prim in ("cache", "compute_at") and buf.name.startswith(str(
                s.words[0]))), steps[-1])
            raise TccScheduleError(f"{buf.name} ({buf.size * buf.dtype.itemsize} bytes) would be in device memory, "
                                   "shared by every block and thread of the kernel", step.span,
                                   "cache into local or shared memory, at a loop where the tile is small")


def _top_level_buffers(func: LoopFunc) -> set[str]:
    """The parameters and the buffers allocated outside every loop nest."""
    names = {p.name for p in func.params}
    body = func.body
    while isinstance(body, Allocate):
        names.add(body.buffer.name)
        body = body.body
    return names


def contract(func: LoopFunc) -> LoopFunc:
    """Allow ``a * b + c`` to become one fused multiply-add (more accurate, never less)."""
    return replace(func, attrs={**func.attrs, "fp_contract": True})


_HANDLERS = {"split": _split, "tile": _tile, "reorder": _reorder, "fuse": _fuse, "unroll": _unroll,
             "vectorize": _vectorize, "parallel": _parallel, "cache": _cache, "compute_at": _compute_at,
             "inline": _inline, "decompose": _decompose, "bind": _bind, "tensorize": _tensorize}
