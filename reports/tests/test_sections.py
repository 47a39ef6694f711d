"""Sections rendered from synthetic inputs whose derived numbers are known by hand."""

import json
from pathlib import Path

import pytest

from benchmarks.efficiency import memory as bench_memory
from benchmarks.efficiency.architectures import ARCHITECTURES
from benchmarks.fidelity import claims as bench_fidelity
from reports import inputs
from reports.markdown import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED, NOT_MEASURED
from reports.sections import equal_bits, fidelity, memory, performance
from reports.tests import synthetic
from reports.tests.mdtables import table_after, tables, tables_without_source

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
COMMITTED_FIDELITY = max(RESULTS.glob("fidelity-*.json"))  # the newest


def load(tmp_path, name, data):
    return inputs.load(synthetic.write(tmp_path, name, data), "--input")


def fitted_slope_us(method):
    """Least squares by hand over the points of the 11K-31K window (the synthetic points are exactly linear)."""
    pts = [(s, synthetic.step_ms(method, s)) for s in synthetic.FIG7_STEPS if 11 * 1024 <= s <= 31 * 1024]
    n = len(pts)
    mx, my = sum(s for s, _ in pts) / n, sum(v for _, v in pts) / n
    return 1e3 * sum((s - mx) * (v - my) for s, v in pts) / sum((s - mx) ** 2 for s, _ in pts)


@pytest.fixture
def gpu(tmp_path):
    return [
        load(tmp_path, "gpu.json", synthetic.gpu_benchmarks()),
        load(tmp_path, "tiny.json", synthetic.tiny_benchmarks()),
    ]


def test_gpu_results_get_slopes_and_ratios_against_fp16_and_kitty(gpu):
    s = performance.render(gpu)
    assert "No GPU results" not in s.body and tables_without_source(s.body) == []
    slopes = {r["method"]: r for r in table_after(s.body, "#### Fig. 7")}
    for m in ("FP16", "Kitty", "PN-Mix"):
        assert float(slopes[m]["slope us/step"]) == pytest.approx(fitted_slope_us(m), abs=1e-3)
    assert float(slopes["PN-Mix"]["slope / Kitty"]) == pytest.approx(2.17 / 2.38, abs=1e-3)
    assert float(slopes["Kitty"]["slope / FP16"]) == pytest.approx(2.38 / 3.0, abs=1e-3)
    tp = {(int(r["batch"]), r["method"]): r for r in table_after(s.body, "#### Fig. 6c")}
    fig6c = synthetic.FIG6C
    assert float(tp[20, "PN-Mix"]["tok/s / FP16"]) == pytest.approx(fig6c["PN-Mix", 20] / fig6c["FP16", 20], abs=1e-3)
    assert float(tp[20, "PN-Mix"]["tok/s / Kitty"]) == pytest.approx(fig6c["PN-Mix", 20] / fig6c["Kitty", 20], abs=1e-3)
    assert tp[21, "FP16"]["tok/s"] == "OOM" and tp[110, "PN-Mix"]["tok/s / FP16"] == "-"  # no FP16 point there
    assert tp[20, "PN-Mix"]["paper tok/s"] == "420.8"
    kernel = {r["method"]: r for r in table_after(s.body, "#### Decode attention kernel")}
    k = synthetic.KERNEL
    assert float(kernel["PN-Mix"]["ms / Kitty"]) == pytest.approx(k["PN-Mix", 1, 8192] / k["Kitty", 1, 8192])
    assert float(kernel["PN-Mix"]["ms / FP16"]) == pytest.approx(k["PN-Mix", 1, 8192] / k["FP16", 1, 8192])
    assert set(s.figures) == {"fig6c-throughput-1.png", "fig7-latency-1.png", "kernel-bandwidth-1.png"}
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in s.figures.values())


def test_launch_choices_are_timed_against_the_default_and_judged(gpu):
    rows = table_after(performance.render(gpu).body, "#### Decode kernel launch choices")
    got = {(int(r["block_n"]), int(r["warps"]), int(r["stages"])): r for r in rows}
    assert next(iter(got)) == (64, 4, 2) and len(got) == len(synthetic.LAUNCH)  # the default first
    assert float(got[64, 4, 1]["ms / default"]) == pytest.approx(0.10 / 0.08)
    assert got[64, 4, 2]["error"] == "0.002 (within 0.01)" and got[32, 4, 2]["error"] == "0.5 (ABOVE 0.01)"
    assert got[128, 8, 3]["fits"] == "no" and got[128, 8, 3]["ms"] == "-" and got[128, 8, 3]["error"] == "-"


