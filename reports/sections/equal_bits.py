"""The section on channels against token roles at equal bits: TriAxialKV, role-aware PN-Mix and the
channel methods on `benchmarks.fidelity.equal_bits` results, with TriAxialKV's stated trade-offs checked."""

from __future__ import annotations

import re
from collections.abc import Sequence

from benchmarks.fidelity import equal_bits
from reference import paper
from reports import figures
from reports.inputs import Source
from reports.markdown import (
    CONFIRMED,
    INCONCLUSIVE,
    NOT_CONFIRMED,
    NOT_MEASURED,
    Citations,
    Claim,
    Section,
    escape,
    figure,
    table,
)
from reports.provenance import computed, measured, quoted
from reports.sections.claims import claims_table

TITLE = "Channels or token roles at equal bits (TriAxialKV)"
FIGURE = "equal-bits-long-output.png"
#: TriAxialKV's numbers (arXiv 2605.17170) that need a GPU decode kernel to check.
THROUGHPUT = "1.26-1.52x the BF16 throughput"
CONCURRENCY = (3.4, 4.0)  # x BF16 concurrency
MEMORY_SOURCE = computed(
    "benchmarks.fidelity.equal_bits.memory_rows (benchmarks.efficiency.memory with each method's exact storage model; "
    f"{paper.MODEL}, {paper.GPU_MEMORY_GIB:g} GiB budget, P = {paper.PROMPT})"
)
CLAIMS_SOURCE = computed("benchmarks.fidelity.equal_bits.claims")
#: The columns of a budget's table that are computed (storage formulas), not measured.
#: The method table's columns by provenance (`equal_bits.METHOD_COLUMNS`).
COMPUTED_COLUMNS = equal_bits.METHOD_COLUMNS[2:4]
MEASURED_COLUMNS = equal_bits.METHOD_COLUMNS[4:]


def _provenance(s: Source) -> str:
    d = s.data
    workload = f"{d.get('model')}, {len(d['conversations']['evaluation'])} evaluation conversations"
    return measured(d.get("device", "?"), d.get("date_utc", "?"), d.get("command"), s.name, workload)


def primary(sources: Sequence[Source], match: str = "asymptotic") -> Source | None:
    """The newest full (non-smoke) result whose channel methods were matched by `match`: what the section states."""
    full = [
        s for s in sources if "--smoke" not in s.data.get("command", "") and s.data.get("match", "asymptotic") == match
    ]
    return max(full, key=lambda s: s.data.get("date_utc", ""), default=None)


def _draw(data: dict):
    results = data["results"]

    def draw(*axes):
        for ax, r in zip(axes, results, strict=True):
            for name, curves in r["long_output"].items():
                if "kl" in curves:
                    ax.plot(
                        range(1, len(curves["kl"]) + 1),
                        curves["kl"],
                        marker="o",
                        ms=3,
                        color=figures.color(name),
                        label=name,
                    )
            ax.set_title(f"{r['budget']} bits: KL(FP16 || method)")
            ax.set_xlabel(f"span of output positions (of {r['long_positions']})")
            ax.set_yscale("log")

    return draw


def _claims(s: Source, only_combination: bool = False, suffix: str = "") -> list[Claim]:
    """The result's claims by this tree's rules (`benchmarks.fidelity.equal_bits.claims` of its results: a result of
    older code, decided on means, is inconclusive where the rule now tests conversation by conversation)."""
    status = {True: CONFIRMED, False: NOT_CONFIRMED, equal_bits.UNDECIDED: INCONCLUSIVE}
    conversations = len(s.data.get("conversations", {}).get("evaluation", ())) or None
    return [
        Claim(
            c["claim"] + suffix,
            status[c["holds"]],
            c["source"],
            c["evidence"],
            CLAIMS_SOURCE if "computed" in c["source"] else _provenance(s),
        )
        for c in equal_bits.claims(s.data["results"], conversations)
        if not only_combination or "combination" in c["claim"]
    ]


