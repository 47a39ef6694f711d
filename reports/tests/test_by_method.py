"""Page 1's table by method: a row per registry method (and per other configuration a task-accuracy result
ran), every cell from a current result that it cites or "-" with why, the accuracy numbers the task-accuracy
section's own."""

from __future__ import annotations

import copy
import dataclasses

from benchmarks.canaries import behaviour
from conformance import loader
from conformance.strategies import REALISTIC, workload_record
from reference import methods
from reports import cli, inputs
from reports.sections import accuracy as acc
from reports.sections import by_method, storage
from reports.tests import synthetic
from reports.tests.mdtables import table_after, tables_without_source

MC = "accuracy, choosing among candidates"
#: What each synthetic run ran, as lm-eval's model_args name it (`benchmarks.accuracy.sweep.Run.model_args`).
MODEL_ARGS = {
    "FP16": "method=FP16",
    "PN-Mix @ 3": "method=PN-Mix,b_high=4",
    "PN-Mix @ 2.25": "method=PN-Mix",
    "PN-Mix @ 1.5": "method=PN-Mix,b_high=2,ratio=0.2",
    "KIVI @ 3": "method=KIVI-2,b_high=3,b_low=3",
    "KIVI @ 2.25": "method=KIVI-2",
    "KIVI @ 1.5": "method=KIVI-2,b_high=1,b_low=1",
}


def task_accuracy(model: str = "TinyLM") -> dict:
    """`synthetic.task_accuracy` with each run's model_args as the sweep writes them."""
    data = synthetic.task_accuracy()
    data["model"] = f"{model} (a test model)"
    for r in data["runs"]:
        r["model_args"] = MODEL_ARGS.get(r["label"], "method=KIVI-2,value_bits=16")
    return data


def load(tmp_path, name, data):
    return inputs.load(synthetic.write(tmp_path, name, data), "--input")


PN_15 = "PN-Mix, K H2(20%)L1, V 2-bit, G 128, 32 sinks (the sweep's pick for its 1.5-bit key budget)"
KIVI_15 = "KIVI, K 1-bit, V 2-bit, G 128 (the sweep's pick for its 1.5-bit key budget)"


def rows(md: str) -> dict[str, dict[str, str]]:
    return {r["method"]: r for r in table_after(md, by_method.HEADING)}


def legend(md: str) -> dict[str, str]:
    """Label -> what it cites, from the table's list of sources."""
    lines = md.split("Sources of the table by method:", 1)[1].strip().splitlines()
    return dict(line.removeprefix("- ").split(" ", 1) for line in lines if line.startswith("- ["))


def conformance() -> dict:
    """The PN-Mix spec measured on the realistic workload at PN-Mix's configuration; KIVI's at its preset's."""
    data = synthetic.conformance()
    base = {**data["results"][0], "module": "conformance/test_p7_attention.py", "outcome": "passed"}
    for impl, config, error in (
        ("reference", methods.config("PN-Mix"), 0.173),
        ("triton", methods.config("PN-Mix"), 0.171),
        ("kivi", methods.kivi_preset(REALISTIC.config), 0.211),
    ):
        workload = workload_record(dataclasses.replace(REALISTIC, config=config))
        data["results"].append(
            {
                **base,
                "implementation": impl,
                "property": "test_the_realistic_workload_attention",
                "measured": {**workload, "realistic_attention_error": error},
            }
        )
    return data


def long_outputs() -> dict:
    pnmix = {"kl": [0.2] * 4 + [0.1] * 4, "top1": [1.0] * 8, "nll": [1.0] * 8}
    return synthetic.long_output([{"PN-Mix": pnmix, "FP16": {"nll": [1.0] * 8}}], 8)


