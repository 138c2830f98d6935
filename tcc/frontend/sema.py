"""Semantic analysis: AST -> tensor-expression IR.

Resolves names, types every expression with NumPy promotion (inserting casts), infers the
ranges of index variables and the shapes of intermediates, and reports every mistake as a
:class:`TccError` at the span that caused it. Shapes stay symbolic here; binding them to
concrete sizes is :mod:`tcc.passes.te.specialize`'s job.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace

import numpy as np

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import Source, Span, TccNameError, TccShapeError, TccSyntaxError, TccTypeError
from tcc.frontend import ast
from tcc.ir.expr import (
    ARITH_OPS,
    COMPARE_OPS,
    MATH_FUNCS,
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
    walk,
)
from tcc.ir.te import Compute, OpTE, Pad, Scalar, Tensor


@dataclass(frozen=True)
class RangeSource:
    """Where an index variable's range was inferred from: dim ``dim`` of ``tensor``."""

    tensor: str
    dim: int
    extent: Expr
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RangeCheck:
    """Several tensors give an index its range; specialisation checks they agree."""

    var: str
    where: str  # "T" for T's statement, used in the message
    sources: tuple[RangeSource, ...]


@dataclass
class Typed:
    """An expression with its weak kind ('b', 'i', 'f') if it is a weak (literal-like) value."""

    expr: Expr
    weak: str | None = None
    span: Span | None = None  # a literal's, for range errors

    @property
    def dtype(self) -> DType:
        return self.expr.dtype


def analyze(module: ast.Module, source: Source) -> dict[str, OpTE]:
    """Check every op of a module and build its TE IR."""
    ops: dict[str, OpTE] = {}
    for op_def in module.ops:
        if op_def.name in ops:
            raise TccNameError(f"op {op_def.name!r} is defined twice", op_def.span,
                               "rename one of them")
        ops[op_def.name] = _OpAnalyzer(op_def, source).run()
    return ops


def _suggest(name: str, candidates: object) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"did you mean {close[0]!r}?" if close else None


def _dtype(name: str, span: Span | None) -> DType:
    if name not in dtypes.ALL:
        raise TccTypeError(f"unknown dtype {name!r}", span, f"use one of {', '.join(dtypes.ALL)}")
    return dtypes.ALL[name]


