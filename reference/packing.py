"""Bit packing of PN-Mix codes (paper Appendix G, generalized to the paper's sweep).

A field of width w (1, 2, 4 or 8 bits) holds one code; a byte holds 8 // w fields,
the first code in the lowest bits (little-endian bit order, as numpy.packbits with
bitorder="little" for w = 1). Golden examples, checked byte for byte by the tests:

    width 1, codes [1, 0, 1, 1, 0, 0, 0, 1] -> 0b10001101 = 0x8D
    width 2, codes [3, 0, 1, 2]             -> 0b10010011 = 0x93

Layouts for one sequence and KV head (a leading [B, H_kv] is implied everywhere):
- key_low  [T_q * w_low / 8, d]: the low b_low bits of every channel's code, packed along
  TOKENS (8 tokens of one channel per byte for b_low = 1);
- key_high [T_q * w_high / 8, n_salient_channels]: the upper b_high - b_low bits of the
  salient channels only, in ascending channel order, packed along tokens (4 tokens per
  byte for b_high = 3, b_low = 1); empty when b_high == b_low;
- values   [T_q, d * w_v / 8]: per-token codes packed along CHANNELS (4 per byte for 2 bits);
- mask     [ceil(d/2 / 8)]: the pair mask, one bit per RoPE pair, zero padded.
"""

from __future__ import annotations

import torch

from .config import field_width


