"""The task-accuracy section: numbers from the result's item outcomes, verdicts from the paired tests."""

import copy

from benchmarks.accuracy.stats import accuracy, margin_rule, paired
from reports import inputs
from reports.markdown import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED, NOT_MEASURED
from reports.sections import accuracy as section
from reports.tests import synthetic
from reports.tests.mdtables import table_after, tables_without_source


def load(tmp_path, data):
    return inputs.load(synthetic.write(tmp_path, "acc.json", data), "--input")


#: A short name for each claim of the section.
SHORT = {
    section.TABLE2: "Table 2",
    section.FIG3_FP16: "Fig. 3 close to FP16",
    section.FIG3: "Fig. 3 KIVI degrades",
    section.TABLE8: "Table 8",
}


def claims_of(tmp_path, data) -> dict:
    return {SHORT[c.claim]: c for c in section.render([load(tmp_path, data)]).claims}


def repeated(data: dict, k: int) -> dict:
    """The same outcomes k times over: k times the items, the same accuracies and differences."""
    for t in data["tasks"]:
        t["items"] *= k
    for r in data["runs"]:
        for task in r["results"].values():
            task["correct"] = task["correct"] * k
    return data


def test_fp16_near_chance_makes_a_task_uninformative(tmp_path):
    data = synthetic.task_accuracy()
    assert section.informative(data) == ["a_1k"]
    body = section.render([load(tmp_path, data)]).body
    tasks = {r["task"]: r for r in table_after(body, "Every task")}
    assert tasks["b_1k"]["informative"] == "no: FP16 near chance" and tasks["a_1k"]["informative"] == "yes"
    a = accuracy(data["runs"][0]["results"]["a_1k"]["correct"])
    assert tasks["a_1k"]["FP16"] == f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]"
    kivi = next(r for r in data["runs"] if r["label"] == "KIVI @ 1.5")["results"]["a_1k"]["correct"]
    d = paired(kivi, data["runs"][0]["results"]["a_1k"]["correct"])
    assert tasks["a_1k"]["KIVI @ 1.5"] == f"{accuracy(kivi).value:.2f} ({d.difference:+.2f}, p {d.p_value:.2g})"
    assert tables_without_source(body) == []


def test_the_claims_are_judged_on_the_paired_differences(tmp_path):
    s = section.render([load(tmp_path, synthetic.task_accuracy())])
    claims = {SHORT[c.claim]: c for c in s.claims}
    # PN-Mix at 2.25 bits answers every item as FP16 does, but 40 items cannot show it within 5 points
    assert claims["Table 2"].status == INCONCLUSIVE and "the items resolve 0." in claims["Table 2"].evidence
    assert claims["Fig. 3 close to FP16"].status == INCONCLUSIVE  # the same at 1.5 bits
    assert claims["Fig. 3 KIVI degrades"].status == CONFIRMED  # PN-Mix > KIVI beyond chance at 1.5 bits
    assert claims["Table 8"].status == CONFIRMED  # keys only lose 10 items of 40, values only none
    assert all(c.basis == "measured" and "135M-270M models" in c.evidence for c in s.claims)
    assert all("at 80% power" in c.evidence and "paired items, 90% interval" in c.evidence for c in s.claims)
    assert set(s.figures) == {"task-accuracy-1.png"}


def test_equivalence_to_fp16_needs_items_enough_to_show_it_within_the_margin(tmp_path):
    table2 = claims_of(tmp_path, repeated(synthetic.task_accuracy(), 10))["Table 2"]
    assert table2.status == CONFIRMED and "within +-0.05 of FP16" in table2.evidence and "400 items" in table2.evidence
    assert section.MARGIN_WHY in table2.evidence


def test_fig3_is_judged_below_2_25_bits_only(tmp_path):
    data = synthetic.task_accuracy()
    by = {r["label"]: r for r in data["runs"]}
    by["KIVI @ 1.5"]["results"]["a_1k"]["correct"] = list(by["PN-Mix @ 1.5"]["results"]["a_1k"]["correct"])
    by["KIVI @ 2.25"]["results"]["a_1k"]["correct"] = [0] * 20 + [1] * 20  # a KIVI drop at 2.25 counts for nothing
    fig3 = claims_of(tmp_path, data)["Fig. 3 KIVI degrades"]
    assert fig3.status == INCONCLUSIVE and "at 2.25 bits" not in fig3.evidence and "at 1.5 bits" in fig3.evidence
    by["KIVI @ 1.5"]["results"]["a_1k"]["correct"] = [1] * 40  # KIVI better than PN-Mix beyond chance
    by["PN-Mix @ 1.5"]["results"]["a_1k"]["correct"] = [0] * 12 + [1] * 28
    assert claims_of(tmp_path, data)["Fig. 3 KIVI degrades"].status == NOT_CONFIRMED


