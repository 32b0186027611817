"""The package's imports, read from the source (module-level and function-level imports alike):
no circle; the subpackages are floors, each importing only the floors below it; nothing but the
command lines imports `vit.cli`; and the floors of `vit.explain` import only downwards. Then
the names and commands the layout keeps for users."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

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
    assert "vit.data.eval_transform" in graph["vit.data.transforms"]  # module level, relative
    assert "vit.data.transforms" in graph["vit.data.transforms_factory"]  # inside a function
    assert (
        "vit.models.vision_transformer" in graph["vit.explain.capture"]
    )  # two dots up, inside a function
    assert "vit.explain" in graph["vit.inference.explanations"]  # `from .. import explain`
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


# The subpackages, lowest first: a module imports only from floors below its own (and from its
# own subpackage). Two subpackages on one floor do not import each other. The front ends (the
# modules directly in vit/: `python -m vit.train`, `vit.evaluate`, `vit.predict`, `vit.export`,
# `vit.benchmark`, `vit.distributed`) sit above: nothing in the floors imports them.
FLOORS = {
    "utils": 0,  # atomic files, locks, the process group, figures, ranges
    "models": 1,  # the network, its parts, the registry of names, the families
    "data": 2,  # images, datasets, transforms, MixUp/CutMix, loaders
    "interop": 2,  # weights files, foreign layouts, ONNX export and runtime
    "factory": 3,  # create_model, load_model
    "explain": 3,  # attention maps
    "inference": 4,  # evaluation, TTA, precision, embeddings, probes, prediction
    "training": 5,  # settings, the loop and its pieces, checkpoints, optimizers
    "cli": 6,  # flags, one-line errors, the model argument
}
FRONT_ENDS = {
    "vit.train", "vit.evaluate", "vit.predict", "vit.export", "vit.benchmark", "vit.distributed",
}  # fmt: skip


def floor_of(module: str) -> str | None:
    """'vit.models.registry' -> 'models'; None for vit itself and the front ends."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else None


def test_every_module_sits_on_a_floor_or_is_a_front_end():
    graph = import_graph(PACKAGE)
    homeless = {m for m in graph if m != "vit" and floor_of(m) is None} - FRONT_ENDS
    assert not homeless, f"modules on no floor (add them to FLOORS or FRONT_ENDS): {homeless}"
    assert {floor_of(m) for m in graph} - {None} == set(FLOORS)


def test_floors_import_only_downwards():
    graph = import_graph(PACKAGE)
    wrong = []
    for module, targets in graph.items():
        here = floor_of(module)
        if here is None:
            continue
        for target in targets:
            there = floor_of(target)
            if there is None or (there != here and FLOORS[there] >= FLOORS[here]):
                wrong.append(f"{module} ({here}) imports {target} ({there or 'front end'})")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(sorted(wrong))


def test_only_the_command_lines_import_cli():
    graph = import_graph(PACKAGE)
    importers = {m for m, targets in graph.items() for t in targets if floor_of(t) == "cli"}
    assert importers - FRONT_ENDS - {m for m in importers if floor_of(m) == "cli"} == set()
    assert {"vit.train", "vit.evaluate", "vit.predict"} <= importers  # the test sees them


def test_the_repository_scripts_run_the_package_commands():
    """train.py and evaluate.py at the repository's root run vit.train's and vit.evaluate's
    main() (so a pip install has the commands too), and hold nothing else of their own."""
    for name in ("train", "evaluate"):
        tree = ast.parse((PACKAGE.parent / f"{name}.py").read_text())
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert [(node.module, [a.name for a in node.names]) for node in imports] == [
            (f"vit.{name}", ["main"])
        ]
        assert not [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


def test_the_floor_test_sees_a_library_module_importing_cli(tmp_path):
    package = tmp_path / "vit"
    for floor in ("cli", "models"):
        (package / floor).mkdir(parents=True)
        (package / floor / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cli" / "flags.py").write_text("")
    (package / "models" / "model.py").write_text("def f():\n    from ..cli import flags\n")
    graph = import_graph(package)
    assert "vit.cli.flags" in graph["vit.models.model"]
    assert floor_of("vit.cli.flags") == "cli" and FLOORS["cli"] > FLOORS["models"]


# -- what the layout keeps for users --------------------------------------------------------------
KEPT_NAMES = [
    "Attention", "Block", "LoadReport", "Mlp", "PatchEmbed", "Preprocess", "ViTConfig",
    "VisionTransformer", "create_model", "create_transform", "list_models", "load_model",
    "load_weights", "resample_abs_pos_embed", "resolve_model", "resolve_model_data_config",
    "save_weights",
]  # fmt: skip
KEPT_EXPLAIN_NAMES = [
    "attention_rollout", "gradient_rollout", "relevance", "last_block_attention",
    "capture_attention", "record_attention", "rollout_matrix", "relevance_matrix",
    "gradient_rollout_matrix", "fuse_heads", "discard_lowest", "patch_map", "grid_of",
    "num_registers", "readout_tokens", "faithfulness", "perturbation_curve", "random_map",
    "area_under_curve", "mean_attention_distance", "model_attention_distance",
    "similarity_scores", "embed", "remove_patches", "drop_tokens",
]  # fmt: skip


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=PACKAGE.parent, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_the_public_names_are_kept_and_import_vit_loads_no_torch():
    code = (
        "import sys, vit\n"
        "print(sorted(vit.__all__))\n"
        "print('torch' in sys.modules)\n"
        "import vit.explain as e\n"
        f"print([n for n in {KEPT_NAMES!r} if not callable(getattr(vit, n))])\n"
        f"print([n for n in {KEPT_EXPLAIN_NAMES!r} if n not in e.__all__ or not hasattr(e, n)])\n"
    )
    names, torch_loaded, missing, missing_explain = run_python(code).splitlines()
    assert names == str(sorted(KEPT_NAMES))
    assert torch_loaded == "False"
    assert missing == "[]" and missing_explain == "[]"


def test_the_console_scripts_point_at_the_front_ends():
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {
        "vit-train": "vit.train:main",
        "vit-evaluate": "vit.evaluate:main",
        "vit-predict": "vit.predict:main",
        "vit-export": "vit.export:main",
        "vit-benchmark": "vit.benchmark:main",
    }
    for entry in project["scripts"].values():
        module, name = entry.split(":")
        assert f"def {name}(" in (PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text()


@pytest.mark.parametrize("module", sorted(FRONT_ENDS))
def test_the_module_commands_still_run(module):
    """`python -m vit.train`, `vit.evaluate`, `vit.predict`, `vit.export`, `vit.benchmark` and
    `vit.distributed` answer --help (the last is torchrun's own help, which it passes
    through)."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        env=env,
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_the_architecture_page_names_every_module():
    """docs/ARCHITECTURE.md's floors name each module of each subpackage, so a module added
    without a line there (what it holds, on which floor) fails here."""
    page = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    modules = [
        path.relative_to(PACKAGE.parent)
        for path in sorted(PACKAGE.glob("*/*.py"))
        if path.name != "__init__.py"
    ]
    assert modules, "no modules found under vit/"
    unnamed = [str(m) for m in modules if m.name not in page]
    assert not unnamed, f"docs/ARCHITECTURE.md does not name: {', '.join(unnamed)}"
