"""Every package the code imports (tests aside) is declared in pyproject.toml, in the core dependencies or an
extra: an import never rests on a package that another one happens to pull in."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

ROOT = Path(__file__).resolve().parents[2]
OWN = {"pnmix", "reference", "conformance", "benchmarks", "reports", "conftest"}
SKIPPED_DIRS = {".venv", ".tox", "tests", "meta", "build"}


def _imported() -> dict[str, str]:
    """Top-level modules imported by the package code (outside tests), with a file that imports each."""
    found: dict[str, str] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in OWN - {"conftest"} or SKIPPED_DIRS & set(rel.parts) or path.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    found.setdefault(top, str(rel))
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    requirements = [*project["dependencies"], *(r for extra in extras for r in extra)]
    return {_normalized(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}


def test_every_imported_package_is_declared():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    undeclared = {
        module: where
        for module, where in _imported().items()
        if not {_normalized(d) for d in distributions.get(module, [module])} & declared
    }
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
