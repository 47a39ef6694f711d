"""Report folders: staged, then published whole; an existing one is replaced only when asked to.

Single files are written by `reference.records` (atomic, never over an existing file unasked).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


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
