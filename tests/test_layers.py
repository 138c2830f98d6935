"""The import contract of docs/architecture.md, read from the source with ``ast``: tcc's modules
form no import circle, and each layer imports only from the layers beneath it. Every import
counts, the ones inside functions (lazy loading) and under ``TYPE_CHECKING`` too, so that no
local import can hide a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tcc"

# lowest first; a module may import from its own layer (without a circle) and the ones before it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("tcc.errors", "tcc.dtypes", "tcc.target", "tcc.paths", "tcc.version", "tcc.stack", "tcc.threads")),
    ("ir", ("tcc.ir",)),
    ("frontend", ("tcc.frontend",)),
    ("passes", ("tcc.passes", "tcc.reference", "tcc.testing")),
    ("codegen", ("tcc.codegen_cpu", "tcc.codegen_cuda")),
    ("runtime", ("tcc.runtime", "tcc.cuda")),
    ("compiler", ("tcc.compiler", "tcc.generic_op", "tcc.index_ranges", "tcc.opdoc", "tcc.tune", "tcc.roofline",
                  "tcc.autodiff")),
    ("interop", ("tcc.interop",)),
    ("entry", ("tcc.cli", "tcc")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The tcc modules ``name`` imports anywhere in its text."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def rank(name: str) -> int:
    best = -1, -1  # (prefix length, layer)
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = len(prefix), i
    assert best[1] >= 0, f"{name} is in no layer of the contract: add it to LAYERS"
    return best[1]


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle, if there is any (depth-first search with colours)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circle():
    found = cycle(graph())
    assert found is None, "import circle: " + " -> ".join(found or ())


def test_layers_import_downward():
    upward = sorted(f"{a} ({LAYERS[rank(a)][0]}) imports {b} ({LAYERS[rank(b)][0]})"
                    for a, targets in graph().items() for b in targets if rank(b) > rank(a))
    assert not upward, "\n".join(upward)


def test_the_checker_sees_local_imports_and_circles(tmp_path):
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from tcc.compiler import Op\n    from tcc import dtypes\n")
    assert imports("tcc.m", source, {"tcc", "tcc.compiler", "tcc.dtypes"}) == {"tcc.compiler", "tcc.dtypes"}
