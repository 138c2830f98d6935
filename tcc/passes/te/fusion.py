"""Op fusion on the tensor-expression IR: fewer passes over memory, no needless temporaries.

Two decisions, both printed by the ``fused`` stage with the reason for each:

* **Inlining.** An intermediate is substituted into the statements that read it when that
  recomputes nothing: it is read at one place, outside any reduction that would repeat it
  (this is how ``conv -> +bias -> relu`` becomes one reduction with an epilogue), or it is
  elementwise and cheap enough that recomputing it at each read costs less than a round trip
  through memory. An expensive elementwise intermediate read twice (softmax's ``exp``) is kept.
* **Grouping.** Consecutive statements that share their leading loops, and read each other's
  results only at the same leading indices (row reductions: softmax, layernorm), form a group:
  lowering puts them under one set of outer loops, so each row is read from memory once, and
  intermediates used only inside the group shrink to one row (a few registers or a stack buffer).

``pad`` views are never materialised (lowering turns their reads into guarded loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tcc.ir.expr import Binary, Call, Cast, Expr, IterVar, Read, Reduce, Select, Var, substitute, transform, walk
from tcc.ir.te import Compute, OpTE, format_op
from tcc.passes.te.specialize import size_hint

EXPENSIVE = {"exp": 8, "log": 8, "sqrt": 4, "rsqrt": 4, "sin": 8, "cos": 8, "tanh": 10, "sigmoid": 10,
             "erf": 10}
GEMM_MIN_FLOPS = 1 << 16  # contractions this large get the auto-schedulers' GEMM schedules
CHEAP_RECOMPUTE = 4  # extra node evaluations we accept to avoid materialising a tensor


@dataclass(frozen=True)
class FusionGroup:
    """Statements lowered under ``shared`` common outer loops."""

    tensors: tuple[str, ...]
    shared: int
    internal: tuple[str, ...]  # intermediates read only inside the group: shrunk to one row

    def describe(self) -> str:
        inner = f"; {', '.join(self.internal)} kept per outer iteration" if self.internal else ""
        return f"group [{', '.join(self.tensors)}] share {self.shared} outer loop(s){inner}"


def group_statements(op: OpTE, gemms: bool = True) -> OpTE:
    """Group consecutive statements that share their outer loops (see the module docstring). It
    runs after inlining and im2col: those make the epilogues and the patch buffers it groups.
    ``gemms=False`` (CUDA) keeps contractions out of groups: a GEMM inside a group loop would
    need per-iteration global buffers, which the CUDA scheduler does not launch (an encoder
    block's LayerNorm, fc1 and GELU shared the batch loop)."""
    groups = _groups(op, gemms)
    return replace(op, groups=groups, fusion_notes=[*op.fusion_notes, *(g.describe() for g in groups)])


def inline_intermediates(op: OpTE) -> OpTE:
    """Substitute intermediates into their readers where that recomputes nothing (see module doc).

    Each intermediate's readers come from an index kept up to date as bodies are substituted (an
    inlined producer's reads become its consumers'): a whole model's backward graph has thousands
    of statements, and scanning every body for every intermediate took most of its compile time."""
    notes: list[str] = list(op.fusion_notes)
    computes: list[Compute | None] = list(op.computes)  # None: inlined away
    readers = _readers(op.computes)
    tensors = dict(op.tensors)
    pads = dict(op.pads)
    for name in [c.tensor for c in op.computes if op.tensors[c.tensor].kind == "temp"]:
        pinned = _scatter_pinned(op, name) or _stream_pinned(op, name)
        if pinned:
            notes.append(f"keep {name}: {pinned}")
            continue
        at = next(n for n, x in enumerate(computes) if x is not None and x.tensor == name)
        c = computes[at]  # the current version, after earlier inlining
        assert c is not None
        source = _copy_of(c, op)
        if source is not None and any(p.source == name for p in pads.values()):
            pads = {n: replace(p, source=source) if p.source == name else p for n, p in pads.items()}
            _inline_at(computes, readers, at)
            del tensors[c.tensor]
            notes.append(f"alias {c.tensor}: a copy of {source}, so its pad views read {source}")
            continue
        others = [x for n in sorted(readers.get(name, ())) if n != at and (x := computes[n]) is not None]
        verdict, reason = _inline_verdict(c, others, replace(op, pads=pads))
        if verdict:
            _inline_at(computes, readers, at)
            del tensors[c.tensor]
            notes.append(f"inline {c.tensor}: {reason}")
        else:
            notes.append(f"keep {c.tensor}: {reason}")
    return replace(op, computes=[c for c in computes if c is not None], tensors=tensors, pads=pads,
                   fusion_notes=notes)


def _readers(computes: list[Compute]) -> dict[str, set[int]]:
    """The positions of the statements whose bodies read each tensor."""
    readers: dict[str, set[int]] = {}
    for n, c in enumerate(computes):
        for name in _tensors_read(c.body):
            readers.setdefault(name, set()).add(n)
    return readers


def _tensors_read(e: Expr) -> set[str]:
    return {n.tensor for n in walk(e) if isinstance(n, Read)}


def _inline_at(computes: list[Compute | None], readers: dict[str, set[int]], at: int) -> None:
    """Substitute the statement at ``at`` into every statement that reads it and drop it; its
    readers now read what it read."""
    c = computes[at]
    assert c is not None
    consumers = readers.pop(c.tensor, set()) - {at}
    for n in consumers:
        other = computes[n]
        if other is not None:
            computes[n] = _inline_into(other, c)
    computes[at] = None
    for name in _tensors_read(c.body):
        readers.setdefault(name, set()).update(consumers)
        readers[name].discard(at)


def _scatter_pinned(op: OpTE, name: str) -> str | None:
    """Why ``name`` must stay a tensor of its own because of an accumulating statement (``+=``),
    or None: one that is added into has more than one statement (inlining its definition would
    drop the additions), one read in a left-hand index is where a scatter writes, and one that
    reads a tensor added into would, moved to its readers, read it after later additions."""
    added = op.accumulated()
    if name in added:
        return "added into by +=: its statements run in order on a tensor of its own"
    if any(_reads(i, name) for c in op.computes for i in c.lhs or ()):
        return "read in the left-hand index of a += statement"
    body = next(c.body for c in op.computes if c.tensor == name)
    read = sorted(t for t in added if _reads(body, t))
    if read:
        return f"reads {read[0]}, which += adds into: it is computed where it stands"
    return None


def _stream_pinned(op: OpTE, name: str) -> str | None:
    """Why ``name`` stays as it is because a stream (:mod:`.streaming`) computes or reads it: the
    stream's score and weights name the tensors they read."""
    for s in op.streams:
        if name in s.statements:
            return f"computed by the stream over {s.axis.var.name}"
        members = [c for c in op.computes if c.tensor in s.statements]
        if any(_reads(c.body, name) for c in members):
            return f"read by the stream over {s.axis.var.name}"
    for w in op.sweeps:
        if name in w.statements:
            return f"computed by the sweep over {w.row.var.name} x {w.key.var.name}"
        if any(_reads(c.body, name) for c in op.computes if c.tensor in w.statements):
            return f"read by the sweep over {w.row.var.name} x {w.key.var.name}"
    return None


def _copy_of(c: Compute, op: OpTE) -> str | None:
    """The tensor that ``c`` copies whole (``T[i, j] = A[i, j]``, same shape and dtype), or None:
    a derived data gradient's dilation of ``dY`` by a stride of 1 (``examples/conv2d_grad.tc``)."""
    body = c.body
    if not (isinstance(body, Read) and body.tensor in op.tensors and op.tensors[body.tensor].kind != "pad"):
        return None
    own = [ax.var for ax in c.axes]
    if list(body.indices) != own:
        return None
    src, dst = op.tensors[body.tensor], op.tensors[c.tensor]
    return body.tensor if src.shape == dst.shape and src.dtype == dst.dtype else None


def format_fused(op: OpTE) -> str:
    """The TE after fusion, then each decision and group with its reason."""
    lines = [format_op(op), "fusion:"]
    lines += [f"    {note}" for note in op.fusion_notes] or ["    nothing to fuse"]
    return "\n".join(lines)


# ---------------------------------------------------------------- inlining

def _inline_verdict(c: Compute, computes: list[Compute], op: OpTE) -> tuple[bool, str]:
    through_pad = [p.name for p in op.pads.values() if p.source == c.tensor]
    if through_pad:
        return False, f"read through the pad view {through_pad[0]}, which needs it in memory"
    sites = [(other, site, repeat) for other in computes if other is not c
             for site, repeat in _read_sites(Reduce("sum", other.axes, other.body, c.body.dtype, c.body.dtype),
                                             c.tensor, dynamic=op.dynamic)]
    if not sites:
        return False, "never read"
    if c.tensor in op.results:
        return False, "a result"
    if c.sequential:
        return False, f"a recurrence along {', '.join(c.sequential)}: each element reads the one before"
    repeated = [s for s in sites if s[2] > 1]
    has_reduce = any(isinstance(n, Reduce) for n in walk(c.body))
    if repeated and (has_reduce or _cost(c.body) > CHEAP_RECOMPUTE):
        consumer = repeated[0][0].tensor
        return False, f"{consumer} reads it under loops that do not index it: inlining would recompute " \
                      f"each element {repeated[0][2]} times"
    nested = [s for s in sites if _inside_reduction(s[0].body, s[1])]
    if has_reduce and nested:
        return False, f"a reduction read inside a reduction of {nested[0][0].tensor}: kept apart so each stays " \
                      "a plain loop nest (a GEMM, an im2col candidate)"
    if len(sites) == 1 and gemm_batch_depth(c, op.dynamic) < len(c.axes) \
            and any(isinstance(n, Reduce) for n in walk(sites[0][0].body)):
        return False, f"a contraction read by {sites[0][0].tensor}, which has a reduction of its own: kept apart " \
                      "so that each is a GEMM (inlined, it was an epilogue's dot product per element)"
    operand = _gemm_operand(c, sites, op)
    if operand:
        return False, f"an expression read by {operand} as a GEMM's operand: kept apart so that the GEMM reads " \
                      "a tensor (inlined, T5's RMSNorm made the MLP's first GEMM a plain loop nest, 5x slower)"
    chosen = [s for s in sites if _inside_reduction(s[0].body, s[1], kind=Select)
              and not all(isinstance(i, Var) for i in s[1].indices)]
    if has_reduce and chosen:
        return False, f"a reduction read at computed indices under a select of {chosen[0][0].tensor} (a " \
                      "phase of a convolution over a dilated tensor): kept apart so it stays a plain loop nest"
    if len(sites) == 1:
        what = "reduction" if has_reduce else "elementwise"
        return True, f"{what}, read once by {sites[0][0].tensor}: fused there with no recomputation"
    if has_reduce:
        return False, f"a reduction read at {len(sites)} places: computed once, not {len(sites)} times"
    cost = _cost(c.body)
    extra = cost * (len(sites) - 1)
    if extra <= CHEAP_RECOMPUTE:
        return True, f"cheap (cost {cost}) and read at {len(sites)} places: recomputing beats a round trip"
    return False, f"cost {cost} per element read at {len(sites)} places: recomputing would cost {extra} " \
                  "more than it saves"


def _gemm_operand(c: Compute, sites: list, op: OpTE) -> str | None:
    """The consumer that reads elementwise ``c`` as an operand of a GEMM it would stop being, if
    one does: the CPU scheduler tiles ``sum(A[..] * B[..])`` of two reads only, and ``c``'s
    expression would be evaluated once per element of the other side anyway (a row scale per
    output column). Only an expression of two tensors or more (a row scale, softmax's ``e / s``):
    a function of one (a transpose, a cast, attention's ``q * scale``) stays inlined, where
    attention's scores, softmax and weighted sum stay one kernel (GPT-2's, cut into three, was
    no faster and four kernels more)."""
    if len(_tensors_read(c.body)) < 2 or any(isinstance(n, Reduce) for n in walk(c.body)):
        return None
    for consumer, read, repeat in sites:
        if repeat > 1 and _inside_reduction(consumer.body, read) \
                and gemm_batch_depth(consumer, op.dynamic) < len(consumer.axes):
            return consumer.tensor
    return None


def _read_sites(e: Expr, tensor: str, repeat: int = 1, dynamic: tuple[str, ...] = ()) -> list[tuple[Read, int]]:
    """Reads of ``tensor`` in ``e``, each with how often one element is re-read by enclosing loops.

    The consumer's own loops are passed in as an outer pseudo-reduction, so a row value read by
    every column of a consumer counts as repeated too.
    """
    if isinstance(e, Reduce):
        out = []
        for read, r in _read_sites(e.body, tensor, 1, dynamic):
            used = set().union(*(_vars(i) for i in read.indices)) if read.indices else set()
            factor = 1
            for ax in e.axes:
                if ax.var.name not in used:  # a moving extent counts once
                    factor *= size_hint(ax.extent, dynamic) or 1
            out.append((read, repeat * r * factor))
        return out
    if isinstance(e, Read) and e.tensor == tensor:
        return [(e, repeat)]
    return [site for child in e.children() for site in _read_sites(child, tensor, repeat, dynamic)]


def _inside_reduction(e: Expr, read: Read, under: bool = False, kind: type = Reduce) -> bool:
    """Whether ``read`` sits under a node of ``kind`` in ``e``."""
    if e is read:
        return under
    return any(_inside_reduction(c, read, under or isinstance(e, kind), kind) for c in e.children())


def _vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def _cost(e: Expr) -> int:
    total = 0
    for n in walk(e):
        if isinstance(n, Call):
            total += EXPENSIVE.get(n.fn, 1)
        elif not isinstance(n, Var) and n.children():
            total += 1
    return total


def _reads(e: Expr, tensor: str) -> bool:
    return any(isinstance(n, Read) and n.tensor == tensor for n in walk(e))


def _inline_into(consumer: Compute, producer: Compute) -> Compute:
    taken = {ax.var.name for ax in consumer.axes} | _vars(consumer.body)
    taken |= {ax.var.name for n in walk(consumer.body) if isinstance(n, Reduce) for ax in n.axes}

    def visit(n: Expr) -> Expr | None:
        if isinstance(n, Read) and n.tensor == producer.tensor:
            mapping = {ax.var.name: idx for ax, idx in zip(producer.axes, n.indices)}
            # renamed before the substitution, which may bring in a consumer variable of the same name
            # as a reduction's (s[a, b] = sum[j](.. j == b ..) read at s[r, j]: the new j is not the sum's)
            names = taken | set(mapping)
            fresh = _fresh_reductions(producer.body, names)
            taken.update(names)  # (each inlined copy's reductions named apart)
            return substitute(fresh, mapping)
        return None

    return replace(consumer, body=transform(consumer.body, visit))


def _fresh_reductions(body: Expr, taken: set[str]) -> Expr:
    """Rename the inlined body's reduction variables so they cannot capture the consumer's."""

    def visit(n: Expr) -> Expr | None:
        if not isinstance(n, Reduce):
            return None
        renames = {}
        for ax in n.axes:
            name = ax.var.name
            while name in taken:
                name += "_"
            taken.add(name)
            renames[ax.var.name] = Var(name, ax.var.dtype)
        if all(renames[k].name == k for k in renames):
            return None
        axes = tuple(IterVar(renames[ax.var.name], ax.extent) for ax in n.axes)
        return replace(n, axes=axes, body=substitute(n.body, renames))

    return transform(body, visit)


# ---------------------------------------------------------------- grouping

def _groups(op: OpTE, gemms: bool = True) -> list:
    groups: list[list[Compute]] = []
    shared: list[int] = []
    streamed = {t for s in [*op.streams, *op.sweeps] for t in s.statements}  # lowered together, one nest of their own
    for c in op.computes:
        own = c.tensor in streamed or c.sequential or c.accumulate
        if own or (not gemms and gemm_batch_depth(c, op.dynamic) < len(c.axes)):  # own nests
            groups.append([c])
            shared.append(0)  # nothing joins it
            continue
        if groups and shared[-1] > 0:
            k = _shared_depth(groups[-1], shared[-1], c, op)
            if k > 0:
                groups[-1].append(c)
                shared[-1] = k
                continue
        groups.append([c])
        shared.append(len(c.axes))
    out = []
    for members, k in zip(groups, shared):
        if len(members) < 2:
            continue
        names = [m.tensor for m in members]
        internal = tuple(n for n in names if op.tensors[n].kind == "temp" and _only_read_in(op, n, members)
                         and n not in op.accumulated())
        out.append(FusionGroup(tuple(names), k, internal))
    return out


def _shared_depth(group: list[Compute], depth: int, c: Compute, op: OpTE) -> int:
    """How many leading loops ``c`` can share with ``group`` (0: it cannot join). A statement that
    would make a group holding a reduction share fewer loops stays out: im2col's patches and
    GEMM for one block of output rows share ``n, y_block``, and the epilogue reading the GEMM at
    ``y // R`` joining them at ``n`` would make whole images' patches again. A group never shares
    a GEMM's row or column loop (see :func:`gemm_batch_depth`)."""
    first = group[0]
    k = min(depth, len(c.axes), *(gemm_batch_depth(m, op.dynamic) for m in (*group, c)))
    while k > 0:
        same_extents = all(first.axes[i].extent == c.axes[i].extent for i in range(k))
        if same_extents and _row_local(group, c, k, op):
            if k < depth and any(isinstance(n, Reduce) for m in group for n in walk(m.body)) \
                    and not all(_window_max(m) for m in (*group, c)):
                return 0
            return k
        k -= 1
    return 0


def _window_max(c: Compute) -> bool:
    """A max over a window of one tensor (a separable max pool's row or column pass): grouped
    with its consumer at a shallower depth, its rows stay in cache for the next pass (ResNet's
    stem pool: 1.6 MiB of row maxima per image otherwise, written and read back)."""
    return isinstance(c.body, Reduce) and c.body.op == "max" and isinstance(c.body.body, Read)


def gemm_batch_depth(c: Compute, dynamic: tuple[str, ...] = ()) -> int:
    """How many leading loops of ``c`` a group may share: for a contraction the CPU GEMM
    scheduler tiles (``sum[k](A[..] * B[..])`` with rows ``i`` and columns ``j``, and at least
    ``GEMM_MIN_FLOPS`` of work), its leading batch loops only; for anything else, all of them.

    Sharing the row or the column loop would leave the GEMM one row (or one element) per group
    iteration, its reduction a dot product the tiles cannot reach: ``gelu(X @ W + b)`` reads
    the GEMM twice (so it is not inlined), and grouping the two at ``t, j`` ran the GEMM element
    by element, 4x slower than tiled. The same analysis as ``autoschedule._contraction``: ``j``
    is the last loop, ``B`` the operand whose last index moves with it, ``i`` a loop that only
    ``A`` reads (or a unit loop that ``B`` does not read)."""
    sums = [n for n in walk(c.body) if isinstance(n, Reduce)]
    if not c.axes or len(sums) != 1 or sums[0].op != "sum" or not isinstance(sums[0].body, Binary) \
            or sums[0].body.op != "mul":
        return len(c.axes)
    a, b = (_strip_casts(x) for x in (sums[0].body.a, sums[0].body.b))
    if not (isinstance(a, Read) and isinstance(b, Read) and a.indices and b.indices and c.axes):
        return len(c.axes)  # (no axes: a dot product, ONNX's MatMul of two vectors)
    j = c.axes[-1].var.name
    if not any(j in _vars(x) for x in b.indices) or any(j in _vars(x) for x in a.indices):
        a, b = b, a
    if not any(j in _vars(x) for x in b.indices) or any(j in _vars(x) for x in a.indices):
        return len(c.axes)
    a_vars = set().union(*(_vars(x) for x in a.indices))
    b_vars = set().union(*(_vars(x) for x in b.indices))
    rows = [i for i, ax in enumerate(c.axes[:-1]) if ax.var.name in a_vars and ax.var.name not in b_vars] \
        or [i for i, ax in enumerate(c.axes[:-1]) if getattr(ax.extent, "value", None) == 1
            and ax.var.name not in b_vars]  # (one row that A does not index: a classifier at batch 1)
    extents = [size_hint(ax.extent, dynamic) for ax in (*c.axes, *sums[0].axes)]
    if not rows or not all(isinstance(e, int) for e in extents) \
            or 2 * math.prod(extents) < GEMM_MIN_FLOPS:  # type: ignore[arg-type]
        return len(c.axes)
    return rows[-1]


def _strip_casts(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def _row_local(group: list[Compute], c: Compute, k: int, op: OpTE) -> bool:
    """Does ``c`` read the group's tensors (directly or through a pad) only at its own first ``k`` indices?"""
    produced = {m.tensor for m in group}
    own = [ax.var.name for ax in c.axes[:k]]
    for read in _reads_of(op, c.body, produced):
        lead = read.indices[:k]
        if len(lead) < k or [getattr(i, "name", None) for i in lead] != own:
            return False
        if not all(_zero(w) for pad in _pads_of(op, read.tensor) for w in (*pad.lo[:k], *pad.hi[:k])):
            return False  # padding a shared dim shifts which iteration's values are read
    return True


def _reads_of(op: OpTE, body: Expr, tensors: set[str]) -> list[Read]:
    """Reads in ``body`` of ``tensors`` or of pad views of them (a pad of a pad too: fuzz seed
    20050 read ``pad(pad(T))`` in a group that kept one element of ``T`` per iteration)."""
    return [n for n in walk(body) if isinstance(n, Read) and _viewed(op, n.tensor) in tensors]


def _pads_of(op: OpTE, tensor: str) -> list:
    """The pad views between ``tensor`` and what it views, outermost first (none for a tensor)."""
    pads = []
    while tensor in op.pads:
        pads.append(op.pads[tensor])
        tensor = op.pads[tensor].source
    return pads


def _viewed(op: OpTE, tensor: str) -> str:
    """The tensor that ``tensor`` is, or that its pad views read in the end."""
    pads = _pads_of(op, tensor)
    return pads[-1].source if pads else tensor


def _zero(e: Expr) -> bool:
    return getattr(e, "value", None) == 0


def _only_read_in(op: OpTE, tensor: str, members: list[Compute]) -> bool:
    """Whether only the statements of the group read ``tensor``: a ``+=`` into a member's tensor
    is a statement of its own, outside the group (fuzz seed 2603), and may read it in its
    left-hand index (a scatter at positions the group computes: the torch.compile importer's
    embedding gradient lost the positions' buffer)."""
    for c in op.computes:
        if not any(c is m for m in members) and any(_reads_of(op, e, {tensor}) for e in (c.body, *(c.lhs or ()))):
            return False
    return True
