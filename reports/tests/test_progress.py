"""The report's progress bar: each step weighs what it took in the newest earlier report (a default by
its kind where none recorded it), and a pytest step shows its tests done."""

import json
import os
import sys
import textwrap
import time

from reports import cli, progress, steps


def _times(folder, rows, mtime):
    path = folder / "data" / steps.STEP_TIMES
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n", encoding="utf-8")
    os.utime(path, (mtime, mtime))


def test_each_step_weighs_its_time_in_the_newest_earlier_report(tmp_path, monkeypatch):
    args = cli.parser().parse_args(["--only", "reference", "--only", "triton", "--fidelity", "smoke"])
    todo = cli.plan(args, tmp_path / "new")
    names = [s.name for s in todo]
    assert names == ["conformance: reference", "conformance: triton", "benchmark suites", "fidelity (smoke)"]
    # no earlier report here: the example report's times (the CI machine class)
    example = tmp_path / "example" / steps.STEP_TIMES
    example.parent.mkdir()
    example.write_text(json.dumps({"name": "conformance: triton", "kind": "conformance-triton", "seconds": 227.0}))
    monkeypatch.setattr(steps, "EXAMPLE_TIMES", example)
    assert steps.weights(todo, steps.recorded_times(tmp_path / "new")) == [
        steps.DEFAULT_S["conformance-pytorch"],
        227.0,
        steps.DEFAULT_S["benchmarks"],
        steps.DEFAULT_S["fidelity-smoke"],
    ]
    # nor an example: the default of each step's kind
    monkeypatch.setattr(steps, "EXAMPLE_TIMES", tmp_path / "nowhere" / steps.STEP_TIMES)
    assert steps.weights(todo, steps.recorded_times(tmp_path)) == [
        steps.DEFAULT_S[k] for k in ("conformance-pytorch", "conformance-triton", "benchmarks", "fidelity-smoke")
    ]
    now = time.time()
    _times(tmp_path / "old", [{"name": n, "kind": "x", "seconds": 1.0} for n in names], now - 100)
    newest = [
        {"name": "conformance: reference", "kind": "conformance-pytorch", "seconds": 40.0, "status": "ok"},
        {"name": "conformance: kitty-triton", "kind": "conformance-triton", "seconds": 200.0, "status": "ok"},
        {"name": "conformance: kivi-triton", "kind": "conformance-triton", "seconds": 100.0, "status": "ok"},
        {"name": "fidelity (smoke)", "kind": "fidelity-smoke", "seconds": 1404.0, "status": "ok"},
    ]
    _times(tmp_path / "newest", newest, now)
    _times(tmp_path / ".staging.tmp", [{"name": n, "kind": "x", "seconds": 9.0} for n in names], now + 100)
    # the same step's time; else the mean of its kind; else the default
    assert steps.weights(todo, steps.recorded_times(tmp_path)) == [40.0, 150.0, steps.DEFAULT_S["benchmarks"], 1404.0]


def test_the_bar_advances_by_each_steps_weight_not_by_step_count(tmp_path, monkeypatch):
    todo = [steps.Step(f"s{i}", (sys.executable, "-c", "pass"), tmp_path / f"s{i}") for i in range(3)]
    seen = []

    def fake_run(step, bar, refresh_s, weight=0.0):
        seen.append((bar.n, bar.total, weight))
        return steps.Outcome(step.name, step.command, "ok", weight, ())

    monkeypatch.setattr(steps, "run", fake_run)
    outcomes = steps.run_all(todo, [10.0, 1000.0, 90.0])
    assert seen == [(0, 1100.0, 10.0), (10.0, 1100.0, 1000.0), (1010.0, 1100.0, 90.0)]
    steps.record_times(todo, outcomes, tmp_path / "r" / "data")
    assert steps.weights(todo, steps.recorded_times(tmp_path)) == [10.0, 1000.0, 90.0]


class _Bar:
    n, total = 0.0, 10.0

    def __init__(self):
        self.shown = []

    def update(self, k):
        self.n += k

    def set_postfix_str(self, text, refresh=True):
        self.shown.append((text, self.n))


def test_a_pytest_step_shows_its_tests_done(tmp_path):
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_slow.py").write_text(
        textwrap.dedent(
            """
            import time
            import pytest

            @pytest.mark.parametrize("i", range(4))
            def test_slow(i):
                time.sleep(0.4)
            """
        )
    )
    argv = (sys.executable, "-m", "pytest", str(tests / "test_slow.py"), "-p", "no:cacheprovider")
    step = steps.Step("pytest", (*argv, "-p", "reports.progress", "-q", "--rootdir", str(tests)), tmp_path / "out")
    bar = _Bar()
    outcome = steps.run(step, bar, 0.1, weight=10.0)
    assert outcome.seconds > 1.6
    counts = [text.split(" tests")[0] for text, _ in bar.shown if " tests" in text]
    assert counts and set(counts) <= {"0/4", "1/4", "2/4", "3/4", "4/4"} and counts != ["0/4"] * len(counts), bar.shown
    assert counts == sorted(counts)
    assert max(n for _, n in bar.shown) > 0 and bar.n == 0  # advanced by the share done, then handed back
    assert progress.read(tmp_path / "nothing") is None


