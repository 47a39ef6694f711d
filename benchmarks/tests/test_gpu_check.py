"""The GPU session command, run at tiny scale on the CPU: what it runs and what it keeps."""

import importlib
import json
import re
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.commands import gpu_check, ncu, specializations
from benchmarks.plugin import points
from reference.records import device_name


def test_tiny_run_keeps_the_benchmark_json_and_a_record_of_each_step(tmp_path, capsys):
    assert gpu_check.main(["--tiny", "--suites", "kernels", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("gpu-check-*.json")
    record = json.loads(record_path.read_text())
    assert record["kind"] == "pnmix-gpu-check" and {"torch", "triton", "python"} <= set(record["versions"])
    assert record["device"] == device_name() and "TRITON_INTERPRET" in record["machine"]  # the device it ran on
    step = record["steps"]["benchmarks"]
    assert step["exit_code"] == 0 and "--bench-scale tiny" in step["command"] and "conformance" not in record["steps"]
    bench = json.loads((tmp_path / step["json"].split("/")[-1]).read_text())
    infos = [b["extra_info"] for b in bench["benchmarks"]]
    kernel = [i for i in infos if i["suite"] == "kernel"]
    assert {i["method"] for i in kernel} == {"FP16", "PN-Mix"}
    assert {i["suite"] for i in infos} == {"kernel", "kernel-launch"}
    assert all(i["scale"] == "tiny" and "not predictive" in i["timing"] for i in infos)
    assert "written to" in capsys.readouterr().out


def test_without_cuda_and_without_tiny_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


# -- --short ------------------------------------------------------------------------------------

DEFAULT_STEPS = [name for name in gpu_check.BUDGET_S if name not in gpu_check.OPTIONAL]


def test_short_tiny_counts_each_step_kernels_and_keeps_its_files_in_out_alone(tmp_path, capsys, monkeypatch):
    """The default steps for real at tiny scale: each prints its kernel specializations (a dry run) before it runs,
    the kernel step reports bandwidth against copy with its settings, and the run leaves at most six files, all in
    --out, and nothing in the folder it ran from or the temporary folder."""
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(gpu_check.ncu, "find", lambda: None)
    # a temporary folder of its own (tests run in parallel create and remove theirs in the shared one)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert gpu_check.main(["--short", "--tiny", "--steps", *DEFAULT_STEPS, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 6 and all(p.is_file() for p in out.iterdir())
    assert [re.sub(r"\d{8}T\d{6}_\d{6}Z", "T", f) for f in files] == [
        f"bench-{SAFE}-T.json",
        f"capture-{SAFE}-T.xml",
        "conformance-triton-T.json",
        f"gpu-check-{SAFE}-T.json",
    ]  # separate ran not: conformance passed
    assert list(cwd.iterdir()) == [] and list(temp.glob("gpu-check-*")) == []
    record = json.loads(next(out.glob("gpu-check-*.json")).read_text())
    assert record["mode"] == "short" and record["scale"] == "tiny" and set(record["steps"]) == set(DEFAULT_STEPS)
    assert sum(gpu_check.BUDGET_S[name] for name in DEFAULT_STEPS) + gpu_check.OVERHEAD_S <= 360
    for name, step in record["steps"].items():
        count = step["specializations"]
        assert isinstance(count["count"], int) and count["count"] <= count["launched"], name
        assert count["estimated_compile_s"] == round(count["count"] * specializations.SECONDS_PER_SPECIALIZATION, 1)
        assert f"gpu_check: {name}: {count['count']} kernel specializations to compile" in printed
        assert printed.index(f"gpu_check: {name}: {count['count']} kernel") < printed.index(
            f"gpu_check: {name}: budget"
        )
    steps = record["steps"]
    assert steps["separate"]["status"].startswith("not needed: conformance passed")
    assert steps["kernel"]["specializations"]["count"] > 0  # the decode kernel and the PTX self-test's probes
    # the decode at the same cache shape and dtype: fig6c's walk compiles what kernel and fig7 did not
    assert steps["fig6c"]["specializations"]["launched"] > steps["fig6c"]["specializations"]["count"]
    step = steps["kernel"]
    assert step["status"] == "passed" and step["budget_s"] == gpu_check.BUDGET_S["kernel"]
    assert step["ncu"] == {"status": "ncu not found"} and "kernel: ncu: ncu not found" in printed
    assert 0 < step["seconds"] and Path(step["json"]).parent == out
    rows = {r["method"]: r for r in step["results"]}
    assert set(rows) == {"PN-Mix", "FP16"}
    for r in rows.values():
        assert r["oom"] is False and r["check_finite"] is False and r["gbps"] > 0 and r["copy_gbps"] > 0
        assert r["fraction_of_copy"] == r["gbps"] / r["copy_gbps"]
        assert r["graph_ms"] is None and r["graph_note"] == "no CUDA graphs on the CPU"
    infos = [b["extra_info"] for b in json.loads(Path(step["json"]).read_text())["benchmarks"]]
    assert all({"device_index", "budget_gib", "budget_requested_gib", "gpu_shared"} <= set(i) for i in infos)
    assert {i["suite"] for i in infos} == {"kernel-fragment", "kernel", "fig7-latency", "fig6c-throughput"}  # one file
    assert re.search(r"kernel: budget 40 s, \d+ s left", printed) and "kernel: passed after" in printed
    # the fragment-order loop's step ran first; off the GPU it records why it did not run the loop
    assert printed.index("gpu_check: fragment:") < printed.index("gpu_check: conformance:")
    (fragment,) = [i for i in infos if i["suite"] == "kernel-fragment"]
    assert fragment["path"] == "off" and fragment["self_test"] == "the fragment-order loop needs a CUDA device"


SAFE = "".join(ch if ch.isalnum() else "-" for ch in device_name()).strip("-")[:40]


def fake_pytest(calls: list):
    def run(args, timeout_s=None, cwd=None) -> dict:
        calls.append((list(args), timeout_s))
        return {"command": "pytest " + " ".join(args), "exit_code": 0, "seconds": 0.1, "timed_out": False}

    return run


def fake_count(steps: dict, target, cwd, timeout_s=None) -> dict:
    """Three specializations a step, one of them the same in every step."""
    keys = {name: ["shared", f"{name}-1", f"{name}-2"] for name in steps}
    return {name: {"keys": keys[name], "tests": 1, "skipped": 0, "skip_reasons": []} for name in steps}


@pytest.fixture
def no_dry_run(monkeypatch):
    monkeypatch.setattr(gpu_check.specializations, "count", fake_count)


def test_short_runs_each_step_within_its_budget_and_only_its_points(tmp_path, monkeypatch, no_dry_run):
    calls = []
    monkeypatch.setattr(gpu_check, "run_pytest", fake_pytest(calls))
    assert gpu_check.main(["--short", "--tiny", "--out", str(tmp_path)]) == 0
    record = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    assert set(record["steps"]) == set(gpu_check.BUDGET_S)
    assert list(gpu_check.BUDGET_S) == [
        "fragment",
        "conformance",
        "separate",
        "capture",
        "kernel",
        "fig7",
        "fig6c",
        "ptx",
        "launch",
        "conformance-full",
    ]
    ran = [name for name in gpu_check.BUDGET_S if name != "separate"]  # separate: conformance passed
    assert [timeout for _, timeout in calls] == [gpu_check.BUDGET_S[n] for n in ran]  # in this order, each its budget
    root = str(gpu_check.ROOT)
    conformance = calls[1][0]  # after the fragment-order loop's step
    assert conformance[:2] == [f"{root}/conformance", f"--ignore={root}/conformance/meta"]
    assert conformance[conformance.index("--hypothesis-profile") + 1] == "gpu-short"
    assert calls[-1][0][calls[-1][0].index("--hypothesis-profile") + 1] == "ci"  # the full grid
    assert "-k" in conformance and "--conformance-json" in conformance and "--impl" in conformance
    capture = calls[2][0]  # the CUDA-graph tests of the decode step, among the first
    assert [a for a in capture if "::" in a] == [f"{root}/{node}" for node in gpu_check.CAPTURE_GRAPH_TESTS]
    assert "--junitxml" in capture and "no:conformance.plugin" in capture
    for node in gpu_check.CAPTURE_TESTS:
        path, test = node.split("::")
        assert hasattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), test)
    for args, _ in [calls[0], *calls[3:-1]]:  # node ids of points the suites define, and nothing else
        ids = [a for a in args if "::" in a]
        assert ids and all(a in args for a in ("--benchmark-only", "--benchmark-json"))
        for node in ids:
            path, test, point = re.fullmatch(r"(.+)\.py::(\w+)\[(.+)\]", node).groups()
            module = importlib.import_module(str(Path(path).relative_to(root)).replace("/", "."))
            marks = getattr(module, test).pytestmark
            mark = next(m for m in marks if m.name in ("parametrize", "bench_points"))  # the points' mark
            params = mark.args[1] if mark.name == "parametrize" else points(mark.kwargs["workloads"])
            assert point in {p.id for p in params}
    # each step's count leaves out what the steps before it compiled: its own two keys, the shared one once
    counts = {name: step["specializations"]["count"] for name, step in record["steps"].items()}
    assert counts == {"fragment": 3, "separate": 2, **{n: 2 for n in ran[1:]}}
    assert record["steps"]["separate"]["specializations"]["launched"] == 3


