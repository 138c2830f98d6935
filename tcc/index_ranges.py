"""The index checks of an op on the GPU, run on the GPU.

A call checks the indices it reads from data before its kernels run (``tcc.runtime.index_checks``).
On the CPU that is one NumPy pass over the index tensor. On CUDA a host pass would first copy the
index tensor over (0.15-0.4 ms a call, ten times an embedding lookup), so there each check is a
tiny op of the language itself, compiled for the same target: the smallest and largest value the
index takes, ``R[0] = min[v...](index)``, ``R[1] = max[v...](index)``, two numbers copied back.
Only when one is out of range does the host pass run, to name the first offending position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tcc.ir.expr import Binary, Const, Read, Var, substitute, walk
from tcc.ir.source import source_expr
from tcc.ir.te import OpTE
from tcc.passes.te.bounds import IndexCheck

RangeOp = Callable[..., Any]


def range_source(op: OpTE, check: IndexCheck) -> tuple[str, tuple[str, ...]]:
    """The source of the op computing ``check``'s index range, and the parameters it reads."""
    tensors = sorted({n.tensor for n in walk(check.index) if isinstance(n, Read)})
    scalars = sorted({n.name for n in walk(check.index) if isinstance(n, Var) and n.name in op.scalars})
    shifted = substitute(check.index, {v: Binary("add", Var(v), Const(lo, Var(v).dtype), Var(v).dtype)
                                       for v, lo, _ in check.ranges})
    axes = ", ".join(f"{v}: {hi - lo + 1}" for v, lo, hi in check.ranges)
    body = source_expr(shifted)
    low, high = (f"{kind}[{axes}](i64({body}))" if axes else f"i64({body})" for kind in ("min", "max"))
    params = [f"{t}: {op.tensors[t].dtype}[{', '.join(map(str, op.tensors[t].concrete_shape()))}]" for t in tensors]
    params += [f"{s}: {op.scalars[s].dtype}" for s in scalars]
    source = (f"op index_range({', '.join(params)}) -> R: i64[2] {{\n"
              f"    R[k] = select(k == 0, {low}, {high})\n}}\n")
    return source, (*tensors, *scalars)


def out_of_range(ranges: list[tuple[RangeOp, tuple[str, ...], IndexCheck]], values: dict[str, Any]) -> bool:
    """Whether any check's index leaves its tensor, given the call's arguments by name (each
    range computed on the device)."""
    for compiled, names, check in ranges:
        low, high = _host(compiled(*(values[n] for n in names)))
        if low < 0 or high >= check.size:
            return True
    return False


def _host(result: Any) -> np.ndarray:
    """A small result of a CUDA op (a torch, CuPy or tcc device array) as NumPy values."""
    for convert in ("to_numpy", "get"):
        if hasattr(result, convert):
            return np.asarray(getattr(result, convert)())
    if hasattr(result, "cpu"):
        return result.cpu().numpy()
    return np.asarray(result)
