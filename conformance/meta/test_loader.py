"""Selecting implementations: built-ins, import paths, clear errors, stubs for missing names."""

import pytest

from conformance import loader
from reference.contract import Capabilities, missing_names


class Partial:
    """An implementation that defines only part of the protocol."""

    name = "partial"
    version = "0"
    capabilities = Capabilities()

    def create(self, config):
        return None


def test_builtin_reference_satisfies_the_protocol():
    impl = loader.load("reference")
    assert impl.name == "reference" and missing_names(impl) == []


def test_import_path_factory_and_class():
    assert loader.load("conformance.meta.mutants:accepts_nan").name == "accepts_nan"
    assert loader.load("conformance.meta.test_loader:Partial").name == "partial"


def test_missing_names_become_stubs_that_say_so():
    impl = loader.load("conformance.meta.test_loader:Partial")
    with pytest.raises(loader.NotDefined, match=r"pack_mask is not defined in conformance\.meta\.test_loader:Partial"):
        impl.pack_mask(None)
    assert impl.create(None) is None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-such-impl", "unknown implementation 'no-such-impl'"),
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("reference.implementation:nothing", "has no attribute 'nothing'"),
        (":make", "must look like 'package.module:factory'"),
    ],
)
def test_bad_names_are_explained(name, message):
    with pytest.raises(ValueError, match=message):
        loader.load(name)


def test_builtins_leave_out_an_adapter_whose_extra_is_not_installed(monkeypatch):
    """`transformers-quanto` needs pnmix[adapters]: without optimum-quanto it is not a built-in
    (a default run would fail on it), and naming it still loads it."""
    assert "transformers-quanto" in loader.builtins()
    real = loader.importlib.metadata.version

    def version(name):
        if name == "optimum-quanto":
            raise loader.importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(loader.importlib.metadata, "version", version)
    assert "transformers-quanto" not in loader.builtins() and "triton" in loader.builtins()
    assert loader.load("transformers-quanto").name == "transformers-quanto"


def test_naming_an_implementation_never_runs_the_suites_own_tests():
    from conformance.meta.test_mutants import run_suite

    result = run_suite("conformance", "--impl", "reference", "--collect-only", "--no-conformance-json")
    assert result.returncode == 0, result.stdout[-2000:]
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected and not [line for line in collected if line.startswith("conformance/meta/")]
    assert "deselected" in result.stdout
