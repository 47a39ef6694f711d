"""Page 1's answer to "which method, at which budget": one row per method of the registry at its own
configuration, and one per other configuration a current task-accuracy result ran of it (a family's
configuration nearest a key-bit budget), each cell citing where it comes from.

- bits / element: the storage section's count of the configuration (`reports.sections.storage.count`: one
  number per configuration in every section; the per-token methods from every token low to every token
  high, since their allocation sets the share);
- attention error: measured by the conformance runs, where an implementation of the method's design ran
  this very configuration on that workload;
- task accuracy: pooled over the informative tasks, per view (choosing among candidates, producing the
  answer), with the task-accuracy section's own functions (`reports.sections.accuracy`);
- long-output drift: mean KL(FP16 || method) over the first and the last quarter of the output positions
  of each full long-output run (`benchmarks.fidelity.long_output.quarter_means`);
- decode speed: the decode-attention time against FP16 SDPA's where a GPU ran the kernel benchmark of the
  method's built-in implementation (`reports.sections.summary.speed_rows`).

Only the results it is given feed it: the report gives it the current ones (`reports.currency`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from benchmarks.efficiency.plugins import BUILTIN_IMPLEMENTATIONS
from benchmarks.fidelity import long_output
from reference import PNMixConfig, methods
from reference.tokens.config import TokenPrecisionConfig
from reports.inputs import Source, benchmarks, of_kind
from reports.markdown import Citations, escape, table
from reports.provenance import computed, measured
from reports.sections import accuracy as acc
from reports.sections import model_label, storage, summary
from reports.sections.accuracy_runs import run_config
from reports.sections.measured import is_fp16

HEADING = "### Which method, at which budget"


@dataclasses.dataclass
class Row:
    """A method at one configuration, and the task-accuracy runs of it: (source, run, other model_args)."""

    method: str
    config: PNMixConfig | TokenPrecisionConfig
    budgets: set = dataclasses.field(default_factory=set)
    runs: list = dataclasses.field(default_factory=list)

    @property
    def own(self) -> bool:
        """At the registry's configuration of its method (what the other tools measure)."""
        return self.config == methods.config(self.method)


#: Roles of task-accuracy runs that stand for no method: Table 8's one-sided runs and the sweep's controls (KIVI's
#: picks at Eq. 7's midpoints), reported in the accuracy section alone.
NOT_A_METHOD = ("table 8", "control")


def rows_of(sources: Sequence[Source]) -> tuple[list[Row], list[str]]:
    """A row per registry method at its own configuration, then one per other configuration of it that a
    task-accuracy result ran (the sweep's budgets; Table 8's runs and the controls are no method and stay in the
    accuracy section); and
    the runs whose configuration this tree cannot build, with why."""
    rows = {(name, repr(methods.config(name))): Row(name, methods.config(name)) for name in methods.REGISTRY}
    unread = []
    for s in sources:
        for run in s.data["runs"]:
            try:
                ran = run_config(run) if run["role"] not in NOT_A_METHOD else None
            except (ValueError, TypeError, AttributeError) as why:  # a value this tree's configurations refuse
                unread.append(f"{run['label']} of `{s.name}` ({why})")
                continue
            if ran is None:
                continue
            name, config, options = ran
            row = rows.setdefault((name, repr(config)), Row(name, config))
            row.runs.append((s, run, options))
            if run.get("budget") is not None:
                row.budgets.add(run["budget"])
    order = list(methods.REGISTRY)
    ordered = sorted(rows.values(), key=lambda r: (order.index(r.method), not r.own, -min(r.budgets, default=0)))
    return ordered, unread


def label(row: Row) -> str:
    """A method at its own configuration by its name; any other configuration by its design and what it is
    (a KIVI cache with 1-bit keys is not KIVI-2), with the key-bit budgets the sweep picked it for."""
    budgets = ", ".join(f"{b:g}" for b in sorted(row.budgets, reverse=True))
    if row.own:
        return row.method + (f" (the sweep's pick for its {budgets}-bit key budget)" if budgets else "")
    at = f" (the sweep's pick for its {budgets}-bit key budget)" if budgets else ""
    return f"{methods.method(row.method).design}, {summary.config_label(row.config)}{at}"


