"""Report folders: staged, then published whole; an existing one is replaced only when asked to.

A staging folder records the process that fills it (OWNER), so that a later run can remove one
left by a run killed before it could clean up, and never one that is still being filled.
Single files are written by `reference.records` (atomic, never over an existing file unasked).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from reference import records

#: In a staging folder: the report run filling it (pid and host), removed when the folder is published or kept.
OWNER = ".pnmix-report-owner.json"
MARK = "pnmix-report staging folder"


def new_folder(final: str | os.PathLike, *, force: bool = False) -> Path:
    """A hidden staging folder beside `final`, to be filled and then moved there by `publish`.

    Fails at once if `final` exists and force is False, so that a long run does not end in
    a refusal; `publish` checks again, since the folder may appear meanwhile.
    """
    final = Path(final)
    if final.exists() and not force:
        raise FileExistsError(f"{final} exists; choose another --name or pass --force to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        owner = {"mark": MARK, "pid": os.getpid(), "host": socket.gethostname()}
        (staging / OWNER).write_text(json.dumps(owner), encoding="utf-8")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


#: A staging folder's name as mkdtemp makes it: ".<final name>.<8 random characters>.tmp".
_STAGING_NAME = re.compile(r"(?<![\w.-])\.([\w.-]+?)\.[a-z0-9_]{8}\.tmp(?=/|\b|$)")


def as_published(text: str) -> str:
    """`text` with every staging folder named by the folder it is published as: the commands that the
    steps ran there (and that their result files record) point at paths a reader will find."""
    return _STAGING_NAME.sub(r"\1", text)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not); True when it cannot be told."""
    if os.name != "posix":
        return True  # os.kill would end the process there, not probe it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _owner(folder: Path) -> int | None:
    """The pid of the report run of this host that fills `folder`, None if it is not such a folder."""
    try:
        owner = json.loads((folder / OWNER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    ours = isinstance(owner, dict) and owner.get("mark") == MARK and owner.get("host") == socket.gethostname()
    return owner["pid"] if ours and isinstance(owner.get("pid"), int) else None


def remove_stale(folder: str | os.PathLike) -> list[tuple[Path, int]]:
    """Remove the staging folders in `folder` whose report run died without cleaning up (SIGKILL,
    power loss); (folder, pid) of each removed. Folders of running reports, of other hosts (a shared
    file system) and kept ones are left alone."""
    removed = []
    for p in sorted(Path(folder).glob(".*.tmp")) if Path(folder).is_dir() else ():
        if p.is_symlink() or not p.is_dir():  # never one of ours: mkdtemp makes a folder
            continue
        pid = _owner(p)
        if pid is not None and not _alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            if not os.path.lexists(p):  # said removed only when it is gone
                removed.append((p, pid))
    return removed


def _usual_modes(folder: Path) -> None:
    """Modes as if the user had made the folder and its files: mkdtemp and atomic writes (mkstemp) make
    them private (0700, 0600), which would leave a report unreadable to the others who may read it."""
    mask = records.umask()
    for path in [folder, *folder.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            path.chmod(0o777 & ~mask)
        elif stat.S_ISREG(mode):
            path.chmod((0o666 | (mode & 0o111)) & ~mask)


def _release(staging: Path) -> None:
    (staging / OWNER).unlink(missing_ok=True)
    _usual_modes(staging)


def keep(staging: str | os.PathLike) -> Path:
    """Keep a staging folder whose run could not publish it (its results are worth keeping): no later
    run removes it."""
    staging = Path(staging)
    _release(staging)
    return staging


def publish(staging: str | os.PathLike, final: str | os.PathLike, *, force: bool = False) -> Path:
    """Move the filled `staging` folder to `final`: readers see the old folder or the whole new one.

    An existing `final` is replaced only with force=True (it is moved aside first, then removed).
    """
    staging, final = Path(staging), Path(final)
    if final.exists() and not force:
        raise FileExistsError(f"{final} exists; choose another --name or pass --force to replace it")
    _release(staging)
    if not final.exists():
        try:
            os.rename(staging, final)  # atomic; fails if final appeared as a non-empty folder
            return final
        except OSError:
            if not final.exists():
                raise
    if not force:
        raise FileExistsError(f"{final} exists; choose another --name or pass --force to replace it")
    old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
    os.rename(final, old / final.name)
    os.rename(staging, final)
    shutil.rmtree(old)
    return final


def discard(staging: str | os.PathLike) -> None:
    """Remove a staging folder left by a run that failed."""
    shutil.rmtree(staging, ignore_errors=True)
