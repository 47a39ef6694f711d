"""Quantize+pack and unpack+dequantize kernels, generic over which axis is grouped and packed.

Every tensor is seen per (batch, head) as a 2-D plane of positions (the grouped / packed axis)
by columns: keys group and pack along tokens with channels as columns; values group and pack
along channels with tokens as columns. One kernel of each kind serves key low plane, key high
plane (salient columns through an index map) and values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pnmix import _runtime  # sets TRITON_INTERPRET before the kernels below are decorated
from pnmix.kernels.common import encode, eq2_eq7_params, round_to, unpack_field
from reference.equations.packing import bit_planes, block_positions


@triton.jit
def _group_params_kernel(
    x_ptr,
    scale_ptr,
    zero_ptr,
    bits_ptr,
    n_cols,
    sx_bh,
    sx_pos,
    sx_col,
    sp_bh,
    sp_grp,
    sp_col,
    sb_bh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BITS: tl.constexpr,
    MIDPOINT: tl.constexpr,
):
    bh, g, cb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs = tl.arange(0, BLOCK_G)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    ok = (offs < GROUP)[:, None] & col_ok[None, :]
    pos = g * GROUP + offs
    ptrs = x_ptr + bh * sx_bh + pos[:, None] * sx_pos + cols[None, :] * sx_col
    x = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    xmin = tl.min(tl.where(ok, x, float("inf")), axis=0) + 0.0  # + 0.0: -0.0 reads as +0.0
    xmax = tl.max(tl.where(ok, x, float("-inf")), axis=0) + 0.0
    xmin, xmax = tl.where(col_ok, xmin, 0.0), tl.where(col_ok, xmax, 0.0)  # no inf - inf off the edge
    if BITS > 0:
        bits = tl.full([BLOCK_C], BITS, tl.int32)
    else:
        bits = tl.load(bits_ptr + bh * sb_bh + cols, mask=col_ok, other=1).to(tl.int32)
    scale, zero = eq2_eq7_params(xmin, xmax, bits, MIDPOINT)
    out = bh * sp_bh + g * sp_grp + cols * sp_col
    tl.store(scale_ptr + out, round_to(scale, scale_ptr.dtype.element_ty), mask=col_ok)
    tl.store(zero_ptr + out, round_to(zero, zero_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _encode_pack_kernel(
    x_ptr,
    scale_ptr,
    zero_ptr,
    bits_ptr,
    colmap_ptr,
    out_ptr,
    n_rows,
    n_cols,
    sx_bh,
    sx_pos,
    sx_col,
    sp_bh,
    sp_grp,
    sp_col,
    sb_bh,
    sm_bh,
    so_bh,
    so_row,
    so_col,
    GROUP: tl.constexpr,
    WIDTH: tl.constexpr,
    SHIFT: tl.constexpr,
    PLANE_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    PLANE_START: tl.constexpr,
    BITS: tl.constexpr,
    USE_COLMAP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    bh, rb, cb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    ok = (rows < n_rows)[:, None] & col_ok[None, :]
    if USE_COLMAP:
        chan = tl.load(colmap_ptr + bh * sm_bh + cols, mask=col_ok, other=0)
    else:
        chan = cols
    if BITS > 0:
        bits = tl.full([BLOCK_C], BITS, tl.int32)
    else:
        bits = tl.load(bits_ptr + bh * sb_bh + chan, mask=col_ok, other=1).to(tl.int32)
    per: tl.constexpr = 8 // WIDTH
    byte = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.int32)
    for i in tl.static_range(per):
        pos = rows * per + i
        x = tl.load(x_ptr + bh * sx_bh + pos[:, None] * sx_pos + chan[None, :] * sx_col, mask=ok, other=0.0)
        p_off = bh * sp_bh + (pos // GROUP)[:, None] * sp_grp + chan[None, :] * sp_col
        s = tl.load(scale_ptr + p_off, mask=ok, other=0.0).to(tl.float32)
        z = tl.load(zero_ptr + p_off, mask=ok, other=0.0).to(tl.float32)
        code = encode(x.to(tl.float32), s, z, bits[None, :])
        byte = byte | (((code >> SHIFT) & ((1 << WIDTH) - 1)) << (i * WIDTH))
    # Row `rows` of this plane sits in block rows // PLANE_ROWS of the field, after the wider planes.
    out_row = (rows // PLANE_ROWS) * BLOCK_ROWS + PLANE_START + rows % PLANE_ROWS
    tl.store(out_ptr + bh * so_bh + out_row[:, None] * so_row + cols[None, :] * so_col, byte.to(tl.uint8), mask=ok)


@triton.jit
def _dequantize_kernel(
    low_ptr,
    high_ptr,
    slot_ptr,
    scale_ptr,
    zero_ptr,
    out_ptr,
    n_pos,
    n_cols,
    sl_bh,
    sl_row,
    sl_col,
    sh_bh,
    sh_row,
    ss_bh,
    sp_bh,
    sp_grp,
    sp_col,
    so_bh,
    so_pos,
    so_col,
    GROUP: tl.constexpr,
    B_LO: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    B_HI: tl.constexpr,
    CODES: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    bh, pb, cb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pos = (pb * BLOCK_P + tl.arange(0, BLOCK_P))[:, None]
    cols = (cb * BLOCK_C + tl.arange(0, BLOCK_C))[None, :]
    ok = (pos < n_pos) & (cols < n_cols)
    code = unpack_field(low_ptr + bh * sl_bh, pos, cols * sl_col, sl_row, ok, B_LO)
    if HAS_HIGH:
        slot = tl.load(slot_ptr + bh * ss_bh + cols, mask=cols < n_cols, other=-1)
        hi_ok = ok & (slot >= 0)
        code = code | (unpack_field(high_ptr + bh * sh_bh, pos, slot, sh_row, hi_ok, B_HI) << B_LO)
    out = out_ptr + bh * so_bh + pos * so_pos + cols * so_col
    if CODES:
        tl.store(out, code.to(tl.uint8), mask=ok)
    else:
        p_off = bh * sp_bh + (pos // GROUP) * sp_grp + cols * sp_col
        s = tl.load(scale_ptr + p_off, mask=ok, other=0.0).to(tl.float32)
        z = tl.load(zero_ptr + p_off, mask=ok, other=0.0).to(tl.float32)
        tl.store(out, s * code.to(tl.float32) + z, mask=ok)


# -- host side ---------------------------------------------------------------------------

_PLANE = {"tokens": (2, 3), "channels": (3, 2)}  # (grouped/packed dim, column dim) of [B, H, T, d]


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(max(int(n), 1)))


def _bh_stride(t: torch.Tensor) -> int:
    """Stride of one (batch, head) step; [B, H, ...] must be uniformly strided over B and H."""
    if t.shape[0] > 1 and t.shape[1] > 0 and t.stride(0) != t.shape[1] * t.stride(1):
        raise ValueError("[B, H, ...] tensors must be strided uniformly over batch and heads")
    return t.stride(1)


def group_params(
    x: torch.Tensor,
    group: int,
    along: str,
    bits: int | torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    midpoint: bool = True,
) -> None:
    """Write Eq. 2 / Eq. 7 scale and zero of x [B, H, T, d] grouped `along` tokens or channels.

    bits: an int, or int32 [B, H, d] per channel (keys). scale, zero: [B, H, n_groups, d]
    (tokens) or [B, H, T, d / group] (channels), possibly views into larger buffers.
    midpoint: 1-bit groups use Eq. 7 (PN-Mix) rather than Eq. 2 (KIVI).
    """
    pos_dim, col_dim = _PLANE[along]
    n_pos, n_cols = x.shape[pos_dim], x.shape[col_dim]
    n_groups = n_pos // group
    if n_groups == 0 or n_cols == 0:
        return
    per_channel = isinstance(bits, torch.Tensor)
    grp_dim, pcol_dim = (2, 3) if along == "tokens" else (3, 2)
    block_c = min(_pow2(n_cols), 64)
    grid = (x.shape[0] * x.shape[1], n_groups, triton.cdiv(n_cols, block_c))
    _runtime.launch(
        _group_params_kernel,
        grid,
        x,
        scale,
        zero,
        bits if per_channel else x,
        n_cols,
        _bh_stride(x),
        x.stride(pos_dim),
        x.stride(col_dim),
        _bh_stride(scale),
        scale.stride(grp_dim),
        scale.stride(pcol_dim),
        bits.stride(1) if per_channel else 0,
        GROUP=group,
        BLOCK_G=_pow2(group),
        BLOCK_C=block_c,
        BITS=0 if per_channel else int(bits),
        MIDPOINT=midpoint,
        num_warps=4,
    )


def encode_pack(
    x: torch.Tensor,
    group: int,
    along: str,
    bits: int | torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    out: torch.Tensor,
    *,
    field_bits: int,
    shift: int = 0,
    colmap: torch.Tensor | None = None,
) -> None:
    """Encode x with its stored scale/zero and pack bits [shift, shift + field_bits) of each code.

    out: [B, H, rows, cols] uint8 with rows = n_pos * field_bits / 8 along `along`, in the bit-plane
    layout of `reference.equations.packing` (one launch per plane); with colmap (int32 [B, H, n]) column j of
    out holds x's column colmap[..., j] (the key high plane).
    """
    pos_dim, col_dim = _PLANE[along]
    n_pos = x.shape[pos_dim]
    n_cols = colmap.shape[-1] if colmap is not None else x.shape[col_dim]
    if n_pos == 0 or n_cols == 0 or field_bits == 0:
        return
    block = block_positions(field_bits)
    if n_pos % block:
        raise ValueError(f"{n_pos} positions do not fill whole blocks of {block} for {field_bits}-bit fields")
    per_channel = isinstance(bits, torch.Tensor)
    grp_dim, pcol_dim = (2, 3) if along == "tokens" else (3, 2)
    orow_dim, ocol_dim = (2, 3) if along == "tokens" else (3, 2)
    block_c = min(_pow2(n_cols), 64)
    low = 0
    for width in bit_planes(field_bits):
        n_rows = n_pos * width // 8
        block_r = min(_pow2(n_rows), 32)
        grid = (x.shape[0] * x.shape[1], triton.cdiv(n_rows, block_r), triton.cdiv(n_cols, block_c))
        _runtime.launch(
            _encode_pack_kernel,
            grid,
            x,
            scale,
            zero,
            bits if per_channel else x,
            colmap if colmap is not None else x,
            out,
            n_rows,
            n_cols,
            _bh_stride(x),
            x.stride(pos_dim),
            x.stride(col_dim),
            _bh_stride(scale),
            scale.stride(grp_dim),
            scale.stride(pcol_dim),
            bits.stride(1) if per_channel else 0,
            colmap.stride(1) if colmap is not None else 0,
            _bh_stride(out),
            out.stride(orow_dim),
            out.stride(ocol_dim),
            GROUP=group,
            WIDTH=width,
            SHIFT=shift + low,
            PLANE_ROWS=block * width // 8,
            BLOCK_ROWS=block * field_bits // 8,
            PLANE_START=block * low // 8,
            BITS=0 if per_channel else int(bits),
            USE_COLMAP=colmap is not None,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            num_warps=8,  # 4 warps spill at 8 fields
        )
        low += width


def dequantize_plane(
    low: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    out: torch.Tensor,
    *,
    group: int,
    along: str,
    low_bits: int,
    high: torch.Tensor | None = None,
    high_bits: int = 0,
    slot: torch.Tensor | None = None,
    codes: bool = False,
) -> None:
    """Unpack codes (and, unless codes=True, dequantize s * q + z in float32) into out [B, H, T, d].

    high / slot: the key high plane and the int32 [B, H, d] map from channel to its column in
    it (-1 for channels without high bits).
    """
    pos_dim, col_dim = _PLANE[along]
    n_pos, n_cols = out.shape[pos_dim], out.shape[col_dim]
    if n_pos == 0 or n_cols == 0:
        return
    has_high = high is not None and high_bits > 0 and high.shape[-1] > 0
    lrow_dim, lcol_dim = (2, 3) if along == "tokens" else (3, 2)
    grp_dim, pcol_dim = (2, 3) if along == "tokens" else (3, 2)
    block_c = min(_pow2(n_cols), 64)
    block_p = min(_pow2(n_pos), 32)
    grid = (out.shape[0] * out.shape[1], triton.cdiv(n_pos, block_p), triton.cdiv(n_cols, block_c))
    _runtime.launch(
        _dequantize_kernel,
        grid,
        low,
        high if has_high else low,
        slot if has_high else low,
        scale,
        zero,
        out,
        n_pos,
        n_cols,
        _bh_stride(low),
        low.stride(lrow_dim),
        low.stride(lcol_dim),
        _bh_stride(high) if has_high else 0,
        high.stride(2) if has_high else 0,
        slot.stride(1) if has_high else 0,
        _bh_stride(scale),
        scale.stride(grp_dim),
        scale.stride(pcol_dim),
        _bh_stride(out),
        out.stride(pos_dim),
        out.stride(col_dim),
        GROUP=group,
        B_LO=low_bits,
        HAS_HIGH=has_high,
        B_HI=high_bits if has_high else 1,
        CODES=codes,
        BLOCK_P=block_p,
        BLOCK_C=block_c,
        num_warps=4,
    )


__all__ = ["dequantize_plane", "encode_pack", "group_params"]
