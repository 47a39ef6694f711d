"""The GPU session command, run at tiny scale on the CPU: what it runs and what it keeps."""

import importlib
import json
import re
from pathlib import Path

import pytest

from benchmarks.commands import gpu_check
from benchmarks.conftest import points
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


def test_short_kernel_step_reports_bandwidth_against_copy_with_its_settings(tmp_path, capsys):
    assert gpu_check.main(["--short", "--tiny", "--steps", "kernel", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("gpu-check-*.json")
    record = json.loads(record_path.read_text())
    assert record["mode"] == "short" and record["scale"] == "tiny" and list(record["steps"]) == ["kernel"]
    step = record["steps"]["kernel"]
    assert step["status"] == "passed" and step["budget_s"] == gpu_check.BUDGET_S["kernel"]
    assert 0 < step["seconds"] and Path(step["json"]).parent == tmp_path
    rows = {r["method"]: r for r in step["results"]}
    assert set(rows) == {"PN-Mix", "FP16"}
    for r in rows.values():
        assert r["oom"] is False and r["check_finite"] is False and r["gbps"] > 0 and r["copy_gbps"] > 0
        assert r["fraction_of_copy"] == r["gbps"] / r["copy_gbps"]
        assert r["graph_ms"] is None and r["graph_note"] == "no CUDA graphs on the CPU"
    infos = [b["extra_info"] for b in json.loads(Path(step["json"]).read_text())["benchmarks"]]
    assert all({"device_index", "budget_gib", "budget_requested_gib", "gpu_shared"} <= set(i) for i in infos)
    out = capsys.readouterr().out
    assert re.search(r"kernel: budget 90 s, \d+ s left", out) and "kernel: passed after" in out


def fake_pytest(calls: list):
    def run(args, timeout_s=None) -> dict:
        calls.append((list(args), timeout_s))
        return {"command": "pytest " + " ".join(args), "exit_code": 0, "seconds": 0.1, "timed_out": False}

    return run


def test_short_runs_each_step_within_its_budget_and_only_its_points(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_check, "run_pytest", fake_pytest(calls))
    assert gpu_check.main(["--short", "--tiny", "--out", str(tmp_path)]) == 0
    record = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    assert (
        set(record["steps"])
        == set(gpu_check.BUDGET_S)
        == {"conformance", "capture", "kernel", "fig7", "fig6c", "ptx", "launch"}
    )
    assert [timeout for _, timeout in calls] == list(gpu_check.BUDGET_S.values())  # in this order, each its budget
    conformance = calls[0][0]
    assert conformance[:5] == ["conformance", "--ignore=conformance/meta", "--impl", "triton", "--device"]
    assert "--hypothesis-profile" in conformance and "-k" in conformance and "--conformance-json" in conformance
    capture = calls[1][0]  # the CUDA-graph tests of the decode step, among the first
    assert [a for a in capture if "::" in a] == list(gpu_check.CAPTURE_TESTS) and "--junitxml" in capture
    for node in gpu_check.CAPTURE_TESTS:
        path, test = node.split("::")
        assert hasattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), test)
    for args, _ in calls[2:]:  # node ids of points the suites define, and nothing else
        ids = [a for a in args if "::" in a]
        assert ids and all(a in args for a in ("--benchmark-only", "--benchmark-json"))
        for node in ids:
            path, test, point = re.fullmatch(r"(.+)\.py::(\w+)\[(.+)\]", node).groups()
            module = importlib.import_module(path.replace("/", "."))
            mark = getattr(module, test).pytestmark[0]  # parametrize, or the suites' bench_points
            params = mark.args[1] if mark.name == "parametrize" else points(mark.kwargs["workloads"])
            assert point in {p.id for p in params}


def test_short_full_scale_plan_fits_a_15_minute_lease():
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
    assert "--impl triton" in " ".join(steps[0].args) and "--budget-gib 40.0" in " ".join(steps[2].args)
    # the steps with room for gpu_check itself and interrupted steps' grace stay under 10 minutes; the
    # optional launch sweep only uses what the others leave of that
    required = [s for s in steps if s.name not in gpu_check.OPTIONAL]
    assert gpu_check.OPTIONAL == {"ptx", "launch"} and [s.name for s in steps[-2:]] == ["ptx", "launch"]
    assert sum(gpu_check.BUDGET_S[s.name] for s in required) < gpu_check.TIME_BUDGET_S <= 540
    assert gpu_check.TIME_BUDGET_S + len(required) * gpu_check.GRACE_S <= 600


def test_short_skips_a_step_that_would_overrun_and_says_so(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(gpu_check, "run_pytest", fake_pytest(calls))
    assert gpu_check.main(["--short", "--tiny", "--time-budget", "100", "--out", str(tmp_path)]) == 1
    record = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    status = {name: step["status"] for name, step in record["steps"].items()}
    # the steps whose budgets fit in what is left of 100 s (the faked steps take no time): capture, kernel, ptx
    assert status["capture"] == status["kernel"] == status["ptx"] == "passed" and len(calls) == 3
    for name in ("conformance", "fig7", "fig6c", "launch"):
        assert status[name].startswith("skipped: would overrun") and record["steps"][name]["exit_code"] is None
    assert status["launch"].endswith("(optional: no failure)") and not status["fig6c"].endswith("failure)")
    assert "skipped: would overrun" in capsys.readouterr().out


def test_short_passes_when_only_the_optional_step_had_no_time_left(tmp_path, monkeypatch):
    calls, clock = [], [0.0]

    def slow_pytest(args, timeout_s=None) -> dict:  # each required step takes all but 5 s of its budget
        calls.append(args)
        clock[0] += timeout_s - 5
        return {"command": "pytest", "exit_code": 0, "seconds": timeout_s - 5, "timed_out": False}

    monkeypatch.setattr(gpu_check, "run_pytest", slow_pytest)
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock[0])
    assert gpu_check.main(["--short", "--tiny", "--out", str(tmp_path)]) == 0
    record = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    assert record["steps"]["launch"]["status"].startswith("skipped: would overrun") and len(calls) == 5
    # a required step skipped the same way is a failure
    clock[0], calls[:] = 0.0, []
    assert gpu_check.main(["--short", "--tiny", "--time-budget", "400", "--out", str(tmp_path)]) == 1


def test_short_ptx_step_records_which_path_each_launch_took(tmp_path):
    assert gpu_check.main(["--short", "--tiny", "--steps", "ptx", "--out", str(tmp_path)]) == 0
    step = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())["steps"]["ptx"]
    assert step["status"] == "passed" and step["budget_s"] == gpu_check.BUDGET_S["ptx"]
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


def test_benchmark_json_given_as_an_open_file_is_accepted_and_a_path_is_never_overwritten(tmp_path):
    root_conftest = importlib.import_module("conftest")

    class Config:
        def __init__(self, value):
            self.value = value

        def getoption(self, name, default=None):
            return self.value if name == "benchmark_json" else default

    with open(tmp_path / "opened.json", "wb") as opened:  # what pytest-benchmark < 5.3 hands over
        root_conftest.pytest_configure(Config(opened))
    (tmp_path / "kept.json").write_text("{}")
    with pytest.raises(pytest.UsageError, match="never overwritten"):
        root_conftest.pytest_configure(Config(str(tmp_path / "kept.json")))


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
