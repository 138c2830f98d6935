"""The index checks of an op, as an op of the language: the guard a call runs before its kernels.

A call checks the indices it reads from data before its kernels run, so that an index out of
range is a ``TccIndexError`` with nothing written. A host pass over the index tensor would cost
a call's Python and, on CUDA, a copy of the tensor to the host (0.15-0.4 ms, ten times an
embedding lookup). So the checks of one specialisation are themselves a tiny op, compiled for the
op's own target: ``R[0]`` counts the checks whose index leaves its tensor somewhere,

    R[tcc_guard] = max[n: 4096](select(i64(idx[n]) < 0 or i64(idx[n]) >= 50000, 1, 0)) + ...

one vectorised (CPU) or parallel (CUDA) pass over the index tensors, and one number back. The
backends run its kernel as the first step of the call and of the call's fast plan, on the plan's
own pointers (``tcc.runtime.index_checks.IndexGuard``). Only when ``R[0]`` is not zero does the
host pass run (``tcc.reference.check_indices``), to name the first offending position.
"""

from __future__ import annotations

from tcc.ir.expr import Binary, Const, Read, Var, substitute, walk
from tcc.ir.source import source_expr
from tcc.ir.te import OpTE
from tcc.passes.te.bounds import IndexCheck

RESULT = "R"  # the guard op's result: i64[1], the number of checks out of range
_AXIS = "tcc_guard"  # its one index (no name of the checked op's variables)


def guard_source(op: OpTE) -> tuple[str, tuple[str, ...]]:
    """The source of the guard op of ``op``'s index checks (a specialised, proved op), and the
    parameters it takes: the tensors and runtime scalars its indices read, named as in ``op``."""
    checks = op.index_checks
    tensors = sorted({n.tensor for c in checks for n in walk(c.index) if isinstance(n, Read)})
    scalars = sorted({n.name for c in checks for n in walk(c.index) if isinstance(n, Var) and n.name in op.scalars})
    params = [f"{t}: {op.tensors[t].dtype}[{', '.join(map(str, op.tensors[t].concrete_shape()))}]" for t in tensors]
    params += [f"{s}: {op.scalars[s].dtype}" for s in scalars]
    body = " + ".join(_outside(check) for check in checks)
    source = (f"op index_guard({', '.join(params)}) -> {RESULT}: i64[1] {{\n"
              f"    {RESULT}[{_AXIS}] = {body}\n}}\n")
    return source, (*tensors, *scalars)


def _outside(check: IndexCheck) -> str:
    """1 where ``check``'s index leaves its tensor at some point of its ranges, else 0 (its
    variables shifted to start at 0: a reduction's extents start there)."""
    shifted = substitute(check.index, {v: Binary("add", Var(v), Const(lo, Var(v).dtype), Var(v).dtype)
                                       for v, lo, _ in check.ranges})
    index = f"i64({source_expr(shifted)})"
    flag = f"select({index} < 0 or {index} >= {check.size}, 1, 0)"
    axes = ", ".join(f"{v}: {hi - lo + 1}" for v, lo, hi in check.ranges)
    return f"max[{axes}]({flag})" if axes else flag
