"""The CPU auto-scheduler's contractions: ``C[...] = g(sum[k...](A[...] * B[...]))`` as BLIS does it.

The reduction is decomposed into updates of the result, the loops are tiled for the target's
caches (L1 holds an ``mr x kc`` micro-panel of A while the ``kc x nr`` micro-panels of B stream
past it from L2), B and A are packed, and an ``mr x nr`` register tile of C is accumulated with
fused multiply-adds (ii unrolled, jj one vector); each thread takes its own rows of C. Every
step is a loop primitive of :mod:`tcc.passes.loops`, reported through the trace.

Tile sizes come from :func:`gemm_params`; the tuner (tcc.tune) searches around them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Cast, Const, Expr, Load, Var, const, free_vars
from tcc.ir.loopnest import fresh, linear_coeff, loop_names, on_loops, subst
from tcc.ir.loops import Allocate, For, LoopFunc, Seq, Stmt, Store, map_stmt, walk_stmts
from tcc.passes.autoschedule_cpu.epilogue import store_epilogue
from tcc.passes.autoschedule_cpu.pixels import merge_pixels
from tcc.passes.autoschedule_cpu.remainders import pad_remainders
from tcc.passes.autoschedule_cpu.tile_init import init_in_first_block, init_in_registers
from tcc.passes.loops.cache import cache
from tcc.passes.loops.fuse import fuse
from tcc.passes.loops.parallel import parallel
from tcc.passes.loops.reduction import decompose_reduction
from tcc.passes.loops.reorder import reorder
from tcc.passes.loops.schedule import contract
from tcc.passes.loops.split import split
from tcc.passes.loops.unroll import unroll
from tcc.passes.loops.vectorize import vectorize
from tcc.passes.trace import SILENT, Trace
from tcc.target import CpuTarget

DYNAMIC_EXTENT = 1024  # what the tiles assume of an extent the dynamic shape symbols give (tails take the rest)
REMAINDER_ROWS = 4  # a dynamic row count's remainder runs as tiles of this many rows (the last padded)
PARALLEL_MIN_WORK = 1 << 15  # iterations below which a fork costs more than it saves
PACK_A_ONCE_BYTES = 32 << 20
A_COPY_COST = 3
ONE_K_BLOCK = 4  # reductions up to this many k blocks run as one (a 3x3 conv on 64 channels, matmul 1024)


def gemm_params(m: int, n: int, k: int, itemsize: int, target: CpuTarget) -> dict[str, int]:
    """Register tile mr x nr (nr two vectors of f32 wide, three quarters of the vector registers
    accumulate: 12 x 32 of the 32 zmm registers with AVX-512, 6 x 16 of the 16 ymm registers with
    AVX2, where an AVX-512 tile spilled: a 3x3 conv on 512 channels at 7x7 ran 3x slower), kc
    from L1 (nr lanes x 4 bytes x kc <= L1; up to 4 such blocks run as one: matmul 1000 and 1024
    ~5% faster), mc x kc block of A in an eighth of L2 and kc x nc panel of B in a quarter
    (measured on the 2 MiB-L2 development host: A in a quarter was 20-25% slower at 2048; B in an
    eighth 7% slower on a 3x3 conv, in a half 4% slower).

    With AVX-512, columns that two-vector tiles fit badly but three-vector ones well get an
    ``8 x 48`` tile (24 accumulators; 3 loads and 8 broadcasts per 24 multiply-adds): the 49
    pixels of a 7x7 layer had made ``12 x 16`` tiles (13 loads per 12 multiply-adds), and a 3x3
    conv on 512 (or 256 -> 512) channels at 7x7 ran 5-12% faster on one znver4 core
    (interleaved, thread time). Where two-vector tiles fit (3136, 784, 196 columns) three-vector
    ones were no faster."""
    l1, l2 = target.cache_bytes(1), target.cache_bytes(2)
    wide = target.vector_bytes == 64
    nr = (32 if wide else 16) if itemsize == 4 else (16 if wide else 8)
    mr = _register_rows(m, target.cores, (12, 8) if wide else (6, 4))
    lanes = target.vector_bytes // itemsize
    if wide and column_tile(n, nr, lanes) < nr and column_tile(n, 3 * lanes, lanes) == 3 * lanes:
        nr, mr = 3 * lanes, 8  # 49 columns (a 7x7 layer): 48 + 1, not 3 x 16 + 1
    kc = max(16, min(256, l1 // (nr * itemsize)))
    if k <= ONE_K_BLOCK * kc:  # one k block: no pass to zero C, no reloads of C, the epilogue in the tile store
        kc = k
    kc = _even_k_blocks(k, kc)
    mc = max(mr, (l2 // 8 // (kc * itemsize)) // mr * mr)
    nc = max(nr, (l2 // 4 // (kc * itemsize)) // nr * nr)
    return {"mr": mr, "nr": nr, "kc": kc, "mc": mc, "nc": nc}


def _even_k_blocks(k: int, kc: int) -> int:
    """``kc`` lowered to the nearest block size that divides ``k`` into as few blocks as it can,
    if one is at least half of it: a 3x3 conv on 128 channels (k = 1152) runs four blocks of 288
    rather than four of 256 and a tail of 128, whose copy of the micro-kernel cost compile time
    and ran no faster (ResNet-18 at batch 8: 6.8 -> 6.1 CPU seconds cold, kernels unchanged)."""
    blocks = -(-k // kc)
    while k % blocks and k // (blocks + 1) >= kc // 2:
        blocks += 1
    return k // blocks if k % blocks == 0 else kc


def column_tile(n: int, nr: int, lanes: int) -> int:
    """The register tile's columns for ``n`` columns (``nr`` at most): whole vectors of ``lanes``,
    with a tail (``n`` modulo the tile) of whole vectors or at most one. A row of the tile wider
    than one vector but not a whole number of them is a vector type LLVM splits badly: with
    AVX-512 (znver4) a 17- to 31-lane tile row was kept in memory and rebuilt lane by lane every
    k step (the 49 columns of a 3x3 conv at 7x7 as 32 + 17: 16 ms against 3.1 ms as 3 x 16 + 1;
    a 24-column matmul 12.2 ms against 0.75 ms as 16 + 8). Applied with AVX-512 only: with AVX2
    the 1.5-vector rows run well (12, 13 and 41 columns as 12, 13 and 16 + 16 + 9 were 23% faster
    than as whole vectors and a tail)."""
    width = min(nr, n)
    if width > lanes and width % lanes:
        width -= width % lanes
    while width > lanes and n % width > lanes and n % width % lanes:
        width -= lanes
    return width


def even_block(extent: int, tile: int, budget: int) -> int:
    """The cache block of ``extent`` for a ``budget`` (a multiple of ``tile``): the largest multiple
    of ``tile`` from half the budget to a quarter above it that divides ``extent``, else the budget. Each
    remainder block is a copy of the whole tile nest (split's tail): 64 rows in blocks of 28 are
    two blocks and a tail of 8, in blocks of 32 two; 3136 columns in blocks of 48 are 65 and a
    tail, of 32 exactly 98 (ResNet-18 at batch 8 compiled in 5.8 rather than 7.3 CPU seconds,
    its kernels as fast, one process, interleaved)."""
    if extent % budget == 0:
        return budget
    fits = [size for size in range(tile, budget + budget // 4 + 1, tile) if extent % size == 0 and 2 * size >= budget]
    return fits[-1] if fits else budget


def _register_rows(m: int, cores: int, choices: tuple[int, int]) -> int:
    """The full tile's rows (``choices[0]``: 12 with AVX-512), or the smaller choice where the
    full one pads a thread's share of the rows by more than 2% and the smaller pads them less:
    64 output channels are 8 tiles of 8 rather than 5 of 12 and a 4-row tail, and 256 rows split
    over 2 threads become 16 tiles each, which also lets the threads split the rows (see
    _parallel_axis) instead of each packing all of A."""
    rows = -(-m // cores)
    full, small = choices

    def waste(mr: int) -> float:
        return -(-rows // mr) * mr / rows - 1

    return small if waste(full) > 0.02 and waste(small) < waste(full) else full


# ---------------------------------------------------------------- contractions

@dataclass(frozen=True)
class GemmNest:
    """A statement ``C[...] = g(sum[k...](A[...] * B[...]))`` as the GEMM schedule sees it."""

    tensor: str  # C, the result
    i: str  # the row loop (A's)
    j: str  # the column loop (B's)
    k_loops: list[str]  # the reduction loops, outermost first
    batch: list[str]  # the other output loops
    m: int
    n: int
    k: int  # the extents of i, j and of all k loops together
    flops: int
    itemsize: int  # of A's elements
    a: str
    b: str  # the operands
    extents: dict[str, int]  # of every loop of the nest (a dynamic one's: DYNAMIC_EXTENT)
    outer: tuple[str, ...] = field(default=())  # the group loops around the nest
    dynamic: frozenset[str] = frozenset()  # the loops whose extents the dynamic shape symbols give


def contractions(func: LoopFunc) -> dict[str, GemmNest]:
    """Statements ``C[...] = g(sum[k...](A[...] * B[...]))`` with their i, j, k loops.

    They are found at the top level and inside group loops (the batch loop im2col and fusion put
    around a patch gather, a GEMM and its epilogue); ``outer`` names the loops around the nest.
    """
    found = {}
    for item, outer in nests(func.body, ()):
        info = _contraction(item)
        if info is not None:
            found[info.tensor] = replace(info, outer=tuple(outer))
    return found


def merge_contraction_pixels(func: LoopFunc) -> LoopFunc:
    """Merge the last two output loops ``y, j`` of each contraction into one pixel loop where every
    access allows it (a 1x1 convolution: a GEMM over H*W columns, not W; see passes/autoschedule_cpu/pixels.py)."""
    for item, _ in nests(func.body, ()):
        info = _contraction(item)
        names = _output_loops(item)
        if info is not None and len(names) >= 3 and names[-1] == info.j and names[-2] in info.batch:
            func = merge_pixels(func, item, names[-2], names[-1])
    return func


def _output_loops(nest: Stmt) -> list[str]:
    names = []
    while isinstance(nest, For):
        names.append(nest.var.name)
        nest = nest.body
    return names


def nests(body: Stmt, outer: tuple[str, ...]) -> list[tuple[Stmt, tuple[str, ...]]]:
    """Each statement of ``body`` with the loops around it, descending into group loops."""
    out = []
    for item in items(body):
        out.append((item, outer))
        if is_group(item):
            out += nests(item.body, (*outer, item.var.name))  # type: ignore[attr-defined]
    return out


def is_group(s: Stmt) -> bool:
    """A loop whose body is several statements (with buffers of its own): a fusion group's loop,
    or the outer of the group's loops (``n`` around ``y_block`` of im2col's row blocks)."""
    if not isinstance(s, For):
        return False
    body, allocs = s.body, 0
    while isinstance(body, Allocate):
        body, allocs = body.body, allocs + 1
    if isinstance(body, For) and not allocs:
        return is_group(body)
    return isinstance(body, Seq) and (allocs > 0 or len(body.stmts) > 1) and not _is_reduction_body(s.body)


def _is_reduction_body(s: Stmt) -> bool:
    return isinstance(s, Allocate) and isinstance(s.body, Seq) and len(s.body.stmts) == 3 \
        and s.buffer.scope == "local" and s.buffer.size == 1


def items(body: Stmt) -> list[Stmt]:
    while isinstance(body, Allocate):
        body = body.body
    return list(body.stmts) if isinstance(body, Seq) else [body]


def _contraction(nest: Stmt) -> dict | None:
    axes: list[For] = []
    s = nest
    while isinstance(s, For):
        axes.append(s)
        s = s.body
    if len(axes) < 2 or not (isinstance(s, Allocate) and isinstance(s.body, Seq) and len(s.body.stmts) == 3):
        return None
    init, red, final = s.body.stmts
    rloops: list[For] = []
    r = red
    while isinstance(r, For):
        rloops.append(r)
        r = r.body
    if not (rloops and isinstance(r, Store) and r.buffer == s.buffer.name and isinstance(final, Store)) \
            or final.accumulate:  # (a += of a contraction: its positions may repeat, not a GEMM's tiles)
        return None
    indices = {f.var.name for f in axes + rloops}
    if any(free_vars(f.extent) & indices for f in axes + rloops):  # a triangle (sum[j: i + 1]) is no GEMM
        return None
    value = r.value
    if not (isinstance(value, Binary) and value.op == "add" and isinstance(value.b, Binary) and value.b.op == "mul"):
        return None
    a, b = _strip(value.b.a), _strip(value.b.b)
    if not (isinstance(a, Load) and isinstance(b, Load)):
        return None
    j = axes[-1].var.name
    if not _moves_with(b, j) or any(j in free_vars(x) for x in a.indices):
        a, b = b, a
    if not _moves_with(b, j) or any(j in free_vars(x) for x in a.indices):
        return None
    a_vars = set().union(*(free_vars(x) for x in a.indices))
    b_vars = set().union(*(free_vars(x) for x in b.indices))
    i_axes = [f for f in axes[:-1] if f.var.name in a_vars and f.var.name not in b_vars] \
        or [f for f in axes[:-1] if int(getattr(f.extent, "value", 0)) == 1 and f.var.name not in b_vars]
    if not i_axes:  # (a unit row loop that A does not index, a classifier at batch 1: a GEMM of one row)
        return None
    ext = {f.var.name: int(f.extent.value) if isinstance(f.extent, Const) else DYNAMIC_EXTENT for f in axes + rloops}
    k = 1
    for f in rloops:
        k *= ext[f.var.name]
    m, n = ext[i_axes[-1].var.name], ext[j]
    total = 1
    for f in axes:
        total *= ext[f.var.name]
    return GemmNest(final.buffer, i_axes[-1].var.name, j, [f.var.name for f in rloops],
                    [f.var.name for f in axes if f.var.name not in (i_axes[-1].var.name, j)],
                    m, n, k, 2 * total * k, a.dtype.itemsize, a.buffer, b.buffer, ext,
                    dynamic=frozenset(f.var.name for f in axes + rloops if not isinstance(f.extent, Const)))


def _moves_with(b: Load, j: str) -> bool:
    """Whether B's element moves with the column loop ``j``: in its last index (a plain GEMM) or
    in another (``Q @ K^T`` reads ``K[j, k]``: packing B transposes it into the kc x nr panels)."""
    return any(linear_coeff(x, j) not in (0, None) for x in b.indices)


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def schedule_gemm(func: LoopFunc, tensor: str, info: GemmNest, p: dict[str, int], target: CpuTarget,
                  trace: Trace = SILENT) -> LoopFunc:
    """The BLIS loop nest for one contraction (see the module docstring), step by step."""
    func, info = _uniquify(func, tensor, info)
    t = _tile_names(func)
    i, j, kloops = info.i, info.j, info.k_loops
    func = trace(f"decompose {tensor}", decompose_reduction(func, tensor))
    k = kloops[0]
    for other in kloops[1:]:
        func = trace(f"fuse {k}, {other}", fuse(func, k, other, name=f"{k}_{other}"))
        k = f"{k}_{other}"
    m, n, kt = info.m, info.n, info.k
    mr, nr = min(p["mr"], m), min(p["nr"], n)
    kc, mc, nc = min(p["kc"], kt), min(p["mc"], m), min(p["nc"], n)
    nthreads = target.cores if info.flops >= 8 * PARALLEL_MIN_WORK else 1
    group = _group_parallel(func, info.outer, nthreads)
    if group is not None or _inside_parallel(func, info.outer):
        nthreads = 1  # one fork per call: the group loop's iterations (images) go to the threads
    batch_parallel = [b for b in info.batch if info.extents[b] >= nthreads > 1 and b not in info.dynamic]
    axis = None if batch_parallel or nthreads == 1 else _parallel_axis(m, n, mr, nr, nthreads)
    if axis is not None and {i, j} & info.dynamic:  # no share per thread of a size known at the call:
        # the threads take register tiles of each cache block: row tiles where there are a few per
        # thread (one fork per block of columns, not one per row tile: a dynamic conv's 64 channels)
        axis = "ir" if i in info.dynamic or m >= 2 * mr * nthreads else "jr"
    per_m = -(-m // nthreads) if axis == "ip" else m
    per_n = -(-n // nthreads) if axis == "jp" else n
    lanes = target.vector_bytes // info.itemsize
    if target.vector_bytes == 64:
        nr = column_tile(per_n, nr, lanes)
    mc = even_block(per_m, mr, max(mr, min(mc, per_m) // mr * mr))
    nc = even_block(per_n, nr, max(nr, min(nc, per_n) // nr * nr))
    unsplit = {x for x, loop in (("ip", i), ("jp", j)) if loop in info.dynamic}
    if len({i, j, k} & info.dynamic) > 1:  # each remainder copies the nest: no cache blocks of dynamic extents
        unsplit |= {x for x, loop in (("io", i), ("jo", j), ("ko", k)) if loop in info.dynamic}
    for loop, factor, outer, inner in ((i, per_m, "ip", "i1"), (t["i1"], mc, "io", "i2"), (t["i2"], mr, "ir", "ii"),
                                       (j, per_n, "jp", "j0"), (t["j0"], nc, "jo", "j1"), (t["j1"], nr, "jr", "jj"),
                                       (k, kc, "ko", "kk")):
        if outer in unsplit:  # one remainder fewer (each is a copy of the nest): one share, of all of it
            func = on_loops(func, loop, lambda s, o=t[outer], n=t[inner]: For(
                Var(o), const(1), replace(s, var=Var(n), body=subst(s.body, {s.var.name: Var(n)})), span=s.span))
            continue
        step = REMAINDER_ROWS if outer == "ir" and i in info.dynamic else None  # (remainder rows: 4-row tiles)
        func = trace(f"split {loop} by {factor} -> {t[outer]}, {t[inner]}",
                     split(func, loop, factor, t[outer], t[inner], remainder_step=step))
    # ir outside jr: one mr x kc micro-panel of A stays in L1 while the kc x nr micro-panels of B
    # stream past it from L2 (jr inside ir measured 5-10% slower on matmul 1024 and the 3x3 conv)
    nest = [*info.batch, *(t[x] for x in ("ip", "jp", "jo", "ko", "io", "ir", "jr", "kk", "ii", "jj"))]
    func = trace(f"reorder {', '.join(nest)}", reorder(func, nest))
    outer = group or (batch_parallel[0] if batch_parallel else None if axis is None else t[axis])
    if outer is not None:  # before caching: packed buffers then belong to each thread
        func = trace(f"parallel {outer}", parallel(func, outer))
    func = trace(f"cache {info.b} at {t['ko']}", cache(func, info.b, t["ko"]))
    a_at = t["jp"] if _pack_a_once(per_m, kt, n, nc, info.itemsize) else t["io"]
    func = trace(f"cache {info.a} at {a_at}", cache(func, info.a, a_at))
    c_tile = tensor if _direct(func, tensor) else f"{tensor}_acc"
    before = set(func.buffers())
    func = trace(f"cache {c_tile} at {t['jr']}", cache(func, c_tile, t["jr"]))
    tiles = set(func.buffers()) - before
    if set(kloops) & info.dynamic:
        pass  # k blocks counted at the call (the first may be the remainder): C is zeroed first, as written
    elif kt <= kc:  # one k block: each register tile is loaded once, right after C is zeroed
        func = trace(f"init {c_tile} in registers", init_in_registers(func, c_tile, tiles))
    else:  # the first k block's tiles start at zero: no pass (and fork) to zero C first
        func = trace(f"init {c_tile} in the first k block's registers",
                     init_in_first_block(func, c_tile, tiles, t["ko"]))
    try:  # an epilogue reading C back is applied as the (last k block's) tile is stored
        if not set(kloops) & info.dynamic:  # (k blocks counted at the call: C accumulates in memory)
            func = trace(f"epilogue of {c_tile} in its tile stores", store_epilogue(func, c_tile, t["jj"]))
    except TccScheduleError:
        pass
    func, rows = column_rows(func, t["ii"], t["jj"])
    if rows is not None:
        func = trace(f"vectorize {rows} (one-column tiles: their rows are the lanes)", vectorize(func, rows))
    if i in info.dynamic:
        rows = REMAINDER_ROWS if mr % REMAINDER_ROWS == 0 else mr
        func = trace(f"pad remainders of {t['ii']} to {rows} rows", pad_remainders(func, t["ii"], rows))
    if j in info.dynamic and nr <= 2 * lanes:
        func = trace(f"pad remainders of {t['jj']} to {nr} columns", pad_remainders(func, t["jj"], nr, guard=False,
                                                                                         tile=t["jr"]))
    names = loop_names(func.body)
    if t["ii"] in names:
        func = trace(f"unroll {t['ii']}", unroll(func, t["ii"]))
    if t["jj"] in names and nr > 2 * lanes:
        func = _vector_columns(func, t["jj"], lanes, trace)
    elif t["jj"] in names:
        func = trace(f"vectorize {t['jj']}", vectorize(func, t["jj"]))
    return trace("contract", contract(func))


def _vector_columns(func: LoopFunc, jj: str, lanes: int, trace: Trace) -> LoopFunc:
    """A register tile row of more than two vectors as that many vectors, one per unrolled
    iteration: LLVM splits a 64-lane row into zmm registers badly and a 48-lane one worse (both
    spilled the whole tile each k step: 5 GFLOP/s on a 3x3 conv at 7x7 on 512 channels)."""
    jv, jl = fresh(func, f"{jj}_vec"), fresh(func, f"{jj}_lane")
    func = trace(f"split {jj} by {lanes} -> {jv}, {jl}", split(func, jj, lanes, jv, jl))
    func = trace(f"unroll {jv}", unroll(func, jv))
    return trace(f"vectorize {jl}", vectorize(func, jl))


def column_rows(func: LoopFunc, ii: str, jj: str) -> tuple[LoopFunc, str | None]:
    """``func`` with each register tile of one column (``ii`` around a ``jj`` of one iteration:
    the tail of 49 columns in tiles of 16) renamed to vectorise along its rows, and that loop's
    name (None if there is none). Its column as a vector is one lane wide: each k step was ``mr``
    scalar multiply-adds on ``mr`` broadcasts of A; along the rows it is one vector multiply-add
    of a row of packed A (whose ``mr`` values lie side by side) and one broadcast of B."""
    rows, one = fresh(func, f"{ii}_lanes"), fresh(func, f"{jj}_one")
    found = False

    def visit(s: Stmt) -> Stmt | None:
        nonlocal found
        if isinstance(s, For) and s.var.name == ii and isinstance(s.body, For) and s.body.var.name == jj \
                and int(getattr(s.body.extent, "value", 0)) == 1:
            found = True
            return _rename_loops(s, {ii: rows, jj: one})
        return None

    func = replace(func, body=map_stmt(func.body, visit))
    return func, rows if found else None


TILE_LOOPS = ("ip", "i1", "io", "i2", "ir", "ii", "jp", "j0", "jo", "j1", "jr", "jj", "ko", "kk")


def _tile_names(func: LoopFunc) -> dict[str, str]:
    """The tile loops' names, with a suffix when an earlier contraction's nest took them."""
    taken = loop_names(func.body)
    n = 1
    while any((f"{x}{n}" if n > 1 else x) in taken for x in TILE_LOOPS):
        n += 1
    return {x: f"{x}{n}" if n > 1 else x for x in TILE_LOOPS}


def _uniquify(func: LoopFunc, tensor: str, info: GemmNest) -> tuple[LoopFunc, GemmNest]:
    """Rename the nest's loops that share a name with another loop of ``func`` (a patch gather's
    ``j``, an epilogue's ``f``), so that splitting them leaves the other statements alone."""
    nest = next(s for s, _ in nests(func.body, ()) if (c := _contraction(s)) and c.tensor == tensor)
    counts: dict[str, int] = {}
    for f in walk_stmts(func.body):
        if isinstance(f, For):
            counts[f.var.name] = counts.get(f.var.name, 0) + 1
    inside = [f.var.name for f in walk_stmts(nest) if isinstance(f, For)]
    mapping: dict[str, str] = {}
    for name in inside:
        if counts[name] > inside.count(name):
            mapping[name] = fresh(func, f"{name}_{tensor}")
    if not mapping:
        return func, info
    renamed = _rename_loops(nest, mapping)
    func = replace(func, body=map_stmt(func.body, lambda s: renamed if s == nest else None))
    return func, replace(_contraction(renamed), outer=info.outer)


