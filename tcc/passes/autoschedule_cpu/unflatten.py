"""unflatten: split a loop over a flattened index back into its row and column loops.

im2col flattens the output pixels into one index ``j`` (the GEMM's columns), so its patch gather
reads ``X[..., j // W + r, j % W + s]``: a non-affine index that vectorises only as a per-lane
gather. ``for j in 0..H*W`` becomes ``for j_row in 0..H: for j_col in 0..W`` with
``j // W = j_row`` and ``j % W = j_col``, after which the reads are unit-stride in ``j_col``.
The iterations run in the same order, so the result is unchanged. A width that dynamic shape
symbols give (``W``, known at the call) splits a loop whose extent is ``H * W`` by its form:
the division by a runtime value per element was the patch gather's whole cost.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import Binary, Const, Expr, Var, free_vars, iadd, imul, transform, walk
from tcc.ir.loopnest import fresh, map_exprs, subst
from tcc.ir.loops import For, LoopFunc, Stmt, map_stmt, stmt_exprs, walk_stmts


def unflatten(func: LoopFunc, loop: str, width: int | Expr) -> LoopFunc:
    """Split every loop ``loop`` whose extent ``width`` divides into ``{loop}_row x {loop}_col``."""
    row, col = fresh(func, f"{loop}_row"), fresh(func, f"{loop}_col")

    def node(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and s.var.name == loop and rows_of(s, width) is not None:
            return split_flat(s, width, row, col)  # (another statement's k1 may run 0..i: a prefix)
        return None

    return replace(func, body=map_stmt(func.body, node))


def divmod_width(s: For) -> int | Expr | None:
    """The one ``W`` with which the body uses ``v // W`` or ``v % W`` (None if not one): a
    constant, or an expression of dynamic shape symbols."""
    v = Var(s.var.name)
    widths = {n.b for st in walk_stmts(s.body) for e in stmt_exprs(st) for n in walk(e)
              if isinstance(n, Binary) and n.op in ("floordiv", "mod") and n.a == v and not free_vars(n.b) & {v.name}}
    if len(widths) != 1:
        return None
    width = widths.pop()
    return int(width.value) if isinstance(width, Const) else width


def rows_of(s: For, width: int | Expr) -> int | Expr | None:
    """The rows of ``s`` split by ``width``: its extent over the width where that divides it (a
    constant's, or ``H`` of an extent ``H * W`` of dynamic shape symbols); None where not."""
    e = s.extent
    if isinstance(width, int):
        return int(e.value) // width if isinstance(e, Const) and int(e.value) % width == 0 else None
    if isinstance(e, Binary) and e.op == "mul" and e.b == width:
        return e.a
    return None


def split_flat(s: For, width: int, row: str, col: str) -> For:
    """``s`` (its extent a multiple of ``width``) as ``row x col`` loops, ``v // width`` read as
    ``row`` and ``v % width`` as ``col``."""
    v, r, c = Var(s.var.name), Var(row), Var(col)

    size = Const(width, s.extent.dtype) if isinstance(width, int) else width

    def parts(e: Expr) -> Expr:
        return transform(e, lambda n: (r if n.op == "floordiv" else c)
                         if isinstance(n, Binary) and n.op in ("floordiv", "mod") and n.a == v
                         and n.b == size else None)

    body = subst(map_exprs(s.body, parts), {s.var.name: iadd(imul(r, size), c)})
    inner = For(c, size, body, span=s.span)
    rows = rows_of(s, width)
    return replace(s, var=r, extent=Const(rows, s.extent.dtype) if isinstance(rows, int) else rows, body=inner)
