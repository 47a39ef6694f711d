"""REPORT.md from its sections: title, contents, numbered sections; figures collected by file name."""

from __future__ import annotations

import re
from collections.abc import Sequence

from reports.markdown import Section


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def assemble(title: str, intro: str, sections: Sequence[Section]) -> tuple[str, dict[str, bytes]]:
    headings = [f"{i + 1}. {s.title}" for i, s in enumerate(sections)]
    lines = [f"# {title}", "", intro.rstrip(), "", "Contents:", ""]
    lines += [f"{i + 1}. [{s.title}](#{anchor(h)})" for i, (s, h) in enumerate(zip(sections, headings, strict=True))]
    figures: dict[str, bytes] = {}
    for s, h in zip(sections, headings, strict=True):
        lines += ["", f"## {h}", "", s.body.rstrip()]
        clash = figures.keys() & s.figures.keys()
        if clash:
            raise ValueError(f"two sections made figures named {sorted(clash)}")
        figures.update(s.figures)
    return "\n".join(lines) + "\n", figures