class _OpAnalyzer:
    def __init__(self, op_def: ast.OpDef, source: Source):
        self.op_def = op_def
        self.source = source
        self.cparams: dict[str, int | float] = {}
        self.symbols: list[str] = []
        self.tensors: dict[str, Tensor] = {}
        self.scalars: dict[str, Scalar] = {}
        self.pads: dict[str, Pad] = {}
        self.params: list[str] = []
        self.results: list[str] = []
        self.computes: list[Compute] = []
        self.declared: dict[str, Tensor] = {}
        self.defined: set[str] = set()  # tensors that may be read so far
        self.range_checks: list[RangeCheck] = []

    # ------------------------------------------------------------ header
    def run(self) -> OpTE:
        d = self.op_def
        for cp in d.cparams:
            self._claim(cp.name, cp.span)
            if isinstance(cp.default, int) and not -2**63 <= cp.default < 2**63:
                raise TccTypeError(f"the default of {cp.name} does not fit a 64-bit integer", cp.span)
            self.cparams[cp.name] = cp.default
        for p in d.params:
            self._param(p)
        for r in d.results:
            self._result(r)
        for stmt in d.body:
            self._statement(stmt)
        for r in d.results:
            if self.tensors[r.name].kind == "result" and r.name not in self.defined:
                raise TccNameError(f"result {r.name!r} is never assigned", r.span,
                                   f"add a statement {r.name}[...] = ... to the body")
        return OpTE(d.name, dict(self.cparams), self.params, self.results, self.tensors, self.scalars,
                    self.pads, self.computes, self.symbols, self.source, d.span,
                    range_checks=self.range_checks)

    def _taken(self) -> set[str]:
        return set(self.cparams) | set(self.symbols) | set(self.tensors) | set(self.scalars) | set(self.declared)

    def _claim(self, name: str, span: Span | None) -> None:
        _not_reserved(name, span)
        if name in self._taken():
            raise TccNameError(f"{name!r} is already defined in op {self.op_def.name!r}", span,
                               "choose another name")

    def _param(self, p: ast.Param) -> None:
        self._claim(p.name, p.span)
        dtype = _dtype(p.dtype, p.span)
        self.params.append(p.name)
        if p.shape is None:
            self.scalars[p.name] = Scalar(p.name, dtype)
            return
        dims = []
        for dim in p.shape:
            if isinstance(dim, ast.Name) and dim.id not in self.cparams and dim.id not in self.symbols:
                if dim.id in self.tensors or dim.id in self.scalars:
                    raise TccNameError(f"{dim.id!r} is a parameter, not a shape symbol", dim.span)
                self.symbols.append(dim.id)
            dims.append(self._dim(dim, f"a dim of {p.name}"))
        self.tensors[p.name] = Tensor(p.name, dtype, tuple(dims), "input", p.span)
        self.defined.add(p.name)

    def _result(self, r: ast.Param) -> None:
        self._claim(r.name, r.span)
        if r.shape is None:
            raise TccShapeError(f"result {r.name!r} needs a shape", r.span,
                                f"write {r.name}: {r.dtype}[N] (a one-element result is [1])")
        dims = tuple(self._dim(d, f"a dim of result {r.name}") for d in r.shape)
        self.tensors[r.name] = Tensor(r.name, _dtype(r.dtype, r.span), dims, "result", r.span)
        self.results.append(r.name)

    def _dim(self, node: ast.Node, what: str) -> Expr:
        """A shape expression: integers, symbols and compile-time parameters only."""
        typed = self._expr(node, {}, what=what, shape_only=True)
        if not (typed.dtype.is_int or typed.dtype.is_bool):
            raise TccTypeError(f"{what} must be an integer expression, not {typed.dtype}", node.span)
        return cast(typed.expr, dtypes.i64)

    # ------------------------------------------------------------ statements
    def _statement(self, stmt: ast.Node) -> None:
        if isinstance(stmt, ast.Decl):
            self._decl(stmt)
        elif isinstance(stmt, ast.PadStmt):
            self._pad(stmt)
        elif isinstance(stmt, ast.Assign):
            self._assign(stmt)
        else:  # pragma: no cover - the grammar has no other statements
            raise TccSyntaxError("unknown statement", stmt.span)

    def _decl(self, d: ast.Decl) -> None:
        if d.name in self.tensors and self.tensors[d.name].kind in ("input", "result"):
            raise TccNameError(f"{d.name!r} is a parameter or result; only intermediates are declared",
                               d.span, "remove the declaration")
        self._claim(d.name, d.span)
        dims = tuple(self._dim(x, f"a dim of {d.name}") for x in d.shape)
        self.declared[d.name] = Tensor(d.name, _dtype(d.dtype, d.span), dims, "temp", d.span)

    def _pad(self, p: ast.PadStmt) -> None:
        self._claim(p.name, p.span)
        src = self._readable(p.source, p.span)
        rank = len(src.shape)
        lo = [self._dim(x, "a pad width") for x in p.lo]
        hi = [self._dim(x, "a pad width") for x in p.hi] if p.hi is not None else lo
        for widths in (lo, hi):
            if len(widths) != rank:
                raise TccShapeError(f"pad of {p.source} needs {rank} widths (one per dim), got {len(widths)}",
                                    p.span, f"{p.source} has rank {rank}")
        value = Const(0, src.dtype)
        if p.value is not None:
            typed = self._expr(p.value, {}, what="a pad value", shape_only=True)
            value = self._convert(typed, src.dtype, p.value.span, "pad value")
        shape = tuple(_add(_add(d, a), b) for d, a, b in zip(src.shape, lo, hi))
        self.tensors[p.name] = Tensor(p.name, src.dtype, shape, "pad", p.span)
        self.pads[p.name] = Pad(p.name, p.source, tuple(lo), tuple(hi), value)
        self.defined.add(p.name)

    def _readable(self, name: str, span: Span | None) -> Tensor:
        if name in self.tensors and name in self.defined:
            return self.tensors[name]
        if name in self.tensors or name in self.declared:
            raise TccNameError(f"{name!r} is read before it is assigned", span,
                               "statements run in order: define a tensor before reading it")
        if name in self.scalars:
            raise TccNameError(f"{name!r} is a scalar, not a tensor", span, f"use it as {name}, without indices")
        raise TccNameError(f"unknown tensor {name!r}", span, _suggest(name, self.tensors))

    def _assign(self, a: ast.Assign) -> None:
        name = a.target
        if name in self.defined or name in self.pads:
            kind = self.tensors[name].kind
            why = "an input is read-only" if kind == "input" else "each tensor is assigned by exactly one statement"
            raise TccNameError(f"{name!r} cannot be assigned here: {why}", a.span,
                               "write the new values into a new tensor")
        if name in self.scalars or name in self.cparams or name in self.symbols:
            raise TccNameError(f"{name!r} is not a tensor and cannot be assigned", a.span)
        _not_reserved(name, a.span)
        axes_names = []
        for idx in a.indices:
            if not isinstance(idx, ast.Name):
                raise TccSyntaxError("left-hand indices must be plain index variables", idx.span,
                                     f"write {name}[i, ...] = ... and use the expression on the right")
            _not_reserved(idx.id, idx.span)
            if idx.id in axes_names:
                raise TccNameError(f"index {idx.id!r} appears twice on the left", idx.span,
                                   "use distinct index variables")
            if idx.id in self._taken():
                raise TccNameError(f"index variable {idx.id!r} clashes with a name of the op", idx.span,
                                   "choose another index name")
            axes_names.append(idx.id)
        env = {n: Var(n, dtypes.i64) for n in axes_names}
        value = self._expr(a.value, env, what="an expression")
        known = self.tensors.get(name) or self.declared.get(name)
        if known is not None:
            if len(known.shape) != len(axes_names):
                raise TccShapeError(f"{name} has rank {len(known.shape)} but is assigned with "
                                    f"{len(axes_names)} indices", a.span)
            tensor = known
            axes = tuple(IterVar(env[n], d) for n, d in zip(axes_names, known.shape))
            body = self._convert(value, known.dtype, a.value.span, f"the value of {name}")
        else:
            dims = []
            for idx, n in zip(a.indices, axes_names):
                dims.append(self._infer_range(n, a.value, f"{name}", idx.span, temp=name, typed=value.expr))
            dtype = value.dtype if value.weak is None else dtypes.weak_default(value.weak)
            tensor = Tensor(name, dtype, tuple(dims), "temp", a.span)
            axes = tuple(IterVar(env[n], d) for n, d in zip(axes_names, dims))
            body = cast(value.expr, dtype)
        self.tensors[name] = tensor
        self.declared.pop(name, None)
        self.computes.append(Compute(name, axes, body, a.span))
        self.defined.add(name)

    def _convert(self, value: Typed, dtype: DType, span: Span | None, what: str) -> Expr:
        """Implicit conversion at a store: NumPy's same-kind rule (no float -> int)."""
        src = value.dtype
        if value.weak is None and src.is_float and not dtype.is_float:
            raise TccTypeError(f"{what} is {src} but must be stored as {dtype}", span,
                               f"convert explicitly: {dtype}(...)")
        if value.weak == "f" and not dtype.is_float:
            raise TccTypeError(f"{what} is a float but must be stored as {dtype}", span,
                               f"convert explicitly: {dtype}(...)")
        _check_literal(value, dtype, span)
        expr = value.expr
        if isinstance(expr, Reduce) and expr.dtype in _HALF and dtype.is_float and dtype.bits >= 32:
            expr = replace(expr, dtype=dtypes.f32)  # a half reduction stored wider: its f32 sum rounds once
        return cast(expr, dtype)

    # ------------------------------------------------------------ range inference
    def _infer_range(self, var: str, body: ast.Node, where: str, span: Span | None, temp: str | None = None,
                     typed: Expr | None = None) -> Expr:
        sources = self._alone_uses(var, body)
        if not sources and typed is not None:
            extent = _affine_extent(var, typed, self.tensors)
            if extent is not None:
                return extent
        if not sources:
            if temp is not None:
                raise TccShapeError(f"cannot infer the range of index {var!r} of {temp}: it is never used "
                                    "alone as an index on the right", span,
                                    f"declare the shape on its own line first: {temp}: f32[...]")
            raise TccShapeError(f"cannot infer the range of reduction index {var!r}: it is never used alone "
                                "as an index in the reduction", span,
                                f"give it explicitly: sum[{var}: EXTENT](...)")
        if len({s.extent for s in sources}) > 1:
            self.range_checks.append(RangeCheck(var, where, tuple(sources)))
        return sources[0].extent

    def _alone_uses(self, var: str, node: ast.Node) -> list[RangeSource]:
        out: list[RangeSource] = []
        if isinstance(node, ast.ReduceExpr):
            if any(ax.name == var for ax in node.axes):
                return out
            return self._alone_uses(var, node.body)
        if isinstance(node, ast.Access) and node.tensor in self.tensors:
            tensor = self.tensors[node.tensor]
            for dim, idx in enumerate(node.indices):
                if isinstance(idx, ast.Name) and idx.id == var and dim < len(tensor.shape):
                    out.append(RangeSource(node.tensor, dim, tensor.shape[dim], idx.span))
        for child in _ast_children(node):
            out.extend(self._alone_uses(var, child))
        return out

    # ------------------------------------------------------------ expressions
    def _expr(self, node: ast.Node, env: dict[str, Var], what: str, shape_only: bool = False) -> Typed:
        method = getattr(self, f"_e_{type(node).__name__}")
        return method(node, env, what, shape_only)

    def _e_Num(self, n: ast.Num, env, what, shape_only) -> Typed:
        if n.is_float:
            return Typed(Const(float(n.value), dtypes.f64), "f", n.span)
        typed = Typed(Const(int(n.value), dtypes.i64), "i", n.span)
        _check_literal(typed, dtypes.i64, n.span)
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
                               _suggest(n.id, self.symbols + list(self.cparams))
                               or "shape symbols are bound by input tensors' dims")
        if n.id in self.scalars:
            return Typed(Var(n.id, self.scalars[n.id].dtype))
        if n.id in self.tensors or n.id in self.declared:
            raise TccNameError(f"{n.id!r} is a tensor: read an element with {n.id}[...]", n.span)
        raise TccNameError(f"unknown name {n.id!r}", n.span,
                           _suggest(n.id, list(env) + self.symbols + list(self.cparams) + list(self.scalars)))

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
        return Typed(Read(n.tensor, tuple(indices), tensor.dtype, n.span))

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
        _check_literal(a, dtype, span)
        _check_literal(b, dtype, span)
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
            _check_literal(args[0], dtypes.ALL[fn], n.span)
            return Typed(cast(args[0].expr, dtypes.ALL[fn]))
        if fn in ("max", "min", "pow"):
            self._arity(n, 2)
            return self._binary(fn, args[0], args[1], n.span)
        if fn == "select":
            self._arity(n, 3)
            self._require_bool(args[0], n.args[0].span, "select")
            dtype, weak = self._unify(args[1], args[2], n.span)
            _check_literal(args[1], dtype, n.span)
            _check_literal(args[2], dtype, n.span)
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
        if fn in REDUCE_OPS:
            raise TccSyntaxError(f"{fn} is a reduction and needs its indices", n.span,
                                 f"write {fn}[k](expr), or max(a, b) / min(a, b) for two values")
        known = list(dtypes.ALL) + ["max", "min", "pow", "select", *MATH_FUNCS]
        raise TccNameError(f"unknown function {fn!r}", n.span, _suggest(fn, known))

    def _arity(self, n: ast.CallExpr, count: int) -> None:
        if len(n.args) != count:
            raise TccTypeError(f"{n.fn} takes {count} argument{'s' if count > 1 else ''}, got {len(n.args)}",
                               n.span)

    def _e_ReduceExpr(self, n: ast.ReduceExpr, env, what, shape_only) -> Typed:
        if shape_only:
            raise TccSyntaxError(f"{what} cannot contain a reduction", n.span)
        inner = dict(env)
        axes_vars = []
        for ax in n.axes:
            _not_reserved(ax.name, ax.span)
            if ax.name in inner or ax.name in self._taken():
                raise TccNameError(f"reduction index {ax.name!r} is already in use", ax.span,
                                   "choose another index name")
            inner[ax.name] = Var(ax.name, dtypes.i64)
            axes_vars.append(ax)
        body = self._expr(n.body, inner, what)
        axes = []
        for ax in axes_vars:
            if ax.extent is not None:
                extent = self._dim(ax.extent, f"the extent of {ax.name}")
            else:
                extent = self._infer_range(ax.name, n.body, f"{n.op}[{ax.name}]", ax.span)
            axes.append(IterVar(inner[ax.name], extent))
        operand = body.dtype if body.weak is None else dtypes.weak_default(body.weak)
        if operand.is_bool and n.op in ("sum", "prod"):
            raise TccTypeError(f"{n.op} of bool values", n.span, "convert first, e.g. i32(x > 0)")
        result = operand
        if n.op in ("sum", "prod") and operand.is_int and operand.bits < 64:
            result = dtypes.i64  # NumPy sums small integers in the platform integer
        half = operand in (dtypes.f16, dtypes.bf16)
        acc = dtypes.f32 if half else result
        expr = in_f32(body.expr) if half else body.expr
        return Typed(Reduce(n.op, tuple(axes), cast(expr, acc), result, acc, n.span))


