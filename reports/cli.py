"""`python -m reports` / `pnmix-report`: one markdown report comparing implementations and methods.

Runs what this machine can run (the conformance suite, the benchmark suites, the fidelity
analyses), reads result files from elsewhere (--input: a GPU run's pytest-benchmark JSON,
gpu_check, conformance or fidelity results; their kind is read from their content) and the
measured results committed in benchmarks/results/, and writes <out-dir>/<name>/REPORT.md with
its PNG figures and the raw results it ran (data/). Every number says where it comes from:
measured (device, command, date, file), computed (which function) or quoted from the paper.
An existing report folder is replaced only with --force.

Nothing is left half-done: the inputs and the output folder are checked before any step runs;
Ctrl-C, SIGTERM or SIGHUP stop the steps and remove the unfinished report; a run killed outright
leaves its hidden staging folder, which the next run in the same --out-dir removes; when the
report cannot be rendered, the results the steps wrote are kept in the staging folder the error names.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from benchmarks.commands import interrupts
from conformance import loader
from reference import records
from reports import currency, environment, files, inputs, steps
from reports.document import assemble
from reports.provenance import ROOT, display_path
from reports.sections import (
    accuracy,
    by_method,
    conformance,
    equal_bits,
    fidelity,
    glance,
    gpu_evidence,
    memory,
    performance,
    storage,
    summary,
)
from reports.sections import claims as claims_section
from reports.sections import environment as environment_section
from reports.sections import history as history_section

DEFAULT_OUT = Path(__file__).resolve().parent
COMMITTED = ROOT / "benchmarks" / "results"
#: A report folder's name: a word character first (not '.', which hides it, nor '-', which reads as an
#: option), then word characters and . + = @ , - ; no separator, space, quote or control character.
NAME = re.compile(r"\w[\w.+=@,-]*")
#: At most this many characters: the staging folder beside it adds its own, within a file system's 255 bytes.
NAME_MAX = 200


@dataclasses.dataclass(frozen=True)
class Given:
    """An implementation given with --impl or --only, as the argument check loaded it (the only import of
    it in this process; each step imports it again in its own)."""

    given: str  # as on the command line: a plug-in's name or 'package.module:factory'
    name: str  # the name it reports, under which its results are filed
    version: str
    file: str  # the file of the module that holds its factory
    origin: str  # `conformance.loader.origin`


def loaded(given: str) -> Given:
    """Load an implementation once (ValueError, one line, when it does not load or its load would end this
    process: `loader.check_in_child`) and say what it is."""
    loader.check_in_child(given)
    impl = loader.load(given)
    module = sys.modules.get(loader.factory_module(given))
    file = getattr(module, "__file__", None)
    return Given(
        given, str(impl.name), str(impl.version), display_path(file) if file else "unknown", loader.origin(given)
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reports",
        description=__doc__.split("\n\n")[0],
        epilog="Default: every built-in implementation, the benchmark suites, the fidelity smoke run"
        + (f"; the example report's steps (reports/example-cpu) {cost}" if (cost := steps.example_cost()) else "")
        + ". --quick: the spec implementations, the adapters and the benchmark suites, fidelity from committed "
        "results only (its time: README, Set up).",
    )
    p.add_argument("--quick", action="store_true", help="run only the fast steps (see below)")
    p.add_argument("--name", default=None, help="report folder name (default: report-<UTC time>)")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT,
        help=f"where report folders go (default: {display_path(DEFAULT_OUT)})",
    )
    p.add_argument("--force", action="store_true", help="replace an existing report folder of the same name")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="FILE_OR_DIR",
        help="a result file, or a folder of them (*.json, recursively); repeatable",
    )
    p.add_argument(
        "--no-committed-results",
        action="store_true",
        help=f"leave out the measured results committed in {display_path(COMMITTED)}",
    )
    p.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="NAME",
        help="add an implementation to the default set: an installed plug-in's name or an import path "
        "'package.module:factory' (repeatable); it is checked by the conformance suite, benchmarked beside the "
        f"built-ins and compared in the summary (default set: every built-in; --quick: {', '.join(steps.QUICK_IMPLS)})",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="compare exactly these implementations instead of the default set (repeatable; same names as --impl)",
    )
    p.add_argument("--no-conformance", action="store_true", help="do not run the conformance suite")
    p.add_argument(
        "--hypothesis-profile",
        choices=("ci", "dev", "thorough", "smoke"),
        default="ci",
        help="hypothesis profile of the conformance run (default ci: small and derandomized; smoke: "
        "two examples a property, to check the pipeline)",
    )
    p.add_argument("--no-benchmarks", action="store_true", help="do not run the benchmark suites (benchmarks/suites)")
    p.add_argument(
        "--fidelity",
        choices=steps.FIDELITY_MODES,
        default=None,
        help="run the fidelity analyses on SmolLM2-135M: full (21 min wall on 2 CPU cores, docs/fidelity.md), "
        "smoke (its time: below), off (default: smoke, --quick: off)",
    )
    p.add_argument(
        "--step-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the time budget of every step (default: each step's own, reports.steps.BUDGETS_S; 0: no limit); a "
        "step past it is stopped, its status naming what it was waiting on",
    )
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[Given]:
    """Refuse what cannot run, before anything runs; the implementations given, each loaded once."""
    name = args.name
    if name is not None and (not NAME.fullmatch(name) or len(name) > NAME_MAX):
        p.error(
            f"--name must be a plain folder name of at most {NAME_MAX} characters: letters, digits and . _ + = @ , - "
            f"(no path separator, space or control character; not starting with '.' or '-'), got {name!r}"
        )
    budget = args.step_budget
    if budget is not None and (not math.isfinite(budget) or budget < 0):
        p.error(f"--step-budget must be a number of seconds >= 0 (0: no limit), got {budget}")
    known = set(loader.available_names())
    for flag, names in (("--impl", args.impl), ("--only", args.only)):
        for impl in names:
            if impl not in known and ":" not in impl:
                p.error(f"{flag} {impl!r}: expected one of {sorted(known)} or an import path 'package.module:factory'")
    if args.no_conformance and (args.impl or args.only):
        p.error("--impl/--only and --no-conformance contradict each other; give one of them")
    if args.impl and args.only:
        p.error("--impl adds to the default set and --only replaces it; give one of them")
    # a named implementation that does not load is refused now, not as a failed step minutes later
    given = []
    for impl in dict.fromkeys((*args.impl, *args.only)):
        try:
            given.append(loaded(impl))
        except ValueError as err:
            p.error(f"--impl {impl!r}: {err}")
    clash = name_clash(given, [] if args.only else implementations(args))
    if clash:
        p.error(clash)
    return given


def name_clash(given: list[Given], default: list[str]) -> str | None:
    """Two implementations of this run under one name would have their results filed together: say which,
    with both origins. A built-in's name is its plug-in name (`conformance.loader.builtins`)."""
    seen = {n: f"the built-in {n!r} ({loader.origin(n)})" for n in default if n in steps.ALL_IMPLS}
    for g in given:
        if g.given == g.name and g.name in default:
            continue  # a built-in named again: the same implementation
        if g.name in seen:
            return (
                f"implementation {g.given!r} ({g.origin}) is named {g.name!r}, as is {seen[g.name]}: their "
                "results would be filed under one name; give one of them, or rename one"
            )
        seen[g.name] = f"{g.given!r} ({g.origin})"
    return None


