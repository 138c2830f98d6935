"""The gather form of an adjoint, for :mod:`tcc.passes.te.grad`.

A statement ``T[i] = ... A[e(i, k)] ...`` (``k`` its reduction indices) contributes
``sum over (i, k) with e(i, k) == a`` of its partial derivative to the adjoint ``dA[a]``. Written
as a gather, ``dA[a]`` is a sum over the index variables that ``e`` leaves free, with the others
solved from the affine equations ``e_d(i, k) == a_d``:

- a dim that is one variable (``A[i, k]``) gives that variable (``i := a_0``); when the variable
  runs over all of ``A``'s dim, nothing guards it (matmul, elementwise, broadcasts);
- a *window* dim ``y*S + r*D - P`` solves the output index ``y`` and sums over the window index
  ``r``, flipped (``r := KH - 1 - r``) so that the read moves forward: ``dA[.., h, ..] =
  sum[r](dTp[.., h + r*D, ..] * W[.., KH - 1 - r])`` reads ``dT`` dilated by ``S`` (``S - 1`` zeros
  between neighbours) and padded, as the hand-written ``examples/conv2d_grad.tc`` does, so that
  im2col and the GEMM schedule take it like a forward convolution. This form applies when the
  solved indices reach the partial derivative only through ``dT``;
- anything else (max pooling's ``select(X[.., y*S + r] == T[.., y], ..)``, a read at a constant,
  a diagonal) solves the same way but guards the sum with the solution's conditions and clamps
  the solved indices into range, so every read stays in bounds;
- a dim that is not affine (``X[i * i % N]``, the clamped reads of a first gradient, which its
  own gradient meets, a data index ``E[idx[n], d]``), or that could only be solved in terms of
  another window dim's solution (``X[i + j, 2*i + j]``), is a guard ``index == a``. Where the
  guard leaves variables to sum over, :func:`gather` returns None and the caller scatters
  (``dA[index] += value``: the forward's work, not the product of the sizes); where it leaves
  none (``X[n, lab[n]]``, ``n`` solved by another dim) it is a compare in the gather. Divisions ``v // c`` and
  ``v % c`` are split first (``v := c*q + t``), so upsampling, pad views read at ``P[j // 3]`` and
  a derived data gradient's dilation read affinely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tcc import dtypes
from tcc.ir.expr import Binary, Const, Expr, IterVar, Read, Reduce, Unary, Var, free_vars, substitute, transform, walk
from tcc.passes.simplify import simplify
from tcc.passes.te.grad_expr import fselect, num

Linear = dict[str | None, Expr]  # index variable (None: the rest) -> coefficient


def _i(value: int) -> Const:
    return Const(value, dtypes.i64)


def iadd(a: Expr, b: Expr) -> Expr:
    return simplify(Binary("add", a, b, dtypes.i64))


def isub(a: Expr, b: Expr) -> Expr:
    return simplify(Binary("sub", a, b, dtypes.i64))


def imul(a: Expr, b: Expr) -> Expr:
    return simplify(Binary("mul", a, b, dtypes.i64))


def imax(a: Expr, b: Expr) -> Expr:
    return simplify(Binary("max", a, b, dtypes.i64))


def clamp(i: Expr, size: Expr) -> Expr:
    """``i`` clamped into ``[0, size)``."""
    return simplify(Binary("min", Binary("max", i, _i(0), dtypes.i64), isub(size, _i(1)), dtypes.i64))


def _cmp(op: str, a: Expr, b: Expr) -> Expr:
    return simplify(Binary(op, a, b, dtypes.boolean))


def linear(e: Expr, variables: set[str]) -> Linear | None:
    """``e`` as a sum of coefficient * variable plus a rest, or None when it is not affine."""
    if isinstance(e, Var) and e.name in variables:
        return {e.name: _i(1)}
    if not (free_vars(e) & variables):
        return {None: e}
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = linear(e.a, variables), linear(e.b, variables)
        if a is None or b is None:
            return None
        for k, v in b.items():
            v = v if e.op == "add" else imul(_i(-1), v)
            a[k] = iadd(a[k], v) if k in a else v
        return a
    if isinstance(e, Binary) and e.op == "mul":
        a, b = linear(e.a, variables), linear(e.b, variables)
        if a is not None and b is not None and (list(a) == [None] or list(b) == [None]):
            scale, form = (a[None], b) if list(a) == [None] else (b[None], a)
            return {k: imul(scale, v) for k, v in form.items()}
    if isinstance(e, Unary) and e.op == "neg":
        inner = linear(e.a, variables)
        return None if inner is None else {k: imul(_i(-1), v) for k, v in inner.items()}
    return None


@dataclass
class Adjoint:
    """The adjoint ``dT`` of the statement being differentiated: its name, axes and shape."""

    name: str
    dtype: dtypes.DType
    axes: tuple[str, ...]
    shape: tuple[Expr, ...]


@dataclass
class Emitter:
    """Where the gather form puts the tensors it needs (the dilated and padded adjoints)."""

    fresh: Callable[[str], str]
    add_temp: Callable[..., None]  # (name, dtype, shape, axes, body, kind=, sequential=)
    add_pad: Callable[[str, str, tuple[Expr, ...], tuple[Expr, ...]], None]
    memo: dict[tuple, str] = field(default_factory=dict)
    static: frozenset[str] = frozenset()  # shape symbols and compile-time parameters: constants once bound


@dataclass
class _Solve:
    var: str
    dim: int
    coef: Expr
    others: Linear  # the dim's other variables (and its rest under None)


def gather(indices: tuple[Expr, ...], shape: tuple[Expr, ...], targets: tuple[Var, ...],
           value: Expr, scope: dict[str, Expr], adjoint: Adjoint, emit: Emitter) -> Expr | None:
    """``dA[targets]``'s part from one read ``A[indices]`` (any integer indices) whose contribution is ``value`` (a
    function of the index variables in ``scope``, name -> extent); None where a scatter is the better form: a
    dim that no variable solves would mask a sum over its variables (``E[idx[n], d]``: a sum over ``n`` for
    every row of ``E``), where ``dA[indices] += value`` does the same work once per point of ``scope``."""
    indices, value, scope = _split_divisions(indices, value, scope, emit)
    forms: list[Linear | None] = []
    for e in indices:
        form = linear(e, set(scope))
        forms.append(None if form is None else {k: v for k, v in form.items() if not (k is not None and _zero(v))})
    solves, guards = _solve(forms, scope)
    trivial = {s.var for s in solves if _trivial(s, scope, shape)}
    window = [s for s in solves if s.var not in trivial]
    summed = [v for v in scope if v not in {s.var for s in solves}]
    if any(free_vars(indices[d]) & set(summed) for d in guards):
        return None
    if not window and not guards:
        body = substitute(value, {s.var: targets[s.dim] for s in solves})
        return _sum(body, summed, scope)
    if not guards and _windowed(window, value, adjoint, summed) and _static_offsets(window, emit.static):
        return _window_form(solves, trivial, value, scope, summed, shape, targets, adjoint, emit)
    return _guarded_form(indices, forms, solves, trivial, value, scope, summed, targets, emit.static)


def _split_divisions(indices: tuple[Expr, ...], value: Expr, scope: dict[str, Expr], emit: Emitter
                     ) -> tuple[tuple[Expr, ...], Expr, dict[str, Expr]]:
    """Each index variable ``v`` that an index divides (``v // c``, ``v % c``; ``c`` free of index
    variables) as two of its own: ``v := c*q + t`` with ``q`` over ``ceil(V / c)`` and ``t`` over
    ``c``, so ``v // c`` is ``q`` and ``v % c`` is ``t``; the value is guarded by ``c*q + t < V``
    and reads ``v`` clamped. Nearest upsampling ``X[i // K]``, a pad view read at ``P[j // 3]`` and
    a dilation ``select(u % S == 0, dY[u // S], 0)`` (the data gradient of a strided convolution,
    so its own gradient in a double backward) then read affinely."""
    for v, c in _divisions(indices, scope):
        if v not in scope:  # split already, by another divisor: that division stays a masked dim
            continue
        extent = scope[v]
        q, t = Var(emit.fresh(f"{v}_q")), Var(emit.fresh(f"{v}_t"))
        whole = iadd(imul(c, q), t)
        clamped = simplify(Binary("min", whole, isub(extent, _i(1)), dtypes.i64))
        parts = {"floordiv": q, "mod": t}

        def part(n: Expr, parts: dict[str, Var] = parts, v: str = v, c: Expr = c) -> Expr | None:
            if isinstance(n, Binary) and n.op in parts and isinstance(n.a, Var) and n.a.name == v and n.b == c:
                return parts[n.op]
            return None

        def split(x: Expr, part=part, v: str = v, clamped: Expr = clamped) -> Expr:
            return substitute(transform(x, part), {v: clamped})

        indices = tuple(split(i) for i in indices)
        value = fselect(_cmp("lt", whole, extent), split(value), num(0))
        quotients = simplify(Binary("floordiv", iadd(extent, isub(c, _i(1))), c, dtypes.i64))
        names = list(scope)
        at = names.index(v)
        scope = {**{k: scope[k] for k in names[:at]}, q.name: quotients, t.name: c,
                 **{k: scope[k] for k in names[at + 1:]}}
    return indices, value, scope


def _divisions(indices: tuple[Expr, ...], scope: dict[str, Expr]) -> list[tuple[str, Expr]]:
    """``(v, c)`` for each ``v // c`` or ``v % c`` in ``indices``: ``v`` an index variable, ``c`` a
    positive constant or an expression of symbols."""
    found: list[tuple[str, Expr]] = []
    for index in indices:
        for n in walk(index):
            if not (isinstance(n, Binary) and n.op in ("floordiv", "mod") and isinstance(n.a, Var)
                    and n.a.name in scope and not free_vars(n.b) & set(scope)):
                continue
            if isinstance(n.b, Const) and n.b.value <= 0:
                continue
            if all(v != n.a.name for v, _ in found):
                found.append((n.a.name, n.b))
    return found


def _zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


def _one(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 1


def _solve(forms: list[Linear | None], scope: dict[str, Expr]) -> tuple[list[_Solve], list[int]]:
    """Solve single-variable dims first, then one (output-most) variable per window dim; the dims
    left over (no variable, all solved already, not affine, or solvable only in terms of another
    window dim's solution, which could close a cycle: ``X[i + j, 2*i + j]``) are guards, their
    remaining variables summed."""
    solves: list[_Solve] = []
    solved: set[str] = set()
    windows: set[str] = set()
    guards: list[int] = []
    order = list(scope)
    for d, form in enumerate(forms):
        names = [] if form is None else [k for k in form if k is not None]
        if len(names) == 1 and names[0] not in solved:
            solves.append(_Solve(names[0], d, form[names[0]], {None: form.get(None, _i(0))}))
            solved.add(names[0])
    for d, form in enumerate(forms):
        if any(s.dim == d for s in solves):
            continue
        names = [] if form is None else [k for k in form if k is not None]
        free = sorted((k for k in names if k not in solved), key=order.index)
        if not free or windows & set(names):
            guards.append(d)
            continue
        var = free[0]
        others = {k: v for k, v in form.items() if k != var}
        others.setdefault(None, _i(0))
        solves.append(_Solve(var, d, form[var], others))
        solved.add(var)
        windows.add(var)
    return solves, guards


def _trivial(s: _Solve, scope: dict[str, Expr], shape: tuple[Expr, ...]) -> bool:
    """``A[.., v, ..]`` with ``v`` over the whole dim: ``v := a`` needs no guard."""
    return (_one(s.coef) and list(s.others) == [None] and _zero(s.others[None])
            and simplify(scope[s.var]) == simplify(shape[s.dim]))


def _windowed(window: list[_Solve], value: Expr, adjoint: Adjoint, summed: list[str]) -> bool:
    """Whether the dilate-and-pad form applies: every solved window index is an axis of ``T``
    reached only through ``dT[axes]``, and its dim's other variables are summed."""
    wanted = tuple(Var(a) for a in adjoint.axes)
    ys = {s.var for s in window}
    for s in window:
        if s.var not in adjoint.axes or any(k is not None and k not in summed for k in s.others):
            return False
        if isinstance(s.coef, Const) and s.coef.value <= 0:
            return False
    for n in walk(value):
        if isinstance(n, Read) and n.tensor == adjoint.name and n.indices != wanted:
            return False
    stripped = transform(value, lambda n: num(1) if isinstance(n, Read) and n.tensor == adjoint.name else None)
    return not (free_vars(stripped) & ys)


def _static_offsets(window: list[_Solve], static: frozenset[str]) -> bool:
    """Whether the window dims' offsets and strides are constants once bound: they become pad widths,
    which may not use a runtime scalar (``X[start + i]``: its gradient is the guarded gather)."""
    return all(free_vars(e) <= static for s in window for e in (s.coef, *s.others.values()))


def _window_form(solves: list[_Solve], trivial: set[str], value: Expr, scope: dict[str, Expr], summed: list[str],
                 shape: tuple[Expr, ...], targets: tuple[Var, ...], adjoint: Adjoint, emit: Emitter) -> Expr:
    window = {s.var: s for s in solves if s.var not in trivial}
    flips: dict[str, str] = {}
    for s in window.values():
        for r, c in s.others.items():
            if r is not None and r not in flips and not (isinstance(c, Const) and c.value < 0):
                flips[r] = emit.fresh(r)
    mapping: dict[str, Expr] = {s.var: targets[s.dim] for s in solves if s.var in trivial}
    mapping.update({r: isub(isub(scope[r], _i(1)), Var(f)) for r, f in flips.items()})
    lo, hi, index = [], [], []
    for j, axis in enumerate(adjoint.axes):
        s = window.get(axis)
        if s is None:
            lo.append(_i(0))
            hi.append(_i(0))
            index.append(mapping.get(axis, Var(axis)))
            continue
        low, top, read = _window_dim(s, flips, scope, shape[s.dim], targets[s.dim])
        lo.append(imax(low, _i(0)))
        hi.append(imax(isub(top, imul(s.coef, isub(adjoint.shape[j], _i(1)))), _i(0)))
        index.append(iadd(read, isub(lo[-1], low)))
    padded = _dilated_padded(adjoint, window, tuple(lo), tuple(hi), emit)
    wanted = tuple(Var(a) for a in adjoint.axes)
    body = transform(value, lambda n: Read(padded, tuple(index), n.dtype)
                     if isinstance(n, Read) and n.tensor == adjoint.name and n.indices == wanted else None)
    body = substitute(body, mapping)
    names = [flips.get(v, v) for v in summed]
    return _sum(body, names, {**scope, **{f: scope[r] for r, f in flips.items()}})


def _window_dim(s: _Solve, flips: dict[str, str], scope: dict[str, Expr], size: Expr, target: Var
                ) -> tuple[Expr, Expr, Expr]:
    """(L, the largest ``coef * y`` read, the read index before the pad's shift) of a window dim: with
    the flipped window index ``r'``, ``coef * y == target + c*r' - L`` (``- c*r`` for one kept as it is)."""
    low = s.others[None]
    top = isub(iadd(size, _i(-1)), s.others[None])
    read: Expr = target
    for r, c in s.others.items():
        if r is None:
            continue
        span = imul(c, isub(scope[r], _i(1)))
        if r in flips:
            low = iadd(low, span)
            read = iadd(read, imul(c, Var(flips[r])))
        else:
            top = isub(top, span)
            read = isub(read, imul(c, Var(r)))
    return low, top, read


def _dilated_padded(adjoint: Adjoint, window: dict[str, _Solve], lo: tuple[Expr, ...], hi: tuple[Expr, ...],
                    emit: Emitter) -> str:
    """``dT`` with ``coef - 1`` zeros between neighbours along each window axis, padded; built once."""
    strides = tuple(window[a].coef if a in window else _i(1) for a in adjoint.axes)
    key = (adjoint.name, strides, lo, hi)
    if key in emit.memo:
        return emit.memo[key]
    source = adjoint.name
    if not all(_one(c) for c in strides):
        source = emit.fresh(f"{adjoint.name}d")
        axes = tuple(IterVar(Var(emit.fresh("u")), _dilated(n, c)) for c, n in zip(strides, adjoint.shape))
        conds = [_cmp("eq", Binary("mod", ax.var, c, dtypes.i64), _i(0)) for ax, c in zip(axes, strides)
                 if not _one(c)]
        cond = conds[0]
        for other in conds[1:]:
            cond = Binary("and", cond, other, dtypes.boolean)
        index = tuple(ax.var if _one(c) else Binary("floordiv", ax.var, c, dtypes.i64)
                      for ax, c in zip(axes, strides))
        body = fselect(cond, Read(adjoint.name, index, adjoint.dtype), num(0))
        emit.add_temp(source, adjoint.dtype, tuple(ax.extent for ax in axes), axes, body)
    name = source
    if not all(_zero(x) for x in lo + hi):
        name = emit.fresh(f"{adjoint.name}p")
        emit.add_pad(name, source, lo, hi)
    emit.memo[key] = name
    return name


def _dilated(size: Expr, stride: Expr) -> Expr:
    """``size`` elements with ``stride - 1`` zeros between neighbours (none when ``size`` is 0)."""
    if _one(stride):
        return size
    return imax(iadd(imul(stride, isub(size, _i(1))), _i(1)), _i(0))


def _guarded_form(indices: tuple[Expr, ...], forms: list[Linear | None], solves: list[_Solve], trivial: set[str],
                  value: Expr, scope: dict[str, Expr], summed: list[str], targets: tuple[Var, ...],
                  static: frozenset[str]) -> Expr:
    """Solve, guard the sum with the solution's conditions and clamp the solved indices in range.
    A dim left unsolved is a guard ``index == target``, its variables summed: for an index that is
    not affine (``X[min(max(i, 0), 2)]``, ``X[i * i % N]``) a masked sum over every value of them."""
    exact: dict[str, Expr] = {}
    conds: list[Expr] = []
    for s in solves:
        rest = s.others[None]
        for k, c in s.others.items():
            if k is not None:
                rest = iadd(rest, imul(c, Var(k)))
        numer, coef = isub(targets[s.dim], rest), s.coef
        if isinstance(coef, Const) and coef.value < 0:  # a reversed read: divide by a positive number
            numer, coef = isub(rest, targets[s.dim]), _i(-coef.value)
        exact[s.var] = numer if _one(coef) else Binary("floordiv", numer, coef, dtypes.i64)
        if s.var in trivial:
            continue
        if not _one(coef):
            conds.append(_cmp("eq", Binary("mod", numer, coef, dtypes.i64), _i(0)))
        conds.append(_cmp("ge", exact[s.var], _i(0)))
        conds.append(_cmp("lt", exact[s.var], scope[s.var]))
    for _ in solves:  # a solution may name an index solved after it
        exact = {v: substitute(e, exact) for v, e in exact.items()}
    clamped = {v: e if v in trivial or _shifted(e, static) else clamp(e, scope[v]) for v, e in exact.items()}
    conds = [substitute(c, exact) for c in conds]
    for d, form in enumerate(forms):
        if any(s.dim == d for s in solves):
            continue
        if form is None:  # evaluated where every read it makes is in bounds
            conds.append(_cmp("eq", substitute(indices[d], clamped), targets[d]))
            continue
        total = form.get(None, _i(0))
        for k, c in form.items():
            if k is not None:
                total = iadd(total, imul(c, exact.get(k, Var(k))))
        conds.append(_cmp("eq", total, targets[d]))
    body = substitute(value, clamped)
    conds = [c for c in conds if not (isinstance(c, Const) and c.value)]
    if conds:
        cond = conds[0]
        for other in conds[1:]:
            cond = Binary("and", cond, other, dtypes.boolean)
        body = fselect(cond, body, num(0))
    return _sum(body, summed, scope)


def _shifted(e: Expr, static: frozenset[str]) -> bool:
    """Whether ``e`` is ``v``, ``v + c``, ``v - c`` or ``c - v`` (``c`` constant once ``static`` names are
    bound): the bounds proof narrows ``v`` under the guard ``0 <= e < n`` itself, so ``e`` needs no
    clamp (and the selects inside the value, such as a recurrence's ``select(t < 2, .., H[t - 2])``,
    are proved through it, where a clamp would hide ``v``)."""
    if isinstance(e, Var):
        return e.name not in static
    if not (isinstance(e, Binary) and e.op in ("add", "sub")):
        return False
    var, other = (e.a, e.b) if isinstance(e.a, Var) and e.a.name not in static else (e.b, e.a)
    return isinstance(var, Var) and var.name not in static and free_vars(other) <= static \
        and not any(isinstance(n, Read) for n in walk(other))


def _sum(body: Expr, names: list[str], scope: dict[str, Expr]) -> Expr:
    if not names:
        return body
    axes = tuple(IterVar(Var(n), scope[n]) for n in names)
    return Reduce("sum", axes, body, body.dtype, body.dtype)