def test_short_full_scale_plan_fits_a_6_minute_share_of_a_15_minute_lease():
    steps = gpu_check.short_steps(False, Path("out"), "stamp", "gpu", 40.0)
    assert [s.name for s in steps] == list(gpu_check.BUDGET_S)
    ids = " ".join(a for s in steps for a in s.args)
    for point in (
        "full-PN-Mix-B1-ctx32768",
        "full-FP16-B1-ctx32768",
        "full-PN-Mix-step16384",
        "full-PN-Mix-B20",
        "full-PN-Mix-B1-ctx32768-n64-w4-s1-x1",
        "full-PN-Mix-B1-ctx32768-n64-w4-s2-x1",
        "full-PN-Mix-B8-ctx4096",  # the PTX unpack's second point
    ):
        assert f"[{point}]" in ids
    by_name = {s.name: " ".join(s.args) for s in steps}
    assert "--impl triton" in by_name["conformance"] and "--budget-gib 40.0" in by_name["kernel"]
    assert "--hypothesis-profile gpu-short" in by_name["conformance"]
    assert "--hypothesis-profile ci" in by_name["conformance-full"]
    assert gpu_check.CAPTURE_TESTS[-1] in by_name["capture"]  # the evaluation path at full scale
    # the default steps with room for gpu_check itself fill at most 6 minutes of the lease (a rerun fits); the
    # optional steps only use what the others leave of that
    required = [s for s in steps if s.name not in gpu_check.OPTIONAL]
    assert gpu_check.OPTIONAL == {"ptx", "launch", "conformance-full"}
    assert [s.name for s in steps[-3:]] == ["ptx", "launch", "conformance-full"]
    assert sum(gpu_check.BUDGET_S[s.name] for s in required) + gpu_check.OVERHEAD_S == gpu_check.TIME_BUDGET_S
    assert gpu_check.TIME_BUDGET_S <= gpu_check.LEASE_SHARE_S == 360
    # the dry run's points: the decode cache of the kernel step, the walks of the model points (a Fig. 7 twin)
    dry = {s.name: s.dry for s in steps}
    assert [p["kind"] for p in dry["kernel"]["points"]] == ["kernel"]  # FP16 (SDPA) launches no Triton kernel
    (walk,) = dry["fig7"]["points"]
    assert walk["plan"][0] == ["fill", walk["prompt"] + 16 * 1024] and walk["twin"][-1] == ["steps", 2]
    (walk,) = dry["fig6c"]["points"]
    assert walk["batch"] == 20 and [p for p in walk["plan"] if p[0] == "fill"][-1] == ["fill", walk["prompt"] + 8176]


