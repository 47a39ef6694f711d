"""Task accuracy against key bits (the paper's Table 2, Fig. 3 / Table 14, Table 8), from the results
of `pnmix-task-accuracy`: every run's accuracy per task with its 95% Wilson interval and
item count, FP16's own beside it, each method's paired difference from FP16 on the same items (exact
McNemar p), a figure of accuracy against key bits, and the three claim rows judged on these numbers."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

from benchmarks import tasks as tasks_suite
from benchmarks.accuracy.stats import Accuracy, Margin, accuracy, items_to_resolve, margin_rule, paired, paired_interval
from benchmarks.accuracy.sweep import NEAR_EXACT_KEY_BITS
from benchmarks.accuracy.task_accuracy import extended_from, layers_note
from reference import methods, paper
from reports import figures
from reports.inputs import Source
from reports.markdown import (
    CONFIRMED,
    INCONCLUSIVE,
    MAX_FIGURES,
    NOT_CONFIRMED,
    NOT_MEASURED,
    Citations,
    Claim,
    Section,
    details,
    escape,
    figure,
    table,
    undrawn,
)
from reports.sections import model_label
from reports.sections.accuracy_runs import is_paper_main

#: FP16 within this much of chance is uninformative: no method can be told from it there.
INFORMATIVE_MARGIN = 0.15
#: The budget below which the paper says PN-Mix stays robust (Fig. 3: "the sub-2.25-bit regime"): Fig. 3
#: is judged on the budgets below it only.
SUB_BUDGET = 2.25
#: The one margin of "close to" and "differs" (`benchmarks.accuracy.stats.margin_rule`): a claim that two runs
#: are close is confirmed when the 90% interval of their paired difference lies within it (two one-sided tests at
#: 5%), refuted when the interval lies wholly outside it; a claim that they differ, the other way round.
EQUIVALENCE_MARGIN = 0.05
#: The paper's own FP16 -> PN-Mix differences of Table 2, as accuracy fractions: an interval wholly below the
#: larger drop says PN-Mix loses more than the paper reports.
PAPER_TABLE2_GAP = tuple(sorted((pnmix - fp16) / 100 for fp16, pnmix in paper.TABLE2_MEAN_ACCURACY.values()))
MARGIN_WHY = (
    "5 points: what the suite's sample plan resolves (about 350 paired items per comparison); the paper's own "
    "FP16 - PN-Mix differences, 0.6-1 point, are below what a few hundred items of a small model can resolve"
)
#: A difference "beyond chance on these items": exact McNemar p below this.
ALPHA = 0.05
#: Key budgets compare keys only where both methods keep values within this many bits of each other.
VALUE_BITS_TOLERANCE = 0.25
SCALE = (
    "these are 135M-270M models on synthetic retrieval and long-output tasks (answers ranked among candidates or "
    "produced in a few tokens), not 8B reasoning models on AIME or code: they can show whether a cache changes "
    "what a small model gets right, not the size of the paper's drops"
)


@functools.lru_cache(maxsize=4096)
def _wilson(outcomes: tuple[bool, ...]) -> Accuracy:
    return accuracy(outcomes)


def wilson(outcomes: Sequence) -> Accuracy:
    """`benchmarks.accuracy.stats.accuracy` of `outcomes`, computed once per list of outcomes: a result's FP16
    run is judged against every task and every other run (scipy's interval takes about a millisecond)."""
    return _wilson(tuple(bool(o) for o in outcomes))


def pooled(run: dict, tasks: Sequence[str]) -> list[bool]:
    """A run's item outcomes over `tasks`, in one order (the pairing with FP16 follows it)."""
    return [bool(o) for t in tasks for o in run["results"][t]["correct"]]


def at_ceiling_or_floor(runs: Sequence[dict], task: str) -> bool:
    """Whether every one of `runs` answers every item of `task` right (or every item wrong): such a task cannot
    tell the runs apart, and pooled in it would pull an equivalence verdict towards "close"."""
    outcomes = [bool(o) for r in runs for o in r["results"][task]["correct"]]
    return all(outcomes) or not any(outcomes)


def telling(runs: Sequence[dict], tasks: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the tasks that can tell `runs` apart, those at ceiling or floor for all of them: `at_ceiling_or_floor`)."""
    flat = [t for t in tasks if at_ceiling_or_floor(runs, t)]
    return [t for t in tasks if t not in flat], flat


def per_task(run: dict, base: dict, tasks: Sequence[str]) -> str:
    """Each task's paired difference from `base` with its 90% interval, beside a pooled verdict."""
    out = []
    for t in tasks:
        mine, ref = run["results"][t]["correct"], base["results"][t]["correct"]
        lo, hi = paired_interval([bool(x) for x in mine], [bool(x) for x in ref], 0.90)
        out.append(f"{t} {paired(mine, ref).difference:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    return "per task (90% interval): " + ", ".join(out)


def answer_in_question(task: str) -> str:
    """Why `task`'s answer can be found from its question alone ("" if it cannot), by the suite's current
    definition of the task (`benchmarks.tasks.Task.answer_in_question`); "" for a task not of the suite."""
    parsed = tasks_suite.parse_task_name(task)
    return "" if parsed is None else tasks_suite.BY_NAME[parsed[0]].answer_in_question


def usable(data: dict, task: dict) -> str:
    """ "yes", or why `task` is left out of the pooled accuracy and the verdicts."""
    if answer_in_question(task["name"]):
        return "no: answer in the question"
    a = wilson(fp16_run(data)["results"][task["name"]]["correct"])
    return (
        "yes" if a.value >= task["chance"] + INFORMATIVE_MARGIN and a.low > task["chance"] else "no: FP16 near chance"
    )


def informative(data: dict) -> list[str]:
    """Tasks whose answer needs the context and where FP16 is clearly above chance: by INFORMATIVE_MARGIN,
    and its Wilson interval above chance (the others are reported, not used in the pooled accuracy or the
    verdicts)."""
    return [t["name"] for t in data["tasks"] if usable(data, t) == "yes"]


def fp16_run(data: dict) -> dict:
    """The result's FP16 run, the baseline of every paired difference."""
    return next(r for r in data["runs"] if r["role"] == "baseline")


def design(run: dict) -> str | None:
    """The design a run ran (`reference.methods.DESIGNS`): as recorded, else its registry method's (results of
    older code record the method alone); None for an implementation given by name."""
    if run.get("design"):
        return run["design"]
    name = run.get("method")
    if name in methods.REGISTRY:
        return methods.method(name).design
    return name if name in methods.DESIGNS else None


def budget_runs(data: dict, of_design: str) -> list[dict]:
    """The sweep's runs of one design at its key-bit budgets, by key bits."""
    runs = [r for r in data["runs"] if r["role"] == "budget" and design(r) == of_design]
    return sorted(runs, key=lambda r: r["key_bits"])


def main_run(data: dict) -> dict | None:
    """The result's run of the paper's main configuration (H3(50%)L1, G = 128: `accuracy_runs.is_paper_main`), a
    budget's pick or a run of its own; None where it has none."""
    return next((r for r in data["runs"] if r["role"] in ("budget", "main") and is_paper_main(r)), None)


def controls(data: dict) -> dict[float, dict]:
    """The sweep's midpoint controls by budget: KIVI's pick at the budget with Eq. 7's 1-bit midpoints."""
    return {r["budget"]: r for r in data["runs"] if r["role"] == "control" and r.get("budget") is not None}


def gap_split(data: dict, tasks: Sequence[str]) -> list[tuple[float, tuple, tuple, tuple]]:
    """Fig. 3's gap at each budget with a midpoint control, split in two on the same items: (budget, PN-Mix - KIVI,
    of it KIVI at midpoints - KIVI (the 1-bit reconstruction), and PN-Mix - KIVI at midpoints (the rest: the pair
    selection, its mixed precision, the sinks)), each (difference, 90% low, 90% high, exact McNemar p)."""
    pnmix = {r["budget"]: r for r in budget_runs(data, "PN-Mix")}
    kivi = {r["budget"]: r for r in budget_runs(data, "KIVI")}
    out = []
    for budget, control in sorted(controls(data).items(), reverse=True):
        if budget not in pnmix or budget not in kivi:
            continue
        p, k, m = (pooled(r, tasks) for r in (pnmix[budget], kivi[budget], control))
        out.append((budget, *(_difference(a, b) for a, b in ((p, k), (m, k), (p, m)))))
    return out


def _difference(a: list[bool], b: list[bool]) -> tuple[float, float, float, float]:
    d = paired(a, b)
    return (d.difference, *paired_interval(a, b, 0.90), d.p_value)


def _signed(d: tuple) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}], p {d[3]:.2g}"


