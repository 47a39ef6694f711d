"""A result file is evidence as given, not signed: what the report checks of it. Its aggregates and verdicts
are recomputed from its own outcomes when it is read (a mismatch is refused, listed under History, and the
rest of the report renders), and current results that measured the same thing and disagree are named on
page 1."""

import copy
import json
from pathlib import Path

import pytest

from benchmarks.fidelity import long_output
from reports import cli, currency, inputs, schema
from reports.sections import accuracy
from reports.tests import synthetic
from reports.tests.mdtables import table_after
from reports.tests.test_report import NOTHING_RUN

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
LONG_OUTPUT = min(RESULTS.glob("long-output-*.json"), key=lambda p: p.stat().st_size)
EQUAL_BITS = max(RESULTS.glob("equal-bits-*.json"))
TASK_ACCURACY = min(RESULTS.glob("task-accuracy-*.json"))
ROLE_CALIBRATION = max(RESULTS.glob("role-calibration-*.json"))


def report(tmp_path: Path, *files: Path) -> str:
    argv = ["--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results", *NOTHING_RUN]
    assert cli.main([*argv, *(a for f in files for a in ("--input", str(f)))]) == 0
    return (tmp_path / "out" / "r" / "REPORT.md").read_text()


@pytest.fixture
def canaries_reproduce(monkeypatch):
    """Every recorded canary reproduces (running them takes 20 s; test_canaries tests them)."""
    monkeypatch.setattr(currency.canaries, "moved", lambda recorded, pipeline=None: [])


def test_committed_results_are_what_their_outcomes_give():
    for path in [LONG_OUTPUT, EQUAL_BITS, ROLE_CALIBRATION]:
        data = json.loads(path.read_text())
        assert schema.disagreements(inputs.kind_of(data, path), data) == [], path


def test_a_long_output_summary_its_series_do_not_give_is_refused_and_the_report_renders(tmp_path, canaries_reproduce):
    data = json.loads(LONG_OUTPUT.read_text())
    for prompt in data["per_prompt"]:  # PN-Mix's divergence edited down, its summary kept
        prompt["PN-Mix"]["kl"] = [x / 10 for x in prompt["PN-Mix"]["kl"]]
    edited = synthetic.write(tmp_path, "edited.json", data)
    source = inputs.load(edited, "--input")
    first = data["summary"]["methods"]["PN-Mix"]["kl"][0]
    assert source.refused.startswith(
        f"refused: its numbers are not what its own outcomes give: summary.methods['PN-Mix'].kl[0] is {first:.6g}, "
        f"its per_prompt series give {first / 10:.6g} (and "
    )
    md = report(tmp_path, edited)
    (row,) = table_after(md, "## 10. History")
    assert row["file"] == f"`{edited}`" and row["why not current"].startswith("refused: its numbers are not what")
    assert "or were refused" in md.split("## 2.")[0]
    assert f"`{edited}`" not in md.split("## 6.")[1].split("## 7.")[0]  # the long-output tables do not show it


def test_a_long_output_series_edited_with_its_summary_is_evidence_as_given(tmp_path):
    data = json.loads(LONG_OUTPUT.read_text())
    for prompt in data["per_prompt"]:
        prompt["PN-Mix"]["kl"] = [x / 10 for x in prompt["PN-Mix"]["kl"]]
    bins = len(data["summary"]["bin_edges"]) - 1
    data["summary"] = long_output.summarize(data["per_prompt"], bins)  # the tool's own summary of it
    assert inputs.load(synthetic.write(tmp_path, "both.json", data), "--input").refused == ""


@pytest.mark.parametrize("cut", ["a prompt's method", "a series' tail"])
def test_series_that_cannot_be_summarized_are_refused_saying_why(tmp_path, cut):
    data = json.loads(LONG_OUTPUT.read_text())
    if cut == "a prompt's method":
        del data["per_prompt"][-1]["PN-Mix"]
    else:
        data["per_prompt"][0]["PN-Mix"]["kl"] = data["per_prompt"][0]["PN-Mix"]["kl"][:5]
    refused = inputs.load(synthetic.write(tmp_path, "cut.json", data), "--input").refused
    assert refused.startswith("refused: its numbers are not what its own outcomes give: per_prompt: its series")


@pytest.mark.parametrize("edit", ["a verdict", "a result"])
def test_equal_bits_verdicts_its_results_do_not_give_are_refused(tmp_path, edit):
    """A result of older code (no per-conversation values) is checked as it was written, on the means."""
    data = json.loads(EQUAL_BITS.read_text())
    assert not any("per_conversation" in r for r in data["results"])
    claim = next(c for c in data["claims"] if "beats both" in c["claim"])
    if edit == "a verdict":
        claim["holds"] = not claim["holds"]
    else:  # the combination's KL set far below the others': the claim would hold, its verdict kept
        r = next(r for r in data["results"] if f"at {r['budget']} bits" in claim["claim"])
        metric = "attention_kl" if "attention KL" in claim["claim"] else "e2e_kl"
        r["methods"]["role-aware PN-Mix"][metric] = 0.0 if claim["holds"] is False else 1e3
    said = {True: "holds", False: "does not hold"}
    refused = inputs.load(synthetic.write(tmp_path, "eb.json", data), "--input").refused
    now = claim["holds"]
    assert refused == (
        "refused: its numbers are not what its own outcomes give: claims says "
        f"{claim['claim']!r} {said[now]}; its results say it {said[not now]}"
    )


