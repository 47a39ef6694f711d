"""Fused split-K decode attention over [sinks | packed quantized region | residual].

One program per (sequence, KV head, split) loads each K/V tile once for all the query heads
of its GQA group (and all new query positions), dequantizes quantized tiles in registers,
and keeps an online softmax in float32; a second kernel merges the splits with their
log-sum-exp. Neither dequantized K/V nor the logits matrix is written to global memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference.config import field_width
from reference.layout import CacheLayout, TokenLayout

from .. import _runtime
from .common import round_to, unpack_field


@triton.jit
def _load_tile(
    pos, cols, d_ok, n_sink, n_q,
    sink_ptr, res_ptr, low_ptr, high_ptr, slot, scale_ptr, zero_ptr, dense_ptr,
    d, lo_row, hi_row, v_row, v_groups, rank_ptr, n_boost,
    IS_KEY: tl.constexpr, QUANT: tl.constexpr, G: tl.constexpr, VG: tl.constexpr,
    W_LO: tl.constexpr, B_LO: tl.constexpr, HAS_HIGH: tl.constexpr, W_HI: tl.constexpr, B_HI: tl.constexpr,
    PAGE_RANKS: tl.constexpr,
):  # fmt: skip
    """A [BLOCK_N, BLOCK_D] float32 tile of keys or values at positions pos (-1 = none).

    The high-plane column of each channel is `slot` (one selection for all tokens), or with
    PAGE_RANKS comes from the per-page rank table (Kitty), row by row.
    """
    p = pos[:, None]
    c = cols[None, :]
    in_sink = (p >= 0) & (p < n_sink) & d_ok
    in_q = (p >= n_sink) & (p < n_sink + n_q) & d_ok
    in_res = (p >= n_sink + n_q) & d_ok
    x = tl.load(sink_ptr + p * d + c, mask=in_sink, other=0.0).to(tl.float32)
    x += tl.load(res_ptr + (p - n_sink - n_q) * d + c, mask=in_res, other=0.0).to(tl.float32)
    qp = tl.where(in_q, p - n_sink, 0)
    if QUANT:
        if IS_KEY:  # packed along tokens; per-channel groups of G tokens
            code = unpack_field(low_ptr, qp, c, lo_row, in_q, W_LO, B_LO)
            if HAS_HIGH:
                if PAGE_RANKS:
                    rank = tl.load(rank_ptr + (qp // G) * d + c, mask=in_q, other=255).to(tl.int32)
                    col = tl.where(rank < n_boost, rank, -1)
                else:
                    col = slot[None, :]
                hi_ok = in_q & (col >= 0)
                code = code | (unpack_field(high_ptr, qp, col, hi_row, hi_ok, W_HI, B_HI) << B_LO)
            p_off = (qp // G) * d + c
        else:  # packed along channels; per-token groups of VG channels
            code = unpack_field(low_ptr, c, qp * v_row, 1, in_q, W_LO, B_LO)
            p_off = qp * v_groups + c // VG
        s = tl.load(scale_ptr + p_off, mask=in_q, other=0.0).to(tl.float32)
        z = tl.load(zero_ptr + p_off, mask=in_q, other=0.0).to(tl.float32)
        x += tl.where(in_q, s * code.to(tl.float32) + z, 0.0)
    else:
        x += tl.load(dense_ptr + qp * d + c, mask=in_q, other=0.0).to(tl.float32)
    return x


@triton.jit
def _split_kernel(
    q_ptr, m_ptr, l_ptr, acc_ptr,
    sk_ptr, sv_ptr, rk_ptr, rv_ptr, klo_ptr, khi_ptr, mask_ptr, ks_ptr, kz_ptr, vp_ptr, vs_ptr, vz_ptr,
    n_sink, n_q, length, t_new, n_rep, n_kv, d, sm_scale, split_len, n_splits,
    s_sink, s_res, s_klo, s_khi, s_mask, s_ks, s_vp, s_vs, hi_row, v_row, v_groups, n_boost,
    ADJACENT: tl.constexpr, PAGE_RANKS: tl.constexpr,
    G: tl.constexpr, VG: tl.constexpr, W_LO: tl.constexpr, B_LO: tl.constexpr, HAS_HIGH: tl.constexpr,
    W_HI: tl.constexpr, B_HI: tl.constexpr, V_QUANT: tl.constexpr, W_V: tl.constexpr, B_V: tl.constexpr,
    DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // n_kv
    h = bh % n_kv
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < n_rep * t_new
    head = h * n_rep + rows // t_new
    j = rows % t_new
    cols = tl.arange(0, BLOCK_D)
    d_ok = cols[None, :] < d
    q_off = ((b * n_rep * n_kv + head) * t_new + j) * d
    q = tl.load(q_ptr + q_off[:, None] + cols[None, :], mask=row_ok[:, None] & d_ok, other=0.0).to(DOT)
    if PAGE_RANKS:
        slot = tl.full([BLOCK_D], -1, tl.int32)  # unused: columns come from the page rank table
    else:
        # Column of each salient channel in the high plane, from the bit-packed pair mask alone.
        pair = tl.where(ADJACENT, cols // 2, cols % (d // 2))
        mask_byte = tl.load(mask_ptr + bh * s_mask + pair // 8, mask=(cols < d) & HAS_HIGH, other=0).to(tl.int32)
        salient = ((mask_byte >> (pair % 8)) & 1) * (cols < d).to(tl.int32)
        slot = tl.where(salient == 1, tl.cumsum(salient, axis=0) - 1, -1)
    last_visible = length - t_new + j  # causal: query j sees positions 0 .. last_visible
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, length)
    for block in range(start, end, BLOCK_N):
        pos = block + tl.arange(0, BLOCK_N)
        pos = tl.where(pos < end, pos, -1)
        k = _load_tile(
            pos, cols, d_ok, n_sink, n_q, sk_ptr + bh * s_sink, rk_ptr + bh * s_res, klo_ptr + bh * s_klo,
            khi_ptr + bh * s_khi, slot, ks_ptr + bh * s_ks, kz_ptr + bh * s_ks, klo_ptr, d, d, hi_row, 0, 0,
            mask_ptr + bh * s_mask, n_boost, True, True, G, VG, W_LO, B_LO, HAS_HIGH, W_HI, B_HI, PAGE_RANKS,
        )  # fmt: skip
        logits = tl.dot(q, tl.trans(k.to(DOT))) * sm_scale
        visible = (pos[None, :] >= 0) & (pos[None, :] <= last_visible[:, None])
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(logits - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _load_tile(
            pos, cols, d_ok, n_sink, n_q, sv_ptr + bh * s_sink, rv_ptr + bh * s_res, vp_ptr + bh * s_vp,
            vp_ptr, slot, vs_ptr + bh * s_vs, vz_ptr + bh * s_vs, vp_ptr + bh * s_vp, d, 0, 0, v_row, v_groups,
            vp_ptr, 0, False, V_QUANT, G, VG, W_V, B_V, False, 1, 1, False,
        )  # fmt: skip
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT))
        m_i = m_new
    out = (bh * n_splits + split) * BLOCK_M + rows
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)
    tl.store(acc_ptr + out[:, None] * BLOCK_D + cols[None, :], acc)


@triton.jit
def _merge_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, n_splits, t_new, n_rep, n_kv, d,
    BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0)
    row = tl.program_id(1)
    b = bh // n_kv
    h = bh % n_kv
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < n_splits
    idx = (bh * n_splits + splits) * BLOCK_M + row
    m = tl.load(m_ptr + idx, mask=s_ok, other=float("-inf"))
    l_s = tl.load(l_ptr + idx, mask=s_ok, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.where(s_ok & (m > float("-inf")), tl.exp(m - m_all), 0.0)
    cols = tl.arange(0, BLOCK_D)
    acc = tl.load(acc_ptr + idx[:, None] * BLOCK_D + cols[None, :], mask=s_ok[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    head = h * n_rep + row // t_new
    j = row % t_new
    dst = out_ptr + ((b * n_rep * n_kv + head) * t_new + j) * d + cols
    tl.store(dst, round_to(o, out_ptr.dtype.element_ty), mask=cols < d)


@dataclass(frozen=True)
class PackedRegion:
    """What decode attention reads for one layer: every component of the cache's
    `reference.layout.CacheLayout` by name (whole buffers or views; the kernels read them by
    position), and `tokens`, the (n_sink, n_quantized, n_residual) tokens they hold.

    counts: the same three numbers as an int32 tensor on the kernels' device, which the kernels
    read (so a captured CUDA graph replays with the lengths of the moment, not of the capture);
    None builds it from `tokens`. capacity: the most tokens the buffers can hold (preallocated
    caches), which fixes the launch grid across steps; None sizes the grid from `tokens`.
    """

    tensors: Mapping[str, torch.Tensor]
    tokens: TokenLayout
    counts: torch.Tensor | None = None
    capacity: int | None = None


def _stride(t: torch.Tensor) -> int:
    return t.stride(1)


def default_splits(work_items: int, length: int, block_n: int) -> int:
    """Enough splits that batch * KV heads * splits covers the GPU twice over (flash-decoding)."""
    if _runtime.INTERPRETED:
        return max(1, min(4, triton.cdiv(length, block_n)))
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    want = max(1, triton.cdiv(2 * sms, max(work_items, 1)))
    return max(1, min(want, triton.cdiv(length, 4 * block_n)))


def decode_attention(
    q: torch.Tensor,
    region: PackedRegion,
    layout: CacheLayout,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Causal attention of q [B, H, T_new, d] (the last T_new positions) over the packed cache.

    The layout says how the region is stored (bits, group sizes, pair layout, the selection's
    metadata format); num_splits and block_n only tune the launch.
    """
    batch, n_heads, t_new, d = q.shape
    cfg, t = layout.config, region.tokens
    n_kv, length = layout.kv_heads, t.length
    n_rep = n_heads // n_kv
    q = q.contiguous()
    block_m = max(16, triton.next_power_of_2(n_rep * t_new))
    block_d = max(16, triton.next_power_of_2(d))
    block_n = block_n or (16 if _runtime.INTERPRETED else 64)
    splits = num_splits or default_splits(batch * n_kv, length, block_n)
    split_len = triton.cdiv(triton.cdiv(length, splits), block_n) * block_n
    splits = triton.cdiv(length, split_len)
    dev = q.device
    m = torch.empty(batch * n_kv * splits * block_m, device=dev, dtype=torch.float32)
    l_sum = torch.empty_like(m)
    acc = torch.empty(batch * n_kv * splits * block_m, block_d, device=dev, dtype=torch.float32)
    dot = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[q.dtype]
    if dot is tl.bfloat16 and _runtime.INTERPRETED:
        dot = tl.float32  # the interpreter's bfloat16 tl.dot is wrong; float32 is exact there
    r = region.tensors
    v_quant = cfg.values_quantized
    value_group = cfg.value_group(d)
    has_high = cfg.b_high > cfg.b_low and layout.n_high_channels > 0
    vs, vz = (r["value_scale"], r["value_zero"]) if v_quant else (r["value_payload"], r["value_payload"])
    _split_kernel[(batch * n_kv, splits)](
        q, m, l_sum, acc,
        r["sink_key"], r["sink_value"], r["residual_key"], r["residual_value"], r["key_low"], r["key_high"],
        r["mask"], r["key_scale"], r["key_zero"], r["value_payload"], vs, vz,
        t.n_sink, t.n_quantized, length, t_new, n_rep, n_kv, d, 1.0 / math.sqrt(d), split_len, splits,
        _stride(r["sink_key"]), _stride(r["residual_key"]), _stride(r["key_low"]), _stride(r["key_high"]),
        _stride(r["mask"]), _stride(r["key_scale"]), _stride(r["value_payload"]), _stride(vs) if v_quant else 0,
        r["key_high"].stride(2), r["value_payload"].stride(2), d // value_group, layout.n_high_channels,
        ADJACENT=cfg.pair_layout == "adjacent", PAGE_RANKS=layout.selection.metadata == "page-ranks",
        G=cfg.group_size, VG=value_group, W_LO=field_width(cfg.b_low), B_LO=cfg.b_low, HAS_HIGH=has_high,
        W_HI=field_width(cfg.b_high - cfg.b_low) if has_high else 1, B_HI=(cfg.b_high - cfg.b_low) if has_high else 1,
        V_QUANT=v_quant, W_V=field_width(cfg.value_bits) if v_quant else 8, B_V=cfg.value_bits if v_quant else 8,
        DOT=dot, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
    )  # fmt: skip
    out = torch.empty_like(q)
    _merge_kernel[(batch * n_kv, n_rep * t_new)](
        m, l_sum, acc, out, splits, t_new, n_rep, n_kv, d,
        BLOCK_S=triton.next_power_of_2(splits), BLOCK_M=block_m, BLOCK_D=block_d,
    )  # fmt: skip
    return out
