"""Section 4: memory feasibility (Fig. 6a/6b): the model of `benchmarks.memory` next to the paper's
points and, when a GPU run is given, the measured peaks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from benchmarks import memory
from benchmarks.models import ARCHITECTURES
from reference import paper
from reference.methods import NAMES
from reference.records import GIB

from .. import figures
from ..inputs import Source, benchmarks
from ..markdown import CONFIRMED, NOT_CONFIRMED, Claim, Section, figure, fmt, table
from ..provenance import computed, measured, quoted

MODEL = paper.MODEL
MODEL_SOURCE = computed(
    "benchmarks.memory (weights from the parameter count in bf16 + the cache of reference.storage_model with "
    "capacity = P + L_gen + workspace_estimate, an explicit estimate, not a measurement), "
    f"{paper.MODEL}, P = {paper.PROMPT}, budget {memory.DEFAULT_BUDGET_GIB:g} GiB"
)


@dataclasses.dataclass(frozen=True)
class FitClaim:
    """A Fig. 6 claim as the points it implies: (method, batch, generation) -> fits the 40 GiB budget."""

    claim: str
    points: tuple[tuple[str, int, int, bool], ...]


def _fit_claims() -> tuple[FitClaim, ...]:
    """The paper's Fig. 6a/6b boundaries (`reference.paper`) as claims, each side of a boundary a point."""
    batch_a, gen_b, gb = paper.FIG6A_BATCH, paper.FIG6B_GENERATION, paper.GPU_MEMORY_GIB
    fp16_gen, pnmix_gen = paper.FIG6A_MAX_GENERATION["FP16"], paper.FIG6A_MAX_GENERATION["PN-Mix"]
    beyond = min(g for g in memory.FIG6A_GENERATION if g > fp16_gen)
    (fp16_b, fp16_gib), (pnmix_b, pnmix_gib) = paper.FIG6B_MAX_BATCH["FP16"], paper.FIG6B_MAX_BATCH["PN-Mix"]
    return (
        FitClaim(
            f"Fig. 6a: at B = {batch_a} FP16 fits up to L_gen = {fp16_gen // 1024}K and exceeds {gb:g} GB beyond",
            (("FP16", batch_a, fp16_gen, True), ("FP16", batch_a, beyond, False)),
        ),
        FitClaim(
            f"Fig. 6a: at B = {batch_a} PN-Mix fits up to L_gen = {pnmix_gen // 1024}K "
            f"({pnmix_gen // fp16_gen}x longer than FP16)",
            (("PN-Mix", batch_a, pnmix_gen, True),),
        ),
        FitClaim(
            f"Fig. 6b: at L_gen = {gen_b // 1024}K FP16's largest batch is B = {fp16_b} ({fp16_gib:.2f} GB); "
            f"B = {fp16_b + 1} runs out of memory",
            (("FP16", fp16_b, gen_b, True), ("FP16", fp16_b + 1, gen_b, False)),
        ),
        FitClaim(
            f"Fig. 6b: at L_gen = {gen_b // 1024}K PN-Mix runs B = {pnmix_b} ({pnmix_gib:.2f} GB), a "
            f"{paper.FIG6B_BATCH_RATIO:g}x larger batch than FP16",
            (("PN-Mix", pnmix_b, gen_b, True),),
        ),
    )


CLAIMS = _fit_claims()


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