def table8_run(data: dict, side: str) -> dict | None:
    """Table 8's run that quantizes one side only: "keys" (exact values) or "values" (keys at
    `NEAR_EXACT_KEY_BITS`), told by the bits it recorded, not by its label."""
    for r in data["runs"]:
        if r["role"] != "table 8" or r.get("key_bits") is None or r.get("value_bits") is None:
            continue
        if (side == "keys" and r["value_bits"] >= 16) or (side == "values" and r["key_bits"] >= NEAR_EXACT_KEY_BITS):
            return r
    return None


def pooled_cell(run: dict, base: dict, tasks: Sequence[str]) -> str:
    """A run's accuracy pooled over `tasks` [95% Wilson] and, for a run other than FP16, its paired difference
    from FP16 on the same items with the exact McNemar p: the pooled accuracy as every table shows it."""
    mine = pooled(run, tasks)
    a, d = wilson(mine), paired(mine, pooled(base, tasks))
    return f"{a.value:.3f} [{a.low:.3f}, {a.high:.3f}]" + (
        "" if run is base else f", {d.difference:+.3f}, p {d.p_value:.2g}"
    )


def _cell(run: dict, base: dict, task: str) -> str:
    mine, ref = run["results"][task]["correct"], base["results"][task]["correct"]
    a = wilson(mine)
    if run is base:
        return f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]"
    d = paired(mine, ref)
    return f"{a.value:.2f} ({d.difference:+.2f}, p {d.p_value:.2g})"


