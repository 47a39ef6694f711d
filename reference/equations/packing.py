"""Bit packing of PN-Mix codes (paper Appendix G, generalized to the paper's sweep).

A b-bit code costs exactly b bits: it is split into bit planes, one per power of two in b,
widest first, the widest holding the code's lowest bits (`bit_planes`:
3 -> a 2-bit and a 1-bit plane, 7 -> 4, 2 and 1). Along the packed axis, codes go in blocks of
`block_positions(b)` = 8 // (narrowest plane) positions; a block stores its planes one after
the other, each plane's w-bit fields 8 // w to a byte, the first code in the lowest bits
(little-endian bit order, as numpy.packbits with bitorder="little" for w = 1). For b = 1, 2, 4
or 8 (one plane) this is plain packing, 8 // b codes per byte. Golden examples, checked byte
for byte by the tests:

    1 bit,  codes [1, 0, 1, 1, 0, 0, 0, 1]  -> [0x8D]
    2 bits, codes [3, 0, 1, 2]              -> [0x93]
    3 bits, codes [0, 1, 2, 3, 4, 5, 6, 7]  -> [0xE4, 0xE4, 0xF0]  (low 2 bits, then bit 2)

Layouts for one sequence and KV head (a leading [B, H_kv] is implied everywhere):
- key_low  [T_q * b_low / 8, d]: the low b_low bits of every channel's code, packed along
  TOKENS (8 tokens of one channel per byte for b_low = 1);
- key_high [T_q * (b_high - b_low) / 8, n_salient_channels]: the upper b_high - b_low bits of
  the salient channels only, in ascending channel order, packed along tokens (4 tokens per
  byte for b_high = 3, b_low = 1; 3 bits in a 2-bit and a 1-bit plane for H4L1); empty when
  b_high == b_low;
- values   [T_q, d * b_v / 8]: per-token codes packed along CHANNELS (4 per byte for 2 bits);
- mask     [ceil(d/2 / 8)]: the pair mask, one bit per RoPE pair, zero padded.
"""

from __future__ import annotations

import torch


