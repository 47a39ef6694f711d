"""Known failures belong to the implementation they were written for (its factory), not to a name."""

import pytest

from conformance import loader, plugin
from conformance.meta.test_mutants import run_suite

#: A third party's plug-in that takes a built-in adapter's name and shares one of its defects: it
#: accepts NaN and Inf appends, which conformance/xfails/transformers-hqq.txt lists for the adapter.
IMPOSTOR = """from conformance.meta import mutants


def make():
    impl = mutants.accepts_nan()
    impl.name = "transformers-hqq"
    return impl
"""
APPEND = "conformance/test_p9_bad_input.py::test_bad_append_is_rejected_and_changes_nothing"
BAD_VALUES = ("-k", "test_bad_append_is_rejected_and_changes_nothing and (nan_in_k or inf_in_v)")


def _run(*args: str):
    return run_suite("conformance/test_p9_bad_input.py", *BAD_VALUES, "--no-conformance-json", *args)


def test_a_plug_in_named_like_a_builtin_is_judged_without_its_known_failures(tmp_path, monkeypatch):
    (tmp_path / "impostor_mod.py").write_text(IMPOSTOR)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result = _run("--impl", "impostor_mod:make")
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-3000:]
    assert "2 failed" in result.stdout and "xfailed" not in result.stdout
    notice = [line for line in result.stdout.splitlines() if "none of them applied" in line]
    assert len(notice) == 1 and "transformers-hqq.txt lists the known failures of" in notice[0]
    assert "conformance.impls.transformers_quantized:make_hqq, not of 'transformers-hqq'" in notice[0]
    assert "loaded from impostor_mod:make" in notice[0]


@pytest.mark.slow  # transformers and hqq imported in a fresh process
def test_the_builtin_keeps_its_known_failures():
    pytest.importorskip("hqq")
    result = _run("--impl", "transformers-hqq")
    assert result.returncode == pytest.ExitCode.OK, result.stdout[-3000:]
    assert "2 xfailed" in result.stdout and "none of them applied" not in result.stdout


def test_a_bound_file_marks_only_its_own_implementations_tests(tmp_path):
    """An id without brackets names a test of every implementation: a file bound to a factory marks its
    implementation's run of it, not another's in the same run."""
    xfails = tmp_path / "mine.txt"
    xfails.write_text(f"factory = conformance.meta.mutants:accepts_nan\n{APPEND}  # accepts NaN\n")
    result = _run("--impl", "reference", "--impl", "conformance.meta.mutants:accepts_nan", "--xfails", str(xfails))
    assert result.returncode == pytest.ExitCode.OK, result.stdout[-3000:]
    assert "2 passed" in result.stdout and "2 xfailed" in result.stdout


def test_every_builtin_file_names_the_entry_point_of_its_implementation():
    files = sorted(plugin.XFAIL_DIR.glob("*.txt"))
    assert files
    for path in files:
        known = plugin.read_known_failures(path, "known-failure file")
        assert known.factory == loader.factory(path.stem), path
        assert loader.factory(known.factory) == known.factory  # loaded by its import path, it is the same code
        assert path.stem in loader.available_names() and known.lines, path


def test_a_third_partys_entry_point_named_like_a_builtin_is_its_own_factory(monkeypatch):
    ep = loader.importlib.metadata.EntryPoint("transformers-hqq", "impostor_mod:make", loader.ENTRY_POINT_GROUP)
    monkeypatch.setattr(loader, "_entry_points", lambda: {"transformers-hqq": ep})
    known = plugin.read_known_failures(plugin.XFAIL_DIR / "transformers-hqq.txt", "known-failure file")
    assert loader.factory("transformers-hqq") == "impostor_mod:make" != known.factory


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("factory = nowhere\n", r"mine\.txt:1: expected one line 'factory = package\.module:factory'.*'factory = "),
        ("factory = a.b:c\nfactory = a.b:d\n", r"mine\.txt:2: expected one line .*, a second factory line$"),
        (b"\xff\xfe", r"mine\.txt: cannot read it \(not UTF-8 text\)$"),
    ],
)
def test_a_malformed_known_failure_file_is_refused_naming_file_and_line(tmp_path, text, says):
    path = tmp_path / "mine.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(pytest.UsageError, match=rf"^--xfails \S+{says}") as err:
        plugin.read_known_failures(path, "--xfails")
    assert "\n" not in str(err.value)