def implementations(args: argparse.Namespace) -> list[str]:
    """The implementations this report compares: --only, or the default set plus --impl, each once."""
    if args.only:
        return list(dict.fromkeys(args.only))
    default = steps.QUICK_IMPLS if args.quick else steps.ALL_IMPLS
    return list(dict.fromkeys([*default, *args.impl]))


def command_line(argv: list[str]) -> str:
    prog = "pnmix-report" if Path(sys.argv[0]).name == "pnmix-report" else "python -m reports"
    return " ".join([prog, *map(shlex.quote, argv)])


def plan(args: argparse.Namespace, data: Path, given: Sequence[Given] = ()) -> list[steps.Step | steps.Outcome]:
    """The steps to run; an implementation in `given` is named by its own name (its step, its folder)."""
    todo: list[steps.Step | steps.Outcome] = []
    impls = implementations(args)
    if not args.no_conformance:
        todo += steps.conformance_steps(impls, data, args.hypothesis_profile, {g.given: g.name for g in given})
    if not args.no_benchmarks:
        # the built-in methods are benchmarked anyway; other implementations are timed beside them
        todo.append(steps.benchmark_step(data, [n for n in impls if n not in steps.ALL_IMPLS]))
    mode = args.fidelity or ("off" if args.quick else "smoke")
    if mode != "off":
        todo.append(steps.fidelity_step(mode, data))
    return steps.with_budget(todo, args.step_budget)


def this_run_sources(outcomes: list[steps.Outcome], staging: Path, final: Path) -> list[inputs.Source]:
    """The results the steps wrote, labelled with the command that wrote them and their published path."""
    return [
        inputs.load(p, "this run", o.command, display_path(final / p.relative_to(staging)))
        for o in outcomes
        for p in o.outputs
    ]


def unique(sources: list[inputs.Source]) -> list[inputs.Source]:
    seen, out = set(), []
    for s in sources:
        key = s.path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def said(o: steps.Outcome) -> str:
    if o.status.startswith("not available"):
        return f"{o.name}: not run here, {o.status}"
    return f"{o.name}: run here ({o.status}, {o.seconds:.0f} s; its command is under Environment and provenance)"


