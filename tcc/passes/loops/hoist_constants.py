"""hoist_constants: work on constant inputs done once, before the calls, instead of at each call.

A model's weights are the same at every call, yet the CPU schedule packs a GEMM's weight operand
into its micro-panel layout inside the kernel, per call (and per image, per block of columns):
9.4 MB of scalar transposing copies for one 3x3 layer on 512 channels. Given the parameters
whose values are known before the first call (``constants``), this pass finds each *fill* of a
kernel buffer computed from constants alone and moves it into a separate *prepare* function,
run once per set of constants (the runtime caches its results with the kernel):

* a fill is a perfect loop nest whose one store writes a buffer ``B`` allocated inside the
  kernel, every element of it (the store's indices are the nest's loop variables), from an
  expression that reads only constant parameters, loop variables and numbers: the packing
  copies that ``cache`` makes, and any other pure transform of the constants;
* ``B`` is written nowhere else and read only after the fill, in the statements that follow it
  in the same sequence, so that at every read its value is what the fill wrote for the current
  iteration of the loops around it; no ``If`` or ``Let`` lies between the function's root and
  the fill (each iteration of those loops runs the fill, so the prepare function may too);
* ``B`` becomes a parameter ``P`` with one leading dim per enclosing loop whose variable the
  fill reads (a packed weight of ``ip`` threads' rows: ``P[ip, ...]``); loops it does not read,
  such as the image loop or a block of columns, are dropped, so the copy made per image and per
  block is made once. Reads ``B[idx]`` become ``P[vars..., idx]``.

A fill whose prepared buffer would exceed ``MAX_GROWTH`` times the constants it reads (a copy
that duplicates elements, say) stays where it is. The prepare function is the kernel's
``attrs["prepare"]``: parameters the constants it reads, then the prepared buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tcc.ir.expr import Load, Var, free_vars, transform, unique_name, walk
from tcc.ir.loopnest import const_extent, fresh, loads, map_exprs, nest_loops
from tcc.ir.loops import Allocate, Buffer, For, LoopFunc, Seq, Stmt, Store, map_stmt, seq, walk_stmts

MAX_GROWTH = 2  # a prepared buffer may hold at most this many times the bytes of the constants it reads
MIN_BYTES = 1 << 16  # ... or this many bytes, whichever is larger


@dataclass(frozen=True)
class _Fill:
    """One fill to hoist: the nest, its buffer, the loops around it that its value depends on."""

    nest: Stmt
    buffer: Buffer
    context: tuple[For, ...]
    prepared: Buffer


def hoist_constants(func: LoopFunc, constants: frozenset[str]) -> LoopFunc:
    """``func`` with each hoistable fill of ``constants`` moved into ``attrs["prepare"]`` (see the
    module docstring); ``func`` itself when there is none."""
    params = {p.name: p for p in func.params if isinstance(p, Buffer)}
    written = {s.buffer for s in walk_stmts(func.body) if isinstance(s, Store)}
    consts = {name for name in constants if name in params and name not in written}
    if not consts:
        return func
    fills: list[_Fill] = []
    taken = set(func.buffers())
    for nest, buf, context in _candidates(func.body, (), consts, _accesses(func.body)):
        sources = {ld.buffer for ld in loads(nest)}
        prepared = Buffer(unique_name(f"{buf.name}_prepared", taken), buf.dtype,
                          (*(const_extent(f) for f in context), *buf.shape))
        source_bytes = sum(params[s].size * params[s].dtype.itemsize for s in sources)
        if prepared.size * prepared.dtype.itemsize > max(MAX_GROWTH * source_bytes, MIN_BYTES):
            taken.discard(prepared.name)  # not hoisted: its name stays free
            continue
        fills.append(_Fill(nest, buf, context, prepared))
    if not fills:
        return func
    body = _remove(func.body, fills)
    sources = sorted({ld.buffer for f in fills for ld in loads(f.nest)}, key=list(params).index)
    prepare = LoopFunc(fresh(func, f"{func.name}_prepare"),
                       [*(params[s] for s in sources), *(f.prepared for f in fills)],
                       seq(*(_prepare_nest(f) for f in fills)), {"sources": len(sources)})
    return replace(func, params=[*func.params, *(f.prepared for f in fills)], body=body,
                   attrs={**func.attrs, "prepare": prepare})


def _accesses(body: Stmt) -> dict[str, int]:
    """How many stores and loads of each buffer ``body`` holds."""
    counts: dict[str, int] = {}
    for n in walk_stmts(body):
        if isinstance(n, Store):
            counts[n.buffer] = counts.get(n.buffer, 0) + 1
    for ld in loads(body):
        counts[ld.buffer] = counts.get(ld.buffer, 0) + 1
    return counts


def _candidates(s: Stmt, chain: tuple[For, ...], consts: set[str], accesses: dict[str, int],
                allocated: dict[str, Buffer] | None = None) -> list[tuple[Stmt, Buffer, tuple[For, ...]]]:
    """(fill nest, its buffer, the enclosing loops it reads) for each fill under ``s``, which
    lies under ``chain`` with no If or Let on the way."""
    allocated = allocated or {}
    if isinstance(s, For):
        return _candidates(s.body, (*chain, s), consts, accesses, allocated)
    if isinstance(s, Allocate):
        return _candidates(s.body, chain, consts, accesses, {**allocated, s.buffer.name: s.buffer})
    if not isinstance(s, Seq):
        return []  # an If, a Let, a store: nothing below is run on every iteration of ``chain``
    found = []
    for pos, item in enumerate(s.stmts):
        buf = _fill_of(item, consts, allocated)
        if buf is not None and _read_only_after(s.stmts, pos, buf.name, accesses[buf.name]):
            used = free_vars(_store(item).value)
            context = tuple(f for f in chain if f.var.name in used)
            loops = {f.var.name for f in (*chain, *nest_loops(item)[0])}
            if used <= loops and all(_const(f) for f in context):  # (a runtime scalar is no constant)
                found.append((item, buf, context))
                continue
        found += _candidates(item, chain, consts, accesses, allocated)
    return found


def _const(f: For) -> bool:
    return isinstance(getattr(f.extent, "value", None), int)


def _store(nest: Stmt) -> Store:
    return nest_loops(nest)[1]  # type: ignore[return-value]


def _fill_of(nest: Stmt, consts: set[str], allocated: dict[str, Buffer]) -> Buffer | None:
    """The buffer ``nest`` fills, if it is a fill of constants (see the module docstring)."""
    loops, store = nest_loops(nest)
    if not loops or not isinstance(store, Store) or store.buffer not in allocated:
        return None
    buf = allocated[store.buffer]
    names = [f.var.name for f in loops]
    index_names = [i.name for i in store.indices if isinstance(i, Var)]
    if len(index_names) != len(store.indices) or sorted(index_names) != sorted(names) \
            or len(set(names)) != len(names) or not all(_const(f) for f in loops):
        return None
    extents = {f.var.name: const_extent(f) for f in loops}
    if any(extents[name] != dim for name, dim in zip(index_names, buf.shape)):
        return None  # not every element: a partial fill
    reads = [n for n in walk(store.value) if isinstance(n, Load)]
    if not reads or any(r.buffer not in consts for r in reads):
        return None
    return buf


def _read_only_after(stmts: tuple[Stmt, ...], pos: int, name: str, accesses: int) -> bool:
    """Whether the buffer ``name``, of ``accesses`` stores and loads in the whole function, is
    written only by ``stmts[pos]`` (a fill: one store) and read only in the statements after it."""
    later = _accesses(Seq(stmts[pos + 1:])) if pos + 1 < len(stmts) else {}
    return later.get(name, 0) == accesses - 1 and not any(isinstance(n, Store) and n.buffer == name
                                                          for s in stmts[pos + 1:] for n in walk_stmts(s))


def _remove(body: Stmt, fills: list[_Fill]) -> Stmt:
    """The kernel without the fills and their buffers' allocations, reading the prepared buffers."""
    by_buffer = {f.buffer.name: f for f in fills}

    def node(n: Stmt) -> Stmt | None:
        if isinstance(n, Seq):
            kept = [c for c in n.stmts if not (isinstance(c, For) and _filled(c) in by_buffer
                                                and c == by_buffer[_filled(c)].nest)]
            return seq(*kept) if len(kept) != len(n.stmts) else None
        if isinstance(n, Allocate) and n.buffer.name in by_buffer:
            return n.body
        return None

    body = map_stmt(body, node)

    def retarget(e):
        return transform(e, lambda n: Load(by_buffer[n.buffer].prepared.name,
                                           (*(f.var for f in by_buffer[n.buffer].context), *n.indices), n.dtype)
                         if isinstance(n, Load) and n.buffer in by_buffer else None)

    return map_exprs(body, retarget)


def _filled(nest: Stmt) -> str | None:
    store = nest_loops(nest)[1]
    return store.buffer if isinstance(store, Store) else None


def _prepare_nest(fill: _Fill) -> Stmt:
    """The fill writing its prepared buffer, inside serial copies of the loops it depends on."""
    prefix = tuple(f.var for f in fill.context)

    def node(n: Stmt) -> Stmt | None:
        if isinstance(n, Store) and n.buffer == fill.buffer.name:
            return replace(n, buffer=fill.prepared.name, indices=(*prefix, *n.indices))
        return None

    body = map_stmt(fill.nest, node)
    for f in reversed(fill.context):
        body = For(f.var, f.extent, body, span=f.span)
    return body