def bit_planes(bits: int) -> tuple[int, ...]:
    """Widths of the bit planes a `bits`-bit code is stored in: one per power of two in `bits`,
    widest first, the widest holding the code's lowest bits (3 -> (2, 1), 7 -> (4, 2, 1)).

    A b-bit code so costs exactly b bits (`reference.equations.packing` lays the planes out).
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 8:
        raise ValueError(f"bits must be an int in 0..8 to be packed, got {bits!r}")
    return tuple(w for w in (8, 4, 2, 1) if bits & w)


def block_positions(bits: int) -> int:
    """Positions one block of `bits`-bit codes spans: 8 // (the narrowest plane's width), the
    fewest that fill whole bytes in every plane (1 bit: 8, 2: 4, 3: 8, 4: 2, 6: 4, 8: 1).

    A packed axis must hold a multiple of it; 0 bits (no plane) needs nothing (1).
    """
    planes = bit_planes(bits)
    return 8 // planes[-1] if planes else 1


def _shifts(per_byte: int, width: int, trailing: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(per_byte, device=device, dtype=torch.int32) * width).view([per_byte] + [1] * trailing)


def pack_fields(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack uint8 codes of `bits` bits along `dim` in bit planes (module doc), exactly `bits` bits each.

    codes: [..., n, ...] with n a multiple of block_positions(bits); returns [..., n * bits / 8, ...] uint8.
    """
    planes, block = bit_planes(bits), block_positions(bits)
    if not planes:
        raise ValueError("bits must be in 1..8 to be packed, got 0")
    dim = dim % codes.dim()
    n = codes.shape[dim]
    if n % block:
        raise ValueError(
            f"length {n} along dim {dim} is not a multiple of {block} ({bits}-bit codes fill whole bytes every {block})"
        )
    if codes.numel() and int(codes.max()) >= 1 << bits:
        raise ValueError(f"codes must fit in {bits} bits, got a code {int(codes.max())}")
    blocks = codes.to(torch.int32).unflatten(dim, (n // block, block))  # [..., n / block, block, ...]
    stored, low = [], 0
    for width in planes:
        per_byte = 8 // width
        fields = ((blocks >> low) & ((1 << width) - 1)).unflatten(dim + 1, (block // per_byte, per_byte))
        stored.append((fields << _shifts(per_byte, width, codes.dim() - dim - 1, codes.device)).sum(dim=dim + 2))
        low += width
    return torch.cat(stored, dim + 1).flatten(dim, dim + 1).to(torch.uint8)


def unpack_fields(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Inverse of `pack_fields`: [..., m, ...] uint8 -> [..., m * 8 / bits, ...] uint8 codes."""
    planes, block = bit_planes(bits), block_positions(bits)
    if not planes:
        raise ValueError("bits must be in 1..8 to be packed, got 0")
    dim = dim % packed.dim()
    per_block = block * bits // 8  # bytes one block of codes takes
    if packed.shape[dim] % per_block:
        raise ValueError(f"length {packed.shape[dim]} along dim {dim} is not a multiple of {per_block} bytes")
    blocks = packed.to(torch.int32).unflatten(dim, (packed.shape[dim] // per_block, per_block))
    codes, low = 0, 0
    for width, plane in zip(planes, blocks.split([block * w // 8 for w in planes], dim + 1), strict=True):
        per_byte = 8 // width
        fields = (plane.unsqueeze(dim + 2) >> _shifts(per_byte, width, packed.dim() - dim - 1, packed.device)) & (
            (1 << width) - 1
        )
        codes = codes + (fields.flatten(dim + 1, dim + 2) << low)
        low += width
    return codes.flatten(dim, dim + 1).to(torch.uint8)


def salient_channel_index(channel_mask: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """Indices of the salient channels of each [..., d] mask row, ascending: [..., n_salient].

    Every row must have the same number of salient channels (PN-Mix selects a fixed count). Without
    `count` it is read from the mask and the rows are checked to agree, which waits for the mask's device
    (two reads of device data); with `count`, the number the caller knows on the host (a cache's
    `CacheLayout.n_high_channels`: its own selection made the mask), nothing is read back and the rows
    are trusted to hold that many.
    """
    if count is not None:
        n = count
    else:
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
    key_low = pack_fields(low, b_low, dim=-2)
    index = salient_channel_index(channel_mask)  # [B, H_kv, n_sal]
    high = torch.gather(codes, -1, index.unsqueeze(-2).expand(*codes.shape[:-1], index.shape[-1])) >> b_low
    if b_high == b_low:
        return key_low, high[..., :0, :].to(torch.uint8)
    return key_low, pack_fields(high, b_high - b_low, dim=-2)


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
    codes = unpack_fields(key_low, b_low, dim=-2)
    if b_high == b_low:
        return codes
    index = salient_channel_index(channel_mask)
    high = unpack_fields(key_high, b_high - b_low, dim=-2).to(torch.int32) << b_low
    full_index = index.unsqueeze(-2).expand(*codes.shape[:-1], index.shape[-1])
    upper = torch.zeros(codes.shape, dtype=torch.int32, device=codes.device).scatter(-1, full_index, high)
    return (codes.to(torch.int32) | upper).to(torch.uint8)


def pack_value_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Value codes [B, H_kv, T_q, d] -> [B, H_kv, T_q, d * bits / 8], packed along channels."""
    return pack_fields(codes, bits, dim=-1)


def unpack_value_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_value_codes`."""
    return unpack_fields(packed, bits, dim=-1)


def pack_mask(pair_mask: torch.Tensor) -> torch.Tensor:
    """Pair mask [..., d/2] bool -> [..., ceil(d/2 / 8)] uint8, one bit per pair, zero padded."""
    n = pair_mask.shape[-1]
    pad = (-n) % 8
    bits = torch.nn.functional.pad(pair_mask.to(torch.uint8), (0, pad))
    return pack_fields(bits, 1, dim=-1)


def unpack_mask(packed: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """Inverse of `pack_mask` for a head_dim of 2 * n_pairs."""
    return unpack_fields(packed, 1, dim=-1)[..., :n_pairs].bool()
