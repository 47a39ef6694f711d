"""Eq. 2 (asymmetric b-bit group quantization) and Eq. 7 (1-bit midpoint quantization).

Numerics, fixed here so that every implementation reproduces the codes bit for bit:

1. min and max of each group are taken in float32, and -0.0 is read as +0.0 (x + 0.0), so
   the sign of a zero never decides a stored bit;
2. scale and zero are computed in float32 (Eq. 2, or Eq. 7 when b == 1) with operations
   that are exact or correctly rounded and cannot be fused differently by a compiler
   (`(max - min) * 0.25` and `* 0.5` are exact, so `min + (max - min) * 0.25` is the same
   with or without a fused multiply-add; the Eq. 2 scale is one correctly rounded division);
3. they are rounded to the storage dtype (`scale_dtype`, float16 by default);
4. codes are computed from the *stored* scale and zero, in float32:
   q = clip(floor((x - z) / s + 0.5), 0, 2^b - 1), with a correctly rounded division,
   so rounding is half-up (x exactly between two levels takes the upper one);
5. a stored scale of 0 (a constant group, or a range that underflows the storage dtype)
   gives code 0 everywhere, so such a group reconstructs to its stored zero: exactly its
   value when the group is constant and the value is representable in the storage dtype;
6. reconstruction is x_hat = s * q + z in float32.

Scale and zero are stored in the configuration's `scale_dtype` (float16 by default), not in the
model's dtype. Decided 2026-12-02 with these numbers: the Triton decode kernel computes a 1-bit low
plane as an exact product (queries times where(bit, s, 0), one MMA: a product of two numbers of one
16-bit dtype is exact in float32) only when the scales have the queries' dtype, so bfloat16 scales
would give bfloat16 models that path too: its main loop 2,022 -> 1,693 instructions per warp per
64-token tile on sm_80 (`python -m pnmix.aot --default`, triton 3.7.1, no GPU), issue bound 22.3 ->
26.7 % of HBM on A100, 17.6 -> 21.0 % H100, 12.3 -> 14.7 % H200. Not the default: it changes the
numerics of every existing bfloat16 result (on `conformance.strategies.REALISTIC` in bfloat16, 64 %
of the dequantized keys and 62 % of the values differ), and bfloat16 keeps 8 significant bits of a
scale and a zero where float16 keeps 11. A bfloat16 model gets the exact path by asking for
`scale_dtype=torch.bfloat16`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Quantized(NamedTuple):
    """Codes (uint8, same shape as the input) and per-group scale and zero (storage dtype).

    scale and zero have the input's shape with the grouped axis divided by the group size.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor


