"""Per-row intermediates too large for a thread's stack become global buffers with a row each.

Fusion keeps a per-row intermediate inside its row's loop nest (``e[c]`` of a softmax, under
``for n``); the TE lowering puts it on the stack up to ``LOCAL_LIMIT`` bytes and in a heap
buffer made inside the nest beyond that. The CPU allocates such a buffer once a call; a GPU
kernel cannot allocate global memory. Here each such buffer moves out of the nest and takes the
enclosing independent loops as leading dimensions: ``e[c]`` under ``for n`` becomes
``e[n, c]`` of a global intermediate that lives for the call (every block its own row), and the
nest schedules as if fusion had kept that one tensor apart.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import Expr, Load, Var, free_vars
from tcc.ir.loopnest import replace_loads
from tcc.ir.loops import Allocate, Buffer, For, Stmt, Store, map_stmt, walk_stmts
from tcc.passes.autoschedule_cuda.indexing import size_of


def hoist(nest: Stmt, temps: list[Buffer]) -> Stmt | None:
    """``nest`` with its inner global buffers moved out (appended to ``temps``); None when one
    is not under independent loops alone (then it cannot be given a row per iteration)."""
    outer: list[For] = []
    s = nest
    while isinstance(s, For) and s.kind == "serial" and not free_vars(s.extent) & {f.var.name for f in outer}:
        outer.append(s)  # (an extent of dynamic shape symbols is the call's: its rows are known then)
        s = s.body
    inner = [a.buffer for a in walk_stmts(nest) if isinstance(a, Allocate) and a.buffer.scope == "global"]
    enclosing = _enclosing(nest, {b.name for b in inner})
    if any(len(enclosing[b.name]) > len(outer) or any(f is not o for f, o in zip(enclosing[b.name], outer))
           for b in inner):
        return None
    rows = {b.name: enclosing[b.name] for b in inner}
    for b in inner:
        temps.append(replace(b, shape=(*(size_of(f) for f in rows[b.name]), *b.shape)))
    return _rewrite(nest, rows)


def _enclosing(nest: Stmt, names: set[str]) -> dict[str, list[For]]:
    """The loops around each named allocation, outermost first."""
    found: dict[str, list[For]] = {}

    def visit(s: Stmt, loops: list[For]) -> None:
        if isinstance(s, Allocate) and s.buffer.name in names:
            found[s.buffer.name] = loops
        for child in s.children():
            visit(child, [*loops, s] if isinstance(s, For) else loops)
    visit(nest, [])
    return found


def _rewrite(nest: Stmt, rows: dict[str, list[For]]) -> Stmt:
    def lead(name: str) -> tuple[Expr, ...]:
        return tuple(Var(f.var.name, f.var.dtype) for f in rows[name])

    nest = replace_loads(nest, lambda n: Load(n.buffer, (*lead(n.buffer), *n.indices), n.dtype)
                         if n.buffer in rows else None)

    def stmt(s: Stmt) -> Stmt | None:
        if isinstance(s, Allocate) and s.buffer.name in rows:
            return s.body
        if isinstance(s, Store) and s.buffer in rows:
            return replace(s, indices=(*lead(s.buffer), *s.indices))
        return None
    return map_stmt(nest, stmt)
