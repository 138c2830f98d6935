"""Streaming reductions: a max, sums of the exponentials of the difference, and sums weighted by
those exponentials, over one axis, become one pass over it (the online-softmax recurrence).

The chain, over a reduction axis ``j`` for every point of some row axes ``r``:

    m[r] = max[j](S(r, j))
    l[r] = sum[j](exp(S(r, j) - m[r]))                  (a softmax denominator, a log-sum-exp)
    W[r, x] = sum[j](exp(S(r, j) - m[r]) * V(r, x, j))   (attention's P . V)

needs every ``S(r, j)`` three times, so as written it is stored (S x L for attention), and so are
its exponentials. One pass over ``j`` keeping a running maximum ``m`` and rescaling each running
sum by ``exp(m_old - m_new)`` whenever ``m`` grows gives the same sums and stores neither: this
is FlashAttention's recurrence, found here from the math rather than from names. ``S`` is the
max's body with the intermediates that depend on ``j`` substituted in (attention's scores
``s``, which may carry a mask, a bias, a soft cap); the exponentials are found wherever a
``sum[j]`` reads ``exp(S - m)`` (through a tensor like attention's ``e`` or written out). A read
of a streamed intermediate outside any reduction (cross-entropy's pick of the label's logit)
recomputes that one element. Where the score is ``select(j <= f(r), ..., -inf)`` the pass
records the limit, so the tiles of ``j`` past it are skipped rather than computed and masked.

The statements stay in the TE as what they compute (``m``, then each sum with ``S`` written in);
:class:`~tcc.ir.te.Stream` marks them as one pass, which lowering turns into a tiled loop nest
(:mod:`tcc.passes.te.lower_stream`). The chain is left as it is, with the reason in the fusion
notes, where the rewrite would not pay (nothing large is stored: a softmax over an input) or is
not possible (a streamed intermediate read inside another reduction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.frontend.ranges import affine_form
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
    Var,
    cast,
    format_expr,
    free_vars,
    substitute,
    transform,
    unique_name,
    walk,
)
from tcc.ir.te import Compute, OpTE, Stream, StreamSum, Tensor
from tcc.target import CpuTarget, CudaTarget, Target

I64 = dtypes.i64
CPU_TILE, CPU_ROW_TILE = 128, 64  # keys x queries of a block: 32 KiB of keys and of scores, in L2
SPLITS_PER_CORE = 8  # parts of the keys per core where the keys go outside the rows (see _split_tiles)
GPU_TILE = 32  # a thread per query row on the GPU (the naive schedule): a tile of scores per thread


def stream_reductions(op: OpTE, target: Target) -> OpTE:
    """``op`` with each max-and-exponential-sums chain computed in one pass (see the module doc)."""
    notes: list[str] = []
    streams = list(op.streams)
    chains = [c.tensor for c in op.computes if _max_over_one_axis(c)]
    if chains and op.dynamic and target.is_gpu:  # (the GPU's stream schedule sizes itself by constant extents)
        why = f"shape symbols {', '.join(op.dynamic)} are dynamic"
        return replace(op, fusion_notes=[*op.fusion_notes, *(f"no stream over {name}: {why}" for name in chains)])
    for name in chains:
        if not any(c.tensor == name and _max_over_one_axis(c) for c in op.computes):
            continue  # (streamed into an earlier chain)
        outcome = _Chain(op, name).fuse(target)
        if isinstance(outcome, str):
            notes.append(f"no stream over {name}: {outcome}")
            continue
        op, stream = _with_epilogues(*outcome)
        streams.append(stream)
        notes.append(_describe(stream))
    if not notes:
        return op
    return replace(op, streams=streams, fusion_notes=[*op.fusion_notes, *notes])


def streamed_chains(op: OpTE) -> tuple[OpTE, list[Stream]]:
    """``op`` with each chain rewritten as :func:`stream_reductions` does (tiles at their defaults,
    no epilogues), and the chains: the analysis that :mod:`.grad_softmax` reads."""
    streams = []
    for name in [c.tensor for c in op.computes if _max_over_one_axis(c)]:
        if not any(c.tensor == name and _max_over_one_axis(c) for c in op.computes):
            continue
        outcome = _Chain(op, name).fuse(None)
        if not isinstance(outcome, str):
            op, stream = outcome
            streams.append(stream)
    return op, streams


def _with_epilogues(op: OpTE, stream: Stream) -> tuple[OpTE, Stream]:
    """``stream`` with the statements that only finish its rows (attention's ``O = T(O_sum / l)``)
    computed as each block of rows ends, and its tensors that only they read never stored: the
    stream then needs no memory beyond its locals. Such a statement reads the stream's tensors at
    its own leading indices (the rows), reads nothing else the stream does not precede, and
    holds no reduction; it moves up to right after the stream."""
    own = set(stream.tensors)
    k = len(stream.rows)
    end = max(i for i, c in enumerate(op.computes) if c.tensor in own) + 1
    added = {c.tensor for c in op.computes[end:] if c.accumulate}  # (moved above a += it would miss it)
    ready = set(op.inputs) | set(op.pads) | {c.tensor for c in op.computes[:end]} - added
    chosen: list[Compute] = []
    swept = {t for w in op.sweeps for t in w.statements}
    for c in op.computes[end:]:
        reads = [n for n in walk(c.body) if isinstance(n, Read)]
        if c.accumulate or c.sequential or not any(r.tensor in own for r in reads) or c.tensor in swept \
                or any(isinstance(n, Reduce) for n in walk(c.body)) or len(c.axes) < k \
                or any(a.extent != b.extent for a, b in zip(c.axes, stream.rows)):
            continue
        lead = tuple(ax.var for ax in c.axes[:k])
        if all(r.tensor in own and r.indices[:k] == lead and all(isinstance(i, Var) for i in r.indices[k:])
               or r.tensor not in own and r.tensor in ready for r in reads):
            chosen.append(c)
    if not chosen:
        return op, stream
    names = {c.tensor for c in chosen}
    rest = [c for c in op.computes if c.tensor not in names]
    readers = {n.tensor for c in rest if c.tensor not in own for n in walk(c.body) if isinstance(n, Read)}
    internal = tuple(t for t in stream.tensors if op.tensors[t].kind == "temp" and t not in readers)
    computes = [*rest[:end], *chosen, *rest[end:]]
    return replace(op, computes=computes), replace(stream, epilogues=tuple(c.tensor for c in chosen),
                                                   internal=internal)


def _max_over_one_axis(c: Compute) -> bool:
    """``c`` is ``m[r] = max[j](...)`` over one axis, for at least one row axis."""
    r = c.body
    return isinstance(r, Reduce) and r.op == "max" and len(r.axes) == 1 and r.dtype.is_float \
        and r.dtype == r.acc_dtype and not c.accumulate and not c.sequential and len(c.axes) > 0


def _describe(s: Stream) -> str:
    sums = ", ".join(x.tensor for x in s.sums)
    skip = f"; tiles of {s.axis.var.name} at or past {format_expr(s.limit)} skipped" if s.limit is not None else ""
    then = f"; {', '.join(s.epilogues)} as each row ends" if s.epilogues else ""
    if s.splits:
        outside = f"; the tiles of {s.axis.var.name} outside the rows" if s.keys_outside else ""
        skip += f"{outside}; {s.axis.var.name} in {s.splits} parts (at most) combined at the end"
    kept = f" ({', '.join(s.internal)} never stored)" if s.internal else ""
    return (f"stream over {s.axis.var.name}: {s.maximum} (running max) and {sums} (sums rescaled as it grows) "
            f"in one pass, tiles of {s.tile} {s.axis.var.name} x {s.tile_rows} {s.rows[-1].var.name}{skip}"
            f"{then}{kept}")


@dataclass
class _Match:
    """A ``sum[j]`` of ``exp(S - m) * weight`` found in statement ``where``."""

    reduce: Reduce
    where: str
    rows: tuple[Var, ...]  # the statement's variables that index m, in m's axis order
    weight: Expr | None


class _Chain:
    """The chain rooted at the max statement ``name``: what can be streamed, and the rewrite."""

    def __init__(self, op: OpTE, name: str):
        self.op = op
        self.position = next(i for i, c in enumerate(op.computes) if c.tensor == name)
        self.top = op.computes[self.position]
        self.max: Reduce = self.top.body  # type: ignore[assignment]
        self.j = self.max.axes[0]
        self.taken = _names(op)
        self.canon_names: list[str] = []
        self.defs = {c.tensor: c for c in op.computes if not c.accumulate}
        self.expandable = self._expandable()

    # ------------------------------------------------------------ what the chain is made of

    def _expandable(self) -> set[str]:
        """The intermediates substituted into the chain: those the max reads along ``j`` (the
        scores, and what they read along it), and those computed from the max or from them
        without a reduction over them (the exponentials)."""
        op, out = self.op, set()
        pending = [self.max.body]
        while pending:
            e = pending.pop()
            for n in walk(e):
                if isinstance(n, Read) and n.tensor not in out and self._plain_temp(n.tensor) \
                        and any(self.j.var.name in free_vars(i) for i in n.indices):
                    out.add(n.tensor)
                    pending.append(self.defs[n.tensor].body)
        for c in op.computes[self.position + 1:]:
            if not self._plain_temp(c.tensor):
                continue
            reads = {n.tensor for n in walk(c.body) if isinstance(n, Read)}
            if reads & (out | {self.top.tensor}) and not any(
                    isinstance(n, Reduce) and _reads_any(n.body, out | {self.top.tensor}) for n in walk(c.body)):
                out.add(c.tensor)
        return out

    def _plain_temp(self, name: str) -> bool:
        c = self.defs.get(name)
        return c is not None and self.op.tensors[name].kind == "temp" and not c.sequential \
            and name not in self.op.accumulated() and not any(p.source == name for p in self.op.pads.values()) \
            and not any(name in w.statements for w in self.op.sweeps)  # (a sweep's copy of the scores)

    def expand(self, e: Expr) -> Expr:
        """``e`` with the chain's intermediates substituted in (their own reductions renamed)."""
        def visit(n: Expr) -> Expr | None:
            if not (isinstance(n, Read) and n.tensor in self.expandable):
                return None
            c = self.defs[n.tensor]
            at = {ax.var.name: i for ax, i in zip(c.axes, n.indices)}
            body = substitute(_fresh_reductions(c.body, self.taken), at)
            return cast(self.expand(body), n.dtype)
        return transform(e, visit)

    def canonical(self, e: Expr) -> Expr:
        """``e`` with its reduction variables renamed by order of appearance: equal up to them."""
        counter = iter(range(1 << 30))
        mapping: dict[str, str] = {}

        def name(k: int) -> str:
            while len(self.canon_names) <= k:
                self.canon_names.append(unique_name(f"k{len(self.canon_names)}", self.taken))
                self.taken.add(self.canon_names[-1])
            return self.canon_names[k]

        def visit(n: Expr) -> Expr | None:
            if isinstance(n, Reduce):
                axes = []
                for ax in n.axes:
                    mapping[ax.var.name] = name(next(counter))
                    axes.append(IterVar(Var(mapping[ax.var.name], ax.var.dtype), ax.extent))
                body = substitute(n.body, {old: Var(new, I64) for old, new in mapping.items()
                                           if old in {a.var.name for a in n.axes}})
                return replace(n, axes=tuple(axes), body=body)
            return None
        return _top_down(e, visit)

    # ------------------------------------------------------------ the rewrite

    def fuse(self, target: Target | None) -> tuple[OpTE, Stream] | str:
        """The op with the chain streamed, or why not; ``target`` None: tiles left at their defaults
        (the analysis alone, for :mod:`.grad_softmax`)."""
        score = self.canonical(self.expand(self.max.body))
        matches, computes = [], []
        for c in self.op.computes[self.position + 1:]:
            found: list[_Match] = []
            body = transform(c.body, lambda n, c=c, found=found: self._match(n, c, score, found))
            matches += found
            computes.append((c, body, found))
        if not matches:
            return f"no sum over {self.j.var.name} of exp(score - {self.top.tensor}) follows it"
        holds_reduce = any(isinstance(n, Reduce) for t in self.expandable for n in walk(self.defs[t].body))
        if not holds_reduce and all(m.weight is None for m in matches):
            return "its scores are computed without a reduction and no sum is weighted: nothing large is stored"
        late = self._late_reads(matches)
        if late:
            return f"a weight reads {late}, computed after {self.top.tensor}"
        return self._rewrite(score, computes, target)

    def _match(self, n: Expr, c: Compute, score: Expr, found: list[_Match]) -> Expr | None:
        """A read of a new tensor in place of ``n`` where ``n`` is a streamed sum."""
        if not (isinstance(n, Reduce) and n.op == "sum" and len(n.axes) == 1 and n.axes[0].extent == self.j.extent
                and n.acc_dtype.is_float):
            return None
        split = _split_exp(_strip(self.expand(n.body)), self.top.tensor)
        if split is None:
            return None
        x, idx, weight = split
        names = [i.name for i in idx if isinstance(i, Var)]
        axes = {ax.var.name for ax in c.axes}
        if len(names) != len(idx) or len(set(names)) != len(names) or not set(names) <= axes:
            return None
        jn = n.axes[0].var
        mapping = {ax.var.name: v for ax, v in zip(self.top.axes, idx)} | {self.j.var.name: jn}
        if self.canonical(x) != self.canonical(substitute(score, mapping)):
            return None
        if weight is not None and (free_vars(weight) - axes - {jn.name} - self._globals()
                                   or _reads_any(weight, self.expandable | {self.top.tensor})):
            return None
        found.append(_Match(n, c.tensor, tuple(idx), weight))  # type: ignore[arg-type]
        return n  # replaced in _rewrite, once every statement is known to be streamable

    def _globals(self) -> set[str]:
        return set(self.op.scalars) | set(self.op.symbols) | set(self.op.cparams)

    def _late_reads(self, matches: list[_Match]) -> str | None:
        early = set(self.op.inputs) | set(self.op.pads) | {c.tensor for c in self.op.computes[:self.position]}
        for m in matches:
            for n in walk(m.weight) if m.weight is not None else ():
                if isinstance(n, Read) and n.tensor not in early:
                    return n.tensor
        return None

    def _rewrite(self, score: Expr, computes: list, target: Target | None) -> tuple[OpTE, Stream] | str:
        op = self.op
        tensors = dict(op.tensors)
        rows = self.top.axes
        sums: list[StreamSum] = []
        stream_computes: list[Compute] = []
        kept: list[Compute] = []
        for c, _, found in computes:
            if c.tensor in self.expandable:
                continue
            replaced: dict[int, Expr] = {}
            for m in found:
                own = self._owns(c, m)
                name = c.tensor if own else unique_name(f"{c.tensor}_sum", set(tensors))
                extra = tuple(ax for ax in c.axes if ax.var not in m.rows and m.weight is not None
                              and ax.var.name in free_vars(m.weight))
                if not own:
                    tensors[name] = Tensor(name, m.reduce.acc_dtype, tuple(ax.extent for ax in (*rows, *extra)),
                                           "temp", m.reduce.span)
                renames = {v.name: ax.var for v, ax in zip(m.rows, rows)} | {m.reduce.axes[0].var.name: self.j.var}
                extra_axes = self._extra_axes(extra, rows)
                renames |= {ax.var.name: new.var for ax, new in zip(extra, extra_axes)}
                weight = None if m.weight is None else substitute(m.weight, renames)
                sums.append(StreamSum(name, extra_axes, weight))
                stream_computes.append(self._sum_compute(name, rows, extra_axes, score, weight, m.reduce))
                replaced[id(m.reduce)] = cast(Read(name, (*m.rows, *(ax.var for ax in extra)), m.reduce.acc_dtype,
                                                   m.reduce.span), m.reduce.dtype)
                if own:
                    break
            else:
                body = transform(c.body, lambda n, r=replaced: r.get(id(n)))
                kept.append(replace(c, body=body))
        leftover = self._recompute_leftovers(kept)
        if isinstance(leftover, str):
            return leftover
        before = [c for c in op.computes[:self.position] if c.tensor not in self.expandable]
        early = next((c.tensor for c in before if _reads_any(c.body, self.expandable)), None)
        if early is not None:
            return f"{early} reads a streamed intermediate before {self.top.tensor} is computed"
        for t in self.expandable:
            del tensors[t]
        top = replace(self.top, body=replace(self.max, body=score))
        stream = Stream(self.top.tensor, rows, self.j, score, tuple(sums), _limit(score, self.j, rows))
        if target is not None:
            stream = replace(stream, **self._tiles(target, stream))
        new = replace(op, computes=[*before, top, *stream_computes, *leftover], tensors=tensors)
        return new, stream

    def _owns(self, c: Compute, m: _Match) -> bool:
        """Whether statement ``c`` is the sum itself (``l`` of attention): it becomes the stream's."""
        return c.body is m.reduce and not c.accumulate and tuple(ax.var for ax in c.axes) == m.rows \
            and self.op.tensors[c.tensor].dtype == m.reduce.acc_dtype

    def _extra_axes(self, extra: tuple[IterVar, ...], rows: tuple[IterVar, ...]) -> tuple[IterVar, ...]:
        clash = {ax.var.name for ax in rows} | {self.j.var.name}
        out = []
        for ax in extra:
            name = ax.var.name
            if name in clash:
                name = unique_name(name, self.taken)
                self.taken.add(name)
            out.append(IterVar(Var(name, I64), ax.extent))
        return tuple(out)

    def _sum_compute(self, name: str, rows: tuple[IterVar, ...], extra: tuple[IterVar, ...], score: Expr,
                     weight: Expr | None, r: Reduce) -> Compute:
        m = Read(self.top.tensor, tuple(ax.var for ax in rows), self.max.dtype)
        term: Expr = Call("exp", (Binary("sub", score, m, score.dtype),), score.dtype)
        if weight is not None:
            term = Binary("mul", term, weight, r.acc_dtype)
        body = Reduce("sum", (self.j,), cast(term, r.acc_dtype), r.acc_dtype, r.acc_dtype, r.span)
        return Compute(name, (*rows, *extra), body, r.span)

    def _recompute_leftovers(self, kept: list[Compute]) -> list[Compute] | str:
        """``kept`` with the other reads of the streamed intermediates computed in place."""
        out = []
        for c in kept:
            for n in walk(c.body):
                if isinstance(n, Reduce) and _reads_any(n.body, self.expandable):
                    t = next(r.tensor for r in walk(n.body) if isinstance(r, Read) and r.tensor in self.expandable)
                    return f"{c.tensor} reads {t} inside a reduction that is not part of the stream"
            if any(_reads_any(i, self.expandable) for i in c.lhs or ()):
                return f"{c.tensor} writes where a streamed intermediate says"
            read = next((n.tensor for n in walk(c.body) if isinstance(n, Read) and n.tensor in self.expandable), None)
            if read is not None and _points(c.axes) > _points(self.top.axes):
                return f"{c.tensor} reads {read} at more points than {self.top.tensor} has rows: it is stored anyway"
            out.append(replace(c, body=self.expand(c.body)) if _reads_any(c.body, self.expandable) else c)
        return out

    def _tiles(self, target: Target, stream: Stream) -> dict[str, int | bool]:
        """The stream's tiles (:class:`~tcc.ir.te.Stream`'s fields): a thread per row on the GPU
        for now (:func:`_gpu_tiles`); on the CPU blocks of rows each walking every tile of keys,
        or, where the keys fill no cache (:func:`_keys_outside`), tiles of keys each walking
        every row."""
        if target.is_gpu:
            return _gpu_tiles(stream, target)  # type: ignore[arg-type]
        if _keys_outside(stream, target):  # type: ignore[arg-type]
            return _split_tiles(stream, target)  # type: ignore[arg-type]
        return {"tile": CPU_TILE, "tile_rows": CPU_ROW_TILE, "stage_keys": True, "group": _register_rows(target)}


def _register_rows(target: Target) -> int:
    """Rows whose tile of scores fit half the vector registers together: 2 x 128 f32 in 16 of
    AVX-512's 32 zmm, 1 on AVX2. CPU time at B1 H8 S1024 D64 by (keys, rows, rows together):
    (64, 32, 4) 30 ms, (128, 32, 2) 28, (128, 64, 2) 26.5, (256, 64, 1) 49 (spilled)."""
    registers = 32 if target.vector_bytes >= 64 else 16
    return max(1, registers // 2 * target.vector_bytes // (CPU_TILE * 4))


def _log_sum_exp(stream: Stream) -> Reduce | None:
    """The score's one sum (of products: a linear layer's logits) where the stream may split its
    keys in parts: one row axis, no weighted sum (nothing per row beyond a maximum and sums, a
    log-sum-exp), no causal limit."""
    sums = [n for n in walk(stream.score) if isinstance(n, Reduce)]
    if len(stream.rows) != 1 or stream.limit is not None or any(x.weight is not None for x in stream.sums) \
            or len(sums) != 1 or sums[0].op != "sum":
        return None
    return sums[0]


def _keys_outside(stream: Stream, target: CpuTarget) -> bool:
    """Whether the tiles of keys go outside the blocks of rows: a :func:`_log_sum_exp` stream whose
    keys' operand (``depth`` values per key, a vocabulary's weights) exceeds the L2 cache. Inside
    each block of rows those keys would come from memory once per block, and be copied key-last
    once per block."""
    total = _log_sum_exp(stream)
    if total is None:
        return False
    return _points((stream.axis,)) * _points(total.axes) * total.acc_dtype.itemsize > target.cache_bytes(2)


def _gpu_tiles(stream: Stream, target: CudaTarget) -> dict[str, int | bool]:
    """A thread per row and ``GPU_TILE`` keys a step (the generic schedule); a
    :func:`_log_sum_exp` stream whose rows are fewer than the machine's resident threads splits
    its keys in parts, a thread per row of each part: 4096 rows alone are 16 blocks of 256
    threads, on 16 of an H100's 132 multiprocessors."""
    plain: dict[str, int | bool] = {"tile": GPU_TILE, "tile_rows": 1, "stage_keys": False, "group": 1}
    rows = _points(stream.rows)
    threads = target.sms * target.max_threads_per_sm
    parts = min(-(-_points((stream.axis,)) // GPU_TILE), -(-threads // rows))
    return plain | {"splits": parts} if _log_sum_exp(stream) is not None and parts > 1 else plain


def _split_tiles(stream: Stream, target: CpuTarget) -> dict[str, int | bool]:
    """Tiles for the keys outside the rows: the GEMM micro-kernel's register tile (two vectors of
    keys by 12 rows with AVX-512, 6 with AVX2: three quarters of the vector registers hold
    scores), a block of rows that tile, and the keys in parts for the threads (several per core, so a
    thread the OS preempts holds up less), each part's maxima and sums per row kept apart until
    the end. On the 2-core znver4 VM (N 512, K 768, C 32000, f32, one thread) the time against
    eager PyTorch's was 0.71 at tiles of 32 x 12, 64 x 6 and 48 x 8 alike, and 0.68-0.72 at 4, 16
    or 64 parts; with the tiles inside the blocks of rows, 1.16-1.34 (each block copied every
    tile of weights key-last again, and read them from memory again)."""
    wide = target.vector_bytes >= 64
    lanes = target.vector_bytes // 4
    tile, group = 2 * lanes, 12 if wide else 6
    tiles = -(-_points((stream.axis,)) // tile)
    return {"tile": tile, "tile_rows": group, "stage_keys": True, "group": group, "keys_outside": True,
            "splits": max(1, min(tiles, SPLITS_PER_CORE * target.cores))}


def _points(axes: tuple[IterVar, ...]) -> int:
    return math.prod(int(getattr(ax.extent, "value", 1)) for ax in axes)


def _names(op: OpTE) -> set[str]:
    names = set(op.tensors) | set(op.scalars) | set(op.symbols) | set(op.cparams)
    for c in op.computes:
        names |= {ax.var.name for ax in c.axes}
        names |= {n.name for n in walk(c.body) if isinstance(n, Var)}
        names |= {ax.var.name for n in walk(c.body) if isinstance(n, Reduce) for ax in n.axes}
    return names


def _fresh_reductions(e: Expr, taken: set[str]) -> Expr:
    """``e`` with each reduction's variables renamed apart from every name in use."""
    def visit(n: Expr) -> Expr | None:
        if not isinstance(n, Reduce):
            return None
        mapping, axes = {}, []
        for ax in n.axes:
            name = unique_name(ax.var.name, taken)
            taken.add(name)
            mapping[ax.var.name] = Var(name, ax.var.dtype)
            axes.append(IterVar(mapping[ax.var.name], ax.extent))
        return replace(n, axes=tuple(axes), body=substitute(n.body, mapping))
    return _top_down(e, visit)


def _top_down(e: Expr, fn) -> Expr:
    """``transform`` from the root: a rewritten reduction's body is visited after its renaming."""
    out = fn(e)
    if out is not None:
        e = out
    if isinstance(e, Reduce):
        return replace(e, body=_top_down(e.body, fn))
    return _children(e, lambda c: _top_down(c, fn))


def _children(e: Expr, fn) -> Expr:
    updates = {}
    for name in e.__dataclass_fields__:
        value = getattr(e, name)
        if isinstance(value, Expr):
            updates[name] = fn(value)
        elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
            updates[name] = tuple(fn(v) for v in value)
    return replace(e, **updates) if updates else e


def _reads_any(e: Expr, tensors: set[str]) -> bool:
    return any(isinstance(n, Read) and n.tensor in tensors for n in walk(e))


def _strip(e: Expr) -> Expr:
    """``e`` without casts that change nothing."""
    while isinstance(e, Cast) and e.a.dtype == e.dtype:
        e = e.a
    return e


def _split_exp(e: Expr, m: str) -> tuple[Expr, tuple[Expr, ...], Expr | None] | None:
    """``(S, indices of m, weight)`` where ``e`` is ``exp(S - m[indices])``, times ``weight``."""
    e = _strip(e)
    if isinstance(e, Call) and e.fn == "exp":
        d = _strip(e.args[0])
        if isinstance(d, Binary) and d.op == "sub":
            read = _strip(d.b)
            if isinstance(read, Read) and read.tensor == m and not _reads_any(d.a, {m}):
                return d.a, read.indices, None
        return None
    if isinstance(e, Binary) and e.op == "mul":
        for a, b in ((e.a, e.b), (e.b, e.a)):
            split = _split_exp(a, m)
            if split is not None and split[2] is None and not _reads_any(b, {m}):
                return split[0], split[1], b
    return None


def _limit(score: Expr, j: IterVar, rows: tuple[IterVar, ...]) -> Expr | None:
    """``f`` where ``score`` is ``select(j < f and ..., ..., -inf)`` with ``f`` affine in the rows,
    non-decreasing in the last (a tile of rows takes its last row's limit): a causal mask."""
    s = _strip(score)
    if not (isinstance(s, Select) and isinstance(s.b, Const) and s.b.value == -math.inf):
        return None
    return key_limit([s.cond], j, rows)


def key_limit(conds: list[Expr], j: IterVar, rows: tuple[IterVar, ...]) -> Expr | None:
    """``f`` where one of ``conds`` (or of their conjuncts) is ``j < f``, ``f`` affine in the rows and
    non-decreasing in the last: the keys at or past ``f`` of a row are masked (for :mod:`.sweeps` too)."""
    names = {ax.var.name for ax in rows}
    for cond in (c for e in conds for c in _conjuncts(e)):
        bound = _upper_bound(cond, j.var.name)
        if bound is None or not free_vars(bound) <= names:
            continue
        form = affine_form(bound, names)
        last = rows[-1].var.name
        if form is not None and (last not in form or isinstance(form[last], Const) and form[last].value >= 0):
            return bound
    return None


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "and":
        return [*_conjuncts(e.a), *_conjuncts(e.b)]
    return [e]


def _upper_bound(cond: Expr, j: str) -> Expr | None:
    """``f`` where ``cond`` is ``j < f`` (or ``j <= f - 1``, ``f > j``, ``f - 1 >= j``)."""
    if not isinstance(cond, Binary):
        return None
    one = Const(1, I64)
    for op, a, b in ((cond.op, cond.a, cond.b), ({"gt": "lt", "ge": "le"}.get(cond.op), cond.b, cond.a)):
        if isinstance(a, Var) and a.name == j and j not in free_vars(b) and b.dtype.is_int:
            if op == "lt":
                return b
            if op == "le":
                return Binary("add", b, one, I64)
    return None
