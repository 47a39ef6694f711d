"""--conformance-json: a path the result cannot be written to is refused before the run, not after it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_an_unwritable_conformance_json_stops_the_run_before_it_starts(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    target = tmp_path / "file" / "result.json"  # unwritable whoever runs the test, root included
    cmd = [sys.executable, "-m", "pytest", "conformance", "--impl", "reference", "--collect-only", "-q"]
    cmd += ["-p", "no:cacheprovider", "--conformance-json", str(target)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and len(said) == 1, said[-30:]
    assert said[0] == f"ERROR: --conformance-json {target}: cannot write there (File exists: {target.parent})"
