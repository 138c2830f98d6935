"""Expressions of a statement, checked and typed: names, reads, operators with NumPy's promotion
(explicit casts inserted), calls of the language's functions and reductions (half-precision
bodies computed in f32). A mixin of the op analyzer (:mod:`tcc.frontend.sema`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

import numpy as np

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import Span, TccNameError, TccShapeError, TccSyntaxError, TccTypeError
from tcc.frontend import ast
from tcc.frontend.ranges import affine_form
from tcc.ir import philox
from tcc.ir.expr import (
    ARITH_OPS,
    COMPARE_OPS,
    MATH_FUNCS,
    RANDOM_FUNCS,
    REDUCE_OPS,
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    Unary,
    Var,
    cast,
    free_vars,
)


@dataclass
class Typed:
    """An expression with its weak kind ('b', 'i', 'f') if it is a weak (literal-like) value."""

    expr: Expr
    weak: str | None = None
    span: Span | None = None  # a literal's, for range errors

    @property
    def dtype(self) -> DType:
        return self.expr.dtype


def suggest(name: str, candidates: object) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"did you mean {close[0]!r}?" if close else None


HALF = (dtypes.f16, dtypes.bf16, *dtypes.FP8)  # floats narrower than f32: reductions over them run in f32


def in_f32(e: Expr) -> Expr:
    """The body of a reduction over f16/bf16 values with every half-precision operation done in
    f32 (DSL.md's rule, and what tensor cores do: a product of two f16 values is not rounded to
    f16). Leaves are widened; an explicit cast to a half type still rounds, then widens."""
    if isinstance(e, Binary):
        return replace(e, a=in_f32(e.a), b=in_f32(e.b), dtype=_widened(e.dtype))
    if isinstance(e, Unary):
        return replace(e, a=in_f32(e.a), dtype=_widened(e.dtype))
    if isinstance(e, Call):
        return replace(e, args=tuple(in_f32(a) for a in e.args), dtype=_widened(e.dtype))
    if isinstance(e, Select):
        return replace(e, cond=in_f32(e.cond), a=in_f32(e.a), b=in_f32(e.b), dtype=_widened(e.dtype))
    if isinstance(e, Reduce):
        return replace(e, body=in_f32(e.body), dtype=_widened(e.dtype))
    if isinstance(e, Cast) and e.a.dtype in HALF and e.dtype not in HALF:
        return replace(e, a=in_f32(e.a))
    return cast(e, dtypes.f32) if e.dtype in HALF else e


def _widened(dtype: DType) -> DType:
    return dtypes.f32 if dtype in HALF else dtype


RESERVED = ("inf", "nan")  # float literals; the lexer reads them as names only where no value can stand


def not_reserved(name: str, span: Span | None) -> None:
    if name in RESERVED:
        raise TccNameError(f"{name!r} is a float literal and cannot name a tensor, index or parameter", span,
                           "choose another name")


def check_literal(value: Typed, dtype: DType, span: Span | None) -> None:
    """An integer literal must fit the integer type it becomes, as in NumPy 2 (which raises
    ``OverflowError`` for ``np.int8(1) + 300``) rather than wrap."""
    if not (isinstance(value.expr, Const) and value.weak == "i" and dtype.is_int):
        return
    info = np.iinfo(dtype.numpy)
    if not info.min <= value.expr.value <= info.max:
        raise TccTypeError(f"the integer {value.expr.value} is out of range for {dtype} "
                           f"({info.min} to {info.max})", value.span or span,
                           "use a wider type, e.g. i64(x), or a float literal" if dtype != dtypes.i64 else
                           "use a float literal, e.g. 1e20")


def _widen_for_literal(a: Typed, other: Typed) -> Typed:
    """``a`` widened to i64 when ``other`` is an integer literal out of ``a``'s range (only
    comparisons do this: NumPy 2 compares such values exactly)."""
    if not (a.weak is None and a.dtype.is_int and isinstance(other.expr, Const) and other.weak == "i"):
        return a
    info = np.iinfo(a.dtype.numpy)
    if info.min <= other.expr.value <= info.max:
        return a
    return Typed(cast(a.expr, dtypes.i64), None, a.span)


class ExprAnalyzer:
    """The expression half of the analysis of one op."""

    def _expr(self, node: ast.Node, env: dict[str, Var], what: str, shape_only: bool = False) -> Typed:
        method = getattr(self, f"_e_{type(node).__name__}")
        return method(node, env, what, shape_only)

    def _e_Num(self, n: ast.Num, env, what, shape_only) -> Typed:
        if n.is_float:
            return Typed(Const(float(n.value), dtypes.f64), "f", n.span)
        typed = Typed(Const(int(n.value), dtypes.i64), "i", n.span)
        check_literal(typed, dtypes.i64, n.span)
        return typed

    def _e_Name(self, n: ast.Name, env, what, shape_only) -> Typed:
        if n.id in env:
            return Typed(env[n.id], "i")
        if n.id in self.symbols:
            return Typed(Var(n.id, dtypes.i64), "i")
        if n.id in self.cparams:
            is_float = isinstance(self.cparams[n.id], float)
            return Typed(Var(n.id, dtypes.f64 if is_float else dtypes.i64), "f" if is_float else "i")
        if shape_only:
            if n.id in self.tensors or n.id in self.scalars:
                raise TccNameError(f"{what} may use only shape symbols, compile-time parameters and "
                                   f"integers, not {n.id!r}", n.span)
            raise TccNameError(f"unknown name {n.id!r} in {what}", n.span,
                               suggest(n.id, self.symbols + list(self.cparams))
                               or "shape symbols are bound by input tensors' dims")
        if n.id in self.scalars:
            return Typed(Var(n.id, self.scalars[n.id].dtype))
        if n.id in self.tensors or n.id in self.declared:
            raise TccNameError(f"{n.id!r} is a tensor: read an element with {n.id}[...]", n.span)
        raise TccNameError(f"unknown name {n.id!r}", n.span,
                           suggest(n.id, list(env) + self.symbols + list(self.cparams) + list(self.scalars)))

    def _e_Access(self, n: ast.Access, env, what, shape_only) -> Typed:
        if shape_only:
            raise TccNameError(f"{what} cannot read tensor {n.tensor!r}", n.span)
        tensor = self._readable(n.tensor, n.span)
        if len(n.indices) != len(tensor.shape):
            raise TccShapeError(f"{n.tensor} has rank {len(tensor.shape)} but is indexed with "
                                f"{len(n.indices)} indices", n.span)
        indices = []
        for idx in n.indices:
            t = self._expr(idx, env, "an index")
            if not t.dtype.is_int:
                raise TccTypeError(f"an index must be an integer expression, not {t.dtype}", idx.span,
                                   "index with index variables, symbols and integers (cast with i64(...))")
            indices.append(cast(t.expr, dtypes.i64))
        read = Read(n.tensor, tuple(indices), tensor.dtype, n.span)
        self.self_read(read)
        return Typed(read)

    def _e_UnaryOp(self, n: ast.UnaryOp, env, what, shape_only) -> Typed:
        a = self._expr(n.a, env, what, shape_only)
        if n.op == "not":
            self._require_bool(a, n.a.span, "not")
            return Typed(Unary("not", a.expr, dtypes.boolean))
        if a.dtype.is_bool:
            raise TccTypeError("cannot negate a bool", n.span, "use `not` for logical negation")
        if isinstance(a.expr, Const):
            return Typed(Const(-a.expr.value, a.dtype), a.weak, n.span)
        return Typed(Unary("neg", a.expr, a.dtype), a.weak)

    def _require_bool(self, t: Typed, span: Span | None, op: str) -> None:
        if not t.dtype.is_bool:
            raise TccTypeError(f"`{op}` needs a bool operand, got {t.dtype}", span,
                               "compare first, e.g. x > 0")

    def _unify(self, a: Typed, b: Typed, span: Span | None) -> tuple[DType, str | None]:
        if a.weak and b.weak:
            kind = "f" if "f" in (a.weak, b.weak) else "i" if "i" in (a.weak, b.weak) else "b"
            return dtypes.weak_default(kind), kind
        if a.weak:
            return dtypes.promote_weak(b.dtype, a.weak), None
        if b.weak:
            return dtypes.promote_weak(a.dtype, b.weak), None
        return dtypes.promote(a.dtype, b.dtype), None

    def _e_BinOp(self, n: ast.BinOp, env, what, shape_only) -> Typed:
        a = self._expr(n.a, env, what, shape_only)
        b = self._expr(n.b, env, what, shape_only)
        return self._binary(n.op, a, b, n.span)

    def _binary(self, op: str, a: Typed, b: Typed, span: Span | None) -> Typed:
        if op in ("and", "or"):
            self._require_bool(a, span, op)
            self._require_bool(b, span, op)
            return Typed(Binary(op, a.expr, b.expr, dtypes.boolean, span))
        if op in COMPARE_OPS:  # as NumPy 2: an integer compares exactly with any Python integer
            a, b = _widen_for_literal(a, b), _widen_for_literal(b, a)
        dtype, weak = self._unify(a, b, span)
        check_literal(a, dtype, span)
        check_literal(b, dtype, span)
        if op in ARITH_OPS and dtype.is_bool:
            raise TccTypeError(f"arithmetic `{op}` on bool values", span, "convert first, e.g. i32(x)")
        if op == "div" and not dtype.is_float:
            dtype = dtypes.f64
            weak = "f" if weak else None
        if op == "pow" and isinstance(b.expr, Const) and b.weak and not dtype.is_float and b.expr.value < 0:
            raise TccTypeError("integers to negative integer powers are not allowed", span,
                               "use a float base, e.g. 2.0 ** -1")
        lhs, rhs = cast(a.expr, dtype), cast(b.expr, dtype)
        if op in COMPARE_OPS:
            return Typed(Binary(op, lhs, rhs, dtypes.boolean, span))
        return Typed(Binary(op, lhs, rhs, dtype, span), weak)

    def _e_CallExpr(self, n: ast.CallExpr, env, what, shape_only) -> Typed:
        args = [self._expr(x, env, what, shape_only) for x in n.args]
        fn = n.fn
        if fn in dtypes.ALL:
            self._arity(n, 1)
            check_literal(args[0], dtypes.ALL[fn], n.span)
            return Typed(cast(args[0].expr, dtypes.ALL[fn]))
        if fn in ("max", "min", "pow"):
            self._arity(n, 2)
            return self._binary(fn, args[0], args[1], n.span)
        if fn == "select":
            self._arity(n, 3)
            self._require_bool(args[0], n.args[0].span, "select")
            dtype, weak = self._unify(args[1], args[2], n.span)
            check_literal(args[1], dtype, n.span)
            check_literal(args[2], dtype, n.span)
            return Typed(Select(args[0].expr, cast(args[1].expr, dtype), cast(args[2].expr, dtype), dtype), weak)
        if fn in MATH_FUNCS:
            self._arity(n, 1)
            a = args[0]
            if a.dtype.is_bool:
                raise TccTypeError(f"{fn} of a bool", n.span, "convert first, e.g. f32(x)")
            keeps_int = fn in ("abs", "floor", "ceil")
            dtype = a.dtype if (a.dtype.is_float or keeps_int) else dtypes.f64
            weak = a.weak if (a.dtype.is_float or keeps_int) else ("f" if a.weak else None)
            return Typed(Call(fn, (cast(a.expr, dtype),), dtype), weak)
        if fn in RANDOM_FUNCS:
            return Typed(self._random(n, args))
        if fn in REDUCE_OPS:
            raise TccSyntaxError(f"{fn} is a reduction and needs its indices", n.span,
                                 f"write {fn}[k](expr), or max(a, b) / min(a, b) for two values")
        known = list(dtypes.ALL) + ["max", "min", "pow", "select", *MATH_FUNCS, *RANDOM_FUNCS]
        raise TccNameError(f"unknown function {fn!r}", n.span, suggest(fn, known))

    def _random(self, n: ast.CallExpr, args: list[Typed]) -> Expr:
        """``rand``/``randn(seed, i, ...)`` as f32 expressions over Philox words, ``philox(word,
        seed, i, ...)`` as one word: the generator is one TE call (``tcc.ir.philox``), so every
        target computes the same bits and the reference is the oracle of its arithmetic."""
        first = 1 if n.fn == "philox" else 0
        word = None
        if n.fn == "philox":
            w = n.args[0] if n.args else None
            if not (isinstance(w, ast.Num) and not w.is_float and 0 <= w.value < philox.COUNTERS):
                raise TccTypeError("philox's first argument is the output word: 0, 1, 2 or 3", n.span)
            word = int(w.value)
        counted = len(args) - first - 1
        if not 1 <= counted <= philox.COUNTERS:
            raise TccTypeError(f"{n.fn} takes a seed and 1 to {philox.COUNTERS} indices, got {len(args) - first}",
                               n.span, f"{n.fn}(seed, i, j) draws one value per (i, j) for each seed")
        for a, node in zip(args[first:], n.args[first:]):
            if not a.dtype.is_int:
                raise TccTypeError(f"{n.fn}'s seed and indices are integers, not {a.dtype}", node.span,
                                   "convert with i64(x)")
        ints = [cast(a.expr, dtypes.i64) for a in args[first:]]
        counter = ints[1:] + [Const(0, dtypes.i64)] * (philox.COUNTERS - counted)

        def bits(k: int) -> Expr:
            return Call("philox", (Const(k, dtypes.i64), ints[0], *counter), dtypes.i64)

        if word is not None:
            return bits(word)
        return _uniform(bits(0)) if n.fn == "rand" else _normal(bits(0), bits(1))

    def _arity(self, n: ast.CallExpr, count: int) -> None:
        if len(n.args) != count:
            raise TccTypeError(f"{n.fn} takes {count} argument{'s' if count > 1 else ''}, got {len(n.args)}",
                               n.span)

    def _extent(self, node: ast.Node, what: str) -> Expr:
        """An explicit reduction extent: shape symbols and parameters, and (``sum[j: i + 1]``, a
        prefix) affine in the statement's own index variables; never in other reductions' ones."""
        axes = self.statement_axes()
        typed = self._expr(node, {n: Var(n, dtypes.i64) for n in axes}, what=what, shape_only=True)
        if not (typed.dtype.is_int or typed.dtype.is_bool):
            raise TccTypeError(f"{what} must be an integer expression, not {typed.dtype}", node.span)
        extent = cast(typed.expr, dtypes.i64)
        if free_vars(extent) & set(axes) and affine_form(extent, set(axes)) is None:
            raise TccTypeError(f"{what} must be affine in the statement's indices ({', '.join(axes)})", node.span,
                               "write it as i + c, i - c or c * i + ...")
        return extent

    def statement_axes(self) -> list[str]:
        """The index variables of the statement being analysed (none outside statements)."""
        return []

    def _e_ReduceExpr(self, n: ast.ReduceExpr, env, what, shape_only) -> Typed:
        if shape_only:
            raise TccSyntaxError(f"{what} cannot contain a reduction", n.span)
        inner = dict(env)
        axes_vars = []
        for ax in n.axes:
            not_reserved(ax.name, ax.span)
            if ax.name in inner or ax.name in self._taken():
                raise TccNameError(f"reduction index {ax.name!r} is already in use", ax.span,
                                   "choose another index name")
            inner[ax.name] = Var(ax.name, dtypes.i64)
            axes_vars.append(ax)
        body = self._expr(n.body, inner, what)
        axes = []
        for ax in axes_vars:
            if ax.extent is not None:
                extent = self._extent(ax.extent, f"the extent of {ax.name}")
            else:
                extent = self._infer_range(ax.name, n.body, f"{n.op}[{ax.name}]", ax.span)
            axes.append(IterVar(inner[ax.name], extent))
        operand = body.dtype if body.weak is None else dtypes.weak_default(body.weak)
        if operand.is_bool and n.op in ("sum", "prod"):
            raise TccTypeError(f"{n.op} of bool values", n.span, "convert first, e.g. i32(x > 0)")
        result = operand
        if n.op in ("sum", "prod") and operand.is_int and operand.bits < 64:
            result = dtypes.i64  # NumPy sums small integers in the platform integer
        half = operand in HALF
        acc = dtypes.f32 if half else result
        expr = in_f32(body.expr) if half else body.expr
        return Typed(Reduce(n.op, tuple(axes), cast(expr, acc), result, acc, n.span))


def _unit(bits: Expr, offset: int) -> Expr:
    """``(bits >> 8) + offset`` times 2**-24 in f32: exact, so the same on every target."""
    top = Binary("floordiv", bits, Const(256, dtypes.i64), dtypes.i64)
    if offset:
        top = Binary("add", top, Const(offset, dtypes.i64), dtypes.i64)
    return Binary("mul", cast(top, dtypes.f32), Const(2.0 ** -24, dtypes.f32), dtypes.f32)


def _uniform(bits: Expr) -> Expr:
    """A uniform f32 in [0, 1) from a 32-bit word."""
    return _unit(bits, 0)


def _normal(first: Expr, second: Expr) -> Expr:
    """A standard normal f32 by Box-Muller: ``sqrt(-2 log u) cos(2 pi v)``, u in (0, 1]."""
    f32 = dtypes.f32
    radius = Call("sqrt", (Binary("mul", Const(-2.0, f32), Call("log", (_unit(first, 1),), f32), f32),), f32)
    angle = Binary("mul", Const(6.283185307179586, f32), _unit(second, 0), f32)
    return Binary("mul", radius, Call("cos", (angle,), f32), f32)