@pytest.mark.parametrize("edit", ["bits", "average_bits"])
def test_role_allocations_their_calibration_does_not_give_are_refused(tmp_path, edit):
    data = json.loads(ROLE_CALIBRATION.read_text())
    given = data["allocations"][0]
    if edit == "bits":  # a tag moved to the other precision, the rest kept
        given["bits"][0] = 4 if given["bits"][0] == 2 else 2
    else:
        given["average_bits"] += 0.01
    refused = inputs.load(synthetic.write(tmp_path, "rc.json", data), "--input").refused
    assert refused.startswith(
        f"refused: its numbers are not what its own outcomes give: allocations[0] (budget {given['budget']:g}).{edit} "
    )
    assert "its calibration gives" in refused


def table2_run(data: dict) -> str:
    """The label of the run Table 2 is judged on: the paper's main configuration, else the 2.25-bit pick."""
    main = accuracy.main_run(data)
    return main["label"] if main is not None else "PN-Mix @ 2.25"


def flipped_table2(data: dict) -> dict:
    """`data` with the outcomes of Table 2's run set to FP16's: Table 2 then holds (the copy a tester edited)."""
    data = copy.deepcopy(data)
    runs = {r["label"]: r for r in data["runs"]}
    runs[table2_run(data)]["results"] = copy.deepcopy(runs["FP16"]["results"])
    return data


def test_edited_outcomes_beside_the_result_they_copy_are_named_on_page_1(tmp_path, canaries_reproduce):
    data = json.loads(TASK_ACCURACY.read_text())
    edited = flipped_table2(data)
    useful = accuracy.informative(edited)
    statuses = [accuracy._claims(d, useful, "-")[0].status for d in (data, edited)]
    assert statuses == ["not confirmed", "confirmed"]  # the two files' Table 2 rows contradict
    given = synthetic.write(tmp_path, "committed.json", data)
    copied = synthetic.write(tmp_path, "copy.json", edited)
    page1 = report(tmp_path, given, copied).split("## 2.")[0]
    runs, label = {r["label"]: r for r in data["runs"]}, table2_run(data)
    differ = {
        t: sum(a != b for a, b in zip(runs["FP16"]["results"][t]["correct"], r["correct"], strict=True))
        for t, r in runs[label]["results"].items()
    }
    first = next(t for t in (t["name"] for t in data["tasks"]) if differ[t])
    items = len(runs["FP16"]["results"][first]["correct"])
    assert "**Contradicting results**" in page1
    assert (
        f"- `{given}` and `{copied}` ran the same model, configuration and items and disagree: {label} on "
        f"{first} ({differ[first]} of {items} items)"
    ) in page1
    assert "they cannot both be right" in page1


def test_the_same_outcomes_twice_or_other_items_contradict_nothing(tmp_path):
    data = synthetic.task_accuracy()
    same = [inputs.load(synthetic.write(tmp_path, f"{i}.json", data), "--input") for i in range(2)]
    assert currency.contradictions(same) == []
    other = flipped_table2(data)
    other["task_files"] = {t["name"]: "another digest" for t in data["tasks"]}  # other documents
    assert currency.contradictions([same[0], inputs.load(synthetic.write(tmp_path, "o.json", other), "-")]) == []
    other["model_fingerprint"] = "sha256:another model"
    other.pop("task_files")
    assert currency.contradictions([same[0], inputs.load(synthetic.write(tmp_path, "m.json", other), "-")]) == []


def test_a_contradiction_across_devices_says_so(tmp_path):
    data = synthetic.task_accuracy()
    keys_only = next(r for r in data["runs"] if r["label"].startswith("keys only"))
    other = json.loads(json.dumps(data))  # the maker shares lists between runs
    next(r for r in other["runs"] if r["label"].startswith("keys only"))["results"]["a_1k"]["correct"][0] ^= 1
    other["device"] = "NVIDIA Other GPU"
    a, b = (inputs.load(synthetic.write(tmp_path, f"{n}.json", d), "-") for n, d in (("a", data), ("b", other)))
    (line,) = currency.contradictions([a, b])
    assert line == (
        f"`{a.name}` and `{b.name}` ran the same model, configuration and items and disagree: {keys_only['label']} "
        "on a_1k (1 of 40 items); they ran on cpu (x86_64) and NVIDIA Other GPU (with the library versions each "
        "records): check whether that explains it; otherwise they cannot both be right"
    )
