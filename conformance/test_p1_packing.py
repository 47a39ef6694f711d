"""Property 1: pack/unpack roundtrips bit for bit and packs the reference's bytes.

Caches from different implementations are interchangeable only if the bytes agree.
"""

import dataclasses

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import reference
from conformance import strategies as cs
from conformance.harness import fitted
from reference import channel_mask_from_pairs

CASE = cs.Case(reference.PNMixConfig(), 2, 3, 1, 24, torch.float16, 16, (), 0)


def random_pair_mask(case, gen):
    """A pair mask with the same count per row, as PN-Mix selects (any count, any pairs)."""
    n_pairs = case.head_dim // 2
    count = int(torch.randint(0, n_pairs + 1, (1,), generator=gen))
    scores = torch.rand(case.batch, case.kv_heads, n_pairs, generator=gen)
    return reference.select_salient_pairs(scores, count)


@given(case=cs.cases(), tokens=st.sampled_from([8, 16, 24, 64]))
@example(case=CASE, tokens=8)
@example(case=cs.Case(reference.PNMixConfig(b_high=8, b_low=3), 1, 1, 1, 20, torch.float16, 1, (), 5), tokens=24)
def test_key_codes_roundtrip_and_match_reference_bytes(impl, device, case, tokens):
    case = fitted(impl, case, device)
    cfg = case.config
    gen = torch.Generator().manual_seed(case.seed)
    pair_mask = random_pair_mask(case, gen)
    channel_mask = channel_mask_from_pairs(pair_mask, cfg.pair_layout)
    limit = torch.where(channel_mask, 1 << cfg.b_high, 1 << cfg.b_low).unsqueeze(-2)
    codes = (torch.randint(0, 256, (case.batch, case.kv_heads, tokens, case.head_dim), generator=gen) % limit).to(
        torch.uint8
    )
    low, high = impl.pack_keys(codes.to(device), channel_mask.to(device), cfg)
    ref_low, ref_high = reference.pack_key_codes(codes, channel_mask, cfg.b_high, cfg.b_low)
    assert torch.equal(low.cpu(), ref_low), "key_low bytes differ from the reference layout"
    assert torch.equal(high.cpu(), ref_high), "key_high bytes differ from the reference layout"
    assert torch.equal(impl.unpack_keys(low, high, channel_mask.to(device), cfg).cpu(), codes)


@given(case=cs.cases(), tokens=st.integers(1, 40))
@example(case=CASE, tokens=1)
def test_value_codes_roundtrip_and_match_reference_bytes(impl, device, case, tokens):
    if not case.config.values_quantized:  # nothing to pack: draw the packed 2-bit format instead
        case = dataclasses.replace(case, config=dataclasses.replace(case.config, value_bits=2))
    case = fitted(impl, case, device)
    cfg = case.config
    if not cfg.values_quantized:
        pytest.skip(f"{impl.name} stores values unquantized: no value packing to check")
    gen = torch.Generator().manual_seed(case.seed)
    codes = torch.randint(0, 1 << cfg.value_bits, (case.batch, case.kv_heads, tokens, case.head_dim), generator=gen)
    codes = codes.to(torch.uint8)
    packed = impl.pack_values(codes.to(device), cfg)
    assert torch.equal(packed.cpu(), reference.pack_value_codes(codes, cfg.value_bits))
    assert torch.equal(impl.unpack_values(packed, cfg).cpu(), codes)


@given(n_pairs=st.integers(1, 40), rows=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
@example(n_pairs=1, rows=1, seed=0)
@example(n_pairs=8, rows=1, seed=1)
@example(n_pairs=9, rows=2, seed=2)
def test_pair_mask_roundtrip_and_match_reference_bytes(impl, device, n_pairs, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, 2, n_pairs, generator=gen) < 0.5
    packed = impl.pack_mask(mask.to(device))
    assert torch.equal(packed.cpu(), reference.pack_mask(mask))
    assert torch.equal(impl.unpack_mask(packed, n_pairs).cpu(), mask)