# -- bits ------------------------------------------------------------------------------------------


def bit_range(config: PNMixConfig | TokenPrecisionConfig) -> tuple[float, float]:
    """Section 3's count of a configuration (`storage.count`); a per-token method's from every token low to every
    token high (its allocation sets the share), a channel one's twice."""
    if isinstance(config, TokenPrecisionConfig):
        return storage.count(config, 1.0)[0], storage.count(config, 0.0)[0]
    return storage.count(config)[0], storage.count(config)[0]


def bits(config: PNMixConfig | TokenPrecisionConfig) -> str:
    """Section 3's count (`storage.count_text`); a per-token method from every token low to every token high."""
    if isinstance(config, TokenPrecisionConfig):
        low, high = bit_range(config)
        return f"{low:.2f}-{high:.2f} (every token at {config.low_bits} to {config.high_bits} bits)"
    return storage.count_text(config)


BITS_SOURCE = computed(f"reports.sections.storage.count, {storage.COUNT_RULE}")


# -- attention error -------------------------------------------------------------------------------


def errors(conformance: Sequence[Source]) -> list[tuple[Source, dict, PNMixConfig]]:
    """(source, record, configuration) of every realistic-workload attention error of the conformance runs whose
    configuration reads (`summary.ran`)."""
    out = []
    for s in conformance:
        for r in s.data["results"]:
            workload = summary.ran(r)
            error = (r.get("measured") or {}).get(summary.ERROR)
            if isinstance(error, (int, float)) and workload is not None and workload.config is not None:
                out.append((s, r, workload.config))
    return out


def _error(row: Row, measured_errors, cites: Citations) -> str:
    design = methods.design(methods.method(row.method).design)
    ours = {design.spec, design.triton} - {None}
    # an implementation of several families (the spec) ran each family's own workload: only this row's counts
    family = type(row.config)
    of_design = [(s, r, c) for s, r, c in measured_errors if r["implementation"] in ours and type(c) is family]
    same = [(s, r) for s, r, c in of_design if c == row.config]
    if same:
        s, r = max(same, key=lambda p: p[1]["measured"][summary.ERROR])
        impls = ", ".join(sorted({r2["implementation"] for _, r2 in same}))
        return f"{r['measured'][summary.ERROR]:.3g} (largest of {impls}) {cites.cite(_conformance(s))}"
    if of_design:
        ran = "; ".join(sorted({summary.config_label(c) for _, _, c in of_design}))
        return f"-: its design's implementations ran the workload as {ran}, not this configuration"
    return "-: no current conformance result of its design measured the realistic workload"


def _conformance(s: Source) -> str:
    d = s.data
    return measured(d.get("device", "?"), d.get("date_utc", "?"), d.get("command"), s.name, "conformance run")


# -- task accuracy ---------------------------------------------------------------------------------


def views(sources: Sequence[Source]) -> list[str]:
    """The views the current task-accuracy results hold informative tasks of, in `accuracy.VIEWS` order."""
    held = {v for s in sources for v in acc.views(s.data, acc.informative(s.data))}
    return [v for v in acc.VIEWS.values() if v in held]


def _accuracy(row: Row, view: str, cites: Citations) -> str:
    cells = []
    for s, run, options in row.runs:
        tasks = acc.views(s.data, acc.informative(s.data)).get(view)
        if not tasks:
            continue
        base = acc.fp16_run(s.data)
        given = f" ({', '.join(f'{k} {v}' for k, v in options.items())})" if options else ""
        cells.append(
            f"{model_label(s.data['model'])}{given}: {acc.pooled_cell(run, base, tasks)} {cites.cite(_task(s))}"
        )
    return "; ".join(cells) or "-: no current task-accuracy result ran this configuration on tasks of this view"


def _task(s: Source) -> str:
    d = s.data
    return measured(d["device"], d["date_utc"], d["command"], s.name, f"task accuracy, model {d['model']}")


# -- long outputs and speed ------------------------------------------------------------------------


