"""The one step runner every command uses: output kept, budget kept, nothing left running."""

import os
import sys

from benchmarks.commands import subprocesses

PRINTS = "import sys, time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.3)\nsys.exit(3)\n"


def test_output_goes_to_the_log_the_tail_and_the_progress_note(tmp_path):
    notes = []
    ended = subprocesses.run([sys.executable, "-c", PRINTS], log=tmp_path / "log.txt", poll_s=0.1, on_poll=notes.append)
    assert ended.exit_code == 3 and not ended.timed_out
    assert ended.tail == ("line 0", "line 1", "line 2")
    assert (tmp_path / "log.txt").read_text() == "line 0\nline 1\nline 2\n"
    assert {"line 0", "line 1"} <= set(notes)


def test_a_step_past_its_budget_and_what_it_started_are_ended(tmp_path):
    child = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    ended = subprocesses.run([sys.executable, "-c", code], timeout_s=3, grace_s=1)
    assert ended.timed_out and ended.exit_code != 0 and ended.seconds < 3 + 1 + subprocesses.GRACE_S + 2
    pid = int(child.read_text())
    try:
        os.kill(pid, 0)
        alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "the step's own child outlived the step"
