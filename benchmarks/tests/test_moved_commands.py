"""Commands that moved into the evidence folders keep the names users type (`python -m benchmarks.X`)."""

import importlib.util
import subprocess
import sys

import pytest

import benchmarks


@pytest.mark.parametrize(("old", "new"), sorted(benchmarks.MOVED.items()))
def test_a_moved_command_is_found_under_its_old_name(old, new):
    assert importlib.util.find_spec(old).origin == importlib.util.find_spec(new).origin


def test_a_moved_command_runs_under_its_old_name():
    ran = subprocess.run(
        [sys.executable, "-m", "benchmarks.long_output", "--help"], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: python -m benchmarks.long_output")


def test_an_unknown_name_is_still_unknown():
    assert importlib.util.find_spec("benchmarks.no_such_command") is None
