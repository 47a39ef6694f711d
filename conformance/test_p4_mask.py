"""Property 4: the salient pairs are the reference's prefill selection (Eq. 6), chosen once,
stored once, and never changed by later tokens, even ones built to reorder the ranking.

The one tie rule of the suite: two selections may differ only between pairs whose scores tie
with the n-th largest within SALIENCY_RELATIVE (summation order); properties 2 and 5 then judge
an implementation on its own mask."""

import pytest
import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import fitted
from reference import PNMixConfig, channel_mask_from_pairs, select_salient_pairs
from reference.contract.tolerances import SALIENCY_RELATIVE
from reference.equations.saliency import criterion_scores

CFG = PNMixConfig(group_size=8, residual_length=8, n_sink=2, ratio=0.25)


PREFILL_SELECTION = pytest.mark.requires("prefill_selection", "a selection made once at prefill (Eq. 6)")


def assert_same_selection(got: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cfg: PNMixConfig) -> None:
    """got equals the reference selection, except between pairs whose scores tie within rounding."""
    sigma = criterion_scores(cfg.criterion, q.cpu(), k.cpu(), cfg.pair_layout).double()
    n = cfg.n_salient_pairs(q.shape[-1])
    expected = select_salient_pairs(sigma, n)
    assert int(got.sum()) == int(expected.sum()), f"{int(got.sum())} salient pairs, expected {int(expected.sum())}"
    differ = got != expected
    if differ.any():
        # The n-th largest score per row: any disagreement must sit on a tie with it.
        kth = torch.sort(sigma, -1, descending=True).values[..., max(n - 1, 0) : max(n, 1)]
        near = (sigma - kth).abs() <= SALIENCY_RELATIVE * kth.abs()
        assert bool(near[differ].all()), "the pair mask differs from the reference's prefill selection"


@PREFILL_SELECTION
@given(case=cs.cases(kinds=cs.KINDS))
@example(case=cs.Case(CFG, 2, 3, 3, 16, torch.float16, 9, (), 1))
@example(case=cs.Case(CFG, 1, 2, 8, 24, torch.bfloat16, 1, (), 2))
@example(case=cs.Case(CFG, 1, 2, 2, 16, torch.float16, 24, (), 3, "subnormal"))
@example(case=cs.Case(CFG, 2, 1, 1, 16, torch.float16, 16, (), 4, "extremes"))
def test_mask_is_the_reference_prefill_selection(impl, device, case):
    case = fitted(impl, case, device)
    q, k, v = cs.prefill_tensors(case, device)
    cache = impl.create(case.config)
    cache.prefill(q, k, v)
    assert tuple(cache.pair_mask.shape) == (case.batch, case.kv_heads, case.head_dim // 2)
    assert_same_selection(cache.pair_mask.cpu(), q, k, case.config)
    assert cache.saliency_computations == 1


@PREFILL_SELECTION
@given(case=cs.cases(kinds=cs.KINDS, max_appends=4))
@example(case=cs.Case(CFG, 1, 2, 2, 16, torch.float16, 20, (1, 8, 30), 3))
def test_mask_never_changes_after_prefill(impl, device, case):
    case = fitted(impl, case, device)
    q, k, v = cs.prefill_tensors(case, device)
    cache = impl.create(case.config)
    cache.prefill(q, k, v)
    mask = cache.pair_mask.clone()
    mask_bytes = cache.storage().mask
    # Adversarial decode keys: large on every pair prefill did not select, zero elsewhere, so
    # any recomputation of Eq. 6 over the cached keys would pick a different set.
    loud = ~channel_mask_from_pairs(mask.cpu(), case.config.pair_layout)
    for i in range(len(case.appends)):
        new_k, new_v = cs.append_tensors(case, i, device)
        new_k = torch.where(loud.unsqueeze(-2), 1000.0, 0.0).expand_as(new_k).to(new_k.dtype).to(device)
        cache.append(new_k, new_v)
        assert torch.equal(cache.pair_mask, mask), f"the mask changed at append {i}"
        assert cache.saliency_computations == 1, "Eq. 6 was evaluated again after prefill"
        assert cache.storage().mask == mask_bytes, "the mask's bytes grew with the cache"
