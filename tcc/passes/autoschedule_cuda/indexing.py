"""Index arithmetic the GPU schedules share: a flat thread or block index split into loop
variables, a guard where the grid overshoots, block and grid sizes within CUDA's limits.

A size is an ``int``, or an expression of the dynamic shape symbols (``tcc.compile(...,
dynamic=...)``: kernel arguments) where it is known only at the call. Such a grid is an
expression too: codegen writes it into the launch plan and the runtime evaluates it for each
call's values, so a tail that a block only partly covers is always guarded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

from tcc import dtypes
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Const, Expr, Var, free_vars, substitute
from tcc.ir.loopnest import buffer_elements
from tcc.ir.loops import For, If, Let, Stmt
from tcc.passes.simplify import evaluate_int, simplify
from tcc.passes.te.specialize import DYNAMIC_EXTENT

I64 = dtypes.i64
MAX_GRID_X = 2**31 - 1
Size = int | Expr  # a constant, or an expression of the dynamic shape symbols
# what a schedule takes a dynamic shape symbol to be while it builds the kernels of one range of
# its values (see .ranges); a symbol not named is DYNAMIC_EXTENT
_ASSUMED: ContextVar[Mapping[str, int]] = ContextVar("assumed_extents", default=MappingProxyType({}))


@contextmanager
def assuming(values: Mapping[str, int]) -> Iterator[None]:
    """Within it, :func:`hint` takes each shape symbol of ``values`` as its value there: the
    kernels built are sized for calls near those values (and still correct for every one)."""
    token = _ASSUMED.set(MappingProxyType({**_ASSUMED.get(), **values}))
    try:
        yield
    finally:
        _ASSUMED.reset(token)


def assumed() -> Mapping[str, int]:
    """The shape symbols' values :func:`assuming` set (none outside it)."""
    return _ASSUMED.get()


def size_of(f: For) -> Size:
    """A loop's extent: an integer where it is a constant, else its expression."""
    value = evaluate_int(f.extent)
    return value if value is not None else f.extent


def invariant(e: Expr, symbols: frozenset[str]) -> bool:
    """Whether ``e`` is the same for the whole call: a constant, or an expression of the dynamic
    shape ``symbols`` alone (not a loop index: a triangular extent moves with one)."""
    return free_vars(e) <= symbols


def product(sizes: list[Size] | tuple[Size, ...]) -> Size:
    """The product of sizes: an integer where all are."""
    return buffer_elements(tuple(sizes))


def as_expr(size: Size) -> Expr:
    return Const(size, I64) if isinstance(size, int) else size


def ceil_div(size: Size, d: int) -> Size:
    """``ceil(size / d)``."""
    if isinstance(size, int):
        return -(-size // d)
    if d == 1:
        return size
    return Binary("floordiv", Binary("add", size, Const(d - 1, I64), I64), Const(d, I64), I64)


def exact_div(size: Size, d: int) -> Size | None:
    """``size / d`` where ``size`` is a multiple of ``d`` by its value or its form (a dynamic
    symbol declared a multiple: ``8 * (N // 8)``), else None."""
    if isinstance(size, int):
        return size // d if size % d == 0 else None
    if isinstance(size, Binary) and size.op == "mul":
        for c, x in ((size.a, size.b), (size.b, size.a)):
            if isinstance(c, Const) and int(c.value) % d == 0:
                k = int(c.value) // d
                return x if k == 1 else Binary("mul", Const(k, I64), x, I64)
    return None


def hint(size: Size) -> int:
    """What a schedule sizes its work by: the constant, or the size with every dynamic shape
    symbol taken as ``DYNAMIC_EXTENT`` (tails handle the rest) or as :func:`assuming` says; at
    least 1 (an image's ``H - KH + 1`` with both taken so is not a size)."""
    if isinstance(size, int):
        return size
    if isinstance(size, Binary) and size.op == "mul":  # a product of dims: each its own hint
        return hint(size.a if not isinstance(size.a, Const) else int(size.a.value)) * \
            hint(size.b if not isinstance(size.b, Const) else int(size.b.value))
    values = _ASSUMED.get()
    value = evaluate_int(simplify(substitute(size, {n: Const(values.get(n, DYNAMIC_EXTENT), I64)
                                                    for n in free_vars(size)})))
    return DYNAMIC_EXTENT if value is None else max(value, 1)


def decompose(axes: list[For], extents: list[Size], flat: Expr, body: Stmt) -> Stmt:
    """``Let`` each axis variable be its digit of the row-major ``flat`` index."""
    stride: Size = 1
    for ax, ext in reversed(list(zip(axes, extents))):
        value: Expr = flat
        if stride != 1:
            value = Binary("floordiv", value, as_expr(stride), I64)
        if ax is not axes[0]:
            value = Binary("mod", value, as_expr(ext), I64)
        body = Let(ax.var, value, body)
        stride = product([stride, ext])
    return body


def linear(outer: Expr, size: int, inner: Expr) -> Expr:
    """``outer * size + inner``: a row-major index one digit longer."""
    return Binary("add", Binary("mul", outer, Const(size, I64), I64), inner, I64)


def guarded(index: Var, value: Expr, total: Size, covered: Size, body: Stmt) -> Stmt:
    """``let index = value; if index < total: body`` (no test when ``covered == total``, both
    known; a dynamic total is always tested)."""
    exact = isinstance(total, int) and isinstance(covered, int) and covered == total
    inner = body if exact else If(Binary("lt", index, as_expr(total), dtypes.boolean), body)
    return Let(index, value, inner)


def block_size(n: Size, cap: int) -> int:
    """A power of two of at least one warp, at most ``cap``, not much over ``n`` (a dynamic
    ``n``: its :func:`hint`)."""
    n = hint(n)
    size = 32
    while size < n and size * 2 <= cap:
        size *= 2
    return size


def grid(total: Size, threads: int, span) -> Size:
    """The blocks that cover ``total`` items, ``threads`` a block (a dynamic total's grid is
    checked against CUDA's limit at the launch)."""
    blocks = ceil_div(total, threads)
    if isinstance(blocks, int) and blocks > MAX_GRID_X:
        raise TccCompileError(f"{total} elements need {blocks} blocks, over CUDA's grid limit", span,
                              "split the op into smaller pieces")
    return blocks
