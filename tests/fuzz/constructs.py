"""The fuzzer's indexing by data, scatters, scans, recurrences, random numbers and dtype parameters.

Each function takes the op builder (``fuzz.generate._OpBuilder``) or a statement's context
(``fuzz.generate._Context``) and writes one construct. What the checker must know to call the op
(the range each index input's values are drawn from, the input poisoned with one value out of
range, ``deterministic=True``, the dtype each type parameter is bound to) is written in a comment
on the op's header line, ``# fuzz: T=f16 I3=[0,7) o4=[0,2) poison=I3 deterministic``, so that a
program (a shrunk one, one pasted into a regression test) says how it is called.

Answers stay independent of rounding as elsewhere in the generator: index values are exact
integers; a scatter's float sum and a linear recurrence (coefficients at most 1/2 in magnitude,
so rounding errors shrink along it) stay bounded; ``rand`` is bit-identical on every target, so
it may feed comparisons, while ``randn`` (a few ulps apart) may not.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fuzz.generate import Dim, Tensor, Value, _Context, _OpBuilder

INDEX_DTYPES = ("i64", "i64", "i32", "i8")


@dataclass
class Annotations:
    """What the header comment of one op says (see the module docstring)."""

    types: dict[str, str] = field(default_factory=dict)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    poison: str | None = None
    deterministic: bool = False

    def text(self) -> str:
        parts = [f"{k}={v}" for k, v in self.types.items()]
        parts += [f"{k}=[{lo},{hi})" for k, (lo, hi) in self.ranges.items()]
        parts += [f"poison={self.poison}"] if self.poison else []
        parts += ["deterministic"] if self.deterministic else []
        return f"  # fuzz: {' '.join(parts)}" if parts else ""


def annotations(source: str, op_name: str) -> Annotations:
    """The annotations of op ``op_name`` in ``source`` (empty where its header has none)."""
    m = re.search(rf"^op {op_name}\b.*# fuzz:(.*)$", source, re.M)
    if m is None:
        return Annotations()
    words = m.group(1).split()
    ann = Annotations(deterministic="deterministic" in words)
    for w in words:
        if r := re.fullmatch(r"(\w+)=\[(-?\d+),(-?\d+)\)", w):
            ann.ranges[r.group(1)] = (int(r.group(2)), int(r.group(3)))
        elif w.startswith("poison="):
            ann.poison = w.removeprefix("poison=")
        elif t := re.fullmatch(r"([A-Z]\w*)=(\w+)", w):
            ann.types[t.group(1)] = t.group(2)
    return ann


def dim_size(b: _OpBuilder, d: Dim) -> int | None:
    """The concrete size of ``d`` in the call the op is generated for (None: not known)."""
    base = int(d.base) if d.base.isdigit() else b.sizes.get(d.base)
    return None if base is None else base * d.scale + d.extra  # (extra: pads and P's value)


# ---------------------------------------------------------------------------- inputs
def add_index_inputs(b: _OpBuilder) -> None:
    """One or two integer inputs read as indices into dims of a symbol (or literal) base: their
    values are drawn in [0, size), one of them sometimes poisoned with a value out of range."""
    from fuzz.generate import Dim, Tensor

    bases = [s for s in b.syms if b.sizes[s] >= 1] + ["3", "4"]
    for _ in range(b.rnd.randint(1, 2)):
        target = b.rnd.choice(bases)
        size = int(target) if target.isdigit() else b.sizes[target]
        dims = [Dim(b.rnd.choice(("N", "M", "K") + tuple(b.syms))) for _ in range(b.rnd.choice([1, 1, 2]))]
        name = b.fresh("I")
        b.tensors.append(Tensor(name, b.rnd.choice(INDEX_DTYPES), dims, exact=True, mag=float(size)))
        b.inputs.append(name)
        b.index_targets[name] = target
        b.ann.ranges[name] = (0, size)


def maybe_poison(b: _OpBuilder) -> None:
    """Now and then one index input gets a value out of range: the call must then raise
    ``TccIndexError`` and write nothing, exactly where the reference raises it."""
    if b.ann.ranges and b.rnd.random() < 0.25:
        b.ann.poison = b.rnd.choice(sorted(b.ann.ranges))


def make_generic(b: _OpBuilder) -> None:
    """Make the op generic over ``T``: every float input (else every integer one) is declared
    ``T``, bound at the call to a dtype of the kind (written in the annotations)."""
    floats = [t for t in b.tensors if t.name in b.inputs and t.dtype in ("f16", "f32", "f64", "bf16")]
    ints = [t for t in b.tensors if t.name in b.inputs and t.dtype in ("i8", "i32", "i64")
            and t.name not in b.index_targets]
    if floats:
        kind, chosen = "float", b.rnd.choice(["f16", "f32", "f64"] + (["bf16"] if b.bf16 else []))
    elif ints:
        kind, chosen = "int", b.rnd.choice(["i8", "i32", "i64"])
    else:
        return
    for t in floats or ints:
        t.dtype, t.spelled = chosen, "T"
    b.generic = (kind, chosen)
    b.ann.types["T"] = chosen


# ---------------------------------------------------------------------------- indices
def data_index(ctx: _Context, d: Dim) -> str | None:
    """An index into ``d`` that reads data: an index input whose values fit ``d`` (clamped now
    and then, which needs no check), or a runtime offset plus a variable (``o4 + i``)."""
    b = ctx.op
    inputs = [n for n, base in b.index_targets.items() if base == d.base and n != ctx.excluded]
    if inputs:
        idx = plain_read(ctx, _tensor(b, ctx.rnd.choice(inputs)))
        if idx is None:
            return None
        if ctx.rnd.random() < 0.15:
            return f"min(max({idx}, 0), {d.text()} - 1)"
        return idx
    return offset_index(ctx, d) if ctx.rnd.random() < 0.25 else None


def offset_index(ctx: _Context, d: Dim) -> str | None:
    """``o + v`` for a fresh ``i64`` scalar ``o``, drawn so that ``v``'s whole range fits ``d``."""
    b = ctx.op
    size = dim_size(b, d)
    fits = [v for v, ext in ctx.vars.items() if size is not None and 1 <= _extent_size(b, ext) <= size]
    if not fits:
        return None
    v = min(fits, key=lambda v: (_extent_size(b, ctx.vars[v]), ctx.rnd.random()))  # the most room
    name = b.fresh("o")
    b.scalars.append((name, "i64"))
    b.ann.ranges[name] = (0, size - _extent_size(b, ctx.vars[v]) + 1)
    return f"{name} + {v}"


