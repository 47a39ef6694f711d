"""The fragment-order decode loop (pnmix/kernels/NOTES.md, "Codes in fragment order"): the decode attention of the
default configuration in Gluon, reading a `PNMixCache` whose pages are stored in fragment order, and its CPU twin.

What it covers: float16 or bfloat16 (the quantized tiles take bfloat16 queries as float16 under a power of two, the
exact tiles run in bfloat16), d = 128, the 1-bit low plane, the 2-bit high plane of 64 salient channels, key groups of
128 tokens, 2-bit values per token (`fragment_attention.why_not` says what else), one new token of up to 16 query rows
per KV head. The package launches it (`pnmix.kernels.fragment_attention`) where `fragment_check.decide` found it right
on the device; the Triton kernel (`pnmix.kernels.attention`) is the fallback and reads everything else.

The structure (the anchors': BitDecoding, Marlin). A program is one (sequence, KV head) and split; its four warps each
own 16 tokens of a 64-token tile and keep their own softmax state, merged once per split, so no tile reduces across
warps. Each lane reads its words of the tile's three planes (`pnmix.kernels.fragment`: 2 of the key low plane, 2 of
the high plane, 4 of the values, each plane in its own cache component) from a ring of `STAGES` tiles that cp.async
fills `STAGES - 1` tiles ahead, and unpacks them with shifts and masks straight into its MMA operand registers: every
layout conversion on the way is checked trivial at compile time (`assert_trivial`), so no code passes through shared
memory after its copy (the 2-bit codes two at a time by inline PTX, `ptx.fragment_pair`, or plainly with PTX off).
The logits' accumulator layout is the probabilities' operand layout (also checked), the queries are loaded once into
their operand layout, and a key group's operands (its scales, q . z by the tensor cores, q s) once for its two tiles:
one trip of the loop is a key group. The high plane's scales are a gather (the salient channels' of the key group's
row), which cp.async copies as the 4-byte pairs holding them; q s is brought under float16's range by a power of two
per group (`_headroom`). The exact regions (sinks, residual: float16 keys and values) are read by one program, before
its quantized tiles (`split_plan`), into the same softmax states.

`twin` computes what the kernel computes, in torch on a CPU, from the same words and scales: the unpack by
`fragment.unpack` (the kernel's own joins and permutations), the operands rounded where the kernel rounds them, the
exact tiles, the per-warp online softmax and the warps' merge.
"""

from __future__ import annotations

import math

import torch

from pnmix import _runtime, sass
from pnmix.kernels import fragment, ptx

# the split rule of the loop, in one place: the gate simulates what is launched
from pnmix.perfmodel import merges_in_loop, split_plan

#: Ring depth of the copy pipeline (tiles in flight: STAGES - 1 ahead of the one computed).
STAGES = 3
QUERY_ROWS = 16  # the MMA's m: query rows of one KV head (GQA x new tokens), zero-padded
BLOCK_N = fragment.TILE
GROUP = 128  # key group (tokens per scale row); two tiles
#: Tokens of one trip of the kernel's loop (a key group: its operands are prepared once for its two tiles).
TOKENS_PER_ITERATION = GROUP


# Gluon kernels are decorated here (under the Triton interpreter too, where they cannot run: the twin stands in).
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2  # noqa: E402

_sync_threads = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # triton 3.7 / 3.6
_PAIR_2 = gl.constexpr(ptx.fragment_pair(2))
_PAIR_CONSTRAINTS = gl.constexpr(ptx.PAIR_CONSTRAINTS)


@gluon.jit
def _halves(x, shift: gl.constexpr, mask: gl.constexpr):
    return gl.join((x >> shift) & mask, (x >> (shift + 16)) & mask)


@gluon.jit
def _eight(x, step: gl.constexpr, mask: gl.constexpr, first: gl.constexpr):
    return gl.join(
        gl.join(
            gl.join(_halves(x, first, mask), _halves(x, first + step, mask)),
            gl.join(_halves(x, first + 2 * step, mask), _halves(x, first + 3 * step, mask)),
        ),
        gl.join(
            gl.join(_halves(x, first + 4 * step, mask), _halves(x, first + 5 * step, mask)),
            gl.join(_halves(x, first + 6 * step, mask), _halves(x, first + 7 * step, mask)),
        ),
    )


@gluon.jit
def _pair(x, shift: gl.constexpr):
    """The 2-bit codes at `shift` and `shift + 16` of each word as float16, joined on a new minor axis: one inline-PTX
    call per pair (`ptx.fragment_pair`, 1.5 instructions per code; `_halves` and `_f16` compute the same codes)."""
    a = gl.join(x, x)
    return gl.inline_asm_elementwise(
        _PAIR_2, _PAIR_CONSTRAINTS, [a, gl.zeros_like(a) + shift], dtype=gl.float16, is_pure=True, pack=2
    )


@gluon.jit
def _eight_f16(x):
    """`_eight(x, 2, 3, 0)` as float16 numbers, by `_pair`."""
    return gl.join(
        gl.join(gl.join(_pair(x, 0), _pair(x, 2)), gl.join(_pair(x, 4), _pair(x, 6))),
        gl.join(gl.join(_pair(x, 8), _pair(x, 10)), gl.join(_pair(x, 12), _pair(x, 14))),
    )


