"""The report's first screen: one row per method of the registry at its budget, the figure of accuracy against
key bits under it, and one sentence per model on what the numbers show and their limits.

Every cell is short; what a cell cannot say (which configuration a sweep ran at a method's budget) is a
numbered note under the table. The numbers are those of the sections below, computed by their functions:
bits by the storage section's count (`reports.sections.storage.count`), accuracy differences from FP16 by
`benchmarks.accuracy.stats.paired_interval` over the informative tasks of a view (section 8's rule), drift by
`benchmarks.fidelity.long_output.quarter_means`, GPU decode time by `reports.sections.summary.speed_rows`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from benchmarks.accuracy.stats import paired_interval
from benchmarks.fidelity import long_output
from reference import methods
from reports import figures
from reports.inputs import Source, of_kind
from reports.markdown import Section, escape, figure, table
from reports.sections import accuracy as acc
from reports.sections import by_method, model_label, storage, summary
from reports.sections import long_output as long_output_section
from reports.sections.measured import is_fp16

TITLE = "At a glance"
FIGURE = "accuracy-against-key-bits.png"
#: A sweep's run stands for a method whose own configuration no run of the model ran when the sweep picked it
#: for a key budget within this many bits of the method's own key bits (half the sweep's budget step).
BUDGET_TOLERANCE = 0.125
#: Short names of the two views in a column's header.
SHORT_VIEW = {"choosing among candidates": "choosing", "producing the answer": "producing"}
#: Confidence of the intervals of the accuracy differences.
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Panel:
    """One model's tasks of one view, from the task-accuracy result with the most informative items of it."""

    model: str
    view: str
    source: Source
    tasks: list[str]

    @property
    def header(self) -> str:
        return f"Δ {SHORT_VIEW.get(self.view, self.view)}, {self.model}"


def panels(sources: Sequence[Source]) -> list[Panel]:
    """Every (model, view) a current task-accuracy result has informative tasks of, models in the order first
    met; where several results have one, the one with the most items."""
    best: dict[tuple[str, str], tuple[int, Panel]] = {}
    for s in sources:
        model = model_label(s.data["model"])
        for view, tasks in acc.views(s.data, acc.informative(s.data)).items():
            items = len(acc.pooled(acc.fp16_run(s.data), tasks))
            if (model, view) not in best or items > best[(model, view)][0]:
                best[(model, view)] = (items, Panel(model, view, s, tasks))
    models = list(dict.fromkeys(m for m, _ in best))
    order = list(acc.VIEWS.values())
    keys = sorted(best, key=lambda k: (models.index(k[0]), order.index(k[1]) if k[1] in order else len(order)))
    return [best[k][1] for k in keys]


def own_key_bits(name: str) -> float:
    return storage.count(methods.config(name))[1]


def run_of(name: str, panel: Panel, rows: Sequence[by_method.Row]) -> tuple[dict, str] | None:
    """The run of `panel`'s result that stands for method `name`, with what it ran where that is not the method's
    own configuration ("" where it is): its own configuration, else the sweep's pick for the budget nearest its
    own key bits (within BUDGET_TOLERANCE); None where no run does."""
    mine = [
        (row, run, options) for row in rows if row.method == name for s, run, options in row.runs if s is panel.source
    ]
    own = [(run, options) for row, run, options in mine if row.own]
    if own:
        run, options = own[0]
        given = ", ".join(
            f"its allocation for a {v:g}-bit budget" if k == "budget" else f"{k} {v}" for k, v in options.items()
        )
        return run, (f"ran with {given}" if given else "")
    target = own_key_bits(name)
    picked = [
        (abs(b - target), row, run)
        for row, run, _ in mine
        for b in [run.get("budget")]
        if b is not None and abs(b - target) <= BUDGET_TOLERANCE
    ]
    if not picked:
        return None
    _, row, run = min(picked, key=lambda p: p[0])
    return run, (
        f"ran {summary.config_label(row.config)} ({storage.count(row.config)[1]:.2f} key bits), the sweep's pick "
        f"for its {run['budget']:g}-bit key budget"
    )


@dataclasses.dataclass
class Notes:
    """Numbered notes of the table: one per distinct text, cited by its number."""

    texts: list[str] = dataclasses.field(default_factory=list)

    def mark(self, text: str) -> str:
        if not text:
            return ""
        if text not in self.texts:
            self.texts.append(text)
        return f" ({self.texts.index(text) + 1})"


@dataclasses.dataclass(frozen=True)
class Difference:
    method: str
    value: float
    low: float
    high: float


def difference(method: str, run: dict, base: dict, tasks: Sequence[str]) -> Difference:
    """`method`'s run against FP16 on the same items: the difference of accuracies and its paired interval."""
    mine, ref = acc.pooled(run, tasks), acc.pooled(base, tasks)
    low, high = paired_interval(mine, ref, CONFIDENCE)
    return Difference(method, sum(mine) / len(mine) - sum(ref) / len(ref), low, high)


def _bits(name: str) -> str:
    low, high = by_method.bit_range(methods.config(name))
    return f"{low:.2f}" if low == high else f"{low:.2f}-{high:.2f}"


def _drift(name: str, long_runs: dict[str, Source]) -> list[str]:
    cells = []
    for s in long_runs.values():
        kl = None if is_fp16(name) else (s.data["summary"]["methods"].get(name) or {}).get("kl")
        if kl:
            q = long_output.quarter_means(kl)
            cells.append(f"{q[0]:.3g} -> {q[-1]:.3g}")
        else:
            cells.append("FP16 itself" if is_fp16(name) else "-")
    return cells