def test_generated_answers_are_judged_apart_from_chosen_ones(tmp_path):
    data = synthetic.task_accuracy()
    data["tasks"].append({"name": "a_gen_1k", "items": 40, "chance": 0.0, "output": "generate_until"})
    for r in data["runs"]:  # the same documents, every method producing the answer FP16 produces
        r["results"]["a_gen_1k"] = {"correct": [1] * 30 + [0] * 10}
    claims = section.render([load(tmp_path, data)]).claims
    table2 = [c for c in claims if c.claim.startswith("Table 2")]
    assert [("choosing among candidates" in c.evidence, "producing the answer" in c.evidence) for c in table2] == [
        (True, False),
        (False, True),
    ]
    fig3 = [c for c in claims if c.claim == section.FIG3]
    assert [c.status for c in fig3] == [CONFIRMED, INCONCLUSIVE]  # KIVI loses chosen answers, not produced ones


def test_a_method_that_loses_items_is_not_confirmed(tmp_path):
    data = synthetic.task_accuracy()
    for r in data["runs"]:
        if r["label"] == "PN-Mix @ 2.25":
            r["results"]["a_1k"]["correct"] = [0] * 20 + [1] * 20  # 16 of FP16's right answers lost
        if r["label"] == "values only (2-bit values, 8-bit keys)":
            r["results"]["a_1k"]["correct"] = [0] * 36 + [1] * 4
    claims = claims_of(tmp_path, data)
    assert claims["Table 2"].status == NOT_CONFIRMED and claims["Table 8"].status == NOT_CONFIRMED


def test_without_results_the_claims_are_not_measured():
    s = section.render([])
    assert {c.status for c in s.claims} == {NOT_MEASURED} and len(s.claims) == 4
    assert "run `pnmix-task-accuracy`" in s.body


def test_the_section_says_whether_the_items_resolve_five_points(tmp_path):
    body = section.render([load(tmp_path, synthetic.task_accuracy())]).body
    assert "choosing among candidates: 40 items on the informative tasks: this does not resolve a 5-point" in body


def test_a_budget_where_values_differ_does_not_count_for_fig3(tmp_path):
    data = synthetic.task_accuracy()
    for r in data["runs"]:
        if r["label"].startswith("KIVI @"):
            r["value_bits"] = 1.12  # KIVI-1's values: what differs is no longer the keys alone
    fig3 = claims_of(tmp_path, data)["Fig. 3 KIVI degrades"]
    assert fig3.status == NOT_MEASURED and fig3.evidence.startswith("no budget below 2.25 compares keys alone")
    assert fig3.evidence.count("not counted: values at 2.50 against 1.12 bits") == 1  # 1.5 bits: the one below


def test_table8_needs_its_interval_beyond_the_margin(tmp_path):
    data = synthetic.task_accuracy()
    keys = next(r for r in data["runs"] if r["label"].startswith("keys only"))
    keys["results"]["a_1k"]["correct"] = [0] * 10 + [1] * 30  # 10 lost, 4 gained against values only
    table8 = claims_of(tmp_path, data)["Table 8"]
    assert table8.status == INCONCLUSIVE and "neither within nor outside +-0.05" in table8.evidence
    # the bits of each side are said: they are not equal
    assert "keys only (2.50-bit keys, 16.00-bit values)" in table8.evidence
    assert "values only (8.25-bit keys, 2.50-bit values)" in table8.evidence


def test_table8_is_refuted_where_keys_and_values_alone_are_equivalent(tmp_path):
    """Keys alone within the margin of values alone, on enough items, refutes "keys alone hurt more"."""
    data = repeated(synthetic.task_accuracy(), 20)
    keys = next(r for r in data["runs"] if r["label"].startswith("keys only"))
    keys["results"]["a_1k"]["correct"] = list(
        next(r for r in data["runs"] if r["role"] == "baseline")["results"]["a_1k"]["correct"]
    )
    table8 = claims_of(tmp_path, data)["Table 8"]
    assert table8.status == NOT_CONFIRMED and "within +-0.05 of each other" in table8.evidence