@gluon.jit
def _low(x, W: gl.constexpr):
    """[W, 32, 2] words -> [W, 128 channels, 16 tokens] 1-bit codes (`fragment.unpack`'s low plane)."""
    t = gl.join(_eight(x, 1, 1, 0), _eight(x, 1, 1, 8))
    t = gl.permute(gl.reshape(t, [W, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]), [0, 11, 10, 9, 8, 4, 5, 7, 6, 1, 2, 3])
    return gl.reshape(t, [W, 128, 16])


@gluon.jit
def _two_bit(x, PTX: gl.constexpr):
    """The 16 two-bit codes of each word as float16, [..., h, i0, i1, i2] (by inline PTX, or plainly)."""
    if PTX:
        return _eight_f16(x)
    else:
        return _f16(_eight(x, 2, 3, 0))


@gluon.jit
def _high(x, W: gl.constexpr, PTX: gl.constexpr):
    """[W, 32, 2] words -> [W, 64 salient channels, 16 tokens] float16 codes (`fragment.unpack`'s high plane)."""
    t = gl.permute(gl.reshape(_two_bit(x, PTX), [W, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]), [0, 10, 9, 8, 4, 5, 7, 6, 1, 2, 3])
    return gl.reshape(t, [W, 64, 16])


@gluon.jit
def _values(x, W: gl.constexpr, PTX: gl.constexpr):
    """[W, 32, 4] words -> [W, 16 tokens, 128 channels] float16 codes (`fragment.unpack`'s values)."""
    t = gl.reshape(_two_bit(x, PTX), [W, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    t = gl.permute(t, [0, 9, 4, 5, 8, 6, 7, 11, 10, 1, 2, 3])
    return gl.reshape(t, [W, 16, 128])


@gluon.jit
def _f16(c):
    # under the exponent of 1024: 1024 + code, exactly, then 1024 subtracted
    return (c | 0x6400).to(gl.int16).to(gl.float16, bitcast=True) - 1024.0


@gluon.jit
def _r3(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr):
    if dim == 0:
        return gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))[:, None, None]
    elif dim == 1:
        return gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))[None, :, None]
    else:
        return gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))[None, None, :]


@gluon.jit
def _issue(stage, tile, src, bufs, offs, W: gl.constexpr, BLOCK: gl.constexpr):
    """Copy tile `tile` of one head (its three planes' words and its scales; src: the head's tensors) into ring
    stage `stage`."""
    group = tile * BLOCK // 128
    async_copy.async_copy_global_to_shared(bufs[0].index(stage), src[0] + tile * (W * 32 * 2) + offs[0])
    async_copy.async_copy_global_to_shared(bufs[1].index(stage), src[1] + tile * (W * 32 * 2) + offs[0])
    async_copy.async_copy_global_to_shared(bufs[2].index(stage), src[2] + tile * (W * 32 * 4) + offs[1])
    async_copy.async_copy_global_to_shared(bufs[3].index(stage), src[3] + group * 128 + offs[2])
    async_copy.async_copy_global_to_shared(bufs[4].index(stage), src[4] + group * 128 + offs[2])
    async_copy.async_copy_global_to_shared(bufs[5].index(stage), src[5] + tile * BLOCK + offs[3])
    async_copy.async_copy_global_to_shared(bufs[6].index(stage), src[6] + tile * BLOCK + offs[3])
    async_copy.async_copy_global_to_shared(bufs[7].index(stage), src[7] + group * 64 + offs[4])
    async_copy.commit_group()


@gluon.jit
def _words_offsets(n: gl.constexpr, W: gl.constexpr, layout: gl.constexpr):
    """Offsets of a tile's words of one plane, [W, 32, n] (n words per lane), in `layout`."""
    return (
        gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))[:, None, None] * (32 * n)
        + gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))[None, :, None] * n
        + gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))[None, None, :]
    )


