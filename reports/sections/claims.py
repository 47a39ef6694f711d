"""The paper's claims, each confirmed, not confirmed, inconclusive or not measured here, with evidence."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from reports.markdown import STATUSES, Citations, Claim, Section, details, table

TITLE = "The paper's claims"
#: The most characters of a claim's "rests on" cell made from its evidence (a claim that names its number
#: says it in `Claim.rests_on`).
GIST = 72


def gist(claim: Claim) -> str:
    """What a claim's status rests on, in a few words: its own `rests_on`, else the first clause of its
    evidence cut at a word (the whole evidence is under the table)."""
    if claim.rests_on:
        return claim.rests_on
    first = claim.evidence.split("; ")[0]
    if len(first) <= GIST:
        return first
    return first[: first.rfind(" ", 0, GIST - 1)].rstrip(",:;") + " ..."


def claims_table(
    claims: Sequence[Claim], cite: Citations, numbered: bool = True, whose: str = "the claims are quoted from the paper"
) -> str:
    """The claims as a table of verdicts, each with what it rests on and its source (cited by its label in
    `cite`: the full descriptions go once in `cite.legend()`), and every row's full evidence in a collapsed
    table under it; `whose` says where the claims come from."""
    source = f"each row's source column (listed in this section); {whose}"
    sources = ["-" if c.provenance == "-" else cite.cite(c.provenance) for c in claims]
    rows = [[c.claim, f"**{c.status}**", c.basis, gist(c), s] for c, s in zip(claims, sources, strict=True)]
    headers = ["claim (paper)", "status", "basis", "rests on", "source"]
    evidence = [[i + 1, c.evidence, s] for i, (c, s) in enumerate(zip(claims, sources, strict=True))]
    rows, headers = [[i + 1, *r] for i, r in enumerate(rows)], ["#", *headers]
    if not numbered:  # the rows are numbered for the evidence below only
        headers[0] = "row"
    return (
        table(rows, headers, source)
        + "\n"
        + details("the evidence of each row", table(evidence, [headers[0], "evidence", "source"], source))
    )


def render(claims: Sequence[Claim]) -> Section:
    count = collections.Counter(c.status for c in claims)
    cite = Citations("C")
    body = "\n".join(
        [
            "The paper's claims (restated from arXiv 2610.19605; the quoted numbers are the paper's) and what this "
            "report found. basis: what decided the status: measured (on the device named), computed (a formula of "
            "this project, exact for its assumptions but no measurement), or - (nothing here decides it: numbers in "
            "its evidence come from another setting).\n",
            ", ".join(f"{count[s]} {s}" for s in STATUSES) + ".\n",
            claims_table(claims, cite),
            cite.legend(),
        ]
    )
    return Section(TITLE, body)