def test_every_claim_is_a_row_even_when_no_result_ran_its_runs(tmp_path):
    data = synthetic.task_accuracy()
    data["runs"] = [r for r in data["runs"] if r["role"] != "table 8" and not r["label"].startswith("KIVI")]
    claims = claims_of(tmp_path, data)
    assert set(claims) == set(SHORT.values())
    assert claims["Table 8"].status == NOT_MEASURED and "keys only and values only" in claims["Table 8"].evidence
    assert claims["Fig. 3 KIVI degrades"].status == NOT_MEASURED
    assert "below 2.25" in claims["Fig. 3 KIVI degrades"].evidence
    assert claims["Table 2"].status != NOT_MEASURED


def renamed(data: dict, old: str, new: str) -> dict:
    for t in data["tasks"]:
        t["name"] = new if t["name"] == old else t["name"]
    for r in data["runs"]:
        r["results"] = {new if k == old else k: v for k, v in r["results"].items()}
    return data


def test_a_task_whose_answer_is_in_its_question_is_left_out_of_the_verdicts(tmp_path):
    data = renamed(synthetic.task_accuracy(), "a_1k", "pnmix_lo_arith_1k")  # FP16 well above chance on it
    assert section.answer_in_question("pnmix_lo_arith_1k") and not section.answer_in_question("pnmix_passkey_1k")
    assert section.informative(data) == []
    body = section.render([load(tmp_path, data)]).body
    tasks = {r["task"]: r for r in table_after(body, "Every task")}
    assert tasks["pnmix_lo_arith_1k"]["informative"] == "no: answer in the question"
    kept = renamed(synthetic.task_accuracy(), "a_1k", "pnmix_passkey_1k")
    assert section.informative(kept) == ["pnmix_passkey_1k"]


def test_a_result_with_exact_windowed_layers_says_what_its_bits_cover(tmp_path):
    data = synthetic.task_accuracy()
    plain = section.render([load(tmp_path, data)]).body
    assert "attention layers hold the method's cache" not in plain
    data["layers"] = {"quantized": 3, "total": 18}
    body = section.render([load(tmp_path, data)]).body
    assert "3 of 18 attention layers hold the method's cache" in body


def test_the_figure_titles_its_model_by_name_and_gives_each_series_its_own_marker(tmp_path, monkeypatch):
    """A figure's title names the model, not the path of the file on the machine that ran it; the runs drawn as
    single points (keys only, values only, own bits) are told apart by their markers, whatever their colours."""
    from reports import figures

    data = synthetic.task_accuracy()
    data["model"] = "gemma-3-270m (GGUF gemma.gguf; --model /root/.cache/somewhere/gemma.gguf)"
    drawn = {}

    def keep(draw, **kwargs):
        with figures.drawn(draw, **kwargs) as fig:
            (ax,) = fig.axes
            drawn["title"] = ax.get_title()
            handles, labels = figures.legend_entries([ax])
            drawn["markers"] = {
                lb: h.lines[0].get_marker() for h, lb in zip(handles, labels, strict=True) if hasattr(h, "lines")
            }
        return b""

    monkeypatch.setattr(figures, "png", keep)
    section.render([load(tmp_path, data)])
    assert drawn["title"] == "Task accuracy against key bits\ngemma-3-270m", drawn["title"]
    singles = {lb: m for lb, m in drawn["markers"].items() if lb.startswith(("keys only", "values only"))}
    assert len(singles) == 2 and len(set(singles.values())) == 2, drawn["markers"]


def test_runs_are_paired_by_design_and_budget_not_by_label(tmp_path):
    """Relabelled runs give the same verdicts on the same numbers: the report pairs PN-Mix and KIVI by the design
    and budget each run recorded, and finds Table 8's runs by their bits."""
    data = synthetic.task_accuracy()
    before = {c: (v.status, v.evidence) for c, v in claims_of(tmp_path, data).items()}
    relabelled = copy.deepcopy(data)
    for i, run in enumerate(relabelled["runs"]):
        run["label"] = f"run {i}"
    after = {c: (v.status, v.evidence) for c, v in claims_of(tmp_path, relabelled).items()}
    assert after == before and before["Fig. 3 KIVI degrades"][0] != NOT_MEASURED


def sized(n: int, lost: int, gained: int = 0) -> tuple[list[int], list[int]]:
    """(FP16, PN-Mix at 2.25) on an `n`-item task: FP16 right on 90%, PN-Mix losing `lost` of those and
    getting `gained` of FP16's wrong answers right."""
    right = n * 9 // 10
    fp16 = [1] * right + [0] * (n - right)
    pnmix = [0] * lost + [1] * (right - lost) + [1] * gained + [0] * (n - right - gained)
    return fp16, pnmix


