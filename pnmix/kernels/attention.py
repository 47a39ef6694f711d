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

from pnmix import _runtime
from pnmix.kernels import ptx, ptx_unpack
from pnmix.kernels.common import (
    LOG2E,
    chunk,
    dot_f32,
    headroom,
    load_tile,
    mma,
    online_softmax,
    round_to,
    saturate,
    unpack_field,
)
from pnmix.kernels.unpack import TORCH_DTYPES, field_codes
from pnmix.kernels.unpack import code_to as _code_to
from pnmix.perfmodel import splits_for
from reference.channels.layout import CacheLayout, TokenLayout
from reference.equations.packing import bit_planes


@triton.jit
def _dot_wide(a, scale, b, e, DOT: tl.constexpr, SWAP: tl.constexpr = False):
    """`dot_f32` of a * scale[None, :], whose entries may pass float16's range, divided by the headroom
    exponent e (`headroom` of a bound on |a * scale|) and the product multiplied back."""
    return dot_f32(a * scale[None, :] * (1.0 / e), b, DOT, SWAP) * e


@triton.jit
def _vector(ptr, n, BLOCK: tl.constexpr):
    """ptr[0:BLOCK] as float32 (0 from n on)."""
    idx = tl.arange(0, BLOCK)
    return tl.load(ptr + idx, mask=idx < n, other=0.0).to(tl.float32)


@triton.jit
def _stored(ptr, n, BLOCK: tl.constexpr):
    """ptr[0:BLOCK] as stored (0 from n on): a load read ahead, converted where it is used."""
    idx = tl.arange(0, BLOCK)
    return tl.load(ptr + idx, mask=idx < n, other=0.0)


@triton.jit
def _scaled_queries(q_ptr, q_rows, row_ok, cols, d, qk_scale):
    """The queries of channels `cols` [BLOCK_M, len(cols)] in float32, scaled as the logits are."""
    q = tl.load(q_ptr + q_rows[:, None] + cols[None, :], mask=row_ok[:, None] & (cols < d)[None, :], other=0.0)
    return q.to(tl.float32) * qk_scale


@triton.jit
def _key_chunk(
    q,
    q_dot,
    first,
    klo,
    ks,
    z_k,
    s_c,
    group,
    t,
    d,
    e,
    q_top,
    qk_scale,
    KC: tl.constexpr,
    B_LO: tl.constexpr,
    EXACT_LO: tl.constexpr,
    TILE_E: tl.constexpr,
    DOT: tl.constexpr,
    SWAP: tl.constexpr,
):
    """The low plane's logits over KC channels from `first` on (q: their scaled queries; q_dot: the same
    queries as given, in DOT; e: the split's headroom exponent of the low plane, `_split_exponents`, or with
    TILE_E the tile's own, from q_top and its scales).

    Scale and zero fold into the operands, q.k = (q * s).code + q.z per channel; each byte of codes is
    read once per field it holds (the repeats hit L1), 16 bytes of adjacent channels at a time, and
    shifted down per token: no register shuffles. The scales are read as q's tile (`_rows`); the zeros,
    read so too, made the default kernel spill on sm_90, and stay a vector.

    EXACT_LO (1-bit codes, scales stored in q's dtype): the product is exact instead, the queries as given
    against where(bit, s, 0) in DOT, one MMA (a product of two DOT numbers is exact in the float32
    accumulator, and the scale is not rounded), with the softmax scale applied to the float32 logits as in
    the dense loops: no q * s operand, no hi + lo split, no headroom (the products are far inside float32).
    SWAP: the dot's operand roles (`mma`). z_k, s_c: the group's zeros and (EXACT_LO) scales of these channels
    (`_key_group`), read a tile ahead by the caller."""
    c = first + tl.arange(0, KC)
    codes = unpack_field(klo, t[None, :], c[:, None], d, (c < d)[:, None], B_LO)
    z_k = z_k.to(tl.float32)
    if EXACT_LO:
        logits = mma(q_dot, tl.where(codes != 0, s_c.to(DOT)[:, None], 0.0).to(DOT), SWAP) * qk_scale
    else:
        s_k = _rows(ks + group * d + c, c < d, q)
        if TILE_E:
            e = headroom(q_top * tl.max(tl.max(s_k, axis=1), axis=0), DOT)
        logits = dot_f32(q * s_k * (1.0 / e), _code_to(codes, DOT), DOT, SWAP) * e
    return logits + tl.sum(q * z_k[None, :], axis=1)[:, None]


@triton.jit
def _key_group_here(ks, kz, group, first, d, KC: tl.constexpr, EXACT_LO: tl.constexpr, DOT: tl.constexpr):
    """`_key_group` read where it is used (not a tile ahead): converted at once."""
    c = first + tl.arange(0, KC)
    z = _vector(kz + group * d + first, d - first, KC)
    if EXACT_LO:
        s = tl.load(ks + group * d + c, mask=c < d, other=0.0).to(DOT)
    else:
        s = z  # unused: the scales are read as q's tile (`_rows`)
    return z, s


