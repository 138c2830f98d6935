"""A symbolic TE op as source text of the language, for ops that passes derive (``tcc.grad``).

The text parses back to the same computation, so a derived op goes through the frontend and
prints at every stage like a hand-written one. Intermediates are declared before their
statement, reductions give their extents, and each ``pad`` follows its source's statement.
"""

from __future__ import annotations

from dataclasses import replace

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, Reduce, format_expr, transform
from tcc.ir.te import OpTE, Pad, Tensor


def format_source(op: OpTE) -> str:
    """``op NAME[...](...) -> (...) { ... }`` for a symbolic (unspecialised) op."""
    lines = [_header(op)]
    for name in op.inputs:
        lines += _pads_of(op, name)
    for c in op.computes:
        t = op.tensors[c.tensor]
        if c.accumulate:  # its index variables are inferred again from where they appear alone
            lhs = ", ".join(source_expr(i) for i in c.target_indices())
            lines.append(f"    {c.tensor}[{lhs}] += {source_expr(c.body)}")
            continue
        if t.kind != "result":
            lines.append(f"    {c.tensor}: {_shape(t)}")
        axes = ", ".join(ax.var.name for ax in c.axes)
        lines.append(f"    {c.tensor}[{axes}] = {source_expr(c.body)}")
        lines += _pads_of(op, c.tensor)
    lines.append("}")
    return "\n".join(lines) + "\n"


def source_expr(e: Expr) -> str:
    """An expression as the language spells it (accumulator dtypes become explicit casts)."""
    return format_expr(transform(e, _spellable))


def _spellable(e: Expr) -> Expr | None:
    if isinstance(e, Reduce) and e.acc_dtype != e.dtype:
        return replace(e, dtype=e.acc_dtype)  # the body is cast to the accumulator already
    if isinstance(e, Const) and e.dtype.is_bool:  # the language has no bool literals
        return Binary("eq", Const(0, dtypes.i64), Const(0 if e.value else 1, dtypes.i64), dtypes.boolean)
    return None


def _header(op: OpTE) -> str:
    cparams = ""
    if op.cparams:
        cparams = "[" + ", ".join(f"{k} = {v!r}" for k, v in op.cparams.items()) + "]"
    params = []
    for p in op.params:
        params.append(f"{p}: {_shape(op.tensors[p])}" if p in op.tensors else f"{p}: {op.scalars[p].dtype}")
    results = ", ".join(f"{r}: {_shape(op.tensors[r])}" for r in op.results)
    return f"op {op.name}{cparams}({', '.join(params)})\n    -> ({results}) {{"


def _shape(t: Tensor) -> str:
    return f"{t.dtype}[{', '.join(format_expr(d) for d in t.shape)}]"


def _pads_of(op: OpTE, source: str) -> list[str]:
    """The ``pad`` statements of ``source``, each followed by those of the view it defines."""
    lines = []
    for p in op.pads.values():
        if p.source == source:
            lines += [_pad(op, p), *_pads_of(op, p.name)]
    return lines


def _pad(op: OpTE, p: Pad) -> str:
    lo = ", ".join(format_expr(e) for e in p.lo)
    hi = ", ".join(format_expr(e) for e in p.hi)
    value = "" if isinstance(p.value, Const) and p.value.value == 0 else f", value={source_expr(p.value)}"
    return f"    {p.name} = pad({p.source}, [{lo}], [{hi}]{value})"
