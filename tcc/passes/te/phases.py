"""phases: a convolution over a dilated tensor becomes ``S**d`` phase convolutions of the tensor.

The data gradient of a strided convolution (``tcc.grad``'s window form, and
``examples/conv2d_grad.tc``) reads the upstream gradient dilated by the stride and padded,
``Td[u] = select(u % S == 0, A[u // S], 0)``, in a stride-1 convolution
``O[h] = sum[r](Tp[h + r + k] * W(r))``: of its products, ``(S**d - 1) / S**d`` multiply an
inserted zero (3/4 for a 2-D stride 2). The stride is a compile-time parameter, so this runs
after specialisation. Split each dilated output index ``h = S*q + t``: for the phase ``t`` only
the taps ``r = r0(t) + S*j`` read a nonzero, at ``A[q + e(t) + j]``, so each phase is a plain
stride-1 convolution of ``A`` itself (padded: a view) over ``q`` with its own taps,

    O_t[q] = sum[j](Ap[q + e(t) + j + lo] * W(r0(t) + S*j))

which im2col and the GEMM take like any convolution, and the statement ``O`` puts each phase's
values back where they belong: ``O[h] = O_{h % S}[h // S]`` (a select over the phases). The
products are the same, in the same order per tap, without the zeros.

It applies where the dilated tensor (through at most one zero pad) is read once, by a statement
that is one ``sum`` whose read of it has, in each dilated dim, an output index plus a reduction
index plus a constant (coefficients 1); the other dims are read as they are, through the same
pad. Anything else is left as it is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from tcc import dtypes
from tcc.ir.expr import (
    Binary,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    Var,
    substitute,
    transform,
    unique_name,
    walk,
)
from tcc.ir.te import Compute, OpTE, Pad, Tensor
from tcc.passes.simplify import evaluate_int, simplify
from tcc.passes.te.grad_index import linear


@dataclass(frozen=True)
class _Dilated:
    """``dil[u..] = select(and(u_d % S_d == 0), source[u_d // S_d or u_d], 0)``."""

    compute: Compute
    source: str
    strides: dict[int, int]  # dim -> stride, the dilated dims only


@dataclass(frozen=True)
class _Dim:
    """One dilated dim of the consumer's read: index ``h + r + k`` into the dilated view."""

    dim: int
    stride: int
    out: str  # the output index h
    red: str  # the reduction index r
    offset: int  # k minus the view's low pad: the index into the dilated tensor is h + r + offset


def split_phases(op: OpTE) -> OpTE:
    """``op`` with each convolution over a dilated tensor split into phase convolutions."""
    dilations = [_dilation(op, c) for c in op.computes if c.tensor not in op.accumulated()]
    for dilated in (d for d in dilations if d is not None):  # their computes survive each rewrite
        found = _consumer(op, dilated)
        if found is not None:
            op = _rewrite(op, dilated, *found)
    return op


def _dilation(op: OpTE, c: Compute) -> _Dilated | None:
    body = c.body
    if not (op.tensors[c.tensor].kind == "temp" and isinstance(body, Select) and isinstance(body.a, Read)
            and _is_zero(body.b)):
        return None
    axes = [ax.var.name for ax in c.axes]
    strides: dict[int, int] = {}
    for cond in _conjuncts(body.cond):
        if not (isinstance(cond, Binary) and cond.op == "eq" and _is_zero(cond.b) and isinstance(cond.a, Binary)
                and cond.a.op == "mod" and isinstance(cond.a.a, Var) and cond.a.a.name in axes):
            return None
        stride = evaluate_int(cond.a.b)
        if stride is None or stride < 2:
            return None
        strides[axes.index(cond.a.a.name)] = stride
    read = body.a
    if not strides or len(read.indices) != len(axes):
        return None
    for d, (e, name) in enumerate(zip(read.indices, axes)):
        want = Binary("floordiv", Var(name), Const(strides[d], dtypes.i64), dtypes.i64) if d in strides else Var(name)
        if simplify(e) != simplify(want):
            return None
    return _Dilated(c, read.tensor, strides)


def _consumer(op: OpTE, dilated: _Dilated) -> tuple[Compute, str, list[_Dim]] | None:
    """The one statement that reads the dilated tensor (through its pad view, if any), with the
    dims of that read, when it has the form this pass handles."""
    name = dilated.compute.tensor
    views = [p for p in op.pads.values() if p.source == name]
    if (len(views) > 1 or any(_reads(c.body, name) for c in op.computes) or name in op.results
            or (views and not _is_zero(views[0].value))):
        return None
    view = views[0].name if views else name
    lo = [evaluate_int(x) for x in views[0].lo] if views else [0] * len(dilated.compute.axes)
    readers = [c for c in op.computes if _reads(c.body, view)]
    if len(readers) != 1 or any(p.source == view for p in op.pads.values()):
        return None
    consumer = readers[0]
    if consumer.accumulate:  # a scatter keeps its own left-hand positions
        return None
    body = consumer.body
    reads = [n for n in walk(body) if isinstance(n, Read) and n.tensor == view]
    if not (isinstance(body, Reduce) and body.op == "sum" and len(reads) == 1):
        return None
    outs = {ax.var.name for ax in consumer.axes}
    reds = {ax.var.name for ax in body.axes}
    dims: list[_Dim] = []
    for d, e in enumerate(reads[0].indices):
        if d not in dilated.strides:
            continue  # read as it is: the phases' source pads keep the view's pad along it
        form = linear(simplify(e), outs | reds)
        if form is None:
            return None
        coefs = {k: evaluate_int(v) for k, v in form.items() if k is not None}
        out = [k for k in coefs if k in outs]
        red = [k for k in coefs if k in reds]
        rest = evaluate_int(form.get(None, Const(0, dtypes.i64)))
        if (len(out) != 1 or len(red) != 1 or set(coefs.values()) != {1} or rest is None
                or any(x.out == out[0] or x.red == red[0] for x in dims)):
            return None
        dims.append(_Dim(d, dilated.strides[d], out[0], red[0], rest - lo[d]))
    return consumer, view, dims


def _rewrite(op: OpTE, dilated: _Dilated, consumer: Compute, view: str, dims: list[_Dim]) -> OpTE:
    """The phase statements and the interleave that replace ``consumer``."""
    reduce: Reduce = consumer.body  # type: ignore[assignment]
    extent = {ax.var.name: evaluate_int(ax.extent) for ax in (*consumer.axes, *reduce.axes)}
    source = op.tensors[dilated.source]
    tensors, pads = dict(op.tensors), dict(op.pads)
    computes: list[Compute] = []
    phases: list[tuple[tuple[int, ...], str, dict[str, int]]] = []  # (t per dim, tensor, q extents)
    taken = set(op.tensors) | {ax.var.name for ax in (*consumer.axes, *reduce.axes)}
    view_pad, rank = op.pads.get(view), len(source.shape)
    kept_lo = [evaluate_int(x) for x in view_pad.lo] if view_pad else [0] * rank  # the undilated dims'
    kept_hi = [evaluate_int(x) for x in view_pad.hi] if view_pad else [0] * rank

    for ts in itertools.product(*(range(d.stride) for d in dims)):
        q_ext = {d.out: -(-(extent[d.out] - t) // d.stride) for d, t in zip(dims, ts)}
        if any(v <= 0 for v in q_ext.values()):
            continue
        mapping: dict[str, Expr] = {}
        qs: dict[str, Var] = {}  # output index -> its phase's q
        index = list(_read_of(reduce.body, view).indices)
        red_axes = {ax.var.name: ax for ax in reduce.axes}
        lo, hi = list(kept_lo), list(kept_hi)
        for d, t in zip(dims, ts):
            r0 = -(t + d.offset) % d.stride
            taps = max(-(-(extent[d.red] - r0) // d.stride), 0)
            e = (t + r0 + d.offset) // d.stride
            q, j = Var(unique_name(f"{d.out}_q", taken)), Var(unique_name(f"{d.red}_j", taken))
            mapping[d.out], qs[d.out] = _affine(d.stride, q, t), q
            mapping[d.red] = _affine(d.stride, j, r0)
            red_axes[d.red] = IterVar(j, Const(taps, dtypes.i64))
            size = evaluate_int(source.shape[d.dim])
            lo[d.dim] = max(-e, 0)
            hi[d.dim] = max(q_ext[d.out] - 1 + e + taps - 1 - (size - 1), 0)
            index[d.dim] = simplify(Binary("add", Binary("add", q, j, dtypes.i64),
                                           Const(e + lo[d.dim], dtypes.i64), dtypes.i64))
        if any(ax.extent == Const(0, dtypes.i64) for ax in red_axes.values()):
            continue  # no tap reads this phase: it adds nothing (the interleave's zero)
        src_index = _source_index(dilated, index)
        padded = dilated.source
        if any(lo) or any(hi):
            padded = unique_name(f"{dilated.source}_ph", taken)
            shape = tuple(Const(evaluate_int(s) + a + b, dtypes.i64) for s, a, b in zip(source.shape, lo, hi))
            tensors[padded] = Tensor(padded, source.dtype, shape, "pad", source.span)
            pads[padded] = Pad(padded, dilated.source, tuple(Const(x, dtypes.i64) for x in lo),
                               tuple(Const(x, dtypes.i64) for x in hi), Const(0.0, source.dtype))
        body = transform(reduce.body, lambda n, padded=padded, src_index=src_index:
                         Read(padded, src_index, n.dtype, n.span) if isinstance(n, Read) and n.tensor == view else None)
        body = simplify(substitute(body, mapping))
        name = unique_name(f"{consumer.tensor}_ph{''.join(map(str, ts))}", taken)
        axes = tuple(IterVar(qs[ax.var.name], Const(q_ext[ax.var.name], dtypes.i64)) if ax.var.name in qs else ax
                     for ax in consumer.axes)
        out = op.tensors[consumer.tensor]
        tensors[name] = Tensor(name, out.dtype, tuple(ax.extent for ax in axes), "temp", out.span)
        new_reduce = replace(reduce, axes=tuple(red_axes[ax.var.name] for ax in reduce.axes), body=body)
        computes.append(Compute(name, axes, new_reduce, consumer.span))
        phases.append((ts, name, q_ext))
    interleave = Compute(consumer.tensor, consumer.axes, _interleave(consumer, dims, phases), consumer.span)
    new_computes: list[Compute] = []
    for c in op.computes:
        if c is dilated.compute:
            continue
        new_computes += [*computes, interleave] if c is consumer else [c]
    for gone in {dilated.compute.tensor, view}:
        tensors.pop(gone, None)
        pads.pop(gone, None)
    return replace(op, tensors=tensors, pads=pads, computes=new_computes)


def _interleave(consumer: Compute, dims: list[_Dim], phases: list[tuple[tuple[int, ...], str, dict[str, int]]]
                ) -> Expr:
    """``O[h..] = O_{h % S}[h // S]``: a select over the phases (zero where none computes)."""
    dtype = consumer.body.dtype
    value: Expr = Const(0.0, dtype)
    for ts, name, q_ext in reversed(phases):
        index = []
        for ax in consumer.axes:
            d = next((d for d in dims if d.out == ax.var.name), None)
            if d is None:
                index.append(ax.var)
                continue
            q = Binary("floordiv", ax.var, Const(d.stride, dtypes.i64), dtypes.i64)
            index.append(simplify(Binary("min", q, Const(q_ext[d.out] - 1, dtypes.i64), dtypes.i64)))
        conds = [Binary("eq", Binary("mod", Var(d.out), Const(d.stride, dtypes.i64), dtypes.i64),
                        Const(t, dtypes.i64), dtypes.boolean) for d, t in zip(dims, ts)]
        cond = conds[0]
        for other in conds[1:]:
            cond = Binary("and", cond, other, dtypes.boolean)
        value = Select(cond, Read(name, tuple(index), dtype), value, dtype)
    return value


def _source_index(dilated: _Dilated, index: list[Expr]) -> tuple[Expr, ...]:
    """The read of the (padded) source at the phase's index: the dilated dims are given; the others
    are the dilation statement's own index, at the consumer's."""
    c = dilated.compute
    mapping = {ax.var.name: e for ax, e in zip(c.axes, index)}
    read: Read = c.body.a  # type: ignore[attr-defined]
    return tuple(index[d] if d in dilated.strides else simplify(substitute(e, mapping))
                 for d, e in enumerate(read.indices))


def _affine(stride: int, v: Var, offset: int) -> Expr:
    return Binary("add", Binary("mul", Const(stride, dtypes.i64), v, dtypes.i64), Const(offset, dtypes.i64),
                  dtypes.i64)


def _read_of(e: Expr, tensor: str) -> Read:
    return next(n for n in walk(e) if isinstance(n, Read) and n.tensor == tensor)


def _reads(e: Expr, tensor: str) -> bool:
    return any(isinstance(n, Read) and n.tensor == tensor for n in walk(e))


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0