def test_short_skips_a_step_that_would_overrun_and_says_so(tmp_path, monkeypatch, capsys, no_dry_run):
    calls = []
    monkeypatch.setattr(gpu_check, "run_pytest", fake_pytest(calls))
    assert gpu_check.main(["--short", "--tiny", "--time-budget", "33", "--out", str(tmp_path)]) == 1
    record = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    status = {name: step["status"] for name, step in record["steps"].items()}
    # the steps whose budgets fit in what is left of 33 s (the faked steps take no time): fragment, fig6c
    assert status["fragment"] == status["fig6c"] == "passed" and len(calls) == 2
    for name in ("conformance", "capture", "kernel", "fig7", "ptx", "launch", "conformance-full"):
        assert status[name].startswith("skipped: would overrun") and record["steps"][name]["exit_code"] is None
    assert status["launch"].endswith("(optional: no failure)") and not status["fig7"].endswith("failure)")
    printed = capsys.readouterr().out
    assert "skipped: would overrun" in printed
    assert "gpu_check: launch: specializations not counted (not counted: it does not run)" in printed


def test_short_passes_when_only_the_optional_steps_had_no_time_left(tmp_path, monkeypatch, no_dry_run):
    calls, clock = [], [0.0]

    def slow_pytest(args, timeout_s=None, cwd=None) -> dict:  # each step takes all but 5 s of its budget
        calls.append(args)
        clock[0] += timeout_s - 5
        return {"command": "pytest", "exit_code": 0, "seconds": timeout_s - 5, "timed_out": False}

    monkeypatch.setattr(gpu_check, "run_pytest", slow_pytest)
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock[0])
    assert gpu_check.main(["--short", "--tiny", "--out", str(tmp_path)]) == 0
    steps = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())["steps"]
    # the six default steps that ran left OVERHEAD_S + separate's 30 s + 5 s each: ptx's 90 s fit, no more
    assert steps["ptx"]["status"] == "passed" and len(calls) == 7
    assert steps["launch"]["status"].startswith("skipped: would overrun")
    assert steps["conformance-full"]["status"].startswith("skipped: would overrun")
    # a required step skipped the same way is a failure
    clock[0], calls[:] = 0.0, []
    assert gpu_check.main(["--short", "--tiny", "--time-budget", "250", "--out", str(tmp_path)]) == 1


