"""Recurrences on the GPU: the independent axes go to threads, the sequential one runs as a loop
inside each thread.

A recurrence's nest arrives as ``for t (sequential) { for d { H[t, d] = ... H[t - 1, d] ... } }``.
Its ``d`` iterations never read each other's elements (sema allows reads at earlier positions
along ``t`` only, at the same ``d``), so ``t`` may move inside them: ``for d { for t { ... } }``.
The flat schedule then binds ``d`` to blocks and threads, and each thread walks its own ``t`` in
order; consecutive threads take consecutive ``d``, so the loads stay coalesced.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import free_vars
from tcc.ir.loops import For, Stmt, is_sequential


def sink_sequential(s: Stmt) -> Stmt:
    """``s`` with each sequential loop moved below the independent loops perfectly nested in it."""
    if not isinstance(s, For):
        return s
    inner = s.body
    if is_sequential(s) and isinstance(inner, For) and inner.kind == "serial" and not is_sequential(inner) \
            and s.var.name not in free_vars(inner.extent):
        return replace(inner, body=sink_sequential(replace(s, body=inner.body)))
    return replace(s, body=sink_sequential(inner))
