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

from llvmlite import ir

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Unary, Var
from tcc.ir.loops import Allocate, Barrier, Buffer, For, If, Let, LoopFunc, Seq, Stmt, Store

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()

_FLOAT_TYPES = {"f16": ir.HalfType(), "f32": ir.FloatType(), "f64": ir.DoubleType()}
_INT_TYPES = {"i8": I8, "i32": I32, "i64": I64}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_LIBM = {"tanh", "erf"}
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


def symbol_name(func: LoopFunc) -> str:
    return f"tcc_{func.name}"


class _FunctionBuilder:
    def __init__(self, module: ir.Module, func: LoopFunc):
        self.module = module
        self.func = func
        fnty = ir.FunctionType(I32, [PTR])
        self.fn = ir.Function(module, fnty, symbol_name(func))
        self.fn.args[0].name = "args"
        self.entry = self.fn.append_basic_block("entry")
        self.builder = ir.IRBuilder(self.entry)
        self.vars: dict[str, ir.Value] = {}
        self.buffers: dict[str, tuple[Buffer, ir.Value]] = {}
        self.oom_block: ir.Block | None = None

    # ------------------------------------------------------------ structure
    def build(self) -> None:
        b = self.builder
        for i, param in enumerate(self.func.params):
            slot = b.gep(self.fn.args[0], [ir.Constant(I64, i)], source_etype=PTR)
            ptr = b.load(slot, typ=PTR, name=f"{param.name}.ptr")
            if isinstance(param, Buffer):
                self.buffers[param.name] = (param, ptr)
            else:
                value = b.load(ptr, typ=memory_type(param.dtype), name=param.name)
                self.vars[param.name] = self._from_memory(value, param.dtype)
        self._stmt(self.func.body)
        b.ret(ir.Constant(I32, 0))

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
        b = self.builder
        extent = self._expr(s.extent)
        pre = b.block
        header = self.fn.append_basic_block(f"{s.var.name}.header")
        body = self.fn.append_basic_block(f"{s.var.name}.body")
        exit_ = self.fn.append_basic_block(f"{s.var.name}.exit")
        b.branch(header)
        b.position_at_end(header)
        idx = b.phi(I64, name=s.var.name)
        idx.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", idx, extent), body, exit_)
        b.position_at_end(body)
        saved = self.vars.get(s.var.name)
        self.vars[s.var.name] = idx
        self._stmt(s.body)
        nxt = b.add(idx, ir.Constant(I64, 1), name=f"{s.var.name}.next", flags=["nsw", "nuw"])
        latch = b.block
        b.branch(header)
        idx.add_incoming(nxt, latch)
        b.position_at_end(exit_)
        if saved is not None:
            self.vars[s.var.name] = saved
        else:
            del self.vars[s.var.name]

    def _s_Store(self, s: Store) -> None:
        buf, base = self.buffers[s.buffer]
        value = self._expr(s.value)
        ptr = self._element(buf, base, s.indices)
        self.builder.store(self._to_memory(value, buf.dtype), ptr, align=buf.dtype.itemsize)

    def _s_Allocate(self, s: Allocate) -> None:
        buf = s.buffer
        b = self.builder
        elem = memory_type(buf.dtype)
        if buf.scope == "local":
            with b.goto_block(self.entry):
                b.position_at_start(self.entry)
                ptr = b.alloca(elem, size=ir.Constant(I64, max(1, buf.size)), name=buf.name)
                ptr.align = max(16, buf.dtype.itemsize)
        else:
            ptr = self._malloc(buf)
        self.buffers[buf.name] = (buf, ptr)
        self._stmt(s.body)
        if buf.scope != "local":
            self._free(ptr)
        del self.buffers[buf.name]

    def _s_If(self, s: If) -> None:
        cond = self._expr(s.cond)
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
        self.vars[s.var.name] = self._expr(s.value)
        self._stmt(s.body)
        del self.vars[s.var.name]

    # ------------------------------------------------------------ memory
    def _element(self, buf: Buffer, base: ir.Value, indices: tuple[Expr, ...]) -> ir.Value:
        b = self.builder
        flat = None
        stride = 1
        for idx, dim in reversed(list(zip(indices, buf.shape))):
            term = self._expr(idx)
            if stride != 1:
                term = b.mul(term, ir.Constant(I64, stride), flags=["nsw"])
            flat = term if flat is None else b.add(flat, term, flags=["nsw"])
            stride *= dim
        if flat is None:
            flat = ir.Constant(I64, 0)
        return b.gep(base, [flat], inbounds=True, source_etype=memory_type(buf.dtype))

    def _malloc(self, buf: Buffer) -> ir.Value:
        b = self.builder
        malloc = self._declare("malloc", ir.FunctionType(PTR, [I64]))
        ptr = b.call(malloc, [ir.Constant(I64, max(1, buf.size * buf.dtype.itemsize))], name=buf.name)
        failed = b.icmp_unsigned("==", ptr, ir.Constant(PTR, None))
        with b.if_then(failed, likely=False):
            b.ret(ir.Constant(I32, 1))
        return ptr

    def _free(self, ptr: ir.Value) -> None:
        free = self._declare("free", ir.FunctionType(ir.VoidType(), [PTR]))
        self.builder.call(free, [ptr])

    def _declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        return existing if existing is not None else ir.Function(self.module, fnty, name)

    def _intrinsic(self, name: str, ty: ir.Type, nargs: int = 1) -> ir.Function:
        suffix = {"half": "f16", "float": "f32", "double": "f64"}[str(ty)]
        return self._declare(f"llvm.{name}.{suffix}", ir.FunctionType(ty, [ty] * nargs))

    def _from_memory(self, value: ir.Value, dtype: DType) -> ir.Value:
        return self.builder.icmp_unsigned("!=", value, ir.Constant(I8, 0)) if dtype.is_bool else value

    def _to_memory(self, value: ir.Value, dtype: DType) -> ir.Value:
        return self.builder.zext(value, I8) if dtype.is_bool else value

    # ------------------------------------------------------------ expressions
    def _expr(self, e: Expr) -> ir.Value:
        method = getattr(self, f"_e_{type(e).__name__}", None)
        if method is None:
            raise TccCompileError(f"internal error: the CPU backend cannot lower {type(e).__name__}")
        return method(e)

    def _e_Const(self, e: Const) -> ir.Value:
        return ir.Constant(value_type(e.dtype), int(e.value) if not e.dtype.is_float else float(e.value))

    def _e_Var(self, e: Var) -> ir.Value:
        return self.vars[e.name]

    def _e_Load(self, e: Load) -> ir.Value:
        buf, base = self.buffers[e.buffer]
        ptr = self._element(buf, base, e.indices)
        value = self.builder.load(ptr, typ=memory_type(buf.dtype), align=buf.dtype.itemsize)
        return self._from_memory(value, buf.dtype)

    def _e_Select(self, e: Select) -> ir.Value:
        return self.builder.select(self._expr(e.cond), self._expr(e.a), self._expr(e.b))

    def _e_Unary(self, e: Unary) -> ir.Value:
        a = self._expr(e.a)
        b = self.builder
        if e.op == "not":
            return b.xor(a, ir.Constant(I1, 1))
        return b.fneg(a) if e.dtype.is_float else b.neg(a)

    def _e_Cast(self, e: Cast) -> ir.Value:
        return self._convert(self._expr(e.a), e.a.dtype, e.dtype)

    def _convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        b = self.builder
        if src == dst:
            return v
        to = value_type(dst)
        if dst.is_bool:
            zero = ir.Constant(v.type, 0.0 if src.is_float else 0)
            return b.fcmp_unordered("!=", v, zero) if src.is_float else b.icmp_unsigned("!=", v, zero)
        if src.is_bool:
            return b.uitofp(v, to) if dst.is_float else b.zext(v, to)
        if src.is_float and dst.is_float:
            return b.fpext(v, to) if dst.bits > src.bits else b.fptrunc(v, to)
        if src.is_float:
            return b.fptosi(v, to)
        if dst.is_float:
            return b.sitofp(v, to)
        if dst.bits > src.bits:
            return b.sext(v, to)
        return b.trunc(v, to)

    def _e_Binary(self, e: Binary) -> ir.Value:
        a, c = self._expr(e.a), self._expr(e.b)
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
            return self._float_binary(e.op, a, c, e.b)
        return self._int_binary(e.op, a, c)

    def _float_binary(self, op: str, a: ir.Value, c: ir.Value, rhs: Expr) -> ir.Value:
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
        zero, one, half = (ir.Constant(a.type, v) for v in (0.0, 1.0, 0.5))
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
        zero = ir.Constant(a.type, 0.0)
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
            return b.call(self._ipow(a.type), [a, c])
        raise TccCompileError(f"internal error: integer operator {op}")

    def _int_divmod(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        """Floor division / modulo; 0 for a zero divisor and no trap for MIN // -1 (as NumPy)."""
        b = self.builder
        ty = a.type
        zero, one, minus_one = ir.Constant(ty, 0), ir.Constant(ty, 1), ir.Constant(ty, -1)
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
                return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x)
            return x
        if e.dtype == dtypes.f16:  # compute in f32, round once
            wide = b.fpext(x, ir.FloatType())
            return b.fptrunc(self._math(e.fn, wide), ir.HalfType())
        return self._math(e.fn, x)

    def _math(self, fn: str, x: ir.Value) -> ir.Value:
        b = self.builder
        one = ir.Constant(x.type, 1.0)
        if fn in _INTRINSIC:
            return b.call(self._intrinsic("fabs" if fn == "abs" else fn, x.type), [x])
        if fn == "rsqrt":
            return b.fdiv(one, b.call(self._intrinsic("sqrt", x.type), [x]))
        if fn == "sigmoid":
            e = b.call(self._intrinsic("exp", x.type), [b.fneg(x)])
            return b.fdiv(one, b.fadd(one, e))
        if fn in _LIBM:
            name = fn + ("f" if str(x.type) == "float" else "")
            return b.call(self._declare(name, ir.FunctionType(x.type, [x.type])), [x])
        raise TccCompileError(f"internal error: math function {fn}")

