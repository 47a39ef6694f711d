"""Codes of packed bytes as dot operands: plainly, or four at a time by inline PTX (`pnmix.kernels.ptx`), and a probe
kernel that runs both on every byte at every shift of every plane width, for the first-use self-test
(`pnmix.kernels.ptx_unpack`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pnmix import _runtime  # noqa: F401  (decides compiled vs interpreted before the kernels below)
from pnmix.kernels import ptx

_CONSTRAINTS = tl.constexpr(ptx.OPERAND_CONSTRAINTS)
_ASM_1 = tl.constexpr(ptx.unpack4_by_operand(1))
_ASM_2 = tl.constexpr(ptx.unpack4_by_operand(2))
_ASM_4 = tl.constexpr(ptx.unpack4_by_operand(4))
_ASM_8 = tl.constexpr(ptx.unpack4_by_operand(8))
_ASM_BF16_1 = tl.constexpr(ptx.unpack4_by_operand(1, "bfloat16"))
_ASM_BF16_2 = tl.constexpr(ptx.unpack4_by_operand(2, "bfloat16"))
_ASM_BF16_4 = tl.constexpr(ptx.unpack4_by_operand(4, "bfloat16"))
#: The (dtype, plane width) pairs the PTX unpack takes, as the self-test probes them.
PROBED = tuple((dtype, bits) for dtype, widths in ptx.DTYPE_WIDTHS.items() for bits in widths)
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: Tokens (rows) of the probe's tile: with 128 columns every byte value lands at every shift of every width.
PROBE_ROWS = 16
PROBE_COLUMNS = 128


@triton.jit
def code_to(code, DOT: tl.constexpr):
    """Integer codes (int32, below 256) as DOT floats, exactly. For float16, under the exponent
    of 1024 a code is the mantissa, so an OR and a subtraction in pairs replace a conversion
    per element (bfloat16 converts plainly: the interpreter cannot check its bit patterns)."""
    if DOT == tl.float16:
        return (code | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True) - 1024.0
    else:
        return code.to(DOT)


@triton.jit
def _ptx4(packed, shift, F16: tl.constexpr, BF16: tl.constexpr, DOT: tl.constexpr):
    """Four codes of one shift per call as DOT numbers by the PTX `F16` (float16) or `BF16` (bfloat16)."""
    if DOT == tl.bfloat16:
        return tl.inline_asm_elementwise(BF16, _CONSTRAINTS, [packed, shift], dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        tl.static_assert(DOT == tl.float16, "the PTX unpack gives float16 or bfloat16 codes")
        return tl.inline_asm_elementwise(F16, _CONSTRAINTS, [packed, shift], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def field_codes(packed, shift, BITS: tl.constexpr, DOT: tl.constexpr, PTX: tl.constexpr):
    """(packed >> shift) & (2**BITS - 1) of uint8 bytes as DOT numbers, exactly (shift: int32, broadcast to packed).

    PTX (float16; bfloat16 at 1, 2 or 4 bits): four codes per six instructions (`ptx.unpack4_by_operand`), which
    shifts each four elements a thread holds by the first one's shift: the caller's shift must be one per four
    adjacent columns (starting at a multiple of 4), and the compiled layout must hand the PTX such fours
    (`pnmix.kernels.ttgir`)."""
    if PTX:
        if BITS == 1:
            return _ptx4(packed, shift, _ASM_1, _ASM_BF16_1, DOT)
        elif BITS == 2:
            return _ptx4(packed, shift, _ASM_2, _ASM_BF16_2, DOT)
        elif BITS == 4:
            return _ptx4(packed, shift, _ASM_4, _ASM_BF16_4, DOT)
        else:
            tl.static_assert(DOT == tl.float16, "bfloat16 codes by the PTX unpack: 1, 2 or 4 bits")
            return _ptx4(packed, shift, _ASM_8, _ASM_8, DOT)
    else:
        return code_to((packed.to(tl.int32) >> shift) & ((1 << BITS) - 1), DOT)


@triton.jit
def _probe_kernel(
    bytes_ptr, out_ptr, BITS: tl.constexpr, N: tl.constexpr, D: tl.constexpr, PTX: tl.constexpr, DOT: tl.constexpr
):
    """The decode kernel's value unpack on a [N, D] tile in its field-major column order: column c holds the field
    c // (D / per) of byte c % (D / per) of its row (per = 8 // BITS fields per byte)."""
    DP: tl.constexpr = D // (8 // BITS)
    rows = tl.arange(0, N)
    cols = tl.arange(0, D)
    packed = tl.load(bytes_ptr + rows[:, None] * DP + (cols % DP)[None, :])
    codes = field_codes(packed, ((cols // DP) * BITS)[None, :], BITS, DOT, PTX)
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], codes)


def probe_bytes(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The probe's packed bytes for one width, [PROBE_ROWS, D / per] uint8: byte i is 167 i mod 256 (167 is odd, so
    every 256 consecutive bytes hold every value; each field position sees every byte)."""
    per = 8 // bits
    n = PROBE_ROWS * (PROBE_COLUMNS // per)
    return ((torch.arange(n) * 167) % 256).to(torch.uint8).reshape(PROBE_ROWS, -1).to(device)


def expected_codes(bits: int, dtype: str = "float16") -> torch.Tensor:
    """The probe's codes computed on the host, [PROBE_ROWS, PROBE_COLUMNS] of `dtype` (column order as the
    kernel's)."""
    packed = probe_bytes(bits).to(torch.int32)
    dp = packed.shape[1]
    cols = torch.arange(PROBE_COLUMNS)
    shift = (cols // dp) * bits
    return ((packed[:, cols % dp] >> shift) & ((1 << bits) - 1)).to(TORCH_DTYPES[dtype])


def probe(bits: int, use_ptx: bool, device: torch.device, dtype: str = "float16") -> torch.Tensor:
    """The probe kernel's codes for one width as `dtype`, by the PTX unpack or the plain one, on `device` (CUDA)."""
    out = torch.empty(PROBE_ROWS, PROBE_COLUMNS, dtype=TORCH_DTYPES[dtype], device=device)
    dot = tl.float16 if dtype == "float16" else tl.bfloat16
    _probe_kernel[(1,)](probe_bytes(bits, device), out, bits, PROBE_ROWS, PROBE_COLUMNS, use_ptx, dot, num_warps=4)
    return out
