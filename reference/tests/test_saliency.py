"""Eq. 6: golden value, brute-force GQA check, selection ties, layouts."""

import math

import pytest
import torch

from reference import channel_mask_from_pairs, pair_channels, pair_norms, pair_saliency, select_salient_pairs


def test_eq6_golden_gqa():
    # d = 4, adjacent pairs (0,1), (2,3); two query heads share one KV head.
    q = torch.tensor([[[[3.0, 4.0, 0.0, 0.0]], [[0.0, 0.0, 1.0, 0.0]]]])  # pair norms (5, 0) and (0, 1)
    k = torch.tensor([[[[1.0, 0.0, 0.0, 2.0]]]])  # pair norms (1, 2)
    sigma = pair_saliency(q, k, "adjacent")
    assert sigma.tolist() == [[[2.5, 1.0]]]  # ((5+0)/2 * 1, (0+1)/2 * 2)


def brute_force_saliency(q, k, layout):
    batch, n_heads, t, d = q.shape
    n_kv = k.shape[1]
    first, second = pair_channels(d, layout)
    out = torch.zeros(batch, n_kv, d // 2, dtype=torch.float64)
    for b in range(batch):
        for h in range(n_kv):
            members = [hq for hq in range(n_heads) if hq // (n_heads // n_kv) == h]
            for i in range(d // 2):
                a, c = int(first[i]), int(second[i])
                k_mean = sum(math.hypot(k[b, h, s, a], k[b, h, s, c]) for s in range(t)) / t
                q_mean = sum(
                    sum(math.hypot(q[b, hq, s, a], q[b, hq, s, c]) for s in range(t)) / t for hq in members
                ) / len(members)
                out[b, h, i] = q_mean * k_mean
    return out


@pytest.mark.parametrize("layout", ["adjacent", "split"])
@pytest.mark.parametrize(("n_heads", "n_kv"), [(4, 4), (6, 2), (8, 1)])
def test_gqa_saliency_matches_brute_force(layout, n_heads, n_kv):
    torch.manual_seed(n_heads * 10 + n_kv)
    q = torch.randn(2, n_heads, 5, 8, dtype=torch.float64)
    k = torch.randn(2, n_kv, 5, 8, dtype=torch.float64)
    expected = brute_force_saliency(q, k, layout)
    torch.testing.assert_close(pair_saliency(q, k, layout).double(), expected, rtol=1e-5, atol=1e-6)


def test_query_heads_map_to_kv_heads_in_repeat_kv_order():
    # Only query heads 2 and 3 (which read KV head 1 when n_rep = 2) carry energy in pair 0.
    q = torch.zeros(1, 4, 1, 4)
    q[0, 2:, 0, 0] = 1.0
    q[0, :, 0, 2] = 0.1
    k = torch.ones(1, 2, 1, 4)
    sigma = pair_saliency(q, k, "adjacent")
    assert sigma[0, 1, 0] > sigma[0, 1, 1] and sigma[0, 0, 0] < sigma[0, 0, 1]


def test_selection_takes_the_top_and_breaks_ties_towards_lower_index():
    sigma = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.5]])
    assert select_salient_pairs(sigma, 3).tolist() == [[False, True, True, True, False, False]]
    assert select_salient_pairs(torch.ones(1, 6), 2).tolist() == [[True, True, False, False, False, False]]
    assert not select_salient_pairs(sigma, 0).any()


def test_channel_mask_expansion_per_layout():
    pm = torch.tensor([True, False, False, True])
    assert channel_mask_from_pairs(pm, "adjacent").tolist() == [1, 1, 0, 0, 0, 0, 1, 1]
    assert channel_mask_from_pairs(pm, "split").tolist() == [1, 0, 0, 1, 1, 0, 0, 1]


def test_split_layout_never_pairs_adjacent_channels():
    x = torch.zeros(1, 4)
    x[0, 0], x[0, 1] = 3.0, 4.0  # adjacent channels 0, 1: different pairs under "split"
    assert pair_norms(x, "adjacent").tolist() == [[5.0, 0.0]]
    assert pair_norms(x, "split").tolist() == [[3.0, 4.0]]


def adjacent_to_split(d):
    """perm with x_split = x_adj[..., perm]: split pair i = (i, i + d/2) holds adjacent pair (2i, 2i+1)."""
    first, second = pair_channels(d, "adjacent")
    return torch.cat([first, second])


def test_layouts_agree_under_channel_permutation():
    torch.manual_seed(3)
    q, k = torch.randn(1, 4, 6, 16), torch.randn(1, 2, 6, 16)
    perm = adjacent_to_split(16)
    sig_adj = pair_saliency(q, k, "adjacent")
    sig_split = pair_saliency(q[..., perm], k[..., perm], "split")
    assert torch.equal(sig_adj, sig_split)
    mask_adj = channel_mask_from_pairs(select_salient_pairs(sig_adj, 3), "adjacent")
    mask_split = channel_mask_from_pairs(select_salient_pairs(sig_split, 3), "split")
    assert torch.equal(mask_adj[..., perm], mask_split)


def test_ablation_criteria_golden():
    from reference.equations.saliency import criterion_scores

    # d = 4 adjacent pairs (0,1), (2,3); two tokens of one KV head.
    k = torch.tensor([[[[3.0, 4.0, 1.0, 0.0], [-3.0, 0.0, 2.0, 0.0]]]])
    q = torch.ones(1, 1, 2, 4)
    assert criterion_scores("k-pair-norm", q, k, "adjacent").tolist() == [[[4.0, 1.5]]]  # (5+3)/2, (1+2)/2
    assert criterion_scores("k-magnitude", q, k, "adjacent").tolist() == [[[5.0, 1.5]]]  # 3+2, 1.5+0
    assert criterion_scores("k-range", q, k, "adjacent").tolist() == [[[10.0, 1.0]]]  # 6+4, 1+0
    assert torch.equal(criterion_scores("qk-pair-norm", q, k, "adjacent"), pair_saliency(q, k, "adjacent"))
    with pytest.raises(ValueError, match="criterion must be one of"):
        criterion_scores("v-norm", q, k, "adjacent")


def test_cache_selects_by_the_configured_criterion():
    from reference import PNMixConfig, ReferenceCache

    # Pair 0 has the largest key range, pair 1 the largest keys, pair 2 the largest queries.
    k = torch.zeros(1, 1, 8, 6)
    k[0, 0, :, 0] = torch.tensor([-1.0, 1.0] * 4)
    k[..., :, 2] = 3.0
    q = torch.full((1, 1, 8, 6), 0.1)
    q[..., 4] = 100.0
    k[..., 4] = 0.5
    picks = {}
    for criterion in ("k-range", "k-magnitude", "qk-pair-norm"):
        cfg = PNMixConfig(ratio=1 / 3, pair_layout="adjacent", criterion=criterion, n_sink=8, value_bits=16)
        picks[criterion] = ReferenceCache.from_prefill(q, k, k, cfg).pair_mask[0, 0].nonzero().flatten().tolist()
    assert picks == {"k-range": [0], "k-magnitude": [1], "qk-pair-norm": [2]}
