"""Source text from AST expressions, parenthesised by the grammar's precedence.

Programs that tcc writes itself (the ONNX importer's) are built as trees and printed here, never
glued together from strings: ``f"{idx} * 3"`` with ``idx = "i + j"`` reads ``i + j * 3``, and a
composition of views silently changed meaning that way. ``Ex`` wraps a node with Python's
operators so a generator still writes ``i * 3 + j``; only :func:`unparse` turns a tree into text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tcc.frontend import ast

# How tightly each form binds, as grammar.lark nests its rules (higher binds tighter).
_OR, _AND, _NOT, _COMPARE, _ARITH, _TERM, _FACTOR, _POWER, _ATOM = range(1, 10)
_BINARY = {
    "or": ("or", _OR), "and": ("and", _AND),
    "lt": ("<", _COMPARE), "le": ("<=", _COMPARE), "gt": (">", _COMPARE), "ge": (">=", _COMPARE),
    "eq": ("==", _COMPARE), "ne": ("!=", _COMPARE),
    "add": ("+", _ARITH), "sub": ("-", _ARITH),
    "mul": ("*", _TERM), "div": ("/", _TERM), "floordiv": ("//", _TERM), "mod": ("%", _TERM),
    "pow": ("**", _POWER),
}


def unparse(node: ast.Node) -> str:
    """``node`` as source text that parses back to the same tree (up to redundant parentheses)."""
    return _text(node, 0)


def _text(node: ast.Node, context: int) -> str:
    text, binds = _bare(node)
    return f"({text})" if binds < context else text


def _bare(node: ast.Node) -> tuple[str, int]:
    """The text of ``node`` without outer parentheses, and how tightly it binds."""
    if isinstance(node, ast.Num):
        return _number(node)
    if isinstance(node, ast.Name):
        return node.id, _ATOM
    if isinstance(node, ast.Access):
        return f"{node.tensor}[{_list(node.indices)}]", _ATOM
    if isinstance(node, ast.CallExpr):
        return f"{node.fn}({_list(node.args)})", _ATOM
    if isinstance(node, ast.ReduceExpr):
        axes = ", ".join(a.name if a.extent is None else f"{a.name}: {_text(a.extent, 0)}" for a in node.axes)
        return f"{node.op}[{axes}]({_text(node.body, 0)})", _ATOM
    if isinstance(node, ast.UnaryOp):
        if node.op == "neg":
            return f"-{_text(node.a, _FACTOR)}", _FACTOR
        return f"not {_text(node.a, _NOT)}", _NOT
    if isinstance(node, ast.BinOp):
        symbol, binds = _BINARY[node.op]
        if binds == _POWER:  # atom ** factor, right-associative
            left, right = _ATOM, _FACTOR
        elif binds == _COMPARE:  # comparisons do not chain
            left = right = _ARITH
        else:  # left-associative
            left, right = binds, binds + 1
        return f"{_text(node.a, left)} {symbol} {_text(node.b, right)}", binds
    raise TypeError(f"cannot print {type(node).__name__} as an expression")


def _number(node: ast.Num) -> tuple[str, int]:
    value = node.value
    if node.is_float:
        value = float(value)
        if math.isnan(value):
            return "nan", _ATOM
        text = ("1e400" if value > 0 else "-1e400") if math.isinf(value) else repr(value)
    else:
        text = str(int(value))
    return text, _FACTOR if text.startswith("-") else _ATOM


def _list(nodes: Iterable[ast.Node]) -> str:
    return ", ".join(_text(n, 0) for n in nodes)


# ---------------------------------------------------------------- building trees

@dataclass(frozen=True, eq=False)
class Ex:
    """An expression under construction. Arithmetic builds ``BinOp`` nodes (folding integer
    identities such as ``x * 1`` and ``0 + x``, which views produce constantly); comparisons and
    logic are methods, since ``==`` on an expression must stay Python's identity test."""

    node: ast.Node

    def __str__(self) -> str:
        return unparse(self.node)

    def __repr__(self) -> str:
        return f"Ex({self})"

    @property
    def int_value(self) -> int | None:
        """The value when this is an integer literal (``-3`` included)."""
        n = self.node
        if isinstance(n, ast.Num) and not n.is_float:
            return int(n.value)
        return None

    def _binary(self, op: str, other: Operand, swap: bool = False) -> Ex:
        a, b = (lift(other), self) if swap else (self, lift(other))
        return _fold(op, a, b) or Ex(ast.BinOp(op, a.node, b.node))

    def __add__(self, o: Operand) -> Ex:
        return self._binary("add", o)

    def __radd__(self, o: Operand) -> Ex:
        return self._binary("add", o, swap=True)

    def __sub__(self, o: Operand) -> Ex:
        return self._binary("sub", o)

    def __rsub__(self, o: Operand) -> Ex:
        return self._binary("sub", o, swap=True)

    def __mul__(self, o: Operand) -> Ex:
        return self._binary("mul", o)

    def __rmul__(self, o: Operand) -> Ex:
        return self._binary("mul", o, swap=True)

    def __truediv__(self, o: Operand) -> Ex:
        return self._binary("div", o)

    def __rtruediv__(self, o: Operand) -> Ex:
        return self._binary("div", o, swap=True)

    def __floordiv__(self, o: Operand) -> Ex:
        return self._binary("floordiv", o)

    def __mod__(self, o: Operand) -> Ex:
        return self._binary("mod", o)

    def __pow__(self, o: Operand) -> Ex:
        return self._binary("pow", o)

    def __neg__(self) -> Ex:
        value = self.int_value
        return num(-value) if value is not None else Ex(ast.UnaryOp("neg", self.node))

    def lt(self, o: Operand) -> Ex:
        return self._binary("lt", o)

    def le(self, o: Operand) -> Ex:
        return self._binary("le", o)

    def gt(self, o: Operand) -> Ex:
        return self._binary("gt", o)

    def ge(self, o: Operand) -> Ex:
        return self._binary("ge", o)

    def eq(self, o: Operand) -> Ex:
        return self._binary("eq", o)

    def ne(self, o: Operand) -> Ex:
        return self._binary("ne", o)

    def and_(self, o: Ex) -> Ex:
        return self._binary("and", o)

    def or_(self, o: Ex) -> Ex:
        return self._binary("or", o)

    def not_(self) -> Ex:
        return Ex(ast.UnaryOp("not", self.node))


