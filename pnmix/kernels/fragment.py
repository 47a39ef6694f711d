"""Codes in the order the decode kernel's tensor-core fragments read them (pnmix/kernels/NOTES.md, "Codes in fragment
order"): the mapping, written once, and its CPU twin.

The fragment-order decode kernel (`pnmix.kernels.fragment_decode`) splits a tile of `TILE` tokens over `WARPS` warps,
16 tokens each, and feeds Ampere's m16n8k16 MMA (`mma_v2`, the same instruction on sm_90) from registers. Each lane of
a warp reads `WORDS` consecutive 32-bit words of the tile, and the codes of those words are exactly the elements its
MMA operand fragments hold:

- words 0-1: the key low plane (1 bit, 128 channels x 16 tokens), the B operand of `logits = q . k`;
- words 2-3: the key high plane (2 bits, 64 salient channels x 16 tokens), the B operand of the high dot;
- words 4-7: the values (2 bits, 16 tokens x 128 channels), the B operand of `o = p . v`.

Inside a word, the code of bit position i + 16 h (1-bit) or 2 i + 16 h (2-bit) is the element whose lowest
coordinate bit along the MMA's k axis is h: the pair (k, k + 1) of one lane sits in the two halves of one word, so
that one shift and one mask give both halves of a float16x2 operand register (the Marlin unpack). Which (channel,
token) each (lane, word, bit) holds follows from the operand layout of the MMA (`triton.experimental.gluon`'s
`DotOperandLayout(1, mma_v2, k_width=2)`: lanes hold k bits 1-2 and n bits 0-2, registers the rest):

| plane | k (row of B) | n (column of B) | lane | word | bit |
|-------|--------------|-----------------|------|------|-----|
| key low | channel c | token t | (c >> 1 & 3) + 4 (t & 7) | t >> 3 | (c >> 3) + 16 (c & 1) |
| key high | salient channel c | token t | (c >> 1 & 3) + 4 (t & 7) | 2 + (t >> 3) | 2 (c >> 3) + 16 (c & 1) |
| values | token t | channel c | (t >> 1 & 3) + 4 (c & 7) | 4 + (c >> 5) | 2 ((t >> 3) + 2 (c >> 3 & 3)) + 16 (t & 1) |

The stored bytes and their count are those of the spec's planes (Appendix G: the 1-bit low plane of every channel,
the 2-bit high plane of the salient channels, the 2-bit values; 72 bytes per token per KV head at d = 128 with the
scales); only their order inside a tile changes. `unpack` is the twin of the kernel's unpack: the same joins,
reshapes and permutations, in torch, so that what the kernel computes from a tile can be computed on a CPU.
"""

from __future__ import annotations

import torch

from reference.equations import packing

#: Tokens per warp (the MMA's n for keys, its k for values), warps per tile, tokens per tile, 32-bit words per lane.
TOKENS_PER_WARP = 16
WARPS = 4
TILE = WARPS * TOKENS_PER_WARP
WORDS = 8
#: The configuration the layout is written for: channels per head, salient channels (high plane), plane widths.
HEAD_DIM = 128
HIGH_CHANNELS = 64
LOW_BITS, HIGH_BITS, VALUE_BITS = 1, 2, 2


