"""Kernels for accumulating statements (``T[...] += expr``, a scatter) on the GPU.

Threads of a scatter may add into one element, so its store is an atomic add (the code generator
emits ``atomicAdd`` for every accumulating store of an ``f32``, ``f64``, ``i32`` or ``i64`` buffer)
and its nest is bound like any elementwise one. The order of the additions into one element then
varies between runs; with ``tcc.compile(..., deterministic=True)`` (or for element types that have
no atomic add: ``f16``, ``bf16``, ``i8``, ``bool``) the nest runs instead as one thread of one block,
in the statement's own order, the same on every run.
"""

from __future__ import annotations

from tcc.ir.expr import Const
from tcc.ir.loopnest import stores
from tcc.ir.loops import Buffer, For, Stmt

ATOMIC_DTYPES = ("f32", "f64", "i32", "i64")  # element types with a hardware atomic add


def accumulates(nest: Stmt) -> bool:
    """Whether ``nest`` holds an accumulating store (a ``+=`` statement)."""
    return any(st.accumulate for st in stores(nest))


def needs_serial(nest: Stmt, buffers: dict[str, Buffer], deterministic: bool) -> bool:
    """Whether the scatter ``nest`` must run as one thread: asked for a fixed order, or adding
    into a buffer whose type has no atomic add."""
    return deterministic or any(st.accumulate and buffers[st.buffer].dtype.name not in ATOMIC_DTYPES
                                for st in stores(nest))


def serial_kernel(nest: Stmt, fresh) -> Stmt:
    """``nest`` as it stands, in one thread of one block: its additions in the statement's order."""
    bx, tx = fresh("bx"), fresh("tx")
    one = Const(1, tx.dtype)
    span = nest.span if isinstance(nest, For) else None
    return For(bx, one, For(tx, one, nest, "thread.x", span=span), "block.x", span=span)