_HALF = (dtypes.f16, dtypes.bf16)


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
    if isinstance(e, Cast) and e.a.dtype in _HALF and e.dtype not in _HALF:
        return replace(e, a=in_f32(e.a))
    return cast(e, dtypes.f32) if e.dtype in _HALF else e


def _widened(dtype: DType) -> DType:
    return dtypes.f32 if dtype in _HALF else dtype


RESERVED = ("inf", "nan")  # float literals; the lexer reads them as names only where no value can stand


def _not_reserved(name: str, span: Span | None) -> None:
    if name in RESERVED:
        raise TccNameError(f"{name!r} is a float literal and cannot name a tensor, index or parameter", span,
                           "choose another name")


def _check_literal(value: Typed, dtype: DType, span: Span | None) -> None:
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


def _add(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value, dtypes.i64)
    return Binary("add", a, b, dtypes.i64)


def _ast_children(node: ast.Node) -> list[ast.Node]:
    out: list[ast.Node] = []
    for value in vars(node).values():
        if isinstance(value, ast.Node):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.Node))
    return out


# ---------------------------------------------------------------- affine range inference

def _affine_extent(var: str, body: Expr, tensors: dict[str, Tensor]) -> Expr | None:
    """The largest range of ``var`` that keeps every read ``T[c*var + rest]`` in bounds.

    Used when ``var`` is never an index on its own, as in ``Z[n, f, y, x] = sum[c, r, s](
    Xp[n, c, y*S + r, x*S + s] * ...)``: ``y*S + r <= dim - 1`` for every ``r`` gives
    ``y < (dim - max(r)) // S + 1``. Several reads give the minimum. The bounds proof
    re-checks the result for the concrete shapes.
    """
    extents = {ax.var.name: ax.extent for n in walk(body) if isinstance(n, Reduce) for ax in n.axes}
    found: list[Expr] = []
    for read in (n for n in walk(body) if isinstance(n, Read)):
        for dim, idx in enumerate(read.indices):
            form = _linear(idx, extents.keys() | {var})
            if form is None or var not in form:
                continue
            coef = form.pop(var)
            if (isinstance(coef, Const) and coef.value <= 0) or any(v not in extents for v in form if v):
                continue
            top = _sub(tensors[read.tensor].shape[dim], Const(1, dtypes.i64))
            for v, c in form.items():  # subtract the largest value of the rest of the index
                if isinstance(c, Const) and c.value < 0:
                    break
                top = _sub(top, c if v is None else _mul(c, _sub(extents[v], Const(1, dtypes.i64))))
            else:
                found.append(_add(Binary("floordiv", top, coef, dtypes.i64), Const(1, dtypes.i64)))
    if not found:
        return None
    out = found[0]
    for other in found[1:]:
        if other != out:
            out = Binary("min", out, other, dtypes.i64)
    return out


