"""What ``help(lib.NAME)``, ``lib.NAME.__doc__`` and ``inspect.signature(lib.NAME)`` show: the
op's header as written in its source, the comment lines directly above it, and how to call it.

Every op of a library is an instance of one class, ``Op``; without these, a user asking Python
about ``lib.softmax`` would read the generic class's docstring instead of the op's signature.
"""

from __future__ import annotations

import inspect
import re

from tcc.frontend.ast import OpDef
from tcc.ir.te import OpTE


def header(ast: OpDef) -> str:
    """The op's header as written (``op NAME[...](...) -> ...``) on one line, comments dropped;
    ``op NAME(...)`` from the parameter names where the op has no source text."""
    span = ast.span
    if span is None:
        return f"op {ast.name}({', '.join(p.name for p in ast.params)})"
    lines = span.source.text.splitlines()[span.line - 1:]
    if lines:
        lines[0] = lines[0][span.col - 1:]
    words = []
    for line in lines:
        code, brace, _ = line.split("#", 1)[0].partition("{")
        words.append(code.strip())
        if brace:
            break
    return re.sub(r"\s+", " ", " ".join(w for w in words if w)).strip()


def comment(ast: OpDef) -> str:
    """The ``#`` lines directly above the op (no blank line between), without their ``#``."""
    span = ast.span
    if span is None:
        return ""
    lines = span.source.text.splitlines()[:span.line - 1]
    found: list[str] = []
    for line in reversed(lines):
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        found.append(stripped[1:].removeprefix(" ").rstrip())
    return "\n".join(reversed(found)).strip()


def docstring(te: OpTE, ast: OpDef, target: str) -> str:
    """The op's own docstring: its header, its comment, and the call's form."""
    lines = [header(ast), ""]
    if comment(ast):
        lines += [comment(ast), ""]
    lines += [f"{te.name}{signature(te)} -> {', '.join(te.results)}: compiled for target {target!r} on the first "
              "call per shape.",
              "Tensors and scalars go positionally, compile-time parameters as keywords; out= writes into",
              "existing arrays. .lower(*args, stage='loops') prints a stage of the compilation."]
    return "\n".join(lines)


def signature(te: OpTE) -> inspect.Signature:
    """The call's Python signature: positional tensors and scalars, keyword-only compile-time
    parameters with their defaults, and ``out=``."""
    positional = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in te.params]
    keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value)
                for name, value in te.cparams.items()]
    out = inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None)
    return inspect.Signature([*positional, *keywords, out])
