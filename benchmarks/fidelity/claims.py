"""The paper's fidelity claims (Table 9, Fig. 4, Fig. 5, Table 11) restated next to what was measured:
each analysis's definition beside the paper's wording, the verdicts, and the markdown of a result."""

from __future__ import annotations

import itertools
import statistics

from tabulate import tabulate

from reference.paper import FIG5_SHARE_PERCENT, FIG5_TOP_PERCENT, TABLE11_OVERLAP


def _percents(values) -> str:
    return "/".join(f"{v:.1f}" for v in values)


#: The paper's claims as it states them, numbers from `reference.paper`.
PAPER = {
    "fig5": f"Qwen3-14B top {'/'.join(map(str, FIG5_TOP_PERCENT))}% hold "
    f"{_percents(FIG5_SHARE_PERCENT['Qwen3-14B'])}%; Qwen3-32B {_percents(FIG5_SHARE_PERCENT['Qwen3-32B'])}% (median)",
    "fig4": "QK pair norm > K pair norm > K magnitude > K range; prefill-only almost equals full-sequence",
    "table9": "QK pair norm gives the lowest attention KL; prefill-only closely matches full-sequence",
    "table11": f"overlap about {TABLE11_OVERLAP['pair-norm']:.2f} (pair-norm reference) and "
    f"{TABLE11_OVERLAP['dot']:.2f} (|<q_i, k_i>|) across four decode ranges",
}


ORDER = ("qk-pair-norm", "k-pair-norm", "k-magnitude", "k-range")  # Fig. 4's claimed order

#: Each analysis: the paper's wording, what is computed here, and where the paper leaves a choice open.
DEFINITIONS = {
    "fig5": {
        "paper": "cumulative share of total importance held by the top-r% pairs (median over layers, KV heads, "
        "prompts)",
        "here": "importance of pair i of a KV head: sum over decode queries t >= P of the group's query heads h and "
        "keys s <= t of ||q[h, t, i]|| * ||k[s, i]||; share = importance of the top r% pairs / importance of all "
        "pairs; median over (layer, KV head, prompt)",
        "open": "which (t, s) the total sums over (here: decode queries, every key they see) and how query heads of "
        "a GQA group combine (here: summed, since they share the KV head's pairs)",
    },
    "fig4": {
        "paper": "Jaccard similarity between each criterion's top-r% pairs and the decoding-time ground truth: the "
        "top-r% pairs by ||q_t,i|| * ||k_s,i|| for each query-key pair (t, s)",
        "here": "for each layer, query head h, decode query t >= P and key s <= t: Jaccard of the criterion's top "
        "r% pairs (chosen per KV head, from the prompt or the full sequence) with the top r% pairs by "
        "||q[h, t, i]|| * ||k[g(h), s, i]||; mean over (t, s) (all of them, or a stated seeded sample), then over "
        "query heads, layers and prompts",
        "open": "how GQA groups are treated (here: each query head has its own ground truth and is compared with "
        "its KV head's selection) and whether s ranges over every key or decode keys only (here: every key "
        "s <= t). The aggregated variant (one ground truth per KV head from the importance summed over all "
        "(t, s)) is reported as an extra, not under the paper's name",
    },
    "table9": {
        "paper": "key MSE and attention KL divergence for uniform baselines and H3(50%)L1 at equal bits, "
        "criteria from prefill tokens or the full sequence",
        "here": "keys in the online cache's layout at the end of the trace (sinks and residual exact, whole pages "
        "quantized); key MSE = mean over every key, channel and KV head of (k_hat - k)^2; attention KL = mean "
        "over query heads and decode queries t >= P of KL(p || p_hat), the attention distributions over keys "
        "s <= t from exact and quantized keys; means over layers and prompts",
        "open": "which tokens are quantized (here: as the online cache does, not the whole trace), which queries "
        "the KL averages over (here: decode queries) and its direction (here: KL(exact || quantized))",
    },
    "table11": {
        "paper": "overlap of prefill-selected pairs with decode-time salient pairs at r = 50% across four decoding "
        "ranges; keys s restricted to decode-generated ones",
        "here": "the decode queries split into four equal ranges; in each, the top 50% pairs per KV head by the "
        "importance summed over the range's queries t and decode-generated keys P <= s <= t (pair-norm "
        "reference: ||q_t,i|| * ||k_s,i||; dot reference: |<q_t,i, k_s,i>|); overlap = |prefill selection and "
        "that set| / |prefill selection|; mean over (layer, KV head, prompt)",
        "open": "whether a range's salient pairs are aggregated over the range (taken here) or per (t, s)",
    },
    "end_to_end": {
        "paper": "not an analysis of the paper (its Table 2 measures task accuracy, not run here)",
        "here": "greedy tokens generated through each method's cache against FP16 (fraction identical, first "
        "divergence), and held-out NLL decoded token by token; the tokens computed with quantized pages in the "
        "cache are counted, since before the first flush a cache is exact",
        "open": "-",
    },
}


