"""tensorize: a warp's tile of a contraction in the loop IR becomes matrix-unit statements.

A schedule writes a warp's share of a block's product as plain loops that every lane of the
warp runs in full, and marks the outer loop ``tensorize=mma.sync lane=LANE``::

    for i in 0..TM:  # tensorize=mma.sync lane=tx
        for j in 0..TN:
            for k in 0..TK:
                C[i, j] = C[i, j] + f32(X[.., r0 + i, k0 + k]) * f32(Y[.., c0 + j, k0 + k])

``C`` is a local ``TM x TN`` buffer (the warp's accumulator tile), ``X`` and ``Y`` are shared
buffers indexed with unit stride by the tile's row (``i`` or ``j``) and ``k`` in their last two
dimensions, either way round. Every other use of ``C`` is a nest ``for a in 0..TM: for b in
0..TN`` that touches only ``C[a, b]`` (its initialisation and the epilogue).

Running every element in every lane computes the same result as sharing them out, which is
what the rewrite does: ``C`` becomes the lanes' accumulator fragments ``C[TM/16][TN/8][4]``
(lane ``l`` holds rows ``l/4`` and ``l/4 + 8``, columns ``2 (l%4)`` and ``+1`` of each 16 x 8
piece), the marked nest becomes fragment loads and ``Mma`` statements, and each other nest over
``C`` runs once per fragment element, at the row and column that element has. With 16-bit
operands (f16, bf16: ``m16n8k16``) fragments come from ``ldmatrix`` (``.trans`` where the row is
the contiguous index); 8-bit ones (``f8e4m3``, ``f8e5m2``: ``m16n8k32``, sm_89 on) lay out their
fragments byte for byte as 16-bit ones do, so the same ``ldmatrix`` loads them, 16 elements a row
of an 8 x 8 (b16) tile, but only K-major (``.trans`` would swap bytes within pairs); with f32
operands the mark must say ``mma.sync.tf32`` (TF32 rounds them to 10 mantissa bits: the caller
opted in) and lanes load their fragment elements one by one.

``tensorize=wgmma`` marks a warpgroup's tile (``lane`` its 128 lanes, TM a multiple of 64, TN
at most 256): the operands must be 128-byte swizzled shared buffers, read through descriptors,
and the nest becomes ``wgmma.fence``, one ``WarpgroupMma`` per 64 rows and 16 of k (8 for TF32,
32 for 8-bit floats, which like TF32 must be K-major: the instruction has no transpose for them), and a
commit; the schedule places the waits (``WarpgroupSync``) that its pipeline needs. Warp ``w``
of the warpgroup holds rows ``16 w ..`` of each 64-row fragment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Binary, Cast, Const, Expr, Load, Var, substitute, transform, unique_name, walk
from tcc.ir.loopnest import (
    add_index,
    div_index,
    linear_coeff,
    map_exprs,
    mod_index,
    mul_index,
    nest_loops,
    on_loops,
    require_loop,
)
from tcc.ir.loops import (
    Allocate,
    Buffer,
    For,
    Let,
    LoopFunc,
    MatrixLoad,
    Mma,
    Stmt,
    Store,
    WarpgroupMma,
    WarpgroupSync,
    map_stmt,
    seq,
    stmt_exprs,
    walk_stmts,
)
from tcc.passes.loops.bind_lanes import LANES, Lanes, lanes_of

I64 = dtypes.i64
I32 = dtypes.i32
F32 = dtypes.f32
INSTRUCTIONS = ("mma.sync", "mma.sync.tf32", "wgmma", "wgmma.tf32")
FP8_KINDS = ("e4m3", "e5m2")


@dataclass(frozen=True)
class _Operand:
    load: Load
    row: str  # the tile's row variable in this operand (i for X, j for Y)
    k: str  # the reduction variable
    trans: bool  # the row index is the contiguous one ([k][row] in shared memory)

    def at(self, row: Expr, k: Expr) -> Load:
        """The operand's element at tile row ``row`` and reduction index ``k``."""
        where = {self.row: row, self.k: k}
        return Load(self.load.buffer, tuple(substitute(ix, where) for ix in self.load.indices), self.load.dtype)


