"""The tensor-expression (TE) IR: what an op computes, with no loops yet.

An :class:`OpTE` is a list of :class:`Compute` statements, each defining every element of
one tensor as a scalar expression of reads of other tensors. Shapes are expressions over
shape symbols and compile-time parameters until :func:`tcc.passes.te.specialize.specialize`
binds them, after which every extent is a constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tcc.dtypes import DType
from tcc.errors import Source, Span, TccError
from tcc.ir.expr import Const, Expr, IterVar, Read, Reduce, Var, format_expr


@dataclass(frozen=True)
class Tensor:
    """A tensor of an op: an input, a result, an intermediate, or a virtual padded view."""

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    kind: str  # "input" | "result" | "temp" | "pad"
    span: Span | None = field(default=None, compare=False, repr=False)

    def concrete_shape(self) -> tuple[int, ...]:
        """The shape as integers; only valid after specialisation without dynamic symbols."""
        return tuple(int(d.value) for d in self.shape)  # type: ignore[attr-defined]

    def dims(self) -> tuple[int | Expr, ...]:
        """The shape after specialisation: an integer per dim, an expression of the dynamic
        shape symbols where the dim depends on them."""
        return tuple(int(d.value) if isinstance(d, Const) else d for d in self.shape)


@dataclass(frozen=True)
class Pad:
    """``name = pad(source, lo, hi, value=value)``: a view that is never materialised."""

    name: str
    source: str
    lo: tuple[Expr, ...]
    hi: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True)
class Scalar:
    """A runtime scalar parameter."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class Compute:
    """``tensor[axes] = body``; or, with ``accumulate``, ``tensor[lhs] += body`` for every point of
    ``axes`` (a scatter: ``lhs`` may be any index expressions, and several points may hit one
    position). An accumulation adds into a tensor that an earlier statement defined. A recurrence
    reads ``tensor`` itself at earlier positions along the axes named in ``sequential``: their
    iterations must run in ascending order (the others stay independent)."""

    tensor: str
    axes: tuple[IterVar, ...]
    body: Expr
    span: Span | None = field(default=None, compare=False, repr=False)
    sequential: tuple[str, ...] = ()
    lhs: tuple[Expr, ...] | None = None  # the left-hand indices of an accumulation
    accumulate: bool = False

    def target_indices(self) -> tuple[Expr, ...]:
        """Where each point stores: ``lhs`` for an accumulation, else the axes themselves."""
        return self.lhs if self.lhs is not None else tuple(ax.var for ax in self.axes)


@dataclass(frozen=True)
class StreamSum:
    """``tensor[rows, extra] = sum[axis](exp(score - max) * weight)`` of a :class:`Stream`
    (``weight`` None: the plain sum of the exponentials, a softmax denominator)."""

    tensor: str
    extra: tuple[IterVar, ...]  # the axes beyond the rows (``d`` of attention's output)
    weight: Expr | None  # in the rows', the extra axes' and the stream axis' variables


