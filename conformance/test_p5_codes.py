"""Property 5: codes and scales of the quantized region are the reference's (ties may differ
by one code); every element reconstructs within half a step plus storage rounding; constant
groups reconstruct exactly."""

import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import bits_of, final_state, fitted
from reference import PNMixConfig, token_layout
from reference.tolerances import TIE_RELATIVE, reconstruction_bound

CFG = PNMixConfig(group_size=8, residual_length=8, n_sink=1)


def assert_codes_match(got, ref, x, group_size, dim, what):
    """Scales and zeros bit-equal; codes equal except +-1 on reference rounding ties."""
    assert torch.equal(bits_of(got.scale.cpu()), bits_of(ref.scale)), f"{what} scales differ from the reference"
    assert torch.equal(bits_of(got.zero.cpu()), bits_of(ref.zero)), f"{what} zeros differ from the reference"
    diff = got.codes.cpu().int() - ref.codes.int()
    if bool((diff != 0).any()):
        s = ref.scale.double().repeat_interleave(group_size, dim)
        z = ref.zero.double().repeat_interleave(group_size, dim)
        v = torch.where(s == 0, 0.0, (x.double() - z) / torch.where(s == 0, 1.0, s)) + 0.5
        tie = (v - v.round()).abs() <= TIE_RELATIVE * v.abs().clamp(min=1)
        assert bool((diff.abs() <= 1).all()) and bool(tie[diff != 0].all()), f"{what} codes differ off a tie"


@given(case=cs.cases(kinds=cs.KINDS))
@example(case=cs.Case(CFG, 2, 2, 2, 16, torch.float16, 40, (8, 9), 1, "near_constant"))
@example(case=cs.Case(CFG, 1, 1, 1, 8, torch.float16, 33, (), 2, "constant"))
@example(case=cs.Case(CFG, 1, 3, 1, 20, torch.float32, 17, (16,), 3, "extremes"))
@example(case=cs.Case(CFG, 1, 1, 4, 8, torch.float16, 25, (), 4, "subnormal"))
def test_codes_scales_and_reconstruction(impl, device, case):
    case = fitted(impl, case, device)
    cfg = case.config
    state = final_state(impl, case, device)
    n_sink, n_q, _ = token_layout(cfg, state.length)
    region = slice(n_sink, n_sink + n_q)
    x = state.all_k[..., region, :]
    got, ref = state.cache.key_codes(), state.ref.key_codes()
    assert tuple(got.codes.shape) == tuple(ref.codes.shape), "key code shape"
    assert_codes_match(got, ref, x, cfg.group_size, -2, "key")
    if cfg.values_quantized:
        assert_codes_match(state.cache.value_codes(), state.ref.value_codes(), state.all_v[..., region, :],
                           cfg.value_group(case.head_dim), -1, "value")  # fmt: skip
    else:
        assert state.cache.value_codes() is None
    if n_q == 0:
        return
    # Reconstruction bound per key group, from the implementation's own stored parameters.
    k_hat = state.cache.dequantize()[0].cpu()[..., region, :].double()
    groups = x.double().unflatten(-2, (n_q // cfg.group_size, cfg.group_size))
    lo, hi = groups.amin(-2), groups.amax(-2)
    high = state.ref.page_channel_masks()  # [B, H_kv, pages, d]
    levels = torch.where(high, 2**cfg.b_high - 1, 2**cfg.b_low - 1).double()
    bound = reconstruction_bound(lo, hi, got.scale.cpu().double(), got.zero.cpu().double(), levels)
    err = (k_hat.unflatten(-2, groups.shape[-3:-1]) - groups).abs().amax(-2)
    assert bool((err <= bound).all()), f"key reconstruction error {float((err - bound).max()):.3g} above the bound"
    constant = lo == hi
    exact = (k_hat.unflatten(-2, groups.shape[-3:-1]) == groups).all(-2)
    representable = lo.to(cfg.scale_dtype).double() == lo
    assert bool(exact[constant & representable].all()), "a constant key group does not reconstruct exactly"
