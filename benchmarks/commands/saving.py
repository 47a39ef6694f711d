"""The end of a run: its result files written into the output folder, or, where a write fails there
(a full disk, the folder removed meanwhile), into a new temporary folder, and one line saying where.

What a run measured is not lost to a fault at its last step: the files that could not go into
`--out` go into a folder made with `tempfile.mkdtemp` (the system's temporary folder, often another
disk), and the run ends with exit status 1 and one line naming the error and both places.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from reference import schema
from reference.records import as_stored, utc_stamp, write_atomic, write_json
from reference.schema import Kind


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


def write_result(
    prog: str,
    out: Path,
    kind: Kind,
    result: dict,
    *,
    extra: Mapping[str, Callable[[Path], object]] | None = None,
    compact: bool = False,
) -> Path:
    """The end of every tool's run, in one place: the result's markdown (`kind.render`) printed first (on screen
    whatever happens to the files), then `<kind>-<UTC stamp>.json` (the record; compact=True puts long series on
    one line), `.md` (the markdown) and `extra` files (suffix -> writer, e.g. ".png") written into `out` by
    `save`, and one line saying where. Returns the JSON's path."""
    # the markdown of the record as its file holds it (keys sorted): what a reader of the file renders again
    stored = as_stored(result)
    text = kind.render(stored)
    print(text)
    stem = f"{kind.name}-{utc_stamp()}"
    files = {
        f"{stem}.json": lambda p: write_json(p, result, compact=compact),
        f"{stem}.md": lambda p: write_atomic(p, text),
        **{f"{stem}{suffix}": write for suffix, write in (extra or {}).items()},
    }
    written = save(prog, out, files)
    others = ", ".join(p.suffix for p in written[2:])
    print(f"written to {written[1]} (and .json{', ' + others if others else ''})")
    # written all the same (a measurement is not lost to a fault of its record), and said: the report refuses it
    for line in schema.problems(kind, stored):
        print(f"{prog}: warning: the report cannot read this result: {line}", file=sys.stderr)
    return written[0]
