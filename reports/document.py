"""REPORT.md from its sections: title, contents, numbered sections; figures collected by file name."""

from __future__ import annotations

import re
from collections.abc import Sequence

from reports.markdown import Section


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def assemble(
    title: str, intro: str, sections: Sequence[Section], front: Section | None = None
) -> tuple[str, dict[str, bytes]]:
    """The report: title, intro, `front` (the first screen, unnumbered, before the contents), contents, sections."""
    headings = [f"{i + 1}. {s.title}" for i, s in enumerate(sections)]
    lines = [f"# {title}", "", intro.rstrip(), ""]
    if front is not None:
        lines += [f"## {front.title}", "", front.body.rstrip(), ""]
    lines += ["Contents:", ""]
    lines += [f"{i + 1}. [{s.title}](#{anchor(h)})" for i, (s, h) in enumerate(zip(sections, headings, strict=True))]
    figures: dict[str, bytes] = dict(front.figures) if front is not None else {}
    for s, h in zip(sections, headings, strict=True):
        lines += ["", f"## {h}", "", s.body.rstrip()]
        clash = figures.keys() & s.figures.keys()
        if clash:
            raise ValueError(f"two sections made figures named {sorted(clash)}")
        figures.update(s.figures)
    return "\n".join(lines) + "\n", figures
