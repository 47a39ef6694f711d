"""How the report says where a number comes from: measured, computed or quoted (README, "Citing numbers")."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def display_path(path: str | os.PathLike) -> str:
    """A path relative to the repository when it is inside it (stable across machines), else absolute."""
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def measured(device: str, date: str, command: str | None, file: str, note: str | None = None) -> str:
    """`file` as the report shows it (`inputs.Source.name`); `note` says how (timing, workload)."""
    parts = [f"measured on {device}", date or "date not recorded"]
    parts.append(f"command `{command}`" if command else "command not recorded")
    if note:
        parts.append(note)
    parts.append(f"file `{file}`")
    return ", ".join(parts)


def computed(what: str) -> str:
    return f"computed: {what}"


def quoted(where: str) -> str:
    return f"quoted from the paper (arXiv 2610.19605, {where})"
