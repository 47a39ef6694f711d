"""Section 8: the paper's claims, each confirmed, not confirmed or not measured here, with evidence."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from ..markdown import STATUSES, Claim, Section, table


def render(claims: Sequence[Claim]) -> Section:
    count = collections.Counter(c.status for c in claims)
    rows = [[i + 1, c.claim, f"**{c.status}**", c.basis, c.evidence, c.provenance] for i, c in enumerate(claims)]
    body = "\n".join(
        [
            "The paper's claims (restated from arXiv 2610.19605; the quoted numbers are the paper's) and what this "
            "report found. basis: measured (on the device named), computed (a formula of this project, exact for its "
            "assumptions but no measurement), or - (nothing here bears on it).\n",
            ", ".join(f"{count[s]} {s}" for s in STATUSES) + ".\n",
            table(
                rows,
                ["#", "claim (paper)", "status", "basis", "evidence", "provenance"],
                "the provenance column of each row; the claims are quoted from the paper",
            ),
        ]
    )
    return Section("The paper's claims", body)