def test_the_ptx_switch_is_shown_with_the_path_each_launch_took(gpu):
    body = performance.render(gpu).body
    (row,) = table_after(body, "#### Decode kernel with the PTX unpack")
    assert row["path asked PTX took"] == "ptx" and row["bit-identical"] == "yes"
    assert float(row["PTX / plain"]) == pytest.approx(0.8)
    assert row["error plain / PTX"] == "0.001 / 0.001 (bound 0.01)"
    assert "not used here" not in body


def test_gpu_claims_follow_the_measured_numbers(gpu, tmp_path):
    claims = {c.claim.split(":")[0] + str(i): c for i, c in enumerate(performance.render(gpu).claims)}
    assert [c.status for c in claims.values()] == [CONFIRMED] * 4
    assert all(c.basis == "measured" and "gpu.json" in c.provenance for c in claims.values())
    steeper = synthetic.gpu_benchmarks()
    for b in steeper["benchmarks"]:  # PN-Mix's latency now grows faster than Kitty's
        if b["extra_info"]["suite"] == "fig7-latency" and b["extra_info"]["method"] == "PN-Mix":
            b["extra_info"]["step_ms"] = 45.0 + 3.5e-3 * b["extra_info"]["step"]
    statuses = [c.status for c in performance.render([load(tmp_path, "steeper.json", steeper)]).claims]
    assert statuses == [CONFIRMED, CONFIRMED, NOT_CONFIRMED, NOT_CONFIRMED]


def test_without_gpu_results_the_report_says_so_and_lists_the_tiny_harness(gpu):
    s = performance.render(gpu[1:])
    assert "**No GPU results.**" in s.body and s.figures == {}
    tiny = table_after(s.body, "### CPU tiny harness")
    assert [(r["method"], r["value"]) for r in tiny] == [("FP16", "1"), ("PN-Mix", "2")]
    assert "not predictive of GPU performance" in s.body
    assert "The `fig6-model` benchmark is computed, not measured" in s.body and "not used here" not in s.body
    assert {c.status for c in s.claims} == {NOT_MEASURED}


def test_tiny_harness_timings_show_their_spread_and_rank_nothing(tmp_path):
    first, second = synthetic.tiny_benchmarks(), synthetic.tiny_benchmarks()
    first["benchmarks"][0]["stats"] = {"median": 0.5, "min": 0.4, "max": 0.9, "rounds": 5}  # FP16
    first["benchmarks"][1]["stats"] = {"median": 0.25, "min": 0.25, "max": 0.25, "rounds": 1}  # PN-Mix
    second["benchmarks"][0]["stats"] = {"median": 1.65, "min": 1.65, "max": 1.65, "rounds": 1}
    second["benchmarks"][0]["options"] = {"timer": "CLOCK"}  # the suite's clock: its rounds are the decode steps
    for b in second["benchmarks"][:2]:
        b["extra_info"]["date_utc"] = "2026-12-02T10:00:00+00:00"
    s = performance.render([load(tmp_path, "a.json", first), load(tmp_path, "b.json", second)])
    rows = table_after(s.body, "### CPU tiny harness")
    fp16 = [r for r in rows if r["method"] == "FP16"]
    assert {r["rounds"] for r in fp16} == {"400-900 (5 rounds)", "none measured (1 round)"}
    assert sorted(r["timed"] for r in rows) == ["a step", "the point", "the point", "the point"]
    assert {r["across runs"] for r in fp16} == {"3.30x over 2 runs"}
    assert {r["across runs"] for r in rows if r["method"] == "PN-Mix"} == {"2.00x over 2 runs"}
    assert "No method is ranked on these timings" in s.body
    assert "varied up to 3.30x (FP16, fig7-latency, batch 1, prompt 40, step 10)" in s.body
    assert "2 of 4 points ran one round" in s.body


