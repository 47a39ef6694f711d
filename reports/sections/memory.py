"""Section 4: memory feasibility (Fig. 6a/6b): the model of `benchmarks.memory` next to the paper's
points and, when a GPU run is given, the measured peaks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from benchmarks import memory
from benchmarks.models import ARCHITECTURES

from .. import figures
from ..inputs import Source, benchmarks
from ..markdown import CONFIRMED, NOT_CONFIRMED, Claim, Section, figure, fmt, table
from ..provenance import computed, measured, quoted

MODEL = "Qwen3-8B"
MODEL_SOURCE = computed(
    "benchmarks.memory (weights from the parameter count in bf16 + the cache of reference.storage_model with "
    "capacity = P + L_gen + workspace_estimate, an explicit estimate, not a measurement), Qwen3-8B, P = 141, "
    f"budget {memory.DEFAULT_BUDGET_GIB:g} GiB"
)


@dataclasses.dataclass(frozen=True)
class FitClaim:
    """A Fig. 6 claim as the points it implies: (method, batch, generation) -> fits the 40 GiB budget."""

    claim: str
    points: tuple[tuple[str, int, int, bool], ...]


CLAIMS = (
    FitClaim(
        "Fig. 6a: at B = 32 FP16 fits up to L_gen = 4K and exceeds 40 GB beyond",
        (("FP16", 32, 4096, True), ("FP16", 32, 8192, False)),
    ),
    FitClaim("Fig. 6a: at B = 32 PN-Mix fits up to L_gen = 32K (8x longer than FP16)", (("PN-Mix", 32, 32768, True),)),
    FitClaim(
        "Fig. 6b: at L_gen = 8K FP16's largest batch is B = 20 (38.48 GB); B = 21 runs out of memory",
        (("FP16", 20, 8192, True), ("FP16", 21, 8192, False)),
    ),
    FitClaim(
        "Fig. 6b: at L_gen = 8K PN-Mix runs B = 110 (38.21 GB), a 5.5x larger batch than FP16",
        (("PN-Mix", 110, 8192, True),),
    ),
)


def measured_points(sources: Sequence[Source]) -> list[dict]:
    """Full-scale Fig. 6 memory measurements under the paper's 40 GiB budget (others answer another question)."""
    return [b for b in benchmarks(sources, "fig6-memory", "full") if b.get("budget_gib") == memory.DEFAULT_BUDGET_GIB]


def _judge(fc: FitClaim, arch, points: list[dict]) -> Claim:
    seen = {(p["method"], p["batch"], p["generation"]): p for p in points}
    got = [(m, b, g, want, seen.get((m, b, g))) for m, b, g, want in fc.points]
    wrong = [x for x in got if x[4] is not None and (not x[4]["oom"]) != x[3]]
    if wrong or all(x[4] is not None for x in got):
        evidence = "; ".join(
            f"{m} B = {b}, L_gen = {g}: "
            + ("out of memory" if p["oom"] else f"fits, peak {fmt(p['peak_allocated_gib'], '.2f')} GiB allocated")
            for m, b, g, _, p in got
            if p is not None
        )
        provenance = "; ".join(sorted({_provenance(p) for *_, p in got if p is not None}))
        return Claim(fc.claim, NOT_CONFIRMED if wrong else CONFIRMED, "measured", evidence, provenance)
    model = [(m, b, g, want, memory.point(arch, m, b, g)) for m, b, g, want in fc.points]
    holds = all(p.fits == want for *_, want, p in model)
    evidence = "; ".join(
        f"{m} B = {b}, L_gen = {g}: model peak {p.peak_gib:.2f} GiB ({'fits' if p.fits else 'over budget'})"
        for m, b, g, _, p in model
    )
    if not holds:
        evidence += " (see the notes of section 4)"
    return Claim(
        fc.claim, CONFIRMED if holds else NOT_CONFIRMED, "computed", evidence + "; no GPU measurement", MODEL_SOURCE
    )


def _provenance(p: dict) -> str:
    return measured(p["device"], p["date_utc"], p["command"], p["source"].name, f"timing: {p['timing']}")


def _pivot(points: Sequence[memory.MemoryPoint], key: str) -> list[list]:
    rows: dict[int, list] = {}
    for p in points:
        rows.setdefault(getattr(p, key), [getattr(p, key)]).append(f"{p.peak_gib:.2f}" + ("" if p.fits else " OOM"))
    return list(rows.values())


def _plot(points, key: str, paper: dict, measured_pts: list[dict], xlabel: str, title: str, logx: bool) -> bytes | None:
    budget = memory.DEFAULT_BUDGET_GIB

    def draw(ax):
        for method in memory.FIG6_METHODS:
            mine = [p for p in points if p.method == method]
            ax.plot(
                [getattr(p, key) for p in mine],
                [p.peak_gib for p in mine],
                marker=".",
                color=figures.color(method),
                label=f"{method} (model)",
            )
        ax.axhline(budget, color="k", ls="--", lw=1, label=f"{budget:g} GiB budget")
        for method, (x, y) in paper.items():
            ax.plot(
                [x],
                [y],
                marker="*",
                ms=15,
                ls="",
                color=figures.color(method),
                mec="k",
                label=f"{method} (paper, quoted)",
            )
        for method in sorted({p["method"] for p in measured_pts}):
            mine = [p for p in measured_pts if p["method"] == method and not p["oom"]]
            ax.plot(
                [p[key] for p in mine],
                [p["peak_allocated_gib"] for p in mine],
                marker="s",
                ls="",
                mec="k",
                color=figures.color(method),
                label=f"{method} (measured)",
            )
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.6 * budget)  # FP16 leaves the plot where it is far over budget
        ax.set_xlabel(xlabel)
        ax.set_ylabel("peak memory (GiB)")
        ax.set_title(title, fontsize="medium")

    return figures.png(draw, size=(7.5, 5.0))