def fig4_per_pair(s: dict) -> bool:
    """Whether a result's Fig. 4 is the paper's per-(t, s) definition (results before it aggregated)."""
    return "fig4_pairs" in s


def _table9_best(s: dict) -> str:
    kl = {n: v["kl"] for n, v in s["table9_mean"].items()}
    return min((n for n in kl if n.startswith("H3")), key=kl.get)


def _overlaps(s: dict) -> list[float]:
    return [v for ref in s["table11_overlap_mean"].values() for v in ref.values()]


def claim_holds(s: dict) -> dict[str, bool | None]:
    """Whether each claim holds on the measured numbers; None where this model cannot test it
    (Fig. 5's shares are for 14B and 32B models)."""
    jac = s["fig4_jaccard_mean"]
    fig4 = all(
        jac[f"{a} ({scope}), r={r}"] > jac[f"{b} ({scope}), r={r}"]
        for scope in ("prefill", "full")
        for r in ("10%", "50%")
        for a, b in itertools.pairwise(ORDER)
    )
    overlaps = _overlaps(s)
    return {
        "fig4": fig4 if fig4_per_pair(s) else None,
        "table9": "qk-pair-norm" in _table9_best(s),
        "table11": max(overlaps) - min(overlaps) < 0.1,
        "fig5": None,
    }


def verdicts(s: dict, model: str | None = None) -> dict[str, str]:
    """Plain statements of whether each claim of the paper holds on the measured numbers (`model`: the
    result's, named in them)."""
    holds = claim_holds(s)
    jac = s["fig4_jaccard_mean"]
    gap = max(abs(jac[f"{c} (prefill), r={r}"] - jac[f"{c} (full), r={r}"]) for c in ORDER for r in ("10%", "50%"))
    out = {}
    order = ", ".join(
        f"{c} {statistics.fmean(jac[f'{c} ({sc}), r={r}'] for sc in ('prefill', 'full') for r in ('10%', '50%')):.3f}"
        for c in ORDER
    )
    if holds["fig4"] is None:
        out["fig4"] = "this result's Fig. 4 aggregates over all (t, s), not the paper's per-(t, s) definition"
    else:
        out["fig4"] = (
            f"order QK pair norm > K pair norm > K magnitude > K range "
            f"{'holds' if holds['fig4'] else 'does not hold'} for every scope and r (per-(t, s) Jaccard, means "
            f"over scopes and r: {order}); largest prefill-vs-full Jaccard gap {gap:.3f}"
        )
    kl = {n: v["kl"] for n, v in s["table9_mean"].items()}
    out["table9"] = (
        f"lowest attention KL among the mixed-precision criteria: {_table9_best(s)} "
        f"({'as' if holds['table9'] else 'not as'} the paper claims); uniform KIVI-style "
        f"{kl['KIVI-style uniform 2-bit']:.4g}, PolarQuant-style {kl['PolarQuant-style 2-bit']:.4g}, "
        f"QK pair norm (prefill) {kl['H3(50%)L1, qk-pair-norm (prefill)']:.4g}"
    )
    shares = {str(k): x for k, x in s["fig5_share_median"].items()}  # int keys, or str after JSON
    out["fig5"] = (
        f"top 10/30/50% hold {shares['10']:.1%}/{shares['30']:.1%}/{shares['50']:.1%} "
        f"here ({'on ' + model.split(' (')[0] + ', ' if model else ''}not the paper's 14B/32B models)"
    )
    overlaps = _overlaps(s)
    out["table11"] = (
        f"overlap stays within {min(overlaps):.3f}-{max(overlaps):.3f} across the four ranges "
        f"({'stable' if holds['table11'] else 'not stable'}: spread {max(overlaps) - min(overlaps):.3f})"
    )
    return out


def _definition(key: str) -> str:
    d = DEFINITIONS[key]
    return f"\nDefinition here: {d['here']}.\nThe paper's wording: {d['paper']}.\nLeft open by the paper: {d['open']}."