def _linear(e: Expr, index_vars: set[str]) -> dict[str | None, Expr] | None:
    """``e`` as {index var: coefficient, None: constant part}, or None if not affine."""
    if isinstance(e, Var):
        return {e.name: Const(1, dtypes.i64)} if e.name in index_vars else {None: e}
    if isinstance(e, Const):
        return {None: e}
    if isinstance(e, Unary) and e.op == "neg":
        inner = _linear(e.a, index_vars)
        return None if inner is None else {k: _mul(Const(-1, dtypes.i64), v) for k, v in inner.items()}
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _linear(e.a, index_vars), _linear(e.b, index_vars)
        if a is None or b is None:
            return None
        for k, v in b.items():
            v = v if e.op == "add" else _mul(Const(-1, dtypes.i64), v)
            a[k] = _add(a[k], v) if k in a else v
        return a
    if isinstance(e, Binary) and e.op == "mul":
        a, b = _linear(e.a, index_vars), _linear(e.b, index_vars)
        if a is None or b is None:
            return None
        if list(a) == [None]:
            return {k: _mul(a[None], v) for k, v in b.items()}
        if list(b) == [None]:
            return {k: _mul(v, b[None]) for k, v in a.items()}
    return None


def _sub(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value - b.value, dtypes.i64)
    return Binary("sub", a, b, dtypes.i64)


def _mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and a.value == 1:
        return b
    if isinstance(b, Const) and b.value == 1:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value, dtypes.i64)
    return Binary("mul", a, b, dtypes.i64)
