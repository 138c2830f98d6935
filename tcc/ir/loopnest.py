"""Helpers shared by the schedule passes: finding loops, substituting, affine coefficients."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import NamedTuple

from tcc import dtypes
from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, free_vars, substitute, transform, unique_name, walk
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, Store, map_stmt, stmt_exprs, walk_stmts


# Index arithmetic as written: one i64 node each, nothing folded, since the GPU schedule builders
# (gemm, tensorcore, warpgroup, tensorize, split_reduction) match the shapes they build later.
def add_index(a: Expr, b: Expr) -> Expr:
    return Binary("add", a, b, dtypes.i64)


def mul_index(a: Expr, k: int) -> Expr:
    return Binary("mul", a, Const(k, dtypes.i64), dtypes.i64)


def div_index(a: Expr, k: int) -> Expr:
    return Binary("floordiv", a, Const(k, dtypes.i64), dtypes.i64)


def mod_index(a: Expr, k: int) -> Expr:
    return Binary("mod", a, Const(k, dtypes.i64), dtypes.i64)


def linear_coeff(e: Expr, var: str) -> int | None:
    """The constant ``c`` with ``e == c * var + (terms free of var)``; None when not affine in var."""
    if isinstance(e, Var):
        return 1 if e.name == var else 0
    if isinstance(e, Const):
        return 0
    if var not in free_vars(e):
        return 0
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = linear_coeff(e.a, var), linear_coeff(e.b, var)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, Binary) and e.op == "mul":
        if isinstance(e.a, Const) and e.a.dtype.is_int:
            inner = linear_coeff(e.b, var)
            return None if inner is None else int(e.a.value) * inner
        if isinstance(e.b, Const) and e.b.dtype.is_int:
            inner = linear_coeff(e.a, var)
            return None if inner is None else int(e.b.value) * inner
    return None


def flat_coeff(indices: tuple[Expr, ...], shape: tuple[int, ...], var: str) -> int | None:
    """The coefficient of ``var`` in the row-major flat offset of ``indices`` into ``shape``; None
    when that offset is not affine in ``var``."""
    flat = flat_terms(indices, shape)
    if flat is None:
        return None
    total = 0
    for atom, coef in flat.atoms.items():
        if isinstance(atom, Var):
            total += coef if atom.name == var else 0
        elif var in free_vars(atom):
            return None
    return total


class FlatOffset(NamedTuple):
    """A row-major flat offset: ``sum(coef * atom) + constant``."""

    atoms: Mapping[Expr, int]
    constant: int
    recombined: bool  # whether a row and a column (``E // W``, ``E % W``) were joined into ``E``


@functools.lru_cache(maxsize=1024)
def flat_terms(indices: tuple[Expr, ...], shape: tuple[int, ...]) -> FlatOffset | None:
    """The row-major flat offset of ``indices`` into ``shape`` as integer multiples of atoms
    (variables and non-affine parts) plus a constant; None when an index is not an integer.
    Cached (its ``atoms`` read-only): code generation asks again for every unrolled copy of an
    access and every lane test, ~280 times for the 17 accesses of a convolution.

    Unlike :func:`linear_coeff` on each index alone, a pixel index split into a row and a column
    (``j // W`` times ``W`` plus ``j % W``, as im2col's gather reads its input) recombines into
    ``j``: ``W * (E // W) + E % W == E`` holds for every integer ``E`` (floor semantics, W > 0).
    """
    terms: dict[Expr, int] = {}
    stride: int | Expr = 1
    for idx, dim in reversed(list(zip(indices, shape))):
        if isinstance(stride, int):
            if not _add_terms(idx, stride, terms):
                return None
        elif not _add_strided(idx, stride, terms):
            return None
        stride = _times(stride, dim)
    recombined = False
    while _pair_divmod(terms):
        recombined = True
    constant = terms.pop(_UNIT, 0)
    return FlatOffset(MappingProxyType({atom: coef for atom, coef in terms.items() if coef}), constant, recombined)


def _times(a: int | Expr, b: int | Expr) -> int | Expr:
    """``a * b`` of dims: an integer, or an expression where a dynamic shape symbol's dim takes part."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1 or b == 1:
        return b if a == 1 else a
    return Binary("mul", Const(a, dtypes.i64) if isinstance(a, int) else a,
                  Const(b, dtypes.i64) if isinstance(b, int) else b, dtypes.i64)


def buffer_elements(shape: tuple[int | Expr, ...]) -> int | Expr:
    """The elements of a buffer of ``shape``: an integer, or an expression of dynamic shape symbols."""
    n: int | Expr = 1
    for d in shape:
        n = _times(n, d)
    return n


_UNIT = Const(1, dtypes.i64)  # the key under which _add_terms sums constants (a Const is never an atom)


def _add_terms(e: Expr, scale: int, terms: dict[Expr, int]) -> bool:
    """Accumulate ``scale * e`` as integer multiples of atoms (variables and non-affine parts)."""
    if isinstance(e, Const):
        if not e.dtype.is_int:
            return False
        terms[_UNIT] = terms.get(_UNIT, 0) + scale * int(e.value)
        return True
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        return _add_terms(e.a, scale, terms) and _add_terms(e.b, scale if e.op == "add" else -scale, terms)
    if isinstance(e, Binary) and e.op == "mul":
        for c, x in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, Const) and c.dtype.is_int:
                return _add_terms(x, scale * int(c.value), terms)
    terms[e] = terms.get(e, 0) + scale
    return True


def _add_strided(idx: Expr, stride: Expr, terms: dict[Expr, int]) -> bool:
    """Accumulate ``idx * stride`` past a dim of a dynamic shape symbol: each of ``idx``'s terms
    times the stride is one atom (``(j // W) * W``, so that the row pairs with ``j % W``)."""
    if not idx.dtype.is_int:
        return False
    inner: dict[Expr, int] = {}
    if not _add_terms(idx, 1, inner):
        return False
    for atom, coef in inner.items():
        key = stride if atom == _UNIT else Binary("mul", atom, stride, dtypes.i64)
        terms[key] = terms.get(key, 0) + coef
    return True


def _pair_divmod(terms: dict[Expr, int]) -> bool:
    """Replace one pair ``c*a * (E // c) + a * (E % c)`` by ``a * E`` (``a * (E // W) * W + a * (E % W)``
    for a dynamic ``W``, a shape symbol: positive); whether one was found."""
    for atom, coef in terms.items():
        if not (coef and isinstance(atom, Binary) and atom.op == "mod"):
            continue
        if isinstance(atom.b, Const):
            if atom.b.value <= 0:
                continue
            quotient, times = Binary("floordiv", atom.a, atom.b, atom.dtype), coef * int(atom.b.value)
        else:
            quotient, times = Binary("mul", Binary("floordiv", atom.a, atom.b, atom.dtype), atom.b, dtypes.i64), coef
        if terms.get(quotient) == times:
            del terms[atom], terms[quotient]
            _add_terms(atom.a, coef, terms)
            return True
    return False


def nest_loops(s: Stmt) -> tuple[list[For], Stmt]:
    """The loops perfectly nested at the top of ``s`` and the statement inside them."""
    loops: list[For] = []
    while isinstance(s, For):
        loops.append(s)
        s = s.body
    return loops, s


def outermost_nests(s: Stmt, accept) -> list[Stmt]:
    """The outermost loop nests (or bare statements) in ``s`` whose innermost statement
    ``accept`` takes: a packing copy, a register tile's write-back."""
    if accept(nest_loops(s)[1]):
        return [s]
    return [n for c in s.children() for n in outermost_nests(c, accept)]


def map_exprs(s: Stmt, fn) -> Stmt:
    """Apply ``fn`` (Expr -> Expr) to every expression held by every statement of ``s``."""
    def node(n: Stmt) -> Stmt | None:
        if isinstance(n, For):
            return replace(n, extent=fn(n.extent))
        if isinstance(n, Store):
            return replace(n, indices=tuple(fn(i) for i in n.indices), value=fn(n.value))
        if isinstance(n, If):
            return replace(n, cond=fn(n.cond))
        if isinstance(n, Let):
            return replace(n, value=fn(n.value))
        return None
    return map_stmt(s, node)


def subst(s: Stmt, mapping: dict[str, Expr]) -> Stmt:
    """Replace variables by expressions everywhere in ``s``."""
    return map_exprs(s, lambda e: substitute(e, mapping))


def replace_loads(s: Stmt, fn) -> Stmt:
    """Rewrite every Load: ``fn(load)`` returns a replacement or None."""
    return map_exprs(s, lambda e: transform(e, lambda n: fn(n) if isinstance(n, Load) else None))


def loops_named(s: Stmt, name: str) -> list[For]:
    return [n for n in walk_stmts(s) if isinstance(n, For) and n.var.name == name]


def loop_names(s: Stmt) -> set[str]:
    return {n.var.name for n in walk_stmts(s) if isinstance(n, For)}


def in_vector_loop(func: LoopFunc, name: str) -> bool:
    """Whether a loop named ``name`` is, or sits inside, a vector loop (whose body runs once for
    all lanes: nothing in it may be vectorised again or hold a per-iteration copy)."""
    return any(isinstance(n, For) and n.kind == "vector" and (n.var.name == name or name in loop_names(n.body))
               for n in walk_stmts(func.body))


def require_loop(func: LoopFunc, name: str, span: Span | None = None) -> list[For]:
    found = loops_named(func.body, name)
    if not found:
        names = ", ".join(sorted(loop_names(func.body))) or "none"
        raise TccScheduleError(f"op {func.name} has no loop {name!r}", span, f"its loops are: {names}")
    return found


def dynamic_remainder(func: LoopFunc, loop: For) -> bool:
    """Whether ``loop``'s extent is an expression of the function's arguments alone (dynamic
    shape symbols: a split's remainder ``N % 32``), which no primitive needing a constant extent
    can take: vectorize and unroll leave such a copy a plain loop."""
    names = free_vars(loop.extent)
    return bool(names) and names <= {p.name for p in func.params}


def const_extent(loop: For, span: Span | None = None) -> int:
    if not isinstance(loop.extent, Const):
        raise TccScheduleError(f"loop {loop.var.name} has no constant extent", span)
    return int(loop.extent.value)


def fresh(func: LoopFunc, base: str) -> str:
    return unique_name(base, loop_names(func.body) | set(func.buffers()) | {p.name for p in func.params})


def on_loops(func: LoopFunc, name: str, fn) -> LoopFunc:
    """``func`` with every loop called ``name`` replaced by ``fn(loop)``."""
    body = map_stmt(func.body, lambda n: fn(n) if isinstance(n, For) and n.var.name == name else None)
    return replace(func, body=body)


def stores(s: Stmt) -> list[Store]:
    return [n for n in walk_stmts(s) if isinstance(n, Store)]


def loads(s: Stmt) -> list[Load]:
    out = []
    for n in walk_stmts(s):
        for e in _exprs(n):
            out.extend(x for x in walk(e) if isinstance(x, Load))
    return out


def _exprs(n: Stmt) -> tuple[Expr, ...]:
    return stmt_exprs(n)


def allocated(s: Stmt) -> set[str]:
    return {n.buffer.name for n in walk_stmts(s) if isinstance(n, Allocate)}


def is_seq_of_copies(s: Stmt) -> bool:
    """The main part and the tail of a split: two loops of one name, the tail running once, both
    storing to the same tensors. (Two statements whose loops got one name from one split, such
    as a cached copy and the nest that reads it, are not copies: permuting them as one nest
    would reorder them.) A split of a dynamic extent with a ``remainder_step`` has three: the
    main part, the remainder's whole steps (a dynamic extent) and its last remainder."""
    if not (isinstance(s, Seq) and len(s.stmts) in (2, 3) and all(isinstance(c, For) for c in s.stmts)):
        return False
    main, *rest = s.stmts
    tail = rest[-1]
    middle = all(c.var.name == main.var.name and not isinstance(c.extent, Const) for c in rest[:-1])
    return (middle and main.var.name == tail.var.name and isinstance(tail.extent, Const) and tail.extent.value == 1
            and all({st.buffer for st in stores(main)} == {st.buffer for st in stores(c)} for c in rest))


def shared_layout(kernel: Stmt, align: int) -> tuple[dict[str, int], int]:
    """Byte offsets of the shared buffers a kernel allocates, each on an ``align`` boundary after
    the last in allocation order, and the bytes they take in all; a buffer that ``reuses`` others
    starts where the first of them does (it may run past them, over no other buffer)."""
    offsets: dict[str, int] = {}
    extents: dict[str, tuple[int, int]] = {}
    end = 0
    for s in walk_stmts(kernel):
        if not (isinstance(s, Allocate) and s.buffer.scope == "shared"):
            continue
        size = -(-s.buffer.size * s.buffer.dtype.itemsize // align) * align
        start = min(offsets[n] for n in s.reuses) if s.reuses else end
        clash = [n for n, (a, b) in extents.items() if n not in s.reuses and a < start + size and start < b]
        if clash:
            raise TccScheduleError(f"internal error: shared buffer {s.buffer.name} would overlap {', '.join(clash)}")
        offsets[s.buffer.name], extents[s.buffer.name] = start, (start, start + size)
        end = max(end, start + size)
    return offsets, end
