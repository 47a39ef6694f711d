"""The packages stack in one direction: reference <- pnmix, conformance <- benchmarks <- reports.

reference (the spec, the layout plan, the implementation contract, result records) imports
none of the others; pnmix (an implementation) imports only the spec, never the test suite;
conformance reaches implementations through the contract alone; nothing imports reports.
Inside `reference/`, the paper's parts stack too: the equations import nothing above them, the
channel-precision family builds on the equations, the per-token family on both, the method
registry on the families, the contract on the registry, the result records on the families (a configuration is
recorded as data and read back). No module imports itself back through
others, not even through imports inside functions, and a project import inside a function is there only
to defer a heavy dependency, said on its line (`# deferred: <why>`) and true: the module it imports brings a
heavy library at module level that the importing module does not already load.
"""

import ast
import re
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
#: The parts of `reference/` (a subpackage or a top-level module) and what each may import of the others.
REFERENCE_PARTS = {
    "equations": set(),
    "paper": set(),
    "models": set(),
    "channels": {"equations"},
    "tokens": {"equations", "channels"},
    "records": {"equations", "channels", "tokens"},  # a configuration recorded as data, and read back
    "methods": {"equations", "channels", "tokens"},
    "contract": {"equations", "channels", "tokens", "methods"},
    "cli": {"equations", "channels", "tokens", "methods", "paper", "records", "models", "contract"},
}


def project_modules() -> dict[str, Path]:
    """Every module of the project (tests left out), by its dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if "tests" in parts or "suites" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, *, inside_functions: bool | None = None):
    """(node, dotted module names) of each project import in `path`: everywhere (None), only inside
    functions (True) or only outside them (False). `from package import module` names the module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inner = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for sub in ast.walk(node)
    }
    for node in ast.walk(tree):
        if inside_functions is not None and (id(node) in inner) != inside_functions:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        names = [name for name in names if name.split(".")[0] in PACKAGES]
        if names:
            yield node, names


def imported_packages(path: Path) -> set[str]:
    """Top-level project packages a module imports, anywhere in it (function-level imports too)."""
    return {name.split(".")[0] for _, names in imports(path) for name in names}


def reference_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "reference" and len(parts) > 1 else None


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_the_layers_below(package):
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) - ALLOWED[package] - {package})
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: names for path, names in wrong.items() if names} == {}


def test_the_parts_of_the_spec_import_only_the_parts_below():
    wrong = {}
    for module, path in project_modules().items():
        part = reference_part(module)
        if part not in REFERENCE_PARTS:
            continue
        # names of the root package (`from reference import __version__`) are no part: it is loaded first anyway
        used = {reference_part(name) for _, names in imports(path) for name in names} & set(REFERENCE_PARTS) - {part}
        if used - REFERENCE_PARTS[part]:
            wrong[module] = sorted(used - REFERENCE_PARTS[part])
    assert wrong == {}