def _paper_gib(method: str, batch: int, generation: int) -> float | None:
    paper = memory.PAPER_FIG6B.get(method)
    return paper[1] if paper and paper[0] == batch and generation == memory.FIG6B_GENERATION else None


def _measured_table(points: list[dict]) -> str:
    rows = []
    for p in sorted(points, key=lambda p: (p["generation"], p["batch"], p["method"])):
        fits = not p["oom"]
        rows.append([
            p["method"], p["batch"], p["generation"], "fits" if fits else "OOM",
            fmt(p["peak_allocated_gib"], ".2f"), fmt(p.get("peak_reserved_gib"), ".2f"),
            fmt(p["model_peak_gib"], ".2f"),
            fmt(p["peak_allocated_gib"] - p["model_peak_gib"] if fits else None, "+.2f"),
            fmt(_paper_gib(p["method"], p["batch"], p["generation"]), ".2f"),
        ])  # fmt: skip
    headers = ["method", "batch", "L_gen", "outcome", "peak allocated GiB", "peak reserved GiB", "model GiB",
               "measured - model", "paper GiB"]  # fmt: skip
    source = (
        "measured columns: " + "; ".join(sorted({_provenance(p) for p in points}))
        + f"; model GiB: {MODEL_SOURCE}; paper GiB: {quoted('Fig. 6b')}"
    )  # fmt: skip
    return table(rows, headers, source)


def render(sources: Sequence[Source]) -> Section:
    arch = ARCHITECTURES[MODEL]
    a, b = memory.fig6a(arch), memory.fig6b(arch)
    methods = list(memory.FIG6_METHODS)
    best = [
        [
            m,
            *(
                (p.batch, f"{p.peak_gib:.2f}")
                if (p := memory.max_batch(arch, m, memory.FIG6B_GENERATION))
                else ("none", "-")
            ),
        ]
        for m in methods
    ]
    comparison = memory.comparison(arch)
    measured_pts = measured_points(sources)
    paper_6a = {m: (g, memory.DEFAULT_BUDGET_GIB) for m, g in memory.PAPER_FIG6A_MAX_GENERATION.items()}
    figs = {
        "fig6a-memory.png": _plot(
            a,
            "generation",
            paper_6a,
            [p for p in measured_pts if p["batch"] == memory.FIG6A_BATCH],
            "generation length L_gen (tokens)",
            "Fig. 6a: peak memory vs L_gen at B = 32 (paper stars: longest L_gen that fits)",
            logx=True,
        ),
        "fig6b-memory.png": _plot(
            b,
            "batch",
            memory.PAPER_FIG6B,
            [p for p in measured_pts if p["generation"] == memory.FIG6B_GENERATION],
            "batch B",
            "Fig. 6b: peak memory vs batch at L_gen = 8K",
            logx=False,
        ),
    }
    figs = {k: v for k, v in figs.items() if v is not None}
    parts = [
        f"Peak GPU memory of {arch.name} ({arch.parameters() / 1e9:.2f} B parameters, weights "
        f"{arch.weight_bytes() / memory.GIB:.2f} GiB in bf16) with every layer's cache preallocated to P + L_gen "
        f"(P = {memory.PROMPT}), against the paper's {memory.DEFAULT_BUDGET_GIB:g} GiB A100. GiB throughout; "
        "OOM: over the budget.\n",
        f"### Fig. 6a: peak GiB vs generation length at B = {memory.FIG6A_BATCH}\n",
        table(_pivot(a, "generation"), ["L_gen", *methods], MODEL_SOURCE),
        f"### Fig. 6b: peak GiB vs batch at L_gen = {memory.FIG6B_GENERATION}\n",
        table(_pivot(b, "batch"), ["batch", *methods], MODEL_SOURCE),
        f"### Largest batch that fits at L_gen = {memory.FIG6B_GENERATION}\n",
        table(best, ["method", "max batch", "peak GiB"], MODEL_SOURCE + "; benchmarks.memory.max_batch"),
        "### The model beside the paper\n",
        table(
            [[r["figure"], r["method"], r["paper"], r["model"], "yes" if r["agrees"] else "no"] for r in comparison],
            ["figure", "method", "paper (quoted)", "model (computed)", "agrees"],
            f"paper column {quoted('Fig. 6a/6b, A100-SXM4-40GB, Qwen3-8B, P = 141')}; model column "
            f"{MODEL_SOURCE}; benchmarks.memory.comparison",
        ),
        "Where they differ, and why (benchmarks.memory.explain, computed from the numbers above):\n",
        "\n".join(f"- {note}" for note in memory.explain(arch)) + "\n",
    ]
    if measured_pts:
        parts += ["### Measured on a GPU\n", _measured_table(measured_pts)]
    else:
        parts.append(
            "No GPU memory measurements at the paper's 40 GiB budget were given: the figures above are the "
            "model's (computed), not measured.\n"
        )
    if figs:
        parts += [
            figure(n, c)
            for n, c in (
                ("fig6a-memory.png", "Fig. 6a: peak memory vs generation length, B = 32"),
                ("fig6b-memory.png", "Fig. 6b: peak memory vs batch, L_gen = 8K"),
            )
            if n in figs
        ]
    else:
        parts.append(figures.MISSING + "\n")
    claims = [_judge(fc, arch, measured_pts) for fc in CLAIMS]
    return Section("Memory feasibility (Fig. 6a, 6b)", "\n".join(parts), figs, claims)
