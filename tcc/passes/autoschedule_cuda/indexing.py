"""Index arithmetic the GPU schedules share: a flat thread or block index split into loop
variables, a guard where the grid overshoots, block and grid sizes within CUDA's limits."""

from __future__ import annotations

from tcc import dtypes
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Const, Expr, Var
from tcc.ir.loops import For, If, Let, Stmt

I64 = dtypes.i64
MAX_GRID_X = 2**31 - 1


def decompose(axes: list[For], extents: list[int], flat: Expr, body: Stmt) -> Stmt:
    """``Let`` each axis variable be its digit of the row-major ``flat`` index."""
    stride = 1
    for ax, ext in reversed(list(zip(axes, extents))):
        value: Expr = flat
        if stride != 1:
            value = Binary("floordiv", value, Const(stride, I64), I64)
        if ax is not axes[0]:
            value = Binary("mod", value, Const(ext, I64), I64)
        body = Let(ax.var, value, body)
        stride *= ext
    return body


def linear(outer: Var, size: int, inner: Var) -> Expr:
    return Binary("add", Binary("mul", outer, Const(size, I64), I64), inner, I64)


def guarded(index: Var, value: Expr, total: int, covered: int, body: Stmt) -> Stmt:
    """``let index = value; if index < total: body`` (no test when ``covered == total``)."""
    inner = body if covered == total else If(Binary("lt", index, Const(total, I64), dtypes.boolean), body)
    return Let(index, value, inner)


def block_size(n: int, cap: int) -> int:
    """A power of two of at least one warp, at most ``cap``, not much over ``n``."""
    size = 32
    while size < n and size * 2 <= cap:
        size *= 2
    return size


def grid(total: int, threads: int, span) -> int:
    blocks = -(-total // threads)
    if blocks > MAX_GRID_X:
        raise TccCompileError(f"{total} elements need {blocks} blocks, over CUDA's grid limit", span,
                              "split the op into smaller pieces")
    return blocks
