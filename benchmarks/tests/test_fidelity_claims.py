"""Whether each fidelity claim holds is decided from the numbers, and the sentences agree with it."""

import copy
import json
import random
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


def prompts_where_every_claim_holds(n: int = 8, seed: int = 0) -> list[dict]:
    """`n` prompts' own means: each of Fig. 4's links ahead by 0.1 give or take 0.02, each Table 11 overlap about
    0.72 (above the chance 0.5) and flat over the four ranges, give or take 0.01."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        jaccard = {
            f"{crit} ({scope}), r={r}": 0.9 - 0.1 * rank + rng.uniform(-0.02, 0.02)
            for rank, crit in enumerate(fidelity.ORDER)
            for scope in ("prefill", "full")
            for r in ("10%", "50%")
        }
        overlaps = {ref: {str(j): 0.72 + rng.uniform(-0.01, 0.01) for j in range(4)} for ref in ("pair-norm", "dot")}
        kl = 0.04 * (1 + rng.uniform(-0.02, 0.02))
        table9 = {name: {"mse": 0.05, "kl": kl * (1 + rng.uniform(-0.01, 0.01))} for name in fidelity.TABLE9_SCOPES}
        out.append({"fig4_jaccard_mean": jaccard, "table11_overlap_mean": overlaps, "table9_mean": table9})
    return out


def test_claims_hold_and_flip_when_the_numbers_do():
    summary, prompts = summary_where_every_claim_holds(), prompts_where_every_claim_holds()
    assert fidelity.claim_holds(summary, prompts) == {
        "fig4": True,
        "fig4_prefill": True,
        "table9": True,
        "table9_prefill": True,
        "table11": True,
        "fig5": None,
    }
    broken, flipped = copy.deepcopy(summary), copy.deepcopy(prompts)
    for p in flipped:  # k-range now beats k-magnitude on every prompt
        jac = p["fig4_jaccard_mean"]
        jac["k-range (full), r=10%"] = jac["k-magnitude (full), r=10%"] + 0.05
        for j in range(4):  # the dot reference's overlap falls by 0.1 a range
            p["table11_overlap_mean"]["dot"][str(j)] = 0.8 - 0.1 * j
        p["table9_mean"][fidelity.TABLE9_SCOPES[0]]["kl"] *= 1.5  # prefill-only selection 50% worse
    broken["table9_mean"]["H3(50%)L1, k-range (full)"]["kl"] = 0.0  # another criterion has the lowest KL
    assert fidelity.claim_holds(broken, flipped) == {
        "fig4": False,
        "fig4_prefill": False,
        "table9": False,
        "table9_prefill": False,
        "table11": False,
        "fig5": None,
    }
    said = fidelity.verdicts(broken, None, flipped)
    assert "k-magnitude > k-range: holds in 3, reversed in 1" in said["fig4"]
    assert "not as the paper" in said["table9"] and "slope -0.1000 per range" in said["table11"]


def test_two_criteria_that_differ_by_noise_are_tied():
    """K magnitude and K range drawn alike on every prompt: their link is tied, and the order undecided."""
    rng = random.Random(1)
    prompts = prompts_where_every_claim_holds()
    for p in prompts:
        jac = p["fig4_jaccard_mean"]
        for scope in ("prefill", "full"):
            for r in ("10%", "50%"):
                jac[f"k-range ({scope}), r={r}"] = jac[f"k-magnitude ({scope}), r={r}"] + rng.gauss(0, 0.02)
    holds = fidelity.claim_holds(summary_where_every_claim_holds(), prompts)
    links = fidelity.fig4_links(prompts)
    assert links["k-magnitude", "k-range"]["tied"] >= 3 and links["qk-pair-norm", "k-pair-norm"]["holds"] == 4
    assert holds["fig4"] == fidelity.UNDECIDED
    said = fidelity.verdicts(summary_where_every_claim_holds(), None, prompts)["fig4"]
    assert "k-magnitude > k-range: " in said and "(where tied, the prompts resolve 0.0" in said


def test_a_random_selection_does_not_pass_table11():
    """Overlaps of a random half of 32 pairs with a fixed top half (the chance overlap, 0.5 on average) do not
    pass: they are not above chance."""
    rng = random.Random(2)
    top = set(range(16))
    prompts = prompts_where_every_claim_holds()
    for p in prompts:
        for ref in p["table11_overlap_mean"]:
            for j in range(4):
                chosen = rng.sample(range(32), 16)
                p["table11_overlap_mean"][ref][str(j)] = len(top.intersection(chosen)) / 16
    assert fidelity.claim_holds(summary_where_every_claim_holds(), prompts)["table11"] is not True
    level = fidelity.table11_tests(prompts)["pair-norm"]["above_chance"]
    assert level[1] < 0 < level[2]  # its interval covers the chance overlap


def test_without_per_prompt_values_fig4_and_table11_are_undecided():
    holds = fidelity.claim_holds(summary_where_every_claim_holds())
    assert holds["fig4"] == holds["fig4_prefill"] == holds["table11"] == holds["table9_prefill"] == fidelity.UNDECIDED
    assert holds["table9"] is True
    said = fidelity.verdicts(summary_where_every_claim_holds())
    assert "keeps no per-prompt values" in said["fig4"] and "keeps no per-prompt values" in said["table11"]


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
    holds = fidelity.claim_holds(newest["summary"], newest.get("per_prompt"))
    assert set(holds) == {"fig4", "fig4_prefill", "table9", "table9_prefill", "table11", "fig5"}
    assert holds["fig4"] in (True, False, fidelity.UNDECIDED)


def test_the_fig5_sentence_names_the_model_measured():
    summary = summary_where_every_claim_holds()
    said = fidelity.verdicts(summary, "gemma-3-270m-q4_k_m (GGUF gemma-3-270m-q4_k_m.gguf; --model g.gguf)")["fig5"]
    assert "on gemma-3-270m-q4_k_m, not the paper's 14B/32B" in said and "135M" not in said
    assert "135M" not in fidelity.verdicts(summary)["fig5"]  # no model given: none named


def test_table11_sets_its_level_beside_the_per_pair_analogue_of_the_same_run():
    """Two equal-size sets with Jaccard J overlap by 2J / (1 + J): Fig. 4's per-(t, s) Jaccard of the prefill QK
    pair norm selection gives Table 11's per-(t, s) analogue, computed on the same run."""
    summary = summary_where_every_claim_holds()
    j = summary["fig4_jaccard_mean"]["qk-pair-norm (prefill), r=50%"]
    said = fidelity.verdicts(summary)["table11"]
    assert f"2J / (1 + J) = {2 * j / (1 + j):.3f}" in said
    assert "lies nearer the per-range overlap" in said  # 0.9 -> 0.947, the per-range overlap 0.70 nearer 0.72


