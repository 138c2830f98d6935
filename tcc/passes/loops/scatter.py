"""Which loops over an accumulating store (a ``+=`` statement: a scatter) may run concurrently.

Two iterations of a scatter may add into the same element (``H[X[n]] += 1``), so a loop over one
runs its iterations in parallel or as vector lanes only where they provably hit distinct
elements: some left-hand index is ``c * v + rest`` for the loop's variable ``v`` (``c != 0``),
with ``rest`` free of data reads and of the variables of loops inside it (``dE[idx[n], d]`` over
``d``). Anything else stays serial (on CUDA the store becomes an atomic add instead).
"""

from __future__ import annotations

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import Expr, Load, free_vars, walk
from tcc.ir.loopnest import linear_coeff, stores
from tcc.ir.loops import For, Let, walk_stmts


def check_scatter(loop: For, what: str, span: Span | None = None) -> None:
    """Raise :class:`TccScheduleError` when iterations of ``loop`` may add into one element;
    ``what`` names the transformation refused ("run in parallel", "vectorise")."""
    inner = {n.var.name for n in walk_stmts(loop.body) if isinstance(n, For | Let)}
    for st in stores(loop.body):
        if st.accumulate and not any(_injective(i, loop.var.name, inner) for i in st.indices):
            raise TccScheduleError(
                f"iterations of loop {loop.var.name} may add into the same element of {st.buffer} (a += "
                f"statement): they cannot {what}", span,
                f"{what} a loop whose variable appears alone in the left-hand indices of the +=")


def _injective(index: Expr, var: str, inner: set[str]) -> bool:
    """Whether ``index`` differs between any two iterations of loop ``var`` (all else equal)."""
    coeff = linear_coeff(index, var)
    return bool(coeff) and not (free_vars(index) & inner) and not any(isinstance(n, Load) for n in walk(index))