def _drift(row: Row, runs: Sequence[Source], cites: Citations) -> str:
    if is_fp16(row.method):
        return "-: the reference the drift is measured from"
    if not row.own:
        return "-: the long-output runs measure each method at its own configuration only"
    cells = []
    for s in runs:
        kl = (s.data["summary"]["methods"].get(row.method) or {}).get("kl")
        if kl:
            q = long_output.quarter_means(kl)
            cells.append(
                f"{model_label(s.data['model'])}: KL {q[0]:.3g} -> {q[-1]:.3g} over "
                f"{s.data['summary']['positions']} positions {cites.cite(_long(s))}"
            )
    return "; ".join(cells) or "-: no current full long-output run of it"


def _long(s: Source) -> str:
    d = s.data
    return measured(d.get("device", "?"), d.get("date_utc", "?"), d.get("command"), s.name, "long outputs")


def method_speeds(sources: Sequence[Source]) -> dict[str, list[tuple[dict, float]]]:
    """method -> its kernel points against FP16's (`summary.speed_rows`), the built-in implementation's only:
    a plug-in timed at a method's points is an implementation, in the table above."""
    entries = [
        {**e, "implementation": e["method"]}
        for e in benchmarks(sources, summary.SPEED_SUITE, "full")
        if is_fp16(e["method"]) or e.get("implementation") in (None, BUILTIN_IMPLEMENTATIONS.get(e["method"]))
    ]
    return summary.speed_rows(entries)


def _speed(row: Row, speeds, cites: Citations) -> str:
    if is_fp16(row.method):
        return "-: the reference the speed is measured against"
    if not row.own:
        return "-: the kernel benchmark times each method at its own configuration only"
    points = speeds.get(row.method)
    if not points:
        return "-: no current GPU kernel benchmark of it"
    e = max(points, key=lambda p: (p[0]["context"], -p[0]["batch"]))[0]
    return f"{summary.speed_text(points)} {cites.cite(_bench(e))}"


def _bench(e: dict) -> str:
    return measured(e["device"], e.get("date_utc", "?"), e.get("command"), e["source"].name, "kernel benchmark")


def render(sources: Sequence[Source]) -> str:
    """The table, its notes and its sources, from `sources` (the current results)."""
    cites = Citations("S")
    tasks = of_kind(sources, "task-accuracy")
    long = [s for s in of_kind(sources, "long-output") if "--smoke" not in s.data.get("command", "")]
    measured_errors = errors(of_kind(sources, "conformance"))
    speeds = method_speeds(sources)
    shown = views(tasks) or ["task accuracy"]
    rows = []
    table_rows, unread = rows_of(tasks)
    for row in table_rows:
        bits_cell = f"{bits(row.config)} {cites.cite(BITS_SOURCE)}"
        rows.append(
            [
                label(row),
                bits_cell,
                _error(row, measured_errors, cites),
                *(_accuracy(row, v, cites) for v in shown),
                _drift(row, long, cites),
                _speed(row, speeds, cites),
            ]
        )
    headers = [
        "method",
        storage.COUNT_NAME,
        "attention error",
        *(f"accuracy, {v}" for v in shown),
        "long-output drift",
        "decode speed",
    ]
    notes = (
        "One row per method of the registry (`reference.methods.REGISTRY`) at its own configuration, and one per "
        "other configuration of it that a current task-accuracy result ran (its family's configuration nearest "
        "a key-bit budget, the paper's counting), named by its design and configuration. bits: the storage "
        "section's count of the configuration, as everywhere in this report; a per-token method from every token "
        "low to every token high (its allocation sets the share). attention error: as in the table above, from the "
        "spec or Triton implementation of the method's design where it ran this very configuration. accuracy: "
        "pooled over the informative tasks of each view (section 8's rule) [95% Wilson], then the paired "
        "difference from FP16 on the same items with the exact McNemar p; one entry per model. long-output "
        "drift: mean KL(FP16 || method), nats, over the first -> the last quarter of the output positions "
        "(teacher-forced FP16 output). decode speed: as in the table above, the method's built-in "
        "implementation. '-': no current result has it, and why. Results listed under History feed no cell.\n"
    )
    if unread:
        notes += f"Left out, their configuration not buildable by this tree's registry: {'; '.join(unread)}.\n"
    return "\n".join(
        [
            HEADING + "\n",
            table(rows, headers, "each cell cites its source: the labels below"),
            escape(notes.rstrip()) + "\n",
            cites.legend("Sources of the table by method"),
        ]
    )
