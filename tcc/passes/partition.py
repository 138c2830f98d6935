"""partition: which statements of a fused op may be compiled as kernels of their own.

A whole ONNX model is one tcc op; compiled as one function, its compile time grows faster than
its size (the auto-scheduler walks the whole function once per loop nest it schedules) and
nothing is shared between the identical layers a network repeats. This analysis cuts the op
where fusion does not join anything: after fusion's inlining, every statement still in memory
is the end of a kernel, except where fusion's grouping keeps statements under shared loops for
a reason other than a shared batch loop. A group that holds a contraction the GEMM scheduler
tiles shares only the batch loop with its neighbours (``fusion.gemm_batch_depth``): it is split
into its members, each a kernel; a group of row computations (softmax, layer norm: the reason
grouping exists) stays one kernel.
"""

from __future__ import annotations

from tcc.ir.te import OpTE
from tcc.passes.fusion import gemm_batch_depth, group_statements, inline_intermediates


def partition(op: OpTE) -> list[tuple[str, ...]]:
    """The op's kernels in program order, each the tensors it computes that stay in memory
    after fusion (the statements inlined into them go with them)."""
    op = inline_intermediates(op)
    grouped: dict[str, tuple[str, ...]] = {}
    for group in group_statements(op):
        members = [c for c in op.computes if c.tensor in group.tensors]
        if all(gemm_batch_depth(c) == len(c.axes) for c in members):
            for name in group.tensors:
                grouped[name] = group.tensors
    kernels: list[tuple[str, ...]] = []
    for c in op.computes:
        kernel = grouped.get(c.tensor, (c.tensor,))
        if not kernels or kernels[-1] != kernel:
            kernels.append(kernel)
    return kernels
