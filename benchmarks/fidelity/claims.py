"""The paper's fidelity claims (Table 9, Fig. 4, Fig. 5, Table 11) restated next to what was measured:
each analysis's definition beside the paper's wording, the verdicts, and the markdown of a result."""

from __future__ import annotations

import itertools
import math
import statistics

from tabulate import tabulate

from reference.paper import FIG5_SHARE_PERCENT, FIG5_TOP_PERCENT, TABLE11_OVERLAP


def _percents(values) -> str:
    return "/".join(f"{v:.1f}" for v in values)


#: The paper's claims as it states them, numbers from `reference.paper`.
PAPER = {
    "fig5": f"Qwen3-14B top {'/'.join(map(str, FIG5_TOP_PERCENT))}% hold "
    f"{_percents(FIG5_SHARE_PERCENT['Qwen3-14B'])}%; Qwen3-32B {_percents(FIG5_SHARE_PERCENT['Qwen3-32B'])}% (median)",
    "fig4": "QK pair norm > K pair norm > K magnitude > K range",
    "fig4_prefill": "each criterion's prefill-only selection almost equals its full-sequence selection",
    "table9": "QK pair norm gives the lowest attention KL",
    "table9_prefill": "criteria from the prefill tokens alone closely match the full sequence's",
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


#: A verdict the measured prompts cannot decide (a Fig. 4 link whose interval covers zero, a Table 11 trend or
#: level the prompts cannot place, a result that keeps no per-prompt values): "inconclusive" in the report.
UNDECIDED = "undecided"
#: The overlap a random selection of the same size has with the reference's top r% pairs (Table 11: r = 50%).
TABLE11_CHANCE = 0.5
#: Table 9's "closely matches": QK pair norm's attention KL from prefill-only selection within this share of its
#: KL from full-sequence selection.
TABLE9_MATCH = 0.10
#: Fig. 4's "almost equals": a criterion's per-(t, s) Jaccard from the prefill tokens within this of its Jaccard
#: from the full sequence.
FIG4_MATCH = 0.05
#: The two Table 9 selections compared for "prefill-only closely matches full-sequence".
TABLE9_SCOPES = ("H3(50%)L1, qk-pair-norm (prefill)", "H3(50%)L1, qk-pair-norm (full)")
#: Table 11's "stable": the overlap moves by less than this over the four ranges (the paper's values move by
#: about 0.01), judged as the slope per range over the three steps between them.
TABLE11_SPREAD = 0.1


def interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of the mean of `values` (units: prompts)."""
    from scipy.stats import t

    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, -math.inf, math.inf
    half = t.ppf((1 + confidence) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def resolvable(values: list[float], power: float = 0.80, alpha: float = 0.05) -> float:
    """The mean difference `values` (one per prompt) resolve with `power` at two-sided `alpha`, given their
    spread: (t_{1-alpha/2} + t_{power}) * sd / sqrt(n), n - 1 degrees of freedom; inf below two prompts."""
    from scipy.stats import t

    n = len(values)
    if n < 2:
        return math.inf
    return (t.ppf(1 - alpha / 2, n - 1) + t.ppf(power, n - 1)) * statistics.stdev(values) / math.sqrt(n)


def _side(low: float, high: float, margin: float = 0.0) -> str:
    """ "above" where (low, high) lies above +margin, "below" where below -margin, "tied" otherwise."""
    return "above" if low > margin else "below" if high < -margin else "tied"


def fig4_links(per_prompt: list[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """Each link a > b of Fig. 4's order, judged in every (scope, r) cell on the prompts' own means: the
    difference's 95% interval over prompts above zero ("holds"), below ("reversed") or covering it ("tied");
    {(a, b): {"holds": n, "tied": n, "reversed": n}} over the cells."""
    out = {}
    for a, b in itertools.pairwise(ORDER):
        counts = {"holds": 0, "tied": 0, "reversed": 0}
        resolves = 0.0
        for scope in ("prefill", "full"):
            for r in ("10%", "50%"):
                diffs = [
                    p["fig4_jaccard_mean"][f"{a} ({scope}), r={r}"] - p["fig4_jaccard_mean"][f"{b} ({scope}), r={r}"]
                    for p in per_prompt
                ]
                _, low, high = interval(diffs)
                side = _side(low, high)
                counts[{"above": "holds", "below": "reversed", "tied": "tied"}[side]] += 1
                if side == "tied":
                    resolves = max(resolves, resolvable(diffs))
        out[a, b] = counts | ({"tied resolves": resolves} if counts["tied"] else {})
    return out


def fig4_prefill(per_prompt: list[dict]) -> dict[str, tuple[str, float]]:
    """Each criterion's prefill-only minus full-sequence Jaccard over prompts, in each r: "within" +-FIG4_MATCH
    (its 95% interval), "outside" it wholly, or "undecided"; {f"{criterion}, r={r}": (that, what the prompts
    resolve at 80% power)}."""
    out = {}
    for c in ORDER:
        for r in ("10%", "50%"):
            diffs = [
                p["fig4_jaccard_mean"][f"{c} (prefill), r={r}"] - p["fig4_jaccard_mean"][f"{c} (full), r={r}"]
                for p in per_prompt
            ]
            _, low, high = interval(diffs)
            side = (
                "within"
                if -FIG4_MATCH < low and high < FIG4_MATCH
                else ("outside" if _side(low, high, FIG4_MATCH) != "tied" else "undecided")
            )
            out[f"{c}, r={r}"] = (side, resolvable(diffs))
    return out


def _ranges(by_range: dict) -> list[float]:
    return [by_range[j] for j in sorted(by_range, key=int)]


def table11_tests(per_prompt: list[dict]) -> dict[str, dict]:
    """Per reference, on the prompts' own overlaps: the mean overlap over the ranges minus TABLE11_CHANCE, and
    the trend (each prompt's least-squares slope per range); where the prompts measured the random control of the
    same size through the same code (`benchmarks.fidelity.analyses.random_selection`), also the mean overlap minus
    the control's on the same prompt ("above_random"); each (mean, low, high), a 95% interval over prompts."""
    out = {}
    control = all("table11_random_overlap_mean" in p for p in per_prompt)
    for ref in per_prompt[0]["table11_overlap_mean"]:
        levels, slopes, over_random = [], [], []
        for p in per_prompt:
            ys = _ranges(p["table11_overlap_mean"][ref])
            levels.append(statistics.fmean(ys) - TABLE11_CHANCE)
            slopes.append(statistics.linear_regression(range(len(ys)), ys).slope if len(ys) > 1 else 0.0)
            if control:
                chance = _ranges(p["table11_random_overlap_mean"][ref])
                over_random.append(statistics.fmean(ys) - statistics.fmean(chance))
        out[ref] = {"above_chance": interval(levels), "slope": interval(slopes), "slope resolves": resolvable(slopes)}
        if control:
            out[ref]["above_random"] = interval(over_random)
    return out


def table9_ratios(per_prompt: list[dict]) -> list[float] | None:
    """Per prompt, QK pair norm's attention KL with the prefill-only selection over the full-sequence one, minus 1;
    None where the prompts' values lack either selection."""
    prefill, full = TABLE9_SCOPES
    if any(n not in p.get("table9_mean", {}) for p in per_prompt for n in TABLE9_SCOPES):
        return None
    return [p["table9_mean"][prefill]["kl"] / p["table9_mean"][full]["kl"] - 1 for p in per_prompt]


def table9_match(per_prompt: list[dict]) -> tuple[float, float, float] | None:
    """`table9_ratios` as (mean, low, high), a 95% interval over prompts; None where they cannot be had."""
    ratios = table9_ratios(per_prompt)
    return None if ratios is None else interval(ratios)


def tested(per_prompt: list[dict] | None) -> bool:
    """Whether a result keeps per-prompt values enough to test across prompts (two prompts at least)."""
    return bool(per_prompt) and len(per_prompt) >= 2


def claim_holds(s: dict, per_prompt: list[dict] | None = None) -> dict[str, bool | str | None]:
    """Whether each claim holds, Fig. 4 and Table 11 judged across prompts on their own means (`per_prompt`, a
    result's): True, False, UNDECIDED where the prompts cannot tell (or the result keeps no per-prompt values),
    None where this model cannot test it (Fig. 5's shares are for 14B and 32B models; a Fig. 4 of the aggregated
    definition). Fig. 4: every link holds in every cell (True), one is reversed in one (False). Table 11: the
    overlap above the chance overlap (and above the random control's, where measured) and its slope within
    +-TABLE11_SPREAD / 3 per range, for both references (True); at or below chance, or a slope wholly beyond
    that, for one (False). Table 9 is judged on the means."""
    if tested(per_prompt):
        links = fig4_links(per_prompt)
        fig4 = (
            False
            if any(c["reversed"] for c in links.values())
            else True
            if all(c["holds"] == c["holds"] + c["tied"] + c["reversed"] for c in links.values())
            else UNDECIDED
        )
        step = TABLE11_SPREAD / 3
        sides = {side for side, _ in fig4_prefill(per_prompt).values()}
        fig4_match = False if "outside" in sides else True if sides == {"within"} else UNDECIDED
        tests = table11_tests(per_prompt).values()
        level = [_side(t[k][1], t[k][2]) for t in tests for k in ("above_chance", "above_random") if k in t]
        trend = [_side(t["slope"][1], t["slope"][2], step) for t in tests]
        flat = [-step < t["slope"][1] and t["slope"][2] < step for t in tests]
        table11 = (
            False
            if "below" in level or any(side != "tied" for side in trend)
            else True
            if all(side == "above" for side in level) and all(flat)
            else UNDECIDED
        )
        match = table9_match(per_prompt)
        table9_prefill = (
            UNDECIDED
            if match is None
            else True
            if -TABLE9_MATCH < match[1] and match[2] < TABLE9_MATCH
            else False
            if _side(match[1], match[2], TABLE9_MATCH) != "tied"
            else UNDECIDED
        )
    else:
        fig4 = fig4_match = table11 = table9_prefill = UNDECIDED
    return {
        "fig4": fig4 if fig4_per_pair(s) else None,
        "fig4_prefill": fig4_match if fig4_per_pair(s) else None,
        "table9": "qk-pair-norm" in _table9_best(s),
        "table9_prefill": table9_prefill,
        "table11": table11,
        "fig5": None,
    }


def verdicts(s: dict, model: str | None = None, per_prompt: list[dict] | None = None) -> dict[str, str]:
    """Plain statements of whether each claim of the paper holds on the measured numbers (`model`: the
    result's, named in them; `per_prompt`: its prompts' own means, which Fig. 4 and Table 11 are tested on)."""
    holds = claim_holds(s, per_prompt)
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
        out["fig4"] = f"per-(t, s) Jaccard, means over scopes and r: {order}; largest prefill-vs-full gap {gap:.3f}; "
        if not tested(per_prompt):
            out["fig4"] += "the result keeps no per-prompt values: the order cannot be tested across prompts"
        else:
            said = "; ".join(
                f"{a} > {b}: "
                + ", ".join(f"{k} in {n}" for k, n in c.items() if n and k != "tied resolves")
                + (f" (where tied, the prompts resolve {c['tied resolves']:.3f} at 80% power)" if c["tied"] else "")
                for (a, b), c in fig4_links(per_prompt).items()
            )
            out["fig4"] += (
                f"each link judged in the 4 (scope, r) cells by the 95% interval over {len(per_prompt)} prompts of "
                f"its difference (holds: above 0; tied: covering 0; reversed: below 0): {said}"
            )
    out["fig4_prefill"] = f"largest prefill-vs-full Jaccard gap of the means {gap:.3f}"
    if holds["fig4_prefill"] is None:
        out["fig4_prefill"] += "; this result's Fig. 4 is not the paper's per-(t, s) definition"
    elif not tested(per_prompt):
        out["fig4_prefill"] += "; no per-prompt values to test the match across prompts"
    else:
        found = fig4_prefill(per_prompt)
        counts = {k: sum(side == k for side, _ in found.values()) for k in ("within", "undecided", "outside")}
        out["fig4_prefill"] += (
            f"; prefill minus full per criterion and r, 95% interval over {len(per_prompt)} prompts against "
            f"+-{FIG4_MATCH:g}: "
            + ", ".join(f"{k} in {n}" for k, n in counts.items() if n)
            + f" of {len(found)} (the prompts resolve up to {max(x for _, x in found.values()):.3f} at 80% power)"
        )
    kl = {n: v["kl"] for n, v in s["table9_mean"].items()}
    out["table9"] = (
        f"lowest attention KL among the mixed-precision criteria: {_table9_best(s)} "
        f"({'as' if holds['table9'] else 'not as'} the paper claims); uniform KIVI-style "
        f"{kl['KIVI-style uniform 2-bit']:.4g}, PolarQuant-style {kl['PolarQuant-style 2-bit']:.4g}, "
        f"QK pair norm (prefill) {kl['H3(50%)L1, qk-pair-norm (prefill)']:.4g}"
    )
    match = table9_match(per_prompt) if tested(per_prompt) else None
    prefill, full = (s["table9_mean"].get(n, {}).get("kl") for n in TABLE9_SCOPES)
    out["table9_prefill"] = (
        f"QK pair norm's attention KL from the prefill tokens {prefill:.4g}, from the full sequence {full:.4g} (means)"
        if prefill is not None and full is not None
        else "the result lacks QK pair norm's prefill or full-sequence selection"
    )
    if match is None:
        out["table9_prefill"] += "; no per-prompt values to test the match across prompts"
    else:
        out["table9_prefill"] += (
            f"; prefill / full - 1 over {len(per_prompt)} prompts {match[0]:+.3f} (95% [{match[1]:+.3f}, "
            f"{match[2]:+.3f}]; close within +-{TABLE9_MATCH:g}; the prompts resolve "
            f"{resolvable(table9_ratios(per_prompt)):.3f} at 80% power)"
        )
    shares = {str(k): x for k, x in s["fig5_share_median"].items()}  # int keys, or str after JSON
    out["fig5"] = (
        f"top 10/30/50% hold {shares['10']:.1%}/{shares['30']:.1%}/{shares['50']:.1%} "
        f"here ({'on ' + model.split(' (')[0] + ', ' if model else ''}not the paper's 14B/32B models)"
    )
    overlaps = _overlaps(s)
    out["table11"] = f"overlap within {min(overlaps):.3f}-{max(overlaps):.3f} across the four ranges (means)"
    j = jac.get("qk-pair-norm (prefill), r=50%")
    if j is not None:  # two sets of one size overlap by 2J / (1 + J) of either when their Jaccard is J
        out["table11"] += (
            f"; the same run's per-(t, s) analogue, from Fig. 4's Jaccard of the prefill QK pair norm selection at "
            f"r = 50% (J = {j:.3f}): 2J / (1 + J) = {2 * j / (1 + j):.3f}; the paper's "
            f"{TABLE11_OVERLAP['pair-norm']:.2f} lies nearer "
            + (
                "this per-(t, s) analogue than the per-range overlap: the level follows the definition"
                if abs(2 * j / (1 + j) - TABLE11_OVERLAP["pair-norm"])
                < abs(statistics.fmean(s["table11_overlap_mean"]["pair-norm"].values()) - TABLE11_OVERLAP["pair-norm"])
                else "the per-range overlap than this per-(t, s) analogue"
            )
        )
    if not tested(per_prompt):
        out["table11"] += "; the result keeps no per-prompt values: neither chance nor the trend can be tested"
    else:
        parts = []
        for ref, t in table11_tests(per_prompt).items():
            level, lo, hi = t["above_chance"]
            slope, slo, shi = t["slope"]
            parts.append(
                f"{ref}: {level:+.3f} above the chance overlap {TABLE11_CHANCE:g} (95% [{lo:+.3f}, {hi:+.3f}]), "
                f"slope {slope:+.4f} per range (95% [{slo:+.4f}, {shi:+.4f}]; stable within "
                f"+-{TABLE11_SPREAD / 3:.3f}; the prompts resolve a slope of {t['slope resolves']:.4f} at 80% power)"
                + (
                    f", {t['above_random'][0]:+.3f} above a random selection of the same size measured by the same "
                    f"code on the same prompts (95% [{t['above_random'][1]:+.3f}, {t['above_random'][2]:+.3f}])"
                    if "above_random" in t
                    else ""
                )
            )
        out["table11"] += (
            f"; tested over {len(per_prompt)} prompts: " + "; ".join(parts) + "; the ranges split each prompt's "
            "generated tokens, not the paper's long generations"
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
    v = verdicts(s, result.get("model"), result.get("per_prompt"))
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
        f"\nPaper (quoted): {PAPER['fig4_prefill']}.\nHere (measured): {v['fig4_prefill']}.",
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
        f"\nPaper (quoted): {PAPER['table9_prefill']}.\nHere (measured): {v['table9_prefill']}.",
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
