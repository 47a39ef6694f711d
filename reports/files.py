"""Result files: written atomically, and never over an existing file unless asked to."""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path


def utc_stamp() -> str:
    """A sortable UTC timestamp for default file names, unique to the microsecond."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S_%fZ")


def write_atomic(path: str | os.PathLike, text: str, *, overwrite: bool = False) -> Path:
    """Write `text` to `path` so that readers see the old file or the whole new one, never a part.

    Without overwrite=True an existing file is left alone and FileExistsError is raised,
    even if it appears while writing (the final step is an exclusive link).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; choose another path or allow overwriting explicitly")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
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


def write_json(path: str | os.PathLike, data: object, *, overwrite: bool = False) -> Path:
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", overwrite=overwrite)