def _rename_loops(s: Stmt, mapping: dict[str, str]) -> Stmt:
    s = subst(s, {old: Var(new) for old, new in mapping.items()})
    return map_stmt(s, lambda n: replace(n, var=Var(mapping[n.var.name]))
                    if isinstance(n, For) and n.var.name in mapping else None)


def _pack_a_once(rows: int, k: int, n: int, nc: int, itemsize: int) -> bool:
    """Pack a thread's rows of A once (at ``jp``) rather than again for each ``nc`` block of
    columns, when there is more than one block and the packed copy is not huge: packing A is a
    transposing scalar copy, and repacking it per block cost ~8% at 1024 and 2048 (each kc x mc
    block of the whole copy is still read from L2 while the column panels of one block run)."""
    return n > nc and rows * k * itemsize <= PACK_A_ONCE_BYTES


def _group_parallel(func: LoopFunc, outer: list[str], nthreads: int) -> str | None:
    """The outermost group loop around a nested contraction (im2col's batch loop) with at least
    one iteration per thread, if it may run in parallel: each thread then gathers, multiplies and
    finishes whole images with its own patch and GEMM buffers (allocated inside the loop), and
    the call forks once instead of once per statement per image."""
    if nthreads < 2 or _inside_parallel(func, outer):
        return None
    for name in outer:
        loop = find_loop(func, name)
        if loop is not None and int(getattr(loop.extent, "value", 0)) >= nthreads:
            try:
                parallel(func, name)
            except TccScheduleError:
                continue
            return name
    return None


