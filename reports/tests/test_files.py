"""Report folders that are never replaced without being asked to (single files: reference/tests/test_records.py)."""

import json
import os
import socket
import stat
import subprocess
import sys

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


@pytest.fixture
def umask():
    """Sets the process umask for one test."""
    before = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(before)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_published_report_has_the_modes_the_umask_gives(tmp_path, umask, mask):
    umask(mask)
    staging = files.new_folder(tmp_path / "r")
    write_atomic(staging / "data" / "result.json", "{}")  # atomic writes start private (0600)
    final = files.publish(staging, tmp_path / "r")
    assert stat.S_IMODE(final.stat().st_mode) == stat.S_IMODE((final / "data").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((final / "data" / "result.json").stat().st_mode) == 0o666 & ~mask
    assert sorted(p.name for p in final.rglob("*")) == ["data", "result.json"]  # the owner record is not published


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()  # reaped: its pid names no process
    return proc.pid


@pytest.mark.skipif(os.name != "posix", reason="processes are probed with signal 0")
def test_only_staging_folders_of_dead_runs_of_this_host_are_removed(tmp_path):
    live = files.new_folder(tmp_path / "live")  # this process's
    dead, elsewhere, kept = (files.new_folder(tmp_path / name) for name in ("dead", "elsewhere", "kept"))
    unmarked = tmp_path / ".someone.abc.tmp"
    unmarked.mkdir()
    pid = dead_pid()
    for folder, host in ((dead, socket.gethostname()), (elsewhere, "another-host"), (kept, socket.gethostname())):
        (folder / files.OWNER).write_text(json.dumps({"mark": files.MARK, "pid": pid, "host": host}))
    files.keep(kept)  # a run that failed after its steps kept its results there
    assert files.remove_stale(tmp_path) == [(dead, pid)]
    assert sorted(tmp_path.iterdir()) == sorted([live, elsewhere, kept, unmarked])


@pytest.mark.skipif(os.name != "posix", reason="processes are probed with signal 0; symbolic links")
def test_a_link_named_like_a_staging_folder_is_left_alone_and_never_said_removed(tmp_path):
    """Only a folder this code made (mkdtemp) can be a stale staging folder; a link to one is someone's."""
    target = tmp_path / "target"
    target.mkdir()
    (target / files.OWNER).write_text(json.dumps({"mark": files.MARK, "pid": dead_pid(), "host": socket.gethostname()}))
    out = tmp_path / "out"
    out.mkdir()
    link = out / ".r.planted.tmp"
    link.symlink_to(target)
    (out / ".file.tmp").write_text("not a folder")
    assert files.remove_stale(out) == []
    assert link.is_symlink() and (target / files.OWNER).exists() and (out / ".file.tmp").exists()


def test_a_full_disk_at_the_end_is_one_line_and_the_results_are_kept(tmp_path, capsys):
    from reports import cli

    staging = tmp_path / "staging"
    staging.mkdir()
    full = OSError(28, "No space left on device", str(staging / "REPORT.md"))
    assert cli.kept(staging, full) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert "the report could not be written (No space left on device: " in err
    assert f"results are kept in {cli.display_path(staging)}" in err


def test_text_names_a_staging_folder_by_the_folder_it_is_published_as(tmp_path):
    final = tmp_path / "report-x.y"
    staging = files.new_folder(final)
    command = f"python -m benchmarks --benchmark-json {staging}/data/bench.json --out reports/{staging.name}/data"
    shown = files.as_published(command)
    assert ".tmp" not in shown and staging.name not in shown
    assert shown == f"python -m benchmarks --benchmark-json {final}/data/bench.json --out reports/{final.name}/data"
    # names that only look alike stay as they are
    for other in ("notes.tmp", "a.report.tmp", ".report.abc.tmp", "x.report-x.abcdefgh.tmp"):
        assert files.as_published(other) == other
    files.discard(staging)
