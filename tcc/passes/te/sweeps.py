"""Pair sweeps: intermediates over every (row, key) pair that sums over one of the two axes read,
computed a tile of pairs at a time and never stored.

The gradient of attention (``tcc.grad``, with the softmax's shift held constant:
:mod:`.grad_softmax`) reads, for every query ``i`` and key ``j``, the scores, the
probabilities ``e``, ``de = sum[d](dO_sum * V) + dl`` and ``ds = de * e``: each ``S x L``, and
each read only by another of them at the same pair or by a sum over one axis,

    dQ[i, d] = sum[j](ds[i, j] * K[j, d])      (over the keys: a value per row)
    dK[j, d] = sum[i](ds[i, j] * Q[i, d])      (over the rows: a value per key)
    dV[j, d] = sum[i](dO_sum[i, d] * e[i, j])

As written they are stored (S x L each). The pass finds such a set from the math: the
statements a sum reads at ``(r, y)`` or ``(y, r)`` (``r`` its reduction variable, ``y`` its own
axis after the shared leading ones), and the statements those read at their own pair, and marks
them as one :class:`~tcc.ir.te.Sweep`: for each tile of keys, for each tile of rows, the tile of
every pair intermediate, then each sum's share of it (FlashAttention-2's backward: the sums
over the rows in locals for the key tile, those over the keys added into their tensors).
A pair intermediate that something else reads too (the forward's scores, which its stream
reads) is computed by the sweep as a copy of its own, so both stay as they are; where the
original would still be stored (its reader is no stream's: ALiBi's slope gradient, a sum over
every pair), nothing is swept. The sums placed after everything they and their pairs read; a sum
read before that place, or by one of the pairs (a softmax's denominator), is left out, and so
are the pairs only it read. The pass fires
where the pairs are scores that a maximum normalises (a softmax's), computed by a reduction
(from two smaller operands): a chain of matrix products (an MLP's hidden layer) stores its
intermediate, which is no larger than its operands, and keeps its GEMM schedule. A sum a
stream can take (the forward's ``P . V``) is left to it. A sum stored in a narrower type than it
adds in (a 16-bit program's gradients, summed in f32) keeps its partial sums in its own type and
rounds once, as it is stored (the sweep is then ``split``: nothing adds into the 16-bit tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc.dtypes import DType
from tcc.ir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    format_expr,
    free_vars,
    substitute,
    transform,
    walk,
)
from tcc.ir.te import Compute, OpTE, Sweep
from tcc.passes.te.streaming import key_limit, streamed_chains
from tcc.target import Target

CPU_TILE_ROWS, CPU_TILE_KEYS = 32, 64  # a tile of each pair intermediate: 8 KiB of f32, in L1
GPU_TILE_ROWS, GPU_TILE_KEYS = 4, 16  # a thread's tiles (the generic CUDA schedule: a thread per head)


def sweep_pairs(op: OpTE, target: Target) -> OpTE:
    """``op`` with the pair intermediates of each shape and the sums that read them marked as a sweep."""
    if op.dynamic:
        return op
    notes: list[str] = []
    sweeps = list(op.sweeps)
    shapes: dict[tuple[Expr, ...], list[Compute]] = {}
    for c in op.computes:
        reads = _sum_reads(op, c)
        if reads is not None:
            shapes.setdefault(op.tensors[reads[0][0].tensor].shape, []).append(c)
    for seeds in shapes.values():
        found = _Finder(op, seeds).find()
        if isinstance(found, str):
            notes.append(f"no sweep for {', '.join(c.tensor for c in seeds)}: {found}")
            continue
        moved, sweep = _apply(op, found, target)
        stored = _stored_anyway(replace(moved, sweeps=[*sweeps, sweep]), found.copies)
        if stored:
            notes.append(f"no sweep for {', '.join(sweep.sums)}: {', '.join(stored)} would be stored anyway "
                         "(read by what no stream computes)")
            continue
        op = moved
        sweeps.append(sweep)
        notes.append(_describe(sweep))
    if not notes:
        return op
    return replace(op, sweeps=sweeps, fusion_notes=[*op.fusion_notes, *notes])


@dataclass
class _Found:
    pairs: list[str]  # in statement order
    sums: list[str]
    by_key: list[str]
    copies: set[str]  # pairs something outside the sweep reads too: the sweep computes its own
    at: int  # the sweep's place: after the last statement its pairs and sums read


def _extent(ax: IterVar) -> int:
    return int(getattr(ax.extent, "value", 2))  # (a symbolic extent: more than one)


def _pair_shape(op: OpTE, name: str) -> tuple[Expr, ...] | None:
    t = op.tensors.get(name)
    if t is None or t.kind != "temp" or len(t.shape) < 2 or not all(isinstance(d, Const) for d in t.shape):
        return None
    return t.shape


def _sum_reads(op: OpTE, c: Compute) -> list[tuple[Read, bool]] | None:
    """The pair reads of ``c`` where it is ``C[outer, y, x...] = sum[r](...)`` reading temps of rank
    ``len(outer) + 2`` at ``(outer, r, y)`` (True: a sum over the rows) or ``(outer, y, r)``;
    None where it is not such a sum. At least one ``x``: a product of the pairs with a matrix
    (a sum to one value per row is a plain reduction, computed where it stands)."""
    red = c.body
    if c.accumulate or c.sequential or not isinstance(red, Reduce) or red.op != "sum" or len(red.axes) != 1 \
            or not _stored_from(red.acc_dtype, op.tensors[c.tensor].dtype):
        return None
    r = red.axes[0].var
    own = [ax.var for ax in c.axes]
    found = []
    for n in walk(red.body):
        if not (isinstance(n, Read) and _pair_shape(op, n.tensor) is not None and r in n.indices):
            continue
        k = len(n.indices) - 2
        if len(own) < k + 2 or math.prod(_extent(ax) for ax in c.axes[k + 1:]) < 2 \
                or list(n.indices[:k]) != own[:k] or tuple(n.indices[k:]) not in ((r, own[k]), (own[k], r)):
            continue  # (not a pair: a read along the sum's axis, dO_sum[i, d] of dV)
        found.append((n, n.indices[k] == r))
    deepest = max((len(n.indices) for n, _ in found), default=0)  # (a row tensor m[b, h, i] is no pair)
    found = [(n, side) for n, side in found if len(n.indices) == deepest]
    if not found or len({side for _, side in found}) > 1:
        return None
    return found


def _stored_from(acc: DType, stored: DType) -> bool:
    """Whether a sum accumulated in ``acc`` may be swept into a tensor of ``stored``: the same type,
    or a narrower float one (a 16-bit program's gradient, summed in f32 and rounded as it is stored)."""
    return acc == stored or acc.is_float and stored.is_float and stored.itemsize < acc.itemsize


class _Finder:
    """The sweep around the sums ``seeds``: their pair intermediates and every sum that reads them."""

    def __init__(self, op: OpTE, seeds: list[Compute]):
        self.op, self.seeds = op, seeds
        self.defs = {c.tensor: c for c in op.computes}
        self.order = {c.tensor: k for k, c in enumerate(op.computes)}
        self.counts: dict[str, int] = {}
        for c in op.computes:
            self.counts[c.tensor] = self.counts.get(c.tensor, 0) + 1

    def find(self) -> _Found | str:
        """The pairs the sums read and the sums that read only pairs, until neither changes: a sum
        dropped (one a pair reads, or read before the sweep's place) takes its pairs with it."""
        current = {c.tensor for c in self.seeds}
        first = _sum_reads(self.op, self.seeds[0])
        assert first is not None
        shape = self.op.tensors[first[0][0].tensor].shape
        streamed = _streamed_sums(self.op)
        for _ in range(8):
            pairs = self._closure([n.tensor for x in current for n, _ in _sum_reads(self.op, self.defs[x]) or ()],
                                  shape)
            if isinstance(pairs, str):
                return pairs
            if not any(isinstance(n, Reduce) for p in pairs for n in walk(self.defs[p].body)):
                return "its pairs hold no reduction (scores from two operands): stored, they cost what their inputs do"
            if not self._normalised(pairs):
                return "no maximum over its pairs (a softmax's): they are as large as what they are computed from"
            sums: dict[str, bool] = {}
            for c in self.op.computes:  # the readers that are sums over one axis of a product with the pairs
                side = _sum_reads(self.op, c)
                if c.tensor not in pairs | streamed and side is not None and all(n.tensor in pairs for n, _ in side) \
                        and self.counts[c.tensor] == 1 and not _reads(c.body, pairs, outside=[n for n, _ in side]) \
                        and not any(_reads(self.defs[p].body, {c.tensor}) for p in pairs):
                    sums[c.tensor] = side[0][1]
            at = self._place(pairs, sums)
            if not sums:
                return "no sum over one axis of a product with its pairs can move after what they read"
            if set(sums) == current:
                break
            current = set(sums)
        else:
            return "its sums and pairs do not settle"
        copies: set[str] = set()
        for c in self.op.computes:  # every other reader keeps the tensor; the sweep computes a copy
            if c.tensor not in pairs and c.tensor not in sums:
                copies |= {n.tensor for e in (c.body, *(c.lhs or ())) for n in walk(e)
                           if isinstance(n, Read) and n.tensor in pairs}
        for name in list(copies):  # what a copy reads among the pairs is copied too
            copies |= self._pair_deps(name, pairs)
        ordered = sorted(sums, key=self.order.__getitem__)
        return _Found(sorted(pairs, key=self.order.__getitem__), ordered, [x for x in ordered if sums[x]], copies, at)

    def _closure(self, reads: list[str], shape: tuple[Expr, ...]) -> set[str] | str:
        """The pair intermediates ``reads`` name and those they read at their own pair, transitively."""
        pairs: set[str] = set()
        pending = list(reads)
        while pending:
            name = pending.pop()
            if name in pairs:
                continue
            why = self._pair(name, shape)
            if why:
                return why
            pairs.add(name)
            pending += [n.tensor for n in walk(self.defs[name].body) if isinstance(n, Read) and n.tensor != name
                        and self._same_point(n, self.defs[name]) and _pair_shape(self.op, n.tensor) == shape
                        and self._plain(n.tensor)]
        return pairs

    def _normalised(self, pairs: set[str]) -> bool:
        """Whether the pairs are scores a softmax normalises: a maximum reduces over them, or (the
        maximum saved by the forward) they subtract a value of their row inside ``exp``."""
        if any(isinstance(c.body, Reduce) and c.body.op == "max" and _reads(c.body, pairs) for c in self.op.computes):
            return True
        for p in pairs:
            c = self.defs[p]
            row = [ax.var for ax in c.axes[:-1]]
            for n in walk(c.body):
                if isinstance(n, Call) and n.fn == "exp" and isinstance(n.args[0], Binary) and n.args[0].op == "sub":
                    b = n.args[0].b
                    while isinstance(b, Cast):
                        b = b.a
                    if isinstance(b, Read) and list(b.indices) == row:
                        return True
        return False

    def _place(self, pairs: set[str], sums: dict[str, bool]) -> int:
        """Where the sweep goes: after everything its pairs and sums read. A sum read before that
        place is dropped from it (the forward's ``O_sum``, which the backward's row term reads),
        its reads of the pairs then those of an outsider."""
        while True:
            members = pairs | set(sums)
            deps = {n.tensor for t in members for n in walk(self.defs[t].body)
                    if isinstance(n, Read) and n.tensor not in members and n.tensor in self.order}
            at = max((self.order[d] + 1 for d in deps), default=0)
            early = {x for x in sums if any(_reads(c.body, {x}) or any(_reads(i, {x}) for i in c.lhs or ())
                                            for c in self.op.computes[:at] if c.tensor not in members)}
            if not early:
                return at
            for x in early:
                del sums[x]

    def _pair(self, name: str, shape: tuple[Expr, ...]) -> str | None:
        if _pair_shape(self.op, name) != shape or not self._plain(name):
            return f"{name} is not a plain intermediate over the same pairs"
        c = self.defs[name]
        for n in walk(c.body):
            if isinstance(n, Read) and _pair_shape(self.op, n.tensor) == shape and self._plain(n.tensor) \
                    and not self._same_point(n, c):
                return f"{name} reads {n.tensor} at other pairs than its own"
            if isinstance(n, Reduce) and any(r.tensor == name for r in walk(n) if isinstance(r, Read)):
                return f"{name} reads itself"
        return None

    def _plain(self, name: str) -> bool:
        c = self.defs.get(name)
        return c is not None and self.counts[name] == 1 and not c.sequential and not c.accumulate \
            and self.op.tensors[name].kind == "temp" and not any(p.source == name for p in self.op.pads.values())

    @staticmethod
    def _same_point(n: Read, c: Compute) -> bool:
        return list(n.indices) == [ax.var for ax in c.axes]

    def _pair_deps(self, name: str, pairs: set[str]) -> set[str]:
        out: set[str] = set()
        pending = [name]
        while pending:
            for n in walk(self.defs[pending.pop()].body):
                if isinstance(n, Read) and n.tensor in pairs and n.tensor not in out:
                    out.add(n.tensor)
                    pending.append(n.tensor)
        return out


def _stored_anyway(op: OpTE, copies: set[str]) -> list[str]:
    """The pairs the sweep copies whose originals stay in memory: those a stream does not take
    (the forward's scores and probabilities, which the stream over the keys never stores)."""
    streamed, _ = streamed_chains(op)
    return sorted(t for t in copies if t in streamed.tensors)


def _streamed_sums(op: OpTE) -> set[str]:
    """The statements that a stream (:mod:`.streaming`) computes: the forward's ``P . V`` is its."""
    _, streams = streamed_chains(op)
    return {x.tensor for s in streams for x in s.sums}


def _reads(e: Expr, tensors: set[str], outside: list[Read] | None = None) -> bool:
    """Whether ``e`` reads one of ``tensors`` (other than the reads in ``outside``)."""
    skip = {id(n) for n in outside or ()}
    return any(isinstance(n, Read) and n.tensor in tensors and id(n) not in skip for n in walk(e))


def _apply(op: OpTE, f: _Found, target: Target) -> tuple[OpTE, Sweep]:
    """The statements of the sweep moved together to its place, each copied pair under a new name."""
    taken = set(op.tensors)
    rename: dict[str, str] = {}
    for name in f.copies:
        new, k = f"{name}_tile", 0
        while new in taken:
            k += 1
            new = f"{name}_tile{k}"
        taken.add(new)
        rename[name] = new
    tensors = dict(op.tensors)
    for old, new in rename.items():
        tensors[new] = replace(tensors[old], name=new)

    def renamed(c: Compute) -> Compute:
        body = transform(c.body, lambda n: replace(n, tensor=rename[n.tensor])
                         if isinstance(n, Read) and n.tensor in rename else None)
        return replace(c, tensor=rename.get(c.tensor, c.tensor), body=body)
    defs = {c.tensor: c for c in op.computes}
    moved = [renamed(defs[p]) for p in f.pairs] + [renamed(defs[s]) for s in f.sums]
    moved = _unmasked(moved, {rename.get(p, p) for p in f.pairs})
    members = set(f.pairs) | set(f.sums)
    before = [c for c in op.computes[:f.at] if c.tensor not in members or c.tensor in f.copies]
    after = [c for c in op.computes[f.at:] if c.tensor not in members or c.tensor in f.copies]
    pairs = tuple(rename.get(p, p) for p in f.pairs)
    top = defs[f.pairs[-1]]
    k = len(top.axes) - 2
    rows, keys = (CPU_TILE_ROWS, CPU_TILE_KEYS) if not target.is_gpu else (GPU_TILE_ROWS, GPU_TILE_KEYS)
    sweep = Sweep(top.axes[:k], top.axes[k], top.axes[k + 1], pairs, tuple(f.sums), tuple(f.by_key), rows, keys)
    points = math.prod(_extent(ax) for ax in sweep.outer)  # (fewer heads than threads: tiles are the parallel work)
    narrow = any(op.tensors[x].dtype != defs[x].body.acc_dtype for x in f.sums)  # (adding into f16 would lose bits)
    split = target.is_gpu or narrow or points < 2 * getattr(target, "cores", 1)
    sweep = replace(sweep, limit=_sweep_limit(op, sweep, f), split=split)
    return replace(op, computes=[*before, *moved, *after], tensors=tensors), sweep


def _unmasked(computes: list[Compute], pairs: set[str]) -> list[Compute]:
    """The sweep's statements with the masks that hide their products from the GEMM schedule
    taken out where that changes no value: a ``select`` of each term of a sum over ``d`` whose
    condition does not name ``d`` goes around the sum (a causal score), and a sum's
    ``select(c, x, 0)`` where ``x`` is 0 outside ``c`` already (a masked ``ds``) is ``x``."""
    defs = {c.tensor: c for c in computes}
    out = []
    for c in computes:
        body = c.body
        if c.tensor in pairs:
            body = transform(body, _select_out_of_sum)
        elif isinstance(body, Reduce):  # (a sum stays one: its term is what changes)
            inner = transform(body.body, _select_out_of_sum)
            inner = transform(inner, lambda n: n.a if isinstance(n, Select) and _is(n.b, 0.0)
                              and n.cond in _nonzero_where(n.a, defs, pairs) else None)
            body = replace(body, body=inner)
        out.append(replace(c, body=body))
        defs[c.tensor] = out[-1]
    return out


def _select_out_of_sum(n: Expr) -> Expr | None:
    if isinstance(n, Reduce) and n.op == "sum" and isinstance(n.body, Select) and _is(n.body.b, 0.0) \
            and not free_vars(n.body.cond) & {ax.var.name for ax in n.axes}:
        return Select(n.body.cond, replace(n, body=n.body.a), Const(0.0, n.dtype), n.dtype)
    return None


def _sweep_limit(op: OpTE, sweep: Sweep, f: _Found) -> Expr | None:
    """The key past which every sum's term is 0 for a row (a causal mask's ``i + 1``), or None."""
    defs = {c.tensor: c for c in op.computes}
    limits = []
    for name in f.sums:
        c = defs[name]
        red = c.body
        assert isinstance(red, Reduce)
        k = len(sweep.outer)
        r, y = red.axes[0].var.name, c.axes[k].var.name
        to_sweep = {ax.var.name: o.var for ax, o in zip(c.axes[:k], sweep.outer)}
        to_sweep |= {r: sweep.row.var, y: sweep.key.var} if name in f.by_key else {r: sweep.key.var, y: sweep.row.var}
        conds = [substitute(x, to_sweep) for x in _nonzero_where(red.body, defs, set(f.pairs))]
        limit = key_limit(conds, sweep.key, (*sweep.outer, sweep.row))
        if limit is None:
            return None
        limits.append(limit)
    return limits[0] if all(x == limits[0] for x in limits) else None


def _nonzero_where(e: Expr, defs: dict[str, Compute], pairs: set[str]) -> list[Expr]:
    """Conditions outside any of which ``e`` is 0: ``select(c, x, 0)``, a product with such a
    factor, ``exp`` of a difference whose first term is ``-inf`` outside them (a masked score)."""
    while isinstance(e, Cast):
        e = e.a
    if isinstance(e, Select) and _is(e.b, 0.0):
        return [e.cond, *_nonzero_where(e.a, defs, pairs)]
    if isinstance(e, Binary) and e.op == "mul":
        return [*_nonzero_where(e.a, defs, pairs), *_nonzero_where(e.b, defs, pairs)]
    if isinstance(e, Call) and e.fn == "exp" and isinstance(e.args[0], Binary) and e.args[0].op == "sub":
        return _finite_where(e.args[0].a, defs, pairs)
    if isinstance(e, Read) and e.tensor in pairs:
        return _nonzero_where(_at(defs[e.tensor], e), defs, pairs)
    return []


def _finite_where(e: Expr, defs: dict[str, Compute], pairs: set[str]) -> list[Expr]:
    """Conditions outside any of which ``e`` is ``-inf``."""
    while isinstance(e, Cast):
        e = e.a
    if isinstance(e, Select) and _is(e.b, -math.inf):
        return [e.cond, *_finite_where(e.a, defs, pairs)]
    if isinstance(e, Read) and e.tensor in pairs:
        return _finite_where(_at(defs[e.tensor], e), defs, pairs)
    return []


def _at(c: Compute, read: Read) -> Expr:
    """``c``'s body at the point ``read`` reads."""
    return substitute(c.body, {ax.var.name: i for ax, i in zip(c.axes, read.indices)})


def _is(e: Expr, value: float) -> bool:
    while isinstance(e, Cast):
        e = e.a
    return isinstance(e, Const) and e.value == value


def _describe(s: Sweep) -> str:
    by_row = [x for x in s.sums if x not in s.by_key]
    parts = [f"sums over {s.key.var.name}: {', '.join(by_row)}" if by_row else "",
             f"sums over {s.row.var.name}: {', '.join(s.by_key)}" if s.by_key else ""]
    skip = f"; tiles of {s.key.var.name} at or past {format_expr(s.limit)} skipped" if s.limit is not None else ""
    return (f"sweep over {s.row.var.name} x {s.key.var.name}: {', '.join(s.pairs)} a tile of "
            f"{s.tile_rows} x {s.tile_keys} at a time, never stored; {'; '.join(p for p in parts if p)}{skip}")

