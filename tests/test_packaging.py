"""What a `pip install vit-from-scratch` gets: every package the library imports declared (as a
dependency, or in the extra its error message names), the version written once, the license
that the metadata names shipped with it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib

import vit

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    """PEP 503's normalised name of a requirement string ("Pillow>=10" -> "pillow")."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level_modules(package: Path) -> set[str]:
    """The top-level names every import under `package` asks for, at any depth of the code."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_package_the_library_imports_is_declared():
    """cv2 and huggingface_hub came only through albumentations and timm: a release of either
    that dropped them would have broken `import vit.data.transforms` and pretrained loading."""
    declared = {requirement_name(r) for r in PROJECT["dependencies"]}
    for requirements in PROJECT["optional-dependencies"].values():
        declared |= {requirement_name(r) for r in requirements}
    distributions = importlib.metadata.packages_distributions()
    third_party = imported_top_level_modules(ROOT / "vit") - set(sys.stdlib_module_names) - {"vit"}
    # packaging: read only after onnxruntime, which requires it (vit/interop/onnx_export.py)
    undeclared = {
        module: distributions.get(module)
        for module in sorted(third_party - {"packaging"})
        if not declared & {requirement_name(d) for d in distributions.get(module, [module])}
    }
    assert undeclared == {}


def test_the_version_is_written_once_and_the_license_ships():
    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    assert importlib.metadata.version("vit-from-scratch") == vit.__version__
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
