"""A model's program cut into kernels: each its own small tcc op, with canonical names.

Compiled as one function, a whole network takes minutes: the auto-scheduler and LLVM work on one
huge function, and the eight identical convolutions of a ResNet stage are compiled eight times.
``tcc.passes.partition`` says where fusion joins nothing; each piece becomes an op of its own
whose tensors and loop indices are renamed in order of appearance, so that two layers of the
same shapes and attributes have the same source text, hence the same cache key: each distinct
kernel is compiled once per process and once per machine (the disk cache), and a warm start
loads small objects instead of one large one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tcc.interop.graph import Program, Statement
from tcc.ir.te import OpTE
from tcc.passes.te.partition import partition

KERNEL_OP = "kernel"  # every kernel's op name: part of its source, so of its cache key


@dataclass(frozen=True)
class Kernel:
    """One piece of the program: ``source`` computes ``results`` (program tensor names) from
    ``params`` (program parameters or other kernels' results), passed in this order."""

    source: str
    params: tuple[str, ...]
    results: tuple[str, ...]

    def to_json(self) -> list:
        return [self.source, list(self.params), list(self.results)]

    @staticmethod
    def from_json(value: list) -> Kernel:
        source, params, results = value
        return Kernel(str(source), tuple(map(str, params)), tuple(map(str, results)))


def whole(program: Program) -> Kernel:
    """The program as one kernel (the CUDA target compiles it so)."""
    return Kernel(program.source(), tuple(p[0] for p in program.params), tuple(r[0] for r in program.results))


def split(program: Program, te: OpTE) -> list[Kernel]:
    """The kernels of ``program`` (``te`` its checked TE), in an order that runs them; a kernel
    whose results nothing reads is left out."""
    index: dict[str, list[int]] = {}  # a tensor's statements: its definition (and scatter-adds into it)
    for n, s in enumerate(program.statements):
        index.setdefault(s.name, []).append(n)
    parts = [tuple(dict.fromkeys(part)) for part in partition(te)]  # a tensor added into has several statements
    kept = {name for part in parts for name in part}
    bodies = [_closure(program, index, part, kept) for part in parts]
    needed = {r[0] for r in program.results}
    kernels: list[Kernel] = []
    for part, body in reversed(list(zip(parts, bodies))):
        results = tuple(name for name in part if name in needed)
        if not results:
            continue  # dead: nothing later reads it
        params = _params(program, body, set(part))
        needed |= set(params)
        kernels.append(_kernel(program, body, params, results))
    return kernels[::-1]


def _closure(program: Program, index: dict[str, list[int]], part: tuple[str, ...], kept: set[str]) -> list[Statement]:
    """The statements of a kernel: its kept tensors' and those of every inlined intermediate or
    pad view they read, in program order."""
    taken: set[str] = set()
    todo = list(part)
    while todo:
        name = todo.pop()
        if name in taken:
            continue
        taken.add(name)
        todo += [r for n in index[name] for r in program.statements[n].reads()
                 if r in index and (r not in kept or r in part) and r not in taken]
    return [program.statements[n] for n in sorted(n for name in taken for n in index[name])]


def _params(program: Program, body: list[Statement], own: set[str]) -> tuple[str, ...]:
    """What the kernel reads from outside, in order of first read."""
    defined = {s.name for s in body}
    declared = {p[0] for p in program.params} | {s.name for s in program.statements}
    params: list[str] = []
    for s in body:
        for name in s.reads():
            if name in declared and name not in defined and name not in own and name not in params:
                params.append(name)
    return tuple(params)


def _kernel(program: Program, body: list[Statement], params: tuple[str, ...], results: tuple[str, ...]) -> Kernel:
    types = {name: f"{dtype}[{', '.join(map(str, shape))}]" for name, dtype, shape in program.params}
    types |= {name: f"{dtype}[{', '.join(map(str, shape))}]" for name, dtype, shape in program.results}
    types |= {s.name: s.decl.split(":", 1)[1].strip() for s in program.statements if s.decl}
    lines = [line for s in body for line in (s.lines() if s.name not in results else [s.text])]
    renames = {name: f"x{n}" for n, name in enumerate(params)}
    renames |= {name: f"y{n}" for n, name in enumerate(results)}
    renames |= {s.name: f"t{n}" for n, s in enumerate(b for b in body if b.name not in results)}
    outs = ", ".join(f"{name}: {types[name]}" for name in results)
    header = (f"op {KERNEL_OP}({', '.join(f'{name}: {types[name]}' for name in params)}) -> "
              f"{outs if len(results) == 1 else f'({outs})'} {{")
    text = "\n".join([header, *("    " + line for line in lines), "}", ""])
    return Kernel(_canonical(text, renames), params, results)


def _canonical(text: str, renames: dict[str, str]) -> str:
    """``text`` with tensors renamed and each statement's loop indices (``i{dim}_{statement}``)
    numbered from 1 in order of appearance."""
    statements: dict[str, int] = {}

    def index(m: re.Match) -> str:
        return f"i{m[1]}_{statements.setdefault(m[2], len(statements) + 1)}"

    text = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: renames.get(m[0], m[0]), text)
    return re.sub(r"\bi(\d+)_(\d+)\b", index, text)
