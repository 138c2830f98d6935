"""A row's elements in registers: each thread of the row schedule keeps the elements it touches.

The row schedule gives a block one row (softmax, layernorm, rmsnorm) and makes each of the
row's loops block-strided: element ``rid = rstep * T + tx`` goes to thread ``tx`` at step
``rstep``. Every loop of the row has the same length, so each thread touches the same elements
in every loop. Two things then need no memory:

* a per-row array that fusion made (``e[n, c] = exp(X[n, c] - m[n])``), which the row schedule
  would place in shared memory (32 KB for a row of 8192 floats: fewer blocks per SM, and a
  barrier after each loop that writes it), is a thread's array of ``steps`` values;
* an input read by several loops at the loop's element (layernorm reads ``X[n, d]`` three
  times: the mean, the variance, the result) is loaded once, by the first loop, into such an
  array, and the later loops read it there: one pass over global memory instead of three.

With the step loops unrolled the arrays are registers. The rewrite applies to the accesses
indexed by the loop's own element (the loop's axes, in order, as the trailing indices, the
leading ones the same in every loop); anything else keeps its memory. At most
``MAX_VALUES`` values a thread (more would spill to local memory, slower than the L2 hits they
replace).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tcc.dtypes import DType
from tcc.ir.expr import Const, Expr, Load, Var, free_vars, transform
from tcc.ir.loopnest import loads
from tcc.ir.loops import Allocate, Buffer, For, Stmt, Store, map_stmt, seq, walk_stmts

MAX_VALUES = 64  # register values a thread may keep for its row

Fresh = Callable[[str], Var]
Key = tuple[str, tuple[Expr, ...]]  # (tensor, leading indices): one row of an input


@dataclass
class RowCache:
    """What the threads of one row keep in registers."""

    steps: int  # elements of the row per thread
    extents: tuple[int, ...]  # the row's loop extents, the same in every loop
    arrays: dict[str, Buffer]  # per-row array -> the thread's register array for it
    inputs: dict[Key, Buffer]  # an input's row -> the thread's register array for it
    loaded: set[Key] = field(default_factory=set)  # inputs already loaded by an earlier loop


def plan(body: Stmt, loops: list[For], threads: int, fresh: Fresh,
         shapes: dict[str, tuple[int, ...]]) -> RowCache | None:
    """The register arrays for a row whose top-level loop nests are ``loops``; None when no
    access qualifies, when the loops differ in shape, or when the arrays would not fit."""
    shapes_seen = {_extents(f) for f in loops}
    if len(shapes_seen) != 1:
        return None
    extents = shapes_seen.pop()
    steps = -(-math.prod(extents) // threads)
    stored = {s.buffer for s in walk_stmts(body) if isinstance(s, Store)}
    local = {s.buffer.name: s.buffer for s in walk_stmts(body)
             if isinstance(s, Allocate) and s.buffer.scope == "local" and s.buffer.size > 1}
    arrays = {name: Buffer(fresh(f"{name}_r").name, buf.dtype, (steps,), "local") for name, buf in local.items()
              if buf.shape == extents and _aligned_everywhere(body, loops, name)}
    counts: dict[Key, int] = {}
    dtypes: dict[str, DType] = {}
    for f in loops:
        for key, dtype in _aligned_reads(f).items():
            trailing_dims = shapes.get(key[0], ())[len(key[1]):]
            if key[0] not in stored and key[0] not in local and trailing_dims == extents:
                counts[key] = counts.get(key, 0) + 1
                dtypes[key[0]] = dtype
    inputs = {key: Buffer(fresh(f"{key[0]}_r").name, dtypes[key[0]], (steps,), "local")
              for key, count in counts.items() if count > 1}
    if not (arrays or inputs) or steps * (len(arrays) + len(inputs)) > MAX_VALUES:
        return None
    return RowCache(steps, extents, arrays, inputs)


def rewrite(body: Stmt, axes: list[For], step: Expr, cache: RowCache) -> Stmt:
    """One loop nest's body with its cached accesses on the thread's register arrays at
    ``step``; the first loop to read an input loads it into its array."""
    trailing = _trailing(axes)

    def cached(load: Load) -> Buffer | None:
        if load.buffer in cache.arrays and load.indices == trailing:
            return cache.arrays[load.buffer]
        return cache.inputs.get(_key(load, trailing))  # type: ignore[arg-type]

    first = [k for k in cache.inputs if k not in cache.loaded and k in _aligned_reads_of(body, trailing)]
    cache.loaded.update(first)

    def expr(e: Expr) -> Expr:
        def visit(n: Expr) -> Expr | None:
            buf = cached(n) if isinstance(n, Load) else None
            return None if buf is None else Load(buf.name, (step,), n.dtype)
        return transform(e, visit)

    def stmt(s: Stmt) -> Stmt | None:
        if not isinstance(s, Store):
            return None
        if s.buffer in cache.arrays and s.indices == trailing:
            return Store(cache.arrays[s.buffer].name, (step,), expr(s.value), span=s.span)
        return replace(s, indices=tuple(expr(i) for i in s.indices), value=expr(s.value))

    loads = [Store(cache.inputs[k].name, (step,), Load(k[0], (*k[1], *trailing), cache.inputs[k].dtype))
             for k in first]
    return seq(*loads, map_stmt(body, stmt))


def axes_of(loop: For) -> list[For]:
    """The perfectly nested serial loops of a row's loop nest, outermost first."""
    axes = []
    s: Stmt = loop
    while isinstance(s, For) and s.kind == "serial":
        axes.append(s)
        s = s.body
    return axes


def _extents(loop: For) -> tuple[int, ...]:
    return tuple(int(a.extent.value) if isinstance(a.extent, Const) else -1 for a in axes_of(loop))


def _trailing(axes: list[For]) -> tuple[Var, ...]:
    return tuple(Var(a.var.name, a.var.dtype) for a in axes)


def _key(load: Load, trailing: tuple[Var, ...]) -> Key | None:
    """(tensor, leading indices) of a load at the loop's element, else None."""
    n = len(trailing)
    if len(load.indices) < n or load.indices[len(load.indices) - n:] != trailing:
        return None
    lead = load.indices[:len(load.indices) - n]
    names = {v.name for v in trailing}
    return None if any(free_vars(i) & names for i in lead) else (load.buffer, lead)


def _aligned_reads_of(s: Stmt, trailing: tuple[Var, ...]) -> dict[Key, DType]:
    return {key: load.dtype for load in loads(s) if (key := _key(load, trailing)) is not None}


def _aligned_reads(loop: For) -> dict[Key, DType]:
    return _aligned_reads_of(loop, _trailing(axes_of(loop)))


def _accesses(s: Stmt, name: str) -> list[tuple[Expr, ...]]:
    """The indices of every load and store of ``name`` in ``s``."""
    return [t.indices for t in walk_stmts(s) if isinstance(t, Store) and t.buffer == name] + \
        [n.indices for n in loads(s) if n.buffer == name]


def _aligned_everywhere(body: Stmt, loops: list[For], name: str) -> bool:
    """Whether a per-row array is touched only inside the loops, each time at the loop's element."""
    inside = [idx for f in loops for idx in _accesses(f, name)]
    aligned = all(idx == _trailing(axes_of(f)) for f in loops for idx in _accesses(f, name))
    return aligned and len(inside) == len(_accesses(body, name))