def test_a_row_per_registry_method_and_per_other_configuration_run(tmp_path):
    empty = rows(by_method.render([]))
    assert list(empty) == list(methods.REGISTRY)  # every method, in the registry's order, with nothing measured
    shown = rows(by_method.render([load(tmp_path, "acc.json", task_accuracy())]))
    assert "PN-Mix (the sweep's pick for its 2.25-bit key budget)" in shown  # its own configuration at that budget
    assert "KIVI-2 (the sweep's pick for its 2.25-bit key budget)" in shown
    others = [m for m in shown if m.startswith(("KIVI,", "PN-Mix,"))]  # a design's other configurations
    assert others == [
        "KIVI, K 3-bit, V 2-bit, G 128 (the sweep's pick for its 3-bit key budget)",
        "KIVI, K 1-bit, V 2-bit, G 128 (the sweep's pick for its 1.5-bit key budget)",
        "PN-Mix, K H4(50%)L1, V 2-bit, G 128, 32 sinks (the sweep's pick for its 3-bit key budget)",
        "PN-Mix, K H2(20%)L1, V 2-bit, G 128, 32 sinks (the sweep's pick for its 1.5-bit key budget)",
    ]
    assert len(shown) == len(methods.REGISTRY) + len(others)
    assert not any("keys only" in m or "values only" in m for m in shown)  # Table 8's runs are no method


def test_a_run_that_records_its_configuration_as_data_is_read_from_it(tmp_path):
    """The sweep records each run's method, configuration and options as data: the table is built from them,
    not from lm-eval's model_args (here garbage), and gives the same rows as the model_args of older results."""
    from reference import records

    old = rows(by_method.render([load(tmp_path, "old.json", task_accuracy())]))
    data = task_accuracy()
    for r in data["runs"]:
        ran = by_method.run_config(r)
        if ran is not None:
            name, config, options = ran
            r.update(method=name, config=records.config_record(config), options=options, model_args="garbage")
    new = rows(by_method.render([load(tmp_path, "new.json", data)]))
    assert list(new) == list(old)


def test_a_run_whose_configuration_cannot_be_built_is_left_out_and_said(tmp_path):
    data = task_accuracy()
    data["runs"][1]["model_args"] = "method=PN-Mix,b_high=9"  # no such key width
    md = by_method.render([load(tmp_path, "acc.json", data)])
    assert data["runs"][1]["label"] == "PN-Mix @ 3" and not any(m.startswith("PN-Mix @ 3") for m in rows(md))
    assert "Left out, their configuration not buildable by this tree's registry: PN-Mix @ 3 of `" in md


def test_the_accuracy_is_the_task_accuracy_sections_and_cites_its_file(tmp_path):
    source = load(tmp_path, "acc.json", task_accuracy())
    md = by_method.render([source])
    section = {r["run"]: r for r in table_after(acc.render([source]).body, "#### ")}
    pooled = "choosing among candidates: accuracy [95% Wilson], vs FP16, McNemar p"
    cells = rows(md)
    for label, row in (
        ("PN-Mix @ 1.5", cells[PN_15]),
        ("KIVI @ 1.5", cells[KIVI_15]),
        ("FP16", cells["FP16"]),
    ):
        model, rest = row[MC].split(": ", 1)
        number, cite = rest.rsplit(" ", 1)
        assert model == "TinyLM" and number == section[label][pooled]
        assert legend(md)[cite].endswith(f"file `{source.name}`") and "task accuracy" in legend(md)[cite]
    assert cells[KIVI_15][MC].startswith("TinyLM: 0.650 [")  # 10 lost
    assert tables_without_source(md) == []


def test_each_view_is_pooled_apart(tmp_path):
    data = task_accuracy()
    data["tasks"].append({"name": "a_gen_1k", "items": 40, "chance": 0.0, "output": "generate_until"})
    for r in data["runs"]:
        r["results"]["a_gen_1k"] = {"correct": [1] * 30 + [0] * 10 if r["label"] != "PN-Mix @ 1.5" else [0] * 40}
    cells = rows(by_method.render([load(tmp_path, "acc.json", data)]))
    pn = cells[PN_15]
    runs = {r["label"]: r for r in data["runs"]}
    base = runs["FP16"]
    assert pn[MC].startswith(f"TinyLM: {acc.pooled_cell(runs['PN-Mix @ 1.5'], base, ['a_1k'])} [")
    produced = acc.pooled_cell(runs["PN-Mix @ 1.5"], base, ["a_gen_1k"])
    assert produced.startswith("0.000") and pn["accuracy, producing the answer"].startswith(f"TinyLM: {produced} [")


