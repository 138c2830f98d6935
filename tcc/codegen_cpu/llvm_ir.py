"""Translate a :class:`~tcc.ir.loops.LoopFunc` into an LLVM module with llvmlite.ir.

The kernel's signature is ``i32 NAME(ptr args)``: ``args`` is an array of pointers, one per
parameter (a buffer's data, or a pointer to a scalar's value), so one ctypes prototype fits
every op. It returns 0, or 1 when an intermediate could not be allocated.

Codegen decides nothing: loops, buffers and their scopes come from the loop IR as is.
Arithmetic follows the language (NumPy) semantics: integer ``//`` and ``%`` floor and give 0
on division by zero (never a trap), float ``max``/``min`` propagate NaN, bools live in memory
as bytes.

The function builder is split by what it emits: this module holds the function itself, memory,
stores (vector, masked, streaming) and addresses; :mod:`.llvm_loads` the loads; :mod:`.llvm_loops`
the loops, parallel regions and buffers; :mod:`.llvm_math` the arithmetic and math functions;
:mod:`.llvm_types` what they share.
"""

from __future__ import annotations

import contextlib

from llvmlite import ir
from llvmlite.ir import instructions as ir_instructions

from tcc import dtypes
from tcc.codegen_cpu.llvm_loads import LoadEmitter
from tcc.codegen_cpu.llvm_loops import LoopEmitter
from tcc.codegen_cpu.llvm_math import MathEmitter
from tcc.codegen_cpu.llvm_types import (
    I8,
    I32,
    I64,
    ICMP,
    PTR,
    int_vector,
    lane_mask,
    like,
    llvm_const,
    local_name,
    memory_type,
    splat_constant,
    type_suffix,
    value_type,
)
from tcc.dtypes import DType
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Cast, Const, Expr, Unary, Var, free_vars
from tcc.ir.loopnest import buffer_elements, flat_coeff, flat_terms
from tcc.ir.loops import Buffer, LoopFunc, Stmt, Store
from tcc.target import CpuTarget

CACHE_LINE = 64
NSW = ("nsw",)  # index arithmetic does not wrap


def build_module(func: LoopFunc, target: CpuTarget) -> ir.Module:
    """The kernel as an LLVM module; ``target``'s features choose its intrinsics (AVX-512)."""
    module = ir.Module(name=func.name)  # the JIT sets the triple and data layout of its target machine
    _FunctionBuilder(module, func, target).build()
    prepare = func.attrs.get("prepare")
    if isinstance(prepare, LoopFunc):  # work on constant parameters, run once before the kernel
        _FunctionBuilder(module, prepare, target).build()
    return module


def symbol_name(func: LoopFunc) -> str:
    return f"tcc_{func.name}"