@gluon.jit
def fragment_split_kernel(
    q_ptr,
    idx_ptr,
    lo_ptr,
    hi_ptr,
    vp_ptr,
    ks,
    ks_pairs,
    kz,
    vs,
    vz,
    sk_ptr,
    sv_ptr,
    rk_ptr,
    rv_ptr,
    counts_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    sem_ptr,
    lo_stride,
    hi_stride,
    vp_stride,
    k_stride,
    v_stride,
    s_stride,
    rk_stride,
    rv_stride,
    n_rep,
    n_splits,
    exact_split,
    total_splits,
    first_split,
    qk_scale,
    W: gl.constexpr,
    STAGES: gl.constexpr,
    PTX: gl.constexpr,
    BF16: gl.constexpr,
    FUSED: gl.constexpr,
    ROWS: gl.constexpr,
):
    """Partial attention of one (sequence, KV head) bh over one split of its quantized tiles (module docstring), read
    from a cache's buffers as held (`PNMixCache` in fragment order). q: [B * H_kv * n_rep, 128], the n_rep query rows
    of each KV head (one new token); idx: int32 [B * H_kv, 64], each head's salient channels ascending; lo, hi, vp:
    the key low plane, key high plane and value codes as int32 words (`fragment.to_fragment_order`), a head every
    lo_stride, hi_stride, vp_stride words; ks, kz: each key group's scales and zeros [groups, 128], a head every
    k_stride; vs, vz: each token's value scale and zero, a head every v_stride; sk, sv, rk, rv: the exact regions'
    keys and values [tokens, 128] (sinks a head every s_stride, residual keys every rk_stride, values every
    rv_stride), which split `exact_split` reads before its quantized tiles (n_splits - 1: the last one; n_splits: a
    program of its own, with no quantized tile: `split_plan`); counts: the sinks [0], quantized tokens [1] and
    residual [2] (read on the device, so that a captured launch replays with the counts of the moment). The partials
    go to rows ((bh * total_splits + first_split + split) * n_rep + r) of m, l and acc, as `attention.merge` reads
    them."""
    BLOCK: gl.constexpr = W * 16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    W2: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 32, 1], [W, 1, 1], [2, 1, 0])
    W4: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [W, 1, 1], [2, 1, 0])
    S2W: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 1, [2, 1, 0])
    S4W: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 1, [2, 1, 0])
    S2: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 1, [1, 0])
    L2: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [1, W], [1, 0])
    LV: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [1, W], [1, 0])
    bh = gl.program_id(0)
    split = gl.program_id(1)
    # Two round trips to memory before the loop, not five: the loads that depend on nothing first (the counts, the
    # salient channels, the queries), then the copies of the split's first tiles and the one gather that needs them
    # (the queries at the salient channels) together, then the exact tiles (`split_plan`'s program) as they land.
    # `volatile` keeps the first ones where they are written: the compiler otherwise sinks each load to its first
    # use, after the gather's wait (the gate's simulated split at batch 1, 4K on an H100: 13.0 us instead of 11.9).
    n_sink = gl.load(counts_ptr, volatile=True)
    groups = gl.load(counts_ptr + 1, volatile=True) // 128
    n_res = gl.load(counts_ptr + 2, volatile=True)
    h_off = (
        gl.arange(0, 1, layout=gl.SliceLayout(1, L2))[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, L2))[None, :]
    )
    idx_c = gl.load(idx_ptr + bh * 64 + h_off, volatile=True)
    rows = _r3(16, 1, A)
    idx = gl.load(idx_ptr + bh * 64 + _r3(64, 2, A), volatile=True)
    # full-shape masks: rows past n_rep are zero queries, never stored
    q_ok = (rows + _r3(128, 2, A) * 0 + _r3(W, 0, A) * 0) < n_rep
    q_at = q_ptr + (bh * n_rep + rows) * 128 + _r3(128, 2, A) + _r3(W, 0, A) * 0
    q = gl.load(q_at, mask=q_ok, other=0.0, volatile=True)
    lbuf = gl.allocate_shared_memory(gl.int32, [STAGES, W, 32, 2], S2W)
    hbuf = gl.allocate_shared_memory(gl.int32, [STAGES, W, 32, 2], S2W)
    vbuf = gl.allocate_shared_memory(gl.int32, [STAGES, W, 32, 4], S4W)
    sbuf = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 128], S2)
    zbuf = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 128], S2)
    svbuf = gl.allocate_shared_memory(gl.float16, [STAGES, W, 16], S2)
    zvbuf = gl.allocate_shared_memory(gl.float16, [STAGES, W, 16], S2)
    # the high plane's scales (s at the salient channels) are a gather of 2-byte numbers, which cp.async cannot
    # copy: it copies the 4-byte pair holding each (ks as int32), and the loop takes the half the channel's parity says
    khbuf = gl.allocate_shared_memory(gl.int32, [STAGES, 1, 64], S2)
    s_off = (
        gl.arange(0, 1, layout=gl.SliceLayout(1, L2))[:, None]
        + gl.arange(0, 128, layout=gl.SliceLayout(0, L2))[None, :]
    )
    v_off = (
        gl.arange(0, W, layout=gl.SliceLayout(1, LV))[:, None] * 16
        + gl.arange(0, 16, layout=gl.SliceLayout(0, LV))[None, :]
    )
    # the split's whole key groups (two tiles each; the package's split rule, in groups)
    size = gl.cdiv(groups, n_splits)
    glo = split * size
    ghi = gl.minimum(glo + size, groups)
    lo, hi = 2 * glo, 2 * ghi
    src = (
        lo_ptr + bh * lo_stride,
        hi_ptr + bh * hi_stride,
        vp_ptr + bh * vp_stride,
        ks + bh * k_stride,
        kz + bh * k_stride,
        vs + bh * v_stride,
        vz + bh * v_stride,
        ks_pairs + bh * (k_stride // 2),
    )
    bufs = (lbuf, hbuf, vbuf, sbuf, zbuf, svbuf, zvbuf, khbuf)
    offs = (_words_offsets(2, W, W2), _words_offsets(4, W, W4), s_off, v_off, idx_c >> 1)
    for i in gl.static_range(STAGES - 1):
        # past the split's end: its last tile again, in bounds (never used); a program without quantized tiles: tile 0
        _issue(i, gl.maximum(gl.minimum(lo + i, hi - 1), 0), src, bufs, offs, W, BLOCK)
    h_ok = (rows + idx * 0 + _r3(W, 0, A) * 0) < n_rep
    qh = gl.load(q_ptr + (bh * n_rep + rows) * 128 + idx + _r3(W, 0, A) * 0, mask=h_ok, other=0.0)
    if BF16:  # the quantized tiles take the queries as float16 under a power of two (8-bit mantissas fit in 11)
        q_exp = _fit_exponent(gl.max(gl.max(gl.max(gl.abs(q.to(gl.float32)), axis=2), axis=1), axis=0))
        qh = (qh.to(gl.float32) * gl.exp2(-q_exp)).to(gl.float16)
    q_top = gl.max(gl.max(gl.max(gl.abs(qh.to(gl.float32)), axis=2), axis=1), axis=0)
    # read once per key group: kept in shared memory, not in 16 registers of every thread through the loop
    SQ: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    qbuf = gl.allocate_shared_memory(gl.float16, [W, 16, 64], SQ, qh)
    parity = gl.allocate_shared_memory(gl.int32, [1, 64], S2, (idx_c & 1) * 16)
    m_i = gl.full([W, 16], float("-inf"), gl.float32, layout=gl.SliceLayout(2, mma))
    l_i = gl.zeros([W, 16], gl.float32, layout=gl.SliceLayout(2, mma))
    z_i = gl.zeros([W, 16], gl.float32, layout=gl.SliceLayout(2, A))
    acc = gl.zeros([W, 16, 128], gl.float32, layout=mma)
    if split == exact_split:  # the exact regions, while the split's first tiles land: the sinks, the residual
        for start in range(0, n_sink, BLOCK):
            m_i, l_i, acc, z_i = _exact_tile(
                q, sk_ptr + bh * s_stride, sv_ptr + bh * s_stride, start, n_sink, qk_scale, m_i, l_i, acc, z_i, W, BF16
            )
        for start in range(0, n_res, BLOCK):
            m_i, l_i, acc, z_i = _exact_tile(
                q, rk_ptr + bh * rk_stride, rv_ptr + bh * rv_stride, start, n_res, qk_scale, m_i, l_i, acc, z_i, W, BF16
            )
    qk_main = qk_scale
    if BF16:
        # read again rather than kept through the exact tiles (a second mask, so not merged with the first load)
        q = gl.load(q_at, mask=q_ok & (split >= 0))
        q = (q.to(gl.float32) * gl.exp2(-q_exp)).to(gl.float16)
        qk_main = qk_scale * gl.exp2(q_exp)
    it = 0
    for g in range(glo, ghi):
        for j in gl.static_range(2):  # the group's two tiles
            stage = it % STAGES
            async_copy.wait_group(STAGES - 2)
            _sync_threads()  # every lane's copies of this stage landed; every lane done with the stage refilled next
            _issue((it + STAGES - 1) % STAGES, gl.minimum(2 * g + j + STAGES - 1, hi - 1), src, bufs, offs, W, BLOCK)
            if j == 0:
                # the group's operands, once for its two tiles: the low plane's scales as the MMA's B operand (exact
                # products with q as given), the zeros' term q . z in float32, the high plane's q s as hi + lo after
                # a power of two that keeps it inside float16's range whatever the scales (`headroom`)
                pair = khbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :]
                half = (pair >> parity.load(gl.SliceLayout(1, A))[:, None, :]) & 0xFFFF
                khs = half.to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32) * 2.0
                e = _headroom(q_top * gl.max(gl.max(gl.max(gl.abs(khs), axis=2), axis=1), axis=0))
                down = gl.exp2(-e)
                up = gl.exp2(e) * qk_main
                s = sbuf.index(stage).load(gl.SliceLayout(2, B))[:, :, None]
                # q . z by the tensor cores too (exact products, float32 sums): z broadcast over the MMA's n, so
                # every column of the accumulator holds a row's q . z, the C operand of each tile's low-plane MMA
                z = zbuf.index(stage).load(gl.SliceLayout(2, B))[:, :, None] + gl.zeros([W, 128, 16], gl.float16, B)
                qz = mma_v2(q, z, gl.zeros([W, 16, 16], gl.float32, layout=mma))
                qs = qbuf.load(A).to(gl.float32) * (khs * down)
                qs_hi = qs.to(gl.float16)
                qs_lo = (qs - qs_hi.to(gl.float32)).to(gl.float16)
            lw = lbuf.index(stage).load(W2)
            hw = hbuf.index(stage).load(W2)
            vw = vbuf.index(stage).load(W4)
            bits = gl.convert_layout(_low(lw, W), B, assert_trivial=True)
            logits = mma_v2(q, gl.where(bits != 0, s, 0.0), qz)
            high = gl.convert_layout(_high(hw, W, PTX), B, assert_trivial=True)
            # the high plane's products accumulate onto the low plane's logits brought down by the same 2^-e
            logits = mma_v2(qs_lo, high, mma_v2(qs_hi, high, logits * down)) * up
            m_new = gl.maximum(m_i, gl.max(logits, axis=2))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(logits - m_new[:, :, None])
            l_i = l_i * alpha + gl.sum(p, axis=2)
            m_i = m_new
            pa = gl.convert_layout(p, A, assert_trivial=True)
            sv = svbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :].to(gl.float32)
            zv = zvbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :].to(gl.float32)
            vals = gl.convert_layout(_values(vw, W, PTX), B, assert_trivial=True)
            ps = pa * sv  # p s in float32 as hi + lo (p <= 1: within float16's range for a float16 scale)
            ps_hi = ps.to(gl.float16)
            acc = mma_v2(ps_hi, vals, acc * alpha[:, :, None])
            acc = mma_v2((ps - ps_hi.to(gl.float32)).to(gl.float16), vals, acc)
            # the zeros' share is the same in every channel: one number per row, added to the output once
            z_i = z_i * gl.convert_layout(alpha, z_i.type.layout) + gl.sum(pa * zv, axis=2)
            it += 1
    async_copy.wait_group(0)
    acc += gl.convert_layout(z_i, gl.SliceLayout(2, mma))[:, :, None]
    m = gl.max(m_i, axis=0)
    a = gl.where(m_i > float("-inf"), gl.exp2(m_i - m[None, :]), 0.0)  # a warp without tokens weighs nothing
    total = gl.sum(l_i * a, axis=0)
    o = gl.sum(acc * a[:, :, None], axis=0)
    out = (bh * total_splits + first_split + split) * n_rep
    r = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, mma)))
    gl.store(m_ptr + out + gl.convert_layout(r, m.type.layout), m, mask=gl.convert_layout(r, m.type.layout) < n_rep)
    rt = gl.convert_layout(r, total.type.layout)
    gl.store(l_ptr + out + rt, total, mask=rt < n_rep)
    orow = gl.arange(0, 16, layout=gl.SliceLayout(1, o.type.layout))[:, None]
    ocol = gl.arange(0, 128, layout=gl.SliceLayout(0, o.type.layout))[None, :]
    gl.store(acc_ptr + (out + orow) * 128 + ocol, o, mask=(orow + ocol * 0) < n_rep)
    if FUSED:
        # The last program of a head to finish merges its splits: no merge kernel, one launch fewer. Every thread's
        # partial stores come before the barrier, the barrier before the count's release; the merging program reads
        # the others' partials after the count's acquire (the split-K pattern of CUTLASS's semaphore).
        _sync_threads()
        done = gl.atomic_add(sem_ptr + bh, 1, sem="acq_rel", scope="gpu")
        if done == total_splits - 1:
            gl.store(sem_ptr + bh, 0)  # zero again for the next launch (a captured step replays with it zero)
            _merge_head(m_ptr, l_ptr, acc_ptr, out_ptr, bh, total_splits, n_rep, W, ROWS)