def import_graph(modules: dict[str, Path], *, inside_functions: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports at module level (with `inside_functions`, anywhere in it; a
    package's `__init__` only when it, not one of its modules, is what the statement names)."""
    graph = {}
    for module, path in modules.items():
        graph[module] = set()
        for _, names in imports(path, inside_functions=None if inside_functions else False):
            named = [name for name in names[1:] if name in modules] or [names[0]]
            graph[module] |= {name for name in named if name in modules and name != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back():
    assert cycles(import_graph(project_modules())) == []


def test_no_module_imports_itself_back_through_imports_inside_functions():
    """A function-level import defers loading, not the dependency: a circle through one is still a circle."""
    assert cycles(import_graph(project_modules(), inside_functions=True)) == []


#: Libraries whose import takes seconds, or that a CPU-only or a light command should not load: the only
#: reasons to defer a project import.
HEAVY = frozenset(
    {"torch", "triton", "transformers", "lm_eval", "datasets", "accelerate", "gguf", "matplotlib", "scipy"}
    | {"optimum", "hqq", "tokenizers", "safetensors", "pandas", "pyarrow"}
)


def module_level_libraries(path: Path) -> set[str]:
    """The top-level names of the libraries (not of this project) a module imports outside its functions."""
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    inner = {id(sub) for node in functions for sub in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out - set(PACKAGES)


def heavy_libraries(modules: dict[str, Path], graph: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    """Module -> the heavy libraries importing it loads: its own module-level imports, its packages' and those
    of every project module it imports at module level, transitively."""
    out: dict[str, frozenset[str]] = {}
    for module in modules:
        seen, stack, found = set(), [module], set()
        while stack:
            m = stack.pop()
            if m in seen or m not in modules:
                continue
            seen.add(m)
            found |= module_level_libraries(modules[m]) & HEAVY
            parts = m.split(".")
            stack += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(graph[m])
        out[module] = frozenset(found)
    return out


#: Deferred imports known to defer no heavy library, each with why it is not moved yet; the test fails when one
#: is moved (remove it here) as when another appears.
def test_a_deferred_import_defers_a_heavy_library():
    """`# deferred:` is true only where the imported module loads, at module level, a heavy library that the
    importing module does not load already; otherwise the import belongs at the top of the module."""
    modules = project_modules()
    heavy = heavy_libraries(modules, import_graph(modules))
    idle = []
    for module, path in modules.items():
        for _, names in imports(path, inside_functions=True):
            targets = [n for n in names[1:] if n in modules] or [n for n in names[:1] if n in modules]
            if targets and not set().union(*(heavy[t] for t in targets)) - heavy[module]:
                idle.append((str(path.relative_to(ROOT)), ", ".join(targets)))
    assert sorted(set(idle)) == []


def test_the_deferral_check_sees_an_import_that_defers_nothing(tmp_path):
    (tmp_path / "light.py").write_text("import json\n")
    (tmp_path / "slow.py").write_text("import transformers\n")
    modules = {"reference.light": tmp_path / "light.py", "reference.slow": tmp_path / "slow.py"}
    heavy = heavy_libraries(modules, {"reference.light": set(), "reference.slow": set()})
    assert heavy == {"reference.light": frozenset(), "reference.slow": frozenset({"transformers"})}


def test_function_level_project_imports_say_why_they_are_deferred():
    undeferred = []
    for path in project_modules().values():
        lines = path.read_text().splitlines()
        for node, _ in imports(path, inside_functions=True):
            if "# deferred: " not in lines[node.lineno - 1]:
                undeferred.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert undeferred == []


def test_the_check_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from reports.files import x\n    import conformance.api\n")
    assert imported_packages(module) == {"reports", "conformance"}
    assert [node.lineno for node, _ in imports(module, inside_functions=True)] == [2, 3]
    assert list(imports(module, inside_functions=False)) == []


def test_the_cycle_check_finds_a_circle_through_a_package():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_module_runs_as_a_command_only_once_it_is_whole():
    """`if __name__ == "__main__":` is a module's last statement: run with `python -m`, a module executes top to
    bottom, and a command started above a definition (a canary, a table) fails on a name not yet defined, which
    the console script, importing the whole module first, never shows."""
    early = []
    for module, path in project_modules().items():
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for i, node in enumerate(body):
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and i != len(body) - 1:
                early.append(f"{module}:{node.lineno}")
    assert early == []


#: Tracked folders that are data of a result, not a part of the layout (a report's own inputs, a GPU session's files).
NOT_LAYOUT = ("reports/example-", "benchmarks/results/")


def test_the_layout_page_has_a_row_for_every_folder():
    """docs/layout.md's table names every folder the repository tracks (a new folder gets its row)."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {str(Path(f).parent) for f in tracked.split()} - {"."}
    folders = {f for f in folders if not f.startswith(NOT_LAYOUT)}
    rows = [
        line.split("|")[1] for line in (ROOT / "docs" / "layout.md").read_text().splitlines() if line.startswith("| ")
    ]
    named = {m.rstrip("/") for row in rows for m in re.findall(r"`([^`]+/)`", row)}
    assert sorted(folders - named) == []
