"""Claims: a status and a basis that say one thing, each source described once, and the sections that
judge a claim saying the same as the claim."""

from pathlib import Path

import pytest

from reports import inputs
from reports.markdown import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED, NOT_MEASURED, Citations, Claim
from reports.sections import claims as claims_section
from reports.sections import fidelity, memory
from reports.tests import synthetic
from reports.tests.mdtables import table_after

COMMITTED_FIDELITY = max((Path(__file__).parents[2] / "benchmarks" / "results").glob("fidelity-*.json"))


@pytest.mark.parametrize(
    ("status", "basis", "says"),
    [
        (NOT_MEASURED, "measured", "basis must be '-' for a claim not measured here"),
        (NOT_MEASURED, "measured (proxy)", "basis must be '-'"),
        (CONFIRMED, "-", "basis of a claim confirmed must start with one of"),
        (NOT_CONFIRMED, "quoted", "basis of a claim not confirmed must start with one of"),
    ],
)
def test_a_status_and_basis_that_contradict_each_other_are_refused(status, basis, says):
    with pytest.raises(ValueError, match=says):
        Claim("c", status, basis, "evidence", "provenance")


@pytest.mark.parametrize(
    ("status", "basis"),
    [
        (NOT_MEASURED, "-"),
        (CONFIRMED, "measured"),
        (NOT_CONFIRMED, "computed"),
        (CONFIRMED, "measured here"),
        (CONFIRMED, "computed from the storage formula"),
    ],
)
def test_a_status_and_basis_that_agree_are_taken(status, basis):
    assert Claim("c", status, basis, "evidence", "provenance").basis == basis


def test_citations_describe_each_source_once():
    cite = Citations("X")
    assert [cite.cite("a"), cite.cite("b"), cite.cite("a")] == ["[X1]", "[X2]", "[X1]"]
    assert cite.legend() == "Sources:\n\n- [X1] a\n- [X2] b\n"
    assert Citations("Y").legend() == ""
    with pytest.raises(ValueError, match="description must say"):
        cite.cite("")
    with pytest.raises(ValueError, match="prefix must be letters"):
        Citations("1")


def test_the_claims_table_cites_each_provenance_once():
    long = "measured on cpu, 2026-12-01, command `x`, file `f.json`"
    claims = [
        Claim("a", CONFIRMED, "measured", "e1", long),
        Claim("b", NOT_CONFIRMED, "measured", "e2", long),
        Claim("c", NOT_MEASURED, "-", "nothing here", "-"),
    ]
    body = claims_section.render(claims).body
    rows = table_after(body, "1 confirmed")
    assert [r["source"] for r in rows] == ["[C1]", "[C1]", "-"]
    assert body.count(long) == 1 and f"- [C1] {long}" in body


def test_fidelity_claims_not_measured_here_have_no_basis():
    claims = {c.claim.split(":")[0]: c for c in fidelity.render([inputs.load(COMMITTED_FIDELITY, "committed")]).claims}
    fig5 = claims["Fig. 5"]
    assert (fig5.status, fig5.basis) == (NOT_MEASURED, "-") and "Qwen3-14B/32B, not run here" in fig5.evidence
    assert "Table 2" not in claims  # task accuracy is judged by the task-accuracy section, not by a proxy


def test_an_end_to_end_warning_is_said_once():
    source = inputs.load(COMMITTED_FIDELITY, "committed")
    e2e = source.data["end_to_end"]
    assert len(e2e["warnings"]) > 1  # the committed run warns for every method, in the same words
    section = fidelity.render([source])
    for warning in e2e["warnings"]:
        said = warning.split(": ", 1)[1]
        assert section.body.count(said) == 1, said
        assert not any(said in c.evidence for c in section.claims)
    merged = fidelity.merged_warnings(e2e)
    texts = list(dict.fromkeys(w.split(": ", 1)[1] for w in e2e["warnings"]))  # each wording once, in order
    assert merged == [", ".join(m for m in e2e["methods"] if f"{m}: {t}" in e2e["warnings"]) + f": {t}" for t in texts]
    assert len(merged) < len(e2e["warnings"])


def test_merged_warnings_keep_different_warnings_apart():
    warnings = ["KIVI-2: only 1 of 2", "KIVI-2 +32 sinks: only 1 of 2", "PN-Mix: only 2 of 4", "general"]
    e2e = {"methods": {"KIVI-2": {}, "KIVI-2 +32 sinks": {}, "PN-Mix": {}}, "warnings": warnings}
    assert fidelity.merged_warnings(e2e) == ["KIVI-2, KIVI-2 +32 sinks: only 1 of 2", "PN-Mix: only 2 of 4", "general"]


def _beside(body: str) -> dict[str, dict]:
    return {r["paper (quoted)"]: r for r in table_after(body, "### The model beside the paper")}


def test_the_memory_table_and_the_memory_claims_say_the_same():
    s = memory.render([])
    rows = _beside(s.body)
    assert len(rows) == len(s.claims) == len(memory.CLAIMS)
    for claim in s.claims:
        row = rows[claim.claim.split(": ", 1)[1]]
        word = {CONFIRMED: "yes", INCONCLUSIVE: "undecided"}.get(claim.status, "no")
        assert claim.basis == "computed" and row["agrees"] == word
    pnmix = next(c for c in s.claims if c.claim.startswith("Fig. 6b") and "PN-Mix runs" in c.claim)
    assert pnmix.status == CONFIRMED and "the model's largest batch: B = " in pnmix.evidence


def test_a_boundary_closer_to_the_budget_than_a_card_keeps_is_inconclusive_not_refuted():
    """FP16's 21st sequence at 8K: 39.59 GiB by the model, 0.41 GiB under the 40 GiB budget, where the paper ran out
    of memory. What a card keeps from tensors is not in the model, so it cannot say the paper is wrong there."""
    fp16 = next(c for c in memory.render([]).claims if "FP16's largest batch" in c.claim)
    assert fp16.status == INCONCLUSIVE, fp16
    assert "not decided by the model" in fp16.evidence and "B = 20, L_gen = 8192: model peak 38.43 GiB (fits)" in (
        fp16.evidence
    )


def test_measured_memory_points_decide_the_claims_and_the_table_shows_them(tmp_path):
    gpu = inputs.load(synthetic.write(tmp_path, "gpu.json", synthetic.gpu_benchmarks()), "--input")
    s = memory.render([gpu])
    rows = _beside(s.body)
    for claim in s.claims:
        row = rows[claim.claim.split(": ", 1)[1]]
        column = "measured agrees" if claim.basis == "measured" else "agrees"
        assert row[column] == ("yes" if claim.status == CONFIRMED else "no")
    assert [row["measured agrees"] for row in rows.values()] == ["-", "-", "yes", "yes"]


def test_each_memory_source_is_described_once():
    body = memory.render([]).body
    assert body.count(memory.MODEL_SOURCE) == 1 and body.count(memory.PAPER_SOURCE) == 1
    assert "Source: computed: the memory model [M1]" in body
