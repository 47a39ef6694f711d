"""Read GitHub tables back out of markdown, so tests compare numbers, not layout."""

from __future__ import annotations


def _cells(line: str) -> list[str]:
    parts, cell, escaped = [], "", False
    for ch in line.strip()[1:-1]:
        if ch == "|" and not escaped:
            parts.append(cell.strip())
            cell = ""
        else:
            cell += ch
        escaped = ch == "\\"
    return [*parts, cell.strip()]


def tables(md: str) -> list[tuple[int, list[dict[str, str]]]]:
    """Every table of `md` as (line index of its header, rows as {header: cell})."""
    lines = md.splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-:"):
            head = _cells(lines[i])
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(dict(zip(head, _cells(lines[j]), strict=True)))
                j += 1
            out.append((i, rows))
            i = j
        else:
            i += 1
    return out


def table_after(md: str, heading: str) -> list[dict[str, str]]:
    """The first table after the line that starts with `heading`."""
    start = next(i for i, line in enumerate(md.splitlines()) if line.startswith(heading))
    return next(rows for i, rows in tables(md) if i > start)


def tables_without_source(md: str) -> list[int]:
    """Header line indices of tables not followed (after blank lines) by a "Source:" line."""
    lines = md.splitlines()
    missing = []
    for i, rows in tables(md):
        end = i + 2 + len(rows)
        following = next((x for x in lines[end:] if x.strip()), "")
        if not following.startswith("Source: "):
            missing.append(i)
    return missing
