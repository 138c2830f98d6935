"""Semantic analysis: AST -> tensor-expression IR.

Resolves names, types every expression with NumPy promotion (inserting casts), infers the
ranges of index variables and the shapes of intermediates, and reports every mistake as a
:class:`TccError` at the span that caused it. Shapes stay symbolic here; binding them to
concrete sizes is :mod:`tcc.passes.te.specialize`'s job.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.dtypes import DType
from tcc.errors import Source, Span, TccNameError, TccShapeError, TccSyntaxError, TccTypeError
from tcc.frontend import ast, generic
from tcc.frontend.ranges import RangeCheck, RangeSource, affine_extent, ast_children, index_add
from tcc.frontend.recurrence import recurrence_axis
from tcc.frontend.sema_expr import HALF, ExprAnalyzer, Typed, check_literal, not_reserved, suggest
from tcc.ir.expr import (
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Var,
    cast,
)
from tcc.ir.te import Compute, OpTE, Pad, Scalar, Tensor


def analyze(module: ast.Module, source: Source) -> dict[str, OpTE]:
    """Check every op of a module and build its TE IR (an op generic over dtypes: for the binding
    its body is checked with, see :mod:`tcc.frontend.generic`; calls build the others)."""
    ops: dict[str, OpTE] = {}
    for op_def in module.ops:
        if op_def.name in ops:
            raise TccNameError(f"op {op_def.name!r} is defined twice", op_def.span,
                               "rename one of them")
        if generic.type_params(op_def):
            generic.check_generic(op_def)
            op_def = generic.bind(op_def, generic.checked_binding(op_def))
        ops[op_def.name] = analyze_op(op_def, source)
    return ops


def analyze_op(op_def: ast.OpDef, source: Source) -> OpTE:
    """One op's TE IR (its type parameters, if any, already bound)."""
    return _OpAnalyzer(op_def, source).run()


def _dtype(name: str, span: Span | None) -> DType:
    if name not in dtypes.ALL:
        raise TccTypeError(f"unknown dtype {name!r}", span, f"use one of {', '.join(dtypes.ALL)}")
    return dtypes.ALL[name]