def test_evaluation_speed_is_shown_against_fp16_through_the_same_path_and_is_no_gpu_result(tmp_path):
    s = performance.render([load(tmp_path, "speed.json", synthetic.eval_speed_benchmarks())])
    rows = {r["method"]: r["item, 1024 tokens"] for r in table_after(s.body, "Evaluation speed through")}
    assert rows == {"FP16": "8 s (1.00x)", "PN-Mix": "8.8 s (1.10x)", "KIVI-2": "10.4 s (1.30x)"}
    assert "**No GPU results.**" in s.body and "evaluation speed" in s.title
    assert {c.status for c in s.claims} == {NOT_MEASURED}


def test_evaluation_speed_compares_each_method_with_the_fp16_run_timed_beside_it(tmp_path):
    beside = {"FP16": 8.0, "PN-Mix": 11.0, "KIVI-2": 8.0}  # the machine was slower while PN-Mix's pair ran
    s = performance.render([load(tmp_path, "speed.json", synthetic.eval_speed_benchmarks(beside))])
    rows = {r["method"]: r["item, 1024 tokens"] for r in table_after(s.body, "Evaluation speed through")}
    assert rows == {"FP16": "8 s (1.00x)", "PN-Mix": "8.8 s (0.80x)", "KIVI-2": "10.4 s (1.30x)"}


def test_gpu_check_says_how_each_step_ended_and_brings_its_benchmark_file(tmp_path):
    synthetic.write(tmp_path, "gpu-check-GPU-1.json", synthetic.gpu_check("bench-GPU-1.json"))
    synthetic.write(tmp_path, "bench-GPU-1.json", synthetic.gpu_benchmarks())
    sources = inputs.load_all([tmp_path / "gpu-check-GPU-1.json"], "--input")  # the record alone is given
    assert sorted(s.kind for s in sources) == ["gpu-check", "pytest-benchmark"]
    s = performance.render(sources)
    assert "`pytest conformance pnmix --impl triton` exited 0 after 120.0 s" in s.body
    assert "`pytest benchmarks/suites --bench-scale full` exited 1 after 300.0 s" in s.body
    assert "No GPU results" not in s.body


def test_measured_memory_points_decide_the_memory_claims(gpu):
    s = memory.render(gpu)
    rows = table_after(s.body, "### Measured on a GPU")
    assert [(r["method"], r["batch"], r["outcome"]) for r in rows] == [
        ("FP16", "20", "fits"),
        ("FP16", "21", "OOM"),
        ("PN-Mix", "110", "fits"),
    ]
    assert rows[0]["measured - model"] == "+1.50" and rows[0]["paper GiB"] == "38.48"
    # Fig. 6a has no measured point here (the model decides); Fig. 6b's points are measured and agree
    assert [(c.basis, c.status) for c in s.claims] == [
        ("computed", CONFIRMED),
        ("computed", CONFIRMED),
        ("measured", CONFIRMED),
        ("measured", CONFIRMED),
    ]
    arch = ARCHITECTURES["Qwen3-8B"]
    fig6a = {int(r["L_gen"]): r for r in table_after(s.body, "### Fig. 6a")}
    assert fig6a[32768]["PN-Mix"] == f"{bench_memory.point(arch, 'PN-Mix', 32, 32768).peak_gib:.2f}"
    assert fig6a[8192]["FP16"].endswith("OOM")


def test_fidelity_claims_follow_the_module_verdicts():
    source = inputs.load(COMMITTED_FIDELITY, "committed")
    s = fidelity.render([source])
    per_prompt = source.data.get("per_prompt")
    verdicts = bench_fidelity.verdicts(source.data["summary"], source.data.get("model"), per_prompt)
    claims = {c.claim.split(":")[0]: c for c in s.claims}
    holds = bench_fidelity.claim_holds(source.data["summary"], per_prompt)
    status = {True: CONFIRMED, False: NOT_CONFIRMED, bench_fidelity.UNDECIDED: INCONCLUSIVE}
    for key, where in (("fig4", "Fig. 4"), ("table9", "Table 9"), ("table11", "Table 11")):
        assert claims[where].status == status[holds[key]]
    assert claims["Table 9"].evidence == verdicts["table9"]
    assert claims["Fig. 5"].status == NOT_MEASURED and "Table 2" not in claims
    share = json.loads(COMMITTED_FIDELITY.read_text())["summary"]["fig5_share_median"]["10"]
    assert f"{share:.1%}" in s.body and tables_without_source(s.body) == []
    assert set(s.figures) == {"fig4-jaccard.png", "fig5-importance-share.png"}


