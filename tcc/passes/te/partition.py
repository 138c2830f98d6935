"""partition: which statements of a fused op may be compiled as kernels of their own.

A whole ONNX model is one tcc op; compiled as one function, its compile time grows faster than
its size (the auto-scheduler walks the whole function once per loop nest it schedules) and
nothing is shared between the identical layers a network repeats. This analysis cuts the op
where fusion joins nothing: after fusion's inlining, each contraction the GEMM scheduler tiles
(a convolution or a matmul with its epilogue inlined) is a kernel, and so is each run of the
statements between two of them (pooling, softmax, layer norm, elementwise: grouping may still
put those under shared loops). A contraction shares at most its batch loop with its neighbours
(``fusion.gemm_batch_depth``), so cutting there loses no fusion but that one loop.

A run is further cut into its independent pieces (statements that share no tensor, read or
written): a training graph's forward ends in one run that returns every layer's saved
activations, 120 unrelated copies which, as one kernel, took a minute to build; as pieces, the
twelve layers' copies are the same few kernels, each built once.
"""

from __future__ import annotations

from tcc.ir.expr import Read, Reduce, Var, walk
from tcc.ir.te import Compute, OpTE
from tcc.passes.te.fusion import gemm_batch_depth, inline_intermediates


def partition(op: OpTE) -> list[tuple[str, ...]]:
    """The op's kernels in program order, each the tensors it computes that stay in memory
    after fusion (the statements inlined into them go with them)."""
    fused = inline_intermediates(op)
    kernels: list[tuple[str, ...]] = []
    run: list[Compute] = []
    for c in fused.computes:
        if gemm_batch_depth(c, tuple(op.dynamic)) < len(c.axes):
            kernels += [*_pieces(fused, run), (c.tensor,)]
            run = []
        elif not run and kernels and _epilogue_of(c, kernels[-1]):
            kernels[-1] += (c.tensor,)
        else:
            run.append(c)
    return kernels + _pieces(fused, run)


def _epilogue_of(c: Compute, kernel: tuple[str, ...]) -> bool:
    """Whether ``c``, right after a GEMM's kernel, is an elementwise function of the GEMM's
    result read at its own indices (GPT-2's and BERT's GELU, which reads it several times, so
    fusion keeps the GEMM apart): it joins that kernel, where the GEMM's scheduler folds it into
    the tiles' write-back (``store_epilogue``) instead of a kernel of its own reading the result
    back from memory."""
    if len(kernel) != 1 or any(isinstance(n, Reduce) for n in walk(c.body)):
        return False
    reads = [n for n in walk(c.body) if isinstance(n, Read) and n.tensor == kernel[0]]
    axes = [a.var.name for a in c.axes]
    return bool(reads) and all(all(isinstance(i, Var) for i in r.indices)
                               and [i.name for i in r.indices] == axes[len(axes) - len(r.indices):] for r in reads)


def _pieces(op: OpTE, run: list[Compute]) -> list[tuple[str, ...]]:
    """The independent pieces of a run of statements, in the order of their first statements: two
    statements are in one piece when they write or read a tensor in common (through pad views
    too), or belong to one stream."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    for c in run:
        for e in (c.body, *(c.lhs or ())):
            for n in walk(e):
                if isinstance(n, Read):
                    join(c.tensor, _viewed(op, n.tensor))
    for s in op.streams:
        for name in s.statements[1:]:
            join(name, s.statements[0])
    pieces: dict[str, list[str]] = {}
    for c in run:
        pieces.setdefault(root(c.tensor), []).append(c.tensor)
    return [tuple(p) for p in pieces.values()]


def _viewed(op: OpTE, tensor: str) -> str:
    """The tensor that ``tensor`` is, or that its pad views read in the end."""
    while tensor in op.pads:
        tensor = op.pads[tensor].source
    return tensor
