"""Section 6: fidelity (Table 9, Fig. 4, Fig. 5, Table 11, end-to-end agreement) from the JSON of
`pnmix-fidelity`, rendered by `benchmarks.fidelity.claims` (`body`, `verdicts`)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from benchmarks.fidelity import claims as fidelity
from reference import paper
from reference.equations.saliency import CRITERIA
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
    details,
    escape,
    escaped,
    figure,
    sources_under_tables,
)
from reports.provenance import measured, quoted
from reports.sections import long_output, model_label
from reports.sections.claims import gist

TITLE = "Fidelity (Table 9, Fig. 4, Fig. 5, Table 11, end to end)"
SHARES = tuple(map(str, paper.FIG5_TOP_PERCENT))
WHERE = {
    "fig4": "Fig. 4",
    "fig4_prefill": "Fig. 4, prefill-only",
    "table9": "Table 9",
    "table9_prefill": "Table 9, prefill-only",
    "table11": "Table 11",
    "fig5": "Fig. 5",
}


def is_smoke(s: Source) -> bool:
    return "--smoke" in s.data.get("command", "")


def primaries(sources: Sequence[Source]) -> list[Source]:
    """The newest full (non-smoke) result of each model, newest first: the ones the claims are judged on, each
    model's own rows (a second family is evidence of its own, not a replacement of the first)."""
    full = sorted((s for s in sources if not is_smoke(s)), key=lambda s: s.data.get("date_utc", ""), reverse=True)
    out, seen = [], set()
    for s in full:
        model = s.data.get("model_fingerprint") or s.data.get("model")
        if model not in seen:
            seen.add(model)
            out.append(s)
    return out


def primary(sources: Sequence[Source]) -> Source | None:
    """The newest full (non-smoke) result of any model."""
    return next(iter(primaries(sources)), None)


def provenance(s: Source) -> str:
    d = s.data
    workload = f"{d.get('model')}, {d.get('prompts')} prompts, {d.get('new_tokens')} new tokens each"
    return measured(d.get("device", "?"), d.get("date_utc", "?"), d.get("command"), s.name, workload)


def merged_warnings(e2e: dict) -> list[str]:
    """The end-to-end warnings, each said once: warnings that differ only in the method they name
    become one naming every such method."""
    groups: dict[str, list[str]] = {}
    for w in e2e.get("warnings", []):
        name = next((m for m in e2e["methods"] if w.startswith(f"{m}: ")), None)
        text = w[len(name) + 2 :] if name else w
        groups.setdefault(text, []).extend([name] if name else [])
    return [f"{', '.join(names)}: {text}" if names else text for text, names in groups.items()]


def claims_of(mains: Sequence[Source], smoke_only: bool) -> list[Claim]:
    """Each model's claim rows (`claims`), Fig. 5's merged into one: the paper's models are not run here, and
    each model's measured shares are said in that one row."""
    if not mains:
        return claims(None, smoke_only)
    rows = [c for s in mains for c in claims(s, smoke_only)]
    fig5 = [c for c in rows if c.claim.startswith(WHERE["fig5"])]
    if len(fig5) < 2:
        return rows
    merged = dataclasses.replace(
        fig5[0],
        evidence=fig5[0].evidence + "; " + "; ".join(c.evidence.split(": ", 1)[-1] for c in fig5[1:]),
        provenance="; ".join(c.provenance for c in fig5),
    )
    return [merged if c is fig5[0] else c for c in rows if c not in fig5[1:]]