@gluon.jit
def _merge_head(m_ptr, l_ptr, acc_ptr, out_ptr, bh, splits, n_rep, W: gl.constexpr, ROWS: gl.constexpr):
    """Head bh's partials of its `splits` programs merged by log-sum-exp into its n_rep query rows of out (q's
    dtype), as `attention.merge` does: 128 // ROWS splits a trip, 128 partial numbers a thread, read past L1."""
    CH: gl.constexpr = 128 // ROWS
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [W, 1, 1], [2, 1, 0])
    SR: gl.constexpr = gl.SliceLayout(2, L3)  # [splits, rows]
    RC: gl.constexpr = gl.SliceLayout(0, L3)  # [rows, channels]
    s_ar = gl.arange(0, CH, layout=gl.SliceLayout(1, SR))
    r_ar = gl.arange(0, ROWS, layout=gl.SliceLayout(0, SR))
    c_ar = gl.arange(0, 128, layout=gl.SliceLayout(0, RC))
    c3 = gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    top = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(0, SR))
    total = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(0, SR))
    o = gl.zeros([ROWS, 128], gl.float32, layout=RC)
    for first in range(0, splits, CH):
        split = first + s_ar
        ok = (split < splits)[:, None] & (r_ar < n_rep)[None, :]
        at = (bh * splits + split)[:, None] * n_rep + r_ar[None, :]
        m_c = gl.load(m_ptr + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
        l_c = gl.load(l_ptr + at, mask=ok, other=0.0, cache_modifier=".cg")
        a_c = gl.load(
            acc_ptr + at[:, :, None] * 128 + c3, mask=ok[:, :, None] & (c3 < 128), other=0.0, cache_modifier=".cg"
        )
        new = gl.maximum(top, gl.max(m_c, axis=0))
        safe = gl.where(new > float("-inf"), new, 0.0)  # rows without a token yet: nothing to rescale
        alpha = gl.exp2(top - safe)
        w = gl.exp2(m_c - safe[None, :])  # a split without tokens (m = -inf) weighs nothing
        total = total * alpha + gl.sum(l_c * w, axis=0)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, RC))[:, None] + gl.sum(a_c * w[:, :, None], axis=0)
        top = new
    o = o / gl.convert_layout(total, gl.SliceLayout(1, RC))[:, None]
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, RC))[:, None]
    dst = out_ptr + (bh * n_rep + rows) * 128 + c_ar[None, :]
    gl.store(dst, o.to(out_ptr.dtype.element_ty), mask=(rows + c_ar[None, :] * 0) < n_rep)


