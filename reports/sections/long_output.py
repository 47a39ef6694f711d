"""The long-output part of the fidelity section: curves and tables of `benchmarks.fidelity.long_output` results."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.fidelity import long_output
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
    escape,
    escaped,
    figure,
    sources_under_tables,
    undrawn,
)
from reports.provenance import measured
from reports.sections import model_label

FIGURE = "long-output-{}.png"  # one figure per run, numbered in the order of the runs' dates


def _provenance(s: Source) -> str:
    d = s.data
    workload = f"{d.get('model')}, {d.get('prompts')} prompts, {d.get('summary', {}).get('positions')} positions"
    return measured(d.get("device", "?"), d.get("date_utc", "?"), d.get("command"), s.name, workload)


CLAIMS = {
    "accumulates": "Error over long outputs: a low-bit key cache drifts further from FP16 as the output grows "
    "(the premise of the paper's long-output setting, 8K-32K generated tokens; no number of the paper)",
    "pnmix_lowest": "Error over long outputs: PN-Mix stays closer to FP16 than uniform quantization at equal bits "
    "(Table 9's ordering, carried to every span of a long output)",
}


def _model(s: Source) -> str:
    return s.data.get("model_fingerprint") or s.data.get("model") or "?"


def primaries(sources: Sequence[Source]) -> list[Source]:
    """Of each model, the claims' basis (each model's rows its own): of its full (non-smoke) results, one that can
    decide (`long_output.MIN_PROMPTS` prompts or more, kept per prompt) before one that cannot, then the longest
    outputs, then the one whose FP16 text loops on the fewest prompts (past a loop a cache's drift is measured on
    text the model already wrote; a result that did not look counts every prompt), then the newest."""
    full = [s for s in sources if "--smoke" not in s.data.get("command", "")]
    best: dict[str, Source] = {}
    for s in sorted(full, key=_basis_rank, reverse=True):
        best.setdefault(_model(s), s)
    return list(best.values())


def _basis_rank(s: Source) -> tuple:
    prompts = len(s.data.get("per_prompt") or ())
    onsets = s.data.get("loop_onsets")
    looping = prompts if onsets is None else sum(onset is not None for onset in onsets)
    return prompts >= long_output.MIN_PROMPTS, s.data["summary"]["positions"], -looping, s.data.get("date_utc", "")


def primary(sources: Sequence[Source]) -> Source | None:
    """The full result with the longest outputs of any model (`primaries`' first)."""
    return next(iter(primaries(sources)), None)


def claims(sources: Sequence[Source]) -> list[Claim]:
    mains = primaries(sources)
    if not mains:
        why = "only a smoke run (a harness check)" if sources else "no long-output results"
        return [Claim(text, NOT_MEASURED, "-", why, "-") for text in CLAIMS.values()]
    # each model's claims in the order of the models' names: not of the results' dates, which may tie or not
    by_model = sorted(mains, key=lambda s: (str(s.data.get("model", "")), _model(s)))
    return [c for s in by_model for c in _claims(s, f"{s.data.get('model')}: " if len(mains) > 1 else "")]


#: The claim status of each long-output verdict (`benchmarks.fidelity.long_output.verdicts`).
STATUS = {
    long_output.HOLDS: CONFIRMED,
    long_output.FAILS: NOT_CONFIRMED,
    long_output.UNDECIDED: INCONCLUSIVE,
    long_output.NOT_MEASURED: NOT_MEASURED,
}


def _claims(s: Source, model: str) -> list[Claim]:
    out = []
    for key, (said, evidence) in long_output.verdicts(s.data).items():
        evidence = model + evidence
        status = STATUS[said]
        nll = long_output.quarter_means(s.data["summary"]["methods"]["FP16"]["nll"])
        if key == "accumulates" and nll[-1] < nll[0] / 4:
            more = f"{nll[0] / nll[-1]:.0f}x more" if nll[-1] > 0 else "fully"
            evidence += (
                f"; FP16's own text gets {more} predictable over the output (it repeats "
                "itself), which lowers every method's KL: this run cannot tell accumulation from that"
            )
            if said == long_output.FAILS:  # a falling KL is what the text alone would give: no evidence against
                status = INCONCLUSIVE
        out.append(
            Claim(
                CLAIMS[key],
                status,
                "measured" if said != long_output.NOT_MEASURED else "-",
                evidence,
                _provenance(s),
                _rests_on(s, key),
            )
        )
    return out


def _rests_on(s: Source, key: str) -> str:
    """The KL a long-output claim rests on: PN-Mix's first and last quarter ("accumulates"), or every quantized
    method's last quarter ("pnmix_lowest"), with the model."""
    kl = long_output.quarter_kl(s.data)  # the means the verdicts were judged on
    model = model_label(str(s.data.get("model", "?")))
    if key == "accumulates" and "PN-Mix" in kl:
        return f"{model}: PN-Mix KL {kl['PN-Mix'][0]:.3g} -> {kl['PN-Mix'][-1]:.3g}"
    if kl:
        return f"{model}, last quarter: " + ", ".join(f"{n} {q[-1]:.3g}" for n, q in kl.items())
    return ""


def render(sources: Sequence[Source], cite: Citations) -> tuple[list[str], dict[str, bytes]]:
    """Markdown parts and figures for the long-output results (nothing when there are none), each
    run's tables citing its source in `cite`, the fidelity section's; their claims come from `claims`."""
    if not sources:
        return [], {}
    parts = [
        "### Fidelity over long outputs\n",
        "Each method reads the FP16 model's own output (greedy, or sampled at the temperature and seed its run "
        "states) teacher-forced through its packed cache, with "
        "each position attending as in token-by-token decoding (`benchmarks.fidelity.long_output`); curves are "
        "means over "
        "spans of output positions, one figure per run.\n",
    ]
    figs = {}
    for i, s in enumerate(sorted(sources, key=lambda s: s.data.get("date_utc", "")), start=1):
        label = cite.cite(_provenance(s))
        body = long_output.body(escaped(s.data), level=4)  # under the section's heading
        parts.append(sources_under_tables(body, f"measured: long-output run {label}"))
        if s.data.get("model_fingerprint"):
            parts.append(escape(f"Model fingerprint: `{s.data['model_fingerprint']}`.") + "\n")
        png = (
            figures.png(
                lambda *axes, s=s: long_output.draw(s.data, axes, figures.color),
                ncols=len(long_output.PANELS),
                size=(4.6, 3.6),
            )
            if i <= MAX_FIGURES
            else None
        )
        if png is not None:
            figs[FIGURE.format(i)] = png
            positions = s.data["summary"]["positions"]
            parts.append(
                figure(
                    FIGURE.format(i),
                    f"Fidelity over {positions} output positions: KL, top-1 agreement "
                    f"and NLL per span of positions (measured, {label})",
                )
            )
    parts.append(undrawn(len(sources) - MAX_FIGURES, "runs"))
    if not figures.available():
        parts.append(figures.MISSING + "\n")
    return parts, figs