def test_long_output_tables_and_curves_come_from_the_results(tmp_path):
    per_prompt = [
        {"PN-Mix": {"kl": [0.125, 0.375], "top1": [1.0, 0.0], "nll": [1.0, 2.0]}, "FP16": {"nll": [0.5, 1.5]}}
    ]
    data = synthetic.long_output(per_prompt, 2, command="python -m benchmarks.long_output --tokens 2")
    s = fidelity.render([], "", [load(tmp_path, "long.json", data)])
    assert "### Fidelity over long outputs" in s.body and "0.125" in s.body and "0.375" in s.body
    assert tables_without_source(s.body) == [] and set(s.figures) == {"long-output-1.png"}


def _long_result(
    pnmix_kl, kivi_kl, fp16_nll, bits=(2.263, 2.263), command="python -m benchmarks.long_output", prompts=8
):
    """A long-output result of `prompts` prompts with the same curves each (a verdict needs 8 prompts)."""
    ones = [1.0] * len(pnmix_kl)
    per_prompt = [
        {
            "PN-Mix": {"kl": list(pnmix_kl), "top1": ones, "nll": ones},
            "KIVI-2": {"kl": list(kivi_kl), "top1": ones, "nll": ones},
            "FP16": {"nll": list(fp16_nll)},
        }
        for _ in range(prompts)
    ]
    key_bits = dict(zip(("PN-Mix", "KIVI-2"), bits, strict=True))
    return synthetic.long_output(per_prompt, 8, command=command, key_bits=key_bits)


EQUAL = (2.263, 2.263)  # key bits of PN-Mix and KIVI-2


@pytest.mark.parametrize(
    ("pnmix", "kivi", "nll", "bits", "expected"),
    [
        # KL grows for both, PN-Mix below KIVI in every quarter
        ([0.1] * 4 + [0.2] * 4, [0.3] * 4 + [0.5] * 4, [1.0] * 8, EQUAL, (CONFIRMED, CONFIRMED)),
        # KL falls for KIVI; PN-Mix above KIVI in the last quarter only
        ([0.1] * 6 + [0.6] * 2, [0.3] * 6 + [0.2] * 2, [1.0] * 8, EQUAL, (NOT_CONFIRMED, NOT_CONFIRMED)),
        # no equal-bit rival
        ([0.1] * 4 + [0.2] * 4, [0.3] * 4 + [0.5] * 4, [1.0] * 8, (2.263, 2.9), (CONFIRMED, NOT_MEASURED)),
        # KL falls while FP16's own text gets predictable: what the text alone would do, so no evidence either way
        ([0.3] * 4 + [0.2] * 4, [0.5] * 4 + [0.3] * 4, [1.0] * 4 + [0.1] * 4, EQUAL, (INCONCLUSIVE, CONFIRMED)),
        # KL grows even though FP16's own text gets predictable: drift beyond what the text hides
        ([0.1] * 4 + [0.2] * 4, [0.3] * 4 + [0.5] * 4, [1.0] * 4 + [0.1] * 4, EQUAL, (CONFIRMED, CONFIRMED)),
    ],
)
def test_long_output_claims_are_judged_on_the_curves(tmp_path, pnmix, kivi, nll, bits, expected):
    from reports.sections import long_output as long_section

    claims = long_section.claims([load(tmp_path, "long.json", _long_result(pnmix, kivi, nll, bits))])
    assert [c.status for c in claims] == list(expected)
    assert all(c.claim.startswith("Error over long outputs") for c in claims)
    assert ("more predictable" in claims[0].evidence) == (nll[-1] < nll[0] / 4)
    if expected[1] != NOT_MEASURED:
        assert "PN-Mix (2.263 key bits)" in claims[1].evidence and "KIVI-2 (2.263 key bits)" in claims[1].evidence