def test_a_failed_conformance_step_runs_the_separate_step_which_names_the_cause(tmp_path, monkeypatch, capsys):
    """The separate step runs after a conformance failure alone, and its outcomes name the part that fails."""
    monkeypatch.setattr(gpu_check.specializations, "count", fake_count)
    calls = []

    def failing_conformance(args, timeout_s=None, cwd=None) -> dict:
        calls.append(list(args))
        xml = next((a for a in args if a.endswith(".xml")), None)
        if xml and "separate" in xml:  # the dots fail alone; the unpack passes
            Path(xml).write_text(
                '<testsuites><testsuite><testcase name="test_unpack_alone_gives_every_code_of_every_byte[x]"/>'
                '<testcase name="test_dot_alone_over_exact_dequantized_operands_is_within_the_bound[y]">'
                '<failure message="m"/></testcase><testcase name="test_fused_decode_is_within_the_bound[z]">'
                '<failure message="m"/></testcase></testsuite></testsuites>'
            )
        failed = "conformance" in args[0]
        return {"command": "pytest", "exit_code": int(failed), "seconds": 0.1, "timed_out": False, "reason": None}

    monkeypatch.setattr(gpu_check, "run_pytest", failing_conformance)
    steps = ["conformance", "separate", "kernel"]
    assert gpu_check.main(["--short", "--tiny", "--steps", *steps, "--out", str(tmp_path)]) == 1
    record = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())["steps"]
    root = gpu_check.ROOT
    assert [c[0] for c in calls[:2]] == [f"{root}/conformance", f"{root}/{gpu_check.SEPARATE_TESTS}"]
    assert record["separate"]["cause"] == "the dots: they fail alone, over exact dequantized operands"
    assert "separate: cause: the dots" in capsys.readouterr().out
    assert len(calls) == 3  # kernel still ran after
    files = list(tmp_path.iterdir())
    assert len(files) <= 6 and any(f.name.startswith("separate-") for f in files)


def test_the_separate_step_runs_when_asked_for_alone_and_not_for_a_skipped_conformance(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check.specializations, "count", fake_count)
    calls = []
    monkeypatch.setattr(gpu_check, "run_pytest", fake_pytest(calls))
    assert gpu_check.main(["--short", "--tiny", "--steps", "separate", "--out", str(tmp_path / "a")]) == 0
    assert [args[0] for args, _ in calls] == [f"{gpu_check.ROOT}/{gpu_check.SEPARATE_TESTS}"]
    calls.clear()
    assert gpu_check.main(["--short", "--tiny", "--skip-conformance", "--out", str(tmp_path / "b")]) == 0
    record = json.loads(next((tmp_path / "b").glob("gpu-check-*.json")).read_text())["steps"]
    assert record["separate"]["status"].startswith("not needed: conformance did not run") and len(calls) == 7


