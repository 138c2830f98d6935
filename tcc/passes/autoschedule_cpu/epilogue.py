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

from tcc import dtypes
from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Const, Expr, Load, Var, free_vars, substitute, transform
from tcc.ir.loopnest import flat_coeff, loads, nest_loops, outermost_nests, stores
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts


def store_epilogue(func: LoopFunc, target: str, lanes: str | None = None) -> LoopFunc:
    """Fold the nest that reads ``target`` back into ``target``'s register-tile write-backs.

    ``lanes``: the tile's column loop (to be vectorised); a fold whose store would not be affine
    in it is refused, since each lane would then be stored on its own (a GEMM over the pixels of
    several images: ``Y[j // 49, f, j % 49]``, whose per-lane addresses took LLVM 1.5 s more per
    kernel than a separate epilogue pass over the result, which runs whole vectors).

    With several k blocks each tile is written back once per block: the write-back of the last
    block applies the epilogue and writes the result (``if ko == last``), the others keep
    accumulating into ``target``, and the separate pass over ``target`` goes.

    With one k block the result of the epilogue is itself written once per element, from the
    tile: an elementwise nest that reads it back next (``gelu(X @ W + b)``: fusion keeps
    ``X @ W + b`` apart since GELU reads it twice) folds in the same way, and so on."""
    func, out, once = _store_epilogue(func, target, lanes)
    while once and out not in {p.name for p in func.params}:
        try:
            func, out, once = _store_epilogue(func, out, lanes)
        except TccScheduleError:
            break
    return func


def _store_epilogue(func: LoopFunc, target: str, lanes: str | None) -> tuple[LoopFunc, str, bool]:
    """One fold: the new function, the epilogue's result, and whether the write-backs store
    each of its elements once (one k block)."""
    if target in {p.name for p in func.params}:
        raise TccScheduleError(f"{target} is a result of {func.name}: there is no epilogue to fold")
    producers, epilogue = _neighbours(func.body, target)
    producer = Seq(tuple(producers))
    loops, out = _perfect_nest(epilogue)
    read = _single_read(func.body, producer, epilogue, target)
    names = [f.var.name for f in loops]
    extents = {f.var.name: _extent(f.extent) for f in loops}
    written = {st.buffer for st in stores(func.body)}
    others = {ld.buffer for ld in loads(epilogue)} - {target}
    if others & written or _mentions(producer, out.buffer):
        raise TccScheduleError(f"the epilogue of {target} reads what the GEMM writes")
    buffers = func.buffers()
    shape, out_shape = buffers[target].shape, buffers[out.buffer].shape
    if not _same_size(tuple(extents.values()), shape):
        raise TccScheduleError(f"the epilogue of {target} does not read each element once")
    k_block = _k_block_loop(producer, target)

    def write_back(s: Stmt) -> Stmt | None:
        if isinstance(s, Store) and s.buffer == target:
            mapping = _invert(read.indices, s.indices, extents, shape)
            if mapping is not None:  # a unit loop of the epilogue (GELU's batch of one) is 0
                mapping |= {n: Const(0, dtypes.i64) for n in names if extents[n] == 1 and n not in mapping}
            if mapping is None or set(mapping) != set(names):
                raise TccScheduleError(f"the epilogue of {target} reads it through an index it cannot invert")
            value = transform(out.value, lambda n: s.value if n == read else None)
            indices = tuple(substitute(i, mapping) for i in out.indices)
            if lanes is not None and flat_coeff(indices, out_shape, lanes) is None:
                raise TccScheduleError(f"the epilogue of {target} would store the tile's lanes one by one")
            return Store(out.buffer, indices, substitute(value, mapping), span=out.span)
        return None

    def fold(s: Stmt, k_loop: For | None) -> Stmt:
        """``s`` with the write-backs that run last for their elements applying the epilogue."""
        if s in copies:
            if k_loop is None:
                return map_stmt(s, write_back)
            last = Const(int(k_loop.extent.value) - 1, k_loop.var.dtype)  # type: ignore[attr-defined]
            return If(Binary("eq", k_loop.var, last, dtypes.boolean), map_stmt(s, write_back), s)
        if isinstance(s, Seq):
            parts = []
            for i, c in enumerate(s.stmts):
                later = any(isinstance(d, For) and d.var.name == k_name for d in s.stmts[i + 1:])
                parts.append(c if later and isinstance(c, For) and c.var.name == k_name else fold(c, k_loop))
            return seq(*parts)  # a k block followed by another (the k tail) is not the last
        if isinstance(s, For) and s.var.name == k_name:
            return replace(s, body=fold(s.body, s if int(s.extent.value) > 1 else None))  # type: ignore[attr-defined]
        if isinstance(s, (For, Allocate, Let)):
            return replace(s, body=fold(s.body, k_loop))
        if isinstance(s, If):
            return replace(s, then=fold(s.then, k_loop),
                           otherwise=None if s.otherwise is None else fold(s.otherwise, k_loop))
        return s

    copies = _write_backs(producer, target)
    k_name = k_block[0].name if k_block is not None else ""
    # by identity: the statements were found in func.body, and map_stmt hands unchanged ones over
    # as they are (hashing every node's subtree to look it up was a fifth of this pass)
    folded = {id(p): fold(p, None) for p in producers}
    folded[id(epilogue)] = Seq(())
    body = map_stmt(func.body, lambda s: folded.get(id(s)))
    if k_block is None:
        body = map_stmt(body, lambda s: s.body if isinstance(s, Allocate) and s.buffer.name == target else None)
    return replace(func, body=body), out.buffer, k_block is None