def long_runs(sources: Sequence[Source], models: Sequence[str] = ()) -> dict[str, Source]:
    """Per model, the long-output run its claims rest on (`reports.sections.long_output.primaries`: the full run
    with the longest outputs); `models` first, in their order."""
    found = {model_label(s.data["model"]): s for s in long_output_section.primaries(of_kind(sources, "long-output"))}
    return {m: found[m] for m in [*models, *found] if m in found}


def _figure(shown: Sequence[Panel]) -> bytes | None:
    if not shown:
        return None
    ncols = min(2, len(shown))
    nrows = math.ceil(len(shown) / ncols)

    marker_of = acc.markers([p.source.data for p in shown])

    def draw(*axes):
        for ax, p in zip(axes, shown, strict=False):
            acc.draw_panel(ax, p.source.data, p.tasks, f"{p.model}\n{p.view}", marker_of)
        for ax in axes[len(shown) :]:
            ax.set_visible(False)

    return figures.png(draw, ncols=ncols, nrows=nrows, size=(5.0, 3.6))


def _sentence(model: str, shown: Sequence[Panel], found: dict[int, list[Difference]]) -> str:
    """What one model's differences show, view by view: how many methods fall below FP16 beyond chance, and the
    smallest and largest difference."""
    parts = []
    for i, p in enumerate(shown):
        ds = found.get(i, [])
        if p.model != model or not ds:
            continue
        below = sum(d.high < 0 for d in ds)
        least, most = max(ds, key=lambda d: d.value), min(ds, key=lambda d: d.value)
        n = len(acc.pooled(acc.fp16_run(p.source.data), p.tasks))
        where = f"{SHORT_VIEW.get(p.view, p.view)} ({n} items, {len(p.tasks)} tasks)"
        if len(ds) == 1:
            beyond = "below FP16 beyond chance" if below else "not told from FP16 by these items"
            parts.append(f"{where}: {least.method}, the only method run at its budget, {least.value:+.3f}, {beyond}")
            continue
        parts.append(
            f"{where}: {below} of {len(ds)} methods below FP16 beyond chance, from {least.method} "
            f"{least.value:+.3f} to {most.method} {most.value:+.3f}"
        )
    return f"**{escape(model)}**: " + escape("; ".join(parts) + ".") if parts else ""


def render(sources: Sequence[Source]) -> Section:
    """The first screen, from `sources` (the current results)."""
    tasks = of_kind(sources, "task-accuracy")
    shown = panels(tasks)
    rows_by_method, _ = by_method.rows_of(tasks)
    longs = long_runs(sources, [p.model for p in shown])
    speeds = by_method.method_speeds(sources)
    notes = Notes()
    found: dict[int, list[Difference]] = {}
    rows = []
    for name in methods.REGISTRY:
        cells = []
        for i, p in enumerate(shown):
            base = acc.fp16_run(p.source.data)
            if is_fp16(name):
                a = acc.wilson(acc.pooled(base, p.tasks))
                cells.append(f"FP16: {a.value:.3f}")
                continue
            picked = run_of(name, p, rows_by_method)
            if picked is None:
                cells.append("-")
                continue
            run, how = picked
            d = difference(name, run, base, p.tasks)
            found.setdefault(i, []).append(d)
            cells.append(f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" + notes.mark(how))
        speed = "the reference" if is_fp16(name) else summary.speed_text(speeds.get(name, []))
        rows.append([name, _bits(name), *cells, *_drift(name, longs), speed])
    headers = [
        "method",
        "bits / element",
        *(p.header for p in shown),
        *(f"long-output KL, {m}" for m in longs),
        "GPU decode vs FP16",
    ]
    files = sorted({p.source.name for p in shown} | {s.name for s in longs.values()})
    source = (
        f"bits computed ({storage.COUNT_RULE}); accuracy and drift measured, "
        + (", ".join(f"`{f}`" for f in files) or "no current task-accuracy or long-output result")
        + " (device, date and command: sections 6 and 8); GPU decode measured where a GPU ran the kernel "
        "benchmark (section 5)"
    )
    png = _figure(shown)
    models = list(dict.fromkeys(p.model for p in shown))
    sentences = [s for m in models if (s := _sentence(m, shown, found))]
    widths = sorted(d.high - d.low for ds in found.values() for d in ds)
    limits = (
        f"Limits: {acc.SCALE}; an accuracy interval here is about {widths[len(widths) // 2] / 2:.2f} wide "
        "on each side, so smaller differences are not resolved."
        if widths
        else "No current task-accuracy result: accuracy is not compared here."
    )
    key = (
        "Δ: accuracy minus FP16's on the same items, pooled over the informative tasks of the view (section 8), "
        f"[{CONFIDENCE:.0%} paired interval]. bits: section 3's count (a per-token method from all tokens low to "
        "all high). long-output KL: mean KL(FP16 || method), first -> last quarter of the output. -: not run."
    )
    numbered = "".join(f"\n{i + 1}. {escape(t)}" for i, t in enumerate(notes.texts))
    parts = [
        table(rows, headers, source),
        figure(FIGURE, "Accuracy against key bits, per model and view (measured; section 8)") if png else "",
        "\n\n".join([*sentences, escape(limits)]) + "\n",
        escape(key) + ("\n" + numbered if numbered else "") + "\n",
    ]
    return Section(TITLE, "\n".join(p for p in parts if p), figures={FIGURE: png} if png else {})
