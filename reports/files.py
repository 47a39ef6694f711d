"""Result files: written atomically, and never over an existing file unless asked to."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
from pathlib import Path


def utc_stamp() -> str:
    """A sortable UTC timestamp for default file names, unique to the microsecond."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S_%fZ")


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, overwrite: bool = False) -> Path:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part.

    Without overwrite=True an existing file is left alone and FileExistsError is raised,
    even if it appears while writing (the final step is an exclusive link).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; choose another path or allow overwriting explicitly")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path appeared meanwhile
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_atomic(path: str | os.PathLike, text: str, *, overwrite: bool = False) -> Path:
    """`write_bytes_atomic` for text (UTF-8)."""
    return write_bytes_atomic(path, text.encode("utf-8"), overwrite=overwrite)


def write_json(path: str | os.PathLike, data: object, *, overwrite: bool = False) -> Path:
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", overwrite=overwrite)


def new_folder(final: str | os.PathLike, *, force: bool = False) -> Path:
    """A hidden staging folder beside `final`, to be filled and then moved there by `publish`.

    Fails at once if `final` exists and force is False, so that a long run does not end in
    a refusal; `publish` checks again, since the folder may appear meanwhile.
    """
    final = Path(final)
    if final.exists() and not force:
        raise FileExistsError(f"{final} exists; choose another --name or pass --force to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))


def publish(staging: str | os.PathLike, final: str | os.PathLike, *, force: bool = False) -> Path:
    """Move the filled `staging` folder to `final`: readers see the old folder or the whole new one.

    An existing `final` is replaced only with force=True (it is moved aside first, then removed).
    """
    staging, final = Path(staging), Path(final)
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
