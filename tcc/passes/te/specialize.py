"""Bind an op's shape symbols and compile-time parameters to concrete values.

Every op compiles for concrete shapes (the cache key holds them). After this pass every
tensor dim and axis extent is a constant, which is what range checks, the bounds proof and
every later pass work with.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.errors import TccShapeError
from tcc.ir.expr import Const, Expr, IterVar, substitute
from tcc.ir.te import OpTE, Pad
from tcc.passes.simplify import evaluate_int, simplify


def specialize(op: OpTE, bindings: dict[str, int | float]) -> OpTE:
    """``op`` with ``bindings`` (every symbol and compile-time parameter) substituted."""
    missing = [s for s in (*op.symbols, *op.cparams) if s not in bindings]
    if missing:
        raise TccShapeError(f"op {op.name}: no value for {', '.join(missing)}", op.span,
                            "give shapes with --shape/-D, or call the op with arrays")
    mapping: dict[str, Expr] = {}
    for name, value in bindings.items():
        is_float = isinstance(value, float)
        mapping[name] = Const(value, dtypes.f64 if is_float else dtypes.i64)

    def sub(e: Expr) -> Expr:
        return simplify(substitute(e, mapping))

    tensors = {}
    for name, t in op.tensors.items():
        dims = []
        for i, d in enumerate(t.shape):
            value = evaluate_int(sub(d))
            if value is None or value < 0:
                shown = "not an integer" if value is None else str(value)
                raise TccShapeError(f"dim {i} of {name} is {shown} for {_fmt(bindings)}", t.span,
                                    "check the input shapes and compile-time parameters")
            dims.append(Const(value, dtypes.i64))
        tensors[name] = replace(t, shape=tuple(dims))
    _check_ranges(op, sub, bindings)
    computes = [replace(c, axes=_axes(c.axes, sub), body=sub(c.body), lhs=_lhs(c.lhs, sub)) for c in op.computes]
    pads = {n: Pad(n, p.source, tuple(sub(x) for x in p.lo), tuple(sub(x) for x in p.hi), sub(p.value))
            for n, p in op.pads.items()}
    for name, pad in pads.items():
        widths = [evaluate_int(w) for w in (*pad.lo, *pad.hi)]
        if any(w is None or w < 0 for w in widths):
            raise TccShapeError(f"pad {name} has a negative width for {_fmt(bindings)}: {widths}",
                                op.tensors[name].span, "pad widths must be >= 0 (crop with indices instead)")
    return replace(op, tensors=tensors, computes=computes, pads=pads,
                   bindings=dict(bindings), range_checks=[])


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
