"""Arithmetic in LLVM IR with the language's (NumPy's) semantics: floor division and modulo that
give 0 on division by zero, NaN-propagating max/min, integer powers, and the math functions
(vector exp, erf and tanh by polynomial, AVX-512's vscalefps and vrangeps where the target has them).
A mixin of the function builder (:mod:`tcc.codegen_cpu.llvm_ir`)."""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tcc import dtypes
from tcc.codegen_cpu.llvm_types import I1, I32, I64, ICMP, lane_mask, like, llvm_const
from tcc.errors import TccCompileError
from tcc.ir import philox
from tcc.ir.expr import Binary, Call, Const, Expr, Var

_LIBM = {"tanh", "erf"}
_INTRINSIC = {"exp", "log", "sqrt", "sin", "cos", "floor", "ceil", "abs"}


class MathEmitter:
    """Binary operators, casts of results and calls of math functions."""

    def _e_Binary(self, e: Binary) -> ir.Value:
        fused = self._fused_multiply_add(e)
        if fused is not None:
            return fused
        a, c = self._expr(e.a), self._expr(e.b)
        if e.op in ("floordiv", "mod") and _narrowable(e, a, self.extents):
            return self._narrow_divmod(e.op, a, int(e.b.value))  # type: ignore[attr-defined]
        if e.op == "div" and e.dtype == dtypes.f32 and isinstance(a.type, ir.VectorType) \
                and not isinstance(c.type, ir.VectorType):
            return self._divide_by_invariant(a, c)
        a, c = self._unify(a, c)
        operand = e.a.dtype
        b = self.builder
        if e.op in ("and", "or"):
            return b.and_(a, c) if e.op == "and" else b.or_(a, c)
        if e.op in ICMP:
            if operand.is_float:
                return b.fcmp_unordered("!=", a, c) if e.op == "ne" else b.fcmp_ordered(ICMP[e.op], a, c)
            if operand.is_bool:
                return b.icmp_unsigned(ICMP[e.op], a, c)
            return b.icmp_signed(ICMP[e.op], a, c)
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
            if self.avx512 and isinstance(a.type, ir.VectorType) and str(a.type.element) == "float":
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
        zero, one, half = (llvm_const(a.type, v) for v in (0.0, 1.0, 0.5))
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
        zero = llvm_const(a.type, 0.0)
        r = b.frem(a, c)
        fix = b.and_(b.fcmp_ordered("!=", r, zero),
                     b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", c, zero)))
        return b.select(fix, b.fadd(r, c), r)

    def _int_binary(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        b = self.builder
        if op == "add":
            return self._iadd(a, c)
        if op == "sub":
            return b.sub(a, c) if _int_value(c) != 0 else a
        if op == "mul":
            return self._imul(a, c)
        if op == "max":
            return b.select(b.icmp_signed(">", a, c), a, c)
        if op == "min":
            return b.select(b.icmp_signed("<", a, c), a, c)
        if op in ("floordiv", "mod"):
            return self._int_divmod(op, a, c)
        if op == "pow":
            return self._per_lane(lambda x, y: b.call(self._ipow(x.type), [x, y]), a, c)
        raise TccCompileError(f"internal error: integer operator {op}")

    def _iadd(self, a: ir.Value, c: ir.Value, flags: tuple[str, ...] = ()) -> ir.Value:
        """``a + c`` on scalar integers, folded where an operand is a constant 0 or both are
        constants: unrolled copies of index arithmetic (``ii * 16 + 0`` for ``ii = 2``) were a
        third of a convolution's IR, each instruction built and printed in Python and then folded
        by LLVM."""
        x, y = _int_value(a), _int_value(c)
        if x is not None and y is not None:
            return ir.Constant(a.type, _wrap(x + y, a.type.width))
        if x == 0:
            return c
        if y == 0:
            return a
        return self.builder.add(a, c, flags=list(flags))

    def _imul(self, a: ir.Value, c: ir.Value, flags: tuple[str, ...] = ()) -> ir.Value:
        """``a * c`` on scalar integers, folded where an operand is a constant 0 or 1 or both are
        constants."""
        x, y = _int_value(a), _int_value(c)
        if x is not None and y is not None:
            return ir.Constant(a.type, _wrap(x * y, a.type.width))
        if x == 0 or y == 1:
            return a
        if y == 0 or x == 1:
            return c
        return self.builder.mul(a, c, flags=list(flags))

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
        zero, one, minus_one = llvm_const(ty, 0), llvm_const(ty, 1), llvm_const(ty, -1)
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

    def _narrow_divmod(self, op: str, a: ir.Value, divisor: int) -> ir.Value:
        """Floor division / modulo of i64 lanes known to fit in i32 (loop indices: im2col's
        ``(base + lane) // 56``), done on i32 lanes: AVX2 has a 32-bit multiply-high for a
        constant divisor and none for 64 bits, so i64 lanes were split one by one (conv2d 3x3
        64->64 56x56: LLVM's IR pipeline ~4 ms and code generation ~8 ms shorter)."""
        b = self.builder
        narrow = ir.VectorType(I32, a.type.count)
        value = self._divmod_by_positive(op, b.trunc(a, narrow), llvm_const(narrow, divisor))
        return b.sext(value, a.type)

    def _divmod_by_positive(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        """Floor division / modulo by a constant above zero (index arithmetic: im2col's ``k // 9``):
        no zero or -1 divisor to guard, so 5 instructions instead of 16 (LLVM folded the guards
        too, but its time grows with the IR it is given)."""
        b = self.builder
        q, r = b.sdiv(a, c), b.srem(a, c)
        negative = b.icmp_signed("<", r, llvm_const(a.type, 0))
        if op == "floordiv":
            return b.select(negative, b.sub(q, llvm_const(a.type, 1)), q)
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
        if e.fn == "philox":
            return self._philox(e)
        x = self._expr(e.args[0])
        b = self.builder
        if not e.dtype.is_float:  # abs / floor / ceil of an integer
            if e.fn == "abs":
                return b.select(b.icmp_signed("<", x, llvm_const(x.type, 0)), b.sub(llvm_const(x.type, 0), x), x)
            return x
        if e.dtype == dtypes.f16:  # compute in f32, round once
            wide = b.fpext(x, like(x.type, ir.FloatType()))
            return b.fptrunc(self._math(e.fn, wide), like(x.type, ir.HalfType()))
        return self._math(e.fn, x)

    def _philox(self, e: Call) -> ir.Value:
        """Output word ``e.args[0]`` of Philox-4x32-10 (``tcc.ir.philox``), on 64-bit lanes: each
        32-bit product is exact in 64 bits, its high word a shift. Vectorises like any integer
        arithmetic."""
        b = self.builder
        values = []
        for a in e.args[1:]:
            v = self._expr(a)
            element = v.type.element if isinstance(v.type, ir.VectorType) else v.type
            values.append(b.sext(v, like(v.type, I64)) if element.width < 64 else v)
        seed, *counter = self._unify(*values)
        t = seed.type
        mask, half = llvm_const(t, philox.MASK), llvm_const(t, 32)
        c = [b.and_(x, mask) for x in counter]
        key = [b.and_(seed, mask), b.lshr(seed, half)]
        for r in range(philox.ROUNDS):
            if r:
                key = [b.and_(b.add(k, llvm_const(t, bump)), mask) for k, bump in zip(key, philox.KEY_BUMPS)]
            p0 = b.mul(c[0], llvm_const(t, philox.MULTIPLIERS[0]))
            p1 = b.mul(c[2], llvm_const(t, philox.MULTIPLIERS[1]))
            c = [b.xor(b.xor(b.lshr(p1, half), c[1]), key[0]), b.and_(p1, mask),
                 b.xor(b.xor(b.lshr(p0, half), c[3]), key[1]), b.and_(p0, mask)]
        return c[int(e.args[0].value)]  # type: ignore[attr-defined]

    def _math(self, fn: str, x: ir.Value) -> ir.Value:
        b = self.builder
        one = llvm_const(x.type, 1.0)
        if fn == "exp" and isinstance(x.type, ir.VectorType) and str(x.type.element) == "float":
            return self._vector_exp(x)
        if fn == "erf" and isinstance(x.type, ir.VectorType) and str(x.type.element) == "float":
            return self._vector_erf(x)
        if fn == "tanh" and isinstance(x.type, ir.VectorType) and str(x.type.element) == "float":
            return self._vector_tanh(x)
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
        f = lambda v: llvm_const(ty, v)  # noqa: E731
        scalef = self.avx512
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
        half = b.ashr(ni, llvm_const(ity, 1))

        def pow2(k: ir.Value) -> ir.Value:
            return b.bitcast(b.shl(b.add(k, llvm_const(ity, 127)), llvm_const(ity, 23)), ty)
        y = b.fmul(b.fmul(p, pow2(half)), pow2(b.sub(ni, half)))
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def _vector_erf(self, x: ir.Value) -> ir.Value:
        """erf on f32 vectors without libm: ``x * p(x**2) / q(x**2)`` on ``x`` clamped to [-4, 4]
        (Eigen's and TensorFlow's rational fit; within 4.5e-7 of erf, a few ulp, over all f32).

        LLVM would otherwise call erff once per lane: GELU's erf cost most of a transformer MLP
        layer's time. NaN passes through the clamp (selects, not x86 max/min) and the fit."""
        b = self.builder
        ty = x.type
        f = lambda v: llvm_const(ty, v)  # noqa: E731
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

    def _vector_tanh(self, x: ir.Value) -> ir.Value:
        """tanh on f32 vectors without libm: ``x * p(x**2) / q(x**2)`` on ``x`` clamped to
        [-7.9988, 7.9988], where the fit reaches 1.0 (Eigen's rational fit; within 3.5e-7 of tanh,
        relative, over all f32, and never beyond 1 in magnitude).

        LLVM would otherwise call tanhf once per lane: GPT-2's GELU (its tanh form) took 20x
        onnxruntime's time, the largest kernel of the model. NaN passes through the clamp."""
        b = self.builder
        ty = x.type
        f = lambda v: llvm_const(ty, v)  # noqa: E731
        xc = b.select(b.fcmp_ordered("<", x, f(-7.99881172180175781)), f(-7.99881172180175781), x)
        xc = b.select(b.fcmp_ordered(">", xc, f(7.99881172180175781)), f(7.99881172180175781), xc)
        x2 = b.fmul(xc, xc)
        fma = self._intrinsic("fma", ty, 3)
        p = f(-2.76076847742355e-16)
        for c in (2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08, 1.48572235717979e-05,
                  6.37261928875436e-04, 4.89352455891786e-03):
            p = b.call(fma, [p, x2, f(c)])
        q = f(1.19825839466702e-06)
        for c in (1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03):
            q = b.call(fma, [q, x2, f(c)])
        return b.fmul(xc, b.fdiv(p, q))  # not (x * p) / q: x * p would underflow for tiny x

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
            lanes = lane_mask([i % count for i in range(lo, lo + 16)])
            parts.append(fn(b.shuffle_vector(p, p, lanes), b.shuffle_vector(n, n, lanes)))
        while len(parts) > 1:
            parts = [b.shuffle_vector(a, c, lane_mask(range(2 * a.type.count)))
                     for a, c in zip(parts[::2], parts[1::2])]
        return parts[0] if count == 16 else b.shuffle_vector(parts[0], parts[0], lane_mask(range(count)))


def _int_value(value: ir.Value) -> int | None:
    """The value of a scalar integer constant (None for anything else)."""
    if isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) and isinstance(value.constant, int):
        return value.constant
    return None


def _wrap(value: int, bits: int) -> int:
    """``value`` as a ``bits``-bit two's complement integer."""
    half = 1 << (bits - 1)
    return (value + half) % (2 * half) - half


def _positive_constant(value: ir.Value) -> bool:
    """Whether ``value`` is an integer constant above zero (a scalar, or a vector of them)."""
    if not isinstance(value, ir.Constant):
        return False
    lanes = value.constant if isinstance(value.constant, list) else [value]
    return all(isinstance(v, ir.Constant) and type(v.constant) is int and v.constant > 0 for v in lanes)


def _against_constant(lhs: Expr | None, rhs: Expr, a: ir.Value, c: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """(x, k) for ``max``/``min`` of a value and a non-NaN constant, else None: ``x > k ? x : k``
    with an unordered compare (so a NaN ``x`` comes through, and ``max(-0.0, 0.0)`` is ``0.0``)
    is the IEEE maximum there, in two instructions where the general case needs four."""
    for const, x, k in ((rhs, a, c), (lhs, c, a)):
        if isinstance(const, Const) and const.value == const.value:  # not NaN
            return x, k
    return None


I32_MAX = (1 << 31) - 1
Range = tuple[int, int] | None


def _narrowable(e: Binary, a: ir.Value, extents: dict[str, int]) -> bool:
    """Whether ``e`` (floordiv or mod, its dividend ``a`` already emitted) divides i64 lanes by a
    positive i32 constant and its dividend provably fits in i32."""
    lanes = a.type
    if not (isinstance(lanes, ir.VectorType) and isinstance(lanes.element, ir.IntType) and lanes.element.width == 64):
        return False
    if not (isinstance(e.b, Const) and type(e.b.value) is int and 0 < e.b.value <= I32_MAX):
        return False
    bounds = index_range(e.a, extents)
    return bounds is not None and -I32_MAX - 1 <= bounds[0] and bounds[1] <= I32_MAX


def index_range(e: Expr, extents: dict[str, int]) -> Range:
    """Bounds [lo, hi] of an integer index expression over loop indices (each in [0, extent)),
    or None where unknown (a parameter, a load, a bound value, an operator not followed)."""
    if isinstance(e, Const) and type(e.value) is int:
        return e.value, e.value
    if isinstance(e, Var):
        extent = extents.get(e.name)
        return (0, extent - 1) if extent is not None and extent > 0 else None
    if not isinstance(e, Binary) or not e.dtype.is_int:
        return None
    a, c = index_range(e.a, extents), index_range(e.b, extents)
    if a is None or c is None:
        return None
    if e.op == "sub":
        return a[0] - c[1], a[1] - c[0]
    if e.op in ("add", "mul", "min", "max"):
        combine = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "min": min, "max": max}[e.op]
        values = [combine(x, y) for x in a for y in c]
        return min(values), max(values)
    if e.op in ("floordiv", "mod") and c[0] == c[1] and c[0] > 0:
        if e.op == "mod":
            return 0, c[0] - 1
        return a[0] // c[0], a[1] // c[0]
    return None