@dataclass(frozen=True)
class Stream:
    """Statements computed together by one pass over ``axis`` (the online-softmax recurrence):
    ``maximum[rows] = max[axis](score)`` and the ``sums`` of ``exp(score - maximum)``, the
    maximum kept as a running value and each sum rescaled by ``exp(old - new)`` when it grows, so
    neither ``score`` nor its exponentials over ``rows x axis`` are ever stored. ``axis`` runs in
    tiles of ``tile`` and the last row axis in tiles of ``tile_rows``; where ``limit`` is given,
    ``score`` is ``-inf`` for ``axis >= limit`` (a causal mask) and those tiles are skipped. With
    ``splits`` the keys come in parts that run in parallel; ``keys_outside`` puts the tiles of
    keys outside the blocks of rows, so each tile's keys are read once rather than once per
    block, where they are what fits no cache (a vocabulary's weights)."""

    maximum: str
    rows: tuple[IterVar, ...]
    axis: IterVar
    score: Expr
    sums: tuple[StreamSum, ...]
    limit: Expr | None = None  # an expression of the rows' variables
    tile: int = 64
    tile_rows: int = 1
    stage_keys: bool = False  # copy each tile's keys key-last for a block of rows (the CPU's vectors)
    group: int = 1  # rows of a block whose sums are formed together (the CPU's registers)
    epilogues: tuple[str, ...] = ()  # statements after it computed from its rows as they finish
    internal: tuple[str, ...] = ()  # its tensors read by those alone: never stored
    splits: int = 0  # keys in this many parts at most (run in parallel), each with its own maxima and sums
    # per row, combined at the end (0: one part)
    keys_outside: bool = False  # the tiles of keys outside the blocks of rows (with splits)

    @property
    def tensors(self) -> tuple[str, ...]:
        return (self.maximum, *(s.tensor for s in self.sums))

    @property
    def statements(self) -> tuple[str, ...]:
        """The statements it computes, in order: its own, then the epilogues."""
        return (*self.tensors, *self.epilogues)


@dataclass(frozen=True)
class Sweep:
    """Intermediates over every (row, key) pair (``pairs``, over ``outer x row x key``) that are
    read only by ``sums`` over one of the two axes, computed a tile of pairs at a time and never
    stored: for each tile of keys, the sums over the rows (``by_key``: one value per key) stay in
    locals while the tiles of rows go by, and the sums over the keys add into their tensors. This
    is FlashAttention-2's backward (scores, probabilities and their gradients never in memory)."""

    outer: tuple[IterVar, ...]
    row: IterVar
    key: IterVar
    pairs: tuple[str, ...]  # in order; each over (outer, row, key) in its own variables
    sums: tuple[str, ...]  # ``C[outer, y, x...] = sum[r](...)``, reading pairs at (r, y) or (y, r)
    by_key: tuple[str, ...]  # the sums over the rows
    tile_rows: int = 64
    tile_keys: int = 64
    limit: Expr | None = None  # every sum's term is 0 at keys >= limit (of the outer and row variables)
    split: bool = False  # the sums over rows and over keys in nests of their own: tiles are parallel work

    @property
    def statements(self) -> tuple[str, ...]:
        return (*self.pairs, *self.sums)


@dataclass
class OpTE:
    """One op in tensor-expression form."""

    name: str
    cparams: dict[str, int | float]  # compile-time parameters and their defaults
    params: list[str]  # positional parameters in order: tensor inputs and scalars
    results: list[str]
    tensors: dict[str, Tensor]
    scalars: dict[str, Scalar]
    pads: dict[str, Pad]
    computes: list[Compute]
    symbols: list[str]  # shape symbols, in order of first appearance in the inputs
    source: Source
    span: Span | None = None
    bindings: dict[str, int | float] = field(default_factory=dict)  # set by specialisation
    dynamic: tuple[str, ...] = ()  # shape symbols left variables by specialisation: kernel arguments
    range_checks: list = field(default_factory=list)  # sema.RangeCheck: inferred ranges to agree
    index_checks: list = field(default_factory=list)  # bounds.IndexCheck: data indices checked at the call
    groups: list = field(default_factory=list)  # fusion.FusionGroup: computes sharing outer loops
    fusion_notes: list = field(default_factory=list)  # fusion decisions and why, for the fused stage
    streams: list[Stream] = field(default_factory=list)  # statements computed in one streaming pass
    sweeps: list[Sweep] = field(default_factory=list)  # pair intermediates computed a tile at a time

    @property
    def inputs(self) -> list[str]:
        return [p for p in self.params if p in self.tensors]

    def accumulated(self) -> set[str]:
        """The tensors that an accumulating statement (``+=``) adds into."""
        return {c.tensor for c in self.computes if c.accumulate}



