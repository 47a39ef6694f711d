"""Which results measured the code of this tree: those go to the comparison; the others, to History.

A result of a measurement tool (`BEHAVIOUR_KINDS`: fidelity, long outputs, equal bits, role calibration, task
accuracy) records what decides it (`benchmarks.canaries.behaviour.record`): the canaries of the methods,
implementations and pipeline it ran (the same code paths on fixed tiny workloads), its data's digests, the
model's fingerprint and the versions of the libraries that change numerics. Such a result is current while
its canaries reproduce here (each canary runs once per report) and its data files are unchanged: a refactor,
a moved file or a reworded comment changes nothing, while a change of what a method or a step computes
sends every result that ran it to History, naming the method or step. A measurement result without canaries
is never current.

A decode-kernel timing that records the machine code it timed (`benchmarks.efficiency.compiled`: the SASS digest of
every kernel it ran, reproduced by compiling its launches ahead of time for the same GPU) is current while those
kernels compile here to the same SASS (`pnmix.aot`, no GPU needed): a refactor that compiles to the same code keeps
it, a changed launch choice or code generation sends it to History naming the kernel. Where this machine cannot
compile them (no toolchain) or the record is not faithful, it falls back to the rule below.

Conformance, GPU-check and other pytest-benchmark (timing) files keep the rule below: a timing measures the code
that ran on the device it ran on, which a CPU canary cannot reproduce, and a conformance verdict covers the
inputs its properties draw, which a fixed workload does not. Such a result
records the code it measured (`reference.records.code_fingerprint`: every file's sha256, what each file does
as the digests of its definitions, and the commit). It is current while every definition it measured is in
this tree (in any file: comments, docstrings, layout and moves change nothing; `changed_files`), or, for a
result that records bytes only, while every file is unchanged; it belongs to history otherwise, labelled
with its commit and the files that changed. A result that records no code (written before results carried
it) cannot be shown to be current, so it is history too. A conformance or benchmark file with several
implementations or points is split: each part goes where its own code says.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.canaries import behaviour as canaries
from benchmarks.efficiency import compiled
from reference import records
from reports import schema
from reports.inputs import BENCHMARK, Source

NO_FINGERPRINT = "records no code fingerprint (written before results recorded the code they measured)"
NO_CANARIES = "records no canaries (written before results recorded the behaviour they measured): remake it"
#: The kinds judged by their canaries (`judge_behaviour`).
BEHAVIOUR_KINDS = frozenset({"fidelity", "long-output", "equal-bits", "role-calibration", "task-accuracy"})


@dataclasses.dataclass(frozen=True)
class Verdict:
    current: bool
    why: str  # empty when current
    commit: str | None


#: The packages whose definitions a moved one may be found in (`tree_units`).
TREE = ("reference", "pnmix", "benchmarks", "conformance", "reports")


@functools.lru_cache(maxsize=1)
def tree_units() -> frozenset[str]:
    """The digests of every top-level definition and statement of this tree's code (`records.code_units`)."""
    return frozenset(u for p in records.code_files(*TREE) for u in records.code_units(p) or ())


def _units(path: Path) -> frozenset[str]:
    return frozenset(records.code_units(path) or ())


def _once(read: Callable[[Path], object], path: Path) -> object:
    """`read(path)` (a file's digest or its units); inside `split`, once per file: a thousand results that
    measured one file have it read and parsed once, not a thousand times."""
    if _READ is None:
        return read(path)
    if (read, path) not in _READ:
        _READ[read, path] = read(path)
    return _READ[read, path]


#: What `split` has read of each file, while it runs (the tree does not change under one report's judgement).
_READ: dict[tuple[Callable, Path], object] | None = None


def changed_files(code: dict) -> list[str]:
    """The recorded files whose code here differs from what was measured, or that are not here. Where a
    result records what each file does (`units`), a file is unchanged while every definition it measured
    is in this tree, in any file (a comment, a docstring, the layout or a move change nothing); otherwise
    its bytes must be the same."""
    out = []
    units = code.get("units") or {}
    for key, digest in sorted(code["files"].items()):
        measured = units.get(key)
        path = records.code_path(str(key))
        if path is None:
            unchanged = False
        elif measured is None:
            unchanged = _once(records.file_digest, path) == digest
        else:  # the file itself as it is now, and (for this tree's code) any file of the tree
            here, tree = _once(_units, path), frozenset() if str(key).startswith(records.SITE) else tree_units()
            unchanged = all(u in here or u in tree for u in measured)
        if not unchanged:
            out.append(key)
    return out