def _fig4_lines(s: dict) -> list[str]:
    if not fig4_per_pair(s):
        return ["\nThis result predates the paper's per-(t, s) definition: its numbers are the aggregated variant."]
    pairs = s["fig4_pairs"]
    sizes = ", ".join(map(str, pairs["per_layer_and_prompt"]))
    how = "every (t, s)" if pairs["exact"] else f"up to {pairs['max_pairs']} (t, s) drawn at random (seeded)"
    lines = [f"\n(t, s) pairs per layer and prompt: {sizes} ({how})."]
    extra = s.get("fig4_aggregated_jaccard_mean")
    if extra:
        lines += [
            "\nExtra, not the paper's definition: the same Jaccard against one ground truth per KV head, the top r% "
            "of the importance summed over all decode (t, s) (what earlier versions reported as Fig. 4):\n",
            tabulate(
                sorted(extra.items(), key=lambda kv: -kv[1]),
                ["criterion (scope), r", "Jaccard"],
                "github",
                floatfmt=".3f",
            ),
        ]
    return lines


def markdown(result: dict) -> str:
    """A fidelity result's markdown: its title, then `body`."""
    return f"# Fidelity analyses on {result['model']}\n" + body(result)


def body(result: dict, level: int = 2) -> str:
    """Everything of a fidelity result's markdown below its title, its headings at `level` (the report embeds
    it under headings of its own)."""
    h = "#" * level
    s = result["summary"]
    v = verdicts(s, result.get("model"))
    lines = [
        "",
        f"Measured on {result['device']}, {result['date_utc']}, command `{result['command']}`; "
        f"{result['prompts']} prompts ({result['prompt_tokens']} prompt tokens), {result['new_tokens']} generated "
        f"tokens each, greedy; versions {result['versions']}.",
        "",
        f"{h} Fig. 5: share of decode-time importance held by the top pairs (median)",
        "",
        tabulate([[f"top {p}%", f"{v:.1%}"] for p, v in s["fig5_share_median"].items()], ["pairs", "share"], "github"),
        f"\nPaper (quoted): {PAPER['fig5']}.\nHere (measured): {v['fig5']}.",
        _definition("fig5"),
        "",
        f"{h} Fig. 4: Jaccard similarity with the decode-time top pairs of each query-key pair (mean)",
        "",
        tabulate(
            sorted(s["fig4_jaccard_mean"].items(), key=lambda kv: -kv[1]),
            ["criterion (scope), r", "Jaccard"],
            "github",
            floatfmt=".3f",
        ),
        f"\nPaper (quoted): {PAPER['fig4']}.\nHere (measured): {v['fig4']}.",
        *_fig4_lines(s),
        _definition("fig4"),
        "",
        f"{h} Table 9: key MSE and attention KL at about 2 bits (mean)",
        "",
        tabulate(
            sorted(([n, v["mse"], v["kl"]] for n, v in s["table9_mean"].items()), key=lambda r: r[2]),
            ["method", "key MSE", "attention KL"],
            "github",
            floatfmt=".4g",
        ),
        f"\nPaper (quoted): {PAPER['table9']}.\nHere (measured): {v['table9']}.",
        _definition("table9"),
        "",
        f"{h} Table 11: overlap of the prefill selection with decode-time salient pairs (r = 50%)",
        "",
        tabulate(
            [[ref, *(f"{v:.3f}" for v in ranges.values())] for ref, ranges in s["table11_overlap_mean"].items()],
            ["reference", *(f"range {j + 1}" for j in range(4))],
            "github",
        ),
        f"\nPaper (quoted): {PAPER['table11']}.\nHere (measured): {v['table11']}.",
        _definition("table11"),
    ]
    if "end_to_end" in result:
        e = result["end_to_end"]

        def quantized(v: dict) -> str:
            reads = v.get("quantized_reads") or []
            if not reads:
                return "not recorded"
            return f"{sum(r['tokens_with_quantized_pages'] for r in reads)} of {sum(r['tokens'] for r in reads)}"

        rows = [
            [
                n,
                statistics.fmean(v["identical_fraction"]),
                str(v["first_divergence"]),
                quantized(v),
                v["nll"],
                v["nll"] - e["fp16_nll"],
            ]
            for n, v in e["methods"].items()
        ]
        heads = ["method", "identical tokens", "first divergence", "tokens read quantized pages", "NLL", "NLL - FP16"]
        lines += [
            "",
            f"{h} End to end: greedy agreement with FP16 and held-out NLL",
            "",
            tabulate(rows, heads, "github", floatfmt=".4f"),
            f"\nFP16 NLL {e['fp16_nll']:.4f} over {e['heldout_tokens'] - e['prefix']} held-out tokens.",
            *(f"\n**Warning:** {w}." for w in e.get("warnings", [])),
            _definition("end_to_end"),
        ]
    return "\n".join(lines) + "\n"