def _inside_parallel(func: LoopFunc, outer: list[str]) -> bool:
    return any(getattr(find_loop(func, name), "kind", "") == "parallel" for name in outer)


def _parallel_axis(m: int, n: int, mr: int, nr: int, nthreads: int) -> str:
    """Split the rows (``ip``) unless that pads the register tiles clearly more than the columns
    (``jp``), or B is much wider than A is tall: each thread packs all of the operand whose
    other axis it splits, and a conv GEMM's B (its patches: 7 MiB for a 7x7 layer on a 224x224
    image) is far larger than its A (the weights). Packing A is a scalar transposing copy, about
    ``A_COPY_COST`` times dearer per element than B's vector copy."""
    def waste(extent: int, tile: int) -> float:
        per = -(-extent // nthreads)
        return -(-per // tile) * tile * nthreads / extent - 1

    if m < 2 * mr or n > A_COPY_COST * m:
        return "jp"
    return "ip" if waste(m, mr) <= waste(n, nr) + 0.02 else "jp"


def _direct(func: LoopFunc, tensor: str) -> bool:
    return f"{tensor}_acc" not in func.buffers()


def find_loop(func: LoopFunc, name: str) -> For | None:
    return next((f for f in walk_stmts(func.body) if isinstance(f, For) and f.var.name == name), None)
