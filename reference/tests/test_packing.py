"""Packing (PAPER.md section 4): golden bytes, numpy.packbits as an independent oracle, roundtrips."""

import numpy as np
import pytest
import torch

from reference import (
    bit_planes,
    block_positions,
    pack_fields,
    pack_key_codes,
    pack_mask,
    pack_value_codes,
    unpack_fields,
    unpack_key_codes,
    unpack_mask,
    unpack_value_codes,
)


def u8(values):
    return torch.tensor(values, dtype=torch.uint8)


def test_golden_bytes_from_the_module_docstring():
    assert pack_fields(u8([1, 0, 1, 1, 0, 0, 0, 1]), 1, dim=0).tolist() == [0x8D]
    assert pack_fields(u8([3, 0, 1, 2]), 2, dim=0).tolist() == [0x93]
    assert pack_fields(u8([0xA, 0x5]), 4, dim=0).tolist() == [0x5A]
    assert pack_fields(u8([7, 200]), 8, dim=0).tolist() == [7, 200]
    assert pack_fields(u8([0, 1, 2, 3, 4, 5, 6, 7]), 3, dim=0).tolist() == [0xE4, 0xE4, 0xF0]


@pytest.mark.parametrize("bits", range(1, 9))
def test_every_width_costs_exactly_its_bits_and_each_plane_is_numpy_packbits(bits):
    # Independent oracle: bit j of every code, packed 8 to a byte by numpy, is what the planes hold
    # once each plane's fields are split into their single bits.
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (3, 16, 5), generator=gen, dtype=torch.uint8)
    packed = pack_fields(codes, bits, dim=1)
    assert packed.shape == (3, 16 * bits // 8, 5)
    block = block_positions(bits)
    rebuilt = torch.zeros_like(codes, dtype=torch.int32)
    first = 0
    for low, width in zip(np.cumsum((0, *bit_planes(bits)))[:-1], bit_planes(bits), strict=True):
        n = block * width // 8
        plane = packed.unflatten(1, (-1, block * bits // 8))[:, :, first : first + n].flatten(1, 2)
        first += n
        for j in range(width):  # the j-th bit of each w-bit field of this plane
            fields = np.unpackbits(plane.numpy(), axis=1, bitorder="little").reshape(3, -1, width, 5)[:, :, j]
            rebuilt |= torch.from_numpy(fields.astype(np.int32)) << int(low + j)
    assert torch.equal(rebuilt.to(torch.uint8), codes)


def test_one_bit_packing_equals_numpy_packbits_little():
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2, (3, 40, 5), generator=gen, dtype=torch.uint8)
    expected = np.packbits(bits.numpy(), axis=1, bitorder="little")
    assert torch.equal(pack_fields(bits, 1, dim=1), torch.from_numpy(expected))


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unpack_inverts_pack(bits, dim):
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (8, 16, 24), generator=gen, dtype=torch.uint8)
    packed = pack_fields(codes, bits, dim)
    assert packed.shape[dim] == codes.shape[dim] * bits // 8
    assert torch.equal(unpack_fields(packed, bits, dim), codes)


def test_one_plane_layouts_are_plain_packing_and_blocks_append():
    # A prefix of whole blocks packs to a prefix of the bytes: appended pages never move earlier ones.
    gen = torch.Generator().manual_seed(1)
    for bits in range(1, 9):
        codes = torch.randint(0, 1 << bits, (32,), generator=gen, dtype=torch.uint8)
        block = block_positions(bits)
        assert torch.equal(pack_fields(codes[:block], bits, 0), pack_fields(codes, bits, 0)[: block * bits // 8])
    assert [block_positions(b) for b in range(1, 9)] == [8, 4, 8, 2, 8, 4, 8, 1]


def test_pack_rejects_codes_wider_than_the_field_and_ragged_lengths():
    with pytest.raises(ValueError, match="fit in 2 bits"):
        pack_fields(u8([4, 0, 0, 0]), 2, dim=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_fields(u8([1, 0, 1]), 1, dim=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_fields(u8([1, 0, 1, 2]), 3, dim=0)  # a 1-bit plane needs 8 codes to fill a byte


def test_key_planes_golden_h3l1():
    # 8 tokens, d = 4, salient channels 1 and 2 (3-bit codes), channels 0 and 3 are 1-bit.
    codes = torch.zeros(1, 1, 8, 4, dtype=torch.uint8)
    codes[0, 0, :, 0] = u8([1, 0, 1, 1, 0, 0, 0, 1])  # LSBs -> 0x8D
    codes[0, 0, :, 1] = u8([7, 6, 5, 4, 3, 2, 1, 0])  # LSBs 1,0,1,0,1,0,1,0 -> 0x55; highs 3,3,2,2,1,1,0,0
    codes[0, 0, :, 2] = u8([0, 2, 4, 6, 1, 3, 5, 7])  # LSBs 0,0,0,0,1,1,1,1 -> 0xF0; highs 0,1,2,3,0,1,2,3
    codes[0, 0, :, 3] = u8([0] * 8)
    mask = torch.tensor([[[False, True, True, False]]])
    low, high = pack_key_codes(codes, mask, b_high=3, b_low=1)
    assert low.tolist() == [[[[0x8D, 0x55, 0xF0, 0x00]]]]
    # high plane, 4 tokens per byte: channel 1 [3,3,2,2] -> 0xAF, [1,1,0,0] -> 0x05;
    # channel 2 [0,1,2,3] -> 0xE4 twice.
    assert high.tolist() == [[[[0xAF, 0xE4], [0x05, 0xE4]]]]
    assert torch.equal(unpack_key_codes(low, high, mask, 3, 1), codes)


@pytest.mark.parametrize(("b_high", "b_low"), [(3, 1), (4, 2), (4, 1), (2, 1), (3, 3), (8, 4), (8, 1)])
def test_key_roundtrip_every_config(b_high, b_low):
    gen = torch.Generator().manual_seed(b_high * 10 + b_low)
    mask = torch.zeros(2, 3, 16, dtype=torch.bool)
    for row in mask.view(-1, 16):
        row[torch.randperm(16, generator=gen)[:6]] = True
    limit = torch.where(mask, 1 << b_high, 1 << b_low).unsqueeze(-2)
    codes = (torch.randint(0, 256, (2, 3, 32, 16), generator=gen) % limit).to(torch.uint8)
    low, high = pack_key_codes(codes, mask, b_high, b_low)
    assert torch.equal(unpack_key_codes(low, high, mask, b_high, b_low), codes)


def test_high_plane_holds_only_salient_channels():
    codes = torch.zeros(1, 1, 8, 16, dtype=torch.uint8)
    mask = torch.zeros(1, 1, 16, dtype=torch.bool)
    mask[..., :4] = True
    low, high = pack_key_codes(codes, mask, 3, 1)
    assert low.shape == (1, 1, 1, 16) and high.shape == (1, 1, 2, 4)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_value_roundtrip_and_channel_order(bits):
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (2, 2, 5, 16), generator=gen, dtype=torch.uint8)
    packed = pack_value_codes(codes, bits)
    assert torch.equal(unpack_value_codes(packed, bits), codes)
    if bits == 2:  # 4 consecutive channels of one token per byte
        assert packed.shape[-1] == 4
        c = codes[0, 0, 0, :4].tolist()
        assert packed[0, 0, 0, 0].item() == c[0] | c[1] << 2 | c[2] << 4 | c[3] << 6


def test_mask_is_one_bit_per_pair_zero_padded():
    pm = torch.tensor([True, False, True, True, False])  # d = 10
    packed = pack_mask(pm)
    assert packed.tolist() == [0b01101]
    assert torch.equal(unpack_mask(packed, 5), pm)
    assert pack_mask(torch.ones(2, 3, 64, dtype=torch.bool)).shape == (2, 3, 8)
