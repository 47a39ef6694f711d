"""pytest plug-in the report's pytest steps load (`-p reports.progress`): after each test it writes
'<done> <total>' to the file PNMIX_PROGRESS names (nothing without it), so that `reports.steps`
shows how many tests of a step are done, and advances the report's progress bar by them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "PNMIX_PROGRESS"
_DONE = pytest.StashKey[int]()
_TOTAL = pytest.StashKey[int]()


def _write(config: pytest.Config) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    path = Path(target)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(f"{config.stash.get(_DONE, 0)} {config.stash.get(_TOTAL, 0)}\n", encoding="utf-8")
        os.replace(tmp, path)  # a reader sees the old count or the new one, never half a line
    except OSError:  # progress is shown, not needed: a folder that went away stops nothing
        pass


_CONFIG: list[pytest.Config] = []  # this process's config: pytest_runtest_logfinish is not given it


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_TOTAL] = len(session.items)
    session.config.stash[_DONE] = 0
    _write(session.config)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    if _CONFIG:
        config = _CONFIG[0]
        config.stash[_DONE] = config.stash.get(_DONE, 0) + 1
        _write(config)


def read(path: Path) -> tuple[int, int] | None:
    """(tests done, tests collected) as the plug-in last wrote them to `path`; None before it has."""
    try:
        done, total = (int(x) for x in path.read_text(encoding="utf-8").split())
    except (OSError, ValueError):
        return None
    return (done, total) if 0 <= done <= total and total > 0 else None
