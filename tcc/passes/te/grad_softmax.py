"""The maxima that no result depends on, which :mod:`.grad` holds constant.

A streamed chain (:mod:`.streaming`) subtracts its row maximum ``m`` before each exponential only
to keep them finite: its results read the sums ``W = sum[j](exp(S - m) * w)`` as ratios
``W / l`` of a plain sum ``l = sum[j](exp(S - m))`` (attention's ``O_sum / l``, a softmax) or as
``m + log(l)`` (a log-sum-exp), and both are the same for any ``m``. The gradient through ``m``
is then zero: what reaches it through the exponentials cancels what reaches it directly. The
derivation still finds both halves (``dm = -sum[j](de * e)``) and sends their sum, zero up to
rounding, through the max's arg-max rule, which needs a count of the ties: two more passes over
``S x L`` that store the scores. Held constant, ``m`` costs nothing, and what is left is
FlashAttention-2's backward: ``ds = e * (sum[x](dO_sum * V) + dl)`` with ``dl = -sum[x](dO * O) / l``
the row term. A chain whose results read ``m`` or a sum any other way keeps the exact rule.
"""

from __future__ import annotations

from tcc.ir.expr import Binary, Call, Cast, Const, Expr, Read, transform, walk
from tcc.ir.te import OpTE, Stream
from tcc.passes.te.streaming import streamed_chains


def constant_maxima(op: OpTE) -> set[str]:
    """The maxima of ``op``'s streamable chains whose results are the same for any value of them."""
    streamed, streams = streamed_chains(op)
    return {s.maximum for s in streams if _invariant(streamed, s)}


def _invariant(op: OpTE, s: Stream) -> bool:
    own = set(s.tensors)
    if own & set(op.results):
        return False
    plain = {x.tensor for x in s.sums if x.weight is None and not x.extra}
    for c in op.computes:
        if c.tensor in own:
            continue
        for e in (c.body, *(c.lhs or ())):
            rest = transform(e, lambda n: _shift_free(n, s.maximum, plain, own))
            if any(isinstance(n, Read) and n.tensor in own for n in walk(rest)):
                return False
    return True


def _shift_free(n: Expr, m: str, plain: set[str], own: set[str]) -> Expr | None:
    """A placeholder for ``n`` where it is ``W / l`` or ``m + log(l)`` at one row."""
    if not isinstance(n, Binary):
        return None
    a, b = _strip(n.a), _strip(n.b)
    if n.op == "div" and isinstance(a, Read) and isinstance(b, Read) and a.tensor in own - {m} and b.tensor in plain \
            and a.indices[:len(b.indices)] == b.indices:
        return Const(0.0, n.dtype)
    if n.op == "add":
        for x, y in ((a, b), (b, a)):
            log = _strip(y)
            if isinstance(x, Read) and x.tensor == m and isinstance(log, Call) and log.fn == "log":
                arg = _strip(log.args[0])
                if isinstance(arg, Read) and arg.tensor in plain and arg.indices == x.indices:
                    return Const(0.0, n.dtype)
    return None


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e