def _traces(seed: int, prompt_len: int = 32, length: int = 96, heads: int = 2, d: int = 64):
    """Post-RoPE-like queries and keys whose pairs keep each head's own scale over the whole sequence (so the
    pairs salient at prefill stay salient while decoding), noise on top; split-half pairs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(heads, 1, d // 2, generator=g)).repeat(1, 1, 2)
    k = scale * (1 + 0.3 * torch.randn(heads, length, d, generator=g))
    q = scale * (1 + 0.3 * torch.randn(heads, length, d, generator=g))
    return q, k, prompt_len


def _mean_overlaps(by_ref: dict) -> dict:
    return {ref: {str(j): sum(v) / len(v) for j, v in by_range.items()} for ref, by_range in by_ref.items()}


def _table11_prompts(batch: int) -> tuple[list[dict], list[dict]]:
    """8 seeded prompts' means as a result keeps them, Table 11's by the tool's own code (`analyses.stability`):
    (PN-Mix's prefill selection with the random control beside it, the control alone in its place)."""
    from reference import PNMixConfig
    from reference.equations.saliency import prefill_pair_mask

    chosen, random_prompts = prompts_where_every_claim_holds(), prompts_where_every_claim_holds()
    for i, (mine, theirs) in enumerate(zip(chosen, random_prompts, strict=True)):
        q, k, n = _traces(100 * batch + i)
        selection = prefill_pair_mask(q[None, :, :n], k[None, :, :n], PNMixConfig())[0]
        control = analyses.random_selection(selection, seed=i)
        assert control.sum(-1).tolist() == selection.sum(-1).tolist() and not torch_equal(control, selection)
        mine["table11_overlap_mean"] = _mean_overlaps(analyses.stability(q, k, n, selection, "split"))
        mine["table11_random_overlap_mean"] = _mean_overlaps(analyses.stability(q, k, n, control, "split"))
        theirs["table11_overlap_mean"] = mine["table11_random_overlap_mean"]
    return chosen, random_prompts


def test_a_random_selection_measured_by_table11s_own_code_is_at_chance_and_fails_the_claim():
    """The control of the same size (`analyses.random_selection`) through the same overlap code as PN-Mix's
    prefill selection: the prefill selection of pairs that stay salient passes Table 11, above chance and above
    the control; the control in its place passes in at most 3 of 20 batches of 8 prompts (the rule passes chance
    with a one-sided 2.5%: 0.5 passes expected, 4 or more with probability 0.0016), its overlap the chance one."""
    chosen, _ = _table11_prompts(0)
    assert fidelity.claim_holds(summary_where_every_claim_holds(), chosen)["table11"] is True
    tests = fidelity.table11_tests(chosen)["pair-norm"]
    assert tests["above_random"][1] > 0.2 and tests["above_chance"][1] > 0.2
    said = fidelity.verdicts(summary_where_every_claim_holds(), None, chosen)["table11"]
    assert "above a random selection of the same size measured by the same code" in said
    passed, levels = 0, []
    for batch in range(20):
        _, random_prompts = _table11_prompts(batch)
        passed += fidelity.claim_holds(summary_where_every_claim_holds(), random_prompts)["table11"] is True
        levels.append(fidelity.table11_tests(random_prompts)["pair-norm"]["above_chance"][0])
    assert passed <= 3 and abs(sum(levels) / len(levels)) < 0.02


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_table9s_prefill_match_says_what_its_prompts_resolve():
    """The match's evidence gives its interval and the difference its prompts resolve at 80% power (their spread),
    so that an interval straddling the margin says how far the sample could see."""
    prompts = prompts_where_every_claim_holds()
    evidence = fidelity.verdicts(summary_where_every_claim_holds(), per_prompt=prompts)["table9_prefill"]
    resolves = fidelity.resolvable(fidelity.table9_ratios(prompts))
    assert 0 < resolves < fidelity.TABLE9_MATCH
    assert evidence.endswith(f"the prompts resolve {resolves:.3f} at 80% power)")
