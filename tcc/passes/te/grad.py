"""Reverse-mode automatic differentiation of the TE IR: the op that computes an op's gradients.

``derive(op, wrt)`` takes a symbolic op ``f(X, ...) -> (Y, ...)`` and returns the op
``f_grad(X, ..., dY, ...) -> (dX, ...)``: given the upstream gradient of each result, the
vector-Jacobian product for each input in ``wrt``. The result is ordinary TE, printed as source
by :func:`tcc.ir.source.format_source`, so it runs through the frontend and the whole pipeline
like a hand-written op.

1. **Normalise**: every reduction that is part of a larger expression becomes its own
   intermediate, so a statement is either elementwise or one reduction; a tensor that ``+=``
   adds into is first computed into a copy of its own (its derivatives read the values before the
   additions).
2. **Sweep** the statements backwards. A tensor's adjoint is complete once every later
   statement has been seen; it is the sum of what each read of it contributes. A read's
   contribution is the upstream adjoint times the partial derivative (:mod:`grad_expr`),
   gathered onto the read tensor's indices (:mod:`grad_index`): a sum over the index variables
   the read leaves free; or, where that sum would be masked by an index no variable solves (a
   data index, ``E[idx[n], d]``), added where it lands: ``dE[idx[n], d] += ...``. A ``+=``
   statement's upstream is the adjoint read at its left-hand position; prefix reductions and
   recurrences have adjoints that run backwards along their axis (:mod:`grad_scan`).
3. **Keep** the forward statements the gradients read (they are recomputed), drop the rest.

Reductions: ``sum`` passes the adjoint to each term; ``max``/``min`` pass it to the elements
equal to the result, split evenly between ties (PyTorch's rule for ``amax``/``amin``; with
distinct values this is the one arg-max, as in ``max_pool2d``); ``prod`` passes
``adjoint * result / term`` (undefined where a term is 0). Reads of a ``pad`` view are reads of
its source where they fall inside it. Any integer index differentiates (:mod:`grad_index`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from tcc import dtypes
from tcc.errors import TccArgumentError, TccCompileError
from tcc.ir.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    Var,
    const,
    free_vars,
    substitute,
    transform,
    walk,
)
from tcc.ir.te import Compute, OpTE, Pad, Tensor, verify_op
from tcc.passes.simplify import simplify
from tcc.passes.te.grad_expr import fadd, fdiv, fmul, fselect, num, partials
from tcc.passes.te.grad_index import Adjoint, Emitter, clamp, gather, iadd, isub
from tcc.passes.te.grad_scan import prefix_of, prefix_partials, recurrence_partials
from tcc.passes.te.grad_softmax import constant_maxima
from tcc.passes.te.grad_tidy import tidy_op

PIECE = 24  # the most nodes a float subexpression keeps inline in the normalised forward


def derive(op: OpTE, wrt: Sequence[str] | None = None, name: str | None = None,
           saved: Sequence[str] = ()) -> OpTE:
    """The gradient op of ``op`` with respect to the tensor inputs ``wrt`` (default: every float one).
    ``saved``: tensors of ``op`` (intermediates or results) that the gradient op takes as inputs,
    after the upstream gradients, rather than computing them again (attention's row maxima and
    sums, and its output: :func:`saving` gives the forward op that returns them)."""
    wrt = _check_wrt(op, wrt)
    _check_differentiable(op)
    _one_version(op)
    _check_saved(op, saved)
    return _Derivation(op, wrt, name or f"{op.name}_grad", tuple(saved)).run()


def saving(op: OpTE, saved: Sequence[str], name: str | None = None) -> OpTE:
    """``op`` that also returns the intermediates ``saved`` (after its own results), for a
    gradient op derived with the same ``saved``."""
    _check_saved(op, saved)
    extra = [s for s in saved if s not in op.results]
    tensors = {n: replace(t, kind="result") if n in extra else t for n, t in op.tensors.items()}
    return replace(op, name=name or f"{op.name}_saving", results=[*op.results, *extra], tensors=tensors)


def _check_saved(op: OpTE, saved: Sequence[str]) -> None:
    for s in saved:
        t = op.tensors.get(s)
        if t is None or t.kind not in ("temp", "result") or s in op.accumulated() \
                or any(c.tensor == s and c.sequential for c in op.computes):
            raise TccArgumentError(f"{op.name} has no intermediate or result {s!r} to save", op.span,
                                   "name statements of the op computed by = (not +=, not a recurrence)")
    if len(set(saved)) != len(saved):
        raise TccArgumentError(f"saved= names a tensor twice: {list(saved)}", op.span)


def _one_version(op: OpTE) -> None:
    """A tensor that ``+=`` adds into must not be read before its last ``+=``: the gradient op
    recomputes the forward whole, so it would see only the final values."""
    last = {c.tensor: k for k, c in enumerate(op.computes) if c.accumulate}
    first = {}
    for k, c in enumerate(op.computes):
        first.setdefault(c.tensor, k)
        for read in (n for e in (c.body, *(c.lhs or ())) for n in walk(e) if isinstance(n, Read)):
            if read.tensor in last and first[read.tensor] <= k <= last[read.tensor] \
                    and not (k == first[read.tensor] and c.sequential):  # (a recurrence's own reads: its version)
                raise TccCompileError(f"{c.tensor}'s statement reads {read.tensor} before the last += into it: "
                                      "tcc.grad differentiates a tensor's final values only", c.span,
                                      f"read a copy of {read.tensor}, or add into it after the reads")


def _check_wrt(op: OpTE, wrt: Sequence[str] | None) -> list[str]:
    floats = [p for p in op.inputs if op.tensors[p].dtype.is_float]
    if wrt is None:
        return floats
    wrt = [wrt] if isinstance(wrt, str) else list(wrt)
    for w in wrt:
        if w not in op.inputs:
            raise TccArgumentError(f"{op.name} has no tensor input {w!r} to differentiate by", op.span,
                                   f"its tensor inputs: {', '.join(op.inputs)}")
        if w not in floats:
            raise TccArgumentError(f"{w} is {op.tensors[w].dtype}: only float inputs have gradients", op.span)
    if len(set(wrt)) != len(wrt) or not wrt:
        raise TccArgumentError(f"wrt= must name distinct inputs of {op.name}, got {wrt}", op.span)
    return wrt


def _check_differentiable(op: OpTE) -> None:
    """A recurrence's reads of itself must be outside reductions: the normalisation moves each
    reduction into an intermediate computed before the statement, which would read the tensor
    before its recurrence runs."""
    for c in op.computes:
        for r in (n for n in walk(c.body) if isinstance(n, Reduce)) if c.sequential else ():
            if any(isinstance(n, Read) and n.tensor == c.tensor for n in walk(r)):
                raise TccCompileError(f"{c.tensor} is a recurrence that reads itself inside a reduction: tcc.grad "
                                      "cannot differentiate that", r.span or c.span,
                                      f"read {c.tensor} outside the reduction")


class _Derivation:
    def __init__(self, op: OpTE, wrt: list[str], name: str, saved: tuple[str, ...] = ()):
        self.op, self.wrt, self.name, self.saved = op, wrt, name, saved
        self.taken = _names(op) | {name}
        self.tensors: dict[str, Tensor] = dict(op.tensors)
        self.pads: dict[str, Pad] = dict(op.pads)
        self.forward: list[Compute] = []
        self.backward: list[Compute] = []
        self.contribs: dict[str, list[Expr]] = {}
        self.scatters: dict[str, list[Scatter]] = {}
        self.targets: tuple[Var, ...] = ()
        self.emit = Emitter(self.fresh, self._add_temp, self._add_pad,
                            static=frozenset(op.symbols) | frozenset(op.cparams))

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}{n}"  # not base_n: lowering names its loops so
        self.taken.add(name)
        return name

    # ------------------------------------------------------------ the sweep
    def run(self) -> OpTE:
        for c in self._versions():
            body = self._hoist(c.body, list(c.axes), c.tensor)
            if c.accumulate and isinstance(body, Reduce):  # a += adds a reduction: hold it in an intermediate
                body = self._intermediate(c.body, body, list(c.axes), c.tensor, body.op)
            self.forward.append(replace(c, body=body))
        active = self._active() - constant_maxima(self.op)  # a softmax's shift: no gradient reaches it
        grads = []
        for r in self.op.results:
            grad = self.fresh(f"d{r}")
            grads.append(grad)
            self.tensors[grad] = Tensor(grad, self.tensors[r].dtype, self.tensors[r].shape, "input")
            self.contribs[r] = [Read(grad, self._targets(r), self.tensors[r].dtype)]
        for c in reversed(self.forward):
            if c.tensor in active and (adj := self._finalize(c.tensor)) is not None:
                self._differentiate(c, adj, active)
                if c.accumulate:  # the statements before it see the same adjoint
                    self.contribs[c.tensor] = [Read(adj, self._targets(c.tensor), self.tensors[c.tensor].dtype)]
        results = [self._finalize(x, result=True) for x in self.wrt]
        return self._build(grads, results)

    def _versions(self) -> list[Compute]:
        """The op's statements, each tensor that ``+=`` adds into first computed into a copy of its own
        (``T_def``, a recurrence reading itself there) and then copied: the derivatives of its
        defining statement read the values it had before the additions, which the gradient op's
        recomputed forward overwrites in ``T``."""
        accumulated = self.op.accumulated()
        out = []
        for c in self.op.computes:
            if c.tensor not in accumulated or c.accumulate:
                out.append(c)
                continue
            t = self.tensors[c.tensor]
            first = self.fresh(f"{c.tensor}_def")
            self.tensors[first] = replace(t, name=first, kind="temp")
            body = transform(c.body, lambda n, first=first, name=c.tensor: replace(n, tensor=first)
                             if isinstance(n, Read) and n.tensor == name else None)
            out.append(replace(c, tensor=first, body=body))
            out.append(Compute(c.tensor, c.axes, Read(first, tuple(ax.var for ax in c.axes), t.dtype), c.span))
        return out

    def _active(self) -> set[str]:
        """Float tensors whose values depend on a ``wrt`` input."""
        active = self._with_views(set(self.wrt))
        for c in self.forward:
            reads = {n.tensor for n in walk(c.body) if isinstance(n, Read)}
            if self.tensors[c.tensor].dtype.is_float and reads & active:
                active = self._with_views(active | {c.tensor})
        return active

    def _with_views(self, tensors: set[str]) -> set[str]:
        """``tensors`` and every pad view of them, pads of pads included."""
        out = set(tensors)
        while new := {p.name for p in self.op.pads.values() if p.source in out} - out:
            out |= new
        return out

    def _targets(self, tensor: str) -> tuple[Var, ...]:
        """The index variables of ``tensor``'s adjoint (``i0, i1, ...``, shared by every adjoint)."""
        rank = len(self.tensors[tensor].shape)
        while len(self.targets) < rank:  # an intermediate of the normalisation may outrank every tensor
            self.targets += (Var(self.fresh(f"i{len(self.targets)}")),)
        return self.targets[:rank]

    def _finalize(self, tensor: str, result: bool = False) -> str | None:
        """The adjoint of ``tensor`` as one tensor (None: it has none), its contributions summed."""
        parts = self.contribs.pop(tensor, [])
        t = self.tensors[tensor]
        axes = self._targets(tensor)
        scatters = self.scatters.pop(tensor, [])
        if not parts and not scatters and not result:
            return None
        if not result and not scatters and len(parts) == 1 and isinstance(parts[0], Read) and parts[0].indices == axes \
                and self.tensors[parts[0].tensor].shape == t.shape:
            return parts[0].tensor
        body = parts[0] if parts else num(0)
        for part in parts[1:]:
            body = fadd(body, part)
        name = self.fresh(f"d{tensor}")
        self._add_temp(name, t.dtype, t.shape, tuple(IterVar(v, d) for v, d in zip(axes, t.shape)), body,
                       "result" if result else "temp")
        for scatter in scatters:
            self._scatter(name, scatter)
        return name

    def _scatter(self, name: str, s: Scatter) -> None:
        """``name[s.indices] += s.value`` over ``s.scope``. The printed ``+=`` infers each index variable's
        range from where it appears alone; where that is not exactly its range here, the value is
        stored first in a tensor over ``s.scope`` read with every variable alone."""
        value, axes = s.value, tuple(IterVar(Var(n), e) for n, e in s.scope.items())
        if not _ranges_inferable(name, s.indices, value, s.scope, self.tensors):
            part = self.fresh(f"{name}_part")
            self._add_temp(part, self.tensors[name].dtype, tuple(ax.extent for ax in axes), axes, value)
            value = Read(part, tuple(ax.var for ax in axes), self.tensors[name].dtype)
        self.backward.append(Compute(name, axes, value, lhs=s.indices, accumulate=True))

    def _differentiate(self, c: Compute, adj: str, active: set[str]) -> None:
        t = self.tensors[c.tensor]
        axes = tuple(ax.var for ax in c.axes)
        scope = {ax.var.name: ax.extent for ax in c.axes}
        adjoint = Adjoint(adj, t.dtype, tuple(v.name for v in axes), t.shape)
        upstream = Read(adj, c.target_indices(), t.dtype)  # for a +=: the adjoint gathered from where it adds
        prefix = prefix_of(c)
        if c.sequential:
            total, parts = recurrence_partials(c, adj, self.emit, partials)
            adjoint = replace(adjoint, name=total)
        elif prefix is not None:
            scope, parts, adjoint = prefix_partials(c, prefix, adjoint, self.emit, partials)
        elif c.accumulate:
            parts = partials(c.body, upstream)
        elif isinstance(c.body, Reduce):
            scope.update({ax.var.name: ax.extent for ax in c.body.axes})
            weight = self._reduce_weight(c, Read(c.tensor, axes, t.dtype))
            parts = partials(c.body.body, fmul(upstream, weight))
        else:
            parts = partials(c.body, upstream, Read(c.tensor, axes, t.dtype))
        for read, value in parts:
            target, indices = self._through_pads(read)
            if target not in active:
                continue
            shape = self.tensors[target].shape
            contribution = gather(indices, shape, self._targets(target), value, scope, adjoint, self.emit)
            if contribution is not None:
                self.contribs.setdefault(target, []).append(contribution)
                continue
            padded = target != read.tensor
            if padded:  # through a pad: the positions that fall in its border add nothing (and are clamped)
                value = fselect(_inside(indices, shape), value, num(0))
            # the read may be in bounds only under a select (whose value is then 0 elsewhere), which a +=
            # does not see: positions that read no data are clamped, those that do are checked at the call
            indices = tuple(i if self._reads_data(i) and not padded else clamp(i, d) for i, d in zip(indices, shape))
            self._add_scatter(target, Scatter(indices, value, dict(scope)))

    def _reads_data(self, index: Expr) -> bool:
        return any(isinstance(n, Read) or (isinstance(n, Var) and n.name in self.op.scalars) for n in walk(index))

    def _add_scatter(self, target: str, new: Scatter) -> None:
        """Scatters to the same positions over the same points add their values first (one ``+=``)."""
        found = self.scatters.setdefault(target, [])
        for k, s in enumerate(found):
            if s.indices == new.indices and s.scope == new.scope:
                found[k] = replace(s, value=fadd(s.value, new.value))
                return
        found.append(new)

    def _reduce_weight(self, c: Compute, value: Read) -> Expr:
        """d(reduction)/d(term): 1 for sum, the ties' share for max/min, result / term for prod."""
        red = c.body
        assert isinstance(red, Reduce)
        if red.op == "sum":
            return num(1)
        if red.op == "prod":
            return fdiv(value, red.body)
        term = red.body if red.body.dtype == value.dtype else Cast(red.body, value.dtype)
        hit = Binary("eq", term, value, dtypes.boolean)
        ties = self.fresh(f"{c.tensor}_ties")
        count = replace(red, op="sum", body=fselect(hit, num(1), num(0)), dtype=value.dtype, acc_dtype=value.dtype)
        self._add_temp(ties, value.dtype, self.tensors[c.tensor].shape, c.axes, count)
        return fselect(hit, fdiv(num(1), Read(ties, value.indices, value.dtype)), num(0))

    def _through_pads(self, read: Read) -> tuple[str, tuple[Expr, ...]]:
        """A read of a pad view as a read of its source (where it falls inside the source)."""
        tensor, indices = read.tensor, read.indices
        while tensor in self.pads:
            pad = self.pads[tensor]
            indices = tuple(isub(i, lo) for i, lo in zip(indices, pad.lo))
            tensor = pad.source
        return tensor, indices

    # ------------------------------------------------------------ normalisation
    def _hoist(self, e: Expr, scope: list[IterVar], owner: str) -> Expr:
        """``e`` with each reduction below its root moved into an intermediate of its own, and each
        float subexpression of more than ``PIECE`` nodes: a derivative copies the values it needs
        (``tanh``'s ``1 - v*v``, a product's other factor), so a gradient of a deep statement, and
        above all the gradient of that gradient, would grow with every level; pieces keep it linear."""
        if isinstance(e, Reduce):
            return replace(e, body=self._lift(e.body, scope + list(e.axes), owner, root=True))
        return self._lift(e, scope, owner, root=True)

    def _lift(self, e: Expr, scope: list[IterVar], owner: str, root: bool = False, conds: Guards = ()) -> Expr:
        """``conds``: the select conditions (and which way each went) around ``e``. A hoisted value
        keeps them, so that its reads stay where they are proved in bounds (``select(t > 0, ..H[t - 1]..)``)."""
        if isinstance(e, Reduce):
            hoisted = self._hoist(e, scope, owner)
            names = {ax.var.name for ax in scope}
            if not any(free_vars(ax.extent) & names for ax in e.axes):  # (a prefix's body stays free of i)
                hoisted = replace(hoisted, body=_guarded(hoisted.body, conds))
            return self._intermediate(hoisted, hoisted, scope, owner, e.op)
        if isinstance(e, Select):
            kids = {id(e.cond): self._lift(e.cond, scope, owner, conds=conds),
                    id(e.a): self._lift(e.a, scope, owner, conds=(*conds, (e.cond, True))),
                    id(e.b): self._lift(e.b, scope, owner, conds=(*conds, (e.cond, False)))}
        else:
            kids = {id(k): self._lift(k, scope, owner, conds=conds) for k in e.children()}
        if not all(kids[id(k)] is k for k in e.children()):
            e = _rebuild(e, kids)
        if not root and e.dtype.is_float and not isinstance(e, (Read, Const)) and _size(e) > PIECE \
                and not any(free_vars(ax.extent) & {a.var.name for a in scope} for ax in scope) \
                and not any(isinstance(n, Read) and n.tensor == owner for n in walk(e)):  # a recurrence's own read
            guarded = _guarded(e, conds)
            return self._intermediate(guarded, guarded, scope, owner, "t")
        return e

    def _intermediate(self, e: Expr, body: Expr, scope: list[IterVar], owner: str, kind: str) -> Read:
        """A read of a new forward intermediate that holds ``body`` (``e`` hoisted) over the index
        variables of ``scope`` that ``e`` uses."""
        used = free_vars(e) - ({ax.var.name for ax in e.axes} if isinstance(e, Reduce) else set())
        if isinstance(e, Reduce):  # a prefix's extent names the statement's index (sum[j: i + 1])
            used |= {v for ax in e.axes for v in free_vars(ax.extent)}
        axes = [_widest(ax, scope, used) for ax in scope if ax.var.name in used]
        indices: tuple[Expr, ...] = tuple(ax.var for ax in axes)
        if not axes:  # a rank-0 value: one element
            axes = [IterVar(Var(self.fresh("z")), const(1))]
            indices = (const(0),)
        name = self.fresh(f"{owner}_{kind}")
        self.tensors[name] = Tensor(name, e.dtype, tuple(ax.extent for ax in axes), "temp")
        self.forward.append(Compute(name, tuple(axes), body))
        return Read(name, indices, e.dtype)

    # ------------------------------------------------------------ output
    def _add_temp(self, name: str, dtype, shape: tuple[Expr, ...], axes: tuple[IterVar, ...], body: Expr,
                  kind: str = "temp", sequential: tuple[str, ...] = ()) -> None:
        self.tensors[name] = Tensor(name, dtype, shape, kind)
        self.backward.append(Compute(name, axes, body, sequential=sequential))

    def _add_pad(self, name: str, source: str, lo: tuple[Expr, ...], hi: tuple[Expr, ...]) -> None:
        src = self.tensors[source]
        shape = tuple(iadd(iadd(d, a), b) for d, a, b in zip(src.shape, lo, hi))
        self.tensors[name] = Tensor(name, src.dtype, shape, "pad")
        self.pads[name] = Pad(name, source, lo, hi, num(0))

    def _build(self, grads: list[str], results: list[str]) -> OpTE:
        needed = self._needed()
        saved = [n for n in self.saved if n in needed]  # (one the gradients do not read is no parameter)
        computes = [c for c in self.forward if c.tensor in needed and c.tensor not in saved] + self.backward
        tensors = {}
        for n, t in self.tensors.items():
            if n in self.op.inputs or n in grads or n in saved:
                tensors[n] = replace(t, kind="input")
            elif n in needed or any(c.tensor == n for c in self.backward):
                tensors[n] = replace(t, kind="result" if n in results else ("pad" if n in self.pads else "temp"))
        pads = {n: p for n, p in self.pads.items() if n in needed}
        out = OpTE(self.name, dict(self.op.cparams), [*self.op.params, *grads, *saved], results, tensors,
                   dict(self.op.scalars), pads, computes, list(self.op.symbols), self.op.source, self.op.span)
        out = tidy_op(out, frozenset(_names(out)) - set(self.op.symbols) - set(self.op.cparams))
        verify_op(out)
        return out

    def _needed(self) -> set[str]:
        """The forward tensors and pads the backward statements read, transitively."""
        defs: dict[str, list[Compute]] = {}
        for c in self.forward:
            defs.setdefault(c.tensor, []).append(c)
        needed: set[str] = set()
        todo = [n.tensor for c in self.backward for n in _reads(c)]
        while todo:
            name = todo.pop()
            if name in needed:
                continue
            needed.add(name)
            if name in self.pads:
                todo.append(self.pads[name].source)
            elif name not in self.saved:  # (a saved tensor is a parameter: what it reads is not needed for it)
                todo += [n.tensor for c in defs.get(name, ()) for n in _reads(c)]
        return needed