def _write_backs(producer: Stmt, target: str) -> list[Stmt]:
    """The outermost loop nests (or bare stores) that copy a register tile back into ``target``
    (not the nest that zeroes it first)."""
    return outermost_nests(producer, lambda s: isinstance(s, Store) and s.buffer == target
                           and _from_registers(s, target))


def _from_registers(s: Store, target: str) -> bool:
    """A write-back: a tile's value (a load, or an epilogue folded into it earlier), neither a
    constant (zeroing) nor an update that reads ``target`` itself (accumulation in memory)."""
    return not isinstance(s.value, Const) and all(ld.buffer != target for ld in loads(s))


def _neighbours(body: Stmt, target: str) -> tuple[list[Stmt], For]:
    """The statements that write ``target`` (a GEMM nest and the copies a split of its outer
    loop made for the tail) and, right after them, the epilogue that reads it."""
    for s in walk_stmts(body):
        if not isinstance(s, Seq):
            continue
        for i, second in enumerate(s.stmts):
            if i and isinstance(second, For) and any(ld.buffer == target for ld in loads(second)) \
                    and not any(st.buffer == target for st in stores(second)):
                first = i
                while first and any(st.buffer == target for st in stores(s.stmts[first - 1])):
                    first -= 1
                if first < i:
                    return list(s.stmts[first:i]), second
    raise TccScheduleError(f"no epilogue reads {target} right after the GEMM that writes it")


def _perfect_nest(s: For) -> tuple[list[For], Store]:
    loops, n = nest_loops(s)
    if not isinstance(n, Store):
        raise TccScheduleError("the epilogue is not one perfect loop nest")
    return loops, n


def _single_read(body: Stmt, producer: Stmt, epilogue: Stmt, target: str) -> Load:
    """The epilogue's read of ``target`` (the GEMM's own reads, its tiles' loads, aside): one
    read, or several of the same element (``h * erf(h)``: GELU), all replaced by the tile; no
    other statement may read ``target``."""
    inside = [ld for ld in loads(producer) if ld.buffer == target]
    found = [ld for ld in loads(body) if ld.buffer == target]
    mine = [ld for ld in loads(epilogue) if ld.buffer == target]
    if not mine or len(found) - len(inside) != len(mine) or any(ld != mine[0] for ld in mine):
        raise TccScheduleError(f"{target} is read {len(found) - len(inside)} times after its GEMM; an epilogue "
                               "reads it only in its own nest, one element per output element")
    return mine[0]


def _mentions(s: Stmt, name: str) -> bool:
    return any(st.buffer == name for st in stores(s)) or any(ld.buffer == name for ld in loads(s))


def _k_block_loop(producer: Stmt, target: str) -> tuple[Var, int] | None:
    """The k-block loop around ``target``'s write-backs (None: one k block, each element written
    once). Every write-back must copy a register tile, inside loops that all move the element
    written but that one."""
    found: set[tuple[str, int]] = set()

    def visit(s: Stmt, chain: tuple[For, ...]) -> None:
        if isinstance(s, Store) and s.buffer == target and not isinstance(s.value, Const):  # (zeroing)
            if not _from_registers(s, target):
                raise TccScheduleError(f"{target} is accumulated in memory, not written from registers")
            used = set().union(*(free_vars(i) for i in s.indices))
            blocks = [f for f in chain if f.var.name not in used and getattr(f.extent, "value", 2) != 1]
            if any(not isinstance(f.extent, Const) for f in blocks):
                raise TccScheduleError(f"{target}'s k blocks are counted at the call (a dynamic shape symbol)")
            found.update((f.var.name, int(f.extent.value)) for f in blocks)  # type: ignore[attr-defined]
        for c in s.children():
            visit(c, chain + (s,) if isinstance(s, For) else chain)

    visit(producer, ())
    if len(found) > 1:
        raise TccScheduleError(f"{target} is written back under several loops that do not move it")
    if not found:
        return None
    name, extent = found.pop()
    return Var(name, dtypes.i64), extent