def with_a_1k(data: dict, fp16: list[int], pnmix: list[int]) -> dict:
    """`data` with task a_1k replaced: FP16's and PN-Mix @ 2.25's outcomes as given, every other run FP16's."""
    data["tasks"][0]["items"] = len(fp16)
    for r in data["runs"]:
        r["results"]["a_1k"] = {"correct": pnmix if r["label"] == "PN-Mix @ 2.25" else fp16}
    return data


def test_a_small_drop_on_a_huge_sample_is_close_to_fp16(tmp_path):
    """The paper's own kind of gap, -0.6 points, measured on 20,000 items lies within the 5-point margin: the
    symmetric rule confirms "close to FP16", where a rule of "any drop beyond chance refutes" would not."""
    data = with_a_1k(synthetic.task_accuracy(), *sized(20_000, lost=120))
    table2 = claims_of(tmp_path, data)["Table 2"]
    assert paired(*reversed(sized(20_000, lost=120))).p_value < 1e-20  # a drop far beyond chance
    assert table2.status == CONFIRMED and "-0.006" in table2.rests_on


def test_an_interval_wholly_beyond_the_margin_refutes_closeness(tmp_path):
    data = with_a_1k(synthetic.task_accuracy(), *sized(4_000, lost=400))  # -10 points
    table2 = claims_of(tmp_path, data)["Table 2"]
    assert table2.status == NOT_CONFIRMED and "differs from FP16 by more than +-0.05" in table2.evidence


def test_a_drop_beyond_the_papers_own_inside_the_margin_says_so(tmp_path):
    """-4.5 points on 400 items: neither within the margin nor wholly outside it, but wholly below the paper's own
    -0.96 points."""
    data = with_a_1k(synthetic.task_accuracy(), *sized(400, lost=18))
    table2 = claims_of(tmp_path, data)["Table 2"]
    assert table2.status == NOT_CONFIRMED and "excludes the paper's own difference" in table2.evidence
    assert "a larger drop than the paper reports" in table2.evidence


def test_an_undecided_verdict_states_what_its_items_resolve_at_80_percent_power(tmp_path):
    table2 = claims_of(tmp_path, with_a_1k(synthetic.task_accuracy(), *sized(100, lost=6, gained=3)))["Table 2"]
    assert table2.status == INCONCLUSIVE
    m = margin_rule(*reversed(sized(100, lost=6, gained=3)), section.EQUIVALENCE_MARGIN)
    assert m.status == "undecided" and f"the items resolve {m.detectable:.3f}" in table2.evidence


def test_tasks_every_run_answers_perfectly_do_not_count_toward_closeness(tmp_path):
    """A task FP16 and PN-Mix both answer perfectly cannot tell them apart: pooled in, its items would pull the
    interval towards "close"; it is left out, and said."""
    data = synthetic.task_accuracy()
    data["tasks"].append({"name": "easy_1k", "items": 4000, "chance": 0.25})
    for r in data["runs"]:
        r["results"]["easy_1k"] = {"correct": [1] * 4000}
    table2 = claims_of(tmp_path, data)["Table 2"]
    assert "left out at ceiling or floor for both: easy_1k" in table2.evidence
    assert "on the same 40 items" in table2.evidence and table2.status == INCONCLUSIVE
    assert "per task (90% interval): a_1k +0.00" in table2.evidence


def test_fig3_judges_closeness_to_fp16_apart_from_kivi(tmp_path):
    """PN-Mix far below FP16 at 1.5 bits while KIVI is further below: the two parts of Fig. 3 get two rows, one
    not confirmed and one confirmed."""
    data = repeated(synthetic.task_accuracy(), 10)
    by = {r["label"]: r for r in data["runs"]}
    fp16 = by["FP16"]["results"]["a_1k"]["correct"]
    by["PN-Mix @ 1.5"]["results"]["a_1k"]["correct"] = [0] * 60 + fp16[60:]  # -15 points
    by["KIVI @ 1.5"]["results"]["a_1k"]["correct"] = [0] * 200 + fp16[200:]  # -50 points
    claims = claims_of(tmp_path, data)
    assert claims["Fig. 3 close to FP16"].status == NOT_CONFIRMED
    assert claims["Fig. 3 KIVI degrades"].status == CONFIRMED