def test_measured_cells_cite_their_results(tmp_path):
    sources = [
        load(tmp_path, "c.json", conformance()),
        load(tmp_path, "gpu.json", synthetic.gpu_benchmarks()),
        load(tmp_path, "long.json", long_outputs()),
    ]
    md = by_method.render(sources)
    cells, cited = rows(md), legend(md)
    pnmix = cells["PN-Mix"]
    error, cite = pnmix["attention error"].rsplit(" ", 1)
    assert error == "0.173 (largest of reference, triton)" and cited[cite].endswith("file `" + sources[0].name + "`")
    speed, cite = pnmix["decode speed"].rsplit(" ", 1)
    assert speed.startswith("0.40x FP16's time (B = 1, 8192 tokens") and sources[1].name in cited[cite]
    drift, cite = pnmix["long-output drift"].rsplit(" ", 1)
    assert drift == "M: KL 0.2 -> 0.1 over 8 positions" and sources[2].name in cited[cite]
    assert cells["Kitty"]["decode speed"].startswith("0.50x FP16's time")
    # KIVI's design ran its preset of the paper's configuration, not KIVI-2's: no number, and why
    assert cells["KIVI-2"]["attention error"].startswith("-: its design's implementations ran the workload as K 1-bit")
    bits, cite = pnmix[storage.COUNT_NAME].rsplit(" ", 1)
    assert bits == "2.26 (K 2.26, V 2.26)" and cited[cite].startswith("computed: reports.sections.storage.count")


def test_a_plugin_timed_at_a_methods_points_is_not_the_method(tmp_path):
    bench = synthetic.gpu_benchmarks()
    for b in bench["benchmarks"]:
        if b["extra_info"]["method"] == "PN-Mix":
            b["extra_info"]["implementation"] = "thirdparty-kivi"
    cells = rows(by_method.render([load(tmp_path, "gpu.json", bench)]))
    assert cells["PN-Mix"]["decode speed"] == "-: no current GPU kernel benchmark of it"


def test_a_method_without_a_measurement_shows_a_dash_with_the_reason(tmp_path):
    cells = rows(by_method.render([load(tmp_path, "acc.json", task_accuracy())]))
    kivi1 = cells["KIVI-1"]
    assert kivi1[MC] == "-: no current task-accuracy result ran this configuration on tasks of this view"
    assert kivi1["long-output drift"] == "-: no current full long-output run of it"
    assert kivi1["decode speed"] == "-: no current GPU kernel benchmark of it"
    assert kivi1["attention error"] == "-: no current conformance result of its design measured the realistic workload"
    assert not kivi1[storage.COUNT_NAME].startswith("-")  # computed, whatever was measured
    budget = cells[PN_15]
    assert budget["decode speed"].startswith("-: the kernel benchmark times each method at its own configuration")
    assert cells["FP16"]["long-output drift"] == "-: the reference the drift is measured from"


def test_a_result_in_history_feeds_no_cell(tmp_path, monkeypatch):
    """Through the report: a result with canaries that reproduce is current, one without is history."""
    monkeypatch.setattr(behaviour, "moved", lambda recorded, pipeline=None: [])
    now = copy.deepcopy(task_accuracy("TinyLM"))
    now["behaviour"] = {"canaries": {"method:PN-Mix": {"exact": {}, "floats": {}}}}
    old = task_accuracy("StaleLM")  # the same outcomes, but it records no canaries
    files = [synthetic.write(tmp_path, n, d) for n, d in (("now.json", now), ("old.json", old))]
    argv = ["--out-dir", str(tmp_path), "--name", "r", "--no-committed-results", "--no-conformance"]
    argv += ["--no-benchmarks", "--fidelity", "off", *(a for f in files for a in ("--input", str(f)))]
    assert cli.main(argv) == 0
    md = (tmp_path / "r" / "REPORT.md").read_text()
    page1 = md.split("\n## 1. Summary")[1].split("\n## 2. ")[0]
    cells = rows(page1)
    assert cells["FP16"][MC].startswith("TinyLM: 0.900 [")
    assert "StaleLM" not in page1 and "old.json" not in page1
    assert "old.json" in md.split("## 10. History")[1]  # it was read, and listed as history


