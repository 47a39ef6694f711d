"""Section 4: memory feasibility (Fig. 6a/6b): the model of `benchmarks.efficiency.memory` next to the paper's
points and, when a GPU run is given, the measured peaks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from benchmarks.efficiency import memory
from benchmarks.efficiency.architectures import ARCHITECTURES
from reference import paper
from reference.methods import NAMES
from reference.records import GIB
from reports import figures
from reports.inputs import Source, benchmarks
from reports.markdown import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED, Citations, Claim, Section, figure, fmt, table
from reports.provenance import computed, measured, quoted

TITLE = "Memory feasibility (Fig. 6a, 6b)"
MODEL = paper.MODEL
MODEL_SOURCE = computed(
    "benchmarks.efficiency.memory (weights from the parameter count in bf16 + the cache of "
    "reference.storage_model with "
    "capacity = P + L_gen + workspace_estimate, an explicit estimate, not a measurement), "
    f"{paper.MODEL}, P = {paper.PROMPT}, budget {memory.DEFAULT_BUDGET_GIB:g} GiB"
)
PAPER_SOURCE = quoted(f"Fig. 6a/6b, {paper.EFFICIENCY_SETTING}")
#: How the figures label the paper's points: its numbers were measured on its own GPU.
PAPER_LABEL = f"paper, {paper.GPU}"


@dataclasses.dataclass(frozen=True)
class FitClaim:
    """A Fig. 6 claim as the points it implies: (method, batch, generation) -> fits the 40 GiB budget."""

    claim: str
    points: tuple[tuple[str, int, int, bool], ...]
    figure: str  # "6a" or "6b"
    largest_batch_of: str | None = None  # a Fig. 6b claim: the method whose largest batch the evidence adds


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
            "6a",
        ),
        FitClaim(
            f"Fig. 6a: at B = {batch_a} PN-Mix fits up to L_gen = {pnmix_gen // 1024}K "
            f"({pnmix_gen // fp16_gen}x longer than FP16)",
            (("PN-Mix", batch_a, pnmix_gen, True),),
            "6a",
        ),
        FitClaim(
            f"Fig. 6b: at L_gen = {gen_b // 1024}K FP16's largest batch is B = {fp16_b} ({fp16_gib:.2f} GB); "
            f"B = {fp16_b + 1} runs out of memory",
            (("FP16", fp16_b, gen_b, True), ("FP16", fp16_b + 1, gen_b, False)),
            "6b",
            "FP16",
        ),
        FitClaim(
            f"Fig. 6b: at L_gen = {gen_b // 1024}K PN-Mix runs B = {pnmix_b} ({pnmix_gib:.2f} GB), a "
            f"{paper.FIG6B_BATCH_RATIO:g}x larger batch than FP16",
            (("PN-Mix", pnmix_b, gen_b, True),),
            "6b",
            "PN-Mix",
        ),
    )


CLAIMS = _fit_claims()


def measured_points(sources: Sequence[Source]) -> list[dict]:
    """Full-scale Fig. 6 memory measurements under the paper's 40 GiB budget (others answer another question)."""
    return [b for b in benchmarks(sources, "fig6-memory", "full") if b.get("budget_gib") == memory.DEFAULT_BUDGET_GIB]


def _measured_claim(fc: FitClaim, points: list[dict]) -> Claim | None:
    """The claim judged on GPU measurements: when one of its points contradicts it or all were measured."""
    seen = {(p["method"], p["batch"], p["generation"]): p for p in points}
    got = [(m, b, g, want, seen.get((m, b, g))) for m, b, g, want in fc.points]
    wrong = [x for x in got if x[4] is not None and (not x[4]["oom"]) != x[3]]
    if not wrong and any(x[4] is None for x in got):
        return None
    evidence = "; ".join(
        f"{m} B = {b}, L_gen = {g}: "
        + ("out of memory" if p["oom"] else f"fits, peak {fmt(p['peak_allocated_gib'], '.2f')} GiB allocated")
        for m, b, g, _, p in got
        if p is not None
    )
    provenance = "; ".join(sorted({_provenance(p) for *_, p in got if p is not None}))
    return Claim(fc.claim, NOT_CONFIRMED if wrong else CONFIRMED, "measured", evidence, provenance)