def trade_offs(s: Source, stored: Source | None = None) -> list[Claim]:
    """TriAxialKV's stated trade-offs, and the question of the comparison, with what the results say
    (`stored`: the run matched on stored memory, whose combination claims are added)."""
    d = s.data
    out = _claims(s)
    if stored is not None:
        out += _claims(stored, only_combination=True, suffix=" (equal stored memory)")
    ratios = []
    for r in d["results"]:
        batch = {m["method"]: m["fig6b_max_batch"] for m in r["memory"]}
        if batch.get("FP16"):
            ratios.append((r["budget"], batch["TriAxialKV"] / batch["FP16"]))
    lo, hi = CONCURRENCY
    out.append(
        Claim(
            f"TriAxialKV serves {lo}-{hi}x the concurrency of BF16, at least {lo}x (arXiv 2605.17170)",
            CONFIRMED if ratios and all(lo <= x for _, x in ratios) else NOT_CONFIRMED,
            f"computed from the storage formula (Fig. 6b model: {paper.MODEL}, {paper.GPU}, 8K generated)",
            "; ".join(f"{b} bits: {x:.2f}x FP16's largest batch" for b, x in ratios) + " (weights and workspace "
            "included: the cache alone would give more)",
            computed("benchmarks.efficiency.memory.max_batch with each method's storage model"),
        )
    )
    out.append(
        Claim(
            f"TriAxialKV decodes at {THROUGHPUT} (arXiv 2605.17170)",
            NOT_MEASURED,
            "-",
            "no GPU here: the Triton decode of per-token precision (bitwidth-homogeneous splits merged by "
            "log-sum-exp, pnmix/kernels/token_attention.py) is checked on the interpreter and compiled for "
            "sm_80/sm_90, but has not run on a GPU",
            quoted("arXiv 2605.17170"),
        )
    )
    return out


def _run_line(data: dict) -> str:
    conv = data["conversations"]
    matched = "stored" if data.get("match") == "stored" else "bits"
    return (
        f"Calibration on {len(conv['calibration'])} conversations, evaluation on {len(conv['evaluation'])} "
        f"({conv['evaluation_tokens']} tokens); attention at layers {data['layers']}; channel methods matched on "
        f"{matched}.\n"
    )


def _tables(data: dict, label: str, level: int, cite: Citations) -> list[str]:
    """Each budget's tables, their provenance per column: the metrics measured in run `label`, the bits,
    stored bits and memory computed from storage formulas."""
    memory = (
        f"computed: the memory model {cite.cite(MEMORY_SOURCE)}, the token methods' share of INT2 tokens as "
        f"measured in {label}"
    )
    parts = []
    for r in data["results"]:
        rows = equal_bits.tables(r)
        parts += [
            f"{'#' * level} Budget {r['budget']} bits\n",
            table(
                rows["methods"],
                list(equal_bits.METHOD_COLUMNS),
                f"equal-bits run {label}; measured: {', '.join(MEASURED_COLUMNS)}; computed: "
                f"{', '.join(COMPUTED_COLUMNS)} (storage formulas, on this run's allocation and conversation "
                "lengths)",
            ),
        ]
        if rows["long_output"]:
            parts += [
                f"Long outputs ({r['long_positions']} positions): KL(FP16 || method) by quarter of the output\n",
                table(rows["long_output"], list(equal_bits.QUARTER_COLUMNS), f"measured: equal-bits run {label}"),
            ]
        parts += [
            f"Memory of each method at this budget ({paper.MODEL}, {paper.GPU_MEMORY_GIB:g} GiB budget, prompt "
            f"{paper.PROMPT})\n",
            table(rows["memory"], list(equal_bits.MEMORY_COLUMNS), memory),
        ]
    return parts


