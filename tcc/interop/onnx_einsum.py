"""ONNX Einsum as one statement: the output's labels index it, the others are summed.

``"bij,bjk->bik"`` becomes ``y[b, i, k] = sum[j](a[b, i, j] * c[b, j, k])``; a label repeated in
one operand reads its diagonal (``"ii->i"``); ``...`` stands for the same leading dims of every
operand, broadcast together; without ``->`` the output is the labels seen once, in alphabetical
order, as NumPy reads it. Fusion and the matmul schedules see an ordinary contraction.
"""

from __future__ import annotations

import re

import numpy as np

from tcc.frontend.unparse import Ex, num, reduction, var
from tcc.interop.graph import Node, Program, Value
from tcc.interop.onnx_ops import cast_to

ELLIPSIS = "."  # one label per dim the ellipsis stands for: ".0", ".1", ...


def _labels(node: Node, term: str, rank: int | None, dims: int) -> list[str]:
    """The labels of one side of the equation, the ellipsis expanded to ``dims`` labels (the
    ellipsis of an operand of ``rank``: what its letters leave)."""
    if not re.fullmatch(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*", term):
        raise node.error(f"cannot read the einsum term {term!r}")
    head, _, tail = term.partition("...")
    if "..." not in term:
        if rank is not None and len(term) != rank:
            raise node.error(f"einsum term {term!r} has {len(term)} labels for an operand of rank {rank}")
        return list(term)
    count = dims if rank is None else rank - len(head) - len(tail)
    if count < 0:
        raise node.error(f"einsum term {term!r} has more labels than its operand's rank {rank}")
    return [*head, *(f"{ELLIPSIS}{dims - count + n}" for n in range(count)), *tail]


def einsum(p: Program, node: Node, args: list[Value | None]) -> list[Value]:
    equation = node.attrs["equation"].replace(" ", "")
    left, arrow, right = equation.partition("->")
    terms = left.split(",")
    operands = [a for a in args if a is not None]
    if len(terms) != len(operands):
        raise node.error(f"equation {equation!r} has {len(terms)} operands, the node {len(operands)}")
    dims = max((x.rank - len(t.replace("...", "")) for t, x in zip(terms, operands) if "..." in t), default=0)
    labels = [_labels(node, t, x.rank, dims) for t, x in zip(terms, operands)]
    sizes: dict[str, int] = {}
    for term, x in zip(labels, operands):
        for label, n in zip(term, x.shape):
            if label.startswith(ELLIPSIS) and sizes.get(label, 1) != 1 and n not in (1, sizes[label]):
                raise node.error(f"the ellipsis dims of {equation!r} do not broadcast")
            if not label.startswith(ELLIPSIS) and sizes.get(label, n) != n:
                raise node.error(f"label {label!r} of {equation!r} has sizes {sizes[label]} and {n}")
            sizes[label] = max(sizes.get(label, n), n) if label.startswith(ELLIPSIS) else n
    if arrow:
        out = _labels(node, right, None, dims)
    else:
        seen = [x for term in labels for x in term]
        out = [f"{ELLIPSIS}{d}" for d in range(dims)] + sorted(x for x in set(seen) if seen.count(x) == 1
                                                              and not x.startswith(ELLIPSIS))
    if any(x not in sizes for x in out) or len(set(out)) != len(out):
        raise node.error(f"the output of {equation!r} names a label twice or one no operand has")
    summed = [x for x in sizes if x not in out]
    dtype = operands[0].dtype
    shape = [sizes[x] for x in out]

    def body(idx: list[Ex]) -> Ex:
        at = {x: i for x, i in zip(out, idx)} | {x: var(f"k{n}") for n, x in enumerate(summed)}
        product: Ex | None = None
        for term, x in zip(labels, operands):
            read = x.read([num(0) if label.startswith(ELLIPSIS) and n == 1 and sizes[label] != 1 else at[label]
                           for label, n in zip(term, x.shape)])
            product = read if product is None else product * read
        assert product is not None
        if not summed:
            return product
        total = reduction("sum", [(f"k{n}", sizes[x]) for n, x in enumerate(summed)], product)
        return total if dtype in ("f32", "f64", "i64") else cast_to(total, dtype)

    if all(x.const is not None for x in operands) and sum(x.size for x in operands) <= 4096:
        return [p.constant(np.einsum(equation, *[x.const for x in operands]), dtype, node.outputs[0])]
    return [p.emit(node.outputs[0], shape, dtype, body)]
