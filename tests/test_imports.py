"""The package's imports: no circle, read from the source (module-level and function-level
imports alike), and the floors of `vit.explain` importing only downwards."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vit"


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `package` (a package is its __init__.py)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports that never run."""
    test = getattr(node, "test", None)
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
    return isinstance(node, ast.If) and name == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at module level, in functions, in classes."""
    found = []
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        elif _is_type_checking(child):
            found += _imports(ast.Module(body=child.orelse, type_ignores=[]))
        else:
            found += _imports(child)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (by name, not their parent packages: that a
    submodule's import runs its package's __init__ first is how packages work, not a circle).

    `from . import x` points at the submodule x when there is one, else at the package. Imports
    behind `if TYPE_CHECKING:` never run and are left out; so are `importlib.import_module`
    calls (the lazy public names of `vit/__init__.py`), which run only when a name is used.
    """
    modules = module_names(package)
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                base = here[: len(here) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                candidates = [f"{source}.{alias.name}" for alias in node.names]
                candidates = [c if c in modules else source for c in candidates]
            targets |= {c for c in candidates if c in modules and c != name}
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search, sorted for a stable
    answer)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def test_the_package_has_no_import_circle():
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph(PACKAGE)
    assert "vit.eval_transform" in graph["vit.transforms"]  # module level, relative
    assert "vit.transforms" in graph["vit.factory"]  # inside a function
    assert "vit.model" in graph["vit.explain.capture"]  # two dots up, inside a function
    assert "vit.explain" in graph["vit.predict"]  # `from . import explain`
    assert {"vit.explain.capture", "vit.explain.rollout"} <= graph["vit.explain.maps"]
    assert graph["vit"] == set()  # only importlib and TYPE_CHECKING imports there


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .low import f\n")  # not a circle
    (package / "sub" / "low.py").write_text("def f():\n    from ..high import g\n")
    (package / "high.py").write_text("from .sub import low\n")
    assert find_cycle(import_graph(package)) == ["pkg.high", "pkg.sub.low", "pkg.high"]
    (package / "high.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .sub import low\n"
    )
    assert find_cycle(import_graph(package)) is None


# vit.explain's modules, floor by floor: a module imports only from floors below its own.
EXPLAIN_FLOORS = {"rollout": 0, "readout": 0, "capture": 1, "maps": 2, "perturbation": 2}


def test_explain_floors_import_only_downwards():
    graph = import_graph(PACKAGE)
    explain = {n.removeprefix("vit.explain.") for n in graph if n.startswith("vit.explain.")}
    assert explain == set(EXPLAIN_FLOORS)  # a new module gets its floor here
    for name, floor in EXPLAIN_FLOORS.items():
        for target in graph[f"vit.explain.{name}"]:
            if target.startswith("vit.explain."):
                below = EXPLAIN_FLOORS[target.removeprefix("vit.explain.")]
                assert below < floor, f"vit.explain.{name} imports {target}, not a lower floor"
    # the arithmetic needs no model: it imports nothing of the package
    assert graph["vit.explain.rollout"] == set()