def _model_claim(fc: FitClaim, arch) -> Claim:
    """The claim judged by the model at the same points (and, for a largest batch, the model's own)."""
    model = [(m, b, g, want, memory.point(arch, m, b, g)) for m, b, g, want in fc.points]
    wrong = [p for *_, want, p in model if p.decided is not None and p.decided != want]
    undecided = [p for *_, p in model if p.decided is None]
    evidence = "; ".join(
        f"{m} B = {b}, L_gen = {g}: model peak {p.peak_gib:.2f} GiB ({_fit_words(p)})" for m, b, g, _, p in model
    )
    if fc.largest_batch_of:
        best = memory.max_batch(arch, fc.largest_batch_of, paper.FIG6B_GENERATION)
        evidence += "; the model's largest batch: " + (f"B = {best.batch} ({best.peak_gib:.2f} GiB)" if best else "-")
    if wrong or undecided:
        evidence += " (see the notes under Memory feasibility)"
    status = NOT_CONFIRMED if wrong else INCONCLUSIVE if undecided else CONFIRMED
    # the point that decided it: the first wrong, else the first undecided, else the last (the boundary)
    m, b, g, _, p = next((x for x in model if x[4] in wrong), next((x for x in model if x[4] in undecided), model[-1]))
    rests_on = (
        f"{m} B = {b}, L_gen = {g}: model peak {p.peak_gib:.2f} GiB ({_fit_words(p).split(' (')[0].split(',')[0]})"
    )
    return Claim(fc.claim, status, "computed", evidence + "; no GPU measurement", MODEL_SOURCE, rests_on)


def _fit_words(p: memory.MemoryPoint) -> str:
    if p.decided is None:
        return (
            f"under the budget by {p.budget_gib - p.peak_gib:.2f} GiB, less than the {memory.UNDECIDED_GIB:g} GiB "
            "a card keeps from tensors: not decided by the model"
        )
    return "fits" if p.decided else "over budget"


def judged(arch, points: list[dict]) -> list[tuple[Claim, Claim | None]]:
    """Each claim of CLAIMS as (the model's verdict, the measured one or None). The measured one, when
    there is one, decides the claim; the section's table shows both, so they say one thing."""
    return [(_model_claim(fc, arch), _measured_claim(fc, points)) for fc in CLAIMS]


def _provenance(p: dict) -> str:
    return measured(p["device"], p["date_utc"], p["command"], p["source"].name, f"timing: {p['timing']}")


def _yes(c: Claim | None) -> str:
    return "-" if c is None else {CONFIRMED: "yes", INCONCLUSIVE: "undecided"}.get(c.status, "no")


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
                label=f"{method} ({PAPER_LABEL})",
            )
        for method, device in sorted({(p["method"], p["device"]) for p in measured_pts}):
            mine = [p for p in measured_pts if (p["method"], p["device"]) == (method, device) and not p["oom"]]
            ax.plot(
                [p[key] for p in mine],
                [p["peak_allocated_gib"] for p in mine],
                marker="s",
                ls="",
                mec="k",
                color=figures.color(method),
                label=f"{method} (measured, {device})",
            )
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.6 * budget)  # FP16 leaves the plot where it is far over budget
        ax.set_xlabel(xlabel)
        ax.set_ylabel("peak memory (GiB)")
        ax.set_title(title, fontsize="medium")

    return figures.png(draw, size=(7.5, 6.0))


def _paper_gib(method: str, batch: int, generation: int) -> float | None:
    known = paper.FIG6B_MAX_BATCH.get(method)
    return known[1] if known and known[0] == batch and generation == paper.FIG6B_GENERATION else None


def _measured_table(points: list[dict], cite: Citations) -> str:
    rows = []
    for p in sorted(points, key=lambda p: (p["generation"], p["batch"], p["method"])):
        fits = not p["oom"]
        rows.append(
            [
                p["method"],
                p["batch"],
                p["generation"],
                "fits" if fits else "OOM",
                fmt(p["peak_allocated_gib"], ".2f"),
                fmt(p.get("peak_reserved_gib"), ".2f"),
                fmt(p["model_peak_gib"], ".2f"),
                fmt(p["peak_allocated_gib"] - p["model_peak_gib"] if fits else None, "+.2f"),
                fmt(_paper_gib(p["method"], p["batch"], p["generation"]), ".2f"),
            ]
        )
    headers = [
        "method",
        "batch",
        "L_gen",
        "outcome",
        "peak allocated GiB",
        "peak reserved GiB",
        "model GiB",
        "measured - model",
        "paper GiB",
    ]
    measured_from = ", ".join(cite.cite(x) for x in sorted({_provenance(p) for p in points}))
    source = (
        f"measured: {measured_from}; model GiB computed: the memory model {cite.cite(MODEL_SOURCE)}; paper GiB "
        f"quoted: the paper {cite.cite(PAPER_SOURCE)}"
    )
    return table(rows, headers, source)