def claims(s: Source | None, smoke_only: bool) -> list[Claim]:
    keys = ("table9", "table9_prefill", "fig4", "fig4_prefill", "fig5", "table11")
    if s is None:
        why = "only a smoke run (one prompt, a harness check)" if smoke_only else "no fidelity results"
        out = [Claim(f"{WHERE[k]}: {fidelity.PAPER[k]}", NOT_MEASURED, "-", why, "-") for k in keys]
    else:
        summary, per_prompt = s.data["summary"], s.data.get("per_prompt")
        v, holds = (
            fidelity.verdicts(summary, s.data.get("model"), per_prompt),
            fidelity.claim_holds(summary, per_prompt),
        )
        out = []
        for k in keys:
            basis = "measured"
            if k == "fig5":  # the paper's numbers are for 14B and 32B models: a 135M model does not test them
                status, basis = NOT_MEASURED, "-"
                evidence = "the claim is about Qwen3-14B/32B, not run here; on a smaller model (measured): " + v[k]
            elif holds[k] is None:  # a result computed under another definition than the paper's
                status, basis, evidence = NOT_MEASURED, "-", v[k]
            elif holds[k] == fidelity.UNDECIDED:
                status, evidence = INCONCLUSIVE, v[k]
            else:
                status, evidence = (CONFIRMED if holds[k] else NOT_CONFIRMED), v[k]
                if k == "table11":
                    evidence += (
                        "; judged on what was tested (above chance and stable over the generated tokens), the "
                        "overlap level itself depends on the model and the definition"
                    )
            claim = Claim(f"{WHERE[k]}: {fidelity.PAPER[k]}", status, basis, evidence, provenance(s))
            out.append(
                dataclasses.replace(claim, rests_on=f"{model_label(str(s.data.get('model', '?')))}: {gist(claim)}")
            )
    return out


def _label(s: Source) -> str:
    return f"{'smoke' if is_smoke(s) else 'full'} run of {s.data.get('date_utc', '?')}"


def _smoke_title(sources: Sequence[Source]) -> str:
    """What the figure's title adds where a measured curve is a smoke run: on the plot itself, how
    many prompts it ran and that it checks the harness, not the claim."""
    smoke = [s for s in sources if is_smoke(s)]
    if not smoke:
        return ""
    prompts = sorted({s.data.get("prompts") for s in smoke} - {None})
    counted = " or ".join(map(str, prompts)) + f" prompt{'s' * (prompts != [1])}, " if prompts else ""
    which = "every measured curve is" if len(smoke) == len(sources) else f"{len(smoke)} measured curve(s) are"
    return f"\n{which} a smoke run ({counted}a harness check, not the claim)"


def _fig5(sources: Sequence[Source]) -> bytes | None:
    labels = [f"{s.data['model'].split()[0]}, {_label(s)}" for s in sources]
    # two files of one run (a copy given with --input) are two curves: each named by its file then
    labels = [f"{a}, {s.name}" if labels.count(a) > 1 else a for a, s in zip(labels, sources, strict=True)]

    def draw(ax):
        x = [int(p) for p in SHARES]
        for s, label, style in zip(sources, labels, itertools.cycle(("-", ":", "-.")), strict=False):
            shares = {str(k): v for k, v in s.data["summary"]["fig5_share_median"].items()}
            model = s.data["model"].split()[0]
            ax.plot(
                x,
                [100 * shares[p] for p in SHARES],
                ls=style,
                marker="o",
                color=figures.color(model),
                label=f"{label} (measured)",
            )
        for model, ys in paper.FIG5_SHARE_PERCENT.items():
            ax.plot(x, ys, marker="*", ls="--", color=figures.color(model), label=f"{model} (paper, quoted)")
        ax.set(
            xlabel="top r% of pairs",
            ylabel="share of decode-time importance (%)",
            xticks=x,
            title="Fig. 5: cumulative importance share (median)" + _smoke_title(sources),
        )

    return figures.png(draw, size=(6.4, 4.8))


def _fig4(s: Source) -> bytes | None:
    jac = s.data["summary"]["fig4_jaccard_mean"]

    def draw(*axes):
        for ax, r in zip(axes, ("10%", "50%"), strict=True):
            xs = range(len(CRITERIA))
            for j, scope in enumerate(("prefill", "full")):
                ax.bar(
                    [x + 0.4 * j - 0.2 for x in xs],
                    [jac[f"{c} ({scope}), r={r}"] for c in CRITERIA],
                    width=0.4,
                    color=figures.color(scope),
                    label=f"from {scope} tokens",
                )
            ax.set_xticks(list(xs), CRITERIA, fontsize="small")
            ax.set(
                ylim=(0, 1), ylabel="Jaccard with the top pairs of each (t, s)", title=f"Fig. 4: r = {r}, {_label(s)}"
            )

    return figures.png(draw, ncols=2, size=(5.6, 4.0))


