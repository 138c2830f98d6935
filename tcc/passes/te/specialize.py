"""Bind an op's shape symbols and compile-time parameters to concrete values.

An op compiles for concrete shapes (the cache key holds them), except for the shape symbols
made *dynamic* (``tcc.compile(..., dynamic=...)``): those stay variables, read by the kernel
at the call, and the dims and extents built from them stay expressions. Every other dim and
extent is a constant after this pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tcc import dtypes
from tcc.errors import TccShapeError
from tcc.ir.expr import Binary, Const, Expr, IterVar, Var, free_vars, substitute
from tcc.ir.te import OpTE, Pad
from tcc.passes.simplify import evaluate_int, simplify


def specialize(op: OpTE, bindings: dict[str, int | float], dynamic: frozenset[str] = frozenset(),
               multiples: Mapping[str, int] | None = None) -> OpTE:
    """``op`` with ``bindings`` (every symbol and compile-time parameter) substituted, except the
    symbols in ``dynamic``, which stay variables (their values in ``bindings`` only check that the
    shapes make sense for one call). A dynamic symbol ``S`` declared a multiple of ``m``
    (``multiples``, checked at every call) becomes ``m * (S // m)``: the schedules see the factor."""
    missing = [s for s in (*op.symbols, *op.cparams) if s not in bindings and s not in dynamic]
    if missing:
        raise TccShapeError(f"op {op.name}: no value for {', '.join(missing)}", op.span,
                            "give shapes with --shape/-D, or call the op with arrays")
    mapping: dict[str, Expr] = {}
    for name, multiple in (multiples or {}).items():
        if name in dynamic and multiple > 1:
            symbol = Var(name, dtypes.i64)
            mapping[name] = Binary("mul", Const(multiple, dtypes.i64),
                                   Binary("floordiv", symbol, Const(multiple, dtypes.i64), dtypes.i64), dtypes.i64)
    for name, value in bindings.items():
        if name in dynamic:
            continue
        is_float = isinstance(value, float)
        mapping[name] = Const(value, dtypes.f64 if is_float else dtypes.i64)

    def sub(e: Expr) -> Expr:
        return simplify(substitute(e, mapping))

    tensors = {}
    for name, t in op.tensors.items():
        dims = []
        for i, d in enumerate(t.shape):
            if dynamic and free_vars(d) & dynamic:
                dims.append(sub(d))  # checked for this call's values by the runtime (binding)
                continue
            value = evaluate_int(sub(d))
            if value is None or value < 0:
                shown = "not an integer" if value is None else str(value)
                raise TccShapeError(f"dim {i} of {name} is {shown} for {_fmt(bindings)}", t.span,
                                    "check the input shapes and compile-time parameters")
            dims.append(Const(value, dtypes.i64))
        tensors[name] = replace(t, shape=tuple(dims))
    if not dynamic:
        _check_ranges(op, sub, bindings)
    computes = [replace(c, axes=_axes(c.axes, sub), body=sub(c.body), lhs=_lhs(c.lhs, sub)) for c in op.computes]
    pads = {n: Pad(n, p.source, tuple(sub(x) for x in p.lo), tuple(sub(x) for x in p.hi), sub(p.value))
            for n, p in op.pads.items()}
    for name, pad in pads.items():
        if dynamic and any(free_vars(w) & dynamic for w in (*pad.lo, *pad.hi)):
            continue
        widths = [evaluate_int(w) for w in (*pad.lo, *pad.hi)]
        if any(w is None or w < 0 for w in widths):
            raise TccShapeError(f"pad {name} has a negative width for {_fmt(bindings)}: {widths}",
                                op.tensors[name].span, "pad widths must be >= 0 (crop with indices instead)")
    return replace(op, tensors=tensors, computes=computes, pads=pads,
                   bindings={k: v for k, v in bindings.items() if k not in dynamic}, range_checks=[],
                   dynamic=tuple(s for s in op.symbols if s in dynamic))


DYNAMIC_EXTENT = 1024  # what cost models assume of a dynamic shape symbol: large enough to tile and repeat


def size_hint(e: Expr, dynamic: tuple[str, ...] | frozenset[str]) -> int | None:
    """The value of an extent or dim for the cost models: a constant's, or with each dynamic shape
    symbol taken as :data:`DYNAMIC_EXTENT`; None where it depends on anything else (a loop index)."""
    if isinstance(e, Const):
        return int(e.value)
    names = free_vars(e)
    if not names or not names <= set(dynamic):
        return None
    return evaluate_int(simplify(substitute(e, {n: Const(DYNAMIC_EXTENT, dtypes.i64) for n in names})))


def _axes(axes: tuple[IterVar, ...], sub) -> tuple[IterVar, ...]:
    return tuple(IterVar(ax.var, sub(ax.extent)) for ax in axes)


def _lhs(lhs: tuple[Expr, ...] | None, sub) -> tuple[Expr, ...] | None:
    """An accumulation's left-hand indices, bound (None for an ordinary statement)."""
    return None if lhs is None else tuple(sub(i) for i in lhs)


def _check_ranges(op: OpTE, sub, bindings: dict[str, int | float]) -> None:
    for check in op.range_checks:
        sizes = [(s, evaluate_int(sub(s.extent))) for s in check.sources]
        if len({size for _, size in sizes}) > 1:
            (first, a), other = sizes[0], next((s, n) for s, n in sizes if n != sizes[0][1])
            raise TccShapeError(
                f"index {check.var!r} of {check.where} ranges over {first.tensor} dim {first.dim} "
                f"(size {a}) and {other[0].tensor} dim {other[0].dim} (size {other[1]})",
                other[0].span, "the sizes must agree; declare the tensor's shape or use separate indices")


def _fmt(bindings: dict[str, int | float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items()) or "these shapes"
