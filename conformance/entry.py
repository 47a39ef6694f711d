"""The `pytest11` entry point of the installed package: the conformance plug-in (`conformance.plugin`) where the
suite's test tools are installed (the `test` extra), nothing where they are not. An entry point that fails to import
stops every pytest run of its environment, so a core install (no hypothesis) must load an empty plug-in."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("hypothesis") is not None:
    from conformance.plugin import *  # noqa: F403  (its hooks, options and fixture, registered under its name)
