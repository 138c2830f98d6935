"""Launch sizes known only at the call: a grid or an intermediate's bytes that depend on the
dynamic shape symbols (``tcc.compile(..., dynamic=...)``), kept in the launch plan as JSON.

Codegen writes each such size as a formula: an integer, a symbol's name, or ``[op, a, b]`` of
formulas (``add``, ``sub``, ``mul``, ``floordiv``, ``mod``, ``max``, ``min``; comparisons, ``and`` and ``or``,
1 or 0, for the condition a kernel requires); the runtime evaluates it with each call's symbol
values. A formula is plain data so that a kernel from
the disk cache needs no IR to launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Cast, Const, Expr, Var
from tcc.passes.simplify import evaluate_int, simplify

Formula = int | str | list  # see the module's docstring

_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b if b else 0, "mod": lambda a, b: a % b if b else 0,
        "max": max, "min": min, "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b),
        "lt": lambda a, b: int(a < b), "le": lambda a, b: int(a <= b), "gt": lambda a, b: int(a > b),
        "ge": lambda a, b: int(a >= b), "and": lambda a, b: int(bool(a) and bool(b)),
        "or": lambda a, b: int(bool(a) or bool(b))}


def formula(e: int | Expr) -> Formula:
    """``e`` (an integer, or an expression of the dynamic shape symbols) as a formula."""
    if isinstance(e, int):
        return e
    value = evaluate_int(e)
    if value is not None:
        return value
    return _tree(simplify(e))


def _tree(e: Expr) -> Formula:
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Cast) and e.dtype.is_int:
        return _tree(e.a)
    if isinstance(e, Binary) and e.op in _OPS:
        return [e.op, _tree(e.a), _tree(e.b)]
    raise TccCompileError(f"internal error: a launch size must be integer arithmetic of shape symbols, not {e}")


def evaluate(f: Formula, values: Mapping[str, Any]) -> int:
    """A formula's value for one call's symbol ``values``."""
    if isinstance(f, int):
        return f
    if isinstance(f, str):
        return int(values[f])
    return _OPS[f[0]](evaluate(f[1], values), evaluate(f[2], values))


def symbols(f: Formula) -> set[str]:
    """The symbols a formula reads."""
    if isinstance(f, str):
        return {f}
    if isinstance(f, list):
        return symbols(f[1]) | symbols(f[2])
    return set()