def format_op(op: OpTE) -> str:
    """Readable text of the TE IR."""
    def shape(t: Tensor) -> str:
        return f"{t.dtype}[{', '.join(format_expr(d) for d in t.shape)}]"

    params = []
    for p in op.params:
        params.append(f"{p}: {shape(op.tensors[p])}" if p in op.tensors else f"{p}: {op.scalars[p].dtype}")
    results = ", ".join(f"{r}: {shape(op.tensors[r])}" for r in op.results)
    head = f"te {op.name}"
    if op.bindings or op.dynamic:
        bound = [f"{k}={v}" for k, v in op.bindings.items()] + [f"{k}=dynamic" for k in op.dynamic]
        head += " {" + ", ".join(bound) + "}"
    elif op.cparams:
        head += "[" + ", ".join(f"{k} = {v}" for k, v in op.cparams.items()) + "]"
    lines = [f"{head}({', '.join(params)}) -> ({results}) {{"]
    for pad in op.pads.values():
        lo = ", ".join(format_expr(e) for e in pad.lo)
        hi = ", ".join(format_expr(e) for e in pad.hi)
        lines.append(f"    {pad.name}: {shape(op.tensors[pad.name])} = pad({pad.source}, [{lo}], [{hi}], "
                     f"value={format_expr(pad.value)})")
    for c in op.computes:
        t = op.tensors[c.tensor]
        axes = ", ".join(f"{ax.var.name}: {format_expr(ax.extent)}" for ax in c.axes)
        kind = "" if t.kind == "result" else f"  # {t.kind}"
        if c.sequential:
            kind += f"  # in order along {', '.join(c.sequential)}"
        if c.accumulate:
            lhs = ", ".join(format_expr(i) for i in c.target_indices())
            lines.append(f"    {c.tensor}[{lhs}] [{axes}] += {format_expr(c.body)}{kind}")
            continue
        lines.append(f"    {c.tensor}: {shape(t)} [{axes}] = {format_expr(c.body)}{kind}")
    lines.append("}")
    return "\n".join(lines)


def verify_op(op: OpTE) -> None:
    """Check the invariants later passes rely on; a failure is a compiler bug."""
    defined = set(op.inputs) | set(op.pads)
    for c in op.computes:
        t = op.tensors.get(c.tensor)
        _check(t is not None and t.kind in ("result", "temp"), f"{c.tensor} is not computable")
        _check(c.accumulate == (c.lhs is not None), f"{c.tensor}: an accumulation needs its left-hand indices")
        _check(not c.accumulate or c.tensor in defined, f"{c.tensor} accumulated into before it is defined")
        indices = c.target_indices()
        _check(len(indices) == len(t.shape), f"{c.tensor}: {len(indices)} indices for rank {len(t.shape)}")
        bound = {ax.var.name for ax in c.axes} | set(op.scalars) | set(op.symbols) | set(op.cparams)
        _check_expr(c.body, op, defined | ({c.tensor} if c.sequential else set()), bound)
        for idx in c.lhs or ():
            _check_expr(idx, op, defined, bound)
        defined.add(c.tensor)
    for r in op.results:
        _check(r in defined, f"result {r} is never computed")


def _check_expr(e: Expr, op: OpTE, defined: set[str], bound: set[str]) -> None:
    if isinstance(e, Reduce):
        _check_expr(e.body, op, defined, bound | {ax.var.name for ax in e.axes})
        return
    if isinstance(e, Read):
        _check(e.tensor in defined, f"{e.tensor} read before it is defined")
        _check(len(e.indices) == len(op.tensors[e.tensor].shape), f"rank mismatch reading {e.tensor}")
    if isinstance(e, Var):
        _check(e.name in bound, f"unbound variable {e.name}")
    for c in e.children():
        _check_expr(c, op, defined, bound)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise TccError(f"internal error: TE verifier: {message}")


__all__ = ["Compute", "OpTE", "Pad", "Scalar", "Stream", "StreamSum", "Sweep", "Tensor", "format_op", "verify_op"]