def pack_fields(codes: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Pack uint8 codes of `width` bits along `dim`, 8 // width per byte, first code lowest.

    codes: [..., n, ...] with n a multiple of 8 // width; returns [..., n * width / 8, ...] uint8.
    """
    if width not in (1, 2, 4, 8):
        raise ValueError(f"width must be 1, 2, 4 or 8, got {width}")
    dim = dim % codes.dim()
    per_byte = 8 // width
    n = codes.shape[dim]
    if n % per_byte:
        raise ValueError(f"length {n} along dim {dim} is not a multiple of {per_byte} ({width}-bit fields)")
    if codes.numel() and int(codes.max()) >= 1 << width:
        raise ValueError(f"codes must fit in {width} bits, got a code {int(codes.max())}")
    fields = codes.to(torch.int32).unflatten(dim, (n // per_byte, per_byte))
    shifts = (torch.arange(per_byte, device=codes.device, dtype=torch.int32) * width).view(
        [per_byte] + [1] * (codes.dim() - dim - 1)
    )
    return (fields << shifts).sum(dim=dim + 1).to(torch.uint8)


def unpack_fields(packed: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Inverse of `pack_fields`: [..., m, ...] uint8 -> [..., m * 8 / width, ...] uint8 codes."""
    if width not in (1, 2, 4, 8):
        raise ValueError(f"width must be 1, 2, 4 or 8, got {width}")
    dim = dim % packed.dim()
    per_byte = 8 // width
    shifts = (torch.arange(per_byte, device=packed.device, dtype=torch.int32) * width).view(
        [per_byte] + [1] * (packed.dim() - dim - 1)
    )
    fields = (packed.to(torch.int32).unsqueeze(dim + 1) >> shifts) & ((1 << width) - 1)
    return fields.flatten(dim, dim + 1).to(torch.uint8)


def salient_channel_index(channel_mask: torch.Tensor) -> torch.Tensor:
    """Indices of the salient channels of each [..., d] mask row, ascending: [..., n_salient].

    Every row must have the same number of salient channels (PN-Mix selects a fixed count).
    """
    counts = channel_mask.sum(dim=-1)
    if counts.numel() and not bool((counts == counts.flatten()[0]).all()):
        raise ValueError("every channel_mask row must have the same number of salient channels")
    n = int(counts.flatten()[0]) if counts.numel() else 0
    # A stable sort puts the True entries first, each group in ascending channel order.
    order = torch.sort((~channel_mask).to(torch.uint8), dim=-1, stable=True).indices
    return order[..., :n]


def high_plane_columns(channel_mask: torch.Tensor) -> torch.Tensor:
    """Column of each channel in the key high plane, -1 for a channel without one: int32 [..., d].

    The inverse of `salient_channel_index`: column j of key_high holds the j-th salient
    channel in ascending order. Example: mask [T, F, T, T] -> [0, -1, 1, 2].
    """
    salient = channel_mask.to(torch.int32)
    return torch.where(channel_mask, salient.cumsum(-1, dtype=torch.int32) - 1, -1).to(torch.int32)


def _pages(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(t.chunk(n, dim=-2)) if n else []


def pack_key_codes(
    codes: torch.Tensor, channel_mask: torch.Tensor, b_high: int, b_low: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split key codes [B, H_kv, T_q, d] into (key_low, key_high) packed planes (module doc).

    channel_mask: [B, H_kv, d] bool, True for the channels quantized with b_high bits; or
    [B, H_kv, P, d], one mask per page of T_q / P tokens (Kitty), each page's high plane
    holding that page's channels.
    """
    if channel_mask.dim() == 4:
        n = channel_mask.shape[2]
        planes = [
            pack_key_codes(c, m, b_high, b_low) for c, m in zip(_pages(codes, n), channel_mask.unbind(2), strict=True)
        ]
        if not planes:
            return pack_key_codes(codes, channel_mask[:, :, 0] if n else channel_mask.any(2), b_high, b_low)
        return torch.cat([p[0] for p in planes], -2), torch.cat([p[1] for p in planes], -2)
    low = codes & ((1 << b_low) - 1)
    key_low = pack_fields(low, field_width(b_low), dim=-2)
    index = salient_channel_index(channel_mask)  # [B, H_kv, n_sal]
    high = torch.gather(codes, -1, index.unsqueeze(-2).expand(*codes.shape[:-1], index.shape[-1])) >> b_low
    width = field_width(b_high - b_low)
    if width == 0:
        return key_low, high[..., :0, :].to(torch.uint8)
    return key_low, pack_fields(high, width, dim=-2)


def unpack_key_codes(
    key_low: torch.Tensor, key_high: torch.Tensor, channel_mask: torch.Tensor, b_high: int, b_low: int
) -> torch.Tensor:
    """Inverse of `pack_key_codes`: rebuild codes [B, H_kv, T_q, d] (uint8)."""
    if channel_mask.dim() == 4:
        n = channel_mask.shape[2]
        if n == 0:
            return unpack_key_codes(key_low, key_high, channel_mask.any(2), b_high, b_low)
        pages = zip(_pages(key_low, n), _pages(key_high, n), channel_mask.unbind(2), strict=True)
        return torch.cat([unpack_key_codes(lo, hi, m, b_high, b_low) for lo, hi, m in pages], -2)
    codes = unpack_fields(key_low, field_width(b_low), dim=-2)
    width = field_width(b_high - b_low)
    if width == 0:
        return codes
    index = salient_channel_index(channel_mask)
    high = unpack_fields(key_high, width, dim=-2).to(torch.int32) << b_low
    full_index = index.unsqueeze(-2).expand(*codes.shape[:-1], index.shape[-1])
    upper = torch.zeros(codes.shape, dtype=torch.int32, device=codes.device).scatter(-1, full_index, high)
    return (codes.to(torch.int32) | upper).to(torch.uint8)


def pack_value_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Value codes [B, H_kv, T_q, d] -> [B, H_kv, T_q, d * w / 8], packed along channels."""
    return pack_fields(codes, field_width(bits), dim=-1)


def unpack_value_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_value_codes`."""
    return unpack_fields(packed, field_width(bits), dim=-1)


def pack_mask(pair_mask: torch.Tensor) -> torch.Tensor:
    """Pair mask [..., d/2] bool -> [..., ceil(d/2 / 8)] uint8, one bit per pair, zero padded."""
    n = pair_mask.shape[-1]
    pad = (-n) % 8
    bits = torch.nn.functional.pad(pair_mask.to(torch.uint8), (0, pad))
    return pack_fields(bits, 1, dim=-1)


def unpack_mask(packed: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """Inverse of `pack_mask` for a head_dim of 2 * n_pairs."""
    return unpack_fields(packed, 1, dim=-1)[..., :n_pairs].bool()