def notes(args: argparse.Namespace, outcomes: list[steps.Outcome]) -> dict[str, str]:
    """What the conformance and fidelity sections say about their own steps (how they ran, or why not)."""
    conf = [o for o in outcomes if o.name.startswith("conformance")]
    fid = [o for o in outcomes if o.name.startswith("fidelity")]
    out = {
        "fidelity": "; ".join(map(said, fid)) + "."
        if fid
        else f"The fidelity analyses were not run here ({'--quick' if args.quick else '--fidelity off'})."
    }
    if args.no_conformance:
        out["conformance"] = "The conformance suite was not run here (--no-conformance)."
    elif conf:
        out["conformance"] = "; ".join(map(said, conf)) + "."
    return out


def given_sources(args: argparse.Namespace) -> list[inputs.Source]:
    """The committed results (unless left out) and every --input, read before any work starts."""
    committed = [] if args.no_committed_results or not COMMITTED.is_dir() else [COMMITTED]
    return inputs.load_all(committed, "committed") + inputs.load_all(args.input, "--input")


#: The kinds of result each section of `render_report` shows, in its order (storage reads none).
HISTORY_KINDS = (
    (),
    ("conformance",),
    (),
    (),
    ("pytest-benchmark", "gpu-check"),
    ("fidelity", "long-output"),
    ("equal-bits", "role-calibration"),
    ("task-accuracy",),
)


def took(outcomes: Sequence[steps.Outcome], wall_s: float) -> str:
    """'14 min 6 s wall, 1,532 CPU-seconds in its steps': what a run cost, as the README quotes it."""
    cpu = sum(o.cpu_seconds or 0.0 for o in outcomes)
    minutes, seconds = divmod(round(wall_s), 60)
    return f"{minutes} min {seconds} s wall, {cpu:,.0f} CPU-seconds in its steps"


def history_note(older: Sequence) -> str:
    """A section's line on its result files under History, counted by why: refused when read (their numbers are
    not what their own outcomes give), or of other code."""
    refused = sum(bool(s.refused) for s in older)
    parts = [
        f"{n} {what}"
        for n, what in (
            (refused, "refused when read: an aggregate or verdict they hold is not what their own outcomes give"),
            (len(older) - refused, "of code that has changed since, or that they do not record"),
        )
        if n
    ]
    return f"{len(older)} result file(s) of this section are listed under History, not shown here: {'; '.join(parts)}."


def render_report(
    name: str, command: str, git: dict, started: str, outcomes, sources, args, given: list[Given] = ()
) -> tuple[str, dict]:
    """REPORT.md's text and its figures. Only results of the code in this tree are compared; the others
    go to History (`reports.currency`)."""
    note = notes(args, outcomes)
    current, history = currency.split(sources)
    conformance_sources = inputs.of_kind(current, "conformance")
    renders = [
        lambda: summary.render(
            conformance_sources, current, len(history), by_method.render(current), gpu_evidence.render(current, history)
        ),
        lambda: conformance.render(conformance_sources, note.get("conformance", "")),
        storage.render,
        lambda: memory.render(current),
        lambda: performance.render(current),
        lambda: fidelity.render(
            inputs.of_kind(current, "fidelity"), note["fidelity"], inputs.of_kind(current, "long-output")
        ),
        lambda: equal_bits.render(inputs.of_kind(current, "equal-bits")),
        lambda: accuracy.render(inputs.of_kind(current, "task-accuracy")),
    ]
    sections = [render() for render in tqdm(renders, desc="rendering", unit="section", file=sys.stderr)]
    for section, kinds in zip(sections, HISTORY_KINDS, strict=True):
        older = [s for s, _ in history if s.kind in kinds]
        if older:
            section.body += "\n" + history_note(older) + "\n"
    claims = [c for s in sections for c in s.claims]
    env = environment_section.render(
        records.machine(), records.versions(), git, started, records.now_utc(), command, outcomes, sources, given
    )
    intro = (
        f"Generated by `{command}` on {started}. Every number carries its provenance: **measured** (device, "
        "command, date, source file), **computed** (the function), or **quoted** from the paper "
        "(arXiv 2610.19605). Only results of the code in this tree are compared; older ones are under History. "
        "Regenerate it; do not edit it by hand."
    )
    body = [*sections, claims_section.render(claims), history_section.render(history), env]
    return assemble(f"PN-Mix report: {name}", intro, body, glance.render(current))


def fail(*lines: str, code: int = 2) -> int:
    for line in lines:
        print(f"pnmix-report: {line}", file=sys.stderr)
    return code


