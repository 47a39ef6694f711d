"""Markdown building blocks of the report: tables that always carry their source, sections, claims.

Every table goes through `table`, which writes a "Source:" line under it, so a number without
provenance cannot be rendered by accident. Text read from result files (names, devices, commands,
reasons) is markdown-safe only once `escape`d: `table` escapes every cell, header and source line,
`Citations`, `details` and `figure` their text, and a section escapes what it writes into prose.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

from tabulate import tabulate

SOURCE = "Source: "
#: What ends a line for markdown or for `str.splitlines` (which the report's own markdown tools use).
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
#: What markdown reads inline, outside code spans: a backslash escape (a backslash and an ASCII punctuation
#: character: CommonMark's only escapes), a run of backticks (a code span opens or stays text), a `<` (HTML or
#: an autolink), a `]` that closes a link or image (`](url)`, `][ref]`, `]: url`) and a `|` (a table cell).
_INLINE = re.compile(r"\\[!-/:-@\[-`{-~]|`+|<|\](?=[(\[:])|\|")
#: What ends or breaks a figure's caption, as the text of an image and in emphasis: every bracket and `*` too.
_CAPTION = re.compile(r"\\[!-/:-@\[-`{-~]|`+|<|[\[\]*]")
#: A `|` that a table reads as the end of a cell: one no backslash precedes (in a code span too).
_PIPE = re.compile(r"(?<!\\)\|")
#: Characters that HTML reads as markup (the summary of `details` is HTML, where backslashes do nothing).
_HTML = re.compile(r"&(?!(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});)|<|>")


@functools.lru_cache(maxsize=16)
def _closing(run: int) -> re.Pattern:
    """The end of a code span opened by `run` backticks: a run of exactly as many (CommonMark)."""
    return re.compile(rf"(?<!`)`{{{run}}}(?!`)")


def _escaped(text: str, special: re.Pattern, cell: bool, spans: bool = True) -> str:
    """`text` as markdown reads it left to right (CommonMark's order): a backslash escape stays as written; a
    code span (a run of backticks closed by a run of the same length) stays as written, its pipes escaped in a
    table `cell`; backticks that close no span (every backtick, without `spans`) are escaped; so is every other
    `special` match."""
    out, at = [], 0
    while (m := special.search(text, at)) is not None:
        token = m.group(0)
        out.append(text[at : m.start()])
        at = m.end()
        if token[0] == "\\" and len(token) == 2:
            out.append(token)
        elif token[0] == "`":
            close = _closing(len(token)).search(text, at) if spans else None
            if close is None:
                out.append("\\`" * len(token))
            else:
                span = text[m.start() : close.end()]
                out.append(_PIPE.sub(r"\\|", span) if cell else span)
                at = close.end()
        elif token == "|" and not cell:
            out.append(token)
        else:
            out.append("\\" + token)
    out.append(text[at:])
    return "".join(out)


def escape(text: object, *, cell: bool = False, spans: bool = True) -> str:
    """`text` made safe to place in a line of markdown, by markdown's own rules (CommonMark, GitHub's tables):
    control characters and line breaks become one space (a name cannot start a table row or a heading); outside
    code spans a `<` is backslash-escaped (no HTML or autolink of a result file reaches the page), and so are a
    `]` that would close a link or image, a backtick that opens no code span, and a `>` that starts the text (no
    block quote); in a table `cell`, every `|` (in code spans too: a cell cannot end early). Code spans are
    left as written (markdown reads no HTML there), and so are backslash escapes; without `spans`, for a text
    that another module places beside code spans of its own, every backtick is escaped (its own would pair
    with theirs). Idempotent. Texts of result files reach it already cut to `reports.inputs.MAX_TEXT`
    characters."""
    text = _escaped(_BREAKS.sub(" ", str(text)), _INLINE, cell, spans)
    return "\\" + text if text.startswith(">") else text


def escape_html(text: object) -> str:
    """`text` made safe inside an HTML element of the page (where backslash escapes do nothing): line breaks
    become one space, `<`, `>` and an `&` that starts no character reference become character references."""
    names = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
    return _HTML.sub(lambda m: names[m.group(0)[0]], _BREAKS.sub(" ", str(text)))


def cell(value: object) -> object:
    """A table cell: text escaped, its `|` too (a cell cannot end early); numbers as they are."""
    return escape(value, cell=True) if isinstance(value, str) else value


def escaped(data: object) -> object:
    """A result's content with every text in it (keys and values) safe in a table cell, in prose and in the
    code spans of a module that does not escape what it writes (`benchmarks.fidelity.claims.markdown`): no
    text carries a code span of its own."""
    if isinstance(data, dict):
        return {_piece(k): escaped(v) for k, v in data.items()}
    if isinstance(data, list):
        return [escaped(v) for v in data]
    return _piece(data)


def _piece(value: object) -> object:
    return escape(value, cell=True, spans=False) if isinstance(value, str) else value


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
    #: The one number the status rests on, in a few words (the claims table shows it; `evidence` goes below)
    rests_on: str = ""

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


#: Figures a section draws at most (about 0.3 s each, one or more per result): past them, its tables alone
#: show the other results and it says so (`undrawn`); a thousand results do not take a thousand figures.
MAX_FIGURES = 12


def undrawn(skipped: int, what: str) -> str:
    """What a section says of the `skipped` `what` (results, tables) it drew no figure for ("" for none)."""
    if skipped <= 0:
        return ""
    return (
        f"{skipped} more {what} have no figure here (a section draws at most {MAX_FIGURES} figures); the tables "
        "show every one.\n"
    )


def figure(name: str, caption: str) -> str:
    """A figure of this report (`name`: a file name it writes) with its caption, escaped."""
    caption = _escaped(_BREAKS.sub(" ", caption), _CAPTION, cell=False)
    return f"![{caption}]({name})\n\n*{caption}*\n"


def fmt(x: float | None, spec: str = ".3g", missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def ratio(x: float | None, base: float | None) -> float | None:
    """x / base, or None when either is missing (out of memory, not run) or base is zero."""
    if x is None or base is None or base == 0:
        return None
    return x / base
