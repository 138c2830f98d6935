"""Shape symbols as runtime values: which symbols of an op stay variables, and the per-call proof.

``tcc.compile(src, dynamic=...)`` names the shape symbols whose kernels take them as arguments
(one kernel for every value): ``True`` (all), a list of names, or a dict of name -> a number every
value is a multiple of (the schedule then needs no tail for it). Without ``dynamic=`` the policy
is automatic, as torch.compile's: a symbol that has taken two distinct values on one op becomes
dynamic for that op, so its third value compiles nothing. ``dynamic=False`` specialises always.

A dynamic kernel's reads are proved for each call's values (once per distinct binding, no
compile): the bounds pass runs on the op specialised for them and must prove every read (a read
under a select where its condition holds: the dynamic kernel clamps those), else the call is
refused with the symbols named. An index read from data is checked at every call before any
kernel runs (``runtime.index_checks``, specialised per binding, not per kernel), so it needs no
specialised kernel: an embedding's lookup is dynamic too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tcc.errors import TccArgumentError, TccError, TccShapeError
from tcc.ir.expr import Read, Reduce, free_vars, walk
from tcc.ir.te import OpTE
from tcc.passes.te.bounds import prove_bounds
from tcc.passes.te.specialize import specialize


@dataclass(frozen=True)
class DynamicSpec:
    """What ``dynamic=`` asked for. ``names`` None: every symbol; ``automatic``: the policy above."""

    names: frozenset[str] | None = frozenset()
    multiples: Mapping[str, int] = field(default_factory=dict)
    automatic: bool = False

    def key(self, symbols: frozenset[str]) -> str:
        """The part of a cache key that says which symbols a kernel leaves variable."""
        return ",".join(f"{s}%{self.multiples.get(s, 1)}" for s in sorted(symbols))


AUTOMATIC = DynamicSpec(automatic=True)
STATIC = DynamicSpec()


def parse_dynamic(value: Any) -> DynamicSpec:
    """``dynamic=`` of ``tcc.compile`` as a :class:`DynamicSpec` (a TccArgumentError when malformed)."""
    hint = 'dynamic=True, dynamic=("S", "N") or dynamic={"S": 8} (S a multiple of 8)'
    if value is None:
        return AUTOMATIC
    if isinstance(value, bool):
        return DynamicSpec(names=None) if value else STATIC
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, Mapping):
        for name, multiple in value.items():
            if not isinstance(name, str) or isinstance(multiple, bool) or not isinstance(multiple, int) \
                    or multiple < 1:
                raise TccArgumentError(f"dynamic= maps a shape symbol to a positive integer, not "
                                       f"{name!r}: {multiple!r}", hint=hint)
        return DynamicSpec(frozenset(value), dict(value))
    if isinstance(value, list | tuple | set | frozenset) and all(isinstance(n, str) for n in value):
        return DynamicSpec(frozenset(value))
    raise TccArgumentError(f"dynamic= must be True, False, a list of shape symbols or a dict, not {value!r}",
                           hint=hint)


def parse_tune(value: Any, ops: Mapping[str, OpTE]) -> tuple[bool | int, tuple[dict[str, int], ...]]:
    """``tune=`` of ``tcc.compile``: (trials or True/False, the sizes a dynamic kernel is tuned at).

    ``tune={"S": (128, 1024, 8192)}`` tunes a kernel with ``S`` dynamic for those sizes at once
    (the schedule best over them: the least mean time relative to the default's at each size);
    several symbols give their sizes position by position (a list of one size is used at every
    position). A kernel that specialises ``S`` is tuned at its own size."""
    hint = 'tune=True, tune=20 (trials) or tune={"S": (128, 1024, 8192)} (sizes of a dynamic symbol)'
    if isinstance(value, bool | int) and value >= 0:
        return value, ()
    if not isinstance(value, Mapping) or not value:
        raise TccArgumentError(f"tune={value!r}: expected True, False, a number of trials or a dict of sizes",
                               hint=hint)
    symbols = {s for op in ops.values() for s in op.symbols}
    lists: dict[str, list[int]] = {}
    for name, sizes in value.items():
        sizes = [sizes] if isinstance(sizes, int) else sizes
        if name not in symbols or not isinstance(sizes, list | tuple) or not sizes or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
            raise TccArgumentError(f"tune= maps a shape symbol to its sizes, not {name!r}: {sizes!r}",
                                   hint=f"{hint}; shape symbols: {', '.join(sorted(symbols)) or 'none'}")
        lists[name] = list(sizes)
    count = max(len(v) for v in lists.values())
    if any(len(v) not in (1, count) for v in lists.values()):
        raise TccArgumentError(f"tune= gives {', '.join(f'{k}: {len(v)}' for k, v in lists.items())} sizes: "
                               "the lists pair up position by position", hint="give each symbol as many sizes, or one")
    return True, tuple({k: v[n] if len(v) > 1 else v[0] for k, v in lists.items()} for n in range(count))


def check_names(spec: DynamicSpec, ops: Mapping[str, OpTE]) -> None:
    """Every symbol ``dynamic=`` names is a shape symbol of some op."""
    if spec.names is None:
        return
    symbols = {s for op in ops.values() for s in op.symbols}
    unknown = sorted(spec.names - symbols)
    if unknown:
        raise TccArgumentError(f"dynamic= names {', '.join(unknown)}, which is no op's shape symbol",
                               hint=f"shape symbols: {', '.join(sorted(symbols)) or 'none'}")


def requested(spec: DynamicSpec, op: OpTE) -> frozenset[str]:
    """The symbols of ``op`` that ``dynamic=`` makes variables (the automatic policy adds its own)."""
    names = set(op.symbols) if spec.names is None else spec.names & set(op.symbols)
    return frozenset(names)


def window_symbols(op: OpTE) -> frozenset[str]:
    """The shape symbols that size a sliding window's output pixels (``y`` of ``X[y*S + r]``, a
    convolution's or pooling's image). The automatic policy keeps these specialised: a dynamic
    image runs its 3x3 convolution at 0.73-0.80 of the specialised kernel's throughput (one
    thread, 7x7 to 56x56); ``dynamic=`` may still ask."""
    found: set[str] = set()
    for c in op.computes:
        extents = {ax.var.name: ax.extent for ax in c.axes}
        reduced = {ax.var.name for n in walk(c.body) if isinstance(n, Reduce) for ax in n.axes}
        for read in (n for n in walk(c.body) if isinstance(n, Read)):
            for index in read.indices:
                names = free_vars(index)
                if names & reduced and names & set(extents):
                    for name in names & set(extents):
                        found |= free_vars(extents[name]) & set(op.symbols)
    return frozenset(found)


def stream_symbols(op: OpTE) -> frozenset[str]:
    """The shape symbols of a max over one axis of a computed reduction (attention's scores,
    a linear layer's logits): every symbol of an op with a chain the streaming pass computes in
    one pass without storing the scores, which it does for constant extents only (of every
    symbol: an H200 ran attention 10-20x slower once its D took a second value). The automatic policy keeps
    them specialised, so a third length does not bring the S x L scores back; ``dynamic=`` may
    still ask."""
    reductions = {c.tensor for c in op.computes if any(isinstance(n, Reduce) for n in walk(c.body))}
    for c in op.computes:
        body = c.body
        if isinstance(body, Reduce) and body.op == "max" and len(body.axes) == 1 \
                and any(isinstance(n, Read) and n.tensor in reductions for n in walk(body.body)):
            return frozenset(op.symbols)  # (any dynamic symbol stops the stream: attention's D too)
    return frozenset()


def check_multiples(spec: DynamicSpec, op: OpTE, symbols: frozenset[str], bindings: Mapping[str, Any]) -> None:
    """A symbol declared a multiple (``dynamic={"S": 8}``) must be one at every call."""
    for name in sorted(symbols):
        multiple = spec.multiples.get(name, 1)
        if bindings[name] % multiple:
            raise TccShapeError(f"shape symbol {name} of {op.name} is {bindings[name]}, not a multiple of "
                                f"{multiple} as dynamic= declares", op.span,
                                f"pad the input to a multiple of {multiple}, or declare {name} without one")


def prove_call(op: OpTE, bindings: dict[str, int | float], symbols: frozenset[str]) -> None:
    """Refuse (TccError naming the symbols) the values of one call that the dynamic kernel of
    ``op`` cannot serve: a read out of range. A read proved only under its select's condition is
    clamped in the dynamic kernel (``bounds.clamp_under_selects``); an index read from data is
    the call's to check (``Op.__call__``), as for a specialised kernel."""
    values = ", ".join(f"{s}={bindings[s]}" for s in sorted(symbols))
    try:
        prove_bounds(specialize(op, bindings))
    except TccError as exc:
        raise type(exc)(f"for {values} (dynamic): {exc.message}", exc.span, exc.hint) from None
