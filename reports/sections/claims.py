"""The paper's claims, each confirmed, not confirmed, inconclusive or not measured here, with evidence."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from reports.markdown import STATUSES, Citations, Claim, Section, table

TITLE = "The paper's claims"


def claims_table(
    claims: Sequence[Claim], cite: Citations, numbered: bool = True, whose: str = "the claims are quoted from the paper"
) -> str:
    """The claims as a table whose source column cites each row's provenance by its label in `cite`
    (the full descriptions go once in `cite.legend()`); `whose` says where the claims come from."""
    rows = [
        [c.claim, f"**{c.status}**", c.basis, c.evidence, "-" if c.provenance == "-" else cite.cite(c.provenance)]
        for c in claims
    ]
    headers = ["claim (paper)", "status", "basis", "evidence", "source"]
    if numbered:
        rows, headers = [[i + 1, *r] for i, r in enumerate(rows)], ["#", *headers]
    return table(rows, headers, f"each row's source column (listed in this section); {whose}")


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