@gluon.jit
def _exact_tile(q, k_ptr, v_ptr, start, n, qk_scale, m_i, l_i, acc, z_i, W: gl.constexpr, BF16: gl.constexpr):
    """One tile of an exact region (float16 keys and values [tokens, 128], tokens start .. start + 16 W - 1 of n, 16
    per warp) folded into the warps' softmax states: keys and values loaded straight into the MMA's B operands, q . k
    as exact products, p . v with p as hi + lo (float32 grade, as the quantized tiles); tokens past n weigh nothing."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    k_tok = start + _r3(W, 0, B) * 16 + _r3(16, 2, B)  # [W, 1, 16]: keys are [channel, token]
    k_ok = (k_tok + _r3(128, 1, B) * 0) < n
    keys = gl.load(k_ptr + k_tok * 128 + _r3(128, 1, B), mask=k_ok, other=0.0)
    v_tok = start + _r3(W, 0, B) * 16 + _r3(16, 1, B)  # [W, 16, 1]: values are [token, channel]
    v_ok = (v_tok + _r3(128, 2, B) * 0) < n
    vals = gl.load(v_ptr + v_tok * 128 + _r3(128, 2, B), mask=v_ok, other=0.0)  # in flight during q . k
    logits = mma_v2(q, keys, gl.zeros([W, 16, 16], gl.float32, layout=mma)) * qk_scale
    seen = (start + _r3(W, 0, mma) * 16 + _r3(16, 2, mma) + _r3(16, 1, mma) * 0) < n
    logits = gl.where(seen, logits, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(logits, axis=2))
    m_safe = gl.where(m_new > float("-inf"), m_new, 0.0)  # a warp with no token yet: nothing to rescale
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(logits - m_safe[:, :, None])
    l_i = l_i * alpha + gl.sum(p, axis=2)
    pa = gl.convert_layout(p, A, assert_trivial=True)
    if BF16:  # p in three bfloat16 parts: 24 bits, as float16's two
        p_1 = pa.to(gl.bfloat16)
        rest = pa - p_1.to(gl.float32)
        p_2 = rest.to(gl.bfloat16)
        acc = mma_v2(p_1, vals, acc * alpha[:, :, None])
        acc = mma_v2(p_2, vals, acc)
        acc = mma_v2((rest - p_2.to(gl.float32)).to(gl.bfloat16), vals, acc)
    else:
        p_hi = pa.to(gl.float16)
        acc = mma_v2(p_hi, vals, acc * alpha[:, :, None])
        acc = mma_v2((pa - p_hi.to(gl.float32)).to(gl.float16), vals, acc)
    z_i = z_i * gl.convert_layout(alpha, z_i.type.layout)
    return m_new, l_i, acc, z_i


@gluon.jit
def _fit_exponent(top):
    """The exponent e of the power of two that brings numbers at most `top` in magnitude to at most 2^15 (down or up:
    bfloat16 queries into float16's range and precision); 0 for no number."""
    return gl.where(top > 0, gl.ceil(gl.log2(top)) - 15.0, 0.0)


@gluon.jit
def _headroom(top):
    """The exponent e >= 0 of the power of two that brings q s (at most `top` in magnitude) to at most 2^15, inside
    float16's range: the high plane's products are scaled by 2^-e and their sum by 2^e, both exact."""
    return gl.maximum(gl.ceil(gl.log2(top)) - 15.0, 0.0)


def plan(splits: int, heads: int) -> tuple[int, int, int]:
    """`split_plan` of `splits` over `heads` (sequence, KV head) items for the target GPU (2 programs an SM; under
    the interpreter no slots, so the exact regions share a split): (quantized splits, exact split, programs)."""
    gpu = _runtime.target()
    return split_plan(splits, heads, 2 * gpu.sms if gpu else 0)


def merges(heads: int, programs: int) -> bool:
    """Whether the loop merges its splits itself on the target GPU (`merges_in_loop`); never without one."""
    gpu = _runtime.target()
    return gpu is not None and merges_in_loop(heads, programs, 2 * gpu.sms)


def launch_split(
    q,
    index,
    planes,
    scales,
    exact,
    counts,
    out,
    heads,
    n_rep,
    n_splits,
    exact_split,
    total,
    first,
    qk_scale,
    use_ptx,
    merged=None,
    semaphores=None,
):
    """Launch the loop over `heads` (sequence, KV head) pairs, as a cache holds them (`fragment_split_kernel`'s
    docstring): q [heads * n_rep, 128]; index int32 [heads, 64]; planes (key low, key high, values) as int32 words
    and scales (key scales, key zeros, value scales, value zeros) and the exact regions (sink keys, sink values,
    residual keys, residual values), each [heads, ...] (a head every stride(0)); counts int32 on the device; out the
    partials (m, l, acc) of `total` splits per head, the loop's from split `first`: its `n_splits` over the quantized
    tiles, split `exact_split` (n_splits - 1, or n_splits: one more program; `split_plan`) reading the exact regions.
    While launches are recorded (the gate) it is recorded, not run. merged and semaphores (int32 [>= heads], zero, kept
    zero by the loop): the last program of each head merges its splits into merged [heads * n_rep, 128] (q's dtype),
    so no merge kernel is launched; the partials then are this launch's alone (first 0, total its programs)."""
    fused = merged is not None
    programs = max(n_splits, exact_split + 1)
    if fused and (semaphores is None or semaphores.numel() < heads or first != 0 or total != programs):
        raise ValueError(
            f"a merge in the loop needs semaphores for {heads} heads and the partials of this launch alone "
            f"(first 0, total {programs}), got semaphores "
            f"{None if semaphores is None else semaphores.numel()}, first {first}, total {total}"
        )
    lo, hi, vp = planes
    ks, kz, vs, vz = scales
    # an empty region is still passed as a tensor the kernel may take the address of (it reads none of it)
    sk, sv, rk, rv = (t if t.shape[-2] else t.new_zeros(*t.shape[:-2], 1, t.shape[-1]) for t in exact)
    m, l_sum, acc = out
    return _runtime.launch(
        fragment_split_kernel,
        (heads, programs),
        q, index, lo, hi, vp, ks, ks.view(torch.int32), kz, vs, vz, sk, sv, rk, rv, counts, m, l_sum, acc,
        merged if fused else m, semaphores if fused else counts,
        lo.stride(0), hi.stride(0), vp.stride(0), ks.stride(0), vs.stride(0), sk.stride(0), rk.stride(0), rv.stride(0),
        n_rep, n_splits, exact_split, total, first, qk_scale,
        num_warps=fragment.WARPS, W=fragment.WARPS, STAGES=STAGES, PTX=use_ptx, BF16=q.dtype == torch.bfloat16,
        FUSED=fused, ROWS=_rows(n_rep) if fused else 1,
    )  # fmt: skip


def _rows(n_rep: int) -> int:
    """The merge's query rows: n_rep to the next power of two (at most `QUERY_ROWS`)."""
    return 1 << max(0, n_rep - 1).bit_length()


def merge_chunk(n_rep: int) -> int:
    """Splits a trip of the loop's own merge (`_merge_head`) for n_rep query rows per KV head."""
    return 128 // _rows(n_rep)


def resources(compiled) -> dict:
    """Registers, local (spilled) bytes and shared memory of a compiled kernel, and its SASS with control codes."""
    registers, local_bytes = sass.registers_and_local_bytes(compiled.asm["cubin"])
    return {
        "registers": registers,
        "local_bytes": local_bytes,
        "shared_bytes": int(compiled.metadata.shared),
        "encoded": sass.disassemble(compiled.asm["cubin"], encoding=True),
    }


# --- the CPU twin ------------------------------------------------------------------------------------------------


def twin(
    q: torch.Tensor,
    idx: torch.Tensor,
    words: torch.Tensor,
    ks: torch.Tensor,
    kz: torch.Tensor,
    vs: torch.Tensor,
    vz: torch.Tensor,
    qk_scale: float,
    n_splits: int = 1,
    exact: tuple[torch.Tensor, ...] = (),
    exact_split: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernel computes for one (sequence, KV head), on a CPU: per split, the log2-domain running max m
    [16], the sum l [16] and the unnormalized output acc [16, 128] (o = acc / l; rows past q's are zero queries).
    Shapes as the kernel reads one head (q [rows <= 16, 128], idx [64] the salient channels, words [tiles, 4, 32, 8]
    (`fragment.pack`), ks/kz [groups, 128], vs/vz [tiles * 64]; exact: the exact regions' (keys, values) pairs,
    [tokens, 128] each, which split exact_split reads first, the last one (n_splits - 1) by default: a split past
    n_splits has no quantized tile, `split_plan`);
    float16 operands rounded where the kernel rounds them, float32 accumulation."""
    f32, f16 = torch.float32, torch.float16
    low, high, values = fragment.unpack(words)
    raw = torch.cat([q, q.new_zeros(QUERY_ROWS - q.shape[0], q.shape[1])])  # the exact tiles' queries, as given
    q, qk_main = raw, qk_scale
    if raw.dtype == torch.bfloat16:  # the quantized tiles': float16 under a power of two, as the kernel
        top = float(raw.float().abs().max())
        q_exp = math.ceil(math.log2(top)) - 15 if top > 0 else 0
        q, qk_main = (raw.float() * 2.0**-q_exp).to(f16), qk_scale * 2.0**q_exp
    qh = q[:, idx.long()].to(f32)
    q_top = qh.abs().max()
    tiles, w = words.shape[0], fragment.WARPS
    groups = ks.shape[0]
    size = -(-groups // n_splits)  # whole key groups per split, as the kernel
    exact_split = n_splits - 1 if exact_split is None else exact_split
    ms, ls, accs = [], [], []
    for split in range(max(n_splits, exact_split + 1)):
        lo, hi = 2 * split * size, min(2 * (split * size + size), tiles)
        m_i = torch.full((w, 16), -math.inf)
        l_i = torch.zeros(w, 16)
        z_i = torch.zeros(w, 16)
        acc = torch.zeros(w, 16, 128)
        for keys, vals in zip(exact[0::2], exact[1::2], strict=True) if split == exact_split else ():
            for start in range(0, keys.shape[0], BLOCK_N):
                state = _exact_tile_twin(raw, keys, vals, start, qk_scale, m_i, l_i, acc, z_i)
                m_i, l_i, acc, z_i = state
        for tile in range(lo, hi):
            g = tile * BLOCK_N // GROUP
            sl = slice(tile * w, tile * w + w)
            s, z = ks[g].to(f32), kz[g].to(f32)
            khs = 2 * ks[g, idx.long()].to(f32)
            e = max(math.ceil(math.log2(q_top * khs.abs().max())) - 15, 0) if float(q_top * khs.abs().max()) else 0
            kop = torch.where(low[sl] != 0, s[:, None], torch.zeros(()))  # [w, 128, 16]: exact products with q
            logits = q.to(f32) @ kop + (q.to(f32) * z).sum(-1)[:, None]
            qs = qh * (khs * 2.0**-e)
            qs_hi = qs.to(f16).to(f32)
            codes = high[sl].to(f32)
            hp = qs_hi @ codes + (qs - qs_hi).to(f16).to(f32) @ codes
            logits = logits * qk_main + hp * (2.0**e * qk_main)
            m_new = torch.maximum(m_i, logits.amax(-1))
            alpha = torch.exp2(m_i - m_new)
            p = torch.exp2(logits - m_new[..., None])
            l_i = l_i * alpha + p.sum(-1)
            m_i = m_new
            tok = torch.arange(tile * BLOCK_N, tile * BLOCK_N + BLOCK_N).view(w, 1, 16)
            sv, zv = vs[tok].to(f32), vz[tok].to(f32)
            ps = p * sv
            ps_hi = ps.to(f16).to(f32)
            codes = values[sl].to(f32)
            acc = acc * alpha[..., None] + ps_hi @ codes + (ps - ps_hi).to(f16).to(f32) @ codes
            z_i = z_i * alpha + (p * zv).sum(-1)
        acc = acc + z_i[..., None]
        m = m_i.amax(0)
        a = torch.where(torch.isfinite(m_i), torch.exp2(m_i - m), torch.zeros_like(m_i))
        ms.append(m)
        ls.append((l_i * a).sum(0))
        accs.append((acc * a[..., None]).sum(0))
    return torch.stack(ms), torch.stack(ls), torch.stack(accs)


def _exact_tile_twin(q, keys, vals, start, qk_scale, m_i, l_i, acc, z_i):
    """The kernel's `_exact_tile` in torch: tokens start .. start + BLOCK_N - 1 of the exact region keys, vals."""
    f32, f16, w = torch.float32, torch.float16, fragment.WARPS
    n = keys.shape[0]
    tok = torch.arange(start, start + BLOCK_N).view(w, 16)
    ok = tok < n
    k = torch.where(ok[..., None], keys[tok.clamp(max=max(n - 1, 0))].to(f32), torch.zeros(()))  # [w, 16, 128]
    v = torch.where(ok[..., None], vals[tok.clamp(max=max(n - 1, 0))].to(f32), torch.zeros(()))
    logits = torch.where(ok[:, None, :], (q.to(f32) @ k.transpose(1, 2)) * qk_scale, -math.inf)  # [w, 16, 16]
    m_new = torch.maximum(m_i, logits.amax(-1))
    m_safe = torch.where(m_new > -math.inf, m_new, torch.zeros(()))
    alpha = torch.exp2(m_i - m_safe)
    p = torch.exp2(logits - m_safe[..., None])
    if keys.dtype == torch.bfloat16:  # p in three bfloat16 parts
        p_1 = p.to(torch.bfloat16).to(f32)
        p_2 = (p - p_1).to(torch.bfloat16).to(f32)
        parts = (p_1, p_2, (p - p_1 - p_2).to(torch.bfloat16).to(f32))
    else:
        p_hi = p.to(f16).to(f32)
        parts = (p_hi, (p - p_hi).to(f16).to(f32))
    acc = acc * alpha[..., None] + sum(part @ v for part in parts)
    return m_new, l_i * alpha + p.sum(-1), acc, z_i * alpha


def merge(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:  # noqa: E741 (the paper's l)
    """The splits' partial results (`twin`'s, log2 domain: m [splits, rows], l [splits, rows], acc [splits, rows,
    d]) merged into the attention output [rows, d]; splits without tokens (m = -inf) weigh nothing."""
    top = m.amax(0)
    weight = torch.where(torch.isfinite(m), torch.exp2(m - top), torch.zeros_like(m))
    return (acc * weight[..., None]).sum(0) / (l * weight).sum(0)[..., None]
