"""Modules by the name they had before they moved: the old names keep importing, for this release, with a
`DeprecationWarning` naming the new home (and `reference.adapter`, where everything an adapter needs lives).

An old name is the new module itself (`sys.modules` holds one object under both names), so classes keep their
identity: an adapter that imported `reference.validation` and one that imports `reference.channels.validation`
share the same functions and types.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: Old module name -> the module that holds it now (moved on 2026-11-30 and 2026-12-02).
MOVED = {
    # the spec in subpackages that read like the paper (2026-12-02)
    "reference.attention": "reference.equations.attention",
    "reference.bit_allocation": "reference.tokens.allocation",
    "reference.cache": "reference.channels.cache",
    "reference.config": "reference.channels.config",
    "reference.faults": "reference.contract.faults",
    "reference.implementation": "reference.contract.implementation",
    "reference.layout": "reference.channels.layout",
    "reference.packing": "reference.equations.packing",
    "reference.polar": "reference.equations.polar",
    "reference.quant": "reference.equations.quant",
    "reference.roles": "reference.tokens.roles",
    "reference.saliency": "reference.equations.saliency",
    "reference.selection": "reference.channels.selection",
    "reference.storage": "reference.channels.storage",
    "reference.tag_distortion": "reference.tokens.distortion",
    "reference.token_cache": "reference.tokens.cache",
    "reference.token_precision": "reference.tokens.config",
    "reference.tolerances": "reference.contract.tolerances",
    "reference.validation": "reference.channels.validation",
    # the implementation contract into the spec layer (2026-11-30)
    "conformance.api": "reference.contract",
    "conformance.impls.reference": "reference.contract.implementation",
    "conformance.tolerances": "reference.contract.tolerances",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """Nothing to run: the module was imported under its own name. The import machinery has just set its
        `__spec__` to the old name's; put back its own, or `importlib.util.find_spec(new)` would answer with an
        alias spec that has no file (and every tool that finds code by module name would lose the module)."""
        module.__spec__ = self.own_spec


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds a moved module under its old name as the module that holds it now, and warns once per import."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(
            f"{fullname} moved to {new}; the old name goes in the next release. An adapter imports everything it "
            "needs from reference.adapter",
            DeprecationWarning,
            stacklevel=2,  # warnings skips the import machinery's frames: the line of the import statement
        )
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())


__all__ = ["MOVED", "MovedModules", "install"]
