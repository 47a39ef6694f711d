"""Property 1: packing round-trips bit for bit in the implementation's own format; with the
opt-in claim `reference_layout`, the bytes are also the reference's (caches of different
implementations are then interchangeable byte for byte)."""

import dataclasses

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import reference
from conformance import strategies as cs
from conformance.harness import covers_claimed_combinations, drop, fitted
from reference import channel_mask_from_pairs

CASE = cs.Case(reference.PNMixConfig(), 2, 3, 1, 24, torch.float16, 16, (), 0)
#: The shapes every claimed combination of bits is packed at (`strategies.claimed_combinations`).
COMBINATIONS = cs.Case(reference.PNMixConfig(group_size=8, residual_length=8), 1, 2, 1, 16, torch.float16, 8, (), 40)
TOKENS = st.sampled_from([8, 16, 24, 64])
REFERENCE_LAYOUT = pytest.mark.requires("reference_layout", "the reference's byte layout (reference.equations.packing)")
PREFILL_SELECTION = pytest.mark.requires("prefill_selection", "a pair mask chosen at prefill (Eq. 6)")


def random_pair_mask(case, gen):
    """A pair mask with the same count per row, as PN-Mix selects (any count, any pairs)."""
    n_pairs = case.head_dim // 2
    count = int(torch.randint(0, n_pairs + 1, (1,), generator=gen))
    scores = torch.rand(case.batch, case.kv_heads, n_pairs, generator=gen)
    return reference.select_salient_pairs(scores, count)


def key_codes(impl, device, case, tokens):
    """(fitted case, channel mask, random key codes [B, H_kv, T, d]); T fills whole packing words."""
    case = fitted(impl, case, device)
    word = impl.capabilities.pack_word_bits
    tokens = -(-tokens // word) * word if word > 8 else tokens
    gen = torch.Generator().manual_seed(case.seed)
    channel_mask = channel_mask_from_pairs(random_pair_mask(case, gen), case.config.pair_layout)
    limit = torch.where(channel_mask, 1 << case.config.b_high, 1 << case.config.b_low).unsqueeze(-2)
    shape = (case.batch, case.kv_heads, tokens, case.head_dim)
    return case, channel_mask, (torch.randint(0, 256, shape, generator=gen) % limit).to(torch.uint8)


def value_codes(impl, device, case, tokens):
    """(fitted case with quantized values, random value codes [B, H_kv, T, d])."""
    if impl.capabilities.value_bits <= {16}:
        pytest.skip(f"{impl.name} stores values unquantized: no value packing to check")
    if not case.config.values_quantized:  # nothing to pack: draw the packed 2-bit format instead
        case = dataclasses.replace(case, config=dataclasses.replace(case.config, value_bits=2))
    case = fitted(impl, case, device)
    cfg = case.config
    if not cfg.values_quantized:
        drop(f"{impl.name} stores the values of these configs unquantized")
    word = impl.capabilities.pack_word_bits
    if case.head_dim * cfg.value_bits % word:
        drop(f"head_dim {case.head_dim} at {cfg.value_bits} bits does not fill {word}-bit words")
    gen = torch.Generator().manual_seed(case.seed)
    shape = (case.batch, case.kv_heads, tokens, case.head_dim)
    return case, torch.randint(0, 1 << cfg.value_bits, shape, generator=gen).to(torch.uint8)


@covers_claimed_combinations(COMBINATIONS, {"tokens": 24})
@given(case=cs.cases(), tokens=TOKENS)
@example(case=CASE, tokens=8)
@example(case=cs.Case(reference.PNMixConfig(b_high=8, b_low=3), 1, 1, 1, 20, torch.float16, 1, (), 5), tokens=24)
@example(case=cs.Case(reference.PNMixConfig(b_high=1, b_low=1), 1, 2, 1, 16, torch.float16, 1, (), 6), tokens=16)
def test_key_codes_roundtrip(impl, device, case, tokens):
    case, channel_mask, codes = key_codes(impl, device, case, tokens)
    low, high = impl.pack_keys(codes.to(device), channel_mask.to(device), case.config)
    back = impl.unpack_keys(low, high, channel_mask.to(device), case.config)
    assert torch.equal(back.cpu(), codes), "unpack_keys(pack_keys(codes)) differs from the codes"


@REFERENCE_LAYOUT
@given(case=cs.cases(), tokens=TOKENS)
@example(case=CASE, tokens=8)
@example(case=cs.Case(reference.PNMixConfig(b_high=8, b_low=3), 1, 1, 1, 20, torch.float16, 1, (), 5), tokens=24)
def test_key_bytes_are_the_reference_layout(impl, device, case, tokens):
    case, channel_mask, codes = key_codes(impl, device, case, tokens)
    low, high = impl.pack_keys(codes.to(device), channel_mask.to(device), case.config)
    ref_low, ref_high = reference.pack_key_codes(codes, channel_mask, case.config.b_high, case.config.b_low)
    assert torch.equal(low.cpu(), ref_low), "key_low bytes differ from the reference layout"
    assert torch.equal(high.cpu(), ref_high), "key_high bytes differ from the reference layout"


@covers_claimed_combinations(COMBINATIONS, {"tokens": 5})
@given(case=cs.cases(), tokens=st.integers(1, 40))
@example(case=CASE, tokens=1)
def test_value_codes_roundtrip(impl, device, case, tokens):
    case, codes = value_codes(impl, device, case, tokens)
    back = impl.unpack_values(impl.pack_values(codes.to(device), case.config), case.config)
    assert torch.equal(back.cpu(), codes), "unpack_values(pack_values(codes)) differs from the codes"


@REFERENCE_LAYOUT
@given(case=cs.cases(), tokens=st.integers(1, 40))
@example(case=CASE, tokens=1)
def test_value_bytes_are_the_reference_layout(impl, device, case, tokens):
    case, codes = value_codes(impl, device, case, tokens)
    packed = impl.pack_values(codes.to(device), case.config)
    assert torch.equal(packed.cpu(), reference.pack_value_codes(codes, case.config.value_bits)), (
        "value bytes differ from the reference layout"
    )


@PREFILL_SELECTION
@given(n_pairs=st.integers(1, 40), rows=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
@example(n_pairs=1, rows=1, seed=0)
@example(n_pairs=8, rows=1, seed=1)
@example(n_pairs=9, rows=2, seed=2)
def test_pair_mask_roundtrips(impl, device, n_pairs, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, 2, n_pairs, generator=gen) < 0.5
    packed = impl.pack_mask(mask.to(device))
    assert torch.equal(impl.unpack_mask(packed, n_pairs).cpu(), mask), "unpack_mask(pack_mask(mask)) differs"
    if impl.capabilities.reference_layout:
        assert torch.equal(packed.cpu(), reference.pack_mask(mask)), "pair mask bytes differ from the reference layout"