def test_the_separate_cause_is_the_first_part_that_fails_alone():
    def rows(**outcomes):
        return [{"test": f"test_{part}_x", "outcome": outcome} for part, outcome in outcomes.items()]

    cause = gpu_check.separate_cause
    assert cause(rows(unpack_alone="failed", dot_alone="failed", fused="failed")).startswith("the unpack")
    assert cause(rows(unpack_alone="passed", dot_alone="error", fused="failed")).startswith("the dots")
    assert cause(rows(unpack_alone="passed", dot_alone="passed", fused="failed")).startswith("the fused decode")
    assert cause(rows(unpack_alone="passed", dot_alone="skipped", fused="passed")).startswith("not reproduced")
    assert cause([]).startswith("unknown")
    # a conformance step cut at its budget with no failure is not what separate is for
    assert not gpu_check.conformance_failed({"exit_code": 2, "results": [{"outcome": "passed"}]})
    assert gpu_check.conformance_failed({"exit_code": 2, "results": [{"outcome": "failed"}]})
    assert gpu_check.conformance_failed({"exit_code": 1, "results": []})
    assert not gpu_check.conformance_failed({"exit_code": None, "results": []}) and not gpu_check.conformance_failed(
        None
    )


def test_short_ptx_step_records_which_path_each_launch_took(tmp_path):
    assert gpu_check.main(["--short", "--tiny", "--steps", "ptx", "--out", str(tmp_path)]) == 0
    step = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())["steps"]["ptx"]
    assert step["status"] == "passed" and step["budget_s"] == gpu_check.BUDGET_S["ptx"]
    assert step["specializations"]["count"] > 0  # counted before it ran, alone
    (row,) = step["results"]
    assert set(gpu_check.SUMMARY_KEYS["kernel-ptx"]) <= set(row)
    # the interpreter runs no inline PTX: asked for, the launch still took the plain path, and said why
    assert row["plain_path"] == row["ptx_path"] == "plain" and "interpreter" in row["self_test"]
    assert row["identical"] is True
    assert 0 <= row["plain_max_error"] <= row["error_bound"] and 0 <= row["ptx_max_error"] <= row["error_bound"]


def test_short_launch_step_judges_every_launch_choice(tmp_path):
    assert gpu_check.main(["--short", "--tiny", "--steps", "launch", "--out", str(tmp_path)]) == 0
    step = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())["steps"]["launch"]
    assert step["status"] == "passed"
    rows = step["results"]
    assert {(r["block_n"], r["warps"], r["stages"]) for r in rows} == {(64, 4, 2), (32, 4, 2)}
    for r in rows:
        assert r["fits"] is True and 0 <= r["max_error"] <= r["error_bound"] and r["gbps"] > 0


def test_a_step_past_its_budget_is_interrupted_and_keeps_what_it_wrote(tmp_path):
    test = tmp_path / "test_slow.py"
    test.write_text("import time\n\n\ndef test_fast():\n    pass\n\n\ndef test_slow():\n    time.sleep(120)\n")
    budget = 20  # pytest's own start-up (plugins import torch) must fit before the interrupt, even on a busy CI
    ran = gpu_check.run_pytest([str(test), f"--rootdir={tmp_path}", f"--junitxml={tmp_path / 'out.xml'}"], budget)
    assert ran["timed_out"] and ran["exit_code"] != 0 and ran["seconds"] < budget + gpu_check.GRACE_S
    assert (tmp_path / "out.xml").is_file()  # pytest wrote its report after the interrupt


def test_a_result_file_left_empty_or_unwritten_summarizes_to_nothing(tmp_path):
    # pytest-benchmark < 5.3 creates the file when it parses its options, so a step that stops
    # before its end leaves it empty; the step's record must still be written.
    (tmp_path / "empty.json").write_text("")
    assert gpu_check.summarize(tmp_path / "empty.json") == []
    assert gpu_check.summarize(tmp_path / "missing.json") == []


def test_benchmark_json_given_as_an_open_file_is_accepted_and_an_existing_path_is_replaced_with_a_warning(tmp_path):
    root_conftest = importlib.import_module("conftest")

    class Config:
        def __init__(self, value):
            self.value, self.warned = value, []

        def getoption(self, name, default=None):
            return self.value if name == "benchmark_json" else default

        def issue_config_time_warning(self, warning, stacklevel):
            self.warned.append(str(warning))

    with open(tmp_path / "opened.json", "wb") as opened:  # what pytest-benchmark < 5.3 hands over
        config = Config(opened)
        root_conftest.pytest_configure(config)
        assert config.warned == []
    (tmp_path / "kept.json").write_text("{}")
    config = Config(str(tmp_path / "kept.json"))
    root_conftest.pytest_configure(config)  # as pytest-benchmark: the run goes on and replaces it, said up front
    assert len(config.warned) == 1 and "kept.json exists: pytest-benchmark replaces it" in config.warned[0]


