"""The suites from an installed package: a wheel of this repository, installed in a fresh virtual environment, runs
`pytest --pyargs conformance --impl fp16 --hypothesis-profile ci` to a verdict, and a benchmark suite with
`pytest --pyargs benchmarks.suites...`, away from the checkout. The plug-ins come in through their pytest11 entry
points, the known-failure files as package data; in another project they change nothing.

The fresh environment takes this package from the wheel alone; its dependencies (torch, hypothesis, ...) come from
the test environment's site-packages through a path file, so the test needs no download (a path file's folder is
not a site folder: the editable install's own path hooks there are not run, and the checkout is not importable)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _source(to: Path) -> Path:
    """The checkout's files (tracked, and new ones not ignored) copied to `to`: setuptools builds in the source
    folder, which must not be the checkout's."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


@pytest.mark.slow
def test_the_installed_wheel_runs_the_suite_to_a_verdict(tmp_path):
    dist, env, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    work.mkdir()
    source = _source(tmp_path / "source")
    wheel_of = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)]
    _run([*wheel_of, str(source)], work)
    (wheel,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)], work)
    python = env / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        work,
    )
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work).stdout.strip()
    )
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = _run([str(python), "-c", "import conformance, reference; print(conformance.__file__)"], work).stdout
    assert Path(where.strip()).is_relative_to(site), f"conformance imported from {where}, not from the wheel"
    assert (site / "conformance" / "xfails" / "transformers-quanto.txt").is_file()  # known failures: package data
    out = tmp_path / "conformance.json"
    argv = [str(python), "-m", "pytest", "--pyargs", "conformance", "--impl", "fp16", "--hypothesis-profile", "ci"]
    proc = _run([*argv, "-p", "no:cacheprovider", "-q", "--conformance-json", str(out)], work)
    assert "passed" in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
    results = json.loads(out.read_text())["results"]
    assert {r["implementation"] for r in results} == {"fp16"}
    # the ids are the suite's own wherever it is installed (its known-failure files and the report use them)
    assert all(r["module"].startswith("conformance/test_p") for r in results), {r["module"] for r in results}
    assert {r["outcome"] for r in results} <= {"passed", "skipped", "measured", "xfailed"}
    assert sum(r["outcome"] == "passed" for r in results) >= 20
    bench = tmp_path / "bench.json"
    argv = [str(python), "-m", "pytest", "--pyargs", "benchmarks.suites.test_fig6_memory", "-k", "feasibility"]
    options = ["--bench-scale", "tiny", "--benchmark-only", "--pnmix-budget-gib", "0", "--benchmark-json", str(bench)]
    proc = _run([*argv, *options, "-p", "no:cacheprovider", "-q"], work)
    assert "1 passed" in proc.stdout and "PN-Mix memory feasibility model" in proc.stdout, proc.stdout[-2000:]
    (timed,) = json.loads(bench.read_text())["benchmarks"]
    assert timed["group"] == "fig6-model" and timed["extra_info"]["suite"] == "fig6-model"


UNRELATED_CONFTEST = """
def pytest_addoption(parser):
    for name in ("--device", "--model-path", "--budget-gib", "--share-gpu", "--eval-speed"):  # names many use
        parser.addoption(name, default="theirs")
"""
UNRELATED_TEST = """
import pytest


@pytest.fixture
def impl():
    return "theirs"


@pytest.fixture
def record():
    return "theirs"


def test_their_own(impl, record, request):
    options = [request.config.getoption(name) for name in ("--device", "--model-path", "--budget-gib")]
    assert impl == record == "theirs" and options == ["theirs"] * 3
    import sys

    from benchmarks import plugin

    assert "pnmix.protocol" not in sys.modules  # no implementation was loaded (the Triton ones live there)
    assert not plugin.active(request.config)  # no GPU taken, no memory capped
"""


def test_the_plugin_changes_nothing_in_a_project_that_is_not_the_suite(tmp_path):
    """Installed, the plug-ins are loaded by every pytest run of the environment: in another project (its own
    --device, --model-path, --budget-gib, ... options, its own `impl` and `record` fixtures) they load no
    implementation, take no GPU, parametrize nothing, print nothing, write nothing."""
    (tmp_path / "conftest.py").write_text(UNRELATED_CONFTEST)
    (tmp_path / "test_theirs.py").write_text(UNRELATED_TEST)
    before = sorted(p.name for p in tmp_path.iterdir())
    pytest_in = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    helped = _run([*pytest_in, "--help"], tmp_path).stdout
    assert "--pnmix-device" in helped and "--pnmix-budget-gib" in helped  # loaded, through their entry points
    proc = _run([*pytest_in, "-q", "-rA"], tmp_path)
    assert "1 passed" in proc.stdout and "test_their_own[" not in proc.stdout, proc.stdout
    assert "pnmix conformance" not in proc.stdout and "PN-Mix memory" not in proc.stdout
    theirs = {"__pycache__", ".benchmarks"}  # Python's, and pytest-benchmark's storage, which it makes in any project
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in theirs) == before
