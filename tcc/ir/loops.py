"""The loop IR: explicit loop nests over buffers, the input of every code generator.

Loops carry a *kind* that passes set and code generators obey (serial, parallel, vector,
unroll, block/thread binding for CUDA); buffers carry a *scope* (global, shared, local).
Loads and stores index buffers by multi-dimensional, row-major indices; codegen flattens.

A ``vector`` loop inside a CUDA thread is one wide memory access: its body is ``let``s and one
store whose flat offset steps by one element per iteration, the first at a multiple of the
loop's extent (the schedule's promise), 4, 8 or 16 bytes in all; the code generator computes
the lanes' values, then stores them at once (two 16-bit floats converted by one instruction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from tcc.dtypes import DType
from tcc.errors import Span, TccError
from tcc.ir.expr import Binary, Expr, Load, Read, Reduce, Var, format_expr, walk

LOOP_KINDS = ("serial", "parallel", "vector", "unroll", "block.x", "block.y", "block.z",
              "thread.x", "thread.y", "thread.z")
SCOPES = ("global", "shared", "local")
DETERMINISTIC = "deterministic"  # LoopFunc.attrs: accumulations (+=) add in one fixed order on every run
# LoopFunc.attrs: tcc.compile's staged_stores= (one of STORE_MODES): which tensor-core GEMM results
# the CUDA schedule sends through shared memory (auto: 16-bit floats; all: f32 too; off: none)
STAGED_STORES = "staged stores"
STORE_MODES = ("auto", "off", "all")
# LoopFunc.attrs: the call checks indices read from data first (a guard op counts those out of
# range); on CUDA every kernel then takes the device count as parameter GUARD_PARAM (i64[1]) and
# returns at once, writing nothing, when it is not zero
GUARDED = "guarded"
GUARD_PARAM = "tcc_guard"
MATRIX_STREAM = "matrix"  # For annotation: the nest's MatrixStream form, for schedules with matrix units
MATRIX_SWEEP = "matrix sweep"  # For annotation: the MatrixSweep form of the sweep whose first nest it marks
SWEPT_BY_MATRIX = "swept by matrix"  # For annotation: a later nest of that sweep (its form: the first nest's)
# Annotations of a CUDA kernel (its block loop). ALIGNED: it assumes 16-byte aligned pointers, and
# the kernel after it (the same work, assuming nothing) is its fallback, run for a misaligned call.
# REQUIRES: a condition of the dynamic shape symbols, checked at the launch and assumed by the
# compiler: the kernel runs only for calls where it holds (an aligned one's fallback runs instead).
# A schedule gives the kernels of alternatives (a size's variants) disjoint conditions that cover
# every call, so that exactly one runs.
ALIGNED = "aligned"
REQUIRES = "requires"
# For annotation (a CUDA kernel): the blocks a multiprocessor is to hold at once, which the schedule
# sized its grid by; the compiler keeps each thread's registers within that (__launch_bounds__)
MIN_BLOCKS = "min_blocks"


@dataclass(frozen=True)
class Buffer:
    """A tensor. ``swizzle=128`` (shared buffers, for the warpgroup matrix units) lays the last
    dimension out in atoms of 128 bytes, atom-major over the rows of the second-to-last one, and
    within each row of an atom exchanges 16-byte chunk ``c`` with ``c ^ (row % 8)``: the layout
    ``wgmma`` descriptors read without bank conflicts. Indices stay logical."""

    name: str
    dtype: DType
    shape: tuple[int, ...]  # an expression of the dynamic shape symbols where a dim depends on them
    scope: str = "global"
    swizzle: int = 0

    @property
    def size(self) -> int:
        """Elements; only for a buffer of constant dims (see :attr:`static`)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def static(self) -> bool:
        """Whether every dim is a constant (not a dynamic shape symbol's expression)."""
        return all(isinstance(d, int) for d in self.shape)