def _bits(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render_result(
    source: Source, cites: Citations, n: int, drawn: bool = True
) -> tuple[str, bytes | None, list[Claim]]:
    """One result's tables, claims and (where `drawn`) figure."""
    data = source.data
    cite = cites.cite(
        f"measured on {data['device']}, {data['date_utc']}, command `{data['command']}`, "
        + "".join(map(extended_from, data.get("extends", [])))
        + f"model {data['model']} (fingerprint {data.get('model_fingerprint', 'not recorded')}), file `{source.name}`"
    )
    base = fp16_run(data)
    names = [t["name"] for t in data["tasks"]]
    useful = informative(data)
    # pooled per view: the two views may ask about the same documents, which a pool over both would count twice
    by_view = views(data, useful)
    rows = []
    for run in data["runs"]:
        cells = [pooled_cell(run, base, tasks) if pooled(run, tasks) else "-" for tasks in by_view.values()]
        rows.append([run["label"], _bits(run.get("key_bits")), _bits(run.get("value_bits")), *(cells or ["-"])])
    tasks_rows = [
        [
            t["name"],
            t["items"],
            f"{t['chance']:.2f}",
            usable(data, t),
            *(_cell(run, base, t["name"]) for run in data["runs"]),
        ]
        for t in data["tasks"]
    ]
    items = sum(t["items"] for t in data["tasks"])
    head = escape(f"#### {data['model']} ({len(names)} tasks, {items} items) {cite}") + "\n"
    overall_table = table(
        rows,
        ["run", "key bits", "value bits"]
        + [f"{view}: accuracy [95% Wilson], vs FP16, McNemar p" for view in by_view]
        + ([] if by_view else ["accuracy"]),
        f"{cite}; bits computed by `reference.channels.storage.bit_widths` (the paper's counting, T_q = 32768)"
        + (f"; {note}" if (note := layers_note(data)) else ""),
    )
    per_task = table(
        tasks_rows,
        ["task", "items", "chance", "informative", *(r["label"] for r in data["runs"])],
        f"{cite}; FP16: accuracy [95% Wilson]; others: accuracy (difference from FP16 on the same items, exact "
        "McNemar p)",
    )
    png = _figure(data, useful) if useful and drawn else None
    power = "".join(_power(view, wilson(pooled(base, tasks))) for view, tasks in by_view.items())
    md = [head, power, overall_table, *_split_table(data, by_view, cite), "Every task, every run:\n"]
    md.append(details("the table", per_task))
    if png is not None:
        md.append(figure(f"task-accuracy-{n}.png", f"accuracy against key bits, {data['model']} (measured)"))
    return "\n".join(md), png, _claims(data, useful, cite)


def _split_table(data: dict, by_view: dict[str, list[str]], cite: str) -> list[str]:
    """Fig. 3's gap split by the midpoint control (`gap_split`), one row per view and budget; nothing where the
    result ran no control."""
    rows = [
        [view, f"{budget:g}", *map(_signed, parts)]
        for view, tasks in by_view.items()
        for budget, *parts in gap_split(data, tasks)
    ]
    if not rows:
        return []
    head = [
        "view",
        "key budget",
        "PN-Mix - KIVI",
        "of it: KIVI at Eq. 7 midpoints - KIVI (1-bit reconstruction)",
        "the rest: PN-Mix - KIVI at Eq. 7 midpoints (pair selection, mixed precision, sinks)",
    ]
    caption = (
        f"{cite}; paired differences on the same items of the informative tasks, 90% interval, exact McNemar p; the "
        "two parts add up to the whole"
    )
    return [
        "Where Fig. 3's gap comes from: KIVI's pick at each budget with 1-bit keys, run again with PN-Mix's "
        "1-bit reconstruction (Eq. 7's bin midpoints instead of the group ends):\n",
        table(rows, head, caption),
    ]


def _power(view: str, fp16: Accuracy) -> str:
    need = items_to_resolve(EQUIVALENCE_MARGIN, min(max(fp16.value, 0.5), 0.95))
    enough = "resolves" if fp16.n >= need else "does not resolve"
    return (
        f"{view}: {fp16.n} items on the informative tasks: this {enough} a {EQUIVALENCE_MARGIN * 100:g}-point "
        f"paired difference from FP16 (about {need} items needed for 80% power with the exact McNemar test at 5%, "
        "`benchmarks.accuracy.stats.items_to_resolve`); differences smaller than the intervals say nothing.\n"
    )


#: Markers of the runs drawn as single points (own bits, Table 8), one per run: the budgets' lines use "o".
SINGLE_MARKERS = ("s", "D", "^", "v", "P", "X", "*")
#: A single point more than this many key bits outside the sweep's budgets is drawn at the axis' edge with its
#: bits written beside it: one far point (Table 8's 8-bit keys) would otherwise squeeze the budgets together.
FAR_BITS = 1.0
#: The method whose colour a family's sweep takes (KIVI's budgets are KIVI-2 configurations, without sinks).
FAMILY_COLOR = {"PN-Mix": "PN-Mix", "KIVI": "KIVI-2"}


def _interval(ax, x: float, a: Accuracy, **style) -> None:
    ax.errorbar([x], [a.value], yerr=[[a.value - a.low], [a.high - a.value]], capsize=3, **style)


#: The roles of the runs drawn as single points.
SINGLE_ROLES = ("own bits", "table 8", "control", "main")


def singles(data: dict) -> list[dict]:
    """The runs a figure draws as single points: at their own bits, Table 8's (below 16 key bits), the midpoint
    controls and the paper's main configuration where no budget picked it."""
    return [
        r for r in data["runs"] if r["role"] in SINGLE_ROLES and r.get("key_bits") is not None and r["key_bits"] < 16
    ]


def markers(results: Sequence[dict]) -> dict[str, str]:
    """A marker per single-point label of `results`, the same in every panel that draws it."""
    labels = dict.fromkeys(r["label"] for data in results for r in singles(data))
    return dict(zip(labels, itertools.cycle(SINGLE_MARKERS), strict=False))


def draw_panel(ax, data: dict, tasks: list[str], title: str, marker_of: dict[str, str] | None = None) -> None:
    """Accuracy over `tasks` against key bits in one panel: the sweep's budgets as a line per family, the runs at
    their own bits as single points (`marker_of` each, default `markers`), FP16's accuracy as a line with its 95%
    interval shaded; the x axis spans the budgets, a point farther than FAR_BITS drawn at its edge with its
    bits."""
    marker_of = marker_of or markers([data])
    lines = {family: budget_runs(data, family) for family in FAMILY_COLOR}
    points = singles(data)
    near = [r["key_bits"] for runs in lines.values() for r in runs] or [r["key_bits"] for r in points] or [2.0]
    lo, hi = min(near) - FAR_BITS, max(near) + FAR_BITS
    for family, runs in lines.items():
        if runs:
            accs = [wilson(pooled(r, tasks)) for r in runs]
            ax.errorbar(
                [r["key_bits"] for r in runs],
                [a.value for a in accs],
                yerr=[[a.value - a.low for a in accs], [a.high - a.value for a in accs]],
                marker="o",
                capsize=3,
                color=figures.color(FAMILY_COLOR[family]),
                label=f"{family} (the sweep's budgets)",
            )
    drawn = list(near)
    for r in points:  # one marker per series: colours may repeat
        a, x = wilson(pooled(r, tasks)), r["key_bits"]
        at = min(max(x, lo), hi)
        _interval(ax, at, a, ls="", marker=marker_of[r["label"]], color=figures.color(r["label"]), label=r["label"])
        drawn.append(at)
        if at != x:
            side = "right" if x > hi else "left"
            ax.annotate(
                f"{x:.2f} bits {'->' if x > hi else '<-'}",
                (at, a.value),
                xytext=(-8 if x > hi else 8, 10),
                textcoords="offset points",
                ha=side,
                fontsize="small",
            )
    fp16 = wilson(pooled(fp16_run(data), tasks))
    ax.axhspan(fp16.low, fp16.high, color=figures.color("FP16"), alpha=0.15)
    ax.axhline(fp16.value, color=figures.color("FP16"), label="FP16 (95% interval shaded)")
    ax.set_xlim(min(drawn) - 0.25, max(drawn) + 0.25)
    ax.set(xlabel="key bits per element (the paper's counting)", ylabel="accuracy (informative tasks)")
    ax.set_title(title, fontsize="medium")


def _figure(data: dict, useful: list[str]) -> bytes | None:
    title = f"Task accuracy against key bits\n{model_label(data['model'])}"
    return figures.png(lambda ax: draw_panel(ax, data, useful, title), size=(7.0, 4.5))


#: The two views of the suite (`benchmarks.tasks`): a candidate chosen, an answer produced.
VIEWS = {"multiple_choice": "choosing among candidates", "generate_until": "producing the answer"}


def views(data: dict, useful: list[str]) -> dict[str, list[str]]:
    """The informative tasks of each view the result holds (a result without "output" is multiple choice)."""
    out: dict[str, list[str]] = {}
    for t in data["tasks"]:
        if t["name"] in useful:
            out.setdefault(VIEWS[t.get("output", "multiple_choice")], []).append(t["name"])
    return out


def _resolution(m: Margin, n: int) -> str:
    return (
        f"{n} paired items, 90% interval [{m.low:+.3f}, {m.high:+.3f}]; they resolve a difference of "
        f"{m.detectable:.3f} at 80% power (`benchmarks.accuracy.stats.detectable`)"
    )


def _claims(data: dict, useful: list[str], cite: str) -> list[Claim]:
    if not useful:
        return [
            Claim(c, NOT_MEASURED, "-", f"{data['model']}: FP16 is near chance on every task run", cite) for c in CLAIMS
        ]
    out = []
    for view, tasks in views(data, useful).items():
        short = f"{model_label(data['model'])}, {view.split()[0]}"
        out += _view_claims(data, tasks, f"{data['model']}, {view}: {SCALE}", cite, short)
    return out


def _view_claims(data: dict, useful: list[str], where: str, cite: str, short: str) -> list[Claim]:
    """The claims on one view's tasks; `short` names the model and view in each claim's `rests_on`."""
    base = fp16_run(data)
    out = []
    pnmix, kivi = budget_runs(data, "PN-Mix"), {r["budget"]: r for r in budget_runs(data, "KIVI")}
    main = main_run(data)
    table2 = main or next((r for r in pnmix if r["budget"] == SUB_BUDGET), None)
    if table2 is not None:
        out.append(_table2(table2, base, useful, where, cite, short, main is not None))
    below = [r for r in pnmix if r["budget"] < SUB_BUDGET]
    if below:
        out.append(_fig3_fp16(below, base, useful, where, cite, short))
    # PN-Mix and KIVI paired by the budget both were picked for
    pairs = [(r, kivi[r["budget"]]) for r in below if r["budget"] in kivi]
    if pairs:
        out.append(
            _fig3(
                pairs,
                useful,
                pooled(base, useful),
                where,
                cite,
                short,
                {b: parts for b, *parts in gap_split(data, useful)},
            )
        )
    keys, values = table8_run(data, "keys"), table8_run(data, "values")
    if keys is not None and values is not None:
        out.append(_table8(keys, values, base, useful, where, cite, short))
    return out


def _close(
    run: dict, base: dict, tasks: Sequence[str], gap: tuple[float, float] | None = None
) -> tuple[Margin, list[str], list[str]]:
    """`margin_rule` of `run` against `base` on the tasks that can tell them apart (`telling`): (the verdict,
    the tasks used, those left out at ceiling or floor)."""
    used, flat = telling([run, base], tasks)
    used = used or list(tasks)  # every task at ceiling: the pool is all there is, and it is said
    return margin_rule(pooled(run, used), pooled(base, used), EQUIVALENCE_MARGIN, gap), used, flat


def _left_out(flat: list[str]) -> str:
    return f"; left out at ceiling or floor for both: {', '.join(flat)}" if flat else ""


def _table2(run: dict, base: dict, tasks: Sequence[str], where: str, cite: str, short: str, main: bool = True) -> Claim:
    """Close to FP16, by the one margin rule: the 90% interval of PN-Mix - FP16 within +-EQUIVALENCE_MARGIN
    confirms; wholly outside it, or wholly below the paper's own larger drop, refutes; otherwise inconclusive,
    with the difference the items resolve at 80% power. `run` is the paper's main configuration (`main`), else
    the sweep's pick at SUB_BUDGET, which the row says."""
    m, used, flat = _close(run, base, tasks, PAPER_TABLE2_GAP)
    mine, ref = pooled(run, used), pooled(base, used)
    d = paired(mine, ref)
    gap = f"{PAPER_TABLE2_GAP[0] * 100:+.2f} to {PAPER_TABLE2_GAP[1] * 100:+.2f} points"
    status, why = {
        "within": (CONFIRMED, f"within +-{EQUIVALENCE_MARGIN:.2f} of FP16"),
        "outside": (NOT_CONFIRMED, f"differs from FP16 by more than +-{EQUIVALENCE_MARGIN:.2f}"),
        "excludes the reference gap": (
            NOT_CONFIRMED if m.high < PAPER_TABLE2_GAP[0] else INCONCLUSIVE,
            f"the interval excludes the paper's own difference ({gap})"
            + (": a larger drop than the paper reports" if m.high < PAPER_TABLE2_GAP[0] else ": a smaller one"),
        ),
        "undecided": (
            INCONCLUSIVE,
            f"neither within nor outside +-{EQUIVALENCE_MARGIN:.2f}: the items resolve {m.detectable:.3f}",
        ),
    }[m.status]
    return Claim(
        TABLE2,
        status,
        "measured",
        f"PN-Mix {MAIN if main else NOT_MAIN} at {run['key_bits']:.2f} key bits against FP16 on the same "
        f"{len(ref)} items: {d.difference:+.3f} "
        f"(exact McNemar p {d.p_value:.2g}; 90% interval [{m.low:+.3f}, {m.high:+.3f}], two one-sided tests at 5%): "
        f"{why}; margin {MARGIN_WHY}; {_resolution(m, len(ref))}{_left_out(flat)}; {per_task(run, base, used)}; "
        f"{where}",
        cite,
        f"{short}: {d.difference:+.3f}, 90% [{m.low:+.3f}, {m.high:+.3f}]",
    )


def _fig3_fp16(runs: list[dict], base: dict, tasks: Sequence[str], where: str, cite: str, short: str) -> Claim:
    """Fig. 3's first part, PN-Mix stays close to FP16 below SUB_BUDGET, by the margin rule at every such budget:
    confirmed where every budget is within the margin, not confirmed where one lies wholly outside it,
    otherwise inconclusive."""
    lines, verdicts = [], []
    for r in runs:
        m, used, flat = _close(r, base, tasks)
        verdicts.append((m, r))
        lines.append(
            f"at {r['budget']:g} bits ({r['key_bits']:.2f} key bits) PN-Mix - FP16 {m.status} "
            f"+-{EQUIVALENCE_MARGIN:.2f}: {_resolution(m, len(pooled(base, used)))}{_left_out(flat)}"
        )
    statuses = {m.status for m, _ in verdicts}
    status = NOT_CONFIRMED if "outside" in statuses else CONFIRMED if statuses == {"within"} else INCONCLUSIVE
    worst, r = min(verdicts, key=lambda v: v[0].low)
    return Claim(
        FIG3_FP16,
        status,
        "measured",
        "; ".join(lines) + f"; {where}",
        cite,
        f"{short}: at {r['budget']:g} bits PN-Mix - FP16 90% [{worst.low:+.3f}, {worst.high:+.3f}]",
    )


def _fig3(
    pairs, useful: list[str], base: list[bool], where: str, cite: str, short: str, split: dict | None = None
) -> Claim:
    """Fig. 3's second part, KIVI degrades more than PN-Mix below SUB_BUDGET: a budget compares keys only where
    the two store values at about the same bits (else what differs is not the keys alone, and it is said).
    Confirmed where PN-Mix is better beyond chance at some budget and never worse; not confirmed where KIVI is
    better beyond chance at some budget; otherwise inconclusive, with what the items resolve. Where the budget
    has a midpoint control (`split`: `gap_split` by budget), the line says how much of the gap Eq. 7's 1-bit
    reconstruction alone makes."""
    lines, better, worse, counted, deciding = [], 0, 0, 0, []
    for p, k in pairs:
        mine, theirs = pooled(p, useful), pooled(k, useful)
        d, own = paired(mine, theirs), paired(mine, base)
        line = (
            f"at {p['budget']:g} bits PN-Mix - KIVI {d.difference:+.3f} (p {d.p_value:.2g}; PN-Mix - FP16 "
            f"{own.difference:+.3f}, p {own.p_value:.2g})"
        )
        if abs((p.get("value_bits") or 0) - (k.get("value_bits") or 0)) > VALUE_BITS_TOLERANCE:
            lines.append(f"{line}, not counted: values at {p['value_bits']:.2f} against {k['value_bits']:.2f} bits")
            continue
        better += d.difference > 0 and d.p_value < ALPHA
        worse += d.difference < 0 and d.p_value < ALPHA
        counted += 1
        deciding.append(
            (d.p_value, f"{short}: at {p['budget']:g} bits, PN-Mix - KIVI {d.difference:+.3f} (p {d.p_value:.2g})")
        )
        m = margin_rule(mine, theirs, EQUIVALENCE_MARGIN)
        parts = (split or {}).get(p["budget"])
        line += (
            f"; of it, KIVI at Eq. 7 midpoints - KIVI {_signed(parts[1])} and PN-Mix - KIVI at Eq. 7 midpoints "
            f"{_signed(parts[2])} (90% intervals)"
            if parts
            else ""
        )
        lines.append(f"{line}; {_resolution(m, len(mine))}")
    if not counted:
        why = f"no budget below {SUB_BUDGET:g} compares keys alone: " + "; ".join(lines)
        return Claim(FIG3, NOT_MEASURED, "-", why, cite)
    status = NOT_CONFIRMED if worse else CONFIRMED if better else INCONCLUSIVE
    return Claim(FIG3, status, "measured", "; ".join(lines) + f"; {where}", cite, min(deciding)[1])


def _side(run: dict) -> str:
    return f"{run['key_bits']:.2f}-bit keys, {run['value_bits']:.2f}-bit values"


def _table8(keys: dict, values: dict, base: dict, tasks: Sequence[str], where: str, cite: str, short: str) -> Claim:
    """Keys alone hurt more than values alone, by the margin rule on keys only - values only: wholly below
    -EQUIVALENCE_MARGIN confirms; within the margin (the two are equivalent) or wholly above it refutes; otherwise
    inconclusive. The two runs' bits are stated: they are not equal (the cache family always quantizes keys, so
    values-only keeps keys at `NEAR_EXACT_KEY_BITS`)."""
    m, used, flat = _close(keys, values, tasks)
    k, v, ref = pooled(keys, used), pooled(values, used), pooled(base, used)
    dk, dv, d = paired(k, ref), paired(v, ref), paired(k, v)
    if m.status == "within":
        status, why = NOT_CONFIRMED, f"keys only and values only within +-{EQUIVALENCE_MARGIN:.2f} of each other"
    elif m.status == "outside":
        status = CONFIRMED if m.high <= -EQUIVALENCE_MARGIN else NOT_CONFIRMED
        why = f"keys only {'below' if status == CONFIRMED else 'above'} values only by more than {EQUIVALENCE_MARGIN}"
    else:
        status, why = INCONCLUSIVE, f"neither within nor outside +-{EQUIVALENCE_MARGIN:.2f}"
    return Claim(
        TABLE8,
        status,
        "measured",
        f"keys only ({_side(keys)}) {dk.difference:+.3f} against FP16 (p {dk.p_value:.2g}), values only "
        f"({_side(values)}) {dv.difference:+.3f} (p {dv.p_value:.2g}); keys only - values only {d.difference:+.3f} "
        f"(p {d.p_value:.2g}): {why}; the two sides' bits are not equal; {_resolution(m, len(k))}{_left_out(flat)}; "
        f"{where}",
        cite,
        f"{short}: keys only - values only {d.difference:+.3f}, 90% [{m.low:+.3f}, {m.high:+.3f}]",
    )


TABLE2 = (
    "Table 2: PN-Mix keeps task accuracy close to FP16 ("
    + "; ".join(
        f"{model} mean {fp16:.2f} vs {pnmix:.2f}" for model, (fp16, pnmix) in paper.TABLE2_MEAN_ACCURACY.items()
    )
    + ")"
)
MAIN = "in the paper's main configuration (H3(50%)L1, G = N = 128, 32 sinks)"
NOT_MAIN = f"at the sweep's {SUB_BUDGET:g}-bit pick (this result did not run the paper's main configuration)"
FIG3_FP16 = "Fig. 3 / Table 14: PN-Mix stays close to FP16 in the sub-2.25-bit regime"
FIG3 = "Fig. 3 / Table 14: in the sub-2.25-bit regime uniform KIVI-style keys degrade more than PN-Mix"
TABLE8 = "Table 8: quantizing keys alone hurts accuracy more than quantizing values alone at equal bits"
#: The claims the section judges, in their order.
CLAIMS = (TABLE2, FIG3_FP16, FIG3, TABLE8)
#: What a result must have run for each claim, said where none has.
_NEEDS = {
    TABLE2: f"no current result ran PN-Mix at {SUB_BUDGET:g} key bits beside FP16",
    FIG3_FP16: f"no current result ran PN-Mix at a key budget below {SUB_BUDGET:g} bits",
    FIG3: f"no current result ran PN-Mix and KIVI at a key budget below {SUB_BUDGET:g} bits",
    TABLE8: "no current result ran Table 8's two runs, keys only and values only (in the sweep's default runs)",
}


def render(sources: Sequence[Source]) -> Section:
    cites = Citations("A")
    parts, figs, claims = [], {}, []
    for n, s in enumerate(sources, start=1):
        md, png, found = render_result(s, cites, n, drawn=n <= MAX_FIGURES)
        parts.append(md)
        claims += found
        if png is not None:
            figs[f"task-accuracy-{n}.png"] = png
    parts.append(undrawn(len(sources) - MAX_FIGURES, "results"))
    if not sources:
        parts.append("No task-accuracy result: run `pnmix-task-accuracy` (or give one with --input).\n")
    # a claim no result ran the runs for is still a row: "not measured here", saying which runs it needs
    claims += [
        Claim(c, NOT_MEASURED, "-", _NEEDS[c] if sources else "no task-accuracy result", "-")
        for c in CLAIMS
        if all(found.claim != c for found in claims)
    ]
    intro = (
        "Accuracy on the repository's offline task suite (`benchmarks/tasks`: RULER-style retrieval and long-output "
        "tasks) through lm-evaluation-harness with each cache "
        "(`pnmix-lm-eval`), PN-Mix and KIVI at the configuration of their family nearest each key-bit budget, "
        "other methods at their own bits. A task where FP16 is within "
        f"{INFORMATIVE_MARGIN:.0%} of chance, or whose answer can be found from the question alone (a task of the "
        "suite that says so: `benchmarks.tasks.Task.answer_in_question`, measured by FP16 given the question "
        "alone), is reported but left out of the pooled accuracy and the verdicts. Two views, judged apart: "
        "choosing (the candidates ranked by log-likelihood, teacher-forced) and producing (`_gen_` tasks: the "
        "answer generated greedily through the cache, right when its first word is the gold). A long-output task's "
        "passage (a registry, a running sum, a list of colours: text the generator wrote, standing for a model's "
        "long output) enters the cache teacher-forced as decode steps in both views; only the answer is produced.\n"
    )
    return Section(
        "Task accuracy (Table 2, Fig. 3, Table 8)", cites.legend() + "\n" + intro + "\n".join(parts), figs, claims
    )
