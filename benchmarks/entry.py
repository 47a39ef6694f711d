"""The `pytest11` entry point of the installed package: the benchmark suites' plug-in (`benchmarks.plugin`) where the
suite's test tools are installed (the `test` extra: pytest-benchmark), nothing where they are not. An entry point
that fails to import stops every pytest run of its environment, so a core install must load an empty plug-in."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("pytest_benchmark") is not None:
    from benchmarks.plugin import *  # noqa: F403  (its hooks, options and fixtures, registered under its name)