def _beside_the_paper(verdicts: list[tuple[Claim, Claim | None]], points: list[dict], cite: Citations) -> str:
    """The paper's Fig. 6a/6b claims with the model's verdict at the same points (and the GPU's)."""
    rows = [
        [fc.figure, fc.claim.split(": ", 1)[1], model.evidence.removesuffix("; no GPU measurement"), _yes(model)]
        for fc, (model, _) in zip(CLAIMS, verdicts, strict=True)
    ]
    headers = ["figure", "paper (quoted)", "model (computed)", "agrees"]
    source = (
        f"paper column quoted: the paper {cite.cite(PAPER_SOURCE)}; model columns computed: the memory model "
        f"{cite.cite(MODEL_SOURCE)}"
    )
    if points:
        rows = [[*r, _yes(m)] for r, (_, m) in zip(rows, verdicts, strict=True)]
        headers.append("measured agrees")
        source += "; measured column: " + ", ".join(cite.cite(x) for x in sorted({_provenance(p) for p in points}))
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
    measured_pts = measured_points(sources)
    verdicts = judged(arch, measured_pts)
    cite = Citations("M")
    model = f"computed: the memory model {cite.cite(MODEL_SOURCE)}"
    paper_6a = {m: (g, memory.DEFAULT_BUDGET_GIB) for m, g in paper.FIG6A_MAX_GENERATION.items()}
    figs = {
        "fig6a-memory.png": _plot(
            a,
            "generation",
            paper_6a,
            [p for p in measured_pts if p["batch"] == paper.FIG6A_BATCH],
            "generation length L_gen (tokens)",
            f"Fig. 6a: peak memory vs L_gen at B = {paper.FIG6A_BATCH}\n(paper's stars: longest L_gen that fit "
            f"its {paper.GPU})",
            logx=True,
        ),
        "fig6b-memory.png": _plot(
            b,
            "batch",
            paper.FIG6B_MAX_BATCH,
            [p for p in measured_pts if p["generation"] == paper.FIG6B_GENERATION],
            "batch B",
            f"Fig. 6b: peak memory vs batch at L_gen = {paper.FIG6B_GENERATION // 1024}K\n(paper's stars: "
            f"measured on its {paper.GPU})",
            logx=False,
        ),
    }
    figs = {k: v for k, v in figs.items() if v is not None}
    parts = [
        f"Peak GPU memory of {arch.name} ({arch.parameters() / 1e9:.2f} B parameters, weights "
        f"{arch.weight_bytes() / GIB:.2f} GiB in bf16) with every layer's cache preallocated to P + L_gen "
        f"(P = {paper.PROMPT}), against the {memory.DEFAULT_BUDGET_GIB:g} GiB of the paper's {paper.GPU}. GiB "
        "throughout; OOM: over the budget. The paper's \"GB\" are read as GiB (2^30 bytes): FP16's "
        f"{paper.FIG6B_MAX_BATCH['FP16'][1]:.2f} at B = {paper.FIG6B_MAX_BATCH['FP16'][0]} as 10^9 bytes would be "
        f"{paper.FIG6B_MAX_BATCH['FP16'][1] * 1e9 / GIB:.2f} GiB, leaving the next batch room on a 40 GiB card, "
        f"yet the paper's FP16 runs out of memory at B = {paper.FIG6B_MAX_BATCH['FP16'][0] + 1}; as GiB the two "
        "agree. The Fig. 6b rows rest on that reading.\n",
        "SOURCES",
        f"### Fig. 6a: peak GiB vs generation length at B = {paper.FIG6A_BATCH}\n",
        table(_pivot(a, "generation"), ["L_gen", *methods], model),
        f"### Fig. 6b: peak GiB vs batch at L_gen = {paper.FIG6B_GENERATION}\n",
        table(_pivot(b, "batch"), ["batch", *methods], model),
        f"### Largest batch that fits at L_gen = {paper.FIG6B_GENERATION}\n",
        table(best, ["method", "max batch", "peak GiB"], model + " (benchmarks.efficiency.memory.max_batch)"),
        "### The model beside the paper\n",
        "Each of the paper's Fig. 6a/6b statements as restated among the paper's claims, with the model at the "
        "same points: the claims are judged on these rows (on the GPU's, where measured).\n",
        _beside_the_paper(verdicts, measured_pts, cite),
        "Where the model's numbers and the paper's differ, and why (benchmarks.efficiency.memory.explain, "
        "computed from the "
        "numbers above):\n",
        "\n".join(f"- {note}" for note in memory.explain(arch)) + "\n",
    ]
    if measured_pts:
        parts += ["### Measured on a GPU\n", _measured_table(measured_pts, cite)]
    else:
        parts.append(
            f"No GPU memory measurements at the paper's {paper.GPU_MEMORY_GIB:g} GiB budget were given: the figures "
            "above are the model's (computed), not measured.\n"
        )
    if figs:
        parts += [
            figure(n, c)
            for n, c in (
                (
                    "fig6a-memory.png",
                    f"Fig. 6a: peak memory vs generation length, B = {paper.FIG6A_BATCH} (lines "
                    f"computed by the model; stars the paper's, on its {paper.GPU})",
                ),
                (
                    "fig6b-memory.png",
                    f"Fig. 6b: peak memory vs batch, L_gen = {paper.FIG6B_GENERATION // 1024}K "
                    f"(lines computed by the model; stars the paper's, on its {paper.GPU})",
                ),
            )
            if n in figs
        ]
    else:
        parts.append(figures.MISSING + "\n")
    parts[parts.index("SOURCES")] = cite.legend()
    claims = [on_gpu or model for model, on_gpu in verdicts]
    return Section(TITLE, "\n".join(parts), figs, claims)