def key_low_position(c: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lane, word, bit) of the low-plane code of channel c, token t (of a warp's 16) within the lane's words."""
    return ((c >> 1) & 3) + 4 * (t & 7), t >> 3, (c >> 3) + 16 * (c & 1)


def key_high_position(c: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lane, word, lowest bit) of the high-plane code of salient channel c (0..63), token t."""
    return ((c >> 1) & 3) + 4 * (t & 7), 2 + (t >> 3), 2 * (c >> 3) + 16 * (c & 1)


def value_position(t: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lane, word, lowest bit) of the value code of token t (of a warp's 16), channel c."""
    return ((t >> 1) & 3) + 4 * (c & 7), 4 + (c >> 5), 2 * ((t >> 3) + 2 * ((c >> 3) & 3)) + 16 * (t & 1)


def _check(name: str, codes: torch.Tensor, shape: tuple[int, int], bits: int) -> None:
    if codes.dim() != 3 or tuple(codes.shape[1:]) != shape:
        raise ValueError(f"{name} must have shape [tiles * {WARPS}, {shape[0]}, {shape[1]}], got {tuple(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of codes, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 1 << bits):
        raise ValueError(f"{name} must hold {bits}-bit codes (0..{(1 << bits) - 1})")


def pack(low: torch.Tensor, high: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The words of whole tiles, [tiles, WARPS, 32, WORDS] int32, from each warp slice's codes: low [slices, 128
    channels, 16 tokens] (1-bit), high [slices, 64, 16] (2-bit), values [slices, 16 tokens, 128 channels] (2-bit);
    slice s is warp s % WARPS of tile s // WARPS."""
    _check("low", low, (HEAD_DIM, TOKENS_PER_WARP), LOW_BITS)
    _check("high", high, (HIGH_CHANNELS, TOKENS_PER_WARP), HIGH_BITS)
    _check("values", values, (TOKENS_PER_WARP, HEAD_DIM), VALUE_BITS)
    slices = low.shape[0]
    if high.shape[0] != slices or values.shape[0] != slices or slices % WARPS:
        raise ValueError(
            f"low, high and values must hold the same whole tiles of {WARPS} slices, got {slices}, "
            f"{high.shape[0]} and {values.shape[0]}"
        )
    words = torch.zeros(slices, 32, WORDS, dtype=torch.int64)
    for codes, position in ((low, key_low_position), (high, key_high_position), (values, value_position)):
        a, b = torch.meshgrid(torch.arange(codes.shape[1]), torch.arange(codes.shape[2]), indexing="ij")
        lane, word, bit = position(a, b)
        flat = (lane * WORDS + word).flatten()
        shifted = codes.to(torch.int64).flatten(1) << bit.flatten()
        words.view(slices, -1).index_add_(1, flat, shifted)  # disjoint bits: the sum is the OR
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words.view(slices // WARPS, WARPS, 32, WORDS)


def _halves(x: torch.Tensor, shift: int, mask: int) -> torch.Tensor:
    """The kernel's `_f`: the codes at `shift` and `shift + 16` joined on a new minor axis."""
    return torch.stack(((x >> shift) & mask, (x >> (shift + 16)) & mask), dim=-1)


def _join(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), dim=-1)


def _eight(x: torch.Tensor, step: int, mask: int, first: int = 0) -> torch.Tensor:
    """Eight positions `first + step * i` of each word, halves innermost: [..., h, i0, i1, i2]."""
    f = [_halves(x, first + step * i, mask) for i in range(8)]
    return _join(_join(_join(f[0], f[1]), _join(f[2], f[3])), _join(_join(f[4], f[5]), _join(f[6], f[7])))


def unpack(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The twin of the kernel's unpack: words [tiles, WARPS, 32, WORDS] -> low [slices, 128, 16], high [slices, 64,
    16], values [slices, 16, 128] (the inverse of `pack`), by the kernel's own joins, reshapes and permutations."""
    if words.dim() != 4 or tuple(words.shape[1:]) != (WARPS, 32, WORDS) or words.dtype != torch.int32:
        raise ValueError(f"words must be int32 [tiles, {WARPS}, 32, {WORDS}], got {words.dtype} {tuple(words.shape)}")
    x = words.reshape(-1, 32, WORDS).to(torch.int64) & 0xFFFFFFFF
    s = x.shape[0]
    lo_w, hi_w, v_w = x[..., 0:2], x[..., 2:4], x[..., 4:8]
    # low plane: 16 positions x 2 halves of 2 words -> [s, 32 lanes, w0, h, i0, i1, i2, i3]
    low = _join(_eight(lo_w, 1, 1), _eight(lo_w, 1, 1, first=8))
    low = low.reshape(s, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2).permute(0, 11, 10, 9, 8, 4, 5, 7, 6, 1, 2, 3)
    high = _eight(hi_w, 2, 3).reshape(s, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2).permute(0, 10, 9, 8, 4, 5, 7, 6, 1, 2, 3)
    vals = _eight(v_w, 2, 3).reshape(s, *[2] * 11).permute(0, 9, 4, 5, 8, 6, 7, 11, 10, 1, 2, 3)
    return (
        low.reshape(s, HEAD_DIM, TOKENS_PER_WARP),
        high.reshape(s, HIGH_CHANNELS, TOKENS_PER_WARP),
        vals.reshape(s, TOKENS_PER_WARP, HEAD_DIM),
    )


# --- a cache's quantized region in fragment order --------------------------------------------------------------------
#
# The cache stores each plane in its own component (`reference.channels.layout.CacheLayout`: key_low [T / 8, 128],
# key_high [T / 4, 64], value_payload [T, 32] bytes per head), so in fragment order tile j of a head is, in each
# component, the bytes j * 1024 (key planes) or j * 2048 (values) onwards: that plane's words of the tile's four warps
# and 32 lanes, [WARPS, 32, words of the plane], little-endian. Component shapes, byte counts and the storage report
# are the spec's; only the order of the codes inside each tile differs.

#: Per plane: its position rule, code shape per warp slice as the rule takes it ((c, t) or (t, c)), bits per code,
#: first word and words per lane, and the spec's columns (channels of the plane).
_PLANES = {
    "key_low": (key_low_position, (HEAD_DIM, TOKENS_PER_WARP), LOW_BITS, 0, 2, HEAD_DIM),
    "key_high": (key_high_position, (HIGH_CHANNELS, TOKENS_PER_WARP), HIGH_BITS, 2, 2, HIGH_CHANNELS),
    "value_payload": (value_position, (TOKENS_PER_WARP, HEAD_DIM), VALUE_BITS, 4, 4, HEAD_DIM),
}


def _slots(plane: str) -> torch.Tensor:
    """For each code slot of one tile's words of `plane` in storage order (warp, lane, word of the plane, field of
    `bits` bits from the lowest), the index token * columns + column of its code in the tile's spec codes [64 tokens,
    columns]."""
    position, shape, bits, first, words, columns = _PLANES[plane]
    a, b = (x.flatten() for x in torch.meshgrid(torch.arange(shape[0]), torch.arange(shape[1]), indexing="ij"))
    channel, token = (a, b) if shape[0] != TOKENS_PER_WARP else (b, a)
    lane, word, bit = position(a, b)
    fields = 32 // bits
    slots = torch.empty(TILE * columns, dtype=torch.int64)
    for w in range(WARPS):
        slot = ((w * 32 + lane) * words + word - first) * fields + bit // bits
        slots[slot] = (w * TOKENS_PER_WARP + token) * columns + channel
    return slots


_SLOTS: dict[tuple[str, torch.device], torch.Tensor] = {}


def _slots_on(plane: str, device: torch.device) -> torch.Tensor:
    key = (plane, torch.device(device))
    if key not in _SLOTS:
        _SLOTS[key] = _slots(plane).to(device)
    return _SLOTS[key]


def _spec_codes(plane: str, packed: torch.Tensor) -> torch.Tensor:
    bits = _PLANES[plane][2]
    return packing.unpack_fields(packed, bits, dim=-1 if plane == "value_payload" else -2)


def _spec_bytes(plane: str, codes: torch.Tensor) -> torch.Tensor:
    bits = _PLANES[plane][2]
    return packing.pack_fields(codes, bits, dim=-1 if plane == "value_payload" else -2)


def _check_region(planes: dict[str, torch.Tensor]) -> int:
    """The tokens the components hold, checked: whole tiles, each component's shape and dtype the spec's."""
    tokens = planes["value_payload"].shape[-2] if planes["value_payload"].dim() >= 2 else -1
    for name, t in planes.items():
        bits, columns = _PLANES[name][2], _PLANES[name][5]
        want = (tokens, columns * bits // 8) if name == "value_payload" else (tokens * bits // 8, columns)
        if t.dim() < 2 or tuple(t.shape[-2:]) != want or t.dtype != torch.uint8:
            raise ValueError(f"{name} must be uint8 [..., {want[0]}, {want[1]}] (the spec's bytes), got {t.dtype} "
                             f"{tuple(t.shape)}")  # fmt: skip
    if tokens % TILE:
        raise ValueError(f"value_payload must hold whole tiles of {TILE} tokens, got {tokens}")
    return tokens


def _each_plane(key_low: torch.Tensor, key_high: torch.Tensor, value_payload: torch.Tensor):
    """The tokens of a checked region, and per plane (name, bytes, bits per code, columns, the shifts of a word's
    fields)."""
    planes = {"key_low": key_low, "key_high": key_high, "value_payload": value_payload}
    tokens = _check_region(planes)
    return tokens, [
        (name, packed, _PLANES[name][2], _PLANES[name][5], torch.arange(0, 32, _PLANES[name][2], device=packed.device))
        for name, packed in planes.items()
    ]


def to_fragment_order(key_low: torch.Tensor, key_high: torch.Tensor, value_payload: torch.Tensor):
    """The spec's bytes of whole tiles (`reference.equations.packing` layouts, [..., rows, columns] per component) in
    fragment order, same shapes and dtype: what a cache's page flush stores. Device work only (no read back)."""
    tokens, planes = _each_plane(key_low, key_high, value_payload)
    out = []
    for name, packed, bits, columns, shifts in planes:
        lead = packed.shape[:-2]
        codes = _spec_codes(name, packed).reshape(*lead, tokens // TILE, TILE * columns)
        fields = codes[..., _slots_on(name, packed.device)].view(*lead, -1, 32 // bits).to(torch.int64)
        word = (fields << shifts).sum(-1)
        word = torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)
        out.append(word.view(torch.uint8).reshape(packed.shape))
    return tuple(out)


def to_spec_order(key_low: torch.Tensor, key_high: torch.Tensor, value_payload: torch.Tensor):
    """The inverse of `to_fragment_order`: a region stored in fragment order as the spec's bytes (new tensors)."""
    tokens, planes = _each_plane(key_low, key_high, value_payload)
    out = []
    for name, packed, bits, columns, shifts in planes:
        lead = packed.shape[:-2]
        word = packed.contiguous().view(torch.int32).reshape(*lead, -1).to(torch.int64) & 0xFFFFFFFF
        fields = ((word[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*lead, tokens // TILE, TILE * columns)
        codes = torch.empty_like(fields).index_copy_(-1, _slots_on(name, packed.device), fields)
        out.append(_spec_bytes(name, codes.reshape(*lead, tokens, columns).to(torch.uint8)))
    return tuple(out)
