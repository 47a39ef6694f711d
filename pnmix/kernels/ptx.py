"""Codes of four packed bytes turned into float16 or bfloat16 by inline PTX, and an exact emulation of that PTX on
the CPU.

The unpack of pnmix/kernels/NOTES.md's change 3 (the decode kernel's value codes behind a switch,
`pnmix.kernels.ptx_unpack`): one 32-bit word holds four packed bytes whose codes share one shift (the same field of
four adjacent channels). Six instructions give the four codes as two 16-bit float pairs: `shr` and `and` take
every byte's field down to its low bits at once, two `prmt` put each byte under an exponent whose unit in the last
place is 1 (float16: 0x64, 1024 + code, exact for codes below 1024; bfloat16: 0x43, 128 + code, exact below 128,
so 1-, 2- and 4-bit fields only), and two pair operations subtract that power of two (float16: `sub.f16x2`;
bfloat16: `fma.rn.bf16x2` by 1 and -128, which sm_80 has; its `sub.bf16x2` needs sm_90). The Triton interpreter
cannot run inline PTX, so `emulate` executes the PTX text itself, instruction by instruction, with the semantics of
the PTX ISA (`shr.b32` logical, `prmt` in its default mode, the pair operations rounding to nearest even), and the
tests compare it with the plain unpack for every shift and plane width.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import torch

#: Plane widths the packing uses (`reference.equations.packing.bit_planes`), and 8 (one plane of 8-bit codes).
WIDTHS = (1, 2, 4, 8)
#: The widths each dtype's unpack takes: bfloat16's 7 mantissa bits hold codes below 128 only.
DTYPE_WIDTHS = {"float16": WIDTHS, "bfloat16": (1, 2, 4)}
#: Constraints of `unpack4` for `tl.inline_asm_elementwise`: two 32-bit outputs, one 32-bit input.
CONSTRAINTS = "=r,=r,r"
#: Constraints of `unpack4_by_operand` with pack=4: two 32-bit outputs, the four bytes in one 32-bit register
#: (Triton packs inputs narrower than 32 bits), then the four elements' int32 shifts, of which the PTX reads the first.
OPERAND_CONSTRAINTS = "=r,=r,r,r,r,r,r"


def _widths(dtype: str) -> tuple[int, ...]:
    if dtype not in DTYPE_WIDTHS:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_WIDTHS)}, got {dtype!r}")
    return DTYPE_WIDTHS[dtype]


def unpack4(shift: int, width: int, dtype: str = "float16") -> str:
    """PTX of four codes (byte >> shift) & (2**width - 1), bytes 0-3 of the word $2, as `dtype` numbers in $0 (bytes 0
    and 1, low half first) and $1 (bytes 2 and 3)."""
    if width not in _widths(dtype) or not 0 <= shift <= 8 - width or shift % width:
        raise ValueError(f"a field of {width} bits at shift {shift} is not one of a packed byte's fields ({dtype})")
    return _unpack4(str(shift), width, dtype)


def unpack4_by_operand(width: int, dtype: str = "float16") -> str:
    """`unpack4` with the shift read from the register $3 (the first of the four elements' shifts): for a tile
    whose shift varies by column, exact where each four elements Triton hands the PTX share one shift
    (`pnmix.kernels.ttgir` checks that in the compiled kernel)."""
    if width not in _widths(dtype):
        raise ValueError(f"{width} bits is not a plane width the {dtype} unpack takes ({_widths(dtype)})")
    return _unpack4("$3", width, dtype)


#: Constraints of `fragment_pair` for `gl.inline_asm_elementwise` with pack=2: one 32-bit output (the float16 pair),
#: the two elements' words, then their shifts (each pair's two elements hold the same word and shift).
PAIR_CONSTRAINTS = "=r,r,r,r,r"


def fragment_pair(width: int) -> str:
    """PTX of the two codes of one word at bits [s, s + width) and [16 + s, 16 + s + width), s the register $3, as a
    float16 pair in $0 (low half first): shift, mask both, put each under the exponent of 1024 and subtract 1024
    (ptxas fuses the mask and the exponent into one `lop3`): the fragment-order unpack
    (`pnmix.kernels.fragment_decode`), 1.5 instructions per code. $1 and $2 are the word twice, $3 and $4 the shift
    twice (Gluon's pack=2 hands each call two elements)."""
    if width not in (1, 2, 4):
        raise ValueError(f"width must be 1, 2 or 4 bits (two codes of a word's halves), got {width}")
    mask = ((1 << width) - 1) * 0x00010001
    return "\n".join(
        [
            "{",
            ".reg .b32 w, k;",
            "shr.b32 w, $1, $3;",
            f"and.b32 w, w, {mask:#010x};",
            "or.b32 w, w, 0x64006400;",
            "mov.b32 k, 0x64006400;",
            "sub.f16x2 $0, w, k;",
            "}",
        ]
    )


def _unpack4(shift: str, width: int, dtype: str) -> str:
    mask = ((1 << width) - 1) * 0x01010101
    if dtype == "float16":  # 1024 + code, minus 1024
        under, regs, subtract = (
            "0x64646464",
            "w, e, k",
            ["mov.b32 k, 0x64006400;", "sub.f16x2 $0, $0, k;", "sub.f16x2 $1, $1, k;"],
        )
    else:  # 128 + code, times 1 minus 128
        under, regs = "0x43434343", "w, e, k, u"
        subtract = [
            "mov.b32 k, 0xC300C300;",
            "mov.b32 u, 0x3F803F80;",
            "fma.rn.bf16x2 $0, $0, u, k;",
            "fma.rn.bf16x2 $1, $1, u, k;",
        ]
    lines = [
        "{",
        f".reg .b32 {regs};",
        f"shr.b32 w, $2, {shift};",
        f"and.b32 w, w, {mask:#010x};",
        f"mov.b32 e, {under};",
        *[line for line in subtract if line.startswith("mov")],
        "prmt.b32 $0, w, e, 0x4140;",
        "prmt.b32 $1, w, e, 0x4342;",
        *[line for line in subtract if not line.startswith("mov")],
        "}",
    ]
    return "\n".join(lines)


_LINE = re.compile(r"^\s*([a-z0-9.]+)\s+(.*?);\s*$")


def _prmt(a: int, b: int, selector: int) -> int:
    """prmt.b32 in its default mode: byte i of the result is byte (selector >> 4 i) & 7 of {b, a} (a the low
    four), its sign replicated when bit 3 of that nibble is set."""
    pool = (b << 32 | a).to_bytes(8, "little")
    out = 0
    for i in range(4):
        nibble = selector >> (4 * i) & 0xF
        byte = pool[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _sub_f16x2(a: int, b: int) -> int:
    """sub.f16x2: each float16 half of a minus b's, rounded to nearest even (float32 holds the exact difference
    of two float16 numbers, so one rounding to float16 is the correctly rounded one)."""
    halves = np.array([a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16], dtype=np.uint16).view(np.float16)
    diff = (halves[:2].astype(np.float32) - halves[2:].astype(np.float32)).astype(np.float16)
    low, high = diff.view(np.uint16).tolist()
    return high << 16 | low


def _bf16_value(bits: int) -> Fraction:
    """The exact value of a finite bfloat16 bit pattern."""
    sign, exponent, mantissa = bits >> 15 & 1, bits >> 7 & 0xFF, bits & 0x7F
    if exponent == 0xFF:
        raise ValueError(f"bfloat16 {bits:#06x} is not finite: not emulated")
    value = (
        Fraction(mantissa, 128) * Fraction(2) ** -126
        if exponent == 0
        else (1 + Fraction(mantissa, 128)) * Fraction(2) ** (exponent - 127)
    )
    return -value if sign else value


def _bf16_round(x: Fraction) -> int:
    """x rounded to the nearest bfloat16, ties to even, as a bit pattern (normal numbers and zero only)."""
    if x == 0:
        return 0
    sign, a = (1 << 15 if x < 0 else 0), abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if a >= Fraction(2) ** (e + 1):
        e += 1
    elif a < Fraction(2) ** e:
        e -= 1
    scaled = a / Fraction(2) ** (e - 7)  # in [128, 256)
    m = round(scaled)  # Fraction.__round__ rounds half to even
    if m == 256:
        m, e = 128, e + 1
    if not -126 <= e <= 127:
        raise ValueError(f"{float(x)} is outside bfloat16's normal range: not emulated")
    return sign | (e + 127) << 7 | (m - 128)


def _fma_bf16x2(a: int, b: int, c: int) -> int:
    """fma.rn.bf16x2: each bfloat16 half a * b + c computed exactly and rounded once to nearest even."""
    low, high = (
        _bf16_round(_bf16_value(a >> s & 0xFFFF) * _bf16_value(b >> s & 0xFFFF) + _bf16_value(c >> s & 0xFFFF))
        for s in (0, 16)
    )
    return high << 16 | low


def emulate(ptx: str, *inputs: int, outputs: int = 2) -> list[int]:
    """Run PTX text of the instructions above on 32-bit operands: $0 .. $outputs-1 are the outputs, the inputs
    follow. Any other instruction or operand form is refused, so the emulation covers the whole text."""
    regs: dict[str, int] = {f"${outputs + i}": v & 0xFFFFFFFF for i, v in enumerate(inputs)}

    def value(operand: str) -> int:
        operand = operand.strip()
        if operand in regs:
            return regs[operand]
        if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", operand):
            return int(operand, 0) & 0xFFFFFFFF
        raise ValueError(f"operand {operand!r} is neither a register set before nor an immediate")

    for line in ptx.splitlines():
        line = line.strip()
        if line in ("{", "}") or line.startswith(".reg "):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"cannot read {line!r}")
        op, operands = m.group(1), [s.strip() for s in m.group(2).split(",")]
        dst, args = operands[0], [value(s) for s in operands[1:]]
        if op == "mov.b32":
            (result,) = args
        elif op == "shr.b32":
            result = args[0] >> min(args[1], 32)
        elif op == "and.b32":
            result = args[0] & args[1]
        elif op == "or.b32":
            result = args[0] | args[1]
        elif op == "prmt.b32":
            result = _prmt(*args)
        elif op == "sub.f16x2":
            result = _sub_f16x2(*args)
        elif op == "fma.rn.bf16x2":
            result = _fma_bf16x2(*args)
        else:
            raise ValueError(f"{op} is not emulated")
        regs[dst] = result & 0xFFFFFFFF
    return [regs[f"${i}"] for i in range(outputs)]


def float16_halves(words: list[int]) -> list[float]:
    """The float16 numbers of 32-bit words, low half first."""
    halves = np.array([h for w in words for h in (w & 0xFFFF, w >> 16)], dtype=np.uint16)
    return halves.view(np.float16).astype(np.float32).tolist()


def halves(words: list[int], dtype: str = "float16") -> list[float]:
    """The `dtype` numbers (float16 or bfloat16) of 32-bit words, low half first."""
    if dtype == "float16":
        return float16_halves(words)
    raw = torch.tensor([h for w in words for h in (w & 0xFFFF, w >> 16)], dtype=torch.int32).to(torch.int16)
    return raw.view(torch.bfloat16).float().tolist()
