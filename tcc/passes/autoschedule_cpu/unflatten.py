"""unflatten: split a loop over a flattened index back into its row and column loops.

im2col flattens the output pixels into one index ``j`` (the GEMM's columns), so its patch gather
reads ``X[..., j // W + r, j % W + s]``: a non-affine index that vectorises only as a per-lane
gather. ``for j in 0..H*W`` becomes ``for j_row in 0..H: for j_col in 0..W`` with
``j // W = j_row`` and ``j % W = j_col``, after which the reads are unit-stride in ``j_col``.
The iterations run in the same order, so the result is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import Binary, Const, Expr, Var, iadd, imul, transform, walk
from tcc.ir.loopnest import fresh, map_exprs, subst
from tcc.ir.loops import For, LoopFunc, Stmt, map_stmt, stmt_exprs, walk_stmts


def unflatten(func: LoopFunc, loop: str, width: int) -> LoopFunc:
    """Split every loop ``loop`` whose extent ``width`` divides into ``{loop}_row x {loop}_col``."""
    row, col = fresh(func, f"{loop}_row"), fresh(func, f"{loop}_col")

    def node(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and s.var.name == loop and isinstance(s.extent, Const) \
                and int(s.extent.value) % width == 0:  # (another statement's k1 may run 0..i: a prefix)
            return split_flat(s, width, row, col)
        return None

    return replace(func, body=map_stmt(func.body, node))


def divmod_width(s: For) -> int | None:
    """The one constant ``W`` with which the body uses ``v // W`` or ``v % W`` (None if not one)."""
    v = Var(s.var.name)
    widths = {n.b.value for st in walk_stmts(s.body) for e in stmt_exprs(st) for n in walk(e)
              if isinstance(n, Binary) and n.op in ("floordiv", "mod") and n.a == v and isinstance(n.b, Const)}
    return int(widths.pop()) if len(widths) == 1 else None


def split_flat(s: For, width: int, row: str, col: str) -> For:
    """``s`` (its extent a multiple of ``width``) as ``row x col`` loops, ``v // width`` read as
    ``row`` and ``v % width`` as ``col``."""
    v, r, c = Var(s.var.name), Var(row), Var(col)

    def parts(e: Expr) -> Expr:
        return transform(e, lambda n: (r if n.op == "floordiv" else c)
                         if isinstance(n, Binary) and n.op in ("floordiv", "mod") and n.a == v
                         and n.b == Const(width, n.b.dtype) else None)

    body = subst(map_exprs(s.body, parts), {s.var.name: iadd(imul(r, width), c)})
    inner = For(c, Const(width, s.extent.dtype), body, span=s.span)
    return replace(s, var=r, extent=Const(int(s.extent.value) // width, s.extent.dtype), body=inner)  # type: ignore[attr-defined]
