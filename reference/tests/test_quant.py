"""Eq. 2 and Eq. 7: hand-worked golden values and the numerics rules of reference.equations.quant."""

import pytest
import torch

from reference import dequantize, midpoint_params, quantize, quantize_keys


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def test_eq2_golden_two_bits():
    # s = (2 - (-1)) / 3 = 1, z = -1; (x - z) / s + 0.5 = [0.5, 2.0, 3.5, 1.7] -> floor.
    q = quantize(f32([[-1.0, 0.5, 2.0, 0.2]]), bits=2, group_size=4, dim=-1)
    assert torch.equal(q.codes, torch.tensor([[0, 2, 3, 1]], dtype=torch.uint8))
    assert torch.equal(q.scale, torch.tensor([[1.0]], dtype=torch.float16))
    assert torch.equal(q.zero, torch.tensor([[-1.0]], dtype=torch.float16))
    assert torch.equal(dequantize(q, 4, -1), f32([[-1.0, 1.0, 2.0, 0.0]]))


def test_eq2_rounds_half_up():
    # 0.5 and 1.5 sit exactly between two levels (s = 1, z = 0): both take the upper level.
    q = quantize(f32([[0.0, 0.5, 1.5, 3.0]]), bits=2, group_size=4, dim=-1)
    assert q.codes.tolist() == [[0, 1, 2, 3]]


def test_eq2_groups_are_consecutive_along_dim():
    x = f32([[0.0, 4.0], [1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [10.0, 10.0], [10.0, 10.0], [13.0, 10.0], [11.0, 10.0]])
    q = quantize(x, bits=2, group_size=4, dim=0)  # keys: per channel along tokens
    assert q.scale.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert q.zero.tolist() == [[0.0, 4.0], [10.0, 10.0]]
    assert q.codes[:, 0].tolist() == [0, 1, 2, 3, 0, 0, 3, 1]
    assert q.codes[:, 1].tolist() == [0, 1, 2, 3, 0, 0, 0, 0]


def test_constant_group_stores_zero_scale_and_reconstructs_exactly():
    x = torch.full((1, 8), 2.5)
    for bits in (1, 2, 3, 4, 8):
        q = quantize(x, bits=bits, group_size=8, dim=-1)
        assert q.scale.item() == 0.0 and q.zero.item() == 2.5
        assert torch.equal(q.codes, torch.zeros(1, 8, dtype=torch.uint8))
        assert torch.equal(dequantize(q, 8, -1), x)


def test_eq7_golden_midpoints():
    # min 0, max 4: s = 2, z = 1; levels (3*0 + 4)/4 = 1 and (0 + 3*4)/4 = 3.
    scale, zero = midpoint_params(f32([0.0]), f32([4.0]))
    assert scale.item() == 2.0 and zero.item() == 1.0
    q = quantize(f32([[0.0, 1.0, 2.0, 4.0]]), bits=1, group_size=4, dim=-1)
    assert q.codes.tolist() == [[0, 0, 1, 1]]  # 2.0 is the tie: half-up takes the upper level
    assert dequantize(q, 4, -1).tolist() == [[1.0, 1.0, 3.0, 3.0]]


def test_eq7_is_not_eq2_at_one_bit():
    # Eq. 2 at b = 1 would reconstruct to the group ends {0, 4}; Eq. 7 never does.
    x = torch.linspace(0, 4, 16).view(1, 16)
    recon = dequantize(quantize(x, bits=1, group_size=16, dim=-1), 16, -1)
    assert set(recon.flatten().tolist()) == {1.0, 3.0}


def test_scale_and_zero_are_rounded_to_storage_dtype_before_codes():
    # min 0, max 1, 3 bits: s = 1/7 in float32, stored as float16 0.142822265625.
    x = torch.linspace(0, 1, 8).view(1, 8)
    q = quantize(x, bits=3, group_size=8, dim=-1)
    assert q.scale.item() == torch.tensor(1 / 7, dtype=torch.float16).item()
    s = q.scale.float()
    expected = torch.clamp(torch.floor(x / s + 0.5), 0, 7).to(torch.uint8)
    assert torch.equal(q.codes, expected)
    q32 = quantize(x, bits=3, group_size=8, dim=-1, scale_dtype=torch.float32)
    assert q32.scale.dtype == torch.float32 and q32.scale.item() == pytest.approx(1 / 7, rel=1e-7)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_reconstruction_error_within_half_a_step(bits):
    torch.manual_seed(bits)
    x = torch.randn(4, 64) * 3
    q = quantize(x, bits=bits, group_size=16, dim=-1, scale_dtype=torch.float32)
    err = (dequantize(q, 16, -1) - x).abs()
    bound = q.scale.repeat_interleave(16, dim=-1) / 2
    assert bool((err <= bound * (1 + 1e-5) + 1e-6).all())


def test_quantize_keys_uses_high_bits_on_salient_channels_only():
    torch.manual_seed(0)
    k = torch.randn(1, 1, 16, 4)
    mask = torch.tensor([[[True, False, False, True]]])
    q = quantize_keys(k, mask, b_high=3, b_low=1, group_size=8)
    assert int(q.codes[..., [1, 2]].max()) <= 1
    assert int(q.codes[..., [0, 3]].max()) > 1
    high = quantize(k[..., 0], bits=3, group_size=8, dim=-1)
    low = quantize(k[..., 1], bits=1, group_size=8, dim=-1)
    assert torch.equal(q.codes[..., 0], high.codes) and torch.equal(q.scale[..., 0], high.scale)
    assert torch.equal(q.codes[..., 1], low.codes) and torch.equal(q.zero[..., 1], low.zero)


def test_group_length_must_divide():
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        quantize(torch.zeros(1, 10), bits=2, group_size=4, dim=-1)


def test_signed_zero_never_reaches_scale_or_zero():
    x = torch.tensor([[-0.0, 0.0, -0.0, 0.0]])
    for bits in (1, 2):
        q = quantize(x, bits=bits, group_size=4, dim=-1)
        assert not torch.signbit(q.zero).any() and not torch.signbit(q.scale).any()
