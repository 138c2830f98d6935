"""check_fp8: refuse 8-bit floats on a target without them, before anything is lowered.

``f8e4m3`` and ``f8e5m2`` exist on GPUs with FP8 tensor cores alone (``Target.fp8``: compute
capability 8.9 and later); elsewhere there is no conversion instruction and no matrix unit to
serve them, and an emulation would be a silent, slow surprise. The error points at the first
tensor declared with such a type, or the first statement that converts to one.
"""

from __future__ import annotations

from tcc.errors import Span, TccTypeError
from tcc.ir.expr import Cast, walk
from tcc.ir.te import OpTE
from tcc.target import Target


def check_fp8(op: OpTE, target: Target) -> OpTE:
    """``op`` unchanged, or a TccTypeError at its first use of an 8-bit float when ``target`` has none."""
    if target.fp8:
        return op
    found = _first_use(op)
    if found is None:
        return op
    name, span = found
    where = "the CPU" if not target.is_gpu else f"this GPU ({target.arch})"  # type: ignore[union-attr]
    raise TccTypeError(f"{name} needs FP8 tensor cores, which {where} does not have", span,
                       "compile for target='cuda' on a GPU of compute capability 8.9 or later (sm_89, sm_90), "
                       "or use f16/bf16 instead")


def _first_use(op: OpTE) -> tuple[str, Span | None] | None:
    """(what, where) of the first 8-bit float: a tensor's declaration, else a conversion."""
    for tensor in op.tensors.values():
        if tensor.dtype.is_fp8:
            return f"{tensor.name}: {tensor.dtype}", tensor.span or op.span
    for scalar in op.scalars.values():
        if scalar.dtype.is_fp8:
            return f"{scalar.name}: {scalar.dtype}", op.span
    for c in op.computes:
        for e in walk(c.body):
            if isinstance(e, Cast) and e.dtype.is_fp8:
                return f"the conversion {e.dtype}(...)", c.span or op.span
    return None