def plain_read(ctx: _Context, t: Tensor) -> str | None:
    """A read of ``t`` whose own indices read no data."""
    saved, ctx.no_data = ctx.no_data, True
    idx = [ctx.index(dd) for dd in t.dims]
    ctx.no_data = saved
    return None if None in idx else f"{t.name}[{', '.join(idx)}]"


def _tensor(b: _OpBuilder, name: str) -> Tensor:
    return next(t for t in b.tensors if t.name == name)


def _extent_size(b: _OpBuilder, ext: str) -> int:
    return int(ext) if ext.isdigit() else b.sizes.get(ext, 0)


# ---------------------------------------------------------------------------- scans
def moving_extent(ctx: _Context, k: str) -> str | None:
    """A reduction extent of one of the statement's own variables (``k: i + 1``, a prefix: a
    scan), with ``k`` walking that variable's dims; None where there is none to use."""
    outer = [v for v in ctx.outer if v in ctx.vars]
    if not outer:
        return None
    v = ctx.rnd.choice(outer)
    ctx.vars[k] = ctx.vars[v]
    return f"{k}: {v} + 1" if ctx.rnd.random() < 0.7 else f"{k}: {v}"


# ---------------------------------------------------------------------------- random numbers
def random_leaf(ctx: _Context) -> Value:
    """``rand`` (exact: bit-identical everywhere), ``randn`` (not exact) or ``philox`` (an exact
    integer, taken modulo 100 to stay small) of a seed and one to three index expressions."""
    from fuzz.generate import Value

    b = ctx.op
    if ctx.rnd.random() < 0.7:
        if b.seed is None:
            b.seed = b.fresh("sd")
            b.scalars.append((b.seed, ctx.rnd.choice(["i64", "i32"])))
        seed = b.seed
    else:
        seed = str(ctx.rnd.choice([0, 1, 42]))
    names = list(ctx.vars)
    idx = [ctx.rnd.choice(names) + ctx.rnd.choice(["", "", " + 1", " * 3"]) for _ in range(ctx.rnd.randint(1, 3))]
    fn = ctx.rnd.choice(["rand", "rand", "randn", "philox"])
    if fn == "philox":
        return Value(f"(philox({ctx.rnd.randint(0, 3)}, {seed}, {', '.join(idx)}) % 100)", "int", True, 100.0)
    return Value(f"{fn}({seed}, {', '.join(idx)})", "float", fn == "rand", 1.0 if fn == "rand" else 6.0)