def test_a_per_token_method_takes_its_error_from_its_own_token_workload(tmp_path):
    """TriAxialKV's conformance run records a `TokenPrecisionConfig` workload: its row cites that error."""
    from conformance import strategies as cs

    data = synthetic.conformance()
    base = {**data["results"][0], "module": "conformance/test_p11_token_precision.py", "outcome": "passed"}
    for impl, error in (("triaxialkv", 0.173), ("triaxialkv-triton", 0.172), ("role-aware-pnmix", 0.126)):
        workload = workload_record(
            cs.fit_fixed(cs.REALISTIC_TOKENS, loader.load(impl.split("-triton")[0]).capabilities)
        )
        data["results"].append(
            {
                **base,
                "implementation": impl,
                "property": "test_the_realistic_token_workload_attention",
                "measured": {**workload, "realistic_attention_error": error},
            }
        )
    source = load(tmp_path, "c.json", data)
    cells = rows(by_method.render([source]))
    error = cells["TriAxialKV"]["attention error"].rsplit(" ", 1)[0]
    assert error == "0.173 (largest of triaxialkv, triaxialkv-triton)"
    error = cells["role-aware PN-Mix"]["attention error"].rsplit(" ", 1)[0]
    assert error == "0.126 (largest of role-aware-pnmix)"


def test_a_spec_of_both_families_is_counted_for_a_row_only_on_its_familys_workload(tmp_path):
    """The reference runs PN-Mix's workload and TriAxialKV's: a PN-Mix configuration it did not run reads what it
    ran of PN-Mix's family, never the per-token workload."""
    from conformance import strategies as cs

    data = conformance()
    token = {**data["results"][-1], "module": "conformance/test_p11_token_precision.py"}
    workload = workload_record(cs.fit_fixed(cs.REALISTIC_TOKENS, loader.load("triaxialkv").capabilities))
    token["implementation"] = "reference"
    token["measured"] = {**workload, "realistic_attention_error": 0.2}
    data["results"].append(token)
    sources = [load(tmp_path, "c.json", data), load(tmp_path, "acc.json", task_accuracy())]
    cells = rows(by_method.render(sources))
    other = cells[PN_15]["attention error"]
    assert other.startswith("-: its design's implementations ran the workload as K H3(50%)L1")
    assert "per token" not in other


def test_a_configuration_has_the_storage_sections_number_and_its_own_name(tmp_path):
    """One number per configuration: each row's bits are the storage section's count of it, as that section's
    table prints it (key bits total, value bits); and a cache with 1-bit keys is never named KIVI-2."""
    shown = rows(by_method.render([load(tmp_path, "acc.json", task_accuracy())]))
    table3 = {r["config"]: r for r in table_after(storage.render().body, "Average bits per element")}
    for name in ("KIVI-2", "KIVI-2 +32 sinks", "KIVI-1", "Kitty", "PN-Mix"):
        row = next(v for k, v in shown.items() if k == name or k.startswith(name + " (the sweep"))
        keys, values = float(table3[name]["key bits total"]), float(table3[name]["value bits"])
        assert row[storage.COUNT_NAME].startswith(f"{(keys + values) / 2:.2f} (K {keys:.2f}, V {values:.2f}) [")
    assert not any(k.startswith("KIVI-2") and "1-bit" in k for k in shown) and KIVI_15 in shown


def test_the_midpoint_controls_are_no_method(tmp_path):
    """The sweep's controls (KIVI's picks at Eq. 7's midpoints) stand for no method: no row, as Table 8's."""
    data = task_accuracy()
    kivi = next(r for r in data["runs"] if r["label"] == "KIVI @ 1.5")
    control = {**copy.deepcopy(kivi), "label": "KIVI, Eq. 7 midpoints @ 1.5", "role": "control"}
    control["model_args"] += ",one_bit=midpoint"
    before = rows(by_method.render([load(tmp_path, "a.json", data)]))
    data["runs"].append(control)
    assert rows(by_method.render([load(tmp_path, "b.json", data)])) == before
    control["role"] = "budget"  # the same configuration as a budget's pick is a row of its own
    assert len(rows(by_method.render([load(tmp_path, "c.json", data)]))) == len(before) + 1
