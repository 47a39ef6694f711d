"""Report folders that are never replaced without being asked to (single files: reference/tests/test_records.py)."""

import pytest

from reference.records import write_atomic
from reports import files


def test_a_report_folder_is_replaced_only_with_force(tmp_path):
    final = tmp_path / "r"
    first = files.new_folder(final)
    write_atomic(first / "REPORT.md", "one")
    assert files.publish(first, final) == final and (final / "REPORT.md").read_text() == "one"
    with pytest.raises(FileExistsError, match=r"r exists; .*--force"):
        files.new_folder(final)
    second = files.new_folder(final, force=True)
    write_atomic(second / "REPORT.md", "two")
    with pytest.raises(FileExistsError, match="--force"):
        files.publish(second, final)  # publish checks again: the folder may have appeared meanwhile
    assert (final / "REPORT.md").read_text() == "one"
    files.publish(second, final, force=True)
    assert (final / "REPORT.md").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no staging or old folders left


def test_discard_removes_a_staging_folder(tmp_path):
    staging = files.new_folder(tmp_path / "r")
    write_atomic(staging / "x", "y")
    files.discard(staging)
    assert list(tmp_path.iterdir()) == []
