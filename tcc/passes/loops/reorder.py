"""reorder: permute the loops of a nest.

The named loops must nest perfectly, except that a loop split earlier may hold its main part
and its tail side by side; those are distributed (each path through them becomes its own nest),
permuted, and merged again where the permuted nests share their outer loops. The order in which
a reduction loop visits its values is kept: reduction loops (those a store's index does not
use) keep their relative order, so the result is bit-for-bit the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tcc.errors import Span, TccScheduleError
from tcc.ir.expr import const, free_vars
from tcc.ir.loopnest import is_seq_of_copies, require_loop, stores
from tcc.ir.loops import Allocate, For, If, Let, LoopFunc, Seq, Stmt, seq


@dataclass
class _Nest:
    headers: list[tuple[For, int]]  # loop (its body ignored) and which copy of a split it is
    body: Stmt


def reorder(func: LoopFunc, order: list[str], span: Span | None = None) -> LoopFunc:
    if len(set(order)) != len(order):
        raise TccScheduleError(f"reorder names a loop twice: {', '.join(order)}", span)
    for name in order:
        require_loop(func, name, span)
    names = set(order)

    def visit(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and s.var.name in names:
            return _reorder_nest(s, order, span)
        return None

    body = _top_down(func.body, names, visit)
    return replace(func, body=body)


def _top_down(s: Stmt, names: set[str], visit) -> Stmt:
    """Apply ``visit`` at the outermost named loops (not inside what it rewrote)."""
    out = visit(s)
    if out is not None:
        return out
    if is_seq_of_copies(s) and s.stmts[0].var.name in names:
        return seq(*(visit(c) for c in s.stmts))
    if isinstance(s, For):
        return replace(s, body=_top_down(s.body, names, visit))
    if isinstance(s, Seq):
        return seq(*(_top_down(c, names, visit) for c in s.stmts))
    if isinstance(s, (Allocate, Let)):
        return replace(s, body=_top_down(s.body, names, visit))
    if isinstance(s, If):
        return replace(s, then=_top_down(s.then, names, visit),
                       otherwise=None if s.otherwise is None else _top_down(s.otherwise, names, visit))
    return s


def _reorder_nest(root: For, order: list[str], span: Span | None) -> Stmt:
    nests = _nests(root, set(order))
    for n in nests:
        got = [h.var.name for h, _ in n.headers]
        if sorted(got) != sorted(order):
            missing = sorted(set(order) - set(got))
            raise TccScheduleError(
                f"cannot reorder {', '.join(order)}: loops {', '.join(missing)} are not perfectly nested "
                f"inside {got[0]}", span, "reorder loops of one nest, with nothing between them")
        _check_reductions(n, order, span)
    permuted = []
    for n in nests:
        by_name = {h.var.name: (h, tag) for h, tag in n.headers}
        permuted.append(_Nest([by_name[name] for name in order], n.body))
    permuted.sort(key=lambda n: [tag for _, tag in n.headers])
    return _merge(permuted)


def _nests(s: Stmt, names: set[str]) -> list[_Nest]:
    if isinstance(s, For) and s.var.name in names:
        return [_Nest([(s, 0), *n.headers], n.body) for n in _nests(s.body, names)]
    if is_seq_of_copies(s) and s.stmts[0].var.name in names:
        out = []
        for tag, c in enumerate(s.stmts):
            for n in _nests(c, names):
                n.headers[0] = (n.headers[0][0], tag)
                out.append(n)
        return out
    return [_Nest([], s)]


def _check_reductions(n: _Nest, order: list[str], span: Span | None) -> None:
    used = set()
    for st in stores(n.body):
        for idx in st.indices:
            used |= free_vars(idx)
    trivial = {h.var.name for h, _ in n.headers if h.extent == const(1)}
    before = [h.var.name for h, _ in n.headers if h.var.name not in used | trivial]
    after = [name for name in order if name not in used | trivial]
    if before != after:
        raise TccScheduleError(f"reorder would change the order of the reduction loops {', '.join(before)} "
                               f"(to {', '.join(after)}), which changes floating-point results", span,
                               "keep reduction loops in their order")


def _same(x: tuple[For, int], y: tuple[For, int]) -> bool:
    """Same loop header and the same copy (main or tail) of its split."""
    (a, ta), (b, tb) = x, y
    return (ta == tb and a.var == b.var and a.extent == b.extent and a.kind == b.kind
            and a.annotations == b.annotations)


def _merge(nests: list[_Nest]) -> Stmt:
    """Rebuild loops, sharing outer loops between consecutive nests that agree on them."""
    if not nests[0].headers:
        return seq(*(n.body for n in nests))
    out: list[Stmt] = []
    group: list[_Nest] = []
    for n in nests:
        if group and not _same(group[0].headers[0], n.headers[0]):
            out.append(_close(group))
            group = []
        group.append(n)
    out.append(_close(group))
    return seq(*out)


def _close(group: list[_Nest]) -> Stmt:
    head = group[0].headers[0][0]
    inner = _merge([_Nest(n.headers[1:], n.body) for n in group])
    return replace(head, body=inner)
