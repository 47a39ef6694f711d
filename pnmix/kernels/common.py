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
