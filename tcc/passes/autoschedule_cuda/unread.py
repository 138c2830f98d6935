"""Stores into global intermediates that no kernel reads, dropped after scheduling.

A schedule that puts one kernel in the place of several nests can leave a tensor that only those
nests read: attention's backward on the matrix units (:mod:`.attention_backward`) reads ``dO / l``
from ``dO`` and ``l`` itself, so the ``S x D`` f32 tensor the generic sweep read (stored by the
nest of the row term, or by the forward's stream as it ends a row) would be written for nothing,
as much traffic as the backward's own reads of ``dO``. Such stores go, and the intermediate with
them where no store is left.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import Load, walk
from tcc.ir.loops import Buffer, Seq, Stmt, Store, map_stmt, stmt_exprs, walk_stmts
from tcc.ir.matrix_loops import MatrixStream


def drop_unread(kernels: list[Stmt], temps: list[Buffer]) -> tuple[list[Stmt], list[Buffer]]:
    """``kernels`` without their stores into the ``temps`` none of them reads, and the temps left."""
    read = {n.buffer for k in kernels for s in walk_stmts(k) for e in stmt_exprs(s) for n in walk(e)
            if isinstance(n, Load)}
    unread = {b.name for b in temps} - read
    if not unread:
        return kernels, temps

    def drop(s: Stmt) -> Stmt | None:
        if isinstance(s, Store) and s.buffer in unread:
            return Seq(())
        if isinstance(s, MatrixStream):  # (its stores are children map_stmt does not enter)
            return replace(s, out=map_stmt(s.out, drop), row_out=map_stmt(s.row_out, drop))
        return None
    kernels = [map_stmt(k, drop) for k in kernels]
    written = {s.buffer for k in kernels for s in walk_stmts(k) if isinstance(s, Store)}
    return kernels, [b for b in temps if b.name not in unread or b.name in written]
