"""Markdown building blocks of the report: tables that always carry their source, sections, claims.

Every table goes through `table`, which writes a "Source:" line under it, so a number without
provenance cannot be rendered by accident. Text read from result files (names, devices, commands,
reasons) is markdown-safe only once `escape`d: `table` escapes every cell, header and source line,
`Citations`, `details` and `figure` their text, and a section escapes what it writes into prose.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from tabulate import tabulate

SOURCE = "Source: "
#: What ends a line for markdown or for `str.splitlines` (which the report's own markdown tools use).
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
#: A code span (CommonMark: a run of backticks closed by a run of the same length): markdown shows what is
#: inside as written and reads no HTML there, so escaping leaves it alone.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)")
#: A `<` not already escaped: the one character that can start HTML (a tag, a comment) in a line of markdown.
_OPEN = re.compile(r"(?<!\\)<")
#: Characters that HTML reads as markup (the summary of `details` is HTML, where backslashes do nothing).
_HTML = re.compile(r"&(?!(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});)|<|>")


def escape(text: object) -> str:
    """`text` made safe to place in a line of markdown, by markdown's own rules: control characters and
    line breaks become one space (a name cannot start a table row or a heading), a `<` outside code spans is
    backslash-escaped (no HTML of a result file reaches the page), and so is a `>` that starts the text
    (no block quote). Code spans are left as written: markdown reads no HTML there. Idempotent."""
    text = _BREAKS.sub(" ", str(text))
    out, at = [], 0
    for span in _CODE_SPAN.finditer(text):
        out += [_OPEN.sub("\\<", text[at : span.start()]), span.group(0)]
        at = span.end()
    out.append(_OPEN.sub("\\<", text[at:]))
    text = "".join(out)
    return "\\" + text if text.startswith(">") else text


def escape_html(text: object) -> str:
    """`text` made safe inside an HTML element of the page (where backslash escapes do nothing): line breaks
    become one space, `<`, `>` and an `&` that starts no character reference become character references."""
    names = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
    return _HTML.sub(lambda m: names[m.group(0)[0]], _BREAKS.sub(" ", str(text)))


def cell(value: object) -> object:
    """A table cell: text escaped, with `|` escaped too (a cell cannot end early); numbers as they are."""
    return escape(value).replace("|", "\\|") if isinstance(value, str) else value


def escaped(data: object) -> object:
    """A result's content with every text in it (keys and values) a safe table cell, for the markdown of
    a module that does not escape what it writes (`benchmarks.fidelity.claims.markdown`)."""
    if isinstance(data, dict):
        return {cell(k): escaped(v) for k, v in data.items()}
    if isinstance(data, list):
        return [escaped(v) for v in data]
    return cell(data)


@dataclasses.dataclass(frozen=True)
class Claim:
    """One of the paper's claims and what this report found about it.

    The status and the basis say one thing: a claim judged (confirmed or not) was judged on something
    measured or computed, and its basis says which ("measured", "computed", "measured here",
    "computed from ..."); a claim not measured here has basis "-", even when its evidence cites
    numbers of another setting (a smaller model, a proxy metric) that do not decide it."""

    claim: str  # restated from the paper, with where it says so
    status: str  # one of STATUSES
    basis: str  # what decided the status: starts with one of BASES, or "-" (nothing here decides it)
    evidence: str
    provenance: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.status == NOT_MEASURED and self.basis != "-":
            raise ValueError(f"basis must be '-' for a claim {NOT_MEASURED}, got {self.basis!r}")
        if self.status != NOT_MEASURED and not self.basis.startswith(BASES):
            raise ValueError(f"basis of a claim {self.status} must start with one of {BASES}, got {self.basis!r}")


CONFIRMED, NOT_CONFIRMED, NOT_MEASURED = "confirmed", "not confirmed", "not measured here"
#: Measured, but the items cannot tell: neither the claim nor its opposite beyond chance (the evidence
#: says what difference the items resolve).
INCONCLUSIVE = "inconclusive"
STATUSES = (CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE, NOT_MEASURED)
BASES = ("measured", "computed")


class Citations:
    """The sources of one section's tables, each described in full once (`legend`) and cited by a
    short label ("[F1]") under the tables and in the rows that use it."""

    def __init__(self, prefix: str):
        if not prefix.isalpha():
            raise ValueError(f"prefix must be letters (labels are prefix + number), got {prefix!r}")
        self.prefix = prefix
        self._labels: dict[str, str] = {}

    def cite(self, description: str) -> str:
        """The label of `description`, numbered in the order sources are first cited."""
        if not description:
            raise ValueError("description must say where the numbers come from, got an empty string")
        if description not in self._labels:
            self._labels[description] = f"[{self.prefix}{len(self._labels) + 1}]"
        return self._labels[description]

    def legend(self, heading: str = "Sources") -> str:
        """Every cited source, in full, under its label (nothing when none was cited)."""
        if not self._labels:
            return ""
        return f"{heading}:\n\n" + "\n".join(f"- {label} {escape(d)}" for d, label in self._labels.items()) + "\n"


@dataclasses.dataclass
class Section:
    """A report section: markdown body (without its heading), PNG figures by file name, claims."""

    title: str
    body: str
    figures: dict[str, bytes] = dataclasses.field(default_factory=dict)
    claims: list[Claim] = dataclasses.field(default_factory=list)


def table(rows: Sequence[Sequence], headers: Sequence[str], source: str, floatfmt: str | Sequence[str] = "g") -> str:
    """A GitHub table followed by its source line."""
    if not source:
        raise ValueError("source must say where the table's numbers come from, got an empty string")
    rows = [[cell(c) for c in row] for row in rows]
    md = tabulate(rows, headers=[cell(h) for h in headers], tablefmt="github", floatfmt=floatfmt)
    return md + f"\n\n{SOURCE}{escape(source)}\n"


def sources_under_tables(md: str, source: str) -> str:
    """Add `source` under every table of `md` that has no source line of its own (embedded markdown)."""
    lines, out = md.splitlines(), []
    for i, line in enumerate(lines):
        out.append(line)
        ends_table = line.startswith("|") and (i + 1 == len(lines) or not lines[i + 1].startswith("|"))
        if ends_table:
            following = next((x for x in lines[i + 1 :] if x.strip()), "")
            if not following.startswith(SOURCE):
                out += ["", SOURCE + escape(source)]
    return "\n".join(out) + "\n"


def demote(md: str, levels: int) -> str:
    """Push every heading of `md` down by `levels` (to embed a document under a section)."""
    return "\n".join("#" * levels + line if line.startswith("#") else line for line in md.splitlines()) + "\n"


def details(summary: str, body: str) -> str:
    """A collapsed block (GitHub renders markdown inside when blank lines surround it)."""
    return f"<details><summary>{escape_html(summary)}</summary>\n\n{body}\n</details>\n"


def figure(name: str, caption: str) -> str:
    """A figure of this report (`name`: a file name it writes) with its caption, escaped."""
    caption = escape(caption).replace("[", "\\[").replace("]", "\\]").replace("*", "\\*")
    return f"![{caption}]({name})\n\n*{caption}*\n"


def fmt(x: float | None, spec: str = ".3g", missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def ratio(x: float | None, base: float | None) -> float | None:
    """x / base, or None when either is missing (out of memory, not run) or base is zero."""
    if x is None or base is None or base == 0:
        return None
    return x / base