@dataclass(frozen=True)
class Scatter:
    """A contribution added where it lands: ``dA[indices] += value`` for every point of ``scope``."""

    indices: tuple[Expr, ...]
    value: Expr
    scope: dict[str, Expr]


def _reads(c: Compute) -> list[Read]:
    """The reads of a statement, its left-hand indices' included."""
    return [n for e in (c.body, *(c.lhs or ())) for n in walk(e) if isinstance(n, Read)]


def _inside(indices: tuple[Expr, ...], shape: tuple[Expr, ...]) -> Expr:
    conds: list[Expr] = []
    for i, d in zip(indices, shape):
        conds += [Binary("ge", i, const(0), dtypes.boolean), Binary("lt", i, d, dtypes.boolean)]
    cond = conds[0]
    for other in conds[1:]:
        cond = Binary("and", cond, other, dtypes.boolean)
    return cond


def _ranges_inferable(target: str, lhs: tuple[Expr, ...], value: Expr, scope: dict[str, Expr],
                      tensors: dict[str, Tensor]) -> bool:
    """Whether every variable of ``scope`` appears alone in a read of ``value`` or in ``lhs`` at a dim
    whose size is its extent (as the frontend infers a ``+=`` statement's ranges), and at no other."""
    found: dict[str, set[Expr]] = {}
    reads = [n for e in (value, *lhs) for n in walk(e) if isinstance(n, Read)]
    for tensor, indices in [*((r.tensor, r.indices) for r in reads), (target, lhs)]:
        for dim, i in enumerate(indices):
            if isinstance(i, Var) and i.name in scope:
                found.setdefault(i.name, set()).add(simplify(tensors[tensor].shape[dim]))
    return all(found.get(v) == {simplify(e)} for v, e in scope.items())