@dataclass(frozen=True)
class Stmt:
    def children(self) -> tuple[Stmt, ...]:
        return ()


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    extent: Expr
    body: Stmt
    kind: str = "serial"
    annotations: tuple[tuple[str, object], ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]

    def children(self) -> tuple[Stmt, ...]:
        return self.stmts


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[indices] = value``. With ``accumulate`` (a ``+=`` statement, a scatter) the value
    is ``buffer[indices] + addend`` and other iterations of the nest may hit the same element:
    schedules keep such loops serial, or make the store an atomic add of the addend."""

    buffer: str
    indices: tuple[Expr, ...]
    value: Expr
    span: Span | None = field(default=None, compare=False, repr=False)
    accumulate: bool = False

    @property
    def addend(self) -> Expr:
        """What an accumulating store adds (its value is ``buffer[indices] + addend``)."""
        return self.value.b  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Allocate(Stmt):
    """``buffer`` for the statements of ``body``. A shared buffer may take the memory of the
    shared buffers named in ``reuses`` (allocated around it), which the schedule has finished
    with, behind a barrier: a GEMM's result tile staged where its operand tiles were."""

    buffer: Buffer
    body: Stmt
    reuses: tuple[str, ...] = ()

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    otherwise: Stmt | None = None

    def children(self) -> tuple[Stmt, ...]:
        return (self.then,) if self.otherwise is None else (self.then, self.otherwise)


@dataclass(frozen=True)
class Let(Stmt):
    var: Var
    value: Expr
    body: Stmt

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Barrier(Stmt):
    """Block-wide barrier (``__syncthreads()`` on CUDA)."""


@dataclass(frozen=True)
class BlockScan(Stmt):
    """Block-wide exclusive scan: each thread's local ``buffer[0]`` becomes ``op`` over the values
    the block's earlier threads hold there (``identity`` for the first) and ``buffer[1]`` ``op``
    over all of them. Every thread of the block reaches it, as a barrier. How the GPU combines a
    prefix scan's chunks in parallel (:mod:`tcc.passes.autoschedule_cuda.scan`)."""

    buffer: str
    op: str  # add, mul, max or min
    identity: Expr


class BindingStmt(Stmt):
    """A statement that binds variables of its own for its expressions and nested stores, and
    prints and lists them itself: the matrix statements of :mod:`tcc.ir.matrix_loops` (kept there so
    that this module stays the core IR's). ``half_operands``: the element references the verifier
    requires to be 16-bit rows of ``depth`` columns."""

    depth: int

    @property
    def bound(self) -> set[str]:
        raise NotImplementedError

    def exprs(self) -> tuple[Expr, ...]:
        raise NotImplementedError

    def half_operands(self) -> tuple[Load, ...]:
        raise NotImplementedError

    def format_lines(self, pad: str, depth: int, out: list[str], format_stmt: Callable[[Stmt, int, list[str]], None]
                     ) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------- GPU data movement and matrix units
# Warp-level statements: all 32 lanes of a warp execute each one together (no lane may be branched
# around it). Operands are element references: a ``Load`` names the first element a lane supplies
# or receives; a fragment is that many consecutive 32-bit registers of a local buffer.

@dataclass(frozen=True)
class AsyncCopy(Stmt):
    """``cp.async``: ``nbytes`` from global ``src`` to shared ``dst``, bypassing registers; zeros
    instead where ``valid`` is false (edges of the problem), so no lane needs another path."""

    dst: Load
    src: Load
    nbytes: int
    valid: Expr | None = None


@dataclass(frozen=True)
class AsyncCommit(Stmt):
    """Close the group of the ``AsyncCopy`` statements this thread issued since the last commit."""


@dataclass(frozen=True)
class AsyncWait(Stmt):
    """Wait until at most ``pending`` of this thread's committed copy groups are still in flight."""

    pending: int


@dataclass(frozen=True)
class MatrixLoad(Stmt):
    """``ldmatrix``: ``count`` 8x8 tiles of 16-bit values from shared memory into the warp's
    fragment registers ``dst`` (``count`` per lane); each lane gives the row address ``src`` of
    row ``lane % 8`` of tile ``lane / 8``. ``trans`` transposes each tile on the way."""

    dst: Load
    src: Load
    count: int
    trans: bool = False


@dataclass(frozen=True)
class Mma(Stmt):
    """``mma.sync``: the warp's ``m x n`` f32 accumulator fragment ``acc`` (4 registers a lane) +=
    fragments ``a`` (``m x k``, row) times ``b`` (``k x n``, col), of operand type ``kind``
    (f16, bf16, or tf32 from f32 registers)."""

    shape: tuple[int, int, int]
    kind: str
    acc: Load
    a: Load
    b: Load