def test_a_failed_step_says_why_in_the_property_own_words(tmp_path, capsys):
    test = tmp_path / "test_fails.py"
    test.write_text("def test_step():\n    assert 0.0202 <= 0.000651, 'attention error 0.0202 above 0.000651'\n")
    ran = gpu_check.run_pytest([str(test), f"--rootdir={tmp_path}"], 120)
    assert ran["exit_code"] == 1
    assert ran["reason"].startswith("AssertionError: attention error 0.0202 above 0.000651 | FAILED ")
    assert "test_step" in capsys.readouterr().out  # the output is still streamed as it comes


def test_the_reason_falls_back_to_the_last_error_line():
    lines = ["collected 1 item", "E   RuntimeError: CUDA error: out of memory", "E   second", "1 error"]
    assert gpu_check.failure_reason(lines) == "RuntimeError: CUDA error: out of memory"
    assert gpu_check.failure_reason(["E   first", "E   last"]) == "last"
    assert gpu_check.failure_reason(["ok"]) is None


def test_a_step_that_cannot_write_its_results_says_so(tmp_path):
    """A full disk when pytest writes a step's result file: the step's reason names it (pytest's own
    INTERNALERROR lines)."""
    full = "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'bench.json')\n"
    (tmp_path / "conftest.py").write_text("import errno, os\n\n\ndef pytest_sessionfinish(session):\n" + full)
    (tmp_path / "test_step.py").write_text("def test_step():\n    pass\n")
    ran = gpu_check.run_pytest([str(tmp_path), f"--rootdir={tmp_path}"], 120)
    assert ran["exit_code"] != 0 and "OSError: [Errno 28] No space left on device: 'bench.json'" in ran["reason"]


def test_a_junit_result_is_summarized_test_by_test(tmp_path):
    xml = tmp_path / "capture.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase name="a" time="1.5"/><testcase name="b" time="0.1"><skipped/></testcase>'
        '<testcase name="c" time="2"><failure message="x"/></testcase></testsuite></testsuites>'
    )
    assert gpu_check.summarize(xml) == [
        {"test": "a", "outcome": "passed", "seconds": 1.5},
        {"test": "b", "outcome": "skipped", "seconds": 0.1},
        {"test": "c", "outcome": "failed", "seconds": 2.0},
    ]
    assert gpu_check.summarize(tmp_path / "missing.xml") == []


# -- Nsight Compute on the kernel step -------------------------------------------------------------------------

#: What `ncu --csv --print-units base --kernel-name regex:_split_kernel --launch-count 1 --metrics ...` prints: its
#: own ==PROF== lines, then the details page, one row per metric of the kernel (thousands separators in values).
NCU_HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)
NCU_ROW = '"0","4242","python3.12","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(8, 1, 33)","0","9.0",' + (
    '"Command line profiler metrics","{metric}","{unit}","{value}"'
)
NCU_VALUES = {
    "dram__bytes_read.sum": ("byte", "9,699,328"),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "61.37"),
    "gpu__time_duration.sum": ("nsecond", "5,888"),
    **{metric: ("ratio", "0") for metric in ncu.STALLS},
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("ratio", "7.42"),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("ratio", "1.25"),
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": ("ratio", "2.03"),
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": ("ratio", "0.51"),
    "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio": ("ratio", "0.93"),
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio": ("ratio", "0.12"),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("ratio", "n/a"),
}


def ncu_output(values=NCU_VALUES, kernel="_split_kernel") -> str:
    rows = [NCU_ROW.format(kernel=kernel, metric=m, unit=u, value=v) for m, (u, v) in values.items()]
    return "\n".join(
        [
            "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
            '==PROF== Profiling "_split_kernel" - 0: 0%....50%....100% - 11 passes',
            "==PROF== Disconnected from process 4242",
            NCU_HEADER,
            *rows,
        ]
    )


