"""Translate a :class:`~tcc.ir.loops.LoopFunc` into an LLVM module with llvmlite.ir.

The kernel's signature is ``i32 NAME(ptr args)``: ``args`` is an array of pointers, one per
parameter (a buffer's data, or a pointer to a scalar's value), so one ctypes prototype fits
every op. It returns 0, or 1 when an intermediate could not be allocated.

Codegen decides nothing: loops, buffers and their scopes come from the loop IR as is.
Arithmetic follows the language (NumPy) semantics: integer ``//`` and ``%`` floor and give 0
on division by zero (never a trap), float ``max``/``min`` propagate NaN, bools live in memory
as bytes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable
from dataclasses import replace

from llvmlite import ir
from llvmlite.ir import instructions as ir_instructions

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Unary, Var
from tcc.ir.loops import Allocate, Barrier, Buffer, For, If, Let, LoopFunc, Seq, Stmt, Store
from tcc.passes.loops.loopnest import flat_coeff, loads

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()

_FLOAT_TYPES = {"f16": ir.HalfType(), "f32": ir.FloatType(), "f64": ir.DoubleType()}
_INT_TYPES = {"i8": I8, "i32": I32, "i64": I64}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_LIBM = {"tanh", "erf"}
MAX_SPREAD_STRIDE = 4  # lanes this far apart load as one wider masked load and a shuffle
CHUNKS_PER_THREAD = 4  # grabs per thread of a parallel loop: balance against preempted threads
STREAM_L2S = 4  # results of at least this many L2s are stored around the cache (non-temporal)
CACHE_LINE = 64
_INTRINSIC = {"exp", "log", "sqrt", "sin", "cos", "floor", "ceil", "abs"}


def value_type(dtype: DType) -> ir.Type:
    """The LLVM type of a value in registers."""
    if dtype.name == "bf16":
        raise TccCompileError("bf16 is supported on target='cuda' only",
                              hint="use f32 or f16 on the CPU")
    if dtype.is_bool:
        return I1
    return _FLOAT_TYPES.get(dtype.name) or _INT_TYPES[dtype.name]


def memory_type(dtype: DType) -> ir.Type:
    """The LLVM type of an element in memory (bools are bytes, as in NumPy)."""
    return I8 if dtype.is_bool else value_type(dtype)


def build_module(func: LoopFunc, triple: str = "", data_layout: str = "") -> ir.Module:
    module = ir.Module(name=func.name)
    if triple:
        module.triple = triple
    if data_layout:
        module.data_layout = data_layout
    _FunctionBuilder(module, func).build()
    return module


MAX_LOCAL_NAME = 64  # LLVM truncates local names at 1,024 characters, so long ones would collide


def local_name(name: str) -> str:
    """A user-derived name for an LLVM local value or block: itself when short, else a prefix
    and a hash of the whole (names stay readable and distinct; llvmlite numbers any repeats)."""
    if len(name) <= MAX_LOCAL_NAME:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=6).hexdigest()
    return f"{name[:MAX_LOCAL_NAME - 13]}.{digest}"


def symbol_name(func: LoopFunc) -> str:
    return f"tcc_{func.name}"


class _FunctionBuilder:
    """Emits one kernel; parallel loop bodies become outlined functions run by libgomp."""

    def __init__(self, module: ir.Module, func: LoopFunc):
        self.module = module
        self.func = func
        self.contract = bool(func.attrs.get("fp_contract"))
        fnty = ir.FunctionType(I32, [PTR])
        self.fn = ir.Function(module, fnty, symbol_name(func))
        self.fn.args[0].name = "args"
        self.entry = self.fn.append_basic_block("entry")
        self.builder = ir.IRBuilder(self.entry)
        self.vars: dict[str, ir.Value] = {}
        self.buffers: dict[str, tuple[Buffer, ir.Value]] = {}
        self.status: ir.Value | None = None  # set inside outlined bodies: where to report failure
        self.vec: tuple[str, int] | None = None  # (var, lanes) inside a vector loop
        self.lane0 = False  # evaluate the vector var as its first lane (address computations)
        self.outlined = 0
        self.streamed = _streamed_outputs(func)

    # ------------------------------------------------------------ structure
    def build(self) -> None:
        b = self.builder
        for i, param in enumerate(self.func.params):
            slot = b.gep(self.fn.args[0], [ir.Constant(I64, i)], source_etype=PTR)
            ptr = b.load(slot, typ=PTR, name=local_name(f"{param.name}.ptr"))
            if isinstance(param, Buffer):
                self.buffers[param.name] = (param, ptr)
            else:
                value = b.load(ptr, typ=memory_type(param.dtype), name=local_name(param.name))
                self.vars[param.name] = self._from_memory(value, param.dtype)
        self._stmt(self.func.body)
        self._store_fence()
        self.builder.ret(ir.Constant(I32, 0))

    def _fail(self) -> None:
        """Leave the current function reporting out-of-memory."""
        b = self.builder
        if self.status is None:
            b.ret(ir.Constant(I32, 1))
        else:
            b.store(ir.Constant(I32, 1), self.status)
            b.ret_void()

    def _stmt(self, s: Stmt) -> None:
        method = getattr(self, f"_s_{type(s).__name__}", None)
        if method is None:
            raise TccCompileError(f"internal error: the CPU backend cannot lower {type(s).__name__}")
        method(s)

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
        with self._bound(s.var.name, idx):
            self._stmt(s.body)
        nxt = b.add(idx, ir.Constant(I64, 1), name=local_name(f"{s.var.name}.next"), flags=["nsw", "nuw"])
        latch = b.block
        b.branch(header)
        idx.add_incoming(nxt, latch)
        b.position_at_end(exit_)

    @contextlib.contextmanager
    def _bound(self, name: str, value: ir.Value):
        saved = self.vars.get(name)
        self.vars[name] = value
        try:
            yield
        finally:
            if saved is not None:
                self.vars[name] = saved
            else:
                del self.vars[name]

    def _unrolled(self, s: For) -> None:
        """One copy of the body per iteration, the index a constant."""
        for i in range(_const_extent(s)):
            with self._bound(s.var.name, ir.Constant(I64, i)):
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
            with self._bound(s.var.name, ir.Constant(I64, 0)):
                self._stmt(s.body)
        finally:
            self.vec = None

    def _parallel(self, s: For) -> None:
        """Outline the body into ``void f(ptr ctx)`` and run it on libgomp's thread team.

        The iterations are handed out dynamically: each thread takes the next chunk from a shared
        counter (an atomic add), so a thread that the OS preempts delays the call by at most one
        chunk instead of its whole static share."""
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
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR]),
                         f"{self.fn.name}.par{self.outlined}")
        fn.linkage = "internal"
        self._outline_body(s, fn, ctx_ty, names, bufs)
        gomp = self._declare("GOMP_parallel", ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]))
        b.call(gomp, [fn, ctx, ir.Constant(I32, 0), ir.Constant(I32, 0)])
        failed = b.icmp_signed("!=", b.load(status, typ=I32), ir.Constant(I32, 0))
        with b.if_then(failed, likely=False):
            self._fail()

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
        nth = b.sext(b.call(self._declare("omp_get_num_threads", ir.FunctionType(I32, [])), []), I64)
        chunk = self._chunk(extent, nth)
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

    def _s_Store(self, s: Store) -> None:
        buf, base = self.buffers[s.buffer]
        value = self._expr(s.value)
        if self.vec is None:
            ptr = self._element(buf, base, s.indices)
            self.builder.store(self._to_memory(value, buf.dtype), ptr, align=buf.dtype.itemsize)
            return
        stride = self._lane_stride(buf, s.indices)
        if stride == 0:
            raise TccCompileError(f"internal error: vector store to one element of {s.buffer}")
        lanes = self.vec[1]
        if stride == 1:
            ptr = self._element(buf, base, s.indices, lane0=True)
            value = self._to_memory(self._splat(value, lanes), buf.dtype)
            if s.buffer in self.streamed and (lanes * buf.dtype.itemsize) % CACHE_LINE == 0:
                self._streaming_store(value, ptr, buf.dtype.itemsize)
            else:
                self._raw_store(value, ptr, buf.dtype.itemsize)
            return
        for lane in range(lanes):  # a scatter, one lane at a time
            with self._lane(lane):
                ptr = self._element(buf, base, s.indices, lane0=True)
            elem = self._lane_value(value, lane)
            self.builder.store(self._to_memory(elem, buf.dtype), ptr, align=buf.dtype.itemsize)

    def _streaming_store(self, value: ir.Value, ptr: ir.Value, itemsize: int) -> None:
        """A non-temporal store where ``ptr`` is cache-line aligned (else a plain one): the line
        is written without first being read (a third less memory traffic for ``relu(a*b + c)``)
        and does not evict what the loop reads. The branch goes one way for the whole loop."""
        b = self.builder
        aligned = b.icmp_unsigned("==", b.and_(b.ptrtoint(ptr, I64), ir.Constant(I64, CACHE_LINE - 1)),
                                  ir.Constant(I64, 0))
        with b.if_else(aligned) as (then, otherwise):
            with then:
                st = ir_instructions.StoreInstr(b.block, value, ptr)
                st.align = CACHE_LINE
                st.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(I32, 1)]))
                b._insert(st)
            with otherwise:
                self._raw_store(value, ptr, itemsize)

    def _store_fence(self) -> None:
        """Order this thread's non-temporal stores before it reports done (they bypass the
        cache's ordering): ``sfence`` at the end of every function that may issue them."""
        if self.streamed:
            self.builder.call(self._declare("llvm.x86.sse.sfence", ir.FunctionType(ir.VoidType(), [])), [])

    def _raw_store(self, value: ir.Value, ptr: ir.Value, align: int | None = None) -> None:
        """A store without llvmlite's check of the pointer's (typed) element type: LLVM's pointers
        are opaque, and vector stores or context fields legitimately differ from it."""
        st = ir_instructions.StoreInstr(self.builder.block, value, ptr)
        st.align = align
        self.builder._insert(st)

    @contextlib.contextmanager
    def _lane(self, lane: int):
        """Evaluate as if the vector index were at ``lane`` (scalar address computations)."""
        name = self.vec[0]
        with self._bound(name, ir.Constant(I64, lane)):
            yield

    def _lane_value(self, value: ir.Value, lane: int) -> ir.Value:
        if isinstance(value.type, ir.VectorType):
            return self.builder.extract_element(value, ir.Constant(I32, lane))
        return value

    def _lane_stride(self, buf: Buffer, indices: tuple[Expr, ...]) -> int | None:
        """Elements between neighbouring lanes of an access (None: not affine in the lane)."""
        return flat_coeff(indices, buf.shape, self.vec[0])

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

    # ------------------------------------------------------------ memory
    def _element(self, buf: Buffer, base: ir.Value, indices: tuple[Expr, ...], lane0: bool = False,
                 inbounds: bool = True) -> ir.Value:
        """Address of an element; with ``lane0`` the vector index counts as its current lane.
        ``inbounds=False`` for a masked access, whose first lane may lie outside the buffer (a
        padded patch row starts before its image): an inbounds address there is poison."""
        saved, self.lane0 = self.lane0, lane0 or self.lane0
        try:
            b = self.builder
            flat = None
            stride = 1
            for idx, dim in reversed(list(zip(indices, buf.shape))):
                term = self._scalar(idx)
                if stride != 1:
                    term = b.mul(term, ir.Constant(I64, stride), flags=["nsw"])
                flat = term if flat is None else b.add(flat, term, flags=["nsw"])
                stride *= dim
            if flat is None:
                flat = ir.Constant(I64, 0)
            return b.gep(base, [flat], inbounds=inbounds, source_etype=memory_type(buf.dtype))
        finally:
            self.lane0 = saved

    def _scalar(self, e: Expr) -> ir.Value:
        saved, self.lane0 = self.lane0, True
        try:
            value = self._expr(e)
        finally:
            self.lane0 = saved
        if isinstance(value.type, ir.VectorType):
            raise TccCompileError(f"internal error: {e} varies across vector lanes")
        return value

    def _malloc(self, buf: Buffer) -> ir.Value:
        """64-byte aligned heap memory (packed tiles are read with full-width vector loads)."""
        b = self.builder
        alloc = self._declare("aligned_alloc", ir.FunctionType(PTR, [I64, I64]))
        size = max(64, -(-buf.size * buf.dtype.itemsize // 64) * 64)
        ptr = b.call(alloc, [ir.Constant(I64, 64), ir.Constant(I64, size)], name=local_name(buf.name))
        failed = b.icmp_unsigned("==", ptr, ir.Constant(PTR, None))
        with b.if_then(failed, likely=False):
            self._fail()
        return ptr

    def _free(self, ptr: ir.Value) -> None:
        free = self._declare("free", ir.FunctionType(ir.VoidType(), [PTR]))
        self.builder.call(free, [ptr])

    def _declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        return existing if existing is not None else ir.Function(self.module, fnty, name)

    def _intrinsic(self, name: str, ty: ir.Type, nargs: int = 1) -> ir.Function:
        return self._declare(f"llvm.{name}.{_type_suffix(ty)}", ir.FunctionType(ty, [ty] * nargs))

    def _from_memory(self, value: ir.Value, dtype: DType) -> ir.Value:
        if not dtype.is_bool:
            return value
        return self.builder.icmp_unsigned("!=", value, _const(value.type, 0))

    def _to_memory(self, value: ir.Value, dtype: DType) -> ir.Value:
        if not dtype.is_bool:
            return value
        return self.builder.zext(value, _like(value.type, I8))

    # ------------------------------------------------------------ vectors
    def _splat(self, value: ir.Value, lanes: int) -> ir.Value:
        if isinstance(value.type, ir.VectorType):
            return value
        vty = ir.VectorType(value.type, lanes)
        if isinstance(value, ir.Constant) and isinstance(value.constant, int | float):
            return ir.Constant(vty, [value.constant] * lanes)
        b = self.builder
        one = b.insert_element(ir.Constant(vty, None), value, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(vty, None), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))

    def _unify(self, *values: ir.Value) -> list[ir.Value]:
        """Broadcast scalars to the vector width when any operand is a vector."""
        widths = [v.type.count for v in values if isinstance(v.type, ir.VectorType)]
        if not widths:
            return list(values)
        return [self._splat(v, widths[0]) for v in values]

    # ------------------------------------------------------------ expressions
    def _expr(self, e: Expr) -> ir.Value:
        method = getattr(self, f"_e_{type(e).__name__}", None)
        if method is None:
            raise TccCompileError(f"internal error: the CPU backend cannot lower {type(e).__name__}")
        return method(e)

    def _e_Const(self, e: Const) -> ir.Value:
        return ir.Constant(value_type(e.dtype), int(e.value) if not e.dtype.is_float else float(e.value))

    def _e_Var(self, e: Var) -> ir.Value:
        value = self.vars[e.name]
        if self.vec is not None and e.name == self.vec[0] and not self.lane0:
            lanes = self.vec[1]
            iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
            return self.builder.add(self._splat(value, lanes), iota)
        return value

    def _e_Load(self, e: Load) -> ir.Value:
        buf, base = self.buffers[e.buffer]
        b = self.builder
        ty = memory_type(buf.dtype)
        stride = 0 if self.vec is None or self.lane0 else self._lane_stride(buf, e.indices)
        if stride == 0:
            ptr = self._element(buf, base, e.indices)
            return self._from_memory(b.load(ptr, typ=ty, align=buf.dtype.itemsize), buf.dtype)
        lanes = self.vec[1]
        vty = ir.VectorType(ty, lanes)
        if stride == 1:
            ptr = self._element(buf, base, e.indices, lane0=True)
            return self._from_memory(b.load(ptr, typ=vty, align=buf.dtype.itemsize), buf.dtype)
        if _spreads(stride, lanes):
            ptr = self._element(buf, base, e.indices, lane0=True)
            every = ir.Constant(ir.VectorType(I1, lanes), [1] * lanes)
            out = self._spread_load(ptr, vty, stride, every, ir.Constant(vty, None), buf.dtype.itemsize)
            return self._from_memory(out, buf.dtype)
        out = ir.Constant(vty, None)
        for lane in range(lanes):  # a gather, one lane at a time
            with self._lane(lane):
                ptr = self._element(buf, base, e.indices, lane0=True)
            out = b.insert_element(out, b.load(ptr, typ=ty, align=buf.dtype.itemsize), ir.Constant(I32, lane))
        return self._from_memory(out, buf.dtype)

    def _e_Select(self, e: Select) -> ir.Value:
        guarded = self._guarded_load(e)
        if guarded is not None:
            return guarded
        cond, a, c = self._expr(e.cond), self._expr(e.a), self._expr(e.b)
        if isinstance(cond.type, ir.VectorType):
            cond, a, c = self._unify(cond, a, c)
        else:
            a, c = self._unify(a, c)
        return self.builder.select(cond, a, c)

    def _guarded_load(self, e: Select) -> ir.Value | None:
        """``select(inside, X[clamp(i)], v)`` (a read through a pad) on vector lanes: a masked load
        of ``X[i]`` (``llvm.masked.load``, or ``llvm.masked.gather`` for a constant stride) where
        ``inside`` holds, instead of one clamped scalar load per lane. ``inside`` must imply that
        every clamp is the identity, which is what lowering a pad read produces."""
        if self.vec is None or self.lane0 or not isinstance(e.a, Load):
            return None
        buf, base = self.buffers[e.a.buffer]
        indices = _unclamped(e.a.indices, _conjuncts(e.cond))
        if indices is None or buf.dtype.is_bool:
            return None
        stride = self._lane_stride(buf, indices)
        if not stride:
            return None
        b = self.builder
        lanes = self.vec[1]
        vty = ir.VectorType(memory_type(buf.dtype), lanes)
        mask, other = self._unify(self._expr(e.cond), self._expr(e.b))
        mask = self._splat(mask, lanes)
        other = self._splat(other, lanes)
        ptr = self._element(buf, base, indices, lane0=True, inbounds=False)
        align = ir.Constant(I32, buf.dtype.itemsize)
        if stride == 1:
            fn = self._declare(f"llvm.masked.load.{_type_suffix(vty)}.p0",
                               ir.FunctionType(vty, [PTR, I32, mask.type, vty]))
            return b.call(fn, [ptr, align, mask, other])
        if _spreads(stride, lanes):
            return self._spread_load(ptr, vty, stride, mask, other, buf.dtype.itemsize)
        size = buf.dtype.itemsize
        offsets = ir.Constant(ir.VectorType(I64, lanes), [lane * stride * size for lane in range(lanes)])
        pty = ir.VectorType(PTR, lanes)
        ptrs = b.inttoptr(b.add(self._splat(b.ptrtoint(ptr, I64), lanes), offsets), pty)
        fn = self._declare(f"llvm.masked.gather.{_type_suffix(vty)}.v{lanes}p0",
                           ir.FunctionType(vty, [pty, I32, mask.type, vty]))
        return b.call(fn, [ptrs, align, mask, other])

    def _spread_load(self, ptr: ir.Value, vty: ir.VectorType, stride: int, mask: ir.Value, other: ir.Value,
                     align: int) -> ir.Value:
        """Lanes ``stride`` elements apart (a stride-2 conv's patch row, a pooling window): one
        masked contiguous load of ``lanes * stride`` elements, only every ``stride``-th enabled (so
        nothing past the last lane is touched), then a shuffle; a masked gather moves one element
        per cycle, this a whole vector."""
        b = self.builder
        lanes = vty.count
        wide = lanes * stride
        wty = ir.VectorType(vty.element, wide)
        picks = [t // stride if t % stride == 0 else lanes for t in range(wide)]
        off = ir.Constant(ir.VectorType(I1, lanes), [0] * lanes)
        wmask = b.shuffle_vector(mask, off, _lanes(picks))
        wother = b.shuffle_vector(other, other, _lanes([t // stride for t in range(wide)]))
        fn = self._declare(f"llvm.masked.load.{_type_suffix(wty)}.p0",
                           ir.FunctionType(wty, [PTR, I32, wmask.type, wty]))
        loaded = b.call(fn, [ptr, ir.Constant(I32, align), wmask, wother])
        return b.shuffle_vector(loaded, loaded, _lanes([lane * stride for lane in range(lanes)]))

    def _e_Unary(self, e: Unary) -> ir.Value:
        a = self._expr(e.a)
        b = self.builder
        if e.op == "not":
            return b.xor(a, _const(a.type, 1))
        return b.fneg(a) if e.dtype.is_float else b.sub(_const(a.type, 0), a)

    def _e_Cast(self, e: Cast) -> ir.Value:
        return self._convert(self._expr(e.a), e.a.dtype, e.dtype)

    def _convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        b = self.builder
        if src == dst:
            return v
        to = _like(v.type, value_type(dst))
        if dst.is_bool:
            zero = _const(v.type, 0.0 if src.is_float else 0)
            return b.fcmp_unordered("!=", v, zero) if src.is_float else b.icmp_unsigned("!=", v, zero)
        if src.is_bool:
            return b.uitofp(v, to) if dst.is_float else b.zext(v, to)
        if src.is_float and dst.is_float:
            return b.fpext(v, to) if dst.bits > src.bits else b.fptrunc(v, to)
        if src.is_float:  # the language's rule: truncate, saturate to i64 (NaN: 0), wrap to the width
            wide = _like(v.type, ir.IntType(64))
            sat = b.call(self._declare(f"llvm.fptosi.sat.{_type_suffix(wide)}.{_type_suffix(v.type)}",
                                       ir.FunctionType(wide, [v.type])), [v])
            return sat if dst.bits == 64 else b.trunc(sat, to)
        if dst.is_float:
            return b.sitofp(v, to)
        if dst.bits > src.bits:
            return b.sext(v, to)
        return b.trunc(v, to)

    def _e_Binary(self, e: Binary) -> ir.Value:
        fused = self._fused_multiply_add(e)
        if fused is not None:
            return fused
        a, c = self._expr(e.a), self._expr(e.b)
        if e.op == "div" and e.dtype == dtypes.f32 and isinstance(a.type, ir.VectorType) \
                and not isinstance(c.type, ir.VectorType):
            return self._divide_by_invariant(a, c)
        a, c = self._unify(a, c)
        operand = e.a.dtype
        b = self.builder
        if e.op in ("and", "or"):
            return b.and_(a, c) if e.op == "and" else b.or_(a, c)
        if e.op in _ICMP:
            if operand.is_float:
                return b.fcmp_unordered("!=", a, c) if e.op == "ne" else b.fcmp_ordered(_ICMP[e.op], a, c)
            if operand.is_bool:
                return b.icmp_unsigned(_ICMP[e.op], a, c)
            return b.icmp_signed(_ICMP[e.op], a, c)
        if operand.is_float:
            return self._float_binary(e.op, a, c, e.b, e.a)
        return self._int_binary(e.op, a, c)

    def _divide_by_invariant(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """f32 lanes over one divisor (softmax's ``e / s``): each lane times ``1 / c`` in f64,
        rounded once to f32. That is the correctly rounded quotient, as ``fdiv`` gives: the f64
        product is within 2^-52 (relative) of ``a / c``, and a quotient of two 24-bit numbers
        that is not an f32 midpoint lies at least ~2^-49 from one, so rounding cannot go the
        other way; f64 neither overflows nor underflows here, and 0, inf and NaN come out as
        IEEE division gives them. A vector ``vdivps`` costs ~8 cycles; this, 3 short ops per 8
        lanes, and ``1 / c`` is computed once outside the loop (softmax 4096x1024: ~2%)."""
        b = self.builder
        f64 = ir.DoubleType()
        lanes = a.type.count
        wide = ir.VectorType(f64, lanes)
        recip = b.fdiv(ir.Constant(f64, 1.0), b.fpext(c, f64))
        product = b.fmul(b.fpext(a, wide), self._splat(recip, lanes))
        return b.fptrunc(product, a.type)

    def _fused_multiply_add(self, e: Binary) -> ir.Value | None:
        """``a * b + c`` as ``llvm.fmuladd`` when the schedule allowed contraction (fp_contract)."""
        if not (self.contract and e.op == "add" and e.dtype.is_float):
            return None
        for mul, addend in ((e.b, e.a), (e.a, e.b)):
            if isinstance(mul, Binary) and mul.op == "mul" and mul.dtype == e.dtype:
                x, y, z = self._unify(self._expr(mul.a), self._expr(mul.b), self._expr(addend))
                return self.builder.call(self._intrinsic("fmuladd", x.type, 3), [x, y, z])
        return None

    def _float_binary(self, op: str, a: ir.Value, c: ir.Value, rhs: Expr, lhs: Expr | None = None) -> ir.Value:
        b = self.builder
        if op == "add":
            return b.fadd(a, c)
        if op == "sub":
            return b.fsub(a, c)
        if op == "mul":
            return b.fmul(a, c)
        if op == "div":
            return b.fdiv(a, c)
        if op in ("max", "min"):
            bound = _against_constant(lhs, rhs, a, c)
            if bound is not None:  # relu's max(x, 0): one compare and a blend
                x, k = bound
                keep = b.fcmp_unordered(">" if op == "max" else "<", x, k)
                return b.select(keep, x, k)
            if _avx512() and isinstance(a.type, ir.VectorType) and str(a.type.element) == "float":
                return self._range(a, c, op)
            return b.call(self._intrinsic("maximum" if op == "max" else "minimum", a.type, 2), [a, c])
        if op == "pow":
            if isinstance(rhs, Const) and rhs.value == 2:
                return b.fmul(a, a)
            return b.call(self._intrinsic("pow", a.type, 2), [a, c])
        if op == "mod":
            return self._float_mod(a, c)
        if op == "floordiv":
            return self._float_floordiv(a, c)
        raise TccCompileError(f"internal error: float operator {op}")

    def _float_floordiv(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """NumPy's floor division: from fmod, with its rounding of the quotient (a / 0 for b == 0)."""
        b = self.builder
        zero, one, half = (_const(a.type, v) for v in (0.0, 1.0, 0.5))
        r = b.frem(a, c)
        div = b.fdiv(b.fsub(a, r), c)
        adjust = b.and_(b.fcmp_ordered("!=", r, zero),
                        b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", c, zero)))
        div = b.select(adjust, b.fsub(div, one), div)
        floor = b.call(self._intrinsic("floor", a.type), [div])
        rounded = b.select(b.fcmp_ordered(">", b.fsub(div, floor), half), b.fadd(floor, one), floor)
        return b.select(b.fcmp_ordered("==", c, zero), b.fdiv(a, c), rounded)

    def _float_mod(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """Python/NumPy modulo: the result takes the divisor's sign."""
        b = self.builder
        zero = _const(a.type, 0.0)
        r = b.frem(a, c)
        fix = b.and_(b.fcmp_ordered("!=", r, zero),
                     b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", c, zero)))
        return b.select(fix, b.fadd(r, c), r)

    def _int_binary(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        b = self.builder
        if op == "add":
            return b.add(a, c)
        if op == "sub":
            return b.sub(a, c)
        if op == "mul":
            return b.mul(a, c)
        if op == "max":
            return b.select(b.icmp_signed(">", a, c), a, c)
        if op == "min":
            return b.select(b.icmp_signed("<", a, c), a, c)
        if op in ("floordiv", "mod"):
            return self._int_divmod(op, a, c)
        if op == "pow":
            return self._per_lane(lambda x, y: b.call(self._ipow(x.type), [x, y]), a, c)
        raise TccCompileError(f"internal error: integer operator {op}")

    def _per_lane(self, fn, *args: ir.Value) -> ir.Value:
        """Apply a scalar emitter lane by lane (for operations with no vector form)."""
        if not isinstance(args[0].type, ir.VectorType):
            return fn(*args)
        b = self.builder
        out = None
        for lane in range(args[0].type.count):
            r = fn(*(b.extract_element(a, ir.Constant(I32, lane)) for a in args))
            if out is None:
                out = ir.Constant(ir.VectorType(r.type, args[0].type.count), None)
            out = b.insert_element(out, r, ir.Constant(I32, lane))
        return out

    def _int_divmod(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        """Floor division / modulo; 0 for a zero divisor and no trap for MIN // -1 (as NumPy)."""
        b = self.builder
        if _positive_constant(c):
            return self._divmod_by_positive(op, a, c)
        ty = a.type
        zero, one, minus_one = _const(ty, 0), _const(ty, 1), _const(ty, -1)
        bad = b.or_(b.icmp_signed("==", c, zero), b.icmp_signed("==", c, minus_one))
        safe = b.select(bad, one, c)
        q = b.sdiv(a, safe)
        r = b.srem(a, safe)
        adjust = b.and_(b.icmp_signed("!=", r, zero), b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", c, zero)))
        if op == "floordiv":
            q = b.select(adjust, b.sub(q, one), q)
            special = b.select(b.icmp_signed("==", c, zero), zero, b.sub(zero, a))  # a // -1 == -a (wraps)
            return b.select(bad, special, q)
        r = b.select(adjust, b.add(r, c), r)
        return b.select(bad, zero, r)

    def _divmod_by_positive(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        """Floor division / modulo by a constant above zero (index arithmetic: im2col's ``k // 9``):
        no zero or -1 divisor to guard, so 5 instructions instead of 16 (LLVM folded the guards
        too, but its time grows with the IR it is given)."""
        b = self.builder
        q, r = b.sdiv(a, c), b.srem(a, c)
        negative = b.icmp_signed("<", r, _const(a.type, 0))
        if op == "floordiv":
            return b.select(negative, b.sub(q, _const(a.type, 1)), q)
        return b.select(negative, b.add(r, c), r)

    def _ipow(self, ty: ir.IntType) -> ir.Function:
        """An integer power helper (square and multiply), emitted once per module and type."""
        name = f"tcc.ipow.i{ty.width}"
        if name in self.module.globals:
            return self.module.globals[name]
        fn = ir.Function(self.module, ir.FunctionType(ty, [ty, ty]), name)
        fn.linkage = "internal"
        base, exp = fn.args
        entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
        b = ir.IRBuilder(entry)
        b.branch(loop)
        b.position_at_end(loop)
        acc = b.phi(ty)
        x = b.phi(ty)
        n = b.phi(ty)
        acc.add_incoming(ir.Constant(ty, 1), entry)
        x.add_incoming(base, entry)
        n.add_incoming(exp, entry)
        odd = b.trunc(n, I1)
        acc2 = b.select(odd, b.mul(acc, x), acc)
        n2 = b.ashr(n, ir.Constant(ty, 1))
        x2 = b.mul(x, x)
        acc.add_incoming(acc2, loop)
        x.add_incoming(x2, loop)
        n.add_incoming(n2, loop)
        b.cbranch(b.icmp_signed(">", n2, ir.Constant(ty, 0)), loop, done)
        b.position_at_end(done)
        result = b.phi(ty)
        result.add_incoming(acc2, loop)
        b.ret(result)
        return fn

    def _e_Call(self, e: Call) -> ir.Value:
        x = self._expr(e.args[0])
        b = self.builder
        if not e.dtype.is_float:  # abs / floor / ceil of an integer
            if e.fn == "abs":
                return b.select(b.icmp_signed("<", x, _const(x.type, 0)), b.sub(_const(x.type, 0), x), x)
            return x
        if e.dtype == dtypes.f16:  # compute in f32, round once
            wide = b.fpext(x, _like(x.type, ir.FloatType()))
            return b.fptrunc(self._math(e.fn, wide), _like(x.type, ir.HalfType()))
        return self._math(e.fn, x)

    def _math(self, fn: str, x: ir.Value) -> ir.Value:
        b = self.builder
        one = _const(x.type, 1.0)
        if fn == "exp" and isinstance(x.type, ir.VectorType) and str(x.type.element) == "float":
            return self._vector_exp(x)
        if fn == "erf" and isinstance(x.type, ir.VectorType) and str(x.type.element) == "float":
            return self._vector_erf(x)
        if fn in _INTRINSIC:
            return b.call(self._intrinsic("fabs" if fn == "abs" else fn, x.type), [x])
        if fn == "rsqrt":
            return b.fdiv(one, b.call(self._intrinsic("sqrt", x.type), [x]))
        if fn == "sigmoid":
            e = self._math("exp", b.fneg(x))
            return b.fdiv(one, b.fadd(one, e))
        if fn in _LIBM:
            def call(v: ir.Value) -> ir.Value:
                name = fn + ("f" if str(v.type) == "float" else "")
                return b.call(self._declare(name, ir.FunctionType(v.type, [v.type])), [v])
            return self._per_lane(call, x)
        raise TccCompileError(f"internal error: math function {fn}")

    def _vector_exp(self, x: ir.Value) -> ir.Value:
        """exp on f32 vectors without libm: 2**n * p(r), |r| <= ln2/2 (Cephes' expf, ~1 ulp).

        LLVM would otherwise call expf once per lane; this keeps softmax-like rows vectorised.
        With AVX-512 the scaling is one ``vscalefps``, which also overflows to inf, underflows
        through the subnormals to 0 and passes NaN on, so no fix-up selects are needed.
        """
        b = self.builder
        ty = x.type
        f = lambda v: _const(ty, v)  # noqa: E731
        scalef = _avx512()
        # clamp with selects that keep NaN (x86 max/min would drop it)
        xc = b.select(b.fcmp_ordered("<", x, f(-104.0)), f(-104.0), x)
        xc = b.select(b.fcmp_ordered(">", xc, f(89.0)), f(89.0), xc)
        n = b.call(self._intrinsic("floor", ty), [b.call(self._intrinsic("fmuladd", ty, 3),
                                                         [xc, f(1.44269504088896341), f(0.5)])])
        fma = self._intrinsic("fma", ty, 3)
        r = b.call(fma, [n, f(-0.693359375), xc])
        r = b.call(fma, [n, f(2.12194440e-4), r])
        p = f(1.9875691500e-4)
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = b.call(fma, [p, r, f(c)])
        p = b.call(fma, [p, b.fmul(r, r), b.fadd(r, f(1.0))])
        if scalef:
            return self._scalef(p, n)
        # 2**n for n in [-150, 129] as two normal powers of two, 2**(n//2) * 2**(n - n//2): the
        # first product is exact, the second rounds once, into the subnormals or to inf
        ity = ir.VectorType(I32, ty.count)
        ni = b.fptosi(n, ity)
        half = b.ashr(ni, _const(ity, 1))

        def pow2(k: ir.Value) -> ir.Value:
            return b.bitcast(b.shl(b.add(k, _const(ity, 127)), _const(ity, 23)), ty)
        y = b.fmul(b.fmul(p, pow2(half)), pow2(b.sub(ni, half)))
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _vector_erf(self, x: ir.Value) -> ir.Value:
        """erf on f32 vectors without libm: ``x * p(x**2) / q(x**2)`` on ``x`` clamped to [-4, 4]
        (Eigen's and TensorFlow's rational fit; within 4.5e-7 of erf, a few ulp, over all f32).

        LLVM would otherwise call erff once per lane: GELU's erf cost most of a transformer MLP
        layer's time. NaN passes through the clamp (selects, not x86 max/min) and the fit."""
        b = self.builder
        ty = x.type
        f = lambda v: _const(ty, v)  # noqa: E731
        xc = b.select(b.fcmp_ordered("<", x, f(-4.0)), f(-4.0), x)
        xc = b.select(b.fcmp_ordered(">", xc, f(4.0)), f(4.0), xc)
        x2 = b.fmul(xc, xc)
        fma = self._intrinsic("fma", ty, 3)
        p = f(-2.72614225801306e-10)
        for c in (2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05, -7.34990630326855e-04,
                  -2.95459980854025e-03, -1.60960333262415e-02):
            p = b.call(fma, [p, x2, f(c)])
        q = f(-1.45660718464996e-05)
        for c in (-2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02):
            q = b.call(fma, [q, x2, f(c)])
        return b.fdiv(b.fmul(xc, p), q)

    def _scalef(self, p: ir.Value, n: ir.Value) -> ir.Value:
        """``p * 2**n`` lane-wise (n integral floats) by AVX-512's vscalefps."""
        v16 = ir.VectorType(ir.FloatType(), 16)
        fn = self._declare("llvm.x86.avx512.mask.scalef.ps.512",
                           ir.FunctionType(v16, [v16, v16, v16, ir.IntType(16), I32]))
        return self._by16(lambda x, y: self.builder.call(fn, [x, y, x, ir.Constant(ir.IntType(16), -1),
                                                              ir.Constant(I32, 4)]), p, n)

    def _range(self, a: ir.Value, c: ir.Value, op: str) -> ir.Value:
        """IEEE maximum / minimum (NaN from either side, -0 < +0): ``vrangeps`` per 16 lanes (which
        drops a quiet NaN like maxNum) and a select of ``a + c`` where either is NaN; four
        instructions where ``llvm.maximum`` costs six on x86, most of a row max's loop body."""
        v16 = ir.VectorType(ir.FloatType(), 16)
        fn = self._declare("llvm.x86.avx512.mask.range.ps.512",
                           ir.FunctionType(v16, [v16, v16, I32, v16, ir.IntType(16), I32]))
        imm = ir.Constant(I32, 5 if op == "max" else 4)
        r = self._by16(lambda x, y: self.builder.call(fn, [x, y, imm, x, ir.Constant(ir.IntType(16), -1),
                                                           ir.Constant(I32, 4)]), a, c)
        return self.builder.select(self.builder.fcmp_unordered("uno", a, c), self.builder.fadd(a, c), r)

    def _by16(self, fn: Callable[[ir.Value, ir.Value], ir.Value], p: ir.Value, n: ir.Value) -> ir.Value:
        """``fn`` (a 16-lane AVX-512 intrinsic) over f32 vectors of any width: padded to a power of
        two times 16, 16 lanes at a time, and cut back."""
        b = self.builder
        count = p.type.count
        width = 16
        while width < count:
            width *= 2
        parts = []
        for lo in range(0, width, 16):
            lanes = _lanes([i % count for i in range(lo, lo + 16)])
            parts.append(fn(b.shuffle_vector(p, p, lanes), b.shuffle_vector(n, n, lanes)))
        while len(parts) > 1:
            parts = [b.shuffle_vector(a, c, _lanes(range(2 * a.type.count))) for a, c in zip(parts[::2], parts[1::2])]
        return parts[0] if count == 16 else b.shuffle_vector(parts[0], parts[0], _lanes(range(count)))


def stream_bytes() -> int:
    """Results at least this large take non-temporal stores: ``STREAM_L2S`` times L2 (8 MiB on
    the development host, where a 4096x1024 softmax and layernorm got 5-15% faster that way)."""
    from tcc.passes.autoschedule_cpu.schedule import host_caches

    return STREAM_L2S * host_caches()[2]


def _streamed_outputs(func: LoopFunc) -> set[str]:
    """Results the kernel only writes and that are too large to stay in cache, on x86 hosts
    with AVX-512: their unit-stride vector stores bypass the cache."""
    if not _avx512():
        return set()
    read = {ld.buffer for ld in loads(func.body)}
    return {p.name for p in func.params if isinstance(p, Buffer) and p.name not in read
            and p.size * p.dtype.itemsize >= stream_bytes()}


def _against_constant(lhs: Expr | None, rhs: Expr, a: ir.Value, c: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """(x, k) for ``max``/``min`` of a value and a non-NaN constant, else None: ``x > k ? x : k``
    with an unordered compare (so a NaN ``x`` comes through, and ``max(-0.0, 0.0)`` is ``0.0``)
    is the IEEE maximum there, in two instructions where the general case needs four."""
    for const, x, k in ((rhs, a, c), (lhs, c, a)):
        if isinstance(const, Const) and const.value == const.value:  # not NaN
            return x, k
    return None


def _spreads(stride: int | None, lanes: int) -> bool:
    """Whether lanes ``stride`` apart load as one wide masked load and a shuffle: small strides,
    and vectors of 16 lanes or more (a 14-lane stride-2 conv row measured slower than a gather)."""
    return stride is not None and 1 < stride <= MAX_SPREAD_STRIDE and lanes >= 16


def _lanes(indices: range | list[int]) -> ir.Constant:
    """A shufflevector mask."""
    return ir.Constant(ir.VectorType(I32, len(indices)), list(indices))


@functools.cache
def _avx512() -> bool:
    """Whether the host (every kernel's target: see jit.host) has AVX-512F and DQ (vrangeps)."""
    from tcc.codegen_cpu.jit import host

    features = host()[2].split(",")
    return "+avx512f" in features and "+avx512dq" in features


def _peel_allocates(s: Stmt) -> tuple[Stmt, list[Buffer]]:
    """The body under a parallel loop's leading allocations, and those buffers."""
    bufs = []
    while isinstance(s, Allocate):
        bufs.append(s.buffer)
        s = s.body
    return s, bufs


def _conjuncts(e: Expr) -> set[Expr]:
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) | _conjuncts(e.b)
    return {e}


def _unclamped(indices: tuple[Expr, ...], facts: set[Expr]) -> tuple[Expr, ...] | None:
    """``indices`` with each ``min(max(i, 0), n - 1)`` replaced by ``i`` when ``facts`` hold
    ``i >= 0`` and ``i < n``; None when there is no clamp or one is not implied."""
    out, found = [], False
    for idx in indices:
        if isinstance(idx, Binary) and idx.op == "min" and isinstance(idx.a, Binary) and idx.a.op == "max" \
                and isinstance(idx.b, Const) and idx.a.b == Const(0, idx.dtype):
            inner = idx.a.a
            lo = Binary("ge", inner, Const(0, idx.dtype), dtypes.boolean)
            hi = Binary("lt", inner, Const(idx.b.value + 1, idx.dtype), dtypes.boolean)
            if lo not in facts or hi not in facts:
                return None
            out.append(inner)
            found = True
        else:
            out.append(idx)
    return tuple(out) if found else None


def _const(ty: ir.Type, value: int | float) -> ir.Constant:
    """A constant of a scalar or vector type (splatted)."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)


def _positive_constant(value: ir.Value) -> bool:
    """Whether ``value`` is an integer constant above zero (a scalar, or a vector of them)."""
    if not isinstance(value, ir.Constant):
        return False
    lanes = value.constant if isinstance(value.constant, list) else [value]
    return all(isinstance(v, ir.Constant) and type(v.constant) is int and v.constant > 0 for v in lanes)


def _like(ty: ir.Type, elem: ir.Type) -> ir.Type:
    """``elem``, as a vector when ``ty`` is one."""
    return ir.VectorType(elem, ty.count) if isinstance(ty, ir.VectorType) else elem


def _type_suffix(ty: ir.Type) -> str:
    """The overload suffix of an LLVM intrinsic for ``ty``: ``f32``, ``v8f64``, ``v16i8``, ..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_type_suffix(ty.element)}"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    return {"half": "f16", "float": "f32", "double": "f64"}[str(ty)]


def _const_extent(s: For) -> int:
    if not isinstance(s.extent, Const):
        raise TccCompileError(f"internal error: {s.kind} loop {s.var.name} has a non-constant extent", s.span)
    return int(s.extent.value)


@functools.cache
def threads_available() -> bool:
    """Whether libgomp (the thread team parallel loops run on) could be loaded into the process."""
    from tcc.codegen_cpu.jit import load_thread_runtime

    return load_thread_runtime()
