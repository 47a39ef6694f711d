"""Whether each fidelity claim holds is decided from the numbers, and the sentences agree with it."""

import copy
import json
from pathlib import Path

from benchmarks.fidelity import analyses
from benchmarks.fidelity import claims as fidelity
from reference.equations.saliency import CRITERIA

RESULTS = Path(__file__).parents[1] / "results"


def summary_where_every_claim_holds() -> dict:
    """Fig. 4 in the claimed order, QK pair norm with the lowest KL, Table 11 stable."""
    jaccard = {
        f"{crit} ({scope}), r={r}": 0.9 - 0.1 * rank
        for rank, crit in enumerate(fidelity.ORDER)
        for scope in ("prefill", "full")
        for r in ("10%", "50%")
    }
    table9 = {"KIVI-style uniform 2-bit": {"mse": 0.1, "kl": 0.07}, "PolarQuant-style 2-bit": {"mse": 0.2, "kl": 0.3}}
    for rank, crit in enumerate(CRITERIA):
        for scope in ("prefill", "full"):
            table9[f"H3(50%)L1, {crit} ({scope})"] = {"mse": 0.05, "kl": 0.04 + 0.01 * rank}
    return {
        "fig5_share_median": {"10": 0.6, "30": 0.8, "50": 0.9},
        "fig4_jaccard_mean": jaccard,
        "fig4_aggregated_jaccard_mean": dict(jaccard),
        "fig4_pairs": {"per_layer_and_prompt": [1000], "exact": True, "max_pairs": analyses.FIG4_MAX_PAIRS},
        "table9_mean": table9,
        "table11_overlap_mean": {"pair-norm": {"0": 0.7, "1": 0.72}, "dot": {"0": 0.68, "1": 0.7}},
    }


def test_claims_hold_and_flip_when_the_numbers_do():
    summary = summary_where_every_claim_holds()
    assert fidelity.claim_holds(summary) == {"fig4": True, "table9": True, "table11": True, "fig5": None}
    broken = copy.deepcopy(summary)
    jac = broken["fig4_jaccard_mean"]
    jac["k-range (full), r=10%"] = jac["k-magnitude (full), r=10%"] + 0.01  # k-range now beats k-magnitude
    broken["table9_mean"]["H3(50%)L1, k-range (full)"]["kl"] = 0.0  # another criterion has the lowest KL
    broken["table11_overlap_mean"]["dot"]["0"] = 0.1  # a spread well over 0.1
    assert fidelity.claim_holds(broken) == {"fig4": False, "table9": False, "table11": False, "fig5": None}
    said = fidelity.verdicts(broken)
    assert "does not hold" in said["fig4"] and "not as the paper" in said["table9"] and "not stable" in said["table11"]


def test_a_fig4_under_the_aggregated_definition_is_not_judged():
    summary = summary_where_every_claim_holds()
    del summary["fig4_pairs"]  # results written before Fig. 4 followed the paper's per-(t, s) definition
    assert fidelity.claim_holds(summary)["fig4"] is None
    assert "not the paper's per-(t, s) definition" in fidelity.verdicts(summary)["fig4"]


def test_the_committed_full_result_follows_the_paper_definitions():
    full = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("fidelity-*.json"))]
    full = [r for r in full if "--smoke" not in r["command"]]
    assert full, "no committed full fidelity result"
    newest = max(full, key=lambda r: r["date_utc"])
    assert fidelity.fig4_per_pair(newest["summary"]) and newest["definitions"] == fidelity.DEFINITIONS
    holds = fidelity.claim_holds(newest["summary"])
    assert set(holds) == {"fig4", "table9", "table11", "fig5"} and holds["fig4"] in (True, False)


def test_the_fig5_sentence_names_the_model_measured():
    summary = summary_where_every_claim_holds()
    said = fidelity.verdicts(summary, "gemma-3-270m-q4_k_m (GGUF gemma-3-270m-q4_k_m.gguf; --model g.gguf)")["fig5"]
    assert "on gemma-3-270m-q4_k_m, not the paper's 14B/32B" in said and "135M" not in said
    assert "135M" not in fidelity.verdicts(summary)["fig5"]  # no model given: none named