def test_long_output_claims_need_eight_prompts(tmp_path):
    """Three prompts that all agree decide nothing: a sign test over them cannot reach 5%, and the row says
    how many prompts a verdict needs."""
    from reports.sections import long_output as long_section

    few = _long_result([0.1] * 4 + [0.2] * 4, [0.3] * 4 + [0.5] * 4, [1.0] * 8, prompts=3)
    claims = long_section.claims([load(tmp_path, "long.json", few)])
    assert [c.status for c in claims] == [INCONCLUSIVE, INCONCLUSIVE]
    assert all("3 prompts kept per prompt: a verdict over prompts needs at least 8" in c.evidence for c in claims)


def test_long_output_claims_rest_on_a_run_that_can_decide_before_a_longer_one_that_cannot(tmp_path):
    """Three prompts of long outputs and twelve of shorter ones: the claims rest on the twelve (three prompts
    decide nothing), and on the longer run again once it too has enough prompts."""
    from reports.sections import long_output as long_section

    grows = ([0.1] * 4 + [0.2] * 4, [0.3] * 4 + [0.5] * 4, [1.0] * 8)
    short = _long_result(*grows, prompts=12)
    long_few = _long_result(*grows, prompts=3)
    long_few["summary"] = {**long_few["summary"], "positions": 4 * short["summary"]["positions"]}
    sources = [load(tmp_path, "short.json", short), load(tmp_path, "long.json", long_few)]
    assert [Path(s.name).name for s in long_section.primaries(sources)] == ["short.json"]
    assert [c.status for c in long_section.claims(sources)] == [CONFIRMED, CONFIRMED]
    long_many = _long_result(*grows, prompts=8)
    long_many["summary"] = {**long_many["summary"], "positions": 4 * short["summary"]["positions"]}
    sources.append(load(tmp_path, "long8.json", long_many))
    assert [Path(s.name).name for s in long_section.primaries(sources)] == ["long8.json"]
    # as long and as many prompts: the one whose FP16 text loops on fewer prompts, whatever its date
    looping = {**long_many, "loop_onsets": [40] * 3 + [None] * 5, "date_utc": "2099-01-01T00:00:00+00:00"}
    calm = {**long_many, "loop_onsets": [None] * 7 + [50], "date_utc": "2000-01-01T00:00:00+00:00"}
    sources += [load(tmp_path, "looping.json", looping), load(tmp_path, "calm.json", calm)]
    assert [Path(s.name).name for s in long_section.primaries(sources)] == ["calm.json"]


def test_long_output_claims_are_decided_prompt_by_prompt_not_on_the_mean(tmp_path):
    """PN-Mix far lower on half the prompts and a little higher on the other half has the lower mean, but the
    prompts disagree: no ordering beyond chance."""
    from reports.sections import long_output as long_section

    data = _long_result([0.1] * 8, [0.3] * 8, [1.0] * 8, prompts=12)
    for prompt in data["per_prompt"][6:]:
        prompt["PN-Mix"] = {**prompt["PN-Mix"], "kl": [0.35] * 8}
    data["summary"] = synthetic.bench_long.summarize(data["per_prompt"], 8)
    lowest = long_section.claims([load(tmp_path, "long.json", data)])[1]
    assert data["summary"]["methods"]["PN-Mix"]["kl"][0] < data["summary"]["methods"]["KIVI-2"]["kl"][0]
    assert lowest.status == INCONCLUSIVE and "Q1 vs KIVI-2: 6 of 12 (p 1)" in lowest.evidence


def test_long_output_claims_are_not_judged_on_a_smoke_run(tmp_path):
    from reports.sections import long_output as long_section

    smoke = _long_result([0.1] * 8, [0.3] * 8, [1.0] * 8, command="python -m benchmarks.long_output --smoke")
    assert {c.status for c in long_section.claims([load(tmp_path, "long.json", smoke)])} == {NOT_MEASURED}
    assert {c.status for c in fidelity.render([], "", []).claims if c.claim.startswith("Error over")} == {NOT_MEASURED}


def test_each_model_has_long_output_claims_of_its_own(tmp_path):
    from reports.sections import long_output as long_section

    grows = _long_result([0.1] * 4 + [0.2] * 4, [0.3] * 4 + [0.5] * 4, [1.0] * 8)
    falls = {**_long_result([0.1] * 6 + [0.6] * 2, [0.3] * 6 + [0.2] * 2, [1.0] * 8), "model": "other (y)"}
    claims = long_section.claims([load(tmp_path, "a.json", grows), load(tmp_path, "b.json", falls)])
    assert [(c.status, c.evidence.split(":")[0]) for c in claims] == [
        (CONFIRMED, "M (x)"),
        (CONFIRMED, "M (x)"),
        (NOT_CONFIRMED, "other (y)"),
        (NOT_CONFIRMED, "other (y)"),
    ]
    assert [c.status for c in long_section.claims([load(tmp_path, "a.json", grows)])] == [CONFIRMED, CONFIRMED]