def test_the_committed_example_report_weighs_a_first_run():
    """A newcomer's first run is weighed by the example report's step times, not by the kinds' budgets (hours)."""
    rows = steps.recorded_times(steps.EXAMPLE_TIMES.parent.parent / "no-report-here")
    assert rows and {r["kind"] for r in rows} >= {"conformance-pytorch", "conformance-triton", "benchmarks"}


def test_a_step_of_one_long_test_moves_the_bar_by_its_time_before_the_test_ends(tmp_path):
    """The bar does not freeze through a test of many minutes: the step's share grows with its time against its
    expected time (short of the whole), and says when it runs past it."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_long.py").write_text("import time\n\ndef test_long():\n    time.sleep(2.0)\n")
    argv = (sys.executable, "-m", "pytest", str(tests / "test_long.py"), "-p", "no:cacheprovider")
    step = steps.Step("pytest", (*argv, "-p", "reports.progress", "-q", "--rootdir", str(tests)), tmp_path / "out")
    bar = _Bar()
    steps.run(step, bar, 0.1, weight=1.0)
    before_end = [(text, n) for text, n in bar.shown if text.startswith("0/1 tests") or " 0/1 tests" in text]
    assert before_end and max(n for _, n in before_end) > 0.3, bar.shown  # moved while no test had ended
    assert max(n for _, n in bar.shown) <= 1.0 and bar.n == 0
    assert any("expected 1 s" in text for text, _ in bar.shown), bar.shown  # past its expected time: said so


def test_a_step_records_its_cpu_seconds_beside_its_wall_time(tmp_path):
    """A step that computes for a second of CPU in a child of its own: its CPU seconds count that child, and
    the step times (what README's figures come from) keep them; one that sleeps uses next to none."""
    busy = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        + repr("import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass")
        + "], check=True)"
    )
    todo = [
        steps.Step("busy", (sys.executable, "-c", busy), tmp_path / "busy"),
        steps.Step("idle", (sys.executable, "-c", "import time; time.sleep(1.0)"), tmp_path / "idle"),
    ]
    busy_out, idle_out = (steps.run(s, _Bar(), 0.2) for s in todo)
    assert busy_out.cpu_seconds >= 0.9 and idle_out.seconds >= 1.0 and idle_out.cpu_seconds < 0.5
    steps.record_times(todo, [busy_out, idle_out], tmp_path / "r" / "data")
    rows = [json.loads(x) for x in (tmp_path / "r" / "data" / steps.STEP_TIMES).read_text().splitlines()]
    assert rows[0]["cpu_seconds"] >= 0.9 and rows[1]["cpu_seconds"] < 0.5
    assert cli.took([busy_out], 61.2) == f"1 min 1 s wall, {busy_out.cpu_seconds:,.0f} CPU-seconds in its steps"
    assert cli.took([], 61.2) == "1 min 1 s wall, 0 CPU-seconds in its steps"


def test_help_gives_the_example_reports_cost_from_its_recorded_steps(tmp_path, monkeypatch):
    rows = [
        {"name": "a", "kind": "conformance-triton", "seconds": 600.0, "cpu_seconds": 1100.0, "status": "ok"},
        {"name": "f", "kind": "fidelity-smoke", "seconds": 61.0, "cpu_seconds": 90.5, "status": "ok"},
    ]
    rows = [{**r, "date_utc": "2026-12-07", "machine": "x86_64, 2 logical cores"} for r in rows]
    path = tmp_path / steps.STEP_TIMES
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr(steps, "EXAMPLE_TIMES", path)
    cost = steps.example_cost()
    assert cost == (
        "took 11 min 1 s wall and 1,190 CPU-seconds (fidelity smoke 61 s wall) on x86_64, 2 logical cores, 2026-12-07"
    )
    assert cost in " ".join(cli.parser().format_help().split())
    path.write_text(json.dumps({**rows[0], "cpu_seconds": None, "status": "failed: exit code 2"}) + "\n")
    assert steps.example_cost() == (
        "took 10 min 0 s wall on x86_64, 2 logical cores, 2026-12-07; 1 of its steps did not end ok"
    )
