"""Property 2: every 1-bit channel of every group reconstructs only to its bin midpoints
(3 min + max) / 4 or (min + 3 max) / 4 (Eq. 7), and each value goes to the nearer one; with
`reference_numerics`, a value exactly at the group's midpoint goes up (rule 4: ties round up).

Which channels are 1-bit is the implementation's own pair mask where it selects at prefill
(property 4 holds it to the reference's selection up to tied scores), else the reference's."""

import dataclasses

import pytest
import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import covers_claimed_combinations, drop, final_state, fitted
from reference import PNMixConfig, channel_mask_from_pairs, token_layout
from reference.contract.tolerances import float32_slack, spacing

ONE_BIT = PNMixConfig(b_high=3, b_low=1, group_size=8, residual_length=8, n_sink=3)


@pytest.mark.requires("midpoint_one_bit", "Eq. 7 midpoints for 1-bit groups")
@covers_claimed_combinations(cs.Case(ONE_BIT, 1, 2, 2, 16, torch.float16, 27, (6,), 50), low_bits=(1,), widths=("low",))
@given(case=cs.cases(kinds=cs.KINDS))
@example(case=cs.Case(ONE_BIT, 2, 2, 3, 16, torch.float16, 37, (5, 16), 11, "normal"))
@example(case=cs.Case(ONE_BIT, 1, 1, 1, 8, torch.float16, 19, (), 3, "constant"))
@example(case=cs.Case(ONE_BIT, 1, 3, 2, 12, torch.bfloat16, 33, (9,), 4, "extremes"))
@example(case=cs.Case(ONE_BIT, 1, 2, 1, 16, torch.float16, 35, (), 5, "half_steps"))
@example(
    case=cs.Case(
        dataclasses.replace(ONE_BIT, scale_dtype=torch.float32), 1, 2, 1, 8, torch.float32, 27, (), 6, "half_steps"
    )
)
@example(case=cs.Case(dataclasses.replace(ONE_BIT, b_high=1), 2, 1, 2, 8, torch.bfloat16, 24, (), 7, "normal"))
def test_one_bit_channels_reconstruct_to_the_nearer_bin_midpoint(impl, device, case):
    if not any(low == 1 for _, low in impl.capabilities.key_bits):
        pytest.skip(f"{impl.name} claims no 1-bit channels")
    case = dataclasses.replace(case, config=dataclasses.replace(case.config, b_low=1))
    case = fitted(impl, case, device)
    cfg = case.config
    if cfg.b_low != 1:
        drop(f"{impl.name} maps these configs to {cfg.b_low}-bit channels")
    state = final_state(impl, case, device)
    tokens = token_layout(cfg, state.length)
    n_sink, n_q = tokens.n_sink, tokens.n_quantized
    if n_q == 0:
        return
    if impl.capabilities.prefill_selection:
        high = channel_mask_from_pairs(state.cache.pair_mask.cpu(), cfg.pair_layout).unsqueeze(-2)
    else:
        high = state.ref.page_channel_masks()  # [B, H_kv, pages, d]: b_high channels of each page
    channels = ~high if cfg.b_high > 1 else torch.ones_like(high)
    x = state.all_k[..., n_sink : n_sink + n_q, :].double()
    x_hat = state.cache.dequantize()[0].cpu()[..., n_sink : n_sink + n_q, :].double()
    groups = x.unflatten(-2, (n_q // cfg.group_size, cfg.group_size))
    lo, hi = groups.amin(-2, keepdim=True), groups.amax(-2, keepdim=True)
    low_level, high_level = (3 * lo + hi) / 4, (lo + 3 * hi) / 4
    got = x_hat.unflatten(-2, groups.shape[-3:-1])
    # The stored scale and zero are rounded to scale_dtype: levels move by at most that rounding.
    zero, scale = lo + (hi - lo) / 4, (hi - lo) / 2
    tol = spacing(zero, cfg.scale_dtype) + spacing(scale, cfg.scale_dtype) + float32_slack(lo, hi)
    near_low = (got - low_level).abs() <= tol
    near_high = (got - high_level).abs() <= tol
    sel = channels.unsqueeze(-2).expand_as(got)
    assert bool((near_low | near_high)[sel].all()), "a 1-bit value reconstructs to neither bin midpoint"
    # Nearer level: only values farther than the tolerance from the midpoint between levels count.
    mid = (lo + hi) / 2
    clearly_low = sel & (groups < mid - tol)
    clearly_high = sel & (groups > mid + tol)
    assert bool(near_low[clearly_low].all()), "a value below the group midpoint went to the upper level"
    assert bool(near_high[clearly_high].all()), "a value above the group midpoint went to the lower level"
    if impl.capabilities.reference_numerics:
        exact = (zero.to(cfg.scale_dtype).double() == zero) & (scale.to(cfg.scale_dtype).double() == scale)
        tie = sel & exact & (groups == mid) & (hi > lo)
        assert bool(near_high[tie].all()), "a value exactly at the group midpoint went to the lower level (rule 4)"
