"""Codes of four packed bytes turned into float16 by inline PTX, and an exact emulation of that PTX on the CPU.

The unpack of pnmix/kernels/NOTES.md's change 3 (the decode kernel's value codes behind a switch,
`pnmix.kernels.ptx_unpack`): one 32-bit word holds four packed bytes whose codes share one shift (the same field of
four adjacent channels). Six instructions give
the four codes as two float16x2 registers: `shr` and `and` take every byte's field down to its low bits at
once, two `prmt` put each byte under the float16 exponent of 1024 (0x64: 1024 + code, exact for codes below
1024), and two `sub.f16x2` subtract 1024. The Triton interpreter cannot run inline PTX, so `emulate` executes
the PTX text itself, instruction by instruction, with the semantics of the PTX ISA (`shr.b32` logical, `prmt`
in its default mode, `sub.f16x2` rounding to nearest even), and the tests compare it with the plain unpack for
every shift and plane width.
"""

from __future__ import annotations

import re

import numpy as np

#: Plane widths the packing uses (`reference.equations.packing.bit_planes`), and 8 (one plane of 8-bit codes).
WIDTHS = (1, 2, 4, 8)
#: Constraints of `unpack4_f16` for `tl.inline_asm_elementwise`: two 32-bit outputs, one 32-bit input.
CONSTRAINTS = "=r,=r,r"
#: Constraints of `unpack4_f16_by_operand` with pack=4: two 32-bit outputs, the four bytes in one 32-bit register
#: (Triton packs inputs narrower than 32 bits), then the four elements' int32 shifts, of which the PTX reads the first.
OPERAND_CONSTRAINTS = "=r,=r,r,r,r,r,r"


def unpack4_f16(shift: int, width: int) -> str:
    """PTX of four codes (byte >> shift) & (2**width - 1), bytes 0-3 of the word $2, as float16 in $0 (bytes 0 and
    1, low half first) and $1 (bytes 2 and 3)."""
    if width not in WIDTHS or not 0 <= shift <= 8 - width or shift % width:
        raise ValueError(f"a field of {width} bits at shift {shift} is not one of a packed byte's fields")
    return _unpack4(str(shift), width)


def unpack4_f16_by_operand(width: int) -> str:
    """`unpack4_f16` with the shift read from the register $3 (the first of the four elements' shifts): for a tile
    whose shift varies by column, exact where each four elements Triton hands the PTX share one shift
    (`pnmix.kernels.ttgir` checks that in the compiled kernel)."""
    if width not in WIDTHS:
        raise ValueError(f"{width} bits is not a plane width of the packing ({WIDTHS})")
    return _unpack4("$3", width)


def _unpack4(shift: str, width: int) -> str:
    mask = ((1 << width) - 1) * 0x01010101
    return (
        "{\n"
        ".reg .b32 w, e, k;\n"
        f"shr.b32 w, $2, {shift};\n"
        f"and.b32 w, w, {mask:#010x};\n"
        "mov.b32 e, 0x64646464;\n"
        "mov.b32 k, 0x64006400;\n"
        "prmt.b32 $0, w, e, 0x4140;\n"
        "prmt.b32 $1, w, e, 0x4342;\n"
        "sub.f16x2 $0, $0, k;\n"
        "sub.f16x2 $1, $1, k;\n"
        "}"
    )


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
        elif op == "prmt.b32":
            result = _prmt(*args)
        elif op == "sub.f16x2":
            result = _sub_f16x2(*args)
        else:
            raise ValueError(f"{op} is not emulated")
        regs[dst] = result & 0xFFFFFFFF
    return [regs[f"${i}"] for i in range(outputs)]


def float16_halves(words: list[int]) -> list[float]:
    """The float16 numbers of 32-bit words, low half first."""
    halves = np.array([h for w in words for h in (w & 0xFFFF, w >> 16)], dtype=np.uint16)
    return halves.view(np.float16).astype(np.float32).tolist()
