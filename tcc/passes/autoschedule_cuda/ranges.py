"""Kernels by the range of a dynamic size: each range of a shape symbol's extent its own schedule.

A kernel compiled for every size of a dynamic shape symbol cannot be the one a constant size gets
at every size: a row of 1000 elements wants 4 steps of 256 threads in registers, a row of 8000
32 steps; a GEMM of 8 rows wants its reduction split across blocks, one of 8192 rows 128 x 128
tiles. So a schedule builds the kernels of a few ranges ``(lo, hi]`` of the extent, each as a
constant size in the range gets them but with the extent a variable (tails guarded or masked),
and marks every kernel of a range with the condition ``lo < E <= hi`` (annotation ``requires``:
the launch checks it, the compiler assumes it), so that one range's kernels run per call. The
ranges cover every size: the last one is open above. The choice is the schedule's, by the
symbol's range; codegen and the launcher only read the conditions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Var, format_expr, substitute
from tcc.ir.loops import ALIGNED, REQUIRES, Allocate, Buffer, For, Seq, Stmt, seq, walk_stmts
from tcc.passes.autoschedule_cuda.indexing import assuming

I64 = dtypes.i64


def by_range(extent: Expr, ranged: list[tuple[int, Stmt]], rest: Stmt) -> Stmt:
    """``ranged``'s kernels ``(hi, kernels)`` (``hi`` ascending) for the calls with ``extent`` in
    ``(previous hi, hi]``, then ``rest`` for the calls past the last ``hi``: every kernel
    annotated with its range's condition."""
    out: list[Stmt] = []
    low: int | None = None
    for high, kernels in ranged:
        out.append(_requiring(kernels, _within(extent, low, high)))
        low = high
    out.append(rest if low is None else _requiring(rest, _within(extent, low, None)))
    return seq(*out)


def _within(extent: Expr, low: int | None, high: int | None) -> Expr:
    """``low < extent <= high``, either side left out where None."""
    parts = ([Binary("lt", Const(low, I64), extent, dtypes.boolean)] if low is not None else []) + \
        ([Binary("le", extent, Const(high, I64), dtypes.boolean)] if high is not None else [])
    cond = parts[0]
    for part in parts[1:]:
        cond = Binary("and", cond, part, dtypes.boolean)
    return cond


def _requiring(kernels: Stmt, cond: Expr) -> Stmt:
    """Each kernel of ``kernels`` with ``cond`` and'ed to what it already requires."""
    def one(kernel: Stmt) -> Stmt:
        assert isinstance(kernel, For) and kernel.kind == "block.x"
        own = next((v for k, v in kernel.annotations if k == REQUIRES), None)
        both = cond if own is None else Binary("and", own, cond, dtypes.boolean)
        return replace(kernel, annotations=(*((k, v) for k, v in kernel.annotations if k != REQUIRES),
                                            (REQUIRES, both)))
    return seq(*map(one, kernels.stmts if isinstance(kernels, Seq) else (kernels,)))


# the sizes whose kernels are built, each for the range above the one before it; above the last,
# twice it. Powers of two and the halves between them (a GEMM of 512 x 512 weights splits K up to
# M = 48 and not from 64: rows 33 to 48 take 48's kernels)
SAMPLES = (1, *sorted({2 ** i for i in range(1, 14)} | {3 * 2 ** i for i in range(12)}))  # 1 2 3 4 6 8 ... 8192


def by_samples(symbol: Var, build: Callable[[], tuple[Stmt, str]], temps: list[Buffer]) -> tuple[Stmt, str]:
    """The kernels ``build`` makes while :func:`assuming` the shape symbol at each of ``SAMPLES``
    (and above), joined as the ranges (:func:`by_range`) of the samples that give the same kernels
    (:func:`fingerprint`): a few ranges, each with the schedule a constant size in it gets (its
    smallest sample's: the range ``(u, v]`` of a sample ``v`` after ``u`` takes ``v``'s kernels). A
    range's global intermediates stay in ``temps``, sized for its largest value (all of them are
    allocated for a call: split-K's partials of 8192 rows would take every range's), those of
    kernels not used are taken out."""
    found: list[tuple[int, Stmt, str, tuple, int, int]] = []  # (highest sample, kernels, how, fingerprint, temps)
    for value in (*SAMPLES, 2 * SAMPLES[-1]):
        made = len(temps)
        with assuming({symbol.name: value}):
            kernels, how = build()
        key = fingerprint(kernels)
        if found and found[-1][3] == key:
            del temps[made:]
            found[-1] = (value, *found[-1][1:])
        else:
            found.append((value, kernels, how, key, made, len(temps)))
    for high, _, _, _, first, end in found[:-1]:
        capped = {symbol.name: Binary("min", symbol, Const(high, I64), I64)}
        temps[first:end] = [replace(b, shape=tuple(d if isinstance(d, int) else substitute(d, capped) for d in b.shape))
                            for b in temps[first:end]]
    ranged = [(high, kernels) for high, kernels, *_ in found[:-1]]
    hows = " | ".join(f"{how} to {high}" for high, _, how, *_ in found[:-1])
    return by_range(symbol, ranged, found[-1][1]), f"by {symbol.name}: {hows} | {found[-1][2]}" if hows \
        else found[-1][2]


def fingerprint(kernels: Stmt) -> tuple:
    """What ``kernels`` are, their variables' names left out: each loop's kind, extent and
    annotations, each buffer's scope, type and shape, in order (two ranges with the same are one).
    An aligned variant's fallback is left out: it runs only for misaligned calls, and its tiles
    differing would double the kernels to compile (the tensor-core GEMM's register-staged one)."""
    out: list[tuple] = []
    after_aligned = False
    for kernel in kernels.stmts if isinstance(kernels, Seq) else (kernels,):
        if not after_aligned:
            out.extend(_shape(kernel))
        after_aligned = isinstance(kernel, For) and any(k == ALIGNED for k, _ in kernel.annotations)
    return tuple(out)


def _shape(kernel: Stmt) -> list[tuple]:
    out: list[tuple] = []
    for s in walk_stmts(kernel):
        if isinstance(s, For):
            out.append((s.kind, format_expr(s.extent), tuple(k for k, _ in s.annotations)))
        elif isinstance(s, Allocate):
            out.append((s.buffer.scope, s.buffer.dtype.name,
                        tuple(d if isinstance(d, int) else format_expr(d) for d in s.buffer.shape)))
        else:
            out.append((type(s).__name__,))
    return out
