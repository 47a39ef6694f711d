"""Each fidelity analysis computes the definition it states, shown on small constructed examples
where the plausible readings of the paper give different numbers."""

import torch

from benchmarks.fidelity import analyses as fidelity
from reference import PNMixConfig


def pairs_vector(norms: list[list[float]]) -> torch.Tensor:
    """[T, 4] vectors whose adjacent pairs (0, 1), (2, 3) have the given norms: [[a, b], ...] -> (a, 0, b, 0)."""
    return torch.tensor([[a, 0.0, b, 0.0] for a, b in norms])


# One KV head; the prompt is token 0, tokens 1 and 2 are decoded. Key 0 is large on pair 0, the
# decode keys lean to pair 1, queries are even: per (t, s) pair 0 wins only where s = 0.
KEYS = pairs_vector([[10, 1], [1, 2], [1, 2]])[None]  # [H_kv = 1, T = 3, d = 4]
EVEN_QUERIES = pairs_vector([[1, 1]] * 3)[None]


def test_fig4_compares_with_the_top_pairs_of_each_query_key_pair():
    t, s, exact = fidelity.decode_pairs(1, 3)
    assert exact and list(zip(t.tolist(), s.tolist(), strict=True)) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    pair0 = torch.tensor([[[True, False]]])  # [C = 1, H_kv, P]
    per_pair = fidelity.per_pair_jaccard(EVEN_QUERIES, KEYS, t, s, pair0, 0.5, "adjacent")
    # (t, s) with s = 0 choose pair 0 (Jaccard 1), the other three pair 1 (Jaccard 0): 2 / 5.
    assert torch.allclose(per_pair, torch.tensor([[0.4]]))
    # The aggregated reading sums the products first: pair 0 holds 23 of 31, so it says 1.0.
    aggregated = fidelity.top(fidelity.decode_importance(EVEN_QUERIES, KEYS, 1, "adjacent"), 0.5)
    assert fidelity.jaccard(pair0[0], aggregated).item() == 1.0


def test_fig4_gives_each_query_head_of_a_group_its_own_ground_truth():
    queries = torch.cat([EVEN_QUERIES, pairs_vector([[1, 100]] * 3)[None]])  # head 1 always prefers pair 1
    t, s, _ = fidelity.decode_pairs(1, 3)
    pair0 = torch.tensor([[[True, False]]])
    per_head = fidelity.per_pair_jaccard(queries, KEYS, t, s, pair0, 0.5, "adjacent")
    assert torch.allclose(per_head, torch.tensor([[0.4, 0.0]]))


def test_fig4_samples_a_stated_number_of_pairs_past_the_limit():
    t, s, exact = fidelity.decode_pairs(100, 1000, max_pairs=500, seed=3)
    assert not exact and len(t) == len(s) == 500
    assert bool(((t >= 100) & (t < 1000) & (s >= 0) & (s <= t)).all())
    again = fidelity.decode_pairs(100, 1000, max_pairs=500, seed=3)
    assert torch.equal(t, again[0]) and torch.equal(s, again[1])


def test_fig5_shares_count_decode_queries_and_the_keys_they_see():
    # Key 2 is huge on pair 1 but only query 2 sees it; the prompt query (t = 0) is not a decode query.
    keys = pairs_vector([[3, 1], [3, 1], [0, 40]])[None]
    queries = pairs_vector([[0, 1000], [1, 1], [1, 1]])[None]
    importance = fidelity.decode_importance(queries, keys, 1, "adjacent")
    # t = 1: keys 0, 1 -> (6, 2); t = 2: keys 0..2 -> (6, 42).
    assert importance.tolist() == [[12.0, 44.0]]
    shares = [0.9, 0.2, 0.1]
    per_prompt = [{**_empty_result(), "share": {10: shares, 30: shares, 50: shares}}]
    assert fidelity.summarize(per_prompt)["fig5_share_median"][10] == 0.2  # the median, not the mean (0.4)


def test_table9_kl_is_exact_against_quantized_over_decode_queries():
    queries = pairs_vector([[5, 0], [1, 1], [1, 1]])[None]
    exact = pairs_vector([[2, 0], [0, 2], [1, 1]])[None]
    rough = pairs_vector([[1, 0], [0, 2], [1, 1]])[None]
    got = fidelity.attention_kl(queries, exact, rough, start=1)
    scale = 4**-0.5
    kls = []
    for t in (1, 2):
        p = torch.softmax((exact[0, : t + 1] @ queries[0, t]) * scale, 0)
        p_hat = torch.softmax((rough[0, : t + 1] @ queries[0, t]) * scale, 0)
        kls.append(float((p * (p / p_hat).log()).sum()))
        reverse = float((p_hat * (p_hat / p).log()).sum())
        assert abs(reverse - kls[-1]) > 1e-4  # the two directions differ here
    assert abs(got - sum(kls) / 2) < 1e-6


def test_table11_counts_only_decode_generated_keys():
    # The prompt's keys make pair 0 salient at prefill; the decode keys favour pair 1, so the
    # overlap is 0, where it would be 1 if prompt keys counted.
    prompt_len, length = 8, 16
    keys = pairs_vector([[50, 1]] * prompt_len + [[1, 3]] * (length - prompt_len))[None]
    queries = pairs_vector([[1, 1]] * length)[None]
    pages = {"group_size": 8, "residual_length": 8, "n_sink": 0}
    result = fidelity.analyse_prompt([(queries, keys)], prompt_len, pages, layout="adjacent")
    overlaps = [v for values in result["stability"]["pair-norm"].values() for v in values]
    assert overlaps and all(v == 0.0 for v in overlaps)
    with_prompt_keys = fidelity.decode_importance(queries, keys, prompt_len, "adjacent", key_from=0)
    assert fidelity.top(with_prompt_keys, 0.5).tolist() == [[True, False]]


def test_end_to_end_counts_tokens_computed_with_quantized_pages_and_warns():
    config = PNMixConfig()  # 32 sinks, pages of 128: the first flush comes at 160 tokens
    reads = fidelity.quantized_reads(config, prompt_len=50, new_tokens=200)
    # Token j >= 1 attends over 50 + j keys; quantized pages exist from 160 keys on: j = 110 .. 199.
    assert reads["tokens_with_quantized_pages"] == 90 and reads["tokens"] == 200
    lengths = range(51, 250)
    assert abs(reads["quantized_key_share"] - sum(128 for n in lengths if n >= 160) / sum(lengths)) < 1e-12
    e2e = {"methods": {"PN-Mix": {"quantized_reads": [reads], "nll_reads": None}}}
    (warning,) = fidelity.quantization_warnings(e2e)
    assert warning.startswith("PN-Mix: only 90 of 200 greedy tokens were computed with quantized pages")
    long = fidelity.quantized_reads(config, prompt_len=200, new_tokens=200)
    assert fidelity.quantization_warnings({"methods": {"PN-Mix": {"quantized_reads": [long]}}}) == []


def _empty_result() -> dict:
    return {
        "jaccard": {},
        "jaccard_aggregated": {},
        "fig4_pairs": [],
        "table9": {},
        "stability": {"pair-norm": {}, "dot": {}},
    }
