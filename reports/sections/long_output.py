"""The long-output part of the fidelity section: curves and tables of `benchmarks.long_output` results."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from benchmarks import long_output

from .. import figures
from ..inputs import Source
from ..markdown import demote, figure, sources_under_tables
from ..provenance import measured

FIGURE = "long-output.png"
PANELS = (("kl", "KL(FP16 || method), nats"), ("top1", "top-1 agreement with FP16"), ("nll", "NLL of the FP16 token"))


def _provenance(s: Source) -> str:
    d = s.data
    workload = f"{d.get('model')}, {d.get('prompts')} prompts, {d.get('summary', {}).get('positions')} positions"
    return measured(d.get("device", "?"), d.get("date_utc", "?"), d.get("command"), s.name, workload)


def _draw(sources: Sequence[Source]):
    def draw(*axes):
        for s, style in zip(sources, itertools.cycle(("-", "--", ":")), strict=False):
            summary = s.data["summary"]
            mids = [(a + b) / 2 for a, b in itertools.pairwise(summary["bin_edges"])]
            for ax, (metric, title) in zip(axes, PANELS, strict=True):
                for name, values in summary["methods"].items():
                    if metric in values:
                        ax.plot(mids[: len(values[metric])], values[metric], style, marker="o", ms=3, label=name)
                ax.set_title(title)
                ax.set_xlabel("output position")

    return draw


def render(sources: Sequence[Source]) -> tuple[list[str], dict[str, bytes]]:
    """Markdown parts and figures for the long-output results (nothing when there are none)."""
    if not sources:
        return [], {}
    parts = [
        "### Fidelity over long outputs\n",
        "Each method reads the FP16 model's own greedy output teacher-forced through its packed cache, with "
        "each position attending as in token-by-token decoding (`benchmarks.long_output`); curves are means over "
        "spans of output positions.\n",
    ]
    for s in sorted(sources, key=lambda s: s.data.get("date_utc", "")):
        body = long_output.markdown(s.data).split("\n", 1)[1]
        parts.append(sources_under_tables(demote(body, 2), _provenance(s)))
        if s.data.get("model_fingerprint"):
            parts.append(f"Model fingerprint: `{s.data['model_fingerprint']}`.\n")
    png = figures.png(_draw(sources), ncols=3, size=(4.6, 3.6))
    if png is None:
        return [*parts, figures.MISSING + "\n"], {}
    return [*parts, figure(FIGURE, "Fidelity over the output: KL, top-1 agreement and NLL per span of positions "
                                   "(measured, sources above)")], {FIGURE: png}  # fmt: skip
