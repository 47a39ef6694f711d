"""The packages stack in one direction: reference <- pnmix, conformance <- benchmarks <- reports.

reference (the spec, the layout plan, the implementation contract, result records) imports
none of the others; pnmix (an implementation) imports only the spec, never the test suite;
conformance reaches implementations through the contract alone; nothing imports reports.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reference", "pnmix", "conformance", "benchmarks", "reports")
#: What each package may import of the others (its tests included).
ALLOWED = {
    "reference": set(),
    "pnmix": {"reference"},
    "conformance": {"reference"},
    "benchmarks": {"reference", "pnmix", "conformance"},
    "reports": {"reference", "pnmix", "conformance", "benchmarks"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level project packages a module imports, anywhere in it (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_the_layers_below(package):
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) - ALLOWED[package] - {package})
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: names for path, names in wrong.items() if names} == {}


def test_the_check_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from reports.files import x\n    import conformance.api\n")
    assert imported_packages(module) == {"reports", "conformance"}
