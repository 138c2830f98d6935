"""The loop IR: explicit loop nests over buffers, the input of every code generator.

Loops carry a *kind* that passes set and code generators obey (serial, parallel, vector,
unroll, block/thread binding for CUDA); buffers carry a *scope* (global, shared, local).
Loads and stores index buffers by multi-dimensional, row-major indices; codegen flattens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tcc.dtypes import DType
from tcc.errors import Span, TccError
from tcc.ir.expr import Expr, Load, Read, Reduce, Var, format_expr, walk

LOOP_KINDS = ("serial", "parallel", "vector", "unroll", "block.x", "block.y", "block.z",
              "thread.x", "thread.y", "thread.z")
SCOPES = ("global", "shared", "local")


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    scope: str = "global"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Stmt:
    def children(self) -> tuple[Stmt, ...]:
        return ()


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    extent: Expr
    body: Stmt
    kind: str = "serial"
    annotations: tuple[tuple[str, object], ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]

    def children(self) -> tuple[Stmt, ...]:
        return self.stmts


@dataclass(frozen=True)
class Store(Stmt):
    buffer: str
    indices: tuple[Expr, ...]
    value: Expr
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    otherwise: Stmt | None = None

    def children(self) -> tuple[Stmt, ...]:
        return (self.then,) if self.otherwise is None else (self.then, self.otherwise)


@dataclass(frozen=True)
class Let(Stmt):
    var: Var
    value: Expr
    body: Stmt

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Barrier(Stmt):
    """Block-wide barrier (``__syncthreads()`` on CUDA)."""


@dataclass
class LoopFunc:
    """A kernel: parameters (buffers for tensors, vars for scalars) and a body."""

    name: str
    params: list[Buffer | Var]
    body: Stmt
    attrs: dict[str, object] = field(default_factory=dict)

    def buffers(self) -> dict[str, Buffer]:
        out = {p.name: p for p in self.params if isinstance(p, Buffer)}
        for s in walk_stmts(self.body):
            if isinstance(s, Allocate):
                out[s.buffer.name] = s.buffer
        return out


def seq(*stmts: Stmt) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    yield s
    for c in s.children():
        yield from walk_stmts(c)


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions a statement holds directly (not those of nested statements)."""
    if isinstance(s, For):
        return (s.extent,)
    if isinstance(s, Store):
        return (*s.indices, s.value)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Let):
        return (s.value,)
    return ()


def map_stmt(s: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Rebuild ``s`` bottom-up; ``fn`` returns a replacement or None to keep a node."""
    from dataclasses import replace

    if isinstance(s, For):
        node: Stmt = replace(s, body=map_stmt(s.body, fn))
    elif isinstance(s, Seq):
        node = seq(*(map_stmt(c, fn) for c in s.stmts))
    elif isinstance(s, Allocate):
        node = replace(s, body=map_stmt(s.body, fn))
    elif isinstance(s, If):
        node = replace(s, then=map_stmt(s.then, fn),
                       otherwise=None if s.otherwise is None else map_stmt(s.otherwise, fn))
    elif isinstance(s, Let):
        node = replace(s, body=map_stmt(s.body, fn))
    else:
        node = s
    out = fn(node)
    return node if out is None else out


# ---------------------------------------------------------------- printing

def format_func(f: LoopFunc) -> str:
    params = []
    for p in f.params:
        if isinstance(p, Buffer):
            params.append(f"{p.name}: {p.dtype}[{', '.join(map(str, p.shape))}]")
        else:
            params.append(f"{p.name}: {p.dtype}")
    lines = [f"func {f.name}({', '.join(params)}) {{"]
    if f.attrs.get("streamed"):  # results stored around the cache (non-temporal), the schedule's choice
        lines.append(f"    # streamed: {', '.join(f.attrs['streamed'])}")  # type: ignore[arg-type]
    _format_stmt(f.body, 1, lines)
    lines.append("}")
    return "\n".join(lines)


def _format_stmt(s: Stmt, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    if isinstance(s, For):
        kind = "" if s.kind == "serial" else f"  # {s.kind}"
        notes = "".join(f" {k}={v}" for k, v in s.annotations)
        out.append(f"{pad}for {s.var.name} in 0..{format_expr(s.extent)}:{kind}{notes}")
        _format_stmt(s.body, depth + 1, out)
    elif isinstance(s, Seq):
        for c in s.stmts:
            _format_stmt(c, depth, out)
    elif isinstance(s, Store):
        idx = ", ".join(format_expr(i) for i in s.indices)
        out.append(f"{pad}{s.buffer}[{idx}] = {format_expr(s.value)}")
    elif isinstance(s, Allocate):
        b = s.buffer
        out.append(f"{pad}allocate {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}] in {b.scope}")
        _format_stmt(s.body, depth, out)
    elif isinstance(s, If):
        out.append(f"{pad}if {format_expr(s.cond)}:")
        _format_stmt(s.then, depth + 1, out)
        if s.otherwise is not None:
            out.append(f"{pad}else:")
            _format_stmt(s.otherwise, depth + 1, out)
    elif isinstance(s, Let):
        out.append(f"{pad}let {s.var.name}: {s.var.dtype} = {format_expr(s.value)}")
        _format_stmt(s.body, depth, out)
    elif isinstance(s, Barrier):
        out.append(f"{pad}barrier")
    else:
        raise TypeError(f"cannot print {type(s).__name__}")


# ---------------------------------------------------------------- verification

def verify_func(f: LoopFunc) -> None:
    """Check scoping and shapes; a failure is a compiler bug, reported as such."""
    buffers = {p.name: p for p in f.params if isinstance(p, Buffer)}
    scope = {p.name for p in f.params if isinstance(p, Var)}
    _verify(f.body, buffers, scope, set())


def _verify(s: Stmt, buffers: dict[str, Buffer], scope: set[str], loops: set[str]) -> None:
    for e in stmt_exprs(s):
        for n in walk(e):
            if isinstance(n, (Read, Reduce)):  # formatted only on failure: printing is O(size)
                _check(False, f"TE node left in loop IR: {n}")
            if isinstance(n, Var):
                _check(n.name in scope, f"unbound variable {n.name}")
            if isinstance(n, Load):
                _check(n.buffer in buffers, f"load from unknown buffer {n.buffer}")
                _check(len(n.indices) == len(buffers[n.buffer].shape), f"rank mismatch loading {n.buffer}")
    if isinstance(s, Store):
        _check(s.buffer in buffers, f"store to unknown buffer {s.buffer}")
        _check(len(s.indices) == len(buffers[s.buffer].shape), f"rank mismatch storing {s.buffer}")
        _check(s.value.dtype == buffers[s.buffer].dtype, f"store of {s.value.dtype} into {s.buffer}")
    if isinstance(s, For):
        _check(s.kind in LOOP_KINDS, f"unknown loop kind {s.kind}")
        _check(s.var.name not in scope, f"loop variable {s.var.name} shadows another")
        _verify(s.body, buffers, scope | {s.var.name}, loops | {s.var.name})
    elif isinstance(s, Allocate):
        _check(s.buffer.scope in SCOPES, f"unknown scope {s.buffer.scope}")
        _verify(s.body, {**buffers, s.buffer.name: s.buffer}, scope, loops)
    elif isinstance(s, Let):
        _verify(s.body, buffers, scope | {s.var.name}, loops)
    else:
        for c in s.children():
            _verify(c, buffers, scope, loops)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise TccError(f"internal error: loop IR verifier: {message}")