# ---------------------------------------------------------------------------- statements
def add_scatter(b: _OpBuilder, t: Tensor) -> None:
    """``T[I3[v1], v2] += value`` after ``t``'s defining statement: each position an index input,
    a variable alone or a constant (duplicates sum); every variable must appear alone somewhere,
    as the language needs (else nothing is added)."""
    from fuzz.generate import Value, _Context

    if t.dtype == "bool":
        return
    ctx = _Context(b, {})
    ctx.excluded = t.name
    lhs = [_scatter_position(ctx, d) for d in t.dims]
    if None in lhs or not ctx.vars:
        return
    ctx.outer = set(ctx.vars)
    if t.dtype[0] in "fb" or ctx.rnd.random() < 0.5:
        value = ctx.expr(depth=ctx.rnd.randint(1, 3))
    else:
        value = Value("1", "int", True, 1.0)  # a histogram
    if value.kind == "bool":
        value = Value(f"i32({value.text})", "int", True, 1.0)
    if value.kind == "float" and t.dtype[0] not in "fb":
        return  # a float into an integer tensor needs a cast, which would round
    target = f"{t.name}[{', '.join(lhs)}]"
    if not all(alone(v, f"{target} {value.text}") for v in ctx.vars):
        return
    hits = math.prod(_extent_size(b, ext) for v, ext in ctx.vars.items() if v not in lhs) or 1
    if value.kind == "float" and value.mag * hits > 100:
        value = Value(f"tanh({value.text}) * {1.0 / hits:.3g}" if hits > 100 else f"tanh({value.text})",
                      "float", False, min(1.0, 100.0 / hits))
    b.lines.append(f"{target} += {value.text}")
    t.exact = t.exact and value.exact and t.dtype[0] not in "fb"
    t.mag = t.mag + value.mag * hits
    if ctx.rnd.random() < 0.3:
        b.ann.deterministic = True


def _scatter_position(ctx: _Context, d: Dim) -> str | None:
    b = ctx.op
    r = ctx.rnd.random()
    inputs = [n for n, base in b.index_targets.items() if base == d.base]
    if inputs and r < 0.6:
        t = _tensor(b, ctx.rnd.choice(inputs))
        idx = []
        for dd in t.dims:
            v = f"v{len(ctx.vars) + 1}"
            ctx.vars[v] = dd.base
            idx.append(v)
        return f"{t.name}[{', '.join(idx)}]"
    if r < 0.9 or _extent_size(b, d.base) < 1:
        v = f"v{len(ctx.vars) + 1}"
        ctx.vars[v] = d.base
        return v
    return "0"


def recurrence(ctx: _Context, name: str, axes: list[tuple[str, str]]) -> Value:
    """The right-hand side of ``H[..., t, ...] = select(t < c, start, step)``: ``step`` reads
    ``H`` at ``t - 1`` (and ``t - 2``): a linear recurrence with coefficients of magnitude at most
    1/2, a running maximum, or integers modulo 7."""
    from fuzz.generate import Value

    t = ctx.rnd.choice([v for v, _ in axes])
    c = ctx.rnd.choice([1, 1, 2])
    prev = lambda k: f"{name}[{', '.join(f'{v} - {k}' if v == t else v for v, _ in axes)}]"  # noqa: E731
    start, x = ctx.expr(ctx.rnd.randint(0, 2)), ctx.expr(ctx.rnd.randint(0, 2))
    kind = ctx.rnd.choice(["linear", "linear", "max", "mod"])
    if kind == "mod" and start.kind == "int" and x.kind == "int" and start.exact and x.exact:
        step = f"({prev(c)} + {x.text}) % 7"
        value = Value("", "int", True, max(start.mag, 7.0))
    elif kind == "max" and start.kind == x.kind and start.kind != "bool":
        step = f"max({prev(c)}, {x.text})"
        value = Value("", start.kind, start.exact and x.exact, max(start.mag, x.mag))
    else:
        start, x = _float(ctx, start), _float(ctx, x)
        coef = ctx.rnd.choice(["0.5", "-0.25", f"0.5 * tanh({_float(ctx, ctx.expr(1)).text})"])
        step = f"{coef} * {prev(c)} + {x.text}" + (f" - 0.25 * {prev(1)}" if c == 2 else "")
        value = Value("", "float", False, start.mag + 4 * x.mag)
    guard = ctx.rnd.choice([(f"{t} < {c}", False), (f"{t} >= {c}", True)] + [(f"{t} == 0", False)] * (c == 1))
    cond, swapped = guard
    value.text = f"select({cond}, {step}, {start.text})" if swapped else f"select({cond}, {start.text}, {step})"
    return value


def _float(ctx: _Context, v: Value) -> Value:
    """``v`` as a bounded float (a recurrence's terms)."""
    from fuzz.generate import Value

    if v.kind != "float":
        v = Value(f"f32({v.text})", "float", v.exact, v.mag)
    return v if v.mag <= 50 else Value(f"tanh({v.text} * 0.02)", "float", False, 1.0)


def alone(var: str, text: str) -> bool:
    """Whether ``var`` is a whole index of some access in ``text`` (what range inference uses):
    brackets are matched, so ``X1[I3[i], j]`` has both ``i`` (in ``I3``) and ``j`` alone."""
    for m in re.finditer(r"\b[A-Z]\w*\[", text):
        depth, start, parts = 1, m.end(), []
        for k in range(m.end(), len(text)):
            ch = text[k]
            if ch in "[(":
                depth += 1
            elif ch in ")]":
                depth -= 1
            if (ch == "," and depth == 1) or depth == 0:
                parts.append(text[start:k].strip())
                start = k + 1
            if depth == 0:
                break
        if var in parts:
            return True
    return False