class _FunctionBuilder(LoadEmitter, LoopEmitter, MathEmitter):
    """Emits one kernel; parallel loop bodies become outlined functions run by the thread pool."""

    def __init__(self, module: ir.Module, func: LoopFunc, target: CpuTarget):
        self.module = module
        self.func = func
        self.avx512 = target.avx512
        self.contract = bool(func.attrs.get("fp_contract"))
        fnty = ir.FunctionType(I32, [PTR])
        self.fn = ir.Function(module, fnty, symbol_name(func))
        self.fn.args[0].name = "args"
        self.entry = self.fn.append_basic_block("entry")
        self.builder = ir.IRBuilder(self.entry)
        self.vars: dict[str, ir.Value] = {}
        self.extents: dict[str, int] = {}  # constant extents of the loop indices in scope
        self.buffers: dict[str, tuple[Buffer, ir.Value]] = {}
        self.status: ir.Value | None = None  # set inside outlined bodies: where to report failure
        self.vec: tuple[str, int] | None = None  # (var, lanes) inside a vector loop
        self.lane0 = False  # evaluate the vector var as its first lane (address computations)
        self.outlined = 0
        self.streamed = set(func.attrs.get("streamed", ()))  # marked by the schedule

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
        for name, nbytes in self.func.attrs.get("streamed_from", ()):  # type: ignore[attr-defined]
            buf = self.buffers[name][0]  # (a dynamic size: streamed where it is large at this call)
            size = b.mul(self._count(buffer_elements(buf.shape)), ir.Constant(I64, buf.dtype.itemsize))
            self.vars[f"{name}.streamed"] = b.icmp_signed(">=", size, ir.Constant(I64, nbytes))
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
                self._streaming_store(value, ptr, buf.dtype.itemsize, self.vars.get(f"{s.buffer}.streamed"))
            else:
                self._raw_store(value, ptr, buf.dtype.itemsize)
            return
        for lane in range(lanes):  # a scatter, one lane at a time
            with self._lane(lane):
                ptr = self._element(buf, base, s.indices, lane0=True)
            elem = self._lane_value(value, lane)
            self.builder.store(self._to_memory(elem, buf.dtype), ptr, align=buf.dtype.itemsize)

    def _streaming_store(self, value: ir.Value, ptr: ir.Value, itemsize: int, large: ir.Value | None = None) -> None:
        """A non-temporal store where ``ptr`` is cache-line aligned (else a plain one): the line
        is written without first being read (a third less memory traffic for ``relu(a*b + c)``)
        and does not evict what the loop reads. The branch goes one way for the whole loop."""
        b = self.builder
        aligned = b.icmp_unsigned("==", b.and_(b.ptrtoint(ptr, I64), ir.Constant(I64, CACHE_LINE - 1)),
                                  ir.Constant(I64, 0))
        if large is not None:  # (a result of a dynamic size: streamed where this call's is large)
            aligned = b.and_(aligned, large)
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


    # ------------------------------------------------------------ memory
    def _element(self, buf: Buffer, base: ir.Value, indices: tuple[Expr, ...], lane0: bool = False,
                 inbounds: bool = True) -> ir.Value:
        """Address of an element; with ``lane0`` the vector index counts as its current lane.
        ``inbounds=False`` for a masked access, whose first lane may lie outside the buffer (a
        padded patch row starts before its image): an inbounds address there is poison."""
        saved, self.lane0 = self.lane0, lane0 or self.lane0
        try:
            return self.builder.gep(base, [self._flat_index(buf, indices)], inbounds=inbounds,
                                    source_etype=memory_type(buf.dtype))
        finally:
            self.lane0 = saved

    def _flat_index(self, buf: Buffer, indices: tuple[Expr, ...]) -> ir.Value:
        """The row-major offset of ``indices``. Where a row and a column of one flat index meet
        again (im2col's ``k // 9 * 9 + k // 3 % 3 * 3 + k % 3`` is ``k``) it is summed as
        multiples of its atoms: that index arithmetic was a third of a convolution's IR, which LLVM
        took long to fold (with its unroller on outer loops too, the smaller loops were unrolled
        further and the object grew: see ``llvm_loops._holds_loop``). Elsewhere index by index,
        innermost first (LLVM's loop strength reduction took 5x longer on a GEMM's offsets summed
        atom by atom)."""
        flat = flat_terms(indices, buf.shape)
        if flat is not None and flat.recombined:
            offset = None
            for atom, coef in flat.atoms.items():
                term = self._imul(self._scalar(atom), ir.Constant(I64, coef), NSW)
                offset = term if offset is None else self._iadd(offset, term, NSW)
            if offset is None:
                return ir.Constant(I64, flat.constant)
            return self._iadd(offset, ir.Constant(I64, flat.constant), NSW)
        offset, stride = None, 1
        for idx, dim in reversed(list(zip(indices, buf.shape))):
            term = self._imul(self._scalar(idx), self._count(stride), NSW)
            offset = term if offset is None else self._iadd(offset, term, NSW)
            stride = buffer_elements((stride, dim))
        return offset if offset is not None else ir.Constant(I64, 0)

    def _count(self, n: int | Expr) -> ir.Value:
        """A size or stride: a constant, or computed from the dynamic shape symbols (kernel arguments)."""
        return ir.Constant(I64, n) if isinstance(n, int) else self._scalar(n)

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
        elements = buffer_elements(buf.shape)
        if isinstance(elements, int):
            size = ir.Constant(I64, max(64, -(-elements * buf.dtype.itemsize // 64) * 64))
        else:  # rounded up to whole cache lines (aligned_alloc's rule), at least one
            nbytes = b.mul(self._count(elements), ir.Constant(I64, buf.dtype.itemsize))
            lines = b.udiv(b.add(nbytes, ir.Constant(I64, 63)), ir.Constant(I64, 64))
            lines = b.select(b.icmp_unsigned("==", lines, ir.Constant(I64, 0)), ir.Constant(I64, 1), lines)
            size = b.mul(lines, ir.Constant(I64, 64))
        ptr = b.call(alloc, [ir.Constant(I64, 64), size], name=local_name(buf.name))
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
        return self._declare(f"llvm.{name}.{type_suffix(ty)}", ir.FunctionType(ty, [ty] * nargs))

    def _from_memory(self, value: ir.Value, dtype: DType) -> ir.Value:
        if not dtype.is_bool:
            return value
        return self.builder.icmp_unsigned("!=", value, llvm_const(value.type, 0))

    def _to_memory(self, value: ir.Value, dtype: DType) -> ir.Value:
        if not dtype.is_bool:
            return value
        return self.builder.zext(value, like(value.type, I8))

    # ------------------------------------------------------------ vectors
    def _splat(self, value: ir.Value, lanes: int) -> ir.Value:
        if isinstance(value.type, ir.VectorType):
            return value
        if isinstance(value, ir.Constant) and isinstance(value.constant, int | float):
            return splat_constant(value.type, lanes, value.constant)
        b = self.builder
        zeros = splat_constant(value.type, lanes, None)
        one = b.insert_element(zeros, value, ir.Constant(I32, 0))
        return b.shuffle_vector(one, zeros, lane_mask((0,) * lanes))

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
            iota = int_vector(I64, tuple(range(lanes)))
            return self.builder.add(self._splat(value, lanes), iota)
        return value

    def _e_Binary(self, e: Binary) -> ir.Value:
        lanes = self._lane_compare(e)
        return lanes if lanes is not None else MathEmitter._e_Binary(self, e)

    def _lane_compare(self, e: Binary) -> ir.Value | None:
        """An i64 comparison affine in the vector index (a padding test on a patch row's lanes,
        ``x_v*2 + s - 1 >= 0``) as ``c * lane OP base``: a constant i32 vector against one
        scalar, clamped to i32 (``|c * lane| < 2^30``, so the clamp keeps every outcome). The
        i64 form costs 7 registers and a dozen ops per 28 lanes, and LLVM re-evaluated it in
        the loop of rows; this one is 4 compares it hoists. None where it does not apply."""
        if self.vec is None or self.lane0 or e.op not in ICMP or e.a.dtype != dtypes.i64:
            return None
        coef = _lane_coefficient(e.a, self.vec[0]), _lane_coefficient(e.b, self.vec[0])
        if None in coef or coef[0] == coef[1]:
            return None
        c, lanes = coef[0] - coef[1], self.vec[1]
        if abs(c) * lanes >= 1 << 30:
            return None
        saved, self.lane0 = self.lane0, True
        try:
            left, right = self._expr(e.a), self._expr(e.b)
        finally:
            self.lane0 = saved
        b = self.builder
        bound = b.sub(right, left)  # lane l compares c*l with right - left (both at lane 0)
        low, high = ir.Constant(I64, -(1 << 31)), ir.Constant(I64, (1 << 31) - 1)
        bound = b.select(b.icmp_signed("<", bound, low), low, bound)
        bound = b.select(b.icmp_signed(">", bound, high), high, bound)
        steps = int_vector(I32, tuple(c * lane for lane in range(lanes)))
        return b.icmp_signed(ICMP[e.op], steps, self._splat(b.trunc(bound, I32), lanes))

    def _e_Unary(self, e: Unary) -> ir.Value:
        a = self._expr(e.a)
        b = self.builder
        if e.op == "not":
            return b.xor(a, llvm_const(a.type, 1))
        return b.fneg(a) if e.dtype.is_float else b.sub(llvm_const(a.type, 0), a)

    def _e_Cast(self, e: Cast) -> ir.Value:
        return self._convert(self._expr(e.a), e.a.dtype, e.dtype)

    def _convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        b = self.builder
        if src == dst:
            return v
        to = like(v.type, value_type(dst))
        if dst.is_bool:
            zero = llvm_const(v.type, 0.0 if src.is_float else 0)
            return b.fcmp_unordered("!=", v, zero) if src.is_float else b.icmp_unsigned("!=", v, zero)
        if src.is_bool:
            return b.uitofp(v, to) if dst.is_float else b.zext(v, to)
        if src.is_float and dst.is_float:
            return b.fpext(v, to) if dst.bits > src.bits else b.fptrunc(v, to)
        if src.is_float:  # the language's rule: truncate, saturate to i64 (NaN: 0), wrap to the width
            wide = like(v.type, ir.IntType(64))
            sat = b.call(self._declare(f"llvm.fptosi.sat.{type_suffix(wide)}.{type_suffix(v.type)}",
                                       ir.FunctionType(wide, [v.type])), [v])
            return sat if dst.bits == 64 else b.trunc(sat, to)
        if dst.is_float:
            return b.sitofp(v, to)
        if dst.bits > src.bits:
            return b.sext(v, to)
        return b.trunc(v, to)


def _lane_coefficient(e: Expr, var: str) -> int | None:
    """``c`` where ``e`` is ``c * var`` plus terms free of ``var``; None otherwise."""
    terms = flat_terms((e,), (1,))
    if terms is None:
        return None
    coef = 0
    for atom, k in terms.atoms.items():
        if isinstance(atom, Var) and atom.name == var:
            coef += k
        elif var in free_vars(atom):
            return None
    return coef
