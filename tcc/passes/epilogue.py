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
    """The epilogue's loop variables at which ``read`` equals ``at``. Each index of ``read`` is
    a row-major flattening ``(a * Eb + b) * Ec + c`` of parts covering its dim, a part being a
    variable or one digit of it (``y // R``, ``y % R``: im2col's blocks of output rows), or ``0``
    in both where a merged pixel index (``[n, f, 0, y*W + x]``, see passes/pixels.py) spans that
    dim and the next."""
    digits: dict[tuple, Expr] = {}
    span = 1  # elements the next index covers: its dim times the dims merged into it
    for idx, x, dim in zip(read, at, shape):
        span *= dim
        if isinstance(idx, Const):
            if idx != x or idx.value != 0:
                return None
            continue
        parts = _flattened(idx, extents)
        if parts is None or _size(e for _, e in parts) != span:
            return None
        span = 1
        for pos, (key, extent) in enumerate(parts):
            if key in digits:
                return None
            inner = _size(e for _, e in parts[pos + 1:])
            value = x if inner == 1 else Binary("floordiv", x, Const(inner, x.dtype), x.dtype)
            if pos > 0:
                value = Binary("mod", value, Const(extent, x.dtype), x.dtype)
            digits[key] = value
    return _combine(digits) if span == 1 else None


def _combine(digits: dict[tuple, Expr]) -> dict[str, Expr] | None:
    """Each variable's value from its whole (``(v, 1)``) or from its two digits ``v // R, v % R``."""
    out: dict[str, Expr] = {}
    for (name, kind, radix), value in digits.items():
        if kind == "all":
            out[name] = value
        elif kind == "hi":
            low = digits.get((name, "lo", radix))
            if low is None:
                return None
            out[name] = Binary("add", Binary("mul", value, Const(radix, value.dtype), value.dtype), low, value.dtype)
        elif (name, "hi", radix) not in digits:
            return None
    return out


def _flattened(e: Expr, extents: dict[str, int]) -> list[tuple[tuple, int]] | None:
    """The parts of ``(a * Eb + b) * Ec + c`` (each part with its extent ``E``), else None."""
    atom = _digit(e, extents)
    if atom is not None:
        return [atom]
    if isinstance(e, Binary) and e.op == "add":
        tail = _digit(e.b, extents)
        scaled = e.a
        if tail is not None and isinstance(scaled, Binary) and scaled.op == "mul" \
                and scaled.b == Const(tail[1], scaled.b.dtype):
            head = _flattened(scaled.a, extents)
            return None if head is None else [*head, tail]
    return None


def _digit(e: Expr, extents: dict[str, int]) -> tuple[tuple, int] | None:
    """``v``, ``v // R`` or ``v % R`` of a loop variable ``v``, as (key, extent)."""
    if isinstance(e, Var) and e.name in extents:
        return (e.name, "all", 1), extents[e.name]
    if isinstance(e, Binary) and e.op in ("floordiv", "mod") and isinstance(e.a, Var) and e.a.name in extents \
            and isinstance(e.b, Const) and e.b.value > 0 and extents[e.a.name] % int(e.b.value) == 0:
        radix = int(e.b.value)
        if e.op == "mod":
            return (e.a.name, "lo", radix), radix
        return (e.a.name, "hi", radix), extents[e.a.name] // radix
    return None


def _size(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n

