"""Device functions shared by every kernel: Eq. 2 / Eq. 7 parameters, encoding, unpacking.

They follow the numerics of `reference.equations.quant` operation for operation (float32, correctly
rounded division, half-up rounding from the stored scale and zero), so codes are bit-identical.
"""

import triton
import triton.language as tl

from pnmix import _runtime  # noqa: F401


@triton.jit
def eq2_eq7_params(xmin, xmax, bits, MIDPOINT: tl.constexpr):
    """Float32 scale and zero of groups with the given min/max: Eq. 7 where bits == 1 (if
    MIDPOINT, PN-Mix), else Eq. 2 (also at 1 bit without MIDPOINT, as KIVI)."""
    span = xmax - xmin
    levels = ((1 << bits) - 1).to(tl.float32)
    eq7 = (bits == 1) & MIDPOINT
    scale = tl.where(eq7, span * 0.5, tl.math.div_rn(span, levels))
    zero = tl.where(eq7, xmin + span * 0.25, xmin)
    return scale, zero


@triton.jit
def encode(x, scale, zero, bits):
    """Codes (int32) of float32 x from stored scale/zero (upcast): clip(floor((x - z) / s + 0.5))."""
    safe = tl.where(scale == 0.0, 1.0, scale)
    q = tl.floor(tl.math.div_rn(x - zero, safe) + 0.5)
    q = tl.where(scale == 0.0, 0.0, q)
    q = tl.minimum(tl.maximum(q, 0.0), ((1 << bits) - 1).to(tl.float32))
    return q.to(tl.int32)


@triton.jit
def _plane_bits(
    packed_ptr, block_row, within, col, row_stride, mask, BITS: tl.constexpr, BLOCK: tl.constexpr, W: tl.constexpr
):
    """The bits a code keeps in its W-bit plane, in place (0 where BITS has no such plane)."""
    if BITS & W:
        LOW: tl.constexpr = BITS - BITS % (2 * W)  # bits held by the wider planes, stored before this one
        PER: tl.constexpr = 8 // W
        row = block_row + BLOCK * LOW // 8 + within // PER
        byte = tl.load(packed_ptr + row * row_stride + col, mask=mask, other=0).to(tl.int32)
        return ((byte >> ((within % PER) * W)) & ((1 << W) - 1)) << LOW
    else:
        return (block_row + col) * 0