def destination_problem(final: Path, force: bool) -> str | None:
    """Why the report cannot be published at `final` (None: it can), found before any work: a link
    (never written through, even when it leads nowhere), something that is no report folder, or a
    report folder that only --force replaces."""
    if final.is_symlink():
        return (
            f"{final} is a symbolic link (to {os.readlink(final)}); a report is never published through one: "
            "choose another --name"
        )
    if final.exists() and not final.is_dir():
        return f"{final} exists and is not a folder; choose another --name"
    if final.exists() and not (final / "REPORT.md").exists():
        return f"{final} exists and is not a report folder (no REPORT.md); choose another --name"
    if final.exists() and not force:
        return f"{final} exists; choose another --name or pass --force to replace it"
    return None


def remove_stale(out_dir: Path) -> None:
    """Staging folders of report runs that were killed (SIGKILL) before they could remove them."""
    try:
        removed = files.remove_stale(out_dir)
    except OSError:
        return  # not ours to fix: creating the staging folder says what is wrong with out_dir
    for folder, pid in removed:
        print(
            f"pnmix-report: removed {display_path(folder)}, left by a report run (pid {pid}) that was killed "
            "before it finished",
            file=sys.stderr,
        )


def kept(staging: Path, err: Exception) -> int:
    """The run could not finish its report after its steps ran: keep what they wrote and say where."""
    if isinstance(err, inputs.InputError):  # a step wrote a result the report cannot read
        lines, code = err.lines, 1
    elif isinstance(err, FileExistsError):  # the report folder appeared while this run worked
        lines, code = [str(err)], 2
    elif isinstance(err, OSError):  # the machine's fault (disk full, a folder made read-only): no traceback
        where = f": {err.filename}" if err.filename else ""
        lines, code = [f"the report could not be written ({err.strerror or err}{where})"], 1
    else:  # a fault of the report itself: its traceback is what fixes it
        traceback.print_exc()
        lines, code = [f"the report could not be written ({type(err).__name__}: {err})"], 1
    try:
        files.keep(staging)
    except OSError as why:
        lines.append(f"could not mark the folder as kept ({why})")
    return fail(*lines, f"this run's results are kept in {display_path(staging)}", code=code)


def main(argv: list[str] | None = None) -> int:
    """The command. Ctrl-C, SIGTERM and SIGHUP end its steps, remove its unfinished report and end
    it with one line (exit 128 + the signal's number)."""
    try:
        with interrupts.as_exceptions():
            return run(argv)
    except KeyboardInterrupt:
        return fail("interrupted (SIGINT): the steps were stopped and no report was written", code=130)
    except interrupts.Terminated as signalled:
        said = f"stopped ({signalled}): the steps were stopped and no report was written"
        return fail(said, code=128 + signalled.signum)


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(argv)
    impls = check_args(p, args)
    name = args.name or f"report-{records.utc_stamp()}"
    final = args.out_dir / name
    refused = destination_problem(final, args.force)
    if refused:  # now, not after minutes of work
        return fail(refused)
    try:
        given = given_sources(args)
    except inputs.InputError as err:
        return fail(*err.lines)
    command = command_line(argv)
    git = environment.git_state()  # before anything is written into the tree
    started, began = records.now_utc(), time.monotonic()
    remove_stale(args.out_dir)
    try:
        with interrupts.shielded():  # the folder exists marked as this run's, or not at all
            staging = files.new_folder(final, force=args.force)
    except OSError as err:  # here, not after the steps: out_dir cannot be written
        why = str(err) if err.errno is None else f"{err.filename}: {err.strerror}"
        return fail(f"cannot write the report in {args.out_dir} ({why})")
    try:
        todo = plan(args, staging / "data", impls)
        # each step weighs what it took in the newest earlier report here (else a default by its kind)
        outcomes = steps.run_all(todo, steps.weights(todo, steps.recorded_times(args.out_dir)))
        steps.record_times(todo, outcomes, staging / "data")
        sources = unique(this_run_sources(outcomes, staging, final) + given)
        text, figs = render_report(name, command, git, started, outcomes, sources, args, impls)
        # the steps ran in the staging folder and their files record it; readers know it by its final name
        records.write_atomic(staging / "REPORT.md", files.as_published(text.replace(str(staging), display_path(final))))
        for fig_name, png in figs.items():
            records.write_bytes_atomic(staging / fig_name, png)
        files.publish(staging, final, force=args.force)
    except Exception as err:
        return kept(staging, err)
    except BaseException:  # Ctrl-C, SIGTERM: the steps were ended; what they left is incomplete
        with interrupts.shielded():
            files.discard(staging)
        raise
    print(f"report written to {display_path(final / 'REPORT.md')} ({took(outcomes, time.monotonic() - began)})")
    failed = [o for o in outcomes if o.status.startswith("failed")]
    for o in failed:
        log = display_path(final / o.log.relative_to(staging))
        print(f"pnmix-report: step '{o.name}' {o.status}; its log is {log}", file=sys.stderr)
    return 1 if failed else 0
