"""Translate a :class:`~tcc.ir.loops.LoopFunc` into an LLVM module with llvmlite.ir.

The kernel's signature is ``i32 NAME(ptr args)``: ``args`` is an array of pointers, one per
parameter (a buffer's data, or a pointer to a scalar's value), so one ctypes prototype fits
every op. It returns 0, or 1 when an intermediate could not be allocated.

Codegen decides nothing: loops, buffers and their scopes come from the loop IR as is.
Arithmetic follows the language (NumPy) semantics: integer ``//`` and ``%`` floor and give 0
on division by zero (never a trap), float ``max``/``min`` propagate NaN, bools live in memory
as bytes.

The function builder is split by what it emits: this module holds the function itself, memory,
loads and stores (vector, masked, streaming); :mod:`.llvm_loops` the loops, parallel regions and
buffers; :mod:`.llvm_math` the arithmetic and math functions; :mod:`.llvm_types` what they share.
"""

from __future__ import annotations

import contextlib

from llvmlite import ir
from llvmlite.ir import instructions as ir_instructions

from tcc import dtypes
from tcc.codegen_cpu.llvm_loops import LoopEmitter
from tcc.codegen_cpu.llvm_math import MathEmitter
from tcc.codegen_cpu.llvm_types import (
    I1,
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
from tcc.ir.expr import Binary, Cast, Const, Expr, Load, Select, Unary, Var, free_vars
from tcc.ir.loops import Buffer, LoopFunc, Stmt, Store
from tcc.passes.loops.loopnest import flat_coeff, flat_terms
from tcc.target import CpuTarget

MAX_SPREAD_STRIDE = 4  # lanes this far apart load as one wider masked load and a shuffle
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


class _FunctionBuilder(LoopEmitter, MathEmitter):
    """Emits one kernel; parallel loop bodies become outlined functions run by libgomp."""

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
            term = self._imul(self._scalar(idx), ir.Constant(I64, stride), NSW)
            offset = term if offset is None else self._iadd(offset, term, NSW)
            stride *= dim
        return offset if offset is not None else ir.Constant(I64, 0)

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
        if stride is not None and 1 < stride <= MAX_SPREAD_STRIDE:
            ptr = self._element(buf, base, e.indices, lane0=True)
            return self._from_memory(self._strided_load(ptr, vty, stride, buf.dtype.itemsize), buf.dtype)
        interleaved = self._interleaved_load(buf, base, e.indices, vty)
        if interleaved is not None:
            return self._from_memory(interleaved, buf.dtype)
        out = splat_constant(ty, lanes, None)
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
        size = buf.dtype.itemsize
        if stride == 1:
            return self._masked_load(ptr, vty, mask, other, size)
        if _spreads(stride, lanes):
            return self._spread_load(ptr, vty, stride, mask, other, size)
        offsets = ir.Constant(ir.VectorType(I64, lanes), [lane * stride * size for lane in range(lanes)])
        pty = ir.VectorType(PTR, lanes)
        ptrs = b.inttoptr(b.add(self._splat(b.ptrtoint(ptr, I64), lanes), offsets), pty)
        fn = self._declare(f"llvm.masked.gather.{type_suffix(vty)}.v{lanes}p0",
                           ir.FunctionType(vty, [pty, I32, mask.type, vty]))
        return b.call(fn, [ptrs, ir.Constant(I32, size), mask, other])

    def _interleaved_load(self, buf: Buffer, base: ir.Value, indices: tuple[Expr, ...],
                          vty: ir.VectorType) -> ir.Value | None:
        """Lanes whose address reads the vector index ``v`` as ``v // 2`` and ``v % 2`` (a row of
        Winograd's 2x2 output tiles: even columns from one tile element, odd from the other):
        each residue's lanes are ``v // 2``-affine, so they load as one vector (contiguous, spread
        or a splat) and a shuffle interleaves the two. Per lane it was a scalar load and an insert
        each (126 ``vinsertps`` in one output transform). None: not this form."""
        var, lanes = self.vec[0], vty.count
        flat = flat_terms(indices, buf.shape)
        if flat is None or lanes % 2:
            return None
        step = 0  # elements between lanes 2q + r and 2q + 2 + r
        for atom, coef in flat.atoms.items():
            if isinstance(atom, Var) and atom.name == var:
                step += 2 * coef
            elif isinstance(atom, Binary) and atom.op in ("floordiv", "mod") and isinstance(atom.b, Const) \
                    and atom.b.value == 2 and _lane_plus_even(atom.a, var):
                step += coef if atom.op == "floordiv" else 0
            elif var in free_vars(atom):
                return None
        half = ir.VectorType(vty.element, lanes // 2)
        if not 0 <= step <= MAX_SPREAD_STRIDE:
            return None
        parts = []
        for residue in (0, 1):
            with self._lane(residue):
                ptr = self._element(buf, base, indices, lane0=True)
            align = buf.dtype.itemsize
            if step == 0:
                parts.append(self._splat(self.builder.load(ptr, typ=vty.element, align=align), half.count))
            elif step == 1:
                parts.append(self.builder.load(ptr, typ=half, align=align))
            else:
                parts.append(self._strided_load(ptr, half, step, align))
        return self.builder.shuffle_vector(parts[0], parts[1],
                                           lane_mask([lane % 2 * half.count + lane // 2 for lane in range(lanes)]))

    def _strided_load(self, ptr: ir.Value, vty: ir.VectorType, stride: int, align: int) -> ir.Value:
        """Lanes ``stride`` elements apart, unguarded. 16 lanes or more (a pooling window's row):
        one masked load of ``lanes * stride`` elements (see ``_spread_load``). Fewer (Winograd's
        stride-2 tile columns, 14 or 7 lanes): one plain load from the first lane's element to
        the last's, then a shuffle; nothing outside that range is touched. A lane at a time
        (before) it was a scalar load and an insert each."""
        b = self.builder
        if _spreads(stride, vty.count):
            every = splat_constant(I1, vty.count, True)
            return self._spread_load(ptr, vty, stride, every, splat_constant(vty.element, vty.count, None), align)
        span = ir.VectorType(vty.element, (vty.count - 1) * stride + 1)
        loaded = b.load(ptr, typ=span, align=align)
        return b.shuffle_vector(loaded, loaded, lane_mask([lane * stride for lane in range(vty.count)]))

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
        off = splat_constant(I1, lanes, False)
        wmask = b.shuffle_vector(mask, off, lane_mask(picks))
        wother = b.shuffle_vector(other, other, lane_mask([t // stride for t in range(wide)]))
        loaded = self._masked_load(ptr, wty, wmask, wother, align)
        return b.shuffle_vector(loaded, loaded, lane_mask([lane * stride for lane in range(lanes)]))

    def _masked_load(self, ptr: ir.Value, vty: ir.VectorType, mask: ir.Value, other: ir.Value,
                     align: int) -> ir.Value:
        """``llvm.masked.load`` of ``vty``, widened to whole 32-byte registers (lanes past ``vty``
        masked off, so never touched) and shuffled back. LLVM's x86 lowering of a masked load whose
        last piece is narrower than a register lost that piece's lanes on AVX2: lanes 16-17 of an
        18-lane load (fuzz seed 140268, a depthwise conv with padding 2) and lanes 4-5 of one split
        as 4 + 2 (seed 150073) read garbage, while whole registers load right."""
        b = self.builder
        lanes = vty.count
        full = max(1, 32 // align)  # lanes of a 32-byte register (``align`` is the element's size)
        wide = -(-lanes // full) * full
        if wide == lanes:
            fn = self._declare(f"llvm.masked.load.{type_suffix(vty)}.p0",
                               ir.FunctionType(vty, [PTR, I32, mask.type, vty]))
            return b.call(fn, [ptr, ir.Constant(I32, align), mask, other])
        wty = ir.VectorType(vty.element, wide)
        pad = list(range(lanes)) + [lanes] * (wide - lanes)  # (lane ``lanes``: the second operand's first)
        wmask = b.shuffle_vector(mask, splat_constant(I1, lanes, False), lane_mask(pad))
        wother = b.shuffle_vector(other, other, lane_mask([min(i, lanes - 1) for i in range(wide)]))
        fn = self._declare(f"llvm.masked.load.{type_suffix(wty)}.p0",
                           ir.FunctionType(wty, [PTR, I32, wmask.type, wty]))
        loaded = b.call(fn, [ptr, ir.Constant(I32, align), wmask, wother])
        return b.shuffle_vector(loaded, loaded, lane_mask(list(range(lanes))))

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


def _spreads(stride: int | None, lanes: int) -> bool:
    """Whether lanes ``stride`` apart load as one wide masked load and a shuffle: small strides,
    and vectors of 16 lanes or more (a 14-lane stride-2 conv row measured slower than a gather)."""
    return stride is not None and 1 < stride <= MAX_SPREAD_STRIDE and lanes >= 16


def _lane_plus_even(e: Expr, var: str) -> bool:
    """Whether ``e`` is ``var`` plus even terms (``32 * o + v``, ``32 + v``): then ``e % 2`` is
    ``var % 2`` and ``e // 2`` grows by one as ``var`` grows by two."""
    terms = flat_terms((e,), (1,))
    if terms is None or terms.constant % 2:
        return False
    for atom, k in terms.atoms.items():
        if isinstance(atom, Var) and atom.name == var:
            if k != 1:
                return False
        elif var in free_vars(atom) or k % 2:
            return False
    return any(isinstance(atom, Var) and atom.name == var for atom in terms.atoms)


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
