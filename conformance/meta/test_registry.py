"""The method registry and the built-in implementations agree: each design's spec and Triton
implementations are registered under the names the registry gives them, with the design's claims."""

import pytest

from conformance import loader
from reference import methods
from reference.contract import Capabilities

NAMED = [(d.name, impl) for d in methods.DESIGNS.values() for impl in (d.spec, d.triton) if impl is not None]


@pytest.mark.parametrize(("design", "builtin"), NAMED)
def test_each_registered_implementation_is_a_builtin_with_its_designs_claims(design, builtin):
    assert builtin in loader.builtins()
    caps = loader.load(builtin).capabilities
    claims = Capabilities(**methods.design(design).claims)
    for name in methods.design(design).claims:
        assert getattr(caps, name) == getattr(claims, name), (builtin, name)
