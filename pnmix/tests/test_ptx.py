"""The inline-PTX unpack (`pnmix.kernels.ptx`) executed by an exact emulation of its instructions, against the
plain unpack, for every plane width and shift and every byte in every position of the word."""

from __future__ import annotations

import pytest

from pnmix.kernels import ptx


def test_the_emulated_instructions_follow_the_ptx_isa():
    # prmt, default mode: byte i of d from nibble i of the selector over {b, a} (a = bytes 0-3, b = bytes 4-7)
    assert ptx._prmt(0x33221100, 0x77665544, 0x3210) == 0x33221100
    assert ptx._prmt(0x33221100, 0x77665544, 0x7654) == 0x77665544
    assert ptx._prmt(0x33221100, 0x77665544, 0x4140) == 0x44114400
    assert ptx._prmt(0x000080FF, 0, 0xA292) == 0x0000FF00  # nibbles 9, A: the signs of bytes 1 (0x80) and 2 (0)
    # f16x2: 1024 + 3 and 1024 + 1 minus 1024 in both halves; 2049 is not a float16: 1024 + 1025 rounds to even
    assert ptx._sub_f16x2(0x64016403, 0x64006400) == 0x3C004200  # 1.0 (high), 3.0 (low)
    assert ptx.float16_halves([ptx._sub_f16x2(0x68006800, 0xBC00BC00)]) == [2048.0, 2048.0]
    # bf16x2: (128 + 3) * 1 - 128 in both halves; 129 * 1 + 0.5 is not a bfloat16 (spacing 1 there): ties to even
    assert ptx._fma_bf16x2(0x43014303, 0x3F803F80, 0xC300C300) == 0x3F804040  # 1.0 (high), 3.0 (low)
    assert ptx.halves([ptx._fma_bf16x2(0x43014301, 0x3F803F80, 0x3F003F00)], "bfloat16") == [130.0, 130.0]
    assert ptx.halves([ptx._fma_bf16x2(0x43004300, 0x3F803F80, 0x3F003F00)], "bfloat16") == [128.0, 128.0]
    assert ptx.emulate("shr.b32 $1, $2, 4;\nmov.b32 $0, $1;", 0xF0, outputs=2) == [0xF, 0xF]
    with pytest.raises(ValueError, match="not emulated"):
        ptx.emulate("cvt.rn.f16.u32 $0, $1;", 1, outputs=1)
    with pytest.raises(ValueError, match="neither a register"):
        ptx.emulate("and.b32 $0, w, 1;", 1, outputs=1)


FIELDS = [(t, w, s) for t, widths in ptx.DTYPE_WIDTHS.items() for w in widths for s in range(0, 8, w)]


@pytest.mark.parametrize(("dtype", "width", "shift"), FIELDS, ids=lambda v: str(v))
def test_the_ptx_unpack_gives_every_code_of_every_field_exactly(dtype, width, shift):
    text = ptx.unpack4(shift, width, dtype)
    mask = (1 << width) - 1
    for first in range(256):  # every byte value in every position of the word
        packed = [(first + 67 * i) % 256 for i in range(4)]
        word = int.from_bytes(bytes(packed), "little")
        got = ptx.halves(ptx.emulate(text, word), dtype)
        assert got == [float((b >> shift) & mask) for b in packed], (dtype, width, shift, packed)


@pytest.mark.parametrize(
    ("width", "shift", "dtype"),
    [
        (3, 0, "float16"),
        (2, 1, "float16"),
        (2, 8, "float16"),
        (4, 6, "float16"),
        (1, 8, "float16"),
        (8, 1, "float16"),
        (8, 0, "bfloat16"),  # bfloat16's 7 mantissa bits hold codes below 128 only
    ],
)
def test_a_shift_that_is_not_a_field_of_a_byte_is_refused(width, shift, dtype):
    with pytest.raises(ValueError, match="not one of a packed byte's fields"):
        ptx.unpack4(shift, width, dtype)
    with pytest.raises(ValueError, match="dtype must be one of"):
        ptx.unpack4(0, 2, "float32")


@pytest.mark.parametrize(
    ("dtype", "pair"), [("float16", ["sub.f16x2"] * 2), ("bfloat16", ["fma.rn.bf16x2"] * 2 + ["mov.b32"])]
)
def test_six_instructions_per_four_codes_besides_the_constants(dtype, pair):
    ops = [line.split()[0] for line in ptx.unpack4(2, 2, dtype).splitlines() if line.split()[0][0].isalpha()]
    assert sorted(ops) == sorted(["shr.b32", "and.b32", "prmt.b32", "prmt.b32", *pair] + ["mov.b32"] * 2)


@pytest.mark.parametrize(("dtype", "width"), [(t, w) for t, widths in ptx.DTYPE_WIDTHS.items() for w in widths])
def test_the_shift_operand_form_shifts_all_four_bytes_by_the_first_elements_shift(dtype, width):
    text = ptx.unpack4_by_operand(width, dtype)
    mask = (1 << width) - 1
    for shift in range(0, 8, width):
        for first in range(0, 256, 5):
            packed = [(first + 67 * i) % 256 for i in range(4)]
            word = int.from_bytes(bytes(packed), "little")
            # the other three elements' shifts are operands too, never read: a wrong one changes nothing
            got = ptx.halves(ptx.emulate(text, word, shift, 7, 0xFFFF, 3), dtype)
            assert got == [float((b >> shift) & mask) for b in packed], (width, shift, packed)
    assert ptx.OPERAND_CONSTRAINTS.split(",").count("=r") == 2 and len(ptx.OPERAND_CONSTRAINTS.split(",")) == 7
    with pytest.raises(ValueError, match="not a plane width"):
        ptx.unpack4_by_operand(3)
    with pytest.raises(ValueError, match="not a plane width"):
        ptx.unpack4_by_operand(8, "bfloat16")