def test_the_ncu_command_profiles_the_first_decode_launch_of_the_kernel_point():
    cmd = ncu.command("/opt/nsight/ncu", 1, 32768, python="/usr/bin/python3")
    assert cmd[0] == "/opt/nsight/ncu" and "--csv" in cmd
    for option, value in (("--kernel-name", "regex:_split_kernel"), ("--launch-count", "1"), ("--print-units", "base")):
        assert cmd[cmd.index(option) + 1] == value
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert set(metrics) == {*ncu.METRICS, *ncu.STALLS} and len(ncu.STALLS) == len(ncu.STALL_REASONS) >= 10
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in metrics
    assert cmd[cmd.index("/usr/bin/python3") :] == [
        "/usr/bin/python3",
        "-m",
        "benchmarks.commands.ncu",
        "--batch",
        "1",
        "--context",
        "32768",
    ]


def test_ncu_csv_is_read_into_dram_throughput_and_the_top_stalls():
    figures = ncu.summary(ncu.parse_csv(ncu_output()))
    assert figures["kernel"] == "_split_kernel" and figures["dram_throughput_pct_of_peak"] == 61.37
    assert figures["dram_bytes_read"] == 9_699_328 and figures["duration_ns"] == 5_888
    assert figures["dram_read_gbps"] == 9_699_328 / 5_888  # bytes per ns are GB/s
    top = figures["top_stalls"]
    assert [s["reason"] for s in top] == [
        "long_scoreboard",
        "math_pipe_throttle",
        "wait",
        "no_instruction",
        "short_scoreboard",
    ]
    assert top[0]["cycles_per_issue"] == 7.42 and len(top) == ncu.TOP_STALLS  # dispatch_stall's 0.12 is sixth
    assert "barrier" not in [s["reason"] for s in top]  # "n/a" is no number, and reasons at 0 are no stall


def test_ncu_values_in_other_units_are_read_in_bytes_and_nanoseconds():
    values = {**NCU_VALUES, "dram__bytes_read.sum": ("Mbyte", "9.70"), "gpu__time_duration.sum": ("usecond", "5.89")}
    metrics = ncu.parse_csv(ncu_output(values))["_split_kernel"]
    assert metrics["dram__bytes_read.sum"] == ("byte", pytest.approx(9.70e6))
    assert metrics["gpu__time_duration.sum"] == ("nsecond", pytest.approx(5890.0))


def test_ncu_output_without_the_kernel_or_a_header_says_so_in_one_line():
    with pytest.raises(ValueError, match=r"^ncu printed no CSV header"):
        ncu.parse_csv("==PROF== ERROR: ERR_NVGPUCTRPERM - no permission to access NVIDIA GPU performance counters")
    with pytest.raises(ValueError, match=r"^ncu profiled no _split_kernel \(kernels: _merge_kernel\)"):
        ncu.summary(ncu.parse_csv(ncu_output(kernel="_merge_kernel")))
    with pytest.raises(ValueError, match="lacks the columns Metric Value"):
        ncu.parse_csv(NCU_HEADER.replace(',"Metric Value"', "") + "\n")


def test_the_kernel_step_records_what_ncu_measured(tmp_path, monkeypatch):
    """profile_kernel end to end with a stand-in ncu that prints the sample (a GPU's run, on the CPU)."""
    (tmp_path / "sample.csv").write_text(ncu_output())
    fake = tmp_path / "ncu"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(tmp_path / 'sample.csv')!r}).read())\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(gpu_check.ncu, "find", lambda: str(fake))
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    (step,) = [s for s in gpu_check.short_steps(False, tmp_path, "t", "gpu", 40.0) if s.name == "kernel"]
    found = gpu_check.profile_kernel(step, 30, tmp_path, tiny=False)
    assert found["status"] == "profiled" and found["dram_throughput_pct_of_peak"] == 61.37
    assert found["command"].startswith(f"{fake} --csv") and found["command"].endswith("--batch 1 --context 32768")
    assert "long_scoreboard 7.42" in gpu_check.ncu_line(found)
    assert gpu_check.profile_kernel(step, 3, tmp_path, tiny=False)["status"].startswith("not profiled: 3 s left")
    monkeypatch.setattr(gpu_check.ncu, "find", lambda: None)
    assert gpu_check.profile_kernel(step, 30, tmp_path, tiny=False) == {"status": "ncu not found"}
