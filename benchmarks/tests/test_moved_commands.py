"""Every command is a console script; the names the commands had before the evidence folders
(`python -m benchmarks.X`) still run, for a release, after a one-line notice naming the script."""

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("old", "new"), sorted(benchmarks.MOVED.items()))
def test_a_moved_command_is_found_under_its_old_name(old, new):
    assert importlib.util.find_spec(old).origin == importlib.util.find_spec(new[0]).origin


@pytest.mark.parametrize(("old", "new"), sorted(benchmarks.MOVED.items()))
def test_each_moved_command_is_the_console_script_it_names(old, new):
    """The script the notice names is declared, and runs the module that holds the command."""
    module, script = new
    text = (ROOT / "pyproject.toml").read_text()
    assert f'{script} = "{module}:main"' in text


def test_a_moved_command_runs_under_its_old_name_after_one_line_naming_its_script():
    ran = subprocess.run(
        [sys.executable, "-m", "benchmarks.long_output", "--help"], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: pnmix-long-output")
    notes = [line for line in ran.stderr.splitlines() if "deprecated" in line]
    assert len(notes) == 1 and "`pnmix-long-output`" in notes[0], ran.stderr


def test_the_gpu_check_keeps_its_short_name_without_a_notice():
    """A GPU machine runs it from a checkout nothing was installed from: its short name is not deprecated."""
    ran = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--help"], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0 and "deprecated" not in ran.stderr, ran.stderr
    assert ran.stdout.startswith("usage: pnmix-gpu-check")


def test_the_module_that_holds_a_command_runs_without_a_notice():
    ran = subprocess.run(
        [sys.executable, "-m", "benchmarks.fidelity.long_output", "--help"], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0 and "deprecated" not in ran.stderr, ran.stderr


def test_an_unknown_name_is_still_unknown():
    assert importlib.util.find_spec("benchmarks.no_such_command") is None


def test_every_console_script_names_a_main_that_exists():
    import importlib

    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function, None)), name