def _plot(points, key: str, stars: dict, measured_pts: list[dict], xlabel: str, title: str, logx: bool) -> bytes | None:
    budget = memory.DEFAULT_BUDGET_GIB

    def draw(ax):
        for method in NAMES:
            mine = [p for p in points if p.method == method]
            ax.plot(
                [getattr(p, key) for p in mine],
                [p.peak_gib for p in mine],
                marker=".",
                color=figures.color(method),
                label=f"{method} (model)",
            )
        ax.axhline(budget, color="k", ls="--", lw=1, label=f"{budget:g} GiB budget")
        for method, (x, y) in stars.items():
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
    known = paper.FIG6B_MAX_BATCH.get(method)
    return known[1] if known and known[0] == batch and generation == paper.FIG6B_GENERATION else None


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
    methods = list(NAMES)
    best = [
        [
            m,
            *(
                (p.batch, f"{p.peak_gib:.2f}")
                if (p := memory.max_batch(arch, m, paper.FIG6B_GENERATION))
                else ("none", "-")
            ),
        ]
        for m in methods
    ]
    comparison = memory.comparison(arch)
    measured_pts = measured_points(sources)
    paper_6a = {m: (g, memory.DEFAULT_BUDGET_GIB) for m, g in paper.FIG6A_MAX_GENERATION.items()}
    figs = {
        "fig6a-memory.png": _plot(
            a,
            "generation",
            paper_6a,
            [p for p in measured_pts if p["batch"] == paper.FIG6A_BATCH],
            "generation length L_gen (tokens)",
            f"Fig. 6a: peak memory vs L_gen at B = {paper.FIG6A_BATCH} (paper stars: longest L_gen that fits)",
            logx=True,
        ),
        "fig6b-memory.png": _plot(
            b,
            "batch",
            paper.FIG6B_MAX_BATCH,
            [p for p in measured_pts if p["generation"] == paper.FIG6B_GENERATION],
            "batch B",
            f"Fig. 6b: peak memory vs batch at L_gen = {paper.FIG6B_GENERATION // 1024}K",
            logx=False,
        ),
    }
    figs = {k: v for k, v in figs.items() if v is not None}
    parts = [
        f"Peak GPU memory of {arch.name} ({arch.parameters() / 1e9:.2f} B parameters, weights "
        f"{arch.weight_bytes() / GIB:.2f} GiB in bf16) with every layer's cache preallocated to P + L_gen "
        f"(P = {paper.PROMPT}), against the paper's {memory.DEFAULT_BUDGET_GIB:g} GiB A100. GiB throughout; "
        "OOM: over the budget.\n",
        f"### Fig. 6a: peak GiB vs generation length at B = {paper.FIG6A_BATCH}\n",
        table(_pivot(a, "generation"), ["L_gen", *methods], MODEL_SOURCE),
        f"### Fig. 6b: peak GiB vs batch at L_gen = {paper.FIG6B_GENERATION}\n",
        table(_pivot(b, "batch"), ["batch", *methods], MODEL_SOURCE),
        f"### Largest batch that fits at L_gen = {paper.FIG6B_GENERATION}\n",
        table(best, ["method", "max batch", "peak GiB"], MODEL_SOURCE + "; benchmarks.memory.max_batch"),
        "### The model beside the paper\n",
        table(
            [[r["figure"], r["method"], r["paper"], r["model"], "yes" if r["agrees"] else "no"] for r in comparison],
            ["figure", "method", "paper (quoted)", "model (computed)", "agrees"],
            f"paper column {quoted('Fig. 6a/6b, ' + paper.EFFICIENCY_SETTING)}; model column "
            f"{MODEL_SOURCE}; benchmarks.memory.comparison",
        ),
        "Where they differ, and why (benchmarks.memory.explain, computed from the numbers above):\n",
        "\n".join(f"- {note}" for note in memory.explain(arch)) + "\n",
    ]
    if measured_pts:
        parts += ["### Measured on a GPU\n", _measured_table(measured_pts)]
    else:
        parts.append(
            f"No GPU memory measurements at the paper's {paper.GPU_MEMORY_GIB:g} GiB budget were given: the figures "
            "above are the model's (computed), not measured.\n"
        )
    if figs:
        parts += [
            figure(n, c)
            for n, c in (
                ("fig6a-memory.png", f"Fig. 6a: peak memory vs generation length, B = {paper.FIG6A_BATCH}"),
                ("fig6b-memory.png", f"Fig. 6b: peak memory vs batch, L_gen = {paper.FIG6B_GENERATION // 1024}K"),
            )
            if n in figs
        ]
    else:
        parts.append(figures.MISSING + "\n")
    claims = [_judge(fc, arch, measured_pts) for fc in CLAIMS]
    return Section("Memory feasibility (Fig. 6a, 6b)", "\n".join(parts), figs, claims)