def group_min_max(x: torch.Tensor, group_size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 min and max of consecutive groups of `group_size` entries along `dim`.

    x: [..., n, ...] with n a multiple of group_size at `dim`;
    returns two tensors shaped like x with n replaced by n // group_size.
    """
    dim = dim % x.dim()
    n = x.shape[dim]
    if n % group_size:
        raise ValueError(f"length {n} along dim {dim} is not a multiple of group_size {group_size}")
    grouped = x.float().unflatten(dim, (n // group_size, group_size))
    # + 0.0 turns -0.0 into +0.0: which zero amin/amax return is not specified.
    return grouped.amin(dim=dim + 1) + 0.0, grouped.amax(dim=dim + 1) + 0.0


def asymmetric_params(xmin: torch.Tensor, xmax: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2 scale and zero in float32: s = (max - min) / (2^b - 1), z = min."""
    return (xmax - xmin) / float(2**bits - 1), xmin.clone()


def midpoint_params(xmin: torch.Tensor, xmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 7 scale and zero in float32: s = (max - min) / 2, z = (3 min + max) / 4.

    The two reconstruction levels are the bin midpoints (3 min + max) / 4 and
    (min + 3 max) / 4. z is evaluated as min + (max - min) / 4, the same real number,
    because that form rounds identically with or without a fused multiply-add.
    """
    span = xmax - xmin
    return span * 0.5, xmin + span * 0.25


def group_params(
    xmin: torch.Tensor, xmax: torch.Tensor, bits: int, scale_dtype: torch.dtype, midpoint: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored (scale, zero) of groups with the given float32 min/max: Eq. 7 if bits == 1 (and
    midpoint, PN-Mix), else Eq. 2 (also at 1 bit when midpoint=False, as KIVI)."""
    use_eq7 = bits == 1 and midpoint
    scale, zero = midpoint_params(xmin, xmax) if use_eq7 else asymmetric_params(xmin, xmax, bits)
    return scale.to(scale_dtype), zero.to(scale_dtype)


def encode(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int | torch.Tensor) -> torch.Tensor:
    """Codes of x from stored scale/zero broadcast to x's shape (numerics rules 4-5).

    bits may be a tensor broadcastable to x (per-channel bit-widths). Returns uint8.
    """
    s = scale.float()
    z = zero.float()
    levels = (2 ** torch.as_tensor(bits, device=x.device)) - 1
    safe_s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.floor((x.float() - z) / safe_s + 0.5)
    q = torch.where(s == 0, torch.zeros_like(q), q)
    return torch.minimum(q.clamp(min=0), levels.to(q.dtype)).to(torch.uint8)


def expand_groups(t: torch.Tensor, group_size: int, dim: int) -> torch.Tensor:
    """Repeat per-group parameters `group_size` times along `dim` to match the data."""
    return t.repeat_interleave(group_size, dim=dim)


def quantize(
    x: torch.Tensor,
    bits: int,
    group_size: int,
    dim: int,
    scale_dtype: torch.dtype = torch.float16,
    midpoint: bool = True,
) -> Quantized:
    """Eq. 2 (Eq. 7 when bits == 1) along `dim` in groups of `group_size` consecutive entries.

    Keys use dim = token axis (per channel along tokens); values use dim = channel axis
    (per token along channels).

    >>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    >>> q = quantize(x, bits=2, group_size=4, dim=-1)
    >>> q.codes.tolist(), q.scale.tolist(), q.zero.tolist(), q.scale.dtype
    ([[0, 1, 2, 3]], [[1.0]], [[0.0]], torch.float16)
    """
    xmin, xmax = group_min_max(x, group_size, dim)
    scale, zero = group_params(xmin, xmax, bits, scale_dtype, midpoint)
    codes = encode(x, expand_groups(scale, group_size, dim), expand_groups(zero, group_size, dim), bits)
    return Quantized(codes, scale, zero)


def dequantize(q: Quantized, group_size: int, dim: int) -> torch.Tensor:
    """x_hat = s * q + z in float32, the inverse map of `quantize` (Eq. 2 / Eq. 7)."""
    s = expand_groups(q.scale, group_size, dim).float()
    z = expand_groups(q.zero, group_size, dim).float()
    return s * q.codes.float() + z


def quantize_keys(
    k: torch.Tensor,
    channel_mask: torch.Tensor,
    b_high: int,
    b_low: int,
    group_size: int,
    scale_dtype: torch.dtype = torch.float16,
    midpoint: bool = True,
) -> Quantized:
    """Mixed-precision key quantization: per channel along tokens, b_high bits on salient channels.

    k: [B, H_kv, T, d] with T a multiple of group_size; channel_mask: [B, H_kv, d] bool, or
    [B, H_kv, T // group_size, d] for a mask per group (Kitty's per-page selection).
    Returns codes [B, H_kv, T, d] and scale/zero [B, H_kv, T // group_size, d].
    """
    xmin, xmax = group_min_max(k, group_size, dim=-2)
    hi = channel_mask.unsqueeze(-2) if channel_mask.dim() == 3 else channel_mask
    s_high, z_high = group_params(xmin, xmax, b_high, scale_dtype, midpoint)
    s_low, z_low = group_params(xmin, xmax, b_low, scale_dtype, midpoint)
    scale = torch.where(hi, s_high, s_low)
    zero = torch.where(hi, z_high, z_low)
    bits = torch.where(hi, b_high, b_low)
    if channel_mask.dim() == 4:
        bits = expand_groups(bits, group_size, -2)
    codes = encode(k, expand_groups(scale, group_size, -2), expand_groups(zero, group_size, -2), bits)
    return Quantized(codes, scale, zero)
