"""The abstract syntax tree: what the user wrote, with a source span on every node."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

from tcc.errors import Span


@dataclass
class Node:
    span: Span | None = field(default=None, kw_only=True, repr=False, compare=False)


# ---------------------------------------------------------------- expressions

@dataclass
class Num(Node):
    value: int | float
    is_float: bool


@dataclass
class Name(Node):
    id: str


@dataclass
class Access(Node):
    tensor: str
    indices: list[Node]


@dataclass
class CallExpr(Node):
    fn: str
    args: list[Node]


@dataclass
class Axis(Node):
    name: str
    extent: Node | None


@dataclass
class ReduceExpr(Node):
    op: str
    axes: list[Axis]
    body: Node


@dataclass
class BinOp(Node):
    op: str  # add sub mul div floordiv mod pow lt le gt ge eq ne and or
    a: Node
    b: Node


@dataclass
class UnaryOp(Node):
    op: str  # neg not
    a: Node


# ---------------------------------------------------------------- statements and ops

@dataclass
class Assign(Node):
    target: str
    indices: list[Node]
    value: Node


@dataclass
class Accumulate(Node):
    """``target[indices] += value``: adds into a tensor an earlier statement defined (a scatter)."""

    target: str
    indices: list[Node]
    value: Node


@dataclass
class Decl(Node):
    name: str
    dtype: str
    shape: list[Node]


@dataclass
class PadStmt(Node):
    name: str
    source: str
    lo: list[Node]
    hi: list[Node] | None
    value: Node | None


@dataclass
class Param(Node):
    name: str
    dtype: str
    shape: list[Node] | None  # None: a runtime scalar


@dataclass
class CParam(Node):
    name: str
    default: int | float


@dataclass
class TypeParam(Node):
    """``T: float`` in an op's brackets: a dtype the op is generic over (``float``, ``int``, ``any``)."""

    name: str
    kind: str


@dataclass
class OpDef(Node):
    name: str
    cparams: list[CParam | TypeParam]
    params: list[Param]
    results: list[Param]
    body: list[Node]


# ---------------------------------------------------------------- schedules

@dataclass
class Word(Node):
    """One argument of a schedule step (a loop, tensor or keyword name, or a number)."""

    value: str | int | float


@dataclass
class SchedStep(Node):
    prim: str
    args: list[Word]


@dataclass
class ScheduleDef(Node):
    """``schedule OP TARGET { steps }``; checked against the op in tcc.frontend.schedules."""

    op: Word
    target: Word
    steps: list[SchedStep]


@dataclass
class Module(Node):
    ops: list[OpDef]
    schedules: list[ScheduleDef] = field(default_factory=list)


def format_ast(node: object, depth: int = 0) -> str:
    """An indented dump of the tree, one node a line, spans as line:col."""
    pad = "  " * depth
    if isinstance(node, list):
        return "\n".join(format_ast(n, depth) for n in node) if node else f"{pad}[]"
    if not is_dataclass(node):
        return f"{pad}{node!r}"
    simple, nested = [], []
    for f in fields(node):
        if f.name == "span":
            continue
        value = getattr(node, f.name)
        if isinstance(value, Node) or (isinstance(value, list) and value and isinstance(value[0], Node)):
            nested.append((f.name, value))
        elif isinstance(value, list) and not value:
            continue
        else:
            simple.append(f"{f.name}={value!r}")
    where = f"  @{node.span.line}:{node.span.col}" if getattr(node, "span", None) else ""
    lines = [f"{pad}{type(node).__name__}({', '.join(simple)}){where}"]
    for name, value in nested:
        lines.append(f"{pad}  {name}:")
        lines.append(format_ast(value, depth + 2))
    return "\n".join(lines)