class _OpAnalyzer(ExprAnalyzer):
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
        self.assigning: tuple[str, list[str]] | None = None  # the statement's tensor and its axes
        self.accumulating: list[str] = []  # the index variables of the += statement being analysed
        self.looks_back: list[str] = []  # axes along which the statement reads its own tensor

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
        not_reserved(name, span)
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
        elif isinstance(stmt, ast.Accumulate):
            self._accumulate(stmt)
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
        shape = tuple(index_add(index_add(d, a), b) for d, a, b in zip(src.shape, lo, hi))
        self.tensors[p.name] = Tensor(p.name, src.dtype, shape, "pad", p.span)
        self.pads[p.name] = Pad(p.name, p.source, tuple(lo), tuple(hi), value)
        self.defined.add(p.name)

    def _readable(self, name: str, span: Span | None) -> Tensor:
        if name in self.tensors and name in self.defined:
            return self.tensors[name]
        if self.assigning is not None and name == self.assigning[0]:
            return self._own(name, span)
        if name in self.tensors or name in self.declared:
            raise TccNameError(f"{name!r} is read before it is assigned", span,
                               "statements run in order: define a tensor before reading it")
        if name in self.scalars:
            raise TccNameError(f"{name!r} is a scalar, not a tensor", span, f"use it as {name}, without indices")
        raise TccNameError(f"unknown tensor {name!r}", span, suggest(name, self.tensors))

    def _assign(self, a: ast.Assign) -> None:
        name = a.target
        if name in self.defined or name in self.pads:
            kind = self.tensors[name].kind
            why = "an input is read-only" if kind == "input" else "each tensor is assigned by exactly one statement"
            raise TccNameError(f"{name!r} cannot be assigned here: {why}", a.span,
                               "write the new values into a new tensor")
        if name in self.scalars or name in self.cparams or name in self.symbols:
            raise TccNameError(f"{name!r} is not a tensor and cannot be assigned", a.span)
        not_reserved(name, a.span)
        axes_names = []
        for idx in a.indices:
            if not isinstance(idx, ast.Name):
                raise TccSyntaxError("left-hand indices must be plain index variables", idx.span,
                                     f"write {name}[i, ...] = ... and use the expression on the right")
            not_reserved(idx.id, idx.span)
            if idx.id in axes_names:
                raise TccNameError(f"index {idx.id!r} appears twice on the left", idx.span,
                                   "use distinct index variables")
            if idx.id in self._taken():
                raise TccNameError(f"index variable {idx.id!r} clashes with a name of the op", idx.span,
                                   "choose another index name")
            axes_names.append(idx.id)
        env = {n: Var(n, dtypes.i64) for n in axes_names}
        self.assigning, self.looks_back = (name, axes_names), []
        try:
            value = self._expr(a.value, env, what="an expression")
        finally:
            self.assigning = None
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
        sequential = tuple(n for n in axes_names if n in self.looks_back)
        self.computes.append(Compute(name, axes, body, a.span, sequential))
        self.defined.add(name)

    def _accumulate(self, a: ast.Accumulate) -> None:
        """``T[lhs] += value``: its index variables are the free names of the statement, each
        ranging where it appears alone in an access (the left-hand one included); the value
        converts to ``T``'s dtype as for ``=``."""
        name = a.target
        tensor = self.tensors.get(name)
        if tensor is None or name not in self.defined or tensor.kind not in ("result", "temp"):
            why = ("an input is read-only" if tensor is not None and tensor.kind == "input" else
                   "a pad view is read-only" if name in self.pads else
                   f"{name!r} is not defined by an earlier statement")
            raise TccNameError(f"cannot add into {name!r}: {why}", a.span,
                               f"define it first ({name}[i, ...] = 0), then add with +=")
        target = ast.Access(name, a.indices, span=a.span)
        names = _free_names([target, a.value], self._taken())
        env = {n: Var(n, dtypes.i64) for n in names}
        axes = tuple(IterVar(env[n], self._accumulate_range(n, target, a)) for n in names)
        lhs = self._expr(target, env, what="the left-hand side").expr
        self.accumulating = names  # (a reduction extent may use them: sum[j: n + 1])
        try:
            value = self._expr(a.value, env, what="an expression")
        finally:
            self.accumulating = []
        body = self._convert(value, tensor.dtype, a.value.span, f"the value added into {name}")
        self.computes.append(Compute(name, axes, body, a.span, lhs=lhs.indices, accumulate=True))

    def _accumulate_range(self, var: str, target: ast.Access, a: ast.Accumulate) -> Expr:
        sources = self._alone_uses(var, target) + self._alone_uses(var, a.value)
        if not sources:
            raise TccShapeError(f"cannot infer the range of index {var!r} of this += statement: it is never "
                                "used alone as an index", a.span,
                                f"use {var} alone in an access (X[{var}]), or check the spelling if it "
                                "is meant to name a tensor, scalar or parameter")
        if len({s.extent for s in sources}) > 1:
            self.range_checks.append(RangeCheck(var, f"{a.target} +=", tuple(sources)))
        return sources[0].extent

    def _convert(self, value: Typed, dtype: DType, span: Span | None, what: str) -> Expr:
        """Implicit conversion at a store: NumPy's same-kind rule (no float -> int)."""
        src = value.dtype
        if value.weak is None and src.is_float and not dtype.is_float:
            raise TccTypeError(f"{what} is {src} but must be stored as {dtype}", span,
                               f"convert explicitly: {dtype}(...)")
        if value.weak == "f" and not dtype.is_float:
            raise TccTypeError(f"{what} is a float but must be stored as {dtype}", span,
                               f"convert explicitly: {dtype}(...)")
        check_literal(value, dtype, span)
        expr = value.expr
        if isinstance(expr, Reduce) and expr.dtype in HALF and dtype.is_float and dtype.bits >= 32:
            expr = replace(expr, dtype=dtypes.f32)  # a half reduction stored wider: its f32 sum rounds once
        return cast(expr, dtype)

    def statement_axes(self) -> list[str]:
        return self.assigning[1] if self.assigning is not None else list(self.accumulating)

    # ------------------------------------------------------------ recurrences
    def _own(self, name: str, span: Span | None) -> Tensor:
        """The tensor a statement defines, read by itself (a recurrence): its shape must be known."""
        known = self.tensors.get(name) or self.declared.get(name)
        if known is None:
            raise TccShapeError(f"{name!r} reads itself, so its shape must be known before its statement",
                                span, f"declare it on its own line first: {name}: f32[...]")
        return known

    def self_read(self, read: Read) -> None:
        """Check a statement's read of its own tensor (:mod:`tcc.frontend.recurrence`)."""
        if self.assigning is None or read.tensor != self.assigning[0]:
            return
        axis = recurrence_axis(read.tensor, read.indices, self.assigning[1], read.span)
        if self.looks_back and axis not in self.looks_back:
            raise TccShapeError(f"{read.tensor} reads itself earlier along {self.looks_back[0]} and along {axis}: "
                                "a recurrence runs in order along one axis", read.span,
                                f"read {read.tensor} at earlier positions along {self.looks_back[0]} only")
        self.looks_back.append(axis)

    # ------------------------------------------------------------ range inference
    def _infer_range(self, var: str, body: ast.Node, where: str, span: Span | None, temp: str | None = None,
                     typed: Expr | None = None) -> Expr:
        sources = self._alone_uses(var, body)
        if not sources and typed is not None:
            extent = affine_extent(var, typed, self.tensors)
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
        for child in ast_children(node):
            out.extend(self._alone_uses(var, child))
        return out

    # ------------------------------------------------------------ expressions


def _free_names(nodes: list[ast.Node], known: set[str]) -> list[str]:
    """The names of ``nodes`` that are none of ``known`` nor a reduction's own index, in order of
    first appearance: the index variables of an accumulating statement."""
    out: list[str] = []

    def visit(node: ast.Node, bound: frozenset[str]) -> None:
        if isinstance(node, ast.ReduceExpr):
            for ax in node.axes:
                if ax.extent is not None:
                    visit(ax.extent, bound)
            visit(node.body, bound | {ax.name for ax in node.axes})
            return
        if isinstance(node, ast.Name) and node.id not in known and node.id not in bound and node.id not in out:
            out.append(node.id)
        for child in ast_children(node):
            visit(child, bound)

    for n in nodes:
        visit(n, frozenset())
    return out


