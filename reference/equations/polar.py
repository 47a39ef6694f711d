"""PolarQuant-style uniform baseline of the paper's ablations (Table 9): each RoPE pair is
quantized in polar coordinates, radius and angle, per pair along tokens in groups of G
(Eq. 2, with the same numerics as every other quantizer here). b bits for the radius and b for
the angle of a pair of two channels is b bits per element, the same budget as uniform KIVI-b.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from reference.equations.quant import Quantized, dequantize, quantize
from reference.equations.saliency import pair_channels


class PolarQuantized(NamedTuple):
    radius: Quantized  # codes [B, H_kv, T, d/2], scale/zero [B, H_kv, T / G, d/2]
    angle: Quantized


def to_polar(k: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Radius and angle (atan2, in [-pi, pi]) of every RoPE pair: [..., d] -> two [..., d/2], float32."""
    first, second = (c.to(k.device) for c in pair_channels(k.shape[-1], layout))
    a, b = k.float()[..., first], k.float()[..., second]
    return torch.sqrt(a * a + b * b), torch.atan2(b, a)


def from_polar(radius: torch.Tensor, angle: torch.Tensor, layout: str) -> torch.Tensor:
    """Inverse of `to_polar`: [..., d/2] radius and angle -> [..., d] channels in `layout` order."""
    d = 2 * radius.shape[-1]
    first, second = (c.to(radius.device) for c in pair_channels(d, layout))
    out = torch.empty(*radius.shape[:-1], d, dtype=torch.float32, device=radius.device)
    out[..., first] = radius * torch.cos(angle)
    out[..., second] = radius * torch.sin(angle)
    return out


def polar_quantize(
    k: torch.Tensor, bits: int, group_size: int, layout: str, scale_dtype: torch.dtype = torch.float16
) -> PolarQuantized:
    """k [B, H_kv, T, d] (T a multiple of group_size) -> b-bit radius and angle codes per pair."""
    radius, angle = to_polar(k, layout)
    return PolarQuantized(
        quantize(radius, bits, group_size, -2, scale_dtype, midpoint=False),
        quantize(angle, bits, group_size, -2, scale_dtype, midpoint=False),
    )


def polar_dequantize(pq: PolarQuantized, group_size: int, layout: str) -> torch.Tensor:
    """Float32 keys [B, H_kv, T, d] rebuilt from quantized radius and angle."""
    return from_polar(dequantize(pq.radius, group_size, -2), dequantize(pq.angle, group_size, -2), layout)
