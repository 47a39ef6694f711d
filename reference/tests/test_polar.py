"""The PolarQuant-style baseline: exact polar round trip, error within half a step of radius and angle."""

import math

import pytest
import torch

from reference.equations.polar import from_polar, polar_dequantize, polar_quantize, to_polar


@pytest.mark.parametrize("layout", ["adjacent", "split"])
def test_polar_roundtrip(layout):
    k = torch.randn(2, 3, 16, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(from_polar(*to_polar(k, layout), layout), k, rtol=1e-5, atol=1e-6)


def test_polar_golden_pair():
    k = torch.tensor([[[[3.0, 4.0]]]])  # one pair: radius 5, angle atan2(4, 3)
    radius, angle = to_polar(k, "adjacent")
    assert radius.item() == 5.0 and angle.item() == pytest.approx(math.atan2(4, 3))


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_polar_error_is_bounded_by_radius_and_angle_steps(bits):
    k = torch.randn(1, 2, 32, 8, generator=torch.Generator().manual_seed(bits)) * 2
    pq = polar_quantize(k, bits, 16, "split", torch.float32)
    k_hat = polar_dequantize(pq, 16, "split")
    r, a = to_polar(k, "split")
    r_hat, a_hat = to_polar(k_hat, "split")
    s_r = pq.radius.scale.repeat_interleave(16, -2)
    s_a = pq.angle.scale.repeat_interleave(16, -2)
    assert bool(((r_hat - r).abs() <= s_r / 2 + 1e-4).all())
    # Angle error wraps at +-pi; compare on the circle.
    da = torch.remainder(a_hat - a + math.pi, 2 * math.pi) - math.pi
    assert bool((da.abs() <= s_a / 2 + 1e-4).all())
    assert pq.radius.codes.shape == (1, 2, 32, 4) and int(pq.angle.codes.max()) <= 2**bits - 1
