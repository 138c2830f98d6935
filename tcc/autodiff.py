"""``tcc.grad``: the op that computes another op's gradients, compiled like any other op."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tcc.compiler import Op, compile
from tcc.generic_op import GenericOp
from tcc.ir.source import format_source
from tcc.passes.te.grad import derive
from tcc.passes.te.grad import saving as saving_te


def grad_source(op: Op | GenericOp, wrt: Sequence[str] | str | None = None, name: str | None = None,
                saved: Sequence[str] = ()) -> str:
    """The source text of ``op``'s gradient op (see :func:`grad`); of an op generic over dtypes, its
    gradient for the binding the op is checked with (``float``: f32)."""
    op = op.checked if isinstance(op, GenericOp) else op
    return format_source(derive(op.te, wrt, name, saved))


def grad(op: Op | GenericOp, wrt: Sequence[str] | str | None = None, name: str | None = None,
         saved: Sequence[str] = ()) -> Op | GenericGrad:
    """The op ``NAME_grad(inputs..., dR..., saved...) -> (dX...)``: given the upstream gradient
    ``dR`` of each result of ``op``, the gradient of each input named in ``wrt`` (default: every
    float tensor input), in that order. It is derived from ``op``'s TE (``tcc.passes.te.grad``),
    printed as source and compiled for ``op``'s target and options; ``grad_op.lower(..., stage=S)``
    shows any stage. It computes again what it needs of the forward, except the tensors named in
    ``saved`` (those it reads among them become its last parameters, in that order: the values
    :func:`saving`'s op returns; attention's ``["m", "l", "O"]`` leave it only the backward).
    For an op generic over dtypes (``op f[T: float](...)``) the gradient is generic too: each
    binding of the type parameters, read from the arguments as for ``op``, derives its own."""
    if isinstance(op, GenericOp):
        return GenericGrad(op, wrt, name, tuple(saved))
    source = grad_source(op, wrt, name, saved)
    library = compile(source, target=op.target, **op.library_options)
    return library[name or f"{op.name}_grad"]


def saving(op: Op | GenericOp, saved: Sequence[str], name: str | None = None) -> Op:
    """``op`` returning also its intermediates ``saved`` (after its own results): the forward of a
    training step whose backward is ``grad(op, saved=saved)``. Of a generic op, its binding with
    ``float`` as f32 (bind it first for another)."""
    op = op.checked if isinstance(op, GenericOp) else op
    te = saving_te(op.te, saved, name)
    library = compile(format_source(te), target=op.target, **op.library_options)
    return library[te.name]


class GenericGrad:
    """``tcc.grad`` of a generic op: the gradient op of each binding, derived on first use and kept."""

    def __init__(self, op: GenericOp, wrt: Sequence[str] | str | None, name: str | None, saved: tuple[str, ...] = ()):
        self.op, self.wrt, self.name, self.saved = op, wrt, name or f"{op.name}_grad", saved
        self._grads: dict[tuple[tuple[str, str], ...], Op] = {}

    def __repr__(self) -> str:
        return f"<tcc gradient of {self.op!r}>"

    def bound(self, **binding: str) -> Op:
        """The gradient op of one binding of the type parameters (``T="bf16"``)."""
        key = tuple(sorted(binding.items()))
        if key not in self._grads:
            self._grads[key] = grad(self.op.bound(**binding), self.wrt, self.name, self.saved)
        return self._grads[key]

    def op_for(self, args: tuple[Any, ...]) -> Op:
        """The binding's gradient op: the type parameters bind from the op's own arguments, which
        the gradient op takes first."""
        return self.bound(**self.op.binding(args[:len(self.op.ast.params)]))

    def __call__(self, *args: Any, out: Any = None, **cparams: Any) -> Any:
        return self.op_for(args)(*args, out=out, **cparams)

    def lower(self, *args: Any, stage: str = "loops", **cparams: Any) -> str:
        return self.op_for(args).lower(*args, stage=stage, **cparams)