def judge(codes: Sequence[dict | None], commit: str | None = None) -> Verdict:
    """One verdict for the code records of one result (all must be current)."""
    if not codes or any(
        not isinstance(c, dict) or not isinstance(c.get("files"), dict) or not c["files"] for c in codes
    ):
        return Verdict(False, NO_FINGERPRINT, commit)
    commit = next((c.get("commit") for c in codes if c.get("commit")), commit)
    changed = sorted({f for c in codes for f in changed_files(c)})
    if not changed:
        return Verdict(True, "", commit)
    shown = ", ".join(f"`{f}`" for f in changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    return Verdict(False, f"its code differs from this tree's: {shown}", commit)


#: Every tool's own canary, by the pipeline name results record it under (each kind's `pipeline`): the report
#: hands them to the canaries, which import no tool.
PIPELINES = schema.PIPELINES


def judge_behaviour(data: dict) -> Verdict:
    """A measurement result: current while every canary it recorded reproduces and its data files are
    unchanged (`benchmarks.canaries.behaviour.moved`); never without canaries."""
    code = data.get("code")
    commit = code.get("commit") if isinstance(code, dict) else None
    recorded = data.get("behaviour")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("canaries"), dict) or not recorded["canaries"]:
        return Verdict(False, NO_CANARIES, commit)
    moved = canaries.moved(recorded, PIPELINES)
    if not moved:
        return Verdict(True, "", commit)
    shown = "; ".join(moved[:4]) + (f"; and {len(moved) - 4} more" if len(moved) > 4 else "")
    return Verdict(False, f"its canaries moved: {shown}{made_elsewhere(data)}", commit)


def made_elsewhere(data: dict) -> str:
    """Where a result whose canaries moved was made otherwise than this report: the libraries that change
    numerics at other versions, a GPU or another dtype (a task-accuracy result records its `dtype` and
    `device_class`). Canaries run on the CPU in float32 wherever they are recorded, so a GPU alone moves
    none; a library at another version can, with this tree's code unchanged: said, so that a reader does
    not take it for changed code."""
    recorded = (data.get("behaviour") or {}).get("versions") or {}
    here = canaries.versions()
    libraries = [
        f"{name} {recorded[name]} (here {here.get(name, 'not installed')})"
        for name in sorted(recorded)
        if isinstance(recorded[name], str) and recorded[name] != here.get(name)
    ]
    made = [f"on {data['device_class']}" if data.get("device_class") not in (None, "cpu") else ""]
    made.append(f"in {data['dtype']}" if data.get("dtype") not in (None, "float32") else "")
    made = " ".join(m for m in made if m)
    if not libraries and not made:
        return ""
    said = ", ".join(
        x for x in (f"made {made}" if made else "", "with " + ", ".join(libraries) if libraries else "") if x
    )
    reason = (
        "the canaries of the same code move with those libraries: rerun the result, or this report, with them"
        if libraries
        else "its canaries ran on the CPU in float32 there too, so this is not the device: the code it measured differs"
    )
    return f" ({said}; {reason})"


def judge_timing(bench: dict, fallback: str | None = None) -> Verdict:
    """One benchmark point: by the machine code it timed where it records it faithfully and this machine can
    compile it (`benchmarks.efficiency.compiled`), else by its code fingerprint."""
    info = bench.get("extra_info") or {}
    rec = info.get("compiled")
    code = info.get("code")
    commit = (code.get("commit") if isinstance(code, dict) else None) or fallback
    if compiled.faithful(rec):
        changed = compiled.moved(rec)
        if not isinstance(changed, str):
            if not changed:
                return Verdict(True, "", commit)
            return Verdict(False, f"its kernels compile to other machine code here: {', '.join(changed)}", commit)
    return judge([code], fallback)


def _benchmark_commit(data: dict) -> str | None:
    info = data.get("commit_info") or {}
    return info.get("id")


