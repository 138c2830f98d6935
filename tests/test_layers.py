"""The contracts of docs/architecture.md, read from the source with ``ast``: tcc's modules form no
import circle, and each layer imports only from the layers beneath it (every import counts, the
ones inside functions (lazy loading) and under ``TYPE_CHECKING`` too, so that no local import can
hide a cycle); no module but the backend registry and the CLI's argument parsing tests the kind
of a target by name or type; interop and autodiff use no private name of the layers beneath."""

from __future__ import annotations

import ast
from pathlib import Path

from tcc.runtime.backend import REGISTRY

ROOT = Path(__file__).resolve().parent.parent / "tcc"

# lowest first; a module may import from its own layer (without a circle) and the ones before it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("tcc.errors", "tcc.dtypes", "tcc.target", "tcc.paths", "tcc.version", "tcc.stack", "tcc.threads")),
    ("ir", ("tcc.ir",)),
    ("frontend", ("tcc.frontend",)),
    ("passes", ("tcc.passes", "tcc.reference", "tcc.testing")),
    ("codegen", ("tcc.codegen_cpu", "tcc.codegen_cuda")),
    ("runtime", ("tcc.runtime", "tcc.cuda")),
    ("compiler", ("tcc.compiler", "tcc.generic_op", "tcc.index_guard", "tcc.opdoc", "tcc.tune", "tcc.roofline",
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


# ---------------------------------------------------------------- the target kind is asked, not tested

KIND_NAMES = {"cpu", "cuda"}
TARGET_TYPES = {"CpuTarget", "CudaTarget"}
# the registry and the backends it names (each one's own stages: stage == "cuda"); the CLI's arguments
KIND_TESTS_ALLOWED = {"tcc.runtime.backend", *REGISTRY.values(), "tcc.cli"}


def kind_tests(tree: ast.AST) -> list[str]:
    """Comparisons with a kind's name (``== "cuda"``, ``in ("cpu", ...)``) and ``isinstance`` /
    ``issubclass`` tests against a Target type, as source text."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            values = [v for side in sides for v in (side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set)
                                                    else [side])]
            if any(isinstance(v, ast.Constant) and v.value in KIND_NAMES for v in values):
                found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
                     if isinstance(n, ast.Name | ast.Attribute)}
            if names & TARGET_TYPES:
                found.append(ast.unparse(node))
    return found


def test_no_kind_tests_outside_the_registry():
    """Code asks the target (``target.is_gpu``, its budgets) or its backend (``backend.primitives``)."""
    found = [f"{name}: {text}" for name, path in sorted(modules().items()) if name not in KIND_TESTS_ALLOWED
             for text in kind_tests(ast.parse(path.read_text()))]
    assert not found, "\n".join(found)


def test_the_kind_checker_sees_names_and_types():
    source = ('if target == "cuda" or kind in ("tpu", "cpu") or isinstance(t, (int, CudaTarget)):\n    pass\n'
              'if issubclass(T, target.CpuTarget) or t.is_gpu or name == "cudnn":\n    pass\n')
    assert kind_tests(ast.parse(source)) == ['target == \'cuda\'', "kind in ('tpu', 'cpu')",
                                             "isinstance(t, (int, CudaTarget))", "issubclass(T, target.CpuTarget)"]


# ---------------------------------------------------------------- interop uses published names

PUBLIC_ONLY = ("tcc/interop/*.py", "tcc/autodiff.py")
# private names of other libraries' objects that interop may read: a tensor's version counter
# (torch.Tensor._version, what PyTorch's autograd and torch.compile's guards read themselves)
FOREIGN_PRIVATE = {"_version"}


def private_uses(tree: ast.AST) -> list[str]:
    """``x._name`` where ``_name`` belongs to another module: ``x`` is not ``self``/``cls`` nor a
    module from outside tcc (or a name bound to one of its attributes), and this module defines
    no ``_name`` of its own (a function, class, attribute or ``__slots__`` entry)."""
    own: set[str] = set()
    foreign: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            own.add(node.value)  # __slots__, getattr(self, "_name")
        elif isinstance(node, ast.Import):
            foreign.update((a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("tcc"))
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("tcc"):
            foreign.update(a.asname or a.name for a in node.names)
    for node in getattr(tree, "body", []):  # module-level aliases of foreign names: _C = torch._C
        if isinstance(node, ast.Assign) and _root(node.value) in foreign:
            foreign.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return [ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and node.attr not in own | FOREIGN_PRIVATE and _root(node.value) not in foreign | {"self", "cls"}]


def _root(e: ast.expr) -> str | None:
    while isinstance(e, ast.Attribute | ast.Call | ast.Subscript):
        e = e.value if not isinstance(e, ast.Call) else e.func
    return e.id if isinstance(e, ast.Name) else None


def test_interop_uses_no_private_name_of_runtime_or_the_compiler():
    """Interop (and autodiff) read what runtime/ and the compiler publish (``op.plans``, the plans'
    fast-path descriptions, ``op.library_options``), never their private attributes."""
    root = ROOT.parent
    found = [f"{path.relative_to(root)}: {text}" for pattern in PUBLIC_ONLY for path in sorted(root.glob(pattern))
             for text in private_uses(ast.parse(path.read_text()))]
    assert not found, "\n".join(found)


def test_the_private_name_checker():
    source = ("import torch\n_C = torch._C\nfrom tcc.compiler import Op\n"
              "class T:\n    def _mine(self):\n        return self._x, _C._y, torch._z, op._plans, T()._mine()\n")
    assert private_uses(ast.parse(source)) == ["op._plans"]