def render(sources: Sequence[Source]) -> Section:
    intro = (
        "PN-Mix spends bits per channel (salient RoPE pairs); TriAxialKV (arXiv 2605.17170) per token, by a role "
        "tag on three axes (recency to the current turn, modality, semantic role; `reference.tokens.roles`), "
        "INT2 or INT4 "
        "per tag chosen by an allocator from calibrated attention-output distortion (`reference.tokens.allocation`, "
        "`benchmarks.fidelity.role_calibration`), stored as `reference.tokens.config` plans (INT2 keys per channel in "
        "groups of 32 INT2 tokens, the leftover on the INT4 per-token path, no exact residual). Role-aware PN-Mix, "
        "the combination neither paper has, keeps TriAxialKV's per-tag budget and spends its INT2 keys as PN-Mix "
        "does: H3(50%)L1 on the pairs Eq. 6 picks at prefill, the same 2 bits. Each channel method takes the "
        ""
        "configuration of its family nearest each budget (`benchmarks.fidelity.equal_bits.candidates`). The "
        "bits column "
        "counts payload, scales, zeros, sinks and metadata (the channel methods' exact residual excluded, as the "
        "paper counts); the stored column counts everything a cache holds for the evaluated conversations: at "
        "these lengths (under 1K tokens) the channel methods' exact residual and sinks are a large share of it "
        "and of their fidelity, which matters less over long outputs. Role-aware PN-Mix and TriAxialKV store the "
        "same bits, so their rows isolate what PN-Mix's pairs add to token roles.\n"
    )
    if not sources:
        return Section(TITLE, intro + "\nNo equal-bits result was given: run `pnmix-equal-bits`.\n")
    models = list(dict.fromkeys(_model(s) for s in sources))
    cite, parts, figs, found = Citations("E"), [intro, "SOURCES"], {}, False
    for n, model in enumerate(models, start=1):
        mine = [s for s in sources if _model(s) == model]
        more, fig = _model_parts(mine, cite, FIGURE if n == 1 else FIGURE.replace(".png", f"-{n}.png"))
        if more is None:
            continue
        found = True
        if len(models) > 1:
            more = [f"### {escape(mine[0].data.get('model', '?'))}\n", *(_demoted(p) for p in more)]
        parts += more
        figs |= fig
    if not found:
        return Section(
            TITLE, intro + "\nOnly smoke runs of `benchmarks.fidelity.equal_bits` were given (harness checks).\n"
        )
    parts[parts.index("SOURCES")] = cite.legend()
    return Section(TITLE, "\n".join(parts), figs)


def _model(s: Source) -> str:
    return s.data.get("model_fingerprint") or s.data.get("model") or "?"


def _demoted(part: str) -> str:
    """A part one heading level down (under the model's heading)."""
    return "\n".join("#" + line if re.match(r"#{3,} ", line) else line for line in part.split("\n"))


def _model_parts(sources: Sequence[Source], cite: Citations, figure_name: str) -> tuple[list[str] | None, dict]:
    """One model's part of the section (its newest full runs), or None where it has only smoke runs."""
    s, stored = primary(sources), primary(sources, "stored")
    only_stored = s is None and stored is not None
    if only_stored:  # the run matched on stored memory is what there is: it is the section's run
        s, stored = stored, None
    if s is None:
        return None, {}
    label = cite.cite(_provenance(s))
    stored_label = cite.cite(_provenance(stored)) if stored is not None else None
    shows = [f"- {escape(x)}" for x in equal_bits.findings(s.data)]
    if stored is not None:
        shows += [f"- Equal stored memory: {escape(x)}" for x in equal_bits.findings(stored.data)]
    parts = []
    if only_stored:
        parts.append(
            "\nNo current run matches the channel methods on bits (the default `pnmix-equal-bits`); "
            "the run shown matches them on stored memory (`--match stored`).\n"
        )
    parts += ["### What it shows\n", *shows, "", escape(f"Run {label}: " + _run_line(s.data))]
    parts += _tables(s.data, label, 3, cite)
    if s.data.get("model_fingerprint"):
        parts.append(escape(f"Model fingerprint: `{s.data['model_fingerprint']}`.") + "\n")
    figs = {}
    png = figures.png(_draw(s.data), ncols=len(s.data["results"]), size=(4.6, 3.6))
    if png is None:
        parts.append(figures.MISSING + "\n")
    else:
        figs[figure_name] = png
        parts.append(figure(figure_name, f"KL(FP16 || method) over long outputs at each budget (measured, {label})"))
    if stored is not None:
        parts += [
            "### At equal stored memory on these conversations\n",
            "The same measurements with each channel method's configuration matched on what its cache stores for "
            "the evaluated conversations, exact residual and sinks included (`--match stored`): at under 1K tokens "
            "none of them stores less than about 3.9 bits per element, so this is run at 4 bits only.\n",
            escape(f"Run {stored_label}: " + _run_line(stored.data)),
            *_tables(stored.data, stored_label, 4, cite),
        ]
    parts += [
        "### TriAxialKV's trade-offs and the combination, checked\n",
        claims_table(
            trade_offs(s, stored),
            cite,
            numbered=False,
            whose="the claims restate TriAxialKV's paper (arXiv 2605.17170) and this comparison's question",
        ),
    ]
    return parts, figs
