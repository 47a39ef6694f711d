"""One way to run a step as a subprocess, for every command that runs steps (`pnmix-report`,
`python -m benchmarks.gpu_check`): the step runs in a process group of its own that dies with this
process; its output is kept (a log file and/or this process's stdout) with its last lines; past its
time budget it is interrupted (SIGINT: pytest stops and writes what it has), then stopped; and an
interrupted run never leaves a step running behind it.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from benchmarks.commands.interrupts import shielded

#: Seconds a step gets to end after SIGINT (its time budget spent) or SIGTERM (a stop) before it is killed.
GRACE_S = 5.0
#: Lines of a step's output kept in memory (its reason for failing is read from them).
TAIL_LINES = 400
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a step ended: its exit code, wall seconds, whether its time budget ran out, its last lines."""

    exit_code: int
    seconds: float
    timed_out: bool
    tail: tuple[str, ...]
    waiting_on: str = ""  # past its budget: its last line before it was interrupted (what it was waiting on)


def _preexec():
    """A preexec_fn (POSIX): SIGINT back to its default (a shell that starts us in the background
    ignores it, and children inherit that), and on Linux the kernel kills the step when this process
    dies, even by SIGKILL, which no handler of ours sees."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
        except (OSError, AttributeError):
            prctl = None

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the request took effect
                os._exit(1)

    return preexec


def _child_options() -> dict:
    if os.name != "posix":
        return {}
    return {"start_new_session": True, "preexec_fn": _preexec()}


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the step's process has ended, without reaping it where possible: until it is reaped its
    process group id cannot be reused, so that the group can still be signalled safely."""
    if hasattr(os, "waitid"):
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True
    return proc.poll() is not None


def _wait_exited(proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not _exited(proc) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _exited(proc)


def stop(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """End a step and every process it started: SIGTERM to its group, SIGKILL to what is left after grace_s."""
    if os.name != "posix":
        proc.kill()
        proc.wait()
        return
    _signal_group(proc.pid, signal.SIGTERM)
    _wait_exited(proc, grace_s)
    _signal_group(proc.pid, signal.SIGKILL)  # its own children, or itself when it did not end in time
    proc.wait()


def _interrupt(proc: subprocess.Popen, grace_s: float) -> None:
    """Its time budget spent: SIGINT (pytest then stops and writes its results), then stop."""
    if os.name == "posix":
        _signal_group(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    if not _wait_exited(proc, grace_s):
        stop(proc)


def run(
    argv: Sequence[str],
    *,
    log: Path | None = None,
    echo: bool = False,
    timeout_s: float | None = None,
    grace_s: float = GRACE_S,
    poll_s: float = 1.0,
    on_poll: Callable[[str], object] | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Ended:
    """Run `argv` to its end or its time budget (timeout_s; then grace_s to end after SIGINT). Its
    output (stdout and stderr) goes line by line to `log` (replaced), to this process's stdout when
    `echo`, and its last TAIL_LINES lines into the result; every poll_s seconds `on_poll` gets its
    newest line (a progress bar's note)."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    start = time.monotonic()
    sink = open(log, "w", encoding="utf-8", errors="replace") if log is not None else None
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            **_child_options(),
        )

        def pump() -> None:
            for line in proc.stdout:
                if sink is not None:
                    sink.write(line)
                    sink.flush()
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                tail.append(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out, waiting_on = False, ""
        try:
            while True:
                left = None if timeout_s is None else timeout_s - (time.monotonic() - start)
                if left is not None and left <= 0:
                    timed_out = True
                    waiting_on = next((t.strip() for t in reversed(tail) if t.strip()), "")
                    _interrupt(proc, grace_s)
                    break
                try:
                    proc.wait(timeout=poll_s if left is None else min(poll_s, left))
                    break
                except subprocess.TimeoutExpired:
                    if on_poll is not None:
                        on_poll(next((t.strip()[-70:] for t in reversed(tail) if t.strip()), ""))
        except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: do not leave the step running
            with shielded():
                stop(proc)
            raise
        exit_code = proc.wait()
        reader.join(timeout=GRACE_S)
    finally:
        if sink is not None:
            sink.close()
    return Ended(exit_code, round(time.monotonic() - start, 1), timed_out, tuple(tail), waiting_on)