@triton.jit
def unpack_field(packed_ptr, pos, col, row_stride, mask, BITS: tl.constexpr):
    """The BITS-bit code at (pos, col) of a field packed along pos in bit planes (`reference.equations.packing`).

    pos: [R, 1] or [R, C] positions along the packed axis; col: column offsets (elements).
    """
    if BITS == 1 or BITS == 2 or BITS == 4 or BITS == 8:  # one plane: 8 // BITS codes per byte
        per: tl.constexpr = 8 // BITS
        byte = tl.load(packed_ptr + (pos // per) * row_stride + col, mask=mask, other=0).to(tl.int32)
        code = (byte >> ((pos % per) * BITS)) & ((1 << BITS) - 1)
    else:
        # Blocks of BLOCK positions (`reference.equations.packing.block_positions`), BLOCK * BITS / 8 bytes each:
        # the planes one after the other, widest first, the widest holding the lowest bits.
        BLOCK: tl.constexpr = 8 if BITS % 2 == 1 else 4
        block_row = (pos // BLOCK) * (BLOCK * BITS // 8)
        within = pos % BLOCK
        code = _plane_bits(packed_ptr, block_row, within, col, row_stride, mask, BITS, BLOCK, 4)
        code = code | _plane_bits(packed_ptr, block_row, within, col, row_stride, mask, BITS, BLOCK, 2)
        code = code | _plane_bits(packed_ptr, block_row, within, col, row_stride, mask, BITS, BLOCK, 1)
    return code


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """float32 x rounded to DTYPE, to nearest even (done by hand for bfloat16: the Triton
    interpreter truncates there, and the stored bits must match the spec's on every backend)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)


@triton.jit
def saturate(x, DTYPE: tl.constexpr):
    """Finite float32 x beyond DTYPE's largest finite value clamped to it (infinities and NaN kept),
    as `reference.equations.attention.saturating_cast`: dequantized values may pass 65504 by a rounding of
    their scale, and attention over finite inputs stays finite."""
    if DTYPE == tl.float16:
        big = 65504.0
    elif DTYPE == tl.bfloat16:
        big = 3.3895313892515355e38
    else:
        return x
    over = (tl.abs(x) > big) & (tl.abs(x) < float("inf"))
    return tl.where(over, tl.where(x > 0, big, -big), x)


#: The kernels' softmax is in base 2.
LOG2E = 1.4426950408889634


@triton.jit
def load_tile(
    pos,
    cols,
    d_ok,
    n_sink,
    n_q,
    sink_ptr,
    res_ptr,
    low_ptr,
    high_ptr,
    slot,
    scale_ptr,
    zero_ptr,
    dense_ptr,
    d,
    lo_row,
    hi_row,
    v_row,
    v_groups,
    rank_ptr,
    n_boost,
    IS_KEY: tl.constexpr,
    QUANT: tl.constexpr,
    G: tl.constexpr,
    VG: tl.constexpr,
    B_LO: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    B_HI: tl.constexpr,
    PAGE_RANKS: tl.constexpr,
):
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
            code = unpack_field(low_ptr, qp, c, lo_row, in_q, B_LO)
            if HAS_HIGH:
                if PAGE_RANKS:
                    rank = tl.load(rank_ptr + (qp // G) * d + c, mask=in_q, other=255).to(tl.int32)
                    col = tl.where(rank < n_boost, rank, -1)
                else:
                    col = slot[None, :]
                hi_ok = in_q & (col >= 0)
                code = code | (unpack_field(high_ptr, qp, col, hi_row, hi_ok, B_HI) << B_LO)
            p_off = (qp // G) * d + c
        else:  # packed along channels; per-token groups of VG channels
            code = unpack_field(low_ptr, c, qp * v_row, 1, in_q, B_LO)
            p_off = qp * v_groups + c // VG
        s = tl.load(scale_ptr + p_off, mask=in_q, other=0.0).to(tl.float32)
        z = tl.load(zero_ptr + p_off, mask=in_q, other=0.0).to(tl.float32)
        x += tl.where(in_q, s * code.to(tl.float32) + z, 0.0)
    else:
        x += tl.load(dense_ptr + qp * d + c, mask=in_q, other=0.0).to(tl.float32)
    return x


@triton.jit
def mma(a, b, SWAP: tl.constexpr):
    """a @ b, or with SWAP as (b^T a^T)^T: the same products summed in the same order along k, with the operands'
    roles in the MMA exchanged (b's rows become the MMA's m side). Which of the two the target's compiler issues
    in fewer instructions depends on the target (`launch_config`: on sm_90 the swapped value dot, 128 channels
    on the m side, becomes a warpgroup MMA)."""
    if SWAP:
        return tl.trans(tl.dot(tl.trans(b), tl.trans(a)))
    else:
        return tl.dot(a, b)


@triton.jit
def dot_f32(a, b, DOT: tl.constexpr, SWAP: tl.constexpr = False):
    """a (float32) @ b (DOT) with a carried as two DOT parts, hi + lo: operands of float32 grade
    on tensor cores, as the spec computes in float32 (rounding a, e.g. queries times key scales
    or probabilities, to float16 alone would add an error of its own, not the dtype's). SWAP: `mma`'s."""
    if DOT == tl.float32:
        return mma(a, b, SWAP)
    else:
        hi = a.to(DOT)
        return mma(hi, b, SWAP) + mma((a - hi.to(tl.float32)).to(DOT), b, SWAP)


@triton.jit
def headroom(top, DOT: tl.constexpr):
    """A power of two e >= 1 with top / e <= 2**14 for float16 operands (1 for the others, whose
    range is float32's). Operands divided by e stay finite in float16, and e rescales exponents
    only, so products scaled back are those of float32 operands: finite inputs at float16's edge
    (a scale of 65504 times a query) give finite attention. e is 1 below 2**14, bit for bit."""
    if DOT == tl.float16:
        return tl.where(top > 16384.0, tl.exp2(tl.ceil(tl.log2(tl.maximum(top, 16384.0))) - 14.0), 1.0)
    else:
        return 1.0


@triton.jit
def online_softmax(logits, pos, last_visible, m_i, l_i, CAUSAL: tl.constexpr, DOT: tl.constexpr):
    """One tile's step of the online softmax (base 2: logits are pre-scaled by log2 e).

    The weights are 2**-32 of the usual ones outside float16 (l_i the same, so the output is
    unchanged): unnormalized sums of bfloat16 values near 3e38 would pass float32's range, and
    float32's exponent range loses nothing to the shift (float16's would: it keeps 1)."""
    visible = pos[None, :] >= 0
    if CAUSAL:
        visible = visible & (pos[None, :] <= last_visible[:, None])
    logits = tl.where(visible, logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(logits - m_safe[:, None])
    if DOT != tl.float16:
        p = p * 2.3283064365386963e-10  # 2**-32 (not folded into m: maxima of 1e9 would absorb it)
    return p, alpha, l_i * alpha + tl.sum(p, axis=1), m_new


@triton.jit
def chunk(split, n_splits, n, BLOCK_N: tl.constexpr):
    """This split's share [lo, hi) of a segment of n tokens, in whole tiles."""
    size = tl.cdiv(tl.cdiv(n, n_splits), BLOCK_N) * BLOCK_N
    lo = split * size
    return lo, tl.minimum(lo + size, n)
