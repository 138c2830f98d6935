"""Indices read from data, checked at the call.

``E[idx[n], d]`` and ``X[start + i, d]`` cannot be proved in bounds when the op compiles: the bounds
pass lists them (``OpTE.index_checks``) and every call checks them over the ranges of the variables
they use, before the kernel runs, so an out-of-range index is a ``TccIndexError`` and no result (nor
``out=``) is written. The hot loop itself has no check.

The check is the op's :class:`IndexGuard`: the kernel of a guard op compiled for the op's own
target (``tcc.index_guard``: one pass over the index tensors, one number back), which the backend
runs first, in the checked call and in the call's fast plan alike (on the plan's own pointers: no
binding, no copy). Only when it finds an index out of range does the host pass here
(:func:`run_checks`, the reference interpreter's evaluator; on CUDA after copying the index
tensors over) run, to name the first offending position and its value. On the CPU the host pass
also checks the first call of each binding, so that a guard op is compiled only for shapes that
come again (``Op._call_guard``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tcc.errors import TccArgumentError
from tcc.ir.expr import Expr, Read, Var, walk
from tcc.ir.te import OpTE
from tcc.passes.te.bounds import prove_bounds
from tcc.passes.te.specialize import specialize
from tcc.reference import check_indices, scalar_values, wide
from tcc.runtime.binding import BoundCall


@dataclass(eq=False)
class IndexGuard:
    """The index checks of one specialisation of an op, as its backend runs them: the loaded
    kernel of its guard op (result ``RESULT``: i64[1], nonzero when an index is out of range), and
    the op's tensors and scalars that kernel reads, by name, in the order of its parameters."""

    kernel: Any
    params: tuple[str, ...]
    result: str = "R"
    states: dict[Any, Any] = field(default_factory=dict)  # the backend's buffers for it, per device


def reads_data(te: OpTE) -> bool:
    """Whether an index of ``te`` reads a tensor or a runtime scalar: only then can a call need a
    check, and only then is the op specialised and proved a second time at the call."""
    def in_index(e: Expr) -> bool:
        return any(isinstance(n, Read) or isinstance(n, Var) and n.name in te.scalars for n in walk(e))

    indices = [i for c in te.computes for i in c.lhs or ()]  # where a += adds
    indices += [i for c in te.computes for e in (c.body, *(c.lhs or ())) for n in walk(e) if isinstance(n, Read)
                for i in n.indices]
    return any(in_index(i) for i in indices)


def checked_op(te: OpTE, bindings: dict[str, int | float]) -> OpTE | None:
    """The op specialised for ``bindings`` with its index checks, or None when it has none."""
    proved = prove_bounds(specialize(te, bindings))
    return proved if proved.index_checks else None


def run_checks(proved: OpTE, bound: BoundCall) -> None:
    """Raise ``TccIndexError`` if an index read from data falls outside its tensor in this call."""
    read = {n.tensor for c in proved.index_checks for n in walk(c.index) if isinstance(n, Read)}
    env = {name: host_value(bound.arrays[name], name).astype(wide(proved.tensors[name].dtype)) for name in read}
    check_indices(proved, env, scalar_values(proved, bound.scalars))


def host_value(array: Any, name: str) -> np.ndarray:
    """A host copy of an argument: a NumPy array as it is, a device tensor copied over."""
    if isinstance(array, np.ndarray):
        return array
    owner, kind = getattr(array, "owner", array), getattr(array, "kind", None)
    if kind == "torch":
        return owner.detach().cpu().numpy()
    if kind == "tcc":
        return owner.to_numpy()
    if kind == "cupy":
        return owner.get()
    raise TccArgumentError(f"{name} is read as indices, and tcc cannot copy this kind of device array to check them",
                           hint="pass a PyTorch, CuPy or tcc.cuda array")