def _source_lines(md: str) -> list[tuple[set[str], str]]:
    """(headers, source line) of every table of `md`."""
    lines = md.splitlines()
    return [(set(rows[0]), next(x for x in lines[i + 2 + len(rows) :] if x.strip())) for i, rows in tables(md)]


def _listed(source: str, kind: str) -> set[str]:
    """The columns a source line names after "measured: " or "computed: " (up to ";" or " (")."""
    return set(source.split(f"; {kind}: ", 1)[1].split(";")[0].split(" (")[0].split(", "))


def test_equal_bits_tables_say_which_columns_are_measured_and_which_computed():
    sources = [inputs.load(p, "committed") for p in sorted(RESULTS.glob("equal-bits-*.json"))]
    body = equal_bits.render(sources).body
    budgets = memories = 0
    for headers, source in _source_lines(body):
        if "attn KL" in headers:  # a budget's table: every figure column measured or computed, none both
            measured, computed = _listed(source, "measured"), _listed(source, "computed")
            assert measured | computed == headers - {"method", "config"} and not measured & computed, source
            budgets += 1
        elif "Fig. 6b: max B at 8K" in headers:  # the storage models', nothing measured in it
            assert source.startswith("Source: computed: the memory model [E"), source
            memories += 1
    assert budgets == memories == sum(len(s.data["results"]) for s in sources)
    for s in sources:  # each run's full provenance once, its tables citing it by label
        assert body.count(equal_bits._provenance(s)) == 1


def test_fidelity_tables_cite_their_run_and_describe_it_once():
    source = inputs.load(COMMITTED_FIDELITY, "committed")
    body = fidelity.render([source]).body
    assert body.count(fidelity.provenance(source)) == 1
    assert {src for _, src in _source_lines(body)} == {"Source: measured: fidelity full run [F1]"}


def test_each_models_newest_full_run_has_claim_rows_of_its_own_and_fig5_one_row_naming_both(tmp_path):
    data = json.loads(COMMITTED_FIDELITY.read_text())
    other = {**data, "model": "other-270m (GGUF other.gguf)", "model_fingerprint": "sha256:" + "1" * 64}
    older = {**data, "date_utc": "1999-01-01T00:00:00+00:00"}  # the same model's older run: no rows of its own
    s = fidelity.render([load(tmp_path, n, d) for n, d in (("a.json", data), ("b.json", other), ("c.json", older))])
    rows = [c.claim.split(":")[0] for c in s.claims]
    kinds = ("Table 9", "Table 9, prefill-only", "Fig. 4", "Fig. 4, prefill-only", "Table 11", "Fig. 5")
    assert [rows.count(k) for k in kinds] == [2, 2, 2, 2, 2, 1]
    assert {c.evidence for c in s.claims if c.claim.startswith("Table 9:")} == {
        bench_fidelity.verdicts(data["summary"], m)["table9"] for m in (data["model"], other["model"])
    }
    (fig5,) = [c for c in s.claims if c.claim.startswith("Fig. 5")]
    assert fig5.status == NOT_MEASURED and fig5.evidence.count("not the paper's 14B/32B models") == 2
    assert "other-270m" in fig5.evidence and {"fig4-jaccard.png", "fig4-jaccard-2.png"} <= set(s.figures)


def test_a_run_matched_on_stored_memory_alone_is_shown_not_called_a_smoke_run():
    stored = [inputs.load(p, "committed") for p in sorted(RESULTS.glob("equal-bits-*.json"))]
    stored = [s for s in stored if s.data.get("match") == "stored" and "--smoke" not in s.data["command"]]
    assert stored, "the committed results hold a full run matched on stored memory"
    body = equal_bits.render(stored[-1:]).body
    assert "Only smoke runs" not in body and "No current run matches the channel methods on bits" in body
    assert body.count(equal_bits._provenance(stored[-1])) == 1 and "### What it shows" in body
