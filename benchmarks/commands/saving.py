"""The end of a run: its result files written into the output folder, or, where a write fails there
(a full disk, the folder removed meanwhile), into a new temporary folder, and one line saying where.

What a run measured is not lost to a fault at its last step: the files that could not go into
`--out` go into a folder made with `tempfile.mkdtemp` (the system's temporary folder, often another
disk), and the run ends with exit status 1 and one line naming the error and both places.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path


def save(prog: str, out: Path, files: Mapping[str, Callable[[Path], object]]) -> list[Path]:
    """Write each file: `files` maps a file name to a function that writes it at the path it is given.
    Returns the paths written in `out`; when some cannot be written there, writes those into a new
    temporary folder and ends the run (SystemExit: one line, exit status 1)."""
    written, failed = [], {}
    for name, write in files.items():
        try:
            write(out / name)
            written.append(out / name)
        except OSError as err:
            failed[name] = err
    if not failed:
        return written
    why = next(iter(failed.values()))
    names = ", ".join(failed)
    try:
        spare = Path(tempfile.mkdtemp(prefix=f"{prog.split()[-1]}-"))
        for name in failed:
            files[name](spare / name)
        where = f"kept in {spare}"
    except OSError as err:
        where = (
            f"lost: the temporary folder {tempfile.gettempdir()} cannot be written either "
            f"({err.strerror or err}); the figures printed above are what is left"
        )
    also = f"; {', '.join(p.name for p in written)} written in {out}" if written else ""
    raise SystemExit(f"{prog}: error: cannot write {names} in {out} ({why.strerror or why}): {where}{also}")