@dataclass(frozen=True)
class ProxyFence(Stmt):
    """``fence.proxy.async.shared::cta``: this thread's earlier writes to shared memory become
    visible to the asynchronous units (the warpgroup matrix units) that read it after a barrier."""


@dataclass(frozen=True)
class WarpgroupMma(Stmt):
    """``wgmma.mma_async``: the 4 warps of a warpgroup (128 lanes) add the product of a ``m x k``
    tile of shared ``a`` and a ``k x n`` tile of shared ``b`` (both 128-byte swizzled, named by
    their first element) to the f32 accumulator fragment ``acc`` (``n / 2`` registers a lane).
    ``trans_a`` / ``trans_b``: the tile is stored with M (N) contiguous rather than K. It runs
    asynchronously: see ``WarpgroupSync``."""

    shape: tuple[int, int, int]
    kind: str
    acc: Load
    a: Load
    b: Load
    trans_a: bool = False
    trans_b: bool = False


@dataclass(frozen=True)
class WarpgroupSync(Stmt):
    """Ordering of ``WarpgroupMma``: ``fence`` before the first one that reads accumulators other
    statements wrote; ``commit`` closes the group of those issued so far; ``wait`` blocks until at
    most ``pending`` groups are in flight (their accumulators and shared tiles are then free)."""

    op: str  # fence, commit or wait
    pending: int = 0


@dataclass
class LoopFunc:
    """A kernel: parameters (buffers for tensors, vars for scalars) and a body."""

    name: str
    params: list[Buffer | Var]
    body: Stmt
    attrs: dict[str, object] = field(default_factory=dict)

    def buffers(self) -> dict[str, Buffer]:
        out = {p.name: p for p in self.params if isinstance(p, Buffer)}
        for s in walk_stmts(self.body):
            if isinstance(s, Allocate):
                out[s.buffer.name] = s.buffer
        return out


SEQUENTIAL = ("sequential", True)  # the annotation of a recurrence's loop: its iterations run in order


def is_sequential(s: Stmt) -> bool:
    """Whether ``s`` is a loop whose iterations must run in ascending order (a recurrence reads
    what earlier iterations stored): never parallel, vector, reordered or unrolled across."""
    return isinstance(s, For) and SEQUENTIAL in s.annotations


def holds_sequential(s: Stmt) -> bool:
    """Whether ``s`` is or encloses a sequential loop."""
    return any(is_sequential(n) for n in walk_stmts(s))


def seq(*stmts: Stmt) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Every statement of ``s``, parents first, children in order. An explicit stack: nested
    generators passed each statement up through every level above it (schedules walk often)."""
    stack = [s]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions a statement holds directly (not those of nested statements)."""
    if isinstance(s, For):
        return (s.extent,)
    if isinstance(s, Store):
        return (*s.indices, s.value)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Let):
        return (s.value,)
    if isinstance(s, AsyncCopy):
        return (s.dst, s.src) if s.valid is None else (s.dst, s.src, s.valid)
    if isinstance(s, MatrixLoad):
        return (s.dst, s.src)
    if isinstance(s, (Mma, WarpgroupMma)):
        return (s.acc, s.a, s.b)
    if isinstance(s, BlockScan):
        return (s.identity,)
    if isinstance(s, BindingStmt):
        return s.exprs()
    return ()


