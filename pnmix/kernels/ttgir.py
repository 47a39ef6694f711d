"""Which elements each packed inline-asm call receives, read from a compiled kernel's TTGIR.

`tl.inline_asm_elementwise(..., pack=4)` hands the PTX four consecutive registers of each thread, whichever elements
the layout puts there ("exactly which set of inputs a block receives is unspecified"). The PTX unpack
(`pnmix.kernels.ptx.unpack4_f16_by_operand`) shifts all four bytes by the first one's shift, so it is exact only
where the four share one shift: four elements of one column, or four adjacent columns of one row starting at a
multiple of 4 (the launch makes every field's run of columns a multiple of 4 long). Triton lowers the op in the
register order of its operands' layout (`ElementwiseInlineAsmOpConversion`: consecutive elements of
`unpackLLElements`, padded when a thread holds no multiple of the pack), so the layout in the final TTGIR says which
four: for `#ttg.blocked` the first registers run along `order[0]` over `sizePerThread`, for `#ttg.linear` the
register bases are written out. Any other layout is refused, as not shown to group by shift.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_ALIAS = re.compile(r"^(#[\w.]+)\s*=\s*(#ttg\.\w+<.*>)\s*$", re.M)
_TENSOR = re.compile(r"tensor<((?:\d+x)+)(\w+)(?:,\s*(#[\w.]+))?>")
_KEY = re.compile(r"(\w+)\s*=\s*\[")


@dataclass(frozen=True)
class AsmOp:
    """One `tt.elementwise_inline_asm` op: its pack, its operands' and results' shapes, element types and layouts."""

    pack: int
    operands: tuple[tuple[tuple[int, ...], str, str], ...]
    results: tuple[tuple[tuple[int, ...], str, str], ...]


def inline_asm_ops(ttgir: str) -> list[AsmOp]:
    """Every packed inline-asm op of the module (its types as printed after the op's ':')."""
    ops = []
    for line in ttgir.splitlines():
        if "tt.elementwise_inline_asm" not in line:
            continue
        pack = re.search(r"packed_element\s*=\s*(\d+)", line)
        ins, _, outs = line.rpartition(" : ")[2].partition("->")
        ops.append(AsmOp(int(pack.group(1)) if pack else 1, _types(ins), _types(outs)))
    return ops


def _types(text: str) -> tuple[tuple[tuple[int, ...], str, str], ...]:
    """(shape, element type, layout alias) of each tensor type in `text`."""
    return tuple((tuple(int(n) for n in dims[:-1].split("x")), elem, lay) for dims, elem, lay in _TENSOR.findall(text))


def layouts(ttgir: str) -> dict[str, str]:
    """The module's layout aliases (`#blocked3` -> `#ttg.blocked<{...}>`)."""
    return {name: body for name, body in _ALIAS.findall(ttgir)}


def register_bases(layout: str, shape: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """The element offset of each register bit of one thread (bit 0 first), from a blocked or linear layout; None
    for any other layout. Blocked: `sizePerThread` along `order` (dimensions the tensor is smaller than broadcast:
    offset 0), then no more (repetitions are not needed for the first bits, and are not derived)."""
    fields = _lists(layout)
    if layout.startswith("#ttg.linear"):
        return [tuple(b) for b in fields.get("register", [])]
    if not layout.startswith("#ttg.blocked"):
        return None
    bases = []
    for dim in fields["order"]:
        for bit in range(fields["sizePerThread"][dim].bit_length() - 1):
            step = 1 << bit
            bases.append(tuple(step if d == dim and step < shape[d] else 0 for d in range(len(shape))))
    return bases


def other_bases(layout: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Offsets of everything but the first two register bits (lanes, warps, blocks, later registers) of a linear
    layout; of a blocked one, those the first two bits' alignment depends on: later registers and lanes and warps
    along each dimension in steps of whole `sizePerThread` runs."""
    fields = _lists(layout)
    if layout.startswith("#ttg.linear"):
        keys = ("register", "lane", "warp", "block")
        return [tuple(b) for key in keys for b in fields.get(key, [])[2 if key == "register" else 0 :]]
    rank = len(shape)
    size = fields["sizePerThread"]
    later = (register_bases(layout, shape) or [])[2:]
    runs = [tuple(size[d] if d == dim else 0 for d in range(rank)) for dim in range(rank)]
    return later + runs


def _lists(layout: str) -> dict[str, list]:
    """The layout's fields whose values are (nested) lists of ints: `sizePerThread = [1, 4]`, `register = [[0, 1]]`."""
    fields = {}
    for m in _KEY.finditer(layout):
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(layout)):
            depth += {"[": 1, "]": -1}.get(layout[end], 0)
            if depth == 0:
                break
        fields[m.group(1)] = json.loads(layout[m.end() - 1 : end + 1])
    return fields


def grouping_problems(ttgir: str) -> list[str]:
    """Why some packed inline-asm op of the module may hand the PTX four elements of different shifts ([] when every
    op groups four elements of one column, or four adjacent columns of one row starting at a multiple of 4)."""
    aliases = layouts(ttgir)
    found = []
    for n, op in enumerate(inline_asm_ops(ttgir)):
        where = f"inline asm #{n}"
        if op.pack != 4:
            found.append(f"{where}: packed_element = {op.pack}, not 4")
            continue
        if not op.operands or op.operands[0][1] != "i8":
            found.append(f"{where}: its first operand is not the tile of packed bytes (i8): {op.operands[:1]}")
            continue
        shape, _, alias = op.operands[0]
        if {lay for _, _, lay in op.operands + op.results} != {alias}:
            found.append(f"{where}: its operands and results do not share one layout")
            continue
        layout = aliases.get(alias, alias)
        bases = register_bases(layout, shape)
        if bases is None:
            found.append(f"{where}: layout {layout} is neither blocked nor linear")
            continue
        if len(bases) < 2:
            found.append(f"{where}: {layout} gives a thread fewer than 4 elements in a row (groups cross repetitions)")
            continue
        col = len(shape) - 1
        b0, b1 = bases[0], bases[1]
        one_column = b0[col] == b1[col] == 0 and any(b0) and any(b1) and b0 != b1
        quad = b0 == tuple(1 if d == col else 0 for d in range(len(shape))) and b1 == tuple(
            2 if d == col else 0 for d in range(len(shape))
        )
        if quad and any(b[col] % 4 for b in other_bases(layout, shape)):
            found.append(f"{where}: four adjacent columns in {layout}, not starting at a multiple of 4")
        elif not (one_column or quad):
            found.append(f"{where}: the four elements of a call lie at offsets 0, {b0}, {b1} in {layout}")
    return found