Guards = tuple[tuple[Expr, bool], ...]


def _widest(ax: IterVar, scope: list[IterVar], used: set[str]) -> IterVar:
    """``ax`` with an extent that moves with an index the intermediate does not keep (``k: i + 1``
    under ``sum[k: i + 1]``) replaced by its largest value (the extent is affine: at an end of
    that index's range); the values past a point's own extent are computed and never read."""
    moving = [a for a in scope if a.var.name in free_vars(ax.extent) and a.var.name not in used]
    extent = ax.extent
    for a in moving:
        ends = [substitute(extent, {a.var.name: e}) for e in (const(0), isub(a.extent, const(1)))]
        extent = simplify(Binary("max", ends[0], ends[1], dtypes.i64))
    return IterVar(ax.var, extent) if moving else ax


def _guarded(e: Expr, conds: Guards) -> Expr:
    """``e`` where every condition of ``conds`` goes its way, else 0."""
    zero = num(0) if e.dtype.is_float else Const(0, e.dtype)
    for cond, taken in reversed(conds):
        e = Select(cond, e, zero, e.dtype) if taken else Select(cond, zero, e, e.dtype)
    return e


def _size(e: Expr) -> int:
    return sum(1 for _ in walk(e))


def _rebuild(e: Expr, kids: dict[int, Expr]) -> Expr:
    """``e`` with its direct children replaced (``kids`` by the id of the old child)."""
    updates = {}
    for f in fields(e):
        value = getattr(e, f.name)
        if isinstance(value, Expr) and id(value) in kids:
            updates[f.name] = kids[id(value)]
        elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
            updates[f.name] = tuple(kids.get(id(v), v) for v in value)
    return replace(e, **updates)


def _names(op: OpTE) -> set[str]:
    """Every name the op uses: tensors, scalars, symbols, parameters and index variables."""
    names = set(op.tensors) | set(op.scalars) | set(op.symbols) | set(op.cparams) | {op.name}
    for c in op.computes:
        names |= {ax.var.name for ax in c.axes}
        for n in walk(c.body):
            if isinstance(n, Var):
                names.add(n.name)
            if isinstance(n, Reduce):
                names |= {ax.var.name for ax in n.axes}
    return names
