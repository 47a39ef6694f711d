"""Whether a pytest run asks for one of this project's suites: a path of the run (or a --pyargs name) inside the
suite's folder or above it. The plug-ins (`conformance.plugin`, `benchmarks.plugin`) are loaded by every pytest run
of an environment where the package is installed, and stay inert in a run that asks for neither suite."""

from __future__ import annotations

from pathlib import Path

import pytest


def runs_inside(config: pytest.Config, folder: Path, module: str) -> bool:
    """Whether a path of this run lies in `folder` or above it, or (with --pyargs) a name lies in the package
    `module` (the folder's dotted name) or above it."""
    pyargs = config.getoption("pyargs", False)
    for arg in config.args:
        target = arg.split("::")[0]
        if pyargs and (target == module or f"{target}.".startswith(f"{module}.") or module.startswith(f"{target}.")):
            return True
        path = Path(config.invocation_params.dir, target).resolve()
        if path == folder or path in folder.parents or folder in path.parents:
            return True
    return False