Extent = int | Expr  # a loop's or a dim's: an expression of dynamic shape symbols where not constant


def _extent(e: Expr) -> Extent:
    return int(e.value) if isinstance(e, Const) else e


def _factors(sizes: tuple[Extent, ...]) -> tuple[int, tuple[str, ...]]:
    """A product of extents as its constant and its other factors (sorted by their text), so
    that ``64 * H * W`` and ``64 * (H * W)`` compare equal."""
    constant, others = 1, []
    todo = list(sizes)
    while todo:
        x = todo.pop()
        if isinstance(x, Const):
            x = int(x.value)
        if isinstance(x, int):
            constant *= x
        elif isinstance(x, Binary) and x.op == "mul":
            todo += [x.a, x.b]
        else:
            others.append(str(x))
    return constant, tuple(sorted(others))


def _same_size(a: tuple[Extent, ...], b: tuple[Extent, ...]) -> bool:
    return _factors(a) == _factors(b)


def _product(sizes: list[Extent]) -> Extent:
    out: Extent = 1
    for x in sizes:
        out = x if out == 1 else out * x if isinstance(out, int) and isinstance(x, int) else \
            Binary("mul", _as_expr(out), _as_expr(x), dtypes.i64)
    return out


def _as_expr(x: Extent) -> Expr:
    return Const(x, dtypes.i64) if isinstance(x, int) else x


def _invert(read: tuple[Expr, ...], at: tuple[Expr, ...], extents: dict[str, Extent],
            shape: tuple[Extent, ...]) -> dict[str, Expr] | None:
    """The epilogue's loop variables at which ``read`` equals ``at``. Each index of ``read`` is
    a row-major flattening ``(a * Eb + b) * Ec + c`` of parts covering its dim, a part being a
    variable or one digit of it (``y // R``, ``y % R``: im2col's blocks of output rows), or ``0``
    in both where a merged pixel index (``[n, f, 0, y*W + x]``, see passes/autoschedule_cpu/pixels.py) spans that
    dim and the next. Extents may be dynamic (``[f, y*W + x]`` over ``H*W`` pixels)."""
    digits: dict[tuple, Expr] = {}
    span: list[Extent] = []  # the dims the next index covers: its own and those merged into it
    for idx, x, dim in zip(read, at, shape):
        span.append(dim)
        if isinstance(idx, Const):
            if idx != x or idx.value != 0:
                return None
            continue
        parts = _flattened(idx, extents)
        if parts is None or not _same_size(tuple(e for _, e in parts), tuple(span)):
            return None
        span = []
        for pos, (key, extent) in enumerate(parts):
            if key in digits:
                return None
            inner = _product([e for _, e in parts[pos + 1:]])
            value = x if inner == 1 else Binary("floordiv", x, _as_expr(inner), x.dtype)
            if pos > 0:
                value = Binary("mod", value, _as_expr(extent), x.dtype)
            digits[key] = value
    return _combine(digits) if not span or _same_size(tuple(span), ()) else None


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


def _flattened(e: Expr, extents: dict[str, Extent]) -> list[tuple[tuple, Extent]] | None:
    """The parts of ``(a * Eb + b) * Ec + c`` (each part with its extent ``E``), else None."""
    atom = _digit(e, extents)
    if atom is not None:
        return [atom]
    if isinstance(e, Binary) and e.op == "add":
        tail = _digit(e.b, extents)
        scaled = e.a
        if tail is not None and isinstance(scaled, Binary) and scaled.op == "mul" \
                and scaled.b == _as_expr(tail[1]):
            head = _flattened(scaled.a, extents)
            return None if head is None else [*head, tail]
    return None


def _digit(e: Expr, extents: dict[str, Extent]) -> tuple[tuple, Extent] | None:
    """``v``, ``v // R`` or ``v % R`` of a loop variable ``v``, as (key, extent)."""
    if isinstance(e, Var) and e.name in extents:
        return (e.name, "all", 1), extents[e.name]
    if isinstance(e, Binary) and e.op in ("floordiv", "mod") and isinstance(e.a, Var) and e.a.name in extents \
            and isinstance(e.b, Const) and e.b.value > 0 and isinstance(extents[e.a.name], int) \
            and extents[e.a.name] % int(e.b.value) == 0:
        radix = int(e.b.value)
        if e.op == "mod":
            return (e.a.name, "lo", radix), radix
        return (e.a.name, "hi", radix), extents[e.a.name] // radix
    return None