def render(sources: Sequence[Source], note: str = "", long_sources: Sequence[Source] = ()) -> Section:
    cite = Citations("F")
    mains = primaries(sources)
    claimed = claims_of(mains, smoke_only=bool(sources)) + long_output.claims(long_sources)
    if not sources:
        long_parts, long_figs = long_output.render(long_sources, cite)
        parts = [(note or "No fidelity results were run or given.") + "\n", cite.legend(), *long_parts]
        return Section(TITLE, "\n".join(p for p in parts if p), long_figs, claimed)
    ordered = sorted(sources, key=lambda s: (s not in mains, s.data.get("date_utc", "")))
    intro = [note + "\n" if note else ""]
    intro.append(
        "Offline analyses of post-RoPE queries and keys recorded from a real model, rendered by "
        "`benchmarks.fidelity.claims.markdown`; the paper's claims are quoted next to what was measured. "
        + (
            escape(
                "The paper's claims are judged on the newest full run of each model: "
                + "; ".join(f"{m.data.get('model')}, {_label(m)}" for m in mains)
                + "."
            )
            if mains
            else "Only smoke runs are present: they check the harness, not the claims."
        )
        + "\n"
    )
    parts = []
    for s in ordered:
        kind = "smoke" if is_smoke(s) else "full"
        body = sources_under_tables(
            fidelity.body(escaped(_said_once(s.data)), level=4),  # under our heading, which names the run
            f"measured: fidelity {kind} run {cite.cite(provenance(s))}",
        )
        head = escape(f"### {s.data.get('model')}: {_label(s)} (`{s.name}`, {s.origin})") + "\n"
        if s.data.get("model_fingerprint"):  # results before --model carry the name alone
            head += "\n" + escape(f"Model fingerprint: `{s.data['model_fingerprint']}`.") + "\n"
        parts.append(head + "\n" + (body if s in mains else details(f"{_label(s)}: tables", body)))
    figs = {"fig5-importance-share.png": _fig5(ordered)}
    for n, m in enumerate(mains, start=1):
        figs["fig4-jaccard.png" if n == 1 else f"fig4-jaccard-{n}.png"] = _fig4(m)
    figs = {k: v for k, v in figs.items() if v is not None}
    if figs:
        parts.append(f"Paper values in the figures are {quoted('Fig. 5')}; the rest is measured (sources above).\n")
        fig4 = (
            "Fig. 4: Jaccard similarity of each criterion's top pairs with the top pairs of each decode query-key "
            "pair (t, s)"
        )
        captions = {"fig5-importance-share.png": "Fig. 5: share of decode-time importance held by the top pairs"}
        for n, m in enumerate(mains, start=1):
            captions["fig4-jaccard.png" if n == 1 else f"fig4-jaccard-{n}.png"] = f"{fig4}, {m.data.get('model')}"
        parts += [figure(n, captions[n]) for n in figs]
    elif not long_sources:  # otherwise the long-output part says it, once for the section
        parts.append(figures.MISSING + "\n")
    long_parts, long_figs = long_output.render(long_sources, cite)
    parts = [*intro, cite.legend(), *parts, *long_parts]
    return Section(TITLE, "\n".join(p for p in parts if p), figs | long_figs, claimed)


def _said_once(data: dict) -> dict:
    """The result with its end-to-end warnings merged (`merged_warnings`), for the module's markdown."""
    e2e = data.get("end_to_end")
    return data | {"end_to_end": e2e | {"warnings": merged_warnings(e2e)}} if e2e else data
