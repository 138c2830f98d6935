"""merge_pixels: one loop over an image's pixels where every access allows it (a 1x1 convolution).

``Y[n, f, y, x] = sum[c](X[n, c, y, x] * Wt[f, c, 0, 0])`` is a GEMM per image, [F x C] @
[C x H*W], but its loops give the contraction finder only W columns. When every access in the
nest touches its last two dims as ``(ey, ex)`` with ``ey = y + a`` and ``ex = x + b`` (``a``, ``b``
free of y and x) and the accessed buffer's last dim is x's extent ``W``, the element
``ey * W + ex`` is also ``a * W + (y * W + x) + b``: the access becomes ``(a, p + b)`` for one
pixel loop ``p = y * W + x`` over ``H * W``. Row-major addresses, so the iterations touch the same
elements in the same order and the result is unchanged.

The merged access is right for a buffer's addresses only: an intermediate that a later pass may
inline (:func:`tcc.passes.loops.inline.inline` substitutes the indices one by one, ``x := p`` with
``p`` past the row) keeps its two loops.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.expr import Const, Expr, Load, Var, const, free_vars, substitute, transform, walk
from tcc.ir.loopnest import fresh, linear_coeff, map_exprs
from tcc.ir.loops import For, LoopFunc, Stmt, Store, map_stmt, stmt_exprs, walk_stmts
from tcc.passes.loops.inline import elementwise_producer


def merge_pixels(func: LoopFunc, nest: For, y: str, x: str) -> LoopFunc:
    """``func`` with loops ``y`` and directly inside it ``x`` of ``nest`` merged (unchanged if illegal)."""
    params = {p.name for p in func.params}
    inlinable = {name for name, _ in _accesses(nest) if name not in params and elementwise_producer(func.body, name)}
    merged = merge_loops(nest, y, x, fresh(func, f"{y}{x}"), func.buffers(), inlinable)
    if merged is None:
        return func
    return replace(func, body=map_stmt(func.body, lambda s: merged if s == nest else None))


def merge_loops(nest: For, y: str, x: str, name: str, buffers: dict, inlinable: set[str] = frozenset()) -> Stmt | None:
    loop_y = next((f for f in walk_stmts(nest) if isinstance(f, For) and f.var.name == y), None)
    if loop_y is None or not (isinstance(loop_y.body, For) and loop_y.body.var.name == x):
        return None
    loop_x = loop_y.body
    if not (isinstance(loop_y.extent, Const) and isinstance(loop_x.extent, Const)):
        return None
    width = int(loop_x.extent.value)
    if not _mergeable(loop_x.body, y, x, width, buffers, inlinable):
        return None
    p = Var(name)
    body = _rewrite(loop_x.body, y, x, p)
    if {y, x} & {v for s in walk_stmts(body) for e in stmt_exprs(s) for v in free_vars(e)}:
        return None  # y or x used outside the accesses' last two indices
    merged = replace(loop_y, var=p, extent=const(int(loop_y.extent.value) * width), body=body)
    return map_stmt(nest, lambda s: merged if s == loop_y else None)


def _accesses(s: Stmt) -> list[tuple[str, tuple[Expr, ...]]]:
    out = []
    for n in walk_stmts(s):
        if isinstance(n, Store):
            out.append((n.buffer, n.indices))
        for e in stmt_exprs(n):
            out += [(ld.buffer, ld.indices) for ld in walk(e) if isinstance(ld, Load)]
    return out


def _mergeable(body: Stmt, y: str, x: str, width: int, buffers: dict, inlinable: set[str]) -> bool:
    for name, idx in _accesses(body):
        used = set().union(*(free_vars(i) for i in idx)) if idx else set()
        if not used & {y, x}:
            continue
        if name in inlinable or len(idx) < 2 or buffers[name].shape[-1] != width \
                or any(free_vars(i) & {y, x} for i in idx[:-2]):
            return False
        ey, ex = idx[-2], idx[-1]
        if linear_coeff(ey, y) != 1 or x in free_vars(ey) or linear_coeff(ex, x) != 1 or y in free_vars(ex):
            return False
    return True


def _rewrite(body: Stmt, y: str, x: str, p: Var) -> Stmt:
    """``(ey, ex)`` -> ``(ey[y := 0], ex[x := p])`` in every access that uses y or x."""
    def indices(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
        if len(idx) < 2 or not (free_vars(idx[-2]) | free_vars(idx[-1])) & {y, x}:
            return idx
        zero = Const(0, idx[-2].dtype)
        return (*idx[:-2], substitute(idx[-2], {y: zero}), substitute(idx[-1], {x: p}))

    def expr(e: Expr) -> Expr:
        return transform(e, lambda n: replace(n, indices=indices(n.indices)) if isinstance(n, Load) else None)

    def node(s: Stmt) -> Stmt | None:
        return replace(s, indices=indices(s.indices)) if isinstance(s, Store) else None

    return map_stmt(map_exprs(body, expr), node)