@dataclass(frozen=True)
class _Plan:
    """One marked nest: what its accumulator becomes and how lanes own its elements."""

    acc: str
    tm: int
    tn: int
    lane: Var  # the lane in the warp (mma.sync) or warpgroup (wgmma)
    kind: str  # f16, bf16, tf32, e4m3 or e5m2 (PTX's names)
    what: str  # the instruction

    @property
    def warpgroup(self) -> bool:
        return self.what.startswith("wgmma")

    @property
    def rows(self) -> int:
        """Accumulator rows per fragment: one warp's 16, or a warpgroup's 64."""
        return 64 if self.warpgroup else 16


def mark(func: LoopFunc, loop: str, what: str, span: Span | None = None) -> LoopFunc:
    """The schedule step ``tensorize(LOOP, WHAT)``: mark each loop named ``loop`` that heads an
    ``i, j, k`` tile nest (copies that ``cache`` made under the same name are left alone) inside
    a loop bound to warps (warpgroups for wgmma) for the rewrite that :func:`tensorize_marked`
    runs once every step has, so later steps may still stage its operands. The nest's shape is
    checked here, its operands' memory at the rewrite."""
    if what not in INSTRUCTIONS:
        raise _fail(f"unknown instruction {what!r} (known: {', '.join(INSTRUCTIONS)})", span)
    require_loop(func, loop, span)
    axis = "warpgroup" if what.startswith("wgmma") else "warp"
    found: list[Lanes | None] = []
    _enclosing_lanes(func.body, loop, None, found)
    lanes_at = iter(found)
    errors: list[tuple[bool, TccScheduleError]] = []

    def marked(f: For) -> For:
        lanes = next(lanes_at)
        nest = len(nest_loops(f)[0]) >= 3
        if nest and (lanes is None or lanes.size != LANES[axis]):
            where = "not inside a loop bound to warps or warpgroups" if lanes is None else \
                f"inside a loop bound to {'warps' if lanes.size == 32 else 'warpgroups'}"
            raise TccScheduleError(f"tensorize({loop}, {what}): loop {loop} is {where}", span,
                                   f"{what} runs on one {axis}: bind the loop over the block's {axis}s with "
                                   f"bind(LOOP, {axis}) around the tile nest")
        out = replace(f, annotations=f.annotations + (("tensorize", what), ("lane", lanes.lane if lanes else None)))
        try:
            _plan(out)
        except TccScheduleError as err:
            errors.append((nest, err))
            return f
        return out
    out = on_loops(func, loop, marked)
    if len(errors) == len(found):
        err = next((e for nest, e in errors if nest), errors[0][1])
        raise TccScheduleError(err.message, span, err.hint)
    return out


def _enclosing_lanes(s: Stmt, loop: str, lanes: Lanes | None, out: list[Lanes | None]) -> None:
    """The warp grid (or None) around each loop named ``loop``, in the order they appear."""
    if isinstance(s, For) and s.var.name == loop:
        out.append(lanes)
        return
    if isinstance(s, For) and s.kind == "thread.x":
        lanes = lanes_of(s)
    for c in s.children():
        _enclosing_lanes(c, loop, lanes, out)


def tensorize_marked(func: LoopFunc, span: Span | None = None) -> LoopFunc:
    """``func`` with every nest a ``tensorize`` step marked on matrix units (a bad one raises at
    ``span``, the step's)."""
    taken = {p.name for p in func.params} | set(func.buffers())
    for s in walk_stmts(func.body):
        if isinstance(s, (For, Let)):
            taken.add(s.var.name)

    def fresh(base: str) -> Var:
        return Var(unique_name(base, taken), I64)
    try:  # no pipeline of warpgroup products here: each group is waited for at once
        return replace(func, body=tensorize(func.body, fresh, wait=True))
    except TccScheduleError as err:
        raise TccScheduleError(err.message, span or err.span, err.hint) from None