def map_stmt(s: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Rebuild ``s`` bottom-up; ``fn`` returns a replacement or None to keep a node. A node whose
    children all came back unchanged is kept as it is (schedules map whole functions to change
    one nest: rebuilding every node cost a convolution's cold compile ~4 ms)."""
    if isinstance(s, For | Allocate | Let):
        body = map_stmt(s.body, fn)
        node: Stmt = s if body is s.body else replace(s, body=body)
    elif isinstance(s, Seq):
        stmts = tuple(map_stmt(c, fn) for c in s.stmts)
        kept = all(n is o for n, o in zip(stmts, s.stmts)) and not any(isinstance(n, Seq) for n in stmts)
        node = s if kept and len(stmts) > 1 else seq(*stmts)
    elif isinstance(s, If):
        then = map_stmt(s.then, fn)
        otherwise = None if s.otherwise is None else map_stmt(s.otherwise, fn)
        node = s if then is s.then and otherwise is s.otherwise else replace(s, then=then, otherwise=otherwise)
    else:
        node = s
    out = fn(node)
    return node if out is None else out


# ---------------------------------------------------------------- printing

def format_func(f: LoopFunc) -> str:
    params = []
    for p in f.params:
        if isinstance(p, Buffer):
            params.append(f"{p.name}: {p.dtype}[{', '.join(map(str, p.shape))}]")
        else:
            params.append(f"{p.name}: {p.dtype}")
    lines = [f"func {f.name}({', '.join(params)}) {{"]
    sized = dict(f.attrs.get("streamed_from", ()))  # type: ignore[arg-type]  # (dynamic sizes: by the call's)
    always = [n for n in f.attrs.get("streamed", ()) if n not in sized]  # type: ignore[attr-defined]
    if always:  # results stored around the cache (non-temporal), the schedule's choice
        lines.append(f"    # streamed: {', '.join(always)}")
    for name, nbytes in sized.items():
        lines.append(f"    # streamed: {name} when at least {nbytes} bytes")
    _format_stmt(f.body, 1, lines)
    lines.append("}")
    prepare = f.attrs.get("prepare")
    if isinstance(prepare, LoopFunc):  # work on constant parameters, hoisted out of the kernel
        lines += ["# run once per set of constant parameters, before the kernel:", format_func(prepare)]
    return "\n".join(lines)


def _format_stmt(s: Stmt, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    if isinstance(s, For):
        kind = "" if s.kind == "serial" else f"  # {s.kind}"
        notes = "".join(f" {k}={v}" for k, v in s.annotations)
        out.append(f"{pad}for {s.var.name} in 0..{format_expr(s.extent)}:{kind}{notes}")
        _format_stmt(s.body, depth + 1, out)
    elif isinstance(s, Seq):
        for c in s.stmts:
            _format_stmt(c, depth, out)
    elif isinstance(s, Store):
        idx = ", ".join(format_expr(i) for i in s.indices)
        note = "  # accumulate" if s.accumulate else ""
        out.append(f"{pad}{s.buffer}[{idx}] = {format_expr(s.value)}{note}")
    elif isinstance(s, Allocate):
        b = s.buffer
        swizzle = f" swizzle={b.swizzle}B" if b.swizzle else ""
        over = f" over {', '.join(s.reuses)}" if s.reuses else ""
        out.append(f"{pad}allocate {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}] in {b.scope}{swizzle}{over}")
        _format_stmt(s.body, depth, out)
    elif isinstance(s, If):
        out.append(f"{pad}if {format_expr(s.cond)}:")
        _format_stmt(s.then, depth + 1, out)
        if s.otherwise is not None:
            out.append(f"{pad}else:")
            _format_stmt(s.otherwise, depth + 1, out)
    elif isinstance(s, Let):
        out.append(f"{pad}let {s.var.name}: {s.var.dtype} = {format_expr(s.value)}")
        _format_stmt(s.body, depth, out)
    elif isinstance(s, Barrier):
        out.append(f"{pad}barrier")
    elif isinstance(s, BlockScan):
        out.append(f"{pad}block_scan {s.buffer} ({s.op}, from {format_expr(s.identity)})")
    elif isinstance(s, BindingStmt):
        s.format_lines(pad, depth, out, _format_stmt)
    elif isinstance(s, AsyncCopy):
        when = "" if s.valid is None else f" if {format_expr(s.valid)} else zeros"
        out.append(f"{pad}cp.async {format_expr(s.dst)} <- {format_expr(s.src)} ({s.nbytes} bytes){when}")
    elif isinstance(s, AsyncCommit):
        out.append(f"{pad}cp.async.commit_group")
    elif isinstance(s, AsyncWait):
        out.append(f"{pad}cp.async.wait_group {s.pending}")
    elif isinstance(s, MatrixLoad):
        trans = ".trans" if s.trans else ""
        out.append(f"{pad}ldmatrix.x{s.count}{trans} {format_expr(s.dst)} <- {format_expr(s.src)}")
    elif isinstance(s, Mma):
        m, n, k = s.shape
        out.append(f"{pad}mma.sync.m{m}n{n}k{k}.{s.kind} {format_expr(s.acc)} += "
                   f"{format_expr(s.a)} * {format_expr(s.b)}")
    elif isinstance(s, WarpgroupMma):
        m, n, k = s.shape
        a, b = (f"{format_expr(r)}{'^T' if t else ''}" for r, t in ((s.a, s.trans_a), (s.b, s.trans_b)))
        out.append(f"{pad}wgmma.m{m}n{n}k{k}.{s.kind} {format_expr(s.acc)} += {a} * {b}")
    elif isinstance(s, WarpgroupSync):
        out.append(f"{pad}wgmma.{s.op}" + (f" {s.pending}" if s.op == "wait" else ""))
    elif isinstance(s, ProxyFence):
        out.append(f"{pad}fence.proxy.async")
    else:
        raise TypeError(f"cannot print {type(s).__name__}")


# ---------------------------------------------------------------- verification

def verify_func(f: LoopFunc) -> None:
    """Check scoping and shapes; a failure is a compiler bug, reported as such."""
    buffers = {p.name: p for p in f.params if isinstance(p, Buffer)}
    scope = {p.name for p in f.params if isinstance(p, Var)}
    _verify(f.body, buffers, scope, set())


def _verify(s: Stmt, buffers: dict[str, Buffer], scope: set[str], loops: set[str]) -> None:
    if isinstance(s, BindingStmt):
        scope = scope | s.bound
    for e in stmt_exprs(s):
        for n in walk(e):
            if isinstance(n, (Read, Reduce)):  # formatted only on failure: printing is O(size)
                _check(False, f"TE node left in loop IR: {n}")
            if isinstance(n, Var):
                _check(n.name in scope, f"unbound variable {n.name}")
            if isinstance(n, Load):
                _check(n.buffer in buffers, f"load from unknown buffer {n.buffer}")
                _check(len(n.indices) == len(buffers[n.buffer].shape), f"rank mismatch loading {n.buffer}")
    if isinstance(s, Store):
        _check(s.buffer in buffers, f"store to unknown buffer {s.buffer}")
        _check(len(s.indices) == len(buffers[s.buffer].shape), f"rank mismatch storing {s.buffer}")
        _check(s.value.dtype == buffers[s.buffer].dtype, f"store of {s.value.dtype} into {s.buffer}")
        _check(not s.accumulate or _adds_to_itself(s), f"accumulating store into {s.buffer} is not a += b")
    if isinstance(s, BlockScan):
        _check(s.buffer in buffers and buffers[s.buffer].scope == "local" and buffers[s.buffer].size >= 2,
               f"block scan of {s.buffer}, not a local buffer of two elements")
    if isinstance(s, BindingStmt):
        _verify_binding(s, buffers, scope, loops)
        return
    if isinstance(s, For):
        _check(s.kind in LOOP_KINDS, f"unknown loop kind {s.kind}")
        _check(s.var.name not in scope, f"loop variable {s.var.name} shadows another")
        _verify(s.body, buffers, scope | {s.var.name}, loops | {s.var.name})
    elif isinstance(s, Allocate):
        _check(s.buffer.scope in SCOPES, f"unknown scope {s.buffer.scope}")
        _check(not s.reuses or (s.buffer.scope == "shared" and all(
            n in buffers and buffers[n].scope == "shared" for n in s.reuses)),
            f"{s.buffer.name} reuses {', '.join(s.reuses)}: not shared buffers allocated around it")
        _verify(s.body, {**buffers, s.buffer.name: s.buffer}, scope, loops)
    elif isinstance(s, Let):
        _verify(s.body, buffers, scope | {s.var.name}, loops)
    else:
        for c in s.children():
            _verify(c, buffers, scope, loops)


def _verify_binding(s: BindingStmt, buffers: dict[str, Buffer], scope: set[str], loops: set[str]) -> None:
    for ref in s.half_operands():
        _check(buffers[ref.buffer].dtype.name in ("f16", "bf16"), f"matrix stream operand {ref.buffer} is not 16-bit")
    _check(s.depth % 16 == 0, f"matrix stream over {s.depth} columns, not a multiple of 16")
    for c in s.children():
        _verify(c, buffers, scope | s.bound, loops)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise TccError(f"internal error: loop IR verifier: {message}")


def _adds_to_itself(s: Store) -> bool:
    """An accumulating store's value is ``Load(buffer, indices) + addend``."""
    v = s.value
    return isinstance(v, Binary) and v.op == "add" and isinstance(v.a, Load) and v.a.buffer == s.buffer \
        and v.a.indices == s.indices
