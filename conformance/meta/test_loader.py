"""Selecting implementations: built-ins, import paths, clear errors, stubs for missing names."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import loader
from conformance.meta.test_mutants import run_suite
from reference.contract import Capabilities, missing_names
from reference.contract.implementation import ReferenceImplementation


class Partial:
    """An implementation that defines only part of the protocol."""

    name = "partial"
    version = "0"
    capabilities = Capabilities()

    def create(self, config):
        return None


def broken_factory():
    raise RuntimeError("no device\nsecond line")


def returns_none():
    return None


def exits():
    raise SystemExit(0)  # a plug-in ending the process from its factory


def _named(name):
    impl = ReferenceImplementation()
    impl.name = name
    return impl


def named_a_path():
    return _named("../../../somewhere/x")


def named_in_markdown():
    return _named("[x](http://e) `y`")


def named_with_a_line_break():
    return _named("a\nb")


def named_nothing():
    return _named("")


def returns_42():
    return 42


def sleeps():
    import time

    time.sleep(30)  # a factory that never finishes: waiting on a lock, a download, a build


def sleeps_and_keeps_going():
    try:
        sleeps()
    except Exception:  # a plug-in that swallows errors does not swallow the time budget
        pass
    return ReferenceImplementation()


#: An implementation module that raises on import (written to a temporary folder on sys.path).
BROKEN_MODULE = 'raise RuntimeError("cannot start")\n\ndef make():\n    pass\n'


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
        ("reference.contract.implementation:nothing", "has no attribute 'nothing'"),
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

    result = run_suite("conformance", "--impl", "reference", "--collect-only", "--no-conformance-json")
    assert result.returncode == 0, result.stdout[-2000:]
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected and not [line for line in collected if line.startswith("conformance/meta/")]
    assert "deselected" in result.stdout


HERE = "conformance.meta.test_loader"
LOAD_FAULTS = [
    (f"{HERE}:broken_factory", r"^implementation '\S+': its factory raised RuntimeError: no device$"),
    (
        "broken_on_import_mod:make",
        r"^cannot import 'broken_on_import_mod' for implementation '\S+': RuntimeError: cannot",
    ),
    (f"{HERE}:returns_none", r"returned None \(NoneType\), not an implementation: it lacks name, "),
    (f"{HERE}:returns_42", r"returned 42 \(int\), not an implementation: it lacks .*unpack_mask$"),
    (f"{HERE}:exits", r"^implementation '\S+': its factory raised SystemExit: 0$"),
    (f"{HERE}:named_a_path", r"its name '\.\./\.\./\.\./somewhere/x' must be 1-64 letters, digits"),
    (f"{HERE}:named_in_markdown", r"its name '\[x\]\(http://e\) `y`' must be 1-64 letters"),
    (f"{HERE}:named_with_a_line_break", r"its name 'a\\nb' must be 1-64 letters"),
    (f"{HERE}:named_nothing", r"its name '' must be 1-64 letters"),
]


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    """A folder on sys.path holding a module that raises on import."""
    (tmp_path / "broken_on_import_mod.py").write_text(BROKEN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("name", "message"), LOAD_FAULTS)
def test_load_faults_are_one_line_naming_module_factory_and_cause(broken_module, name, message):
    with pytest.raises(ValueError, match=message) as err:
        loader.load(name)
    assert "\n" not in str(err.value)


def test_a_plug_in_factory_that_raises_is_named_with_its_module(monkeypatch):
    ep = loader.importlib.metadata.EntryPoint("broken", f"{HERE}:broken_factory", loader.ENTRY_POINT_GROUP)
    monkeypatch.setattr(loader, "_entry_points", lambda: {"broken": ep})
    with pytest.raises(ValueError, match=r"'broken' \(factory conformance\.meta\.test_loader:broken_factory\): its"):
        loader.load("broken")


# each a fresh pytest process: the kinds of fault (the names are refused as a raising factory is)
@pytest.mark.parametrize("name", [name for name, _ in LOAD_FAULTS[:5]] + [f"{HERE}:named_a_path"])
def test_a_run_whose_implementation_does_not_load_stops_with_one_line(broken_module, name):
    path = os.pathsep.join(filter(None, (str(broken_module), os.environ.get("PYTHONPATH"))))
    cmd = [sys.executable, "-m", "pytest", "conformance", "--impl", name, "--collect-only", "-q"]
    cmd += ["-p", "no:cacheprovider", "--no-conformance-json"]
    root = Path(__file__).parents[2]
    result = subprocess.run(cmd, cwd=root, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and len(said) == 1, said[-30:]
    assert said[0].startswith("ERROR: ") and name.partition(":")[0] in said[0]


def test_two_implementations_under_one_name_are_refused_naming_both_origins():
    cmd = [sys.executable, "-m", "pytest", "conformance", "--impl", "reference"]
    cmd += ["--impl", "reference.contract.implementation:make", "--collect-only", "-q", "-p", "no:cacheprovider"]
    cmd += ["--no-conformance-json"]
    result = subprocess.run(cmd, cwd=Path(__file__).parents[2], capture_output=True, text=True)
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and len(said) == 1, said[-30:]
    assert "--impl reference.contract.implementation:make is named 'reference', as is reference" in said[0]
    assert "reference = reference.contract.implementation:make (pnmix" in said[0] and "must be unique" in said[0]


@pytest.mark.parametrize("factory", ["sleeps", "sleeps_and_keeps_going"])
def test_a_load_past_its_time_budget_is_stopped_naming_where_it_waited(monkeypatch, capsys, factory):
    import time

    monkeypatch.setenv(loader.LOAD_TIMEOUT_ENV, "0.5")
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        loader.load(f"{HERE}:{factory}")
    message = str(err.value)
    assert time.monotonic() - start < 10 and "\n" not in message
    assert message.startswith(f"implementation '{HERE}:{factory}': loading did not finish within 0.5 s")
    assert f"waiting in {__file__}:" in message and "in sleeps" in message and "PNMIX_LOAD_TIMEOUT_S" in message
    monkeypatch.setattr(loader, "LOAD_NOTICE_S", 0.2)  # a long load says it is still running, and where
    with pytest.raises(ValueError, match=r"loading did not finish within 0\.5 s"):
        loader.load(f"{HERE}:{factory}")
    said = capsys.readouterr().err
    assert f"loading implementation '{HERE}:{factory}': still running after 0 s, in {__file__}:" in said
    assert "(stopped at 0.5 s)" in said and said.count("still running") == 1
    monkeypatch.setenv(loader.LOAD_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"^PNMIX_LOAD_TIMEOUT_S='soon': expected a number of seconds >= 0"):
        loader.load("reference")
    monkeypatch.delenv(loader.LOAD_TIMEOUT_ENV)
    assert loader.load("reference").name == "reference"  # within the default budget, no timer left behind
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
