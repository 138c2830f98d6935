"""store_epilogue: apply an elementwise epilogue where a GEMM's register tiles are written back.

A contraction with an epilogue (``relu(A @ B + b)``, im2col's ``conv + bias + relu``) lowers to
a GEMM into an intermediate (``C_acc``, ``Y_gemm``) and a separate nest that reads it back,
applies the epilogue and writes the result: the whole intermediate goes out to memory and comes
back (0.8 MiB per image of a 64-channel 56x56 conv), and a parallel GEMM pays a second fork.

When each element of the intermediate is written exactly once (its reduction fits one k block,
so every register tile is stored once) and the epilogue reads it once per output element
through a bijective index (the same indices, or im2col's row-major flattening of the pixels),
the epilogue moves into the write-back: ``C_acc[i, j] = tile[ii, jj]`` becomes
``C[i, j] = max(tile[ii, jj] + b[j], 0)``, the epilogue nest goes and so does the intermediate.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, free_vars, substitute, transform
from tcc.ir.loops import Allocate, For, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts
from tcc.passes.loopnest import loads, stores


def store_epilogue(func: LoopFunc, target: str) -> LoopFunc:
    """Fold the nest that reads ``target`` back into ``target``'s register-tile write-backs."""
    if target in {p.name for p in func.params}:
        raise TccScheduleError(f"{target} is a result of {func.name}: there is no epilogue to fold")
    seq_stmt, producer, epilogue = _neighbours(func.body, target)
    loops, out = _perfect_nest(epilogue)
    read = _single_read(func.body, target)
    names = [f.var.name for f in loops]
    extents = {f.var.name: int(f.extent.value) for f in loops}  # type: ignore[attr-defined]
    written = {st.buffer for st in stores(func.body)}
    others = {ld.buffer for ld in loads(epilogue)} - {target}
    if others & written or _mentions(producer, out.buffer):
        raise TccScheduleError(f"the epilogue of {target} reads what the GEMM writes")
    shape = func.buffers()[target].shape
    if _size(extents.values()) != _size(shape):
        raise TccScheduleError(f"the epilogue of {target} does not read each element once")

    def write_back(s: Stmt) -> Stmt | None:
        if isinstance(s, Store) and s.buffer == target:
            mapping = _invert(read.indices, s.indices, extents, shape)
            if mapping is None or set(mapping) != set(names):
                raise TccScheduleError(f"the epilogue of {target} reads it through an index it cannot invert")
            value = transform(out.value, lambda n: s.value if n == read else None)
            return Store(out.buffer, tuple(substitute(i, mapping) for i in out.indices),
                         substitute(value, mapping), span=out.span)
        return None

    _check_written_once(producer, target)
    body = map_stmt(func.body, lambda s: seq(*(c for c in s.stmts if c != epilogue)) if s == seq_stmt else None)
    body = map_stmt(body, write_back)
    body = map_stmt(body, lambda s: s.body if isinstance(s, Allocate) and s.buffer.name == target else None)
    return replace(func, body=body)


def _neighbours(body: Stmt, target: str) -> tuple[Seq, Stmt, For]:
    """The Seq holding the statement that writes ``target`` and, right after it, the epilogue."""
    for s in walk_stmts(body):
        if not isinstance(s, Seq):
            continue
        for first, second in zip(s.stmts, s.stmts[1:]):
            if any(st.buffer == target for st in stores(first)) and isinstance(second, For) \
                    and any(ld.buffer == target for ld in loads(second)):
                return s, first, second
    raise TccScheduleError(f"no epilogue reads {target} right after the GEMM that writes it")


def _perfect_nest(s: For) -> tuple[list[For], Store]:
    loops: list[For] = []
    n: Stmt = s
    while isinstance(n, For):
        loops.append(n)
        n = n.body
    if not isinstance(n, Store) or any(not isinstance(f.extent, Const) for f in loops):
        raise TccScheduleError("the epilogue is not one perfect loop nest")
    return loops, n


def _single_read(body: Stmt, target: str) -> Load:
    found = [ld for ld in loads(body) if ld.buffer == target]
    if len(found) != 1:
        raise TccScheduleError(f"{target} is read {len(found)} times; an epilogue reads it once")
    return found[0]


def _mentions(s: Stmt, name: str) -> bool:
    return any(st.buffer == name for st in stores(s)) or any(ld.buffer == name for ld in loads(s))


def _check_written_once(producer: Stmt, target: str) -> None:
    """Every write-back of ``target`` is a copy out of a register tile, inside loops that each move
    the element written (so no element is written twice: one k block)."""
    def visit(s: Stmt, chain: tuple[For, ...]) -> None:
        if isinstance(s, Store) and s.buffer == target:
            if not isinstance(s.value, Load):
                raise TccScheduleError(f"{target} is accumulated in memory, not written once from registers")
            used = set().union(*(free_vars(i) for i in s.indices))
            if any(f.var.name not in used and getattr(f.extent, "value", 2) != 1 for f in chain):
                raise TccScheduleError(f"{target} is written more than once per element (several k blocks)")
        for c in s.children():
            visit(c, chain + (s,) if isinstance(s, For) else chain)

    visit(producer, ())


def _invert(read: tuple[Expr, ...], at: tuple[Expr, ...], extents: dict[str, int],
            shape: tuple[int, ...]) -> dict[str, Expr] | None:
    """The epilogue's loop variables at which ``read`` equals ``at``: each index of ``read`` is a
    variable or a row-major flattening ``(a * E + b)`` of variables (``b`` of extent ``E``)
    covering its dim, or ``0`` in both where a merged pixel index (``[n, f, 0, y*W + x]``, see
    passes/pixels.py) spans that dim and the next."""
    mapping: dict[str, Expr] = {}
    span = 1  # elements the next index covers: its dim times the dims merged into it
    for idx, x, dim in zip(read, at, shape):
        span *= dim
        if isinstance(idx, Const):
            if idx != x or idx.value != 0:
                return None
            continue
        parts = _flattened(idx, extents)
        if parts is None or _size(extents[v] for v in parts) != span:
            return None
        span = 1
        for pos, v in enumerate(parts):
            if v in mapping:
                return None
            inner = _size(extents[w] for w in parts[pos + 1:])
            value = x if inner == 1 else Binary("floordiv", x, Const(inner, x.dtype), x.dtype)
            if pos > 0:
                value = Binary("mod", value, Const(extents[v], x.dtype), x.dtype)
            mapping[v] = value
    return mapping if span == 1 else None


def _flattened(e: Expr, extents: dict[str, int]) -> list[str] | None:
    """``[a, b, c]`` for ``(a * Eb + b) * Ec + c`` (``E*`` the variables' extents), else None."""
    if isinstance(e, Var) and e.name in extents:
        return [e.name]
    if isinstance(e, Binary) and e.op == "add" and isinstance(e.b, Var) and e.b.name in extents:
        scaled = e.a
        if isinstance(scaled, Binary) and scaled.op == "mul" and scaled.b == Const(extents[e.b.name], e.b.dtype):
            head = _flattened(scaled.a, extents)
            return None if head is None else [*head, e.b.name]
    return None


def _size(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n

