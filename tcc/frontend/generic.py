"""Ops generic over dtypes: ``op rmsnorm[T: float](X: T[N, D], g: T[D]) -> Y: T[N, D]``.

A type parameter is bound like a shape symbol, by the first parameter declared with it, and every
other use must agree. Binding rewrites the op's AST with the concrete dtype (parameters,
declarations, results and ``T(x)`` casts), and the rewritten op is checked and compiled like any
other: each binding is an ordinary op with its own kernels, so nothing downstream of the
frontend knows that generic ops exist.
"""

from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass

from tcc import dtypes
from tcc.errors import Span, TccTypeError
from tcc.frontend import ast

TYPE_KINDS: dict[str, tuple[str, ...]] = {
    "float": ("f16", "bf16", "f32", "f64"),
    "int": ("i8", "i32", "i64"),
    "any": tuple(dtypes.ALL),
}
CHECKED_AS = {"float": "f32", "int": "i64", "any": "f32"}  # the binding an op's body is checked with


def type_params(op: ast.OpDef) -> list[ast.TypeParam]:
    return [p for p in op.cparams if isinstance(p, ast.TypeParam)]


def binders(op: ast.OpDef) -> dict[str, str]:
    """Each type parameter and the parameter that binds it (the first declared with it)."""
    found: dict[str, str] = {}
    for p in op.params:
        found.setdefault(p.dtype, p.name)
    return {t.name: found[t.name] for t in type_params(op) if t.name in found}


def check_generic(op: ast.OpDef) -> None:
    """A type parameter has a known kind, is not a dtype's name and binds from a parameter."""
    bound = binders(op)
    for t in type_params(op):
        if t.kind not in TYPE_KINDS:
            raise TccTypeError(f"{t.name}: {t.kind} is not a kind of dtype", t.span,
                               f"write {t.name}: float, {t.name}: int or {t.name}: any")
        if t.name in dtypes.ALL:
            raise TccTypeError(f"{t.name!r} is a dtype; a type parameter needs another name", t.span)
        if t.name not in bound:
            raise TccTypeError(f"no parameter of {op.name} is declared with type {t.name}, so nothing binds it",
                               t.span, f"declare an input as {t.name}[...] or a scalar as {t.name}")


def admit(op: ast.OpDef, name: str, dtype: str, span: Span | None = None) -> None:
    """Refuse ``dtype`` for type parameter ``name`` where its kind does not admit it."""
    kind = next(t.kind for t in type_params(op) if t.name == name)
    if dtype not in TYPE_KINDS[kind]:
        raise TccTypeError(f"{op.name}: {name} is {kind} ({', '.join(TYPE_KINDS[kind])}), but "
                           f"{binders(op)[name]} is {dtype}", span, f"pass a {kind} array")


def checked_binding(op: ast.OpDef) -> dict[str, str]:
    """The binding compile checks the body with, before any call binds the real one."""
    return {t.name: CHECKED_AS[t.kind] for t in type_params(op)}


def bind(op: ast.OpDef, binding: dict[str, str]) -> ast.OpDef:
    """A copy of ``op`` with each type parameter replaced by its dtype; the name is unchanged."""
    bound = copy.deepcopy(op)
    bound.cparams = [p for p in bound.cparams if not isinstance(p, ast.TypeParam)]
    _substitute(bound, binding)
    return bound


def _substitute(node: object, binding: dict[str, str]) -> None:
    if isinstance(node, list):
        for item in node:
            _substitute(item, binding)
        return
    if not is_dataclass(node):
        return
    if isinstance(node, ast.Param | ast.Decl) and node.dtype in binding:
        node.dtype = binding[node.dtype]
    if isinstance(node, ast.CallExpr) and node.fn in binding:
        node.fn = binding[node.fn]  # T(x): a cast to the bound dtype
    for f in fields(node):
        if f.name != "span":
            _substitute(getattr(node, f.name), binding)