@triton.jit
def _key_group(ks, kz, group, first, d, ok, KC: tl.constexpr, EXACT_LO: tl.constexpr, DOT: tl.constexpr):
    """A key group's zeros and, with EXACT_LO, scales of KC channels from `first` on, as stored; 0 where not ok (a
    tile past the split's end, whose group may lie past the cache)."""
    c = first + tl.arange(0, KC)
    m = (c < d) & ok
    # as stored: converted where used, so that nothing waits on the load in the tile that issues it
    z = tl.load(kz + group * d + c, mask=m, other=0.0)
    if EXACT_LO:
        s = tl.load(ks + group * d + c, mask=m, other=0.0)
    else:
        s = z  # unused: the scales are read as q's tile (`_rows`)
    return z, s


@triton.jit
def _split_exponents(
    ks,
    vs,
    channel,
    cols,
    col_ok,
    hcol_ok,
    d,
    lo,
    hi,
    v_hi,
    q_top,
    n_boost,
    G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    B_LO: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    PAGE_RANKS: tl.constexpr,
    EXACT_LO: tl.constexpr,
    FAST: tl.constexpr,
    V_HEADROOM: tl.constexpr,
    DOT: tl.constexpr,
):
    """The headroom exponents (`headroom`) of the fast path's three scaled dots over this split's tiles [lo, hi):
    the key low plane (q * s), the high plane (q * s * 2**B_LO) and the values (p * s, p <= 1), each from the
    largest bound of any tile of the split. `headroom` grows with its bound, so each is the largest of the
    exponents the tiles would have had alone: 1 wherever every tile's is 1 (bit for bit the results of an
    exponent per tile), and a power of two above 1 only where some tile's bound passes 2**14. Read once per
    split, before its loop, instead of reduced from each tile: the key scales of the split's groups (only those
    of the high channels when the low plane is an exact product), and the value scales only when they can pass
    float16 (V_HEADROOM: stored wider than float16; float16 scales times p <= 1 stay within 65504). With
    per-page rank tables (Kitty) the keys' exponents stay per tile (1 here): inverting every page's ranks
    before the loop and two more live values in it made the d = 256 kernel spill on sm_90."""
    top_lo = q_top * 0.0
    top_hi = q_top * 0.0
    top_v = q_top * 0.0
    if FAST and DOT == tl.float16 and not PAGE_RANKS:
        for g in range(lo // G, tl.cdiv(hi, G)):
            if not EXACT_LO:
                s_k = tl.load(ks + g * d + cols, mask=col_ok, other=0.0).to(tl.float32)
                top_lo = tl.maximum(top_lo, tl.max(s_k, axis=0))
            if HAS_HIGH:
                s_hi = tl.load(ks + g * d + channel, mask=hcol_ok, other=0.0).to(tl.float32) * (1 << B_LO)
                top_hi = tl.maximum(top_hi, tl.max(s_hi, axis=0))
    if V_HEADROOM:
        for start in range(lo, v_hi, BLOCK_N):
            top_v = tl.maximum(top_v, tl.max(_vector(vs + start, v_hi - start, BLOCK_N), axis=0))
    return headroom(q_top * top_lo, DOT), headroom(q_top * top_hi, DOT), headroom(top_v, DOT)


@triton.jit
def _rows(ptrs, ok, like):
    """The vector at ptrs (float32; 0 where not ok) on every row of a tile shaped like `like`, loaded as that
    tile: each thread reads the elements of its own part of the tile, adjacent ones 16 bytes at a time (a load the
    software pipeline turns into cp.async, prefetched with the codes), where the vector alone would be one 2-byte
    load per thread (cp.async moves 4, 8 or 16 bytes) and a conversion to the tile's layout. The repeats hit L1."""
    shape: tl.constexpr = like.shape
    x = tl.load(tl.broadcast_to(ptrs[None, :], shape), mask=tl.broadcast_to(ok[None, :], shape), other=0.0)
    return x.to(tl.float32)


@triton.jit
def _dense_tile(ptr, rows, row_ok, cols, d):
    """Rows of a [tokens, d] buffer of exact keys or values (the sinks, the residual, FP16 pages)."""
    return tl.load(ptr + rows[:, None] * d + cols[None, :], mask=row_ok[:, None] & (cols[None, :] < d), other=0.0)


@triton.jit
def pair_slots(meta, cols, col_ok, d, ADJACENT: tl.constexpr, HAS_HIGH: tl.constexpr):
    """The high-plane column of each channel from the bit-packed pair mask `meta` (-1: none)."""
    pair = tl.where(ADJACENT, cols // 2, cols % (d // 2))
    byte = tl.load(meta + pair // 8, mask=col_ok & HAS_HIGH, other=0).to(tl.int32)
    salient = ((byte >> (pair % 8)) & 1) * col_ok.to(tl.int32)
    return tl.where(salient == 1, tl.cumsum(salient, axis=0) - 1, -1)


@triton.jit
def _high_queries(q_ptr, q_rows, channel, row_ok, hcol_ok, qk_scale):
    """The queries of the high plane's channels [BLOCK_M, BLOCK_H], scaled as the logits are (0 past n_boost)."""
    q_hi = tl.load(q_ptr + q_rows[:, None] + channel[None, :], mask=row_ok[:, None] & hcol_ok[None, :], other=0.0)
    return q_hi.to(tl.float32) * qk_scale


@triton.jit
def _split_kernel(
    q_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    counts_ptr,
    sk_ptr,
    sv_ptr,
    rk_ptr,
    rv_ptr,
    klo_ptr,
    khi_ptr,
    mask_ptr,
    ks_ptr,
    kz_ptr,
    vp_ptr,
    vs_ptr,
    vz_ptr,
    t_new,
    n_rep,
    n_kv,
    d,
    qk_scale,
    n_splits,
    s_sink,
    s_res,
    s_vres,
    s_klo,
    s_khi,
    s_mask,
    s_ks,
    s_vp,
    s_vs,
    v_row,
    v_groups,
    n_boost,
    ADJACENT: tl.constexpr,
    PAGE_RANKS: tl.constexpr,
    CAUSAL: tl.constexpr,
    FAST: tl.constexpr,
    G: tl.constexpr,
    VG: tl.constexpr,
    B_LO: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    B_HI: tl.constexpr,
    V_QUANT: tl.constexpr,
    V_FIELDS: tl.constexpr,
    W_V: tl.constexpr,
    B_V: tl.constexpr,
    SLIDING: tl.constexpr,
    DOT: tl.constexpr,
    EXACT_LO: tl.constexpr,
    V_HEADROOM: tl.constexpr,
    KEY_CHUNKS: tl.constexpr,
    PTX_UNPACK: tl.constexpr,
    SWAP_K: tl.constexpr,
    SWAP_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Partial attention of one (sequence, KV head) over one split of each region.

    Each region is its own loop: sinks and residual are dense tiles; the quantized region is
    read in whole tiles of one key group (FAST), codes are shifted out of their bytes with
    vector loads of adjacent channels, and scale and zero are folded into the operands instead
    of applied per element: q.k = (q * s).code + q.z for keys (per channel), p.v =
    (p * s).code + p.z for values (per token). Other configurations (groups smaller than a
    tile, value groups smaller than the head) dequantize per element.

    With per-token value groups over the whole head and values in one bit plane of W_V bits
    (V_FIELDS), the value columns are kept in
    field-major order, column c holding channel vchan[c] = (c % V_DP) * per + c // V_DP: the
    packed value bytes of adjacent columns are then adjacent in memory (vector loads, no
    interleave of fields in registers), and the dense value tiles and the final store use the
    same order. With PTX_UNPACK (float16, or bfloat16 up to 4 bits; runs of V_DP columns a multiple of
    4: `value_ptx`) their codes are turned into DOT numbers by inline PTX, four of one shift at a time
    (`unpack.field_codes`).

    With a sliding value window (SLIDING, the published KIVI) values are quantized up to
    n_value_quantized <= n_quantized: the quantized region's last tiles take the values past
    that from the exact window, which also holds the residual's values (from row n_q - n_vq).
    """
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // n_kv
    h = bh % n_kv
    n_real = n_rep * t_new
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < n_real
    j = rows % t_new
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < d
    V_DP: tl.constexpr = BLOCK_D // (8 // W_V)  # value bytes per token (columns of one field)
    if V_FIELDS:
        vchan = (cols % V_DP) * (8 // W_V) + cols // V_DP
    else:
        vchan = cols
    q_rows = ((b * n_rep * n_kv + h * n_rep + rows // t_new) * t_new + j) * d
    q = tl.load(q_ptr + q_rows[:, None] + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    q_dot = q.to(DOT)  # the queries as given: exact operands (the scale is applied to the float32 logits)
    # The fast path's key dot runs over KEY_CHUNKS chunks of channels, each with its own queries:
    # at d = 256 a [BLOCK_M, 256] operand and its low part held at once spill.
    KC: tl.constexpr = BLOCK_D // KEY_CHUNKS
    q0 = _scaled_queries(q_ptr, q_rows, row_ok, tl.arange(0, KC), d, qk_scale)
    q_top = tl.max(tl.max(tl.abs(q0), axis=1), axis=0)  # bounds the key operands q * s (see headroom)
    if KEY_CHUNKS == 2:
        q1 = _scaled_queries(q_ptr, q_rows, row_ok, KC + tl.arange(0, KC), d, qk_scale)
        q_top = tl.maximum(q_top, tl.max(tl.max(tl.abs(q1), axis=1), axis=0))
        if EXACT_LO:  # the chunks' queries as given
            qd0 = _scaled_queries(q_ptr, q_rows, row_ok, tl.arange(0, KC), d, 1.0).to(DOT)
            qd1 = _scaled_queries(q_ptr, q_rows, row_ok, KC + tl.arange(0, KC), d, 1.0).to(DOT)
        else:
            qd0, qd1 = q_dot, q_dot
    else:
        qd0, qd1 = q_dot, q_dot
    n_sink = tl.load(counts_ptr)
    n_q = tl.load(counts_ptr + 1)
    length = n_sink + n_q + tl.load(counts_ptr + 2)
    if SLIDING:
        n_vq = tl.load(counts_ptr + 3)
    else:
        n_vq = n_q
    last_visible = length - t_new + j
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    tok = tl.arange(0, BLOCK_N)

    # exact regions: the sinks, then the residual
    for region in tl.static_range(2):
        if region == 0:
            first, n, k_ptr, v_ptr = 0, n_sink, sk_ptr + bh * s_sink, sv_ptr + bh * s_sink
        else:
            first, n, k_ptr, v_ptr = n_sink + n_q, length - n_sink - n_q, rk_ptr + bh * s_res, rv_ptr + bh * s_vres
            if SLIDING:
                v_ptr += (n_q - n_vq) * d
        lo, hi = chunk(split, n_splits, n, BLOCK_N)
        for start in range(lo, hi, BLOCK_N):
            t = start + tok
            ok = t < hi
            logits = tl.dot(q_dot, tl.trans(_dense_tile(k_ptr, t, ok, cols, d).to(DOT))) * qk_scale
            p, alpha, l_i, m_i = online_softmax(
                logits, tl.where(ok, first + t, -1), last_visible, m_i, l_i, CAUSAL, DOT
            )
            acc = acc * alpha[:, None] + dot_f32(p, _dense_tile(v_ptr, t, ok, vchan, d).to(DOT), DOT)

    # the quantized region
    klo, khi, meta = klo_ptr + bh * s_klo, khi_ptr + bh * s_khi, mask_ptr + bh * s_mask
    ks, kz, vp = ks_ptr + bh * s_ks, kz_ptr + bh * s_ks, vp_ptr + bh * s_vp
    vs, vz = vs_ptr + bh * s_vs, vz_ptr + bh * s_vs
    hcol = tl.arange(0, BLOCK_H)
    hcol_ok = hcol < n_boost
    if not PAGE_RANKS:
        # High-plane column of each salient channel, from the bit-packed pair mask alone, and its inverse.
        slot = pair_slots(meta, cols, col_ok, d, ADJACENT, HAS_HIGH)
        channel = tl.sum(tl.where(slot[None, :] == hcol[:, None], cols[None, :], 0), axis=1)
        if FAST:
            if HAS_HIGH:  # one selection for every tile: its queries are read once, not per tile
                q_hi = _high_queries(q_ptr, q_rows, channel, row_ok, hcol_ok, qk_scale)
        split_channel = channel
    else:
        slot = tl.full([BLOCK_D], -1, tl.int32)  # unused: columns come from each page's rank table
        split_channel = hcol  # unused: the keys take an exponent per tile with per-page ranks
    lo, hi = chunk(split, n_splits, n_q, BLOCK_N)
    v_hi = tl.minimum(hi, n_vq) if SLIDING else hi
    if FAST or V_HEADROOM:  # the headroom exponents of the split's scaled dots, once before its loop
        e_lo, e_hi, e_v = _split_exponents(
            ks,
            vs,
            split_channel,
            cols,
            col_ok,
            hcol_ok,
            d,
            lo,
            hi,
            v_hi,
            q_top,
            n_boost,
            G,
            BLOCK_N,
            B_LO,
            HAS_HIGH,
            PAGE_RANKS,
            EXACT_LO,
            FAST,
            V_HEADROOM,
            DOT,
        )
    # The 2-byte operands of a tile (the key group's zeros and exact-product scales, the high channels' scales, the
    # values' scales and zeros) are read a tile ahead (AHEAD): issued mid-tile, used by the next tile, so no tile
    # waits on a round trip for them (the codes come a tile ahead through the software pipeline). Not at d = 256
    # (two key chunks): carried a tile ahead, its operands spill on sm_90 (8 B per thread), so they are read in place.
    AHEAD: tl.constexpr = KEY_CHUNKS == 1
    if AHEAD:
        ahead = lo < hi
        nz0, ns0 = _key_group(ks, kz, lo // G, 0, d, ahead, KC, EXACT_LO, DOT)
        if HAS_HIGH and not PAGE_RANKS:
            nhi = tl.load(ks + (lo // G) * d + split_channel, mask=hcol_ok & ahead, other=0.0)
        else:
            nhi = tl.zeros([BLOCK_H], ks.dtype.element_ty)
        nsv = _stored(vs + lo, v_hi - lo, BLOCK_N)
        nzv = _stored(vz + lo, v_hi - lo, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        t = start + tok
        group = start // G
        if AHEAD:
            z0, s0, s_hi, s_v, z_v = nz0, ns0, nhi.to(tl.float32), nsv.to(tl.float32), nzv.to(tl.float32)
        nxt = start + BLOCK_N
        if FAST:
            if not AHEAD:  # read in place, where each is used (as many live values as before AHEAD)
                z0, s0 = _key_group_here(ks, kz, group, 0, d, KC, EXACT_LO, DOT)
            logits = _key_chunk(
                q0,
                qd0,
                0,
                klo,
                ks,
                z0,
                s0,
                group,
                t,
                d,
                e_lo,
                q_top,
                qk_scale,
                KC,
                B_LO,
                EXACT_LO,
                PAGE_RANKS,
                DOT,
                SWAP_K,
            )
            if KEY_CHUNKS == 2:  # never AHEAD
                z1, s1 = _key_group_here(ks, kz, group, KC, d, KC, EXACT_LO, DOT)
                logits += _key_chunk(
                    q1,
                    qd1,
                    KC,
                    klo,
                    ks,
                    z1,
                    s1,
                    group,
                    t,
                    d,
                    e_lo,
                    q_top,
                    qk_scale,
                    KC,
                    B_LO,
                    EXACT_LO,
                    PAGE_RANKS,
                    DOT,
                    SWAP_K,
                )
            if HAS_HIGH:
                if PAGE_RANKS:  # this page's boosted channels: the inverse of its rank table
                    rank = tl.load(meta + group * d + cols, mask=col_ok, other=255).to(tl.int32)
                    channel = tl.sum(tl.where(rank[None, :] == hcol[:, None], cols[None, :], 0), axis=1)
                    q_hi = _high_queries(q_ptr, q_rows, channel, row_ok, hcol_ok, qk_scale)
                    s_hi = tl.load(ks + group * d + channel, mask=hcol_ok, other=0.0).to(tl.float32)
                elif not AHEAD:
                    s_hi = tl.load(ks + group * d + channel, mask=hcol_ok, other=0.0).to(tl.float32)
                s_hi = s_hi * (1 << B_LO)
                high = unpack_field(khi, t[None, :], hcol[:, None], n_boost, hcol_ok[:, None], B_HI)
                if PAGE_RANKS:  # the tile's own exponent (see _split_exponents)
                    e_page = headroom(q_top * tl.max(s_hi, axis=0), DOT)
                    logits += _dot_wide(q_hi, s_hi, _code_to(high, DOT), e_page, DOT)
                else:
                    logits += _dot_wide(q_hi, s_hi, _code_to(high, DOT), e_hi, DOT)
        else:
            pos = tl.where(t < hi, t, -1)
            k = load_tile(
                pos,
                cols,
                col_ok[None, :],
                0,
                n_q,
                klo,
                klo,
                klo,
                khi,
                slot,
                ks,
                kz,
                klo,
                d,
                d,
                n_boost,
                0,
                0,
                meta,
                n_boost,
                True,
                True,
                G,
                VG,
                B_LO,
                HAS_HIGH,
                B_HI,
                PAGE_RANKS,
            )
            e = headroom(tl.max(tl.max(tl.abs(k), axis=1), axis=0), DOT)  # dequantized keys may pass 65504
            logits = tl.dot(q_dot, tl.trans((k * (1.0 / e)).to(DOT))) * (qk_scale * e)
        # the next tile's 2-byte operands, issued here: after this tile's key dots (whose scoreboard waits would
        # otherwise wait for these loads too) and a softmax and value dot before the next tile needs them
        if AHEAD and V_FIELDS:
            nsv = _stored(vs + nxt, v_hi - nxt, BLOCK_N)
            nzv = _stored(vz + nxt, v_hi - nxt, BLOCK_N)
        if AHEAD and FAST:
            ahead = nxt < hi
            nz0, ns0 = _key_group(ks, kz, nxt // G, 0, d, ahead, KC, EXACT_LO, DOT)
            if HAS_HIGH and not PAGE_RANKS:
                nhi = tl.load(ks + (nxt // G) * d + split_channel, mask=hcol_ok & ahead, other=0.0)
        p, alpha, l_i, m_i = online_softmax(
            logits, tl.where(t < hi, n_sink + t, -1), last_visible, m_i, l_i, CAUSAL, DOT
        )
        if V_FIELDS:
            ok = t < v_hi
            if not AHEAD:  # one value group per token here (with AHEAD, read a tile ahead)
                s_v = _vector(vs + start, v_hi - start, BLOCK_N)
                z_v = _vector(vz + start, v_hi - start, BLOCK_N)
            # Field-major columns (see vchan): adjacent columns read adjacent bytes, 16 at a time.
            packed = tl.load(vp + t[:, None] * v_row + (cols % V_DP)[None, :], mask=ok[:, None], other=0)
            # One shift per V_DP columns; with PTX_UNPACK four codes of one shift per inline-PTX call.
            codes = field_codes(packed, ((cols // V_DP) * W_V)[None, :], B_V, DOT, PTX_UNPACK)
            if V_HEADROOM:
                pv = _dot_wide(p, s_v, codes, e_v, DOT, SWAP_V)
            else:  # p <= 1 times a scale of float16 (or of DOT's range) is within DOT's range
                pv = dot_f32(p * s_v[None, :], codes, DOT, SWAP_V)
            pv += tl.sum(p * z_v[None, :], axis=1)[:, None]
        elif V_QUANT:
            pos = tl.where(t < v_hi, t, -1)
            v = load_tile(
                pos,
                cols,
                col_ok[None, :],
                0,
                n_q,
                vp,
                vp,
                vp,
                vp,
                slot,
                vs,
                vz,
                vp,
                d,
                0,
                0,
                v_row,
                v_groups,
                vp,
                0,
                False,
                True,
                G,
                VG,
                B_V,
                False,
                1,
                False,
            )
            e = headroom(tl.max(tl.max(tl.abs(v), axis=1), axis=0), DOT)  # dequantized values may pass 65504
            pv = dot_f32(p, (v * (1.0 / e)).to(DOT), DOT) * e
        else:  # FP16 values in the quantized region
            pv = dot_f32(p, _dense_tile(vp, t, t < v_hi, cols, d).to(DOT), DOT)
        if SLIDING:
            if start + BLOCK_N > n_vq:  # values past n_vq are still exact, in the window
                w_ok = (t >= n_vq) & (t < hi)
                window = _dense_tile(rv_ptr + bh * s_vres, t - n_vq, w_ok, vchan, d)
                pv += dot_f32(p, window.to(DOT), DOT)
        acc = acc * alpha[:, None] + pv

    out = (bh * n_splits + split) * n_real + rows
    tl.store(m_ptr + out, m_i, mask=row_ok)
    tl.store(l_ptr + out, l_i, mask=row_ok)
    tl.store(acc_ptr + out[:, None] * d + vchan[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _merge_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    n_splits,
    t_new,
    n_rep,
    n_kv,
    d,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
):
    bh = tl.program_id(0)
    row = tl.program_id(1)
    b = bh // n_kv
    h = bh % n_kv
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < n_splits
    idx = (bh * n_splits + splits) * (n_rep * t_new) + row
    m = tl.load(m_ptr + idx, mask=s_ok, other=float("-inf"))
    l_s = tl.load(l_ptr + idx, mask=s_ok, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.where(s_ok & (m > float("-inf")), tl.exp2(m - m_all), 0.0)  # the maxima are in base 2
    cols = tl.arange(0, BLOCK_D)
    o = tl.zeros([BLOCK_D], tl.float32)
    # The partial outputs a chunk of splits at a time: all of them at once would spill.
    for first in range(0, n_splits, CHUNK):
        part = first + tl.arange(0, CHUNK)
        ok = part < n_splits
        at = (bh * n_splits + part) * (n_rep * t_new) + row
        m_c = tl.load(m_ptr + at, mask=ok, other=float("-inf"))
        w_c = tl.where(ok & (m_c > float("-inf")), tl.exp2(m_c - m_all), 0.0)
        acc = tl.load(acc_ptr + at[:, None] * d + cols[None, :], mask=ok[:, None] & (cols[None, :] < d), other=0.0)
        o += tl.sum(acc * w_c[:, None], axis=0)
    o = o / tl.sum(l_s * w, axis=0)
    head = h * n_rep + row // t_new
    j = row % t_new
    dst = out_ptr + ((b * n_rep * n_kv + head) * t_new + j) * d + cols
    tl.store(dst, round_to(saturate(o, out_ptr.dtype.element_ty), out_ptr.dtype.element_ty), mask=cols < d)


@dataclass(frozen=True)
class PackedRegion:
    """What decode attention reads for one layer: every component of the cache's
    `reference.channels.layout.CacheLayout` by name (whole buffers or views; the kernels read them by
    position), and `tokens`, the tokens they hold (`reference.channels.layout.TokenLayout`).

    counts: (n_sink, n_quantized, n_residual, n_value_quantized) as an int32 tensor on the
    kernels' device, which the kernels read (so a captured CUDA graph replays with the lengths of
    the moment, not of the capture); None builds it from `tokens`. capacity: the most tokens the
    buffers can hold (preallocated caches), which fixes the launch grid across steps; None sizes
    the grid from `tokens`.
    """

    tensors: Mapping[str, torch.Tensor]
    tokens: TokenLayout
    counts: torch.Tensor | None = None
    capacity: int | None = None


def _stride(t: torch.Tensor) -> int:
    return t.stride(1)


def default_splits(work_items: int, length: int, block_n: int) -> int:
    """Enough splits that batch * KV heads * splits covers the GPU twice over (flash-decoding)."""
    gpu = _runtime.target()
    if gpu is None:
        return max(1, min(4, triton.cdiv(length, block_n)))
    return splits_for(gpu.sms, work_items, length, block_n)


def launch_config(layout: CacheLayout) -> dict:
    """Tile size, warps, stages and register limit of the decode kernel (pnmix/kernels/NOTES.md).

    A tile is the largest power of two up to 64 that divides the key group size G, so that a
    tile lies in one group (the fast path), and the codes of a plane's tile are at most 2,048
    per warp up to 128 channels (64 tokens at 4 warps) and 512 beyond (16 tokens of 256
    channels at 8 warps): larger tiles spill (32 tokens at d = 256: 8 B per thread in some
    kernels on sm_80 or sm_90, at one, two or three stages). Per-page rank tables (Kitty) take 8 warps too:
    inverting a page's ranks in every tile spills at 4 on sm_90. Groups of fewer than 16
    tokens take 64-token tiles and the per-element path. maxnreg 255: left to itself, ptxas
    caps registers on sm_90 for occupancy (128 or 168) and spills at d = 64. Stages: `pipeline_stages`
    (the next tiles' packed codes copied asynchronously while this one is computed). The interpreter
    runs the same tiles (and ignores stages, which change no result), so CI checks the GPU paths.

    Operand roles (`mma`; swap_k: the key low plane's dot, swap_v: the values'): compiled both ways for every
    method, dtype and head_dim by `python -m pnmix.aot`. Swapped values on sm_90 become a warpgroup MMA (the head's
    channels on the m side) and ptxas stops copying loop-invariant query fragments into place before each MMA;
    on sm_80 they cost about 100 more instructions, and at d = 256 they spill. Swapped keys help the pair-mask high
    plane (PN-Mix) up to d = 128 and grow or spill KIVI's and Kitty's loops. Default configuration, loop SASS per
    warp per 64-token tile with the PTX unpack, neither swapped -> this choice: float16 sm_80 1,441 -> 1,435, sm_90
    1,497 -> 1,281; bfloat16 1,830 -> 1,793 and 1,853 -> 1,512. Across `--all` every loop is as short or
    shorter (sm_90: 1 % to 18 %) and none spills (pnmix/kernels/NOTES.md, variant 16). Triton 3.6 (the GPU machines'
    image) spills the swapped values in bfloat16 on sm_90 (8 B per thread, default configuration): there bfloat16
    keeps the values' roles (loop 1,697 instead of 1,572 with the spill).
    """
    g = layout.config.group_size
    block_d = max(16, triton.next_power_of_2(layout.head_dim))
    warps = 8 if block_d >= 256 or layout.selection.metadata == "page-ranks" else 4
    codes = 2048 if block_d <= 128 else 512
    block_n = min(64, g & -g, codes * warps // block_d)
    gpu = _runtime.target()  # None: the interpreter, which runs every choice alike (tests choose)
    # Operand roles, measured per configuration (see the docstring): swapped keys with a pair-mask high plane up to
    # d = 128 (KIVI's and Kitty's loops grow or spill), swapped values on sm_90 up to d = 128 (d = 256 spills).
    swap_k = block_d <= 128 and layout.n_high_channels > 0 and layout.selection.metadata != "page-ranks"
    swap_v = gpu is not None and gpu.arch >= 90 and block_d <= 128
    if swap_v and layout.dtype == torch.bfloat16 and _runtime.TRITON_VERSION < (3, 7):
        swap_v = False  # triton 3.6 spills this loop on sm_90 (8 B per thread at d = 128); unswapped it does not
    return {
        "block_n": block_n if block_n >= 16 else 64,
        "num_warps": warps,
        "num_stages": pipeline_stages(gpu, warps),
        "maxnreg": 255,
        "swap_k": swap_k,
        "swap_v": swap_v,
    }


def pipeline_stages(gpu: _runtime.Target | None, warps: int) -> int:
    """Tiles the decode kernel's software pipeline keeps in flight, for the DRAM round trip the gate's prediction
    waits on (pnmix/kernels/NOTES.md, variant 18): as many as two programs of 4 warps per SM hold in shared memory at
    the default configuration (20 KiB a stage: the codes as the tile reads them), 4 on sm_90 (228 KiB per SM), 3 on
    sm_80 (164 KiB); 2 elsewhere (sm_86 and sm_89 have 100 KiB), for the 8-warp kernels (one program per SM at 255
    registers; at 4 stages one spills 8 B per thread on sm_90) and under the interpreter (which ignores stages)."""
    if gpu is None or warps != 4:
        return 2
    return 4 if gpu.arch >= 90 else 3 if gpu.arch == 80 else 2


def _launch_overrides(num_splits, block_n, num_warps, num_stages, swap=None) -> dict:
    """The launch choices given (not None), checked: positive ints; tiles and warps powers of two; swap a pair
    of bools (the keys' and the values' operand roles, `launch_config`)."""
    if swap is not None:
        if not (isinstance(swap, tuple) and len(swap) == 2 and all(type(x) is bool for x in swap)):
            raise ValueError(f"swap must be a pair of bools (keys, values), or None (the default choice), got {swap!r}")
    given = {"num_splits": num_splits, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages}
    rules = {
        "block_n": (16, 256, True),
        "num_warps": (1, 32, True),
        "num_splits": (1, None, False),
        "num_stages": (1, 8, False),
    }
    for name, value in given.items():
        if value is None:
            continue
        low, high, power = rules[name]
        ok = type(value) is int and value >= low and (high is None or value <= high)
        if not ok or (power and value & (value - 1)):
            kind = "a power of two" if power else "an int"
            top = f" and <= {high}" if high is not None else ""
            raise ValueError(f"{name} must be {kind} >= {low}{top}, or None (the default choice), got {value!r}")
    chosen = {k: v for k, v in given.items() if v is not None}
    if swap is not None:
        chosen |= {"swap_k": swap[0], "swap_v": swap[1]}
    return chosen


def partials(rows: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split kernels' outputs, merged by `merge`: maxima and sums [rows], accumulators [rows, d]."""
    m = torch.empty(rows, device=device, dtype=torch.float32)
    return m, torch.empty_like(m), torch.empty(rows, d, device=device, dtype=torch.float32)


def dot_dtype(dtype: torch.dtype):
    """The tl.dot operand dtype for queries of `dtype`."""
    dot = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]
    if dot is tl.bfloat16 and _runtime.INTERPRETED:
        dot = tl.float32  # the interpreter's bfloat16 tl.dot is wrong; float32 is exact there
    return dot


def merge(
    m: torch.Tensor, l_sum: torch.Tensor, acc: torch.Tensor, q: torch.Tensor, n_kv: int, splits: int
) -> torch.Tensor:
    """Every split's partial attention merged by log-sum-exp: [B, H, T_new, d] in q's dtype (the partials
    in the split kernels' order: sequence x KV head, split, query head of the group x new position)."""
    batch, n_heads, t_new, d = q.shape
    n_rep, rows = n_heads // n_kv, n_heads // n_kv * t_new
    out = torch.empty_like(q)
    _runtime.launch(
        _merge_kernel,
        (batch * n_kv, rows),
        m,
        l_sum,
        acc,
        out,
        splits,
        t_new,
        n_rep,
        n_kv,
        d,
        BLOCK_S=triton.next_power_of_2(splits),
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        CHUNK=min(16, triton.next_power_of_2(splits)),
        num_warps=4,
    )
    return out


def counts_tensor(tokens: TokenLayout, device: torch.device) -> torch.Tensor:
    return torch.tensor(tokens[:4], dtype=torch.int32, device=device)


def decode_attention(
    q: torch.Tensor,
    region: PackedRegion,
    layout: CacheLayout,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap: tuple[bool, bool] | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of q [B, H, T_new, d] (the last T_new positions) over the packed cache.

    The layout says how the region is stored (bits, group sizes, pair layout, the selection's
    metadata format); num_splits, block_n, num_warps, num_stages and swap only tune the launch (None:
    `launch_config`'s and `default_splits`' choice; a tile that does not divide the key group
    size G takes the per-element path). The grid depends on the region's capacity when it has
    one, so that one launch serves every length (CUDA graphs). scale: of the logits, 1/sqrt(d)
    by default.
    """
    tune = launch_config(layout) | _launch_overrides(num_splits, block_n, num_warps, num_stages, swap)
    batch, n_heads, t_new, d = q.shape
    cfg, t = layout.config, region.tokens
    n_kv = layout.kv_heads
    n_rep = n_heads // n_kv
    q = q.contiguous()
    block_n = tune["block_n"]
    block_d = max(16, triton.next_power_of_2(d))
    splits = tune.get("num_splits") or default_splits(batch * n_kv, region.capacity or t.length, block_n)
    counts = region.counts if region.counts is not None else counts_tensor(t, q.device)
    rows = n_rep * t_new
    m, l_sum, acc = partials(batch * n_kv * splits * rows, d, q.device)
    dot = dot_dtype(q.dtype)
    r = region.tensors
    v_quant = cfg.values_quantized
    value_group = cfg.value_group(d)
    has_high = cfg.b_high > cfg.b_low and layout.n_high_channels > 0
    v_fields = value_fields(layout, d)
    # The low plane as an exact product needs 1-bit codes and scales that DOT holds exactly (q's dtype).
    exact_lo = cfg.b_low == 1 and r["key_scale"].dtype == q.dtype
    vs, vz = (r["value_scale"], r["value_zero"]) if v_quant else (r["value_payload"], r["value_payload"])
    args = (
        q,
        m,
        l_sum,
        acc,
        counts,
        r["sink_key"],
        r["sink_value"],
        r["residual_key"],
        r["residual_value"],
        r["key_low"],
        r["key_high"],
        r["mask"],
        r["key_scale"],
        r["key_zero"],
        r["value_payload"],
        vs,
        vz,
        t_new,
        n_rep,
        n_kv,
        d,
        LOG2E * (1.0 / math.sqrt(d) if scale is None else scale),
        splits,
        _stride(r["sink_key"]),
        _stride(r["residual_key"]),
        _stride(r["residual_value"]),
        _stride(r["key_low"]),
        _stride(r["key_high"]),
        _stride(r["mask"]),
        _stride(r["key_scale"]),
        _stride(r["value_payload"]),
        _stride(vs) if v_quant else 0,
        r["value_payload"].stride(2),
        d // value_group,
        layout.n_high_channels,
    )
    constexprs = dict(
        ADJACENT=cfg.pair_layout == "adjacent",
        PAGE_RANKS=layout.selection.metadata == "page-ranks",
        CAUSAL=t_new > 1,
        FAST=cfg.group_size % block_n == 0,
        G=cfg.group_size,
        VG=value_group,
        B_LO=cfg.b_low,
        HAS_HIGH=has_high,
        B_HI=(cfg.b_high - cfg.b_low) if has_high else 1,
        V_QUANT=v_quant,
        V_FIELDS=v_fields,
        W_V=cfg.value_bits if v_fields else 8,
        B_V=cfg.value_bits if v_quant else 8,
        SLIDING=cfg.value_residual == "sliding",
        DOT=dot,
        EXACT_LO=exact_lo,
        V_HEADROOM=v_fields and dot is tl.float16 and vs.dtype != torch.float16,
        KEY_CHUNKS=2 if block_d >= 256 else 1,
        BLOCK_M=max(16, triton.next_power_of_2(rows)),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(layout.n_high_channels)),
        num_warps=tune["num_warps"],
        num_stages=tune["num_stages"],
        maxnreg=tune["maxnreg"],
        SWAP_K=tune["swap_k"],
        SWAP_V=tune["swap_v"],
    )
    use_ptx = value_ptx(layout, q.dtype)
    compiled = _runtime.launch(_split_kernel, (batch * n_kv, splits), *args, PTX_UNPACK=use_ptx, **constexprs)
    if use_ptx and compiled is not None and not ptx_unpack.kernel_groups_by_shift(compiled):
        # this kernel's layout may mix shifts in one PTX call: its partials are computed again, plainly
        _runtime.launch(_split_kernel, (batch * n_kv, splits), *args, PTX_UNPACK=False, **constexprs)
    return merge(m, l_sum, acc, q, n_kv, splits)


def value_fields(layout: CacheLayout, d: int) -> bool:
    """Whether decode reads the values in field-major columns (`_split_kernel`'s V_FIELDS): per-token value groups
    over the whole (padded) head, codes in one bit plane."""
    cfg = layout.config
    block_d = max(16, triton.next_power_of_2(d))
    return cfg.values_quantized and cfg.value_group(d) == block_d and len(bit_planes(cfg.value_bits)) == 1


def value_ptx(layout: CacheLayout, dtype: torch.dtype) -> bool:
    """Whether decode over `layout` with queries of `dtype` now turns its value codes into dot operands by inline PTX:
    the switch is on (`ptx_unpack.active`: asked for, compiled, self-test passed on this device), the dot is float16,
    or bfloat16 with codes of at most 4 bits (`ptx.DTYPE_WIDTHS`), and the values are field-major with each field's
    run of columns (V_DP) a multiple of 4, so that every four adjacent columns starting at a multiple of 4 share one
    shift."""
    d = layout.head_dim
    name = next((n for n, t in TORCH_DTYPES.items() if t == dtype), None)
    if name is None or layout.config.value_bits not in ptx.DTYPE_WIDTHS[name] or not value_fields(layout, d):
        return False
    run = max(16, triton.next_power_of_2(d)) // (8 // layout.config.value_bits)
    return run % 4 == 0 and ptx_unpack.active()
