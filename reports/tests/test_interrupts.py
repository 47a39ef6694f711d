"""A report run stopped by a signal: its step is ended, its staging folder removed, one line said;
after SIGKILL, which no handler sees, the step dies with it and the next run removes the folder."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reports import cli
from reports.tests.test_report import NOTHING_RUN

ROOT = Path(__file__).parents[2]
#: `python -c` program: the report with one slow step, which writes its pid to argv[1] once it runs.
DRIVER = """
import sys
from reports import cli, steps
slow = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
step = lambda data: steps.Step("slow", (sys.executable, "-c", slow, sys.argv[1]), data / "slow")
cli.plan = lambda args, data, given=(): [step(data)]
sys.exit(cli.main(sys.argv[2:]))
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a step dies with the report on Linux")


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # ended, not yet reaped by init
    except FileNotFoundError:
        return True


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """The report running its slow step; (the report's process, the step's pid)."""
    pid_file = tmp_path / "step.pid"
    argv = [str(pid_file), "--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results"]
    report = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as in a terminal: a suite started in the background of a shell inherits SIGINT ignored, which
        # Python then keeps ignoring (no KeyboardInterrupt), as a user's `pnmix-report &` would
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    if not wait_for(lambda: pid_file.exists() and pid_file.read_text(), 120):
        report.kill()
        pytest.fail(f"the step did not start: {report.communicate()[1][-2000:]}")
    return report, int(pid_file.read_text())


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_run_ends_its_step_removes_its_folder_and_says_one_line(tmp_path, signum, code):
    report, step = start(tmp_path)
    try:
        report.send_signal(signum)
        _, err = report.communicate(timeout=60)
    finally:
        report.kill()
    assert report.returncode == code and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1].startswith("pnmix-report: ") and "no report was written" in err.splitlines()[-1]
    assert list((tmp_path / "out").iterdir()) == [] and gone(step)


def test_after_sigkill_the_step_dies_and_the_next_run_removes_the_staging_folder(tmp_path, capsys):
    report, step = start(tmp_path)
    (staging,) = (tmp_path / "out").iterdir()
    report.kill()
    report.communicate()
    assert wait_for(lambda: gone(step), 10), "the step outlived the report"
    argv = ["--out-dir", str(tmp_path / "out"), "--name", "next", "--no-committed-results", *NOTHING_RUN]
    assert cli.main(argv) == 0
    assert f"pnmix-report: removed {staging}, left by a report run (pid {report.pid})" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["next"]
