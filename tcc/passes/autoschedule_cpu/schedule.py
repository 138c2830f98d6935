"""The CPU auto-scheduler: the schedule every op gets unless its user wrote one.

* Contractions (a sum of products of two tensors: matmul, batched matmul, convolutions) get the
  BLIS structure: the reduction is decomposed into updates of the result, the loops are tiled
  for the caches read from the host (L1 holds an ``mr x kc`` micro-panel of A while the
  ``kc x nr`` micro-panels of B stream past it from L2), B and A are packed, and an ``mr x nr`` register tile of C is
  accumulated with fused multiply-adds (ii unrolled, jj one vector); each thread takes its own
  rows of C.
* Row-wise chains (softmax, layernorm) are fused into one loop per row (compute_at), so the
  intermediates fold into per-thread rows; the rows run in parallel.
* Every other loop nest gets its unit-stride innermost loop vectorised (reductions with vector
  partial sums) and its outermost loop parallelised when there is enough work.

Tile sizes come from :func:`gemm_params`; the tuner (tcc.tune) searches around them.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

from tcc.errors import TccScheduleError
from tcc.ir.expr import Binary, Cast, Expr, Load, Select, Var, free_vars, walk
from tcc.ir.loops import Allocate, For, LoopFunc, Seq, Stmt, Store, map_stmt, stmt_exprs, walk_stmts
from tcc.passes.autoschedule_cpu.epilogue import store_epilogue
from tcc.passes.autoschedule_cpu.pack_gather import gather_into_packs
from tcc.passes.autoschedule_cpu.pixels import merge_pixels
from tcc.passes.autoschedule_cpu.tile_init import init_in_registers
from tcc.passes.autoschedule_cpu.unflatten import divmod_width, unflatten
from tcc.passes.loops.cache import cache
from tcc.passes.loops.compute_at import compute_at
from tcc.passes.loops.fuse import fuse
from tcc.passes.loops.loopnest import fresh, linear_coeff, loads, loop_names, on_loops, stores, subst
from tcc.passes.loops.parallel import parallel
from tcc.passes.loops.reduction import decompose_reduction
from tcc.passes.loops.reorder import reorder
from tcc.passes.loops.schedule import contract
from tcc.passes.loops.split import split
from tcc.passes.loops.unroll import unroll
from tcc.passes.loops.vectorize import vectorize

PARALLEL_MIN_WORK = 1 << 15  # iterations below which a fork costs more than it saves
GEMM_MIN_FLOPS = 1 << 16
PACK_A_ONCE_BYTES = 32 << 20
A_COPY_COST = 3
ONE_K_BLOCK = 4  # reductions up to this many k blocks run as one (a 3x3 conv on 64 channels, matmul 1024)


@functools.cache
def host_caches() -> dict[int, int]:
    """Data cache sizes in bytes by level, from /sys (defaults where it is unreadable)."""
    return read_caches("/sys/devices/system/cpu/cpu0/cache")


def read_caches(root: str) -> dict[int, int]:
    """Data cache sizes from a sysfs cache directory (``index*/{type,level,size}``)."""
    sizes = {1: 32 << 10, 2: 1 << 20, 3: 8 << 20}
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))  # not "uevent"
    except OSError:
        return sizes
    for entry in entries:
        path = os.path.join(root, entry)
        try:
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(path, "level")) as f:
                level = int(f.read())
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes[level] = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
    return sizes


def threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def host_vector_bytes() -> int:
    """The width of the host's vector registers in bytes: 64 with AVX-512F (32 registers), else 32
    (AVX2: 16 registers), from /proc/cpuinfo (32 where it is unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return 32
    return 64 if "avx512f" in flags else 32


def gemm_params(m: int, n: int, k: int, itemsize: int = 4) -> dict[str, int]:
    """Register tile mr x nr (nr two vectors of f32 wide, three quarters of the vector registers
    accumulate: 12 x 32 of the 32 zmm registers with AVX-512, 6 x 16 of the 16 ymm registers with
    AVX2, where an AVX-512 tile spilled: a 3x3 conv on 512 channels at 7x7 ran 3x slower), kc
    from L1 (nr lanes x 4 bytes x kc <= L1; up to 4 such blocks run as one: matmul 1000 and 1024
    ~5% faster), mc x kc block of A in an eighth of L2 and kc x nc panel of B in a quarter
    (measured on the 2 MiB-L2 development host: A in a quarter was 20-25% slower at 2048; B in an
    eighth 7% slower on a 3x3 conv, in a half 4% slower)."""
    caches = host_caches()
    wide = host_vector_bytes() == 64
    nr = (32 if wide else 16) if itemsize == 4 else (16 if wide else 8)
    mr = _register_rows(m, (12, 8) if wide else (6, 4))
    kc = max(16, min(256, caches[1] // (nr * itemsize)))
    if k <= ONE_K_BLOCK * kc:  # one k block: no pass to zero C, no reloads of C, the epilogue in the tile store
        kc = k
    mc = max(mr, (caches[2] // 8 // (kc * itemsize)) // mr * mr)
    nc = max(nr, (caches[2] // 4 // (kc * itemsize)) // nr * nr)
    return {"mr": mr, "nr": nr, "kc": kc, "mc": mc, "nc": nc}


def _register_rows(m: int, choices: tuple[int, int]) -> int:
    """The full tile's rows (``choices[0]``: 12 with AVX-512), or the smaller choice where the
    full one pads a thread's share of the rows by more than 2% and the smaller pads them less:
    64 output channels are 8 tiles of 8 rather than 5 of 12 and a 4-row tail, and 256 rows split
    over 2 threads become 16 tiles each, which also lets the threads split the rows (see
    _parallel_axis) instead of each packing all of A."""
    rows = -(-m // threads())
    full, small = choices

    def waste(mr: int) -> float:
        return -(-rows // mr) * mr / rows - 1

    return small if waste(full) > 0.02 and waste(small) < waste(full) else full


def autoschedule(func: LoopFunc, params: dict[str, dict[str, int]] | None = None) -> LoopFunc:
    """The default CPU schedule; ``params`` (by result tensor) override the contraction tiles."""
    func = merge_contraction_pixels(func)
    for tensor, info in contractions(func).items():
        if info["flops"] >= GEMM_MIN_FLOPS:
            chosen = (params or {}).get(tensor) or gemm_params(info["m"], info["n"], info["k"], info["itemsize"])
            func = schedule_gemm(func, tensor, info, chosen)
    func = fuse_rows(gather_into_packs(func))
    return vectorize_and_parallelize(unflatten_gathers(func))


# ---------------------------------------------------------------- contractions

def contractions(func: LoopFunc) -> dict[str, dict]:
    """Statements ``C[...] = g(sum[k...](A[...] * B[...]))`` with their i, j, k loops.

    They are found at the top level and inside group loops (the batch loop im2col and fusion put
    around a patch gather, a GEMM and its epilogue); ``outer`` names the loops around the nest.
    """
    found = {}
    for item, outer in _nests(func.body, ()):
        info = _contraction(item)
        if info is not None:
            found[info["tensor"]] = {**info, "outer": list(outer)}
    return found


def merge_contraction_pixels(func: LoopFunc) -> LoopFunc:
    """Merge the last two output loops ``y, j`` of each contraction into one pixel loop where every
    access allows it (a 1x1 convolution: a GEMM over H*W columns, not W; see passes/autoschedule_cpu/pixels.py)."""
    for item, _ in _nests(func.body, ()):
        info = _contraction(item)
        names = _output_loops(item)
        if info is not None and len(names) >= 3 and names[-1] == info["j"] and names[-2] in info["batch"]:
            func = merge_pixels(func, item, names[-2], names[-1])
    return func


def _output_loops(nest: Stmt) -> list[str]:
    names = []
    while isinstance(nest, For):
        names.append(nest.var.name)
        nest = nest.body
    return names


def _nests(body: Stmt, outer: tuple[str, ...]) -> list[tuple[Stmt, tuple[str, ...]]]:
    """Each statement of ``body`` with the loops around it, descending into group loops."""
    out = []
    for item in _items(body):
        out.append((item, outer))
        if _is_group(item):
            out += _nests(item.body, (*outer, item.var.name))  # type: ignore[attr-defined]
    return out


def _is_group(s: Stmt) -> bool:
    """A loop whose body is several statements (with buffers of its own): a fusion group's loop,
    or the outer of the group's loops (``n`` around ``y_block`` of im2col's row blocks)."""
    if not isinstance(s, For):
        return False
    body, allocs = s.body, 0
    while isinstance(body, Allocate):
        body, allocs = body.body, allocs + 1
    if isinstance(body, For) and not allocs:
        return _is_group(body)
    return isinstance(body, Seq) and (allocs > 0 or len(body.stmts) > 1) and not _is_reduction_body(s.body)


def _is_reduction_body(s: Stmt) -> bool:
    return isinstance(s, Allocate) and isinstance(s.body, Seq) and len(s.body.stmts) == 3 \
        and s.buffer.scope == "local" and s.buffer.size == 1


def _items(body: Stmt) -> list[Stmt]:
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
    if not (rloops and isinstance(r, Store) and r.buffer == s.buffer.name and isinstance(final, Store)):
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
    i_axes = [f for f in axes[:-1] if f.var.name in a_vars and f.var.name not in b_vars]
    if not i_axes:
        return None
    ext = {f.var.name: int(f.extent.value) for f in axes + rloops}  # type: ignore[attr-defined]
    k = 1
    for f in rloops:
        k *= ext[f.var.name]
    m, n = ext[i_axes[-1].var.name], ext[j]
    total = 1
    for f in axes:
        total *= ext[f.var.name]
    return {"tensor": final.buffer, "i": i_axes[-1].var.name, "j": j, "k_loops": [f.var.name for f in rloops],
            "batch": [f.var.name for f in axes if f.var.name not in (i_axes[-1].var.name, j)],
            "m": m, "n": n, "k": k, "flops": 2 * total * k, "itemsize": a.dtype.itemsize,
            "a": a.buffer, "b": b.buffer, "extents": ext}


def _moves_with(b: Load, j: str) -> bool:
    """Whether B's element moves with the column loop ``j``: in its last index (a plain GEMM) or
    in another (``Q @ K^T`` reads ``K[j, k]``: packing B transposes it into the kc x nr panels)."""
    return any(linear_coeff(x, j) not in (0, None) for x in b.indices)


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def schedule_gemm(func: LoopFunc, tensor: str, info: dict, p: dict[str, int]) -> LoopFunc:
    """The BLIS loop nest for one contraction (see the module docstring)."""
    func, info = _uniquify(func, tensor, info)
    t = _tile_names(func)
    i, j, kloops = info["i"], info["j"], info["k_loops"]
    func = decompose_reduction(func, tensor)
    k = kloops[0]
    for other in kloops[1:]:
        func = fuse(func, k, other, name=f"{k}_{other}")
        k = f"{k}_{other}"
    m, n, kt = info["m"], info["n"], info["k"]
    mr, nr = min(p["mr"], m), min(p["nr"], n)
    kc, mc, nc = min(p["kc"], kt), min(p["mc"], m), min(p["nc"], n)
    nthreads = threads() if info["flops"] >= 8 * PARALLEL_MIN_WORK else 1
    group = _group_parallel(func, info["outer"], nthreads)
    if group is not None or _inside_parallel(func, info["outer"]):
        nthreads = 1  # one fork per call: the group loop's iterations (images) go to the threads
    batch_parallel = [b for b in info["batch"] if info["extents"][b] >= nthreads > 1]
    axis = None if batch_parallel or nthreads == 1 else _parallel_axis(m, n, mr, nr, nthreads)
    per_m = -(-m // nthreads) if axis == "ip" else m
    per_n = -(-n // nthreads) if axis == "jp" else n
    mc = max(mr, min(mc, per_m) // mr * mr)
    nc = max(nr, min(nc, per_n) // nr * nr)
    func = split(func, i, per_m, t["ip"], t["i1"])
    func = split(func, t["i1"], mc, t["io"], t["i2"])
    func = split(func, t["i2"], mr, t["ir"], t["ii"])
    func = split(func, j, per_n, t["jp"], t["j0"])
    func = split(func, t["j0"], nc, t["jo"], t["j1"])
    func = split(func, t["j1"], nr, t["jr"], t["jj"])
    func = split(func, k, kc, t["ko"], t["kk"])
    # ir outside jr: one mr x kc micro-panel of A stays in L1 while the kc x nr micro-panels of B
    # stream past it from L2 (jr inside ir measured 5-10% slower on matmul 1024 and the 3x3 conv)
    nest = ("ip", "jp", "jo", "ko", "io", "ir", "jr", "kk", "ii", "jj")
    func = reorder(func, [*info["batch"], *(t[x] for x in nest)])
    outer = group or (batch_parallel[0] if batch_parallel else None if axis is None else t[axis])
    if outer is not None:
        func = parallel(func, outer)  # before caching: packed buffers then belong to each thread
    func = cache(func, info["b"], t["ko"])
    func = cache(func, info["a"], t["jp"] if _pack_a_once(per_m, kt, n, nc, info["itemsize"]) else t["io"])
    target = tensor if _direct(func, tensor) else f"{tensor}_acc"
    func = cache(func, target, t["jr"])
    if kt <= kc:  # one k block: each register tile is loaded once, right after C is zeroed
        func = init_in_registers(func, target)
    try:  # an epilogue reading C back is applied as the (last k block's) tile is stored
        func = store_epilogue(func, target)
    except TccScheduleError:
        pass
    func = unroll(func, t["ii"])
    func = vectorize(func, t["jj"])
    return contract(func)


TILE_LOOPS = ("ip", "i1", "io", "i2", "ir", "ii", "jp", "j0", "jo", "j1", "jr", "jj", "ko", "kk")


def _tile_names(func: LoopFunc) -> dict[str, str]:
    """The tile loops' names, with a suffix when an earlier contraction's nest took them."""
    taken = loop_names(func.body)
    n = 1
    while any((f"{x}{n}" if n > 1 else x) in taken for x in TILE_LOOPS):
        n += 1
    return {x: f"{x}{n}" if n > 1 else x for x in TILE_LOOPS}


def _uniquify(func: LoopFunc, tensor: str, info: dict) -> tuple[LoopFunc, dict]:
    """Rename the nest's loops that share a name with another loop of ``func`` (a patch gather's
    ``j``, an epilogue's ``f``), so that splitting them leaves the other statements alone."""
    nest = next(s for s, _ in _nests(func.body, ()) if (c := _contraction(s)) and c["tensor"] == tensor)
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
    return func, _contraction(renamed) | {"outer": info["outer"]}


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
        loop = _find_loop(func, name)
        if loop is not None and int(getattr(loop.extent, "value", 0)) >= nthreads:
            try:
                parallel(func, name)
            except TccScheduleError:
                continue
            return name
    return None


def _inside_parallel(func: LoopFunc, outer: list[str]) -> bool:
    return any(getattr(_find_loop(func, name), "kind", "") == "parallel" for name in outer)


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


# ---------------------------------------------------------------- rows and elementwise

def fuse_rows(func: LoopFunc) -> LoopFunc:
    """compute_at each intermediate into the outer loop of its first consumer, where legal."""
    temps = [b.name for b in func.buffers().values() if b.scope == "global"
             and b.name not in {p.name for p in func.params}]
    for t in temps:
        items = _items(func.body)
        producer = next((s for s in items if isinstance(s, For) and any(st.buffer == t for st in stores(s))), None)
        if producer is None or producer.kind != "serial":
            continue
        consumer = next((s for s in items[items.index(producer) + 1:] if t in {ld.buffer for ld in loads(s)}), None)
        if not (isinstance(consumer, For) and consumer.var.name == producer.var.name):
            continue  # only into the consumer's outer loop: deeper, it would be recomputed per outer iteration
        try:
            func = compute_at(func, t, producer.var.name)
        except TccScheduleError:
            continue
    return func


def unflatten_gathers(func: LoopFunc) -> LoopFunc:
    """Innermost loops over a flattened index (im2col's patch gather) become row x column loops,
    so that the column loop vectorises with unit-stride (masked) loads."""
    for f in list(walk_stmts(func.body)):
        if not (isinstance(f, For) and f.kind == "serial") or any(isinstance(n, For) for n in walk_stmts(f.body)):
            continue
        width = divmod_width(f)
        if width is not None and 1 < width < int(getattr(f.extent, "value", 0)):
            func = unflatten(func, f.var.name, width)
    return func


def vectorize_and_parallelize(func: LoopFunc) -> LoopFunc:
    lanes = 32
    for name in _vector_candidates(func):
        try:
            func = vectorize(func, name, lanes)
        except TccScheduleError:
            continue
    func = unroll_masked_rows(func)
    if threads() > 1:
        func = _parallelize_items(func, func.body)
    return func


MASKED_ROW_UNROLL = 4


def unroll_masked_rows(func: LoopFunc) -> LoopFunc:
    """Unroll the few vectors of a row whose lanes read through a pad (``x_o`` of a depthwise
    conv: 3 vectors of 32 and a tail): each unrolled copy's padding masks are constants, and
    LLVM, left to itself, kept the loop once the body held an epilogue and computed the masks
    with 64-bit vector compares per vector (the fused depthwise layer ran 1.6x its bare one)."""
    for f in list(walk_stmts(func.body)):
        if isinstance(f, For) and f.kind == "serial" and isinstance(f.body, For) and f.body.kind == "vector" \
                and 1 < int(getattr(f.extent, "value", 0)) <= MASKED_ROW_UNROLL \
                and any(isinstance(n, Select) for st in walk_stmts(f.body) for e in stmt_exprs(st) for n in walk(e)):
            func = on_loops(func, f.var.name,
                            lambda s, body=f.body: replace(s, kind="unroll") if s.body == body else None)
    return func


def _parallelize_items(func: LoopFunc, body: Stmt) -> LoopFunc:
    """Parallelise each statement's outer loop; a group loop that cannot run in parallel (it holds
    a parallel GEMM) gets its own statements parallelised instead, one fork per iteration."""
    for item in _items(body):
        if not (isinstance(item, For) and item.kind == "serial"):
            continue
        if not _has_parallel(item) and _work(item) >= PARALLEL_MIN_WORK:
            try:
                func = _parallel_widened(func, item)
                continue
            except TccScheduleError:
                pass
        group = _find_loop(func, item.var.name) if _is_group(item) else None
        if group is not None:  # (None: an earlier step renamed it, fusing it with another loop)
            func = _parallelize_items(func, group.body)
    return func


def _parallel_widened(func: LoopFunc, item: For) -> LoopFunc:
    """``item``'s loop in parallel; with fewer iterations than the threads take chunks (a batch of
    one) it is first fused with the loop right inside it (``n`` x ``c`` of a depthwise conv)."""
    if int(getattr(item.extent, "value", 0)) < 4 * threads() and isinstance(item.body, For):
        name = fresh(func, f"{item.var.name}_{item.body.var.name}")
        try:
            return parallel(fuse(func, item.var.name, item.body.var.name, name=name), name)
        except TccScheduleError:
            pass
    return parallel(func, item.var.name)


def _has_parallel(s: Stmt) -> bool:
    return any(isinstance(n, For) and n.kind == "parallel" for n in walk_stmts(s))


def _find_loop(func: LoopFunc, name: str) -> For | None:
    return next((f for f in walk_stmts(func.body) if isinstance(f, For) and f.var.name == name), None)


def _vector_candidates(func: LoopFunc) -> list[str]:
    """Loops whose variable walks the last dim of what they store (or, innermost, of what they load)."""
    picked: list[str] = []
    for f in walk_stmts(func.body):
        if not isinstance(f, For) or f.kind != "serial":
            continue
        if int(getattr(f.extent, "value", 0)) < 4 or f.var.name in picked:
            continue
        inner_loops = [n for n in walk_stmts(f.body) if isinstance(n, For)]
        if any(n.kind == "vector" for n in inner_loops):
            continue
        if _unit_store(f) or (not inner_loops and _unit_load(f)):
            picked.append(f.var.name)
    return [n for n in picked if not any(_inside(func, n, other) for other in picked if other != n)]


def _unit_store(f: For) -> bool:
    return any(st.indices and linear_coeff(st.indices[-1], f.var.name) == 1 for st in stores(f.body))


def _unit_load(f: For) -> bool:
    return any(ld.indices and linear_coeff(ld.indices[-1], f.var.name) == 1 for ld in loads(f.body))


def _inside(func: LoopFunc, inner: str, outer: str) -> bool:
    return any(isinstance(n, For) and n.var.name == outer and inner in loop_names(n.body)
               for n in walk_stmts(func.body))


def _work(f: For) -> int:
    total = 0
    for n in walk_stmts(f):
        if isinstance(n, Store):
            total += 1
    size = 1
    s: Stmt = f
    while isinstance(s, For):
        size *= int(getattr(s.extent, "value", 1))
        s = s.body
    inner = sum(int(getattr(n.extent, "value", 1)) for n in walk_stmts(s) if isinstance(n, For)) or 1
    return size * inner * total

