"""Decode attention over a per-token precision cache (TriAxialKV, role-aware PN-Mix), as its paper
decodes: flash-decoding splits that each read one store of one bit width, merged by log-sum-exp.

The stores are those of `reference.tokens.config` (the spec's bytes): the low tokens' key pages
(packed along tokens, per-channel groups of G; role-aware PN-Mix's pairs in a high plane), the
leftover and high tokens' keys and every value per token (packed along channels, groups of G
channels). Each store gets its own splits (`load_tile` reads both layouts), so a split never mixes
bit widths; `attention._merge_kernel` merges every split.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pnmix import _runtime
from pnmix.kernels.attention import (
    default_splits,
    dot_dtype,
    merge,
    pair_slots,
    partials,
)
from pnmix.kernels.common import LOG2E, chunk, dot_f32, headroom, load_tile, online_softmax
from reference.tokens.config import TokenPrecisionConfig

#: The stores in split order: (key store, value store, offset of its first value row in the value store).
SEGMENTS = tl.constexpr(3)


@triton.jit
def _segment(
    q_dot,
    m_i,
    l_i,
    acc,
    last_visible,
    sub,
    n_sub,
    n_rows,
    pos_ptr,
    cols,
    col_ok,
    d,
    qk_scale,
    k_ptr,
    kh_ptr,
    slot,
    ks_ptr,
    kz_ptr,
    v_ptr,
    vs_ptr,
    vz_ptr,
    v_first,
    k_row,
    v_row,
    n_boost,
    PAGED: tl.constexpr,
    G: tl.constexpr,
    B_K: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    B_HI: tl.constexpr,
    B_V: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The online softmax over this split's share of one store: m_i, l_i, acc updated."""
    lo, hi = chunk(sub, n_sub, n_rows, BLOCK_N)
    tok = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        t = start + tok
        ok = t < hi
        rows = tl.where(ok, t, -1)
        if PAGED:  # packed along tokens, per-channel groups of G tokens
            k = load_tile(
                rows,
                cols,
                col_ok[None, :],
                0,
                n_rows,
                k_ptr,
                k_ptr,
                k_ptr,
                kh_ptr,
                slot,
                ks_ptr,
                kz_ptr,
                k_ptr,
                d,
                d,
                n_boost,
                0,
                0,
                k_ptr,
                n_boost,
                True,
                True,
                G,
                G,
                B_K,
                HAS_HIGH,
                B_HI,
                False,
            )
        else:  # packed along channels, per-token groups of G channels
            k = load_tile(
                rows,
                cols,
                col_ok[None, :],
                0,
                n_rows,
                k_ptr,
                k_ptr,
                k_ptr,
                k_ptr,
                slot,
                ks_ptr,
                kz_ptr,
                k_ptr,
                d,
                0,
                0,
                k_row,
                d // G,
                k_ptr,
                0,
                False,
                True,
                G,
                G,
                B_K,
                False,
                1,
                False,
            )
        e = headroom(tl.max(tl.max(tl.abs(k), axis=1), axis=0), DOT)  # dequantized keys may pass 65504
        logits = tl.dot(q_dot, tl.trans((k * (1.0 / e)).to(DOT))) * (qk_scale * e)
        position = tl.load(pos_ptr + t, mask=ok, other=-1)
        p, alpha, l_i, m_i = online_softmax(logits, position, last_visible, m_i, l_i, CAUSAL, DOT)
        v = load_tile(
            tl.where(ok, v_first + t, -1),
            cols,
            col_ok[None, :],
            0,
            v_first + n_rows,
            v_ptr,
            v_ptr,
            v_ptr,
            v_ptr,
            slot,
            vs_ptr,
            vz_ptr,
            v_ptr,
            d,
            0,
            0,
            v_row,
            d // G,
            v_ptr,
            0,
            False,
            True,
            G,
            G,
            B_V,
            False,
            1,
            False,
        )
        e = headroom(tl.max(tl.max(tl.abs(v), axis=1), axis=0), DOT)
        acc = acc * alpha[:, None] + dot_f32(p, (v * (1.0 / e)).to(DOT), DOT) * e
    return m_i, l_i, acc


