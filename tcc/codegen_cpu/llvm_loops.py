"""The loop statements of a kernel in LLVM IR: serial, unrolled and vector loops, parallel loops
outlined into functions that tcc's thread pool (:mod:`.pool`) runs in chunks, buffers on the stack or the
heap, conditions and lets. A mixin of the function builder (:mod:`tcc.codegen_cpu.llvm_ir`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import replace

from llvmlite import ir

from tcc import threads
from tcc.codegen_cpu import pool
from tcc.codegen_cpu.llvm_types import I32, I64, PTR, local_name, loop_metadata, memory_type
from tcc.errors import TccCompileError
from tcc.ir.expr import Const
from tcc.ir.loops import Allocate, Barrier, Buffer, For, If, Let, Seq, Stmt, walk_stmts

CHUNKS_PER_THREAD = 4  # grabs per thread of a parallel loop: balance against preempted threads


class LoopEmitter:
    """Loops, parallel regions and buffers (the statements other than stores)."""

    def _s_Seq(self, s: Seq) -> None:
        for c in s.stmts:
            self._stmt(c)

    def _s_Barrier(self, s: Barrier) -> None:
        pass  # one thread of control per loop body on the CPU

    def _s_For(self, s: For) -> None:
        if s.kind not in ("serial", "unroll", "vector", "parallel"):
            raise TccCompileError(f"loop {s.var.name} is bound to {s.kind}, which the CPU has not", s.span,
                                  "GPU bindings need target='cuda'")
        if s.kind == "unroll":
            return self._unrolled(s)
        if s.kind == "vector":
            return self._vectorized(s)
        if s.kind == "parallel" and self.status is None and self.vec is None and threads_available():
            return self._parallel(s)
        self._loop(s, ir.Constant(I64, 0), self._scalar(s.extent))

    def _loop(self, s: For, begin: ir.Value, end: ir.Value) -> None:
        b = self.builder
        pre = b.block
        header = self.fn.append_basic_block(local_name(f"{s.var.name}.header"))
        body = self.fn.append_basic_block(local_name(f"{s.var.name}.body"))
        exit_ = self.fn.append_basic_block(local_name(f"{s.var.name}.exit"))
        b.branch(header)
        b.position_at_end(header)
        idx = b.phi(I64, name=local_name(s.var.name))
        idx.add_incoming(begin, pre)
        b.cbranch(b.icmp_signed("<", idx, end), body, exit_)
        b.position_at_end(body)
        extent = ir.Constant(I64, int(s.extent.value)) if isinstance(s.extent, Const) else None
        with self._bound(s.var.name, idx, extent):
            self._stmt(s.body)
        nxt = b.add(idx, ir.Constant(I64, 1), name=local_name(f"{s.var.name}.next"), flags=["nsw", "nuw"])
        latch = b.block
        latch_branch = b.branch(header)
        if _holds_loop(s.body) and not _runs_once(s):
            latch_branch.set_metadata("llvm.loop", loop_metadata(self.module, "llvm.loop.unroll.disable"))
        idx.add_incoming(nxt, latch)
        b.position_at_end(exit_)

    @contextlib.contextmanager
    def _bound(self, name: str, value: ir.Value, extent: ir.Value | None = None):
        """``name`` is ``value`` inside; a loop index also records its constant extent (the
        index is in [0, extent)), which narrower index arithmetic relies on (``index_range``)."""
        saved, saved_extent = self.vars.get(name), self.extents.pop(name, None)
        self.vars[name] = value
        if isinstance(extent, ir.Constant) and isinstance(extent.constant, int):
            self.extents[name] = extent.constant
        try:
            yield
        finally:
            self.extents.pop(name, None)
            if saved_extent is not None:
                self.extents[name] = saved_extent
            if saved is not None:
                self.vars[name] = saved
            else:
                del self.vars[name]

    def _unrolled(self, s: For) -> None:
        """One copy of the body per iteration, the index a constant."""
        for i in range(_const_extent(s)):
            with self._bound(s.var.name, ir.Constant(I64, i), ir.Constant(I64, _const_extent(s))):
                self._stmt(s.body)

    def _vectorized(self, s: For) -> None:
        """The body once, on vectors of ``extent`` lanes; the loop index is lane 0 = 0 plus the lane."""
        if self.vec is not None:
            raise TccCompileError(f"internal error: vector loop {s.var.name} inside another", s.span)
        lanes = _const_extent(s)
        if lanes == 0:
            return
        self.vec = (s.var.name, lanes)
        try:
            with self._bound(s.var.name, ir.Constant(I64, 0), ir.Constant(I64, lanes)):
                self._stmt(s.body)
        finally:
            self.vec = None

    def _parallel(self, s: For) -> None:
        """Outline the body into ``void f(ptr ctx, i64 team)`` and run it on tcc's thread pool.

        The iterations are handed out dynamically: each thread takes the next chunk from a shared
        counter (an atomic add), so a thread that the OS preempts delays the call by at most one
        chunk instead of its whole static share, and chunks that no worker took the calling thread
        runs itself (the pool does not wait for a worker that has not joined)."""
        b = self.builder
        extent = self._scalar(s.extent)
        status = self._entry_alloca(I32, 1, "status")
        b.store(ir.Constant(I32, 0), status)
        counter = self._entry_alloca(I64, 1, "next")
        b.store(ir.Constant(I64, 0), counter)
        names = list(self.vars)
        bufs = list(self.buffers)
        values = [self.vars[n] for n in names] + [self.buffers[n][1] for n in bufs] + [extent, status, counter]
        ctx_ty = ir.LiteralStructType([v.type for v in values])
        ctx = self._entry_alloca(ctx_ty, 1, "ctx")
        for i, v in enumerate(values):
            self._raw_store(v, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=ctx_ty))
        self.outlined += 1
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, I64]),
                         f"{self.fn.name}.par{self.outlined}")
        fn.linkage = "internal"
        self._outline_body(s, fn, ctx_ty, names, bufs)
        run = self._declare(pool.SYMBOL, ir.FunctionType(ir.VoidType(), [PTR, PTR, I32]))
        b.call(run, [fn, ctx, b.load(self._thread_count(), typ=I32)])
        failed = b.icmp_signed("!=", b.load(status, typ=I32), ir.Constant(I32, 0))
        with b.if_then(failed, likely=False):
            self._fail()

    def _thread_count(self) -> ir.GlobalVariable:
        """The process-wide cell that ``tcc.set_num_threads`` writes (0: the default), read
        before each parallel loop so that a new count applies to every later call without a rebuild."""
        cell = self.module.globals.get(threads.SYMBOL)
        return cell if cell is not None else ir.GlobalVariable(self.module, I32, threads.SYMBOL)

    def _outline_body(self, s: For, fn: ir.Function, ctx_ty: ir.Type, names: list[str], bufs: list[str]) -> None:
        saved = (self.fn, self.entry, self.builder, self.vars, self.buffers, self.status)
        self.fn = fn
        self.entry = fn.append_basic_block("entry")
        b = self.builder = ir.IRBuilder(self.entry)

        def field(i: int, ty: ir.Type) -> ir.Value:
            return b.load(b.gep(fn.args[0], [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=ctx_ty), typ=ty)

        types = ctx_ty.elements
        self.vars = {n: field(i, types[i]) for i, n in enumerate(names)}
        self.buffers = {n: (saved[4][n][0], field(len(names) + i, PTR)) for i, n in enumerate(bufs)}
        extent = field(len(names) + len(bufs), I64)
        self.status = field(len(names) + len(bufs) + 1, PTR)
        counter = field(len(names) + len(bufs) + 2, PTR)
        chunk = self._chunk(extent, fn.args[1])  # the team: grabs sized for every thread of it
        try:
            body, scratch = _peel_allocates(s.body)
            self._per_thread(scratch, lambda: self._chunks(replace(s, body=body), extent, chunk, counter))
            self._store_fence()
            self.builder.ret_void()
        finally:
            self.fn, self.entry, self.builder, self.vars, self.buffers, self.status = saved

    def _chunk(self, extent: ir.Value, nth: ir.Value) -> ir.Value:
        """Iterations per grab: about CHUNKS_PER_THREAD grabs per thread, at least one iteration."""
        b = self.builder
        parts = b.mul(nth, ir.Constant(I64, CHUNKS_PER_THREAD))
        chunk = b.sdiv(extent, parts)
        return b.select(b.icmp_signed("<", chunk, ir.Constant(I64, 1)), ir.Constant(I64, 1), chunk)

    def _chunks(self, s: For, extent: ir.Value, chunk: ir.Value, counter: ir.Value) -> None:
        """``while (begin = next.fetch_add(chunk)) < extent: run s over [begin, min(begin + chunk, extent))``."""
        b = self.builder
        header = self.fn.append_basic_block(local_name(f"{s.var.name}.grab"))
        body = self.fn.append_basic_block(local_name(f"{s.var.name}.chunk"))
        done = self.fn.append_basic_block(local_name(f"{s.var.name}.done"))
        b.branch(header)
        b.position_at_end(header)
        begin = b.atomic_rmw("add", counter, chunk, "monotonic")
        b.cbranch(b.icmp_signed("<", begin, extent), body, done)
        b.position_at_end(body)
        end = b.add(begin, chunk)
        end = b.select(b.icmp_signed("<", end, extent), end, extent)
        self._loop(s, begin, end)
        b.branch(header)
        b.position_at_end(done)

    def _per_thread(self, scratch: list[Buffer], emit: Callable[[], None]) -> None:
        """Scratch buffers of a parallel loop's iterations, allocated once per thread around ``emit``
        (each iteration overwrites them before reading, so a thread may reuse them)."""
        if not scratch:
            return emit()
        self._with_buffer(scratch[0], lambda: self._per_thread(scratch[1:], emit))

    def _entry_alloca(self, ty: ir.Type, count: int, name: str) -> ir.Value:
        b = self.builder
        with b.goto_block(self.entry):
            b.position_at_start(self.entry)
            ptr = b.alloca(ty, size=ir.Constant(I64, max(1, count)), name=local_name(name))
        ptr.align = 64
        return ptr

    def _s_Allocate(self, s: Allocate) -> None:
        self._with_buffer(s.buffer, lambda: self._stmt(s.body))

    def _with_buffer(self, buf: Buffer, emit: Callable[[], None]) -> None:
        """Stack (entry-block alloca) for local buffers, the heap for global ones, around ``emit``."""
        elem = memory_type(buf.dtype)
        if buf.scope == "local":
            ptr = self._entry_alloca(elem, buf.size, buf.name)
        else:
            ptr = self._malloc(buf)
        self.buffers[buf.name] = (buf, ptr)
        emit()
        if buf.scope != "local":
            self._free(ptr)
        del self.buffers[buf.name]

    def _s_If(self, s: If) -> None:
        cond = self._expr(s.cond)
        if isinstance(cond.type, ir.VectorType):
            raise TccCompileError("internal error: a branch on a vector condition")
        if s.otherwise is None:
            with self.builder.if_then(cond):
                self._stmt(s.then)
        else:
            with self.builder.if_else(cond) as (then, otherwise):
                with then:
                    self._stmt(s.then)
                with otherwise:
                    self._stmt(s.otherwise)

    def _s_Let(self, s: Let) -> None:
        with self._bound(s.var.name, self._expr(s.value)):
            self._stmt(s.body)


def _holds_loop(s: Stmt) -> bool:
    """Whether a loop body holds a loop of its own (unrolled and vector loops are expanded by the
    code generator, so they do not count).

    LLVM's unroller is left only the innermost loops: a register tile's reduction, which it
    unrolls in part (matmul 256 ran 30% slower without), a pooling window. Outer loops with small
    trip counts it copied whole: a convolution's three column tiles became three copies of the
    GEMM micro-kernel and its seven row tiles seven copies of the weight packing, twice the object
    code and compile time (conv2d 3x3 64->64 56x56: LLVM 580 -> 280 ms) and nothing faster."""
    return any(isinstance(n, For) and n.kind in ("serial", "parallel") for n in walk_stmts(s))


def _runs_once(s: For) -> bool:
    """A loop of one iteration (``ko in 0..1``): LLVM removes it by unrolling it once, so it carries
    no note (with one, its branch stayed: matmul 257x129x263 ran ~1.5% slower)."""
    return isinstance(s.extent, Const) and s.extent.value <= 1


def _peel_allocates(s: Stmt) -> tuple[Stmt, list[Buffer]]:
    """The body under a parallel loop's leading allocations, and those buffers."""
    bufs = []
    while isinstance(s, Allocate):
        bufs.append(s.buffer)
        s = s.body
    return s, bufs


def _const_extent(s: For) -> int:
    if not isinstance(s.extent, Const):
        raise TccCompileError(f"internal error: {s.kind} loop {s.var.name} has a non-constant extent", s.span)
    return int(s.extent.value)


@functools.cache
def threads_available() -> bool:
    """Whether tcc's thread pool (which parallel loops run on) can run in this process."""
    return pool.available()