Operand = Ex | int | float


def _fold(op: str, a: Ex, b: Ex) -> Ex | None:
    """Integer identities and integer constants, so generated indices stay short."""
    x, y = a.int_value, b.int_value
    if x is not None and y is not None and op in ("add", "sub", "mul"):
        return num(x + y if op == "add" else x - y if op == "sub" else x * y)
    if op in ("add", "sub") and y == 0 or op == "mul" and y == 1:
        return a
    if op == "add" and x == 0 or op == "mul" and x == 1:
        return b
    return None


def lift(x: Operand) -> Ex:
    """An operand as an expression: Python ints and floats become literals."""
    if isinstance(x, Ex):
        return x
    if isinstance(x, bool):
        raise TypeError("the language has no bool literals: use a comparison")
    if isinstance(x, int):
        return num(x)
    if isinstance(x, float):
        return num(x)
    raise TypeError(f"cannot make an expression of {type(x).__name__}")


def num(value: int | float) -> Ex:
    """A literal: an int, or a float (weak: it takes the other operand's dtype)."""
    return Ex(ast.Num(value, isinstance(value, float)))


def var(name: str) -> Ex:
    return Ex(ast.Name(name))


def access(tensor: str, indices: Sequence[Operand]) -> Ex:
    return Ex(ast.Access(tensor, [lift(i).node for i in indices]))


def call(fn: str, *args: Operand) -> Ex:
    """``fn(args...)``: a function, ``max``/``min`` of two values, or a cast when ``fn`` is a dtype."""
    return Ex(ast.CallExpr(fn, [lift(a).node for a in args]))


def select(cond: Ex, a: Operand, b: Operand) -> Ex:
    return call("select", cond, a, b)


def reduction(kind: str, axes: Sequence[tuple[str, Operand]], body: Operand) -> Ex:
    """``kind[k0: n0, ...](body)``; an extent may be an expression (``sum[j: i + 1]``)."""
    return Ex(ast.ReduceExpr(kind, [ast.Axis(k, lift(n).node) for k, n in axes], lift(body).node))


def add_all(terms: Sequence[Operand]) -> Ex:
    """``t0 + t1 + ...`` (0 for none)."""
    total = lift(terms[0]) if terms else num(0)
    for t in terms[1:]:
        total = total + t
    return total


def all_of(conds: Sequence[Ex]) -> Ex:
    """``c0 and c1 and ...`` (at least one condition)."""
    result = conds[0]
    for c in conds[1:]:
        result = result.and_(c)
    return result