def split_source(source: Source) -> list[tuple[Source, Verdict]]:
    """The parts of one result file, each with its verdict (a file whose parts agree stays whole)."""
    data = source.data
    if source.refused:  # its numbers are not what its own outcomes give (`inputs.load`): shown, never compared
        code = data.get("code")
        return [(source, Verdict(False, source.refused, code.get("commit") if isinstance(code, dict) else None))]
    if source.kind == "conformance":
        suite = data.get("code")
        details = {d.get("name"): d for d in data.get("implementation_details") or []}
        names = list(dict.fromkeys(r["implementation"] for r in data["results"]))
        verdicts = {n: judge([suite, (details.get(n) or {}).get("code")]) for n in names}

        def part(keep: list[str]) -> Source:
            return dataclasses.replace(
                source,
                data={
                    **data,
                    "results": [r for r in data["results"] if r["implementation"] in keep],
                    "implementation_details": [
                        d for d in data.get("implementation_details") or [] if d.get("name") in keep
                    ],
                },
            )

        return _grouped(names, verdicts, part, source)
    if source.kind == BENCHMARK:
        fallback = _benchmark_commit(data)
        names = [b.get("fullname") or b.get("name") for b in data["benchmarks"]]
        verdicts = {n: judge_timing(b, fallback) for n, b in zip(names, data["benchmarks"], strict=True)}

        def part(keep: list[str]) -> Source:
            kept = [b for n, b in zip(names, data["benchmarks"], strict=True) if n in keep]
            return dataclasses.replace(source, data={**data, "benchmarks": kept})

        return _grouped(names, verdicts, part, source)
    if source.kind in BEHAVIOUR_KINDS:
        return [(source, judge_behaviour(data))]
    return [(source, judge([data.get("code")]))]


def _grouped(names, verdicts: dict, part, source: Source) -> list[tuple[Source, Verdict]]:
    groups: dict[Verdict, list] = {}
    for n in names:
        groups.setdefault(verdicts[n], []).append(n)
    if len(groups) <= 1:
        return [(source, next(iter(groups), judge([])))]
    return [(part(keep), v) for v, keep in groups.items()]


def split(sources: Sequence[Source]) -> tuple[list[Source], list[tuple[Source, Verdict]]]:
    """(current sources, history: (source, verdict) pairs), in the given order."""
    global _READ
    current, history = [], []
    _READ = {}
    try:
        for s in sources:
            for part, verdict in split_source(s):
                if verdict.current:
                    current.append(part)
                else:
                    history.append((part, verdict))
    finally:
        _READ = None
    return current, history


#: Pairs of contradicting results said in full on page 1; past them, a count.
SHOWN_CONTRADICTIONS = 5


def _task_outcomes(sources: Sequence[Source]) -> dict[tuple, dict[tuple, list[tuple[Source, str]]]]:
    """Every run's outcomes on every task, by what decides them: the model (its fingerprint), the pair layout,
    the run (its label and configuration, model_args), the task, its data file and its items."""
    out: dict[tuple, dict[tuple, list[tuple[Source, str]]]] = {}
    for s in sources:
        if s.kind != "task-accuracy":
            continue
        d = s.data
        model, data = d.get("model_fingerprint") or d["model"], d.get("task_files") or {}
        for run in d["runs"]:
            for t in d["tasks"]:
                key = (model, d.get("pair_layout"), run["label"], run.get("model_args"), t["name"])
                key += (data.get(t["name"]), t["items"])
                correct = tuple(run["results"][t["name"]]["correct"])
                out.setdefault(key, {}).setdefault(correct, []).append((s, run["label"]))
    return out


def contradictions(sources: Sequence[Source]) -> list[str]:
    """Results that ran the same model, configuration and items and disagree on some item's outcome, one
    line per pair of files (SHOWN_CONTRADICTIONS, then a count): a result file is evidence as given, not
    signed, and two that disagree cannot both be right. Task accuracy only: its outcomes are right or wrong
    per item, so a disagreement is exact, not a matter of tolerance."""
    pairs: dict[tuple[int, int], tuple[Source, Source, list[str]]] = {}  # by the files' ids: a Source is no key
    for key, variants in _task_outcomes(sources).items():
        task, items = key[4], key[6]
        (first, holders), *others = variants.items()  # each other variant against the first file's
        a = holders[0][0]
        for outcomes, [(b, label), *_] in others:
            if b is not a:
                differ = sum(x != y for x, y in zip(first, outcomes, strict=True))
                pairs.setdefault((id(a), id(b)), (a, b, []))[2].append(f"{label} on {task} ({differ} of {items} items)")
    lines = []
    for a, b, where in list(pairs.values())[:SHOWN_CONTRADICTIONS]:
        shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        ran = [(s.data.get("device"), s.data.get("versions")) for s in (a, b)]
        why = (
            "they cannot both be right"
            if ran[0] == ran[1]
            else f"they ran on {a.data.get('device')} and {b.data.get('device')} (with the library versions each "
            "records): check whether that explains it; otherwise they cannot both be right"
        )
        lines.append(
            f"`{a.name}` and `{b.name}` ran the same model, configuration and items and disagree: {shown}; {why}"
        )
    if len(pairs) > SHOWN_CONTRADICTIONS:
        lines.append(f"and {len(pairs) - SHOWN_CONTRADICTIONS} more pairs of files like these")
    return lines
