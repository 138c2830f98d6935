"""partition: which statements of a fused op may be compiled as kernels of their own.

A whole ONNX model is one tcc op; compiled as one function, its compile time grows faster than
its size (the auto-scheduler walks the whole function once per loop nest it schedules) and
nothing is shared between the identical layers a network repeats. This analysis cuts the op
where fusion joins nothing: after fusion's inlining, each contraction the GEMM scheduler tiles
(a convolution or a matmul with its epilogue inlined) is a kernel, and so is each run of the
statements between two of them (pooling, softmax, layer norm, elementwise: grouping may still
put those under shared loops). A contraction shares at most its batch loop with its neighbours
(``fusion.gemm_batch_depth``), so cutting there loses no fusion but that one loop.
"""

from __future__ import annotations

from tcc.ir.te import OpTE
from tcc.passes.te.fusion import gemm_batch_depth, inline_intermediates


def partition(op: OpTE) -> list[tuple[str, ...]]:
    """The op's kernels in program order, each the tensors it computes that stay in memory
    after fusion (the statements inlined into them go with them)."""
    kernels: list[tuple[str, ...]] = []
    run: list[str] = []
    for c in inline_intermediates(op).computes:
        if gemm_batch_depth(c, tuple(op.dynamic)) < len(c.axes):
            kernels += [tuple(run), (c.tensor,)] if run else [(c.tensor,)]
            run = []
        else:
            run.append(c.tensor)
    return kernels + [tuple(run)] if run else kernels