def tensorize(kernel: Stmt, fresh, wait: bool = False) -> Stmt:
    """``kernel`` with each nest marked ``tensorize`` on matrix units; ``fresh(base)`` names new
    variables and buffers (a ``Var``). A bad mark raises a TccScheduleError at the nest. Warpgroup
    products end with their commit, for the caller to wait where its pipeline allows, or, with
    ``wait``, with a wait for them."""
    plans: dict[str, _Plan] = {}
    for s in walk_stmts(kernel):
        if isinstance(s, For) and _note(s, "tensorize") is not None:
            plan = _plan(s)
            if plans.setdefault(plan.acc, plan) != plan:
                raise _fail(f"two tensorized nests accumulate into {plan.acc} differently", s.span)
    if not plans:
        return kernel
    shared = {s.buffer.name: s.buffer for s in walk_stmts(kernel)
              if isinstance(s, Allocate) and s.buffer.scope == "shared"}

    def rewrite(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and _note(s, "tensorize") is not None:
            return _products(s, plans[_plan(s).acc], shared, fresh, wait)
        if isinstance(s, Allocate) and s.buffer.name in plans:
            p = plans[s.buffer.name]
            return replace(s, buffer=Buffer(s.buffer.name, F32, (p.tm // p.rows, p.tn // 8, 4), "local"))
        if isinstance(s, For) and isinstance(s.body, For):
            return _elementwise(s, plans, fresh)
        return None
    out = map_stmt(kernel, rewrite)
    for s in walk_stmts(out):
        touched = [n for e in stmt_exprs(s) for n in walk(e) if isinstance(n, Load)]
        if isinstance(s, Store):
            touched.append(Load(s.buffer, s.indices, F32))
        for n in touched:
            if n.buffer in plans and len(n.indices) == 2:
                raise _fail(f"{n.buffer} is used outside a `for a: for b:` nest over its whole tile "
                            "indexed [a, b]", getattr(s, "span", None))
    return out


def _note(f: For, key: str) -> object:
    return next((v for k, v in f.annotations if k == key), None)


def _fail(message: str, span: Span | None) -> TccScheduleError:
    return TccScheduleError(f"tensorize: {message}", span,
                            "mark `for i: for j: for k: C[i, j] = C[i, j] + X[.., i, k] * Y[.., j, k]` over a "
                            "local C and shared X, Y, with 16 | TM, 16 | TN, 16 | TK (8 for tf32, 32 for 8-bit floats)")


def _plan(nest: For) -> _Plan:
    what, lane = _note(nest, "tensorize"), _note(nest, "lane")
    if what not in INSTRUCTIONS:
        raise _fail(f"unknown instruction {what!r} (known: {', '.join(INSTRUCTIONS)})", nest.span)
    if not isinstance(lane, Var):
        raise _fail("the nest names no lane variable (annotation lane=)", nest.span)
    i, j, k, body = _three_loops(nest)
    acc, x, y = _update(body, i, j, nest.span)
    kind = _kind(x, y, what, nest.span)
    tm, tn, tk = (_extent(f, nest.span) for f in (i, j, k))
    if str(what).startswith("wgmma") and (tm % 64 or tn % 8 or tn > 256 or tk % _k_step(kind)):
        raise _fail(f"tile {tm} x {tn} x {tk} of {kind} is not made of whole m64nNk{_k_step(kind)} wgmma "
                    "(N <= 256)", nest.span)
    if tm % 16 or tn % 16 or tk % _k_step(kind):
        raise _fail(f"tile {tm} x {tn} x {tk} is not made of whole instructions", nest.span)
    return _Plan(acc, tm, tn, lane, kind, str(what))


def _k_step(kind: str) -> int:
    """The k of one instruction: 32 bytes of each operand's rows (TF32 is read at 8)."""
    return {"tf32": 8, "e4m3": 32, "e5m2": 32}.get(kind, 16)


def _three_loops(nest: For) -> tuple[For, For, For, Stmt]:
    loops, s = [], nest
    while isinstance(s, For) and len(loops) < 3:
        loops.append(s)
        s = s.body
    if len(loops) < 3:
        raise _fail("the marked nest needs three perfectly nested loops (i, j, k)", nest.span)
    return loops[0], loops[1], loops[2], s


def _extent(f: For, span: Span | None) -> int:
    if not isinstance(f.extent, Const):
        raise _fail(f"loop {f.var.name} has no constant extent", span)
    return int(f.extent.value)


def _update(body: Stmt, i: For, j: For, span: Span | None) -> tuple[str, Expr, Expr]:
    """(accumulator, X operand, Y operand) of ``C[i, j] = C[i, j] + X * Y``."""
    ij = (i.var, j.var)
    v = body.value if isinstance(body, Store) else None
    if isinstance(body, Store) and body.indices != ij:
        raise TccScheduleError(f"tensorize: the innermost statement is not C[i, j] = C[i, j] + X * Y: the "
                               f"accumulator {body.buffer} is not indexed [{i.var.name}, {j.var.name}]", span,
                               f"cache({body.buffer}, LOOP, local) at a loop around the tile nest, so that it "
                               "becomes the warp's tile in registers")
    if not (isinstance(body, Store) and body.indices == ij and isinstance(v, Binary) and v.op == "add"
            and v.a == Load(body.buffer, ij, F32) and isinstance(v.b, Binary) and v.b.op == "mul"
            and v.dtype == F32):
        raise _fail("the innermost statement is not C[i, j] = C[i, j] + X * Y in f32", span)
    return body.buffer, v.b.a, v.b.b


def _kind(x: Expr, y: Expr, what: object, span: Span | None) -> str:
    kinds = {_operand_kind(e) for e in (x, y)}
    if len(kinds) != 1 or None in kinds:
        raise _fail("operands must both be f16, both bf16 or both one 8-bit float widened to f32, or both f32",
                    span)
    kind = kinds.pop()
    if (kind == "tf32") != str(what).endswith(".tf32"):
        raise _fail("f32 operands need a mark ending .tf32, mma.sync.tf32 or wgmma.tf32 (and only they)", span)
    return kind


def _operand_kind(e: Expr) -> str | None:
    if isinstance(e, Cast) and e.dtype == F32 and isinstance(e.a, Load) and e.a.dtype.name in ("f16", "bf16"):
        return e.a.dtype.name
    if isinstance(e, Cast) and e.dtype == F32 and isinstance(e.a, Load) and e.a.dtype.is_fp8:
        return e.a.dtype.name.removeprefix("f8")  # e4m3, e5m2
    return "tf32" if isinstance(e, Load) and e.dtype == F32 else None


def _operand(e: Expr, row: Var, other: Var, k: Var, shared: dict[str, Buffer], span: Span | None) -> _Operand:
    load = e.a if isinstance(e, Cast) else e
    assert isinstance(load, Load)
    buf = shared.get(load.buffer)
    if buf is None:
        raise _fail(f"operand {load.buffer} is not a shared buffer of the kernel", span)
    coeffs = [(linear_coeff(ix, row.name), linear_coeff(ix, k.name), linear_coeff(ix, other.name))
              for ix in load.indices]
    if len(coeffs) < 2 or any(c[2] != 0 for c in coeffs) or any(
            c != (0, 0, 0) for c in coeffs[:-2]) or {coeffs[-2][:2], coeffs[-1][:2]} != {(1, 0), (0, 1)}:
        raise _fail(f"{load.buffer} is not indexed [.., {row.name}, k] or [.., k, {row.name}] with unit steps "
                    "(the marked loop runs over the rows of the product's first factor, the loop inside it over "
                    "the second's)", span)
    if buf.shape[-1] * buf.dtype.itemsize % 16:
        raise _fail(f"rows of {load.buffer} are not 16-byte aligned", span)
    return _Operand(load, row.name, k.name, coeffs[-1][0] == 1)


def _products(nest: For, plan: _Plan, shared: dict[str, Buffer], fresh, wait: bool = False) -> Stmt:
    """Fragment loads and matrix instructions for the marked nest."""
    i, j, k, body = _three_loops(nest)
    assert isinstance(body, Store) and isinstance(body.value, Binary) and isinstance(body.value.b, Binary)
    x = _operand(body.value.b.a, i.var, j.var, k.var, shared, nest.span)
    y = _operand(body.value.b.b, j.var, i.var, k.var, shared, nest.span)
    if plan.kind in FP8_KINDS and (x.trans or y.trans):
        raise _fail(f"8-bit operands are read K-major only; {(x if x.trans else y).load.buffer} is stored [k][row]",
                    nest.span)
    if plan.warpgroup:
        products = _warpgroup_products(nest, plan, x, y, shared, fresh)
        return seq(products, WarpgroupSync("wait", 0)) if wait else products
    mf, nf, step = plan.tm // 16, plan.tn // 8, _k_step(plan.kind)
    frag = F32 if plan.kind == "tf32" else I32
    a, b = fresh("afrag"), fresh("bfrag")
    abuf, bbuf = Buffer(a.name, frag, (mf, 4), "local"), Buffer(b.name, frag, (nf, 2), "local")
    ks, fi, fj = fresh("ks"), fresh("fi"), fresh("fj")
    k0 = mul_index(ks, step)
    if plan.kind == "tf32":
        loads = seq(_scalar_fragments(x, abuf, fi, mf, k0, plan.lane, fresh("fr"), True),
                    _scalar_fragments(y, bbuf, fj, nf, k0, plan.lane, fresh("fr"), False))
    else:
        loads = seq(_ldmatrix(x, abuf, fi, mf, k0, plan.lane, True),
                    _ldmatrix(y, bbuf, fj, nf // 2, k0, plan.lane, False))
    zero = Const(0, I64)
    mma = Mma((16, 8, step), plan.kind, Load(plan.acc, (fi, fj, zero), F32), Load(a.name, (fi, zero), frag),
              Load(b.name, (fj, zero), frag))
    products = For(fi, Const(mf, I64), For(fj, Const(nf, I64), mma, "unroll"), "unroll")
    steps = For(ks, Const(_extent(k, nest.span) // step, I64), seq(loads, products), "unroll", span=nest.span)
    return Allocate(abuf, Allocate(bbuf, steps))


def _warpgroup_products(nest: For, plan: _Plan, x: _Operand, y: _Operand, shared: dict[str, Buffer],
                        fresh) -> Stmt:
    """``wgmma`` straight from the shared tiles: a fence (the accumulators were written by other
    statements), one instruction per 64 rows and 16 of k, and a commit. The caller waits."""
    for op in (x, y):
        buf = shared[op.load.buffer]
        atom = 128 // buf.dtype.itemsize
        if buf.swizzle != 128 or (not op.trans and buf.shape[-1] != atom) or (op.trans and buf.shape[-2] % 8):
            raise _fail(f"wgmma reads {buf.name} through a descriptor: it must be 128-byte swizzled with "
                        f"{'8 | rows' if op.trans else f'rows of {atom} elements (one atom)'}", nest.span)
        if op.trans and plan.kind == "tf32":
            raise _fail(f"wgmma reads TF32 operands K-major only; {buf.name} is stored [k][row]", nest.span)
        if plan.kind in FP8_KINDS and buf.dtype.itemsize != 1:
            raise _fail(f"wgmma reads 8-bit operands from 8-bit tiles; {buf.name} is {buf.dtype}", nest.span)
    ks, fi = fresh("ks"), fresh("fi")
    step = _k_step(plan.kind)
    k0, zero = mul_index(ks, step), Const(0, I64)
    mma = WarpgroupMma((64, plan.tn, step), plan.kind, Load(plan.acc, (fi, zero, zero), F32),
                       x.at(mul_index(fi, 64), k0), y.at(zero, k0), x.trans, y.trans)
    steps = For(ks, Const(_extent(_three_loops(nest)[2], nest.span) // step, I64),
                For(fi, Const(plan.tm // 64, I64), mma, "unroll"), "unroll", span=nest.span)
    return seq(WarpgroupSync("fence"), steps, WarpgroupSync("commit"))


def _ldmatrix(op: _Operand, dst: Buffer, f: Var, count: int, k0: Expr, lane: Var, is_a: bool) -> Stmt:
    """One ``ldmatrix.x4`` per 16 rows: four 8x8 tiles, lane ``l`` addressing row ``l % 8`` of tile
    ``l / 8``. For A the tiles are (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): the
    a0..a3 registers; for B (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): b0, b1 of two
    8-column fragments (k counted in 16-bit elements: in 8-bit ones each range is twice as long)."""
    q = div_index(lane, 8)
    tile_row, tile_k = (mod_index(q, 2), div_index(q, 2)) if is_a else (div_index(q, 2), mod_index(q, 2))
    row, kk = mul_index(tile_row, 8), mul_index(tile_k, 16 // op.load.dtype.itemsize)  # a tile row: 16 bytes
    if op.trans:  # stored [k][row]: a lane's address is a k row
        kk = add_index(kk, mod_index(lane, 8))
    else:
        row = add_index(row, mod_index(lane, 8))
    src = op.at(add_index(mul_index(f, 16), row), add_index(k0, kk))
    zero = Const(0, I64)
    first = (f, zero) if is_a else (mul_index(f, 2), zero)
    return For(f, Const(count, I64), MatrixLoad(Load(dst.name, first, dst.dtype), src, 4, op.trans), "unroll")


def _scalar_fragments(op: _Operand, dst: Buffer, f: Var, count: int, k0: Expr, lane: Var, r: Var,
                      is_a: bool) -> Stmt:
    """TF32 fragments element by element: a_r at (row g + 8 (r % 2), k t + 4 (r / 2)), b_r at
    (column g, k t + 4 r), for g = lane / 4, t = lane % 4."""
    g, t = div_index(lane, 4), mod_index(lane, 4)
    if is_a:
        row, kk = add_index(g, mul_index(mod_index(r, 2), 8)), add_index(t, mul_index(div_index(r, 2), 4))
        rows, regs = 16, 4
    else:
        row, kk, rows, regs = g, add_index(t, mul_index(r, 4)), 8, 2
    store = Store(dst.name, (f, r), op.at(add_index(mul_index(f, rows), row), add_index(k0, kk)))
    return For(f, Const(count, I64), For(r, Const(regs, I64), store, "unroll"), "unroll")


def _elementwise(outer: For, plans: dict[str, _Plan], fresh) -> Stmt | None:
    """A ``for a: for b:`` nest over an accumulator tile, run once per fragment element of the lane
    (element ``e`` of fragment (fi, fj) is row ``16 fi + l/4 + 8 (e/2)``, column ``8 fj + 2 (l%4) + e%2``);
    a ``vector`` loop ``b`` (consecutive columns) gives 2-lane vector loops over each pair ``e%2``."""
    inner = outer.body
    assert isinstance(inner, For)
    ab = (outer.var, inner.var)
    uses = [(n.buffer, n.indices) for s in walk_stmts(inner.body) for e in stmt_exprs(s) for n in walk(e)
            if isinstance(n, Load) and n.buffer in plans]
    uses += [(s.buffer, s.indices) for s in walk_stmts(inner.body) if isinstance(s, Store) and s.buffer in plans]
    found = {name for name, _ in uses}
    if len(found) != 1 or any(indices != ab for _, indices in uses):
        return None
    plan = plans[found.pop()]
    if not (isinstance(outer.extent, Const) and isinstance(inner.extent, Const)
            and (outer.extent.value, inner.extent.value) == (plan.tm, plan.tn)):
        return None
    fi, fj, e = fresh("fi"), fresh("fj"), fresh("fe")
    vector = inner.kind == "vector"  # the tile's columns as vectors: each lane's column pairs are 2-lane ones
    half, pair = (fresh("fh"), fresh("fp")) if vector else (div_index(e, 2), mod_index(e, 2))
    frag = (fi, fj, add_index(mul_index(half, 2), pair) if vector else e)

    def load(n: Expr) -> Expr | None:
        return Load(plan.acc, frag, F32) if isinstance(n, Load) and n.buffer == plan.acc and n.indices == ab else None

    def store(s: Stmt) -> Stmt | None:
        return replace(s, indices=frag) if isinstance(s, Store) and s.buffer == plan.acc and s.indices == ab else None
    body = map_stmt(map_exprs(inner.body, lambda x: transform(x, load)), store)
    lane = plan.lane
    if plan.warpgroup:  # warp w of the warpgroup holds rows 16 w .. 16 w + 15
        in_warp = add_index(mul_index(div_index(lane, 32), 16),
                            add_index(div_index(mod_index(lane, 32), 4), mul_index(half, 8)))
    else:
        in_warp = add_index(div_index(lane, 4), mul_index(half, 8))
    row = add_index(mul_index(fi, plan.rows), in_warp)
    col = add_index(mul_index(fj, 8), add_index(mul_index(mod_index(lane, 4), 2), pair))
    body = Let(outer.var, row, Let(inner.var, col, body))
    elements: Stmt = For(e, Const(4, I64), body, "unroll")
    if vector:
        assert isinstance(half, Var) and isinstance(pair, Var)
        elements = For(half, Const(2, I64), For(pair, Const(2, I64), body, "vector"), "unroll")
    return For(fi, Const(plan.tm // plan.rows, I64), For(fj, Const(plan.tn // 8, I64), elements, "unroll"),
               "unroll", span=outer.span)
