"""``tcc.grad``: the op that computes another op's gradients, compiled like any other op."""

from __future__ import annotations

from collections.abc import Sequence

from tcc.compiler import Op, compile
from tcc.ir.source import format_source
from tcc.passes.te.grad import derive


def grad_source(op: Op, wrt: Sequence[str] | str | None = None, name: str | None = None) -> str:
    """The source text of ``op``'s gradient op (see :func:`grad`)."""
    return format_source(derive(op.te, wrt, name))


def grad(op: Op, wrt: Sequence[str] | str | None = None, name: str | None = None) -> Op:
    """The op ``NAME_grad(inputs..., dR...) -> (dX...)``: given the upstream gradient ``dR`` of each
    result of ``op``, the gradient of each input named in ``wrt`` (default: every float tensor input),
    in that order. It is derived from ``op``'s TE (``tcc.passes.te.grad``), printed as source and
    compiled for ``op``'s target and options; ``grad_op.lower(..., stage=S)`` shows any stage."""
    source = grad_source(op, wrt, name)
    library = compile(source, target=op.target, **op.library_options)
    return library[name or f"{op.name}_grad"]
