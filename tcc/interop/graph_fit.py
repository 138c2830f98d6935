"""A graph's program over shape symbols, fitted from programs translated at a few sizes.

The importers translate a graph for concrete shapes: every handler computes with integers (a
Reshape's target, a Slice's clamped ends, a flattened ``batch * seq``). A graph whose inputs have
symbolic dims is translated at a few bindings of its symbols instead, and the programs compared
number by number (:func:`fit`): text that is the same at every binding is kept; each integer that
differs must be ``c * m + d`` for one monomial ``m`` of the symbols (``seq``, ``batch * seq``,
integers ``c`` and ``d``), and becomes that expression. The result is a :class:`Template`: the
program with symbols in its shapes, reads and extents. Nothing here trusts the fit beyond the
bindings it saw: :meth:`Template.matches` checks the program of each new binding, text against
text, before its kernels run (a Slice that clamps at 16 fits ``seq`` at 7 and 11, and fails the
check at 20).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tcc.interop.graph import Program, Statement

Binding = Mapping[str, int]
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?![\w.])")


class NotGeneric(Exception):
    """The programs differ where no expression of the symbols explains them (the message says where)."""


@dataclass(frozen=True)
class Term:
    """``c * prod(symbols) + d``: one integer of the program as a function of the binding."""

    c: int
    symbols: tuple[str, ...]
    d: int

    def value(self, binding: Binding) -> int:
        return self.c * math.prod(binding[s] for s in self.symbols) + self.d

    def text(self) -> str:
        product = " * ".join(self.symbols)
        text = product if self.c == 1 else f"{self.c} * {product}"
        if self.d:
            text += f" {'+' if self.d > 0 else '-'} {abs(self.d)}"
        return text if text.isidentifier() else f"({text})"


@dataclass(frozen=True)
class Pattern:
    """One string of the program: literal pieces between numbers that are literal or :class:`Term`."""

    pieces: tuple[str | Term, ...]

    @property
    def literal(self) -> bool:
        return all(isinstance(p, str) for p in self.pieces)

    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text() for p in self.pieces)

    def at(self, binding: Binding) -> str:
        return "".join(p if isinstance(p, str) else str(p.value(binding)) for p in self.pieces)


def monomials(symbols: Sequence[str]) -> list[tuple[str, ...]]:
    """The candidate ``m`` of a term, simplest first: each symbol, then products of two."""
    return [(s,) for s in symbols] + list(itertools.combinations_with_replacement(symbols, 2))


def fit_number(values: Sequence[str], bindings: Sequence[Binding], symbols: Sequence[str]) -> Term | None:
    """The simplest term through every (binding, value) (None: a float, or no term fits)."""
    if not all(v.isdigit() for v in values):
        return None
    ys = [int(v) for v in values]
    for m in monomials(symbols):
        xs = [math.prod(b[s] for s in m) for b in bindings]
        pair = next(((i, j) for i in range(len(xs)) for j in range(i) if xs[i] != xs[j]), None)
        if pair is None:
            continue
        i, j = pair
        c, rest = divmod(ys[i] - ys[j], xs[i] - xs[j])
        if rest or c == 0:
            continue
        term = Term(c, m, ys[i] - c * xs[i])
        if all(term.value(b) == y for b, y in zip(bindings, ys)):
            return term
    return None


def fit_string(texts: Sequence[str], bindings: Sequence[Binding], symbols: Sequence[str], where: str) -> Pattern:
    """The pattern of one string of the program, from its text at each binding."""
    if len(set(texts)) == 1:
        return Pattern((texts[0],))
    splits = [NUMBER.split(t) for t in texts]
    if len({len(s) for s in splits}) != 1:
        raise NotGeneric(f"{where} changes with the shape symbols beyond its numbers")
    pieces: list[str | Term] = []
    for k, parts in enumerate(zip(*splits)):
        if len(set(parts)) == 1:
            pieces.append(parts[0])
        elif k % 2 == 0:
            raise NotGeneric(f"{where} changes with the shape symbols beyond its numbers")
        elif (term := fit_number(parts, bindings, symbols)) is not None:
            pieces.append(term)
        else:
            raise NotGeneric(f"{where}: the number {' / '.join(parts)} (at {_describe(bindings)}) is no "
                             f"c * m + d of {', '.join(symbols)}")
    return Pattern(tuple(pieces))


def _describe(bindings: Sequence[Binding]) -> str:
    return " / ".join(",".join(f"{k}={v}" for k, v in b.items()) for b in bindings)


def fields(p: Program) -> list[tuple[str, str]]:
    """The program as (where, text) strings in a fixed order: what two bindings' programs must
    share, numbers aside (weights by name here: the engine compares their values)."""
    out = [(f"parameter {name}", f"{name}: {dtype}[{', '.join(map(str, shape))}]") for name, dtype, shape in p.params]
    out += [(f"result {name}", f"{name}: {dtype}[{', '.join(map(str, shape))}]") for name, dtype, shape in p.results]
    for s in p.statements:
        where = f"the statement of {s.name}"
        out += [(where, s.text), (where, s.decl or ""), (where, f"{s.pad_of}|{s.accumulates}")]
    out += [("the inputs", repr(sorted(p.inputs.items()))), ("the weights", repr(sorted(p.weights))),
            ("the options", repr(p.winograd))]
    return out


def skeleton(p: Program) -> int:
    """A hash of the program's :func:`fields` less their numbers: programs with the same skeleton
    may fit one template."""
    return hash(tuple(NUMBER.sub("#", text) for _, text in fields(p)))


@dataclass
class Template:
    """A program over shape symbols (``program``: its shapes and reads name them), with the
    patterns that rebuild the program's text at any binding."""

    program: Program
    patterns: list[Pattern]
    symbols: tuple[str, ...]

    def matches(self, concrete: Program, binding: Binding) -> str | None:
        """None when ``concrete`` is this template at ``binding``, else what differs."""
        texts = fields(concrete)
        if len(texts) != len(self.patterns):
            return "the program has another structure at this size"
        for (where, text), pattern in zip(texts, self.patterns):
            if pattern.at(binding) != text:
                return f"{where} is not the one the kernels were fitted on: {text[:120]!r}"
        return None


