"""Atomic writes and report folders that are never replaced without being asked to."""

import pytest

from reports import files


def test_bytes_and_text_share_the_atomic_path(tmp_path):
    png = bytes(range(256))
    files.write_bytes_atomic(tmp_path / "a.png", png)
    files.write_atomic(tmp_path / "b.md", "zürich\n")
    assert (tmp_path / "a.png").read_bytes() == png
    assert (tmp_path / "b.md").read_bytes() == "zürich\n".encode()
    with pytest.raises(FileExistsError, match=r"a\.png exists"):
        files.write_bytes_atomic(tmp_path / "a.png", b"other")
    assert (tmp_path / "a.png").read_bytes() == png
    files.write_bytes_atomic(tmp_path / "a.png", b"other", overwrite=True)
    assert (tmp_path / "a.png").read_bytes() == b"other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.md"]  # no temporary files left


def test_a_report_folder_is_replaced_only_with_force(tmp_path):
    final = tmp_path / "r"
    first = files.new_folder(final)
    files.write_atomic(first / "REPORT.md", "one")
    assert files.publish(first, final) == final and (final / "REPORT.md").read_text() == "one"
    with pytest.raises(FileExistsError, match=r"r exists; .*--force"):
        files.new_folder(final)
    second = files.new_folder(final, force=True)
    files.write_atomic(second / "REPORT.md", "two")
    with pytest.raises(FileExistsError, match="--force"):
        files.publish(second, final)  # publish checks again: the folder may have appeared meanwhile
    assert (final / "REPORT.md").read_text() == "one"
    files.publish(second, final, force=True)
    assert (final / "REPORT.md").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no staging or old folders left


def test_discard_removes_a_staging_folder(tmp_path):
    staging = files.new_folder(tmp_path / "r")
    files.write_atomic(staging / "x", "y")
    files.discard(staging)
    assert list(tmp_path.iterdir()) == []