def test_the_pooled_table_pools_each_view_apart(tmp_path):
    """The two views ask about the same documents: the table pools each apart, never both in one cell."""
    data = synthetic.task_accuracy()
    data["tasks"].append({"name": "a_gen_1k", "items": 40, "chance": 0.0, "output": "generate_until"})
    for r in data["runs"]:
        r["results"]["a_gen_1k"] = {"correct": [1] * 30 + [0] * 10}
    (row, *_) = table_after(section.render([load(tmp_path, data)]).body, "#### ")
    views = [k for k in row if k.endswith("vs FP16, McNemar p")]
    assert [v.split(":")[0] for v in views] == ["choosing among candidates", "producing the answer"]
    assert row[views[0]].startswith("0.900 [") and row[views[1]].startswith("0.750 [")


def with_main(data: dict, outcomes: list[int]) -> dict:
    """`data` with a run of the paper's main configuration of its own (role "main"), answering task a_1k so."""
    fp16 = data["runs"][0]
    main = copy.deepcopy(next(r for r in data["runs"] if r["label"] == "PN-Mix @ 2.25"))
    main.update(label="PN-Mix (the paper's main configuration)", role="main", budget=None, paper_main=True)
    main["results"] = {**fp16["results"], "a_1k": {"correct": outcomes}}
    data["runs"].append(main)
    return data


def test_table2_is_judged_on_the_papers_main_configuration_where_the_result_ran_it(tmp_path):
    """Table 2 reports H3(50%)L1, G = 128: where the sweep ran it beside a different 2.25-bit pick, the claim is
    that run's (here it loses every item the pick keeps); where it did not, the row says it judged the pick."""
    data = repeated(synthetic.task_accuracy(), 20)
    pick = claims_of(tmp_path, data)["Table 2"]
    assert pick.status == CONFIRMED and section.NOT_MAIN in pick.evidence
    lost = [0] * len(data["runs"][0]["results"]["a_1k"]["correct"])
    main = claims_of(tmp_path, with_main(data, lost))["Table 2"]
    assert main.status == NOT_CONFIRMED and section.MAIN in main.evidence and section.NOT_MAIN not in main.evidence


def with_control(data: dict, budget: float, outcomes: list[int]) -> dict:
    """`data` with the midpoint control at `budget` (KIVI's pick there at Eq. 7's midpoints) answering a_1k so."""
    kivi = next(r for r in data["runs"] if r["label"] == f"KIVI @ {budget:g}")
    control = copy.deepcopy(kivi)
    control.update(label=f"KIVI, Eq. 7 midpoints @ {budget:g}", role="control")
    control["results"]["a_1k"] = {"correct": outcomes}
    data["runs"].append(control)
    return data


def test_the_midpoint_control_splits_fig3s_gap_into_parts_that_add_up(tmp_path):
    """KIVI loses 10 of FP16's 36 right answers at 1.5 bits and PN-Mix none; a control that gets back 4 of them
    splits PN-Mix - KIVI (+0.25) into +0.10 from the 1-bit reconstruction and +0.15 from the rest, on the same
    items, in the section's table and in Fig. 3's row; a result without a control has no such table."""
    data = synthetic.task_accuracy()
    assert (
        section.gap_split(data, ["a_1k"]) == []
        and "Where Fig. 3's gap" not in section.render([load(tmp_path, data)]).body
    )
    fp16 = data["runs"][0]["results"]["a_1k"]["correct"]
    control = [0] * 6 + fp16[6:]  # 6 of the first 10 right answers lost, where KIVI loses 10
    data = with_control(data, 1.5, control)
    ((budget, whole, reconstruction, rest),) = section.gap_split(data, ["a_1k"])
    assert budget == 1.5 and (whole[0], reconstruction[0], rest[0]) == (0.25, 0.1, 0.15)
    assert whole[1] <= whole[0] <= whole[2] and reconstruction[1] <= 0.1 <= reconstruction[2]
    body = section.render([load(tmp_path, data)]).body
    (row,) = table_after(body, "Where Fig. 3's gap comes from")
    assert row["key budget"] == "1.5" and row["PN-Mix - KIVI"].startswith("+0.250 [")
    assert tables_without_source(body) == []
    fig3 = claims_of(tmp_path, data)["Fig. 3 KIVI degrades"]
    assert "of it, KIVI at Eq. 7 midpoints - KIVI +0.100 [" in fig3.evidence