@triton.jit
def _token_split_kernel(
    q_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    pos_ptr,
    pk_ptr,
    ph_ptr,
    mask_ptr,
    pks_ptr,
    pkz_ptr,
    lk_ptr,
    lks_ptr,
    lkz_ptr,
    hk_ptr,
    hks_ptr,
    hkz_ptr,
    lv_ptr,
    lvs_ptr,
    lvz_ptr,
    hv_ptr,
    hvs_ptr,
    hvz_ptr,
    n_grouped,
    n_leftover,
    n_high,
    t_new,
    n_rep,
    n_kv,
    d,
    qk_scale,
    n_sub,
    s_pk,
    s_ph,
    s_mask,
    s_pks,
    s_lk,
    s_lks,
    s_hk,
    s_hks,
    s_lv,
    s_lvs,
    s_hv,
    s_hvs,
    n_boost,
    ADJACENT: tl.constexpr,
    G: tl.constexpr,
    B_PLO: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    B_PHI: tl.constexpr,
    B_LOW: tl.constexpr,
    B_HIGH: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Partial attention of one (sequence, KV head) over one split of one store: splits 0 .. n_sub - 1
    read the low key pages, the next n_sub the leftover, the last n_sub the high tokens."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    seg = split // n_sub
    sub = split % n_sub
    b = bh // n_kv
    h = bh % n_kv
    n_real = n_rep * t_new
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < n_real
    j = rows % t_new
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < d
    q_rows = ((b * n_rep * n_kv + h * n_rep + rows // t_new) * t_new + j) * d
    q = tl.load(q_ptr + q_rows[:, None] + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    q_dot = q.to(DOT)
    length = n_grouped + n_leftover + n_high
    last_visible = length - t_new + j
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    slot = pair_slots(mask_ptr + bh * s_mask, cols, col_ok, d, ADJACENT, HAS_HIGH)
    qk = qk_scale
    if seg == 0:
        m_i, l_i, acc = _segment(
            q_dot,
            m_i,
            l_i,
            acc,
            last_visible,
            sub,
            n_sub,
            n_grouped,
            pos_ptr,
            cols,
            col_ok,
            d,
            qk,
            pk_ptr + bh * s_pk,
            ph_ptr + bh * s_ph,
            slot,
            pks_ptr + bh * s_pks,
            pkz_ptr + bh * s_pks,
            lv_ptr + bh * s_lv,
            lvs_ptr + bh * s_lvs,
            lvz_ptr + bh * s_lvs,
            0,
            d,
            d * B_LOW // 8,
            n_boost,
            True,
            G,
            B_PLO,
            HAS_HIGH,
            B_PHI,
            B_LOW,
            CAUSAL,
            DOT,
            BLOCK_N,
        )
    elif seg == 1:
        m_i, l_i, acc = _segment(
            q_dot,
            m_i,
            l_i,
            acc,
            last_visible,
            sub,
            n_sub,
            n_leftover,
            pos_ptr + n_grouped,
            cols,
            col_ok,
            d,
            qk,
            lk_ptr + bh * s_lk,
            lk_ptr,
            slot,
            lks_ptr + bh * s_lks,
            lkz_ptr + bh * s_lks,
            lv_ptr + bh * s_lv,
            lvs_ptr + bh * s_lvs,
            lvz_ptr + bh * s_lvs,
            n_grouped,
            d * B_HIGH // 8,
            d * B_LOW // 8,
            0,
            False,
            G,
            B_HIGH,
            False,
            1,
            B_LOW,
            CAUSAL,
            DOT,
            BLOCK_N,
        )
    else:
        m_i, l_i, acc = _segment(
            q_dot,
            m_i,
            l_i,
            acc,
            last_visible,
            sub,
            n_sub,
            n_high,
            pos_ptr + n_grouped + n_leftover,
            cols,
            col_ok,
            d,
            qk,
            hk_ptr + bh * s_hk,
            hk_ptr,
            slot,
            hks_ptr + bh * s_hks,
            hkz_ptr + bh * s_hks,
            hv_ptr + bh * s_hv,
            hvs_ptr + bh * s_hvs,
            hvz_ptr + bh * s_hvs,
            0,
            d * B_HIGH // 8,
            d * B_HIGH // 8,
            0,
            False,
            G,
            B_HIGH,
            False,
            1,
            B_HIGH,
            CAUSAL,
            DOT,
            BLOCK_N,
        )
    out = (bh * (SEGMENTS * n_sub) + split) * n_real + rows
    tl.store(m_ptr + out, m_i, mask=row_ok)
    tl.store(l_ptr + out, l_i, mask=row_ok)
    tl.store(acc_ptr + out[:, None] * d + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


def _stride(t: torch.Tensor) -> int:
    return t.stride(1)


def token_decode_attention(
    q: torch.Tensor,
    stored: dict[str, torch.Tensor],
    positions: torch.Tensor,
    counts: tuple[int, int, int],
    config: TokenPrecisionConfig,
    *,
    scale: float | None = None,
    num_splits: int | None = None,
    block_n: int = 16,
) -> torch.Tensor:
    """Causal attention of q [B, H, T_new, d] (the last T_new positions) over a per-token precision cache.

    stored: the cache's tensors by the names of `reference.tokens.config.PARTS`; positions: int32 [T]
    on q's device, the token position of every stored row, the low key pages' rows first, then the
    leftover's, then the high tokens'; counts: (grouped, leftover, high) rows.
    """
    batch, n_heads, t_new, d = q.shape
    n_kv = stored["high_key"].shape[1]
    n_rep = n_heads // n_kv
    rows = n_rep * t_new
    low = config.low_key_config
    n_boost = stored["low_key_high"].shape[-1]
    has_high = low.b_high > low.b_low and n_boost > 0
    q = q.contiguous()
    n_sub = num_splits or default_splits(batch * n_kv * SEGMENTS.value, max(counts), block_n)
    splits = SEGMENTS.value * n_sub
    m, l_sum, acc = partials(batch * n_kv * splits * rows, d, q.device)
    dot = dot_dtype(q.dtype)
    s = {name: t.contiguous() for name, t in stored.items()}
    block_d = max(16, triton.next_power_of_2(d))
    _runtime.launch(
        _token_split_kernel,
        (batch * n_kv, splits),
        q,
        m,
        l_sum,
        acc,
        positions,
        s["low_key_low"],
        s["low_key_high"],
        s["pair_mask"],
        s["low_key_scale"],
        s["low_key_zero"],
        s["leftover_key"],
        s["leftover_key_scale"],
        s["leftover_key_zero"],
        s["high_key"],
        s["high_key_scale"],
        s["high_key_zero"],
        s["low_value"],
        s["low_value_scale"],
        s["low_value_zero"],
        s["high_value"],
        s["high_value_scale"],
        s["high_value_zero"],
        *counts,
        t_new,
        n_rep,
        n_kv,
        d,
        LOG2E * (1.0 / math.sqrt(d) if scale is None else scale),
        n_sub,
        *(
            _stride(s[n])
            for n in (
                "low_key_low",
                "low_key_high",
                "pair_mask",
                "low_key_scale",
                "leftover_key",
                "leftover_key_scale",
                "high_key",
                "high_key_scale",
                "low_value",
                "low_value_scale",
                "high_value",
                "high_value_scale",
            )
        ),
        n_boost,
        ADJACENT=config.pair_layout == "adjacent",
        G=config.group_size,
        B_PLO=low.b_low,
        HAS_HIGH=has_high,
        B_PHI=(low.b_high - low.b_low) if has_high else 1,
        B_LOW=config.low_bits,
        B_HIGH=config.high_bits,
        CAUSAL=t_new > 1,
        DOT=dot,
        BLOCK_M=max(16, triton.next_power_of_2(rows)),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        num_warps=4,
        num_stages=1,
    )
    return merge(m, l_sum, acc, q, n_kv, splits)


__all__ = ["token_decode_attention"]