def fit(seen: Sequence[tuple[Binding, list[tuple[str, str]]]], symbols: Sequence[str], like: Program) -> Template:
    """The template through the programs ``seen`` (their :func:`fields` at their bindings); ``like``
    is one of them, whose structure the template keeps (NotGeneric when none fits)."""
    bindings = [b for b, _ in seen]
    columns = [c for _, c in seen]
    if len({len(c) for c in columns}) != 1:
        raise NotGeneric("the program has another number of statements at another size")
    patterns = [fit_string([c[k][1] for c in columns], bindings, symbols, columns[0][k][0])
                for k in range(len(columns[0]))]
    return Template(_symbolic(like, iter(patterns)), patterns, tuple(symbols))


def _symbolic(p: Program, patterns) -> Program:
    """``p`` with each field replaced by its pattern's text (the order of :func:`fields`)."""
    def shape(pattern: Pattern) -> tuple[str, ...]:
        dims = pattern.text().split("[", 1)[1].rstrip("]")
        return tuple(dims.split(", ")) if dims else ()

    params = [(name, dtype, shape(next(patterns))) for name, dtype, _ in p.params]
    results = [(name, dtype, shape(next(patterns))) for name, dtype, _ in p.results]
    statements: list[Statement] = []
    for s in p.statements:
        text, decl = next(patterns).text(), next(patterns).text()
        next(patterns)
        statements.append(replace(s, text=text, decl=decl or None))
    return replace(p, params=params, results=results, statements=statements, weights=dict(p.weights),
                   inputs=dict(p.inputs), notes=list(p.notes))
