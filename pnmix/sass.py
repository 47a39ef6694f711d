"""A compiled kernel as its SASS, and a digest that says whether two compilations are the same machine code.

A kernel timing measures machine code, not source: a comment, a rename or a refactor that compiles to the same
SASS leaves the timing true, and a change of a launch choice or of Triton's code generation does not. The digest
hashes the disassembled instructions and branch labels in order (nvdisasm, from the triton wheel): not the cubin's
bytes, which carry line tables that move with any edit above a kernel, and not the addresses, which the order
implies. `pnmix.aot.kernel_digests` compiles the package's own launches for a GPU target without a GPU, so a result
timed on a device records these digests and a CPU tells later whether its kernels are still the ones it timed
(`reports.currency`).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
LABEL = re.compile(r"^(\.L_x_\d+):")
#: A branch to a label: backward, it closes a loop.
BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def toolchain() -> dict[str, str] | str:
    """Paths of ptxas, cuobjdump and nvdisasm, or why they cannot be used."""
    try:
        from triton import knobs

        tools = {name: getattr(knobs.nvidia, name).path for name in ("ptxas", "cuobjdump", "nvdisasm")}
    except Exception as exc:
        return f"triton's CUDA toolchain is unavailable: {exc}"
    missing = [name for name, path in tools.items() if not path or not os.access(path, os.X_OK)]
    if missing:
        return f"not found: {', '.join(missing)} (triton ships them in triton/backends/nvidia/bin)"
    return tools


def _tool(name: str) -> str:
    tools = toolchain()
    if isinstance(tools, str):
        raise RuntimeError(f"cannot read SASS: {tools}")
    return tools[name]


def disassemble(cubin: bytes, encoding: bool = False) -> str:
    """The SASS of a cubin, as nvdisasm prints it (-c: code sections only; encoding: with each instruction's
    128-bit encoding, -hex, which `instructions` reads the control codes from)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        flags = ["-c", "-hex"] if encoding else ["-c"]
        done = subprocess.run([_tool("nvdisasm"), *flags, str(path)], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"nvdisasm could not read the cubin: {done.stderr.strip() or 'no output'}")
    return done.stdout


def resource_usage(cubin: bytes) -> str:
    """cuobjdump -res-usage of a cubin (registers, stack, local and shared memory)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([_tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True).stdout


def registers_and_local_bytes(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, local bytes per thread: spills and stack) of a cubin, from `resource_usage`; -1
    registers where cuobjdump reports none."""
    usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", resource_usage(cubin)))
    return int(usage.get("REG", -1)), int(usage.get("LOCAL", 0)) + int(usage.get("STACK", 0))


_ENCODED = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* (0x[0-9a-f]{16}) \*/")
_HIGH_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
_GUARD = re.compile(r"^@!?U?P[T0-9]+\s+")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction of sm_70 and later with the control code ptxas scheduled it with.

    The control code is the top 23 bits of the 128-bit encoding (bits 105-127; Jia et al., "Dissecting the NVIDIA
    Volta GPU Architecture via Microbenchmarking", 2018, section 2.2, and CuAssembler's documentation, which carry it
    to Turing, Ampere and Hopper): from the least significant, 4 bits of stall count (cycles before the warp may
    issue its next instruction), 1 yield bit, 3 bits of write-barrier index and 3 of read-barrier index (7: none;
    six scoreboards per warp that a variable-latency instruction releases when its result is written, or its
    operands read), 6 bits of wait mask (the scoreboards that must be released before this instruction issues) and
    4 operand-reuse bits."""

    text: str  # as nvdisasm prints it, without the ";"
    stall: int
    write_barrier: int | None
    read_barrier: int | None
    wait_mask: int

    @property
    def opcode(self) -> str:
        """The opcode with its modifiers, without a guard predicate: "IMAD.MOV.U32"."""
        return _GUARD.sub("", self.text).split(" ", 1)[0]

    @property
    def base(self) -> str:
        """The opcode without modifiers: "IMAD"."""
        return self.opcode.split(".", 1)[0]


def control_code(high_word: int) -> tuple[int, int | None, int | None, int]:
    """(stall, write barrier, read barrier, wait mask) of the upper 64 bits of an instruction's encoding."""
    code = high_word >> 41
    write, read = (code >> 5) & 7, (code >> 8) & 7
    return code & 15, None if write == 7 else write, None if read == 7 else read, (code >> 11) & 63


def instructions(encoded: str) -> list[Instruction | str]:
    """The instructions of a `disassemble(..., encoding=True)` listing, with their control codes, and its branch
    labels (as strings), in order."""
    out: list[Instruction | str] = []
    lines = encoded.splitlines()
    for i, line in enumerate(lines):
        if m := LABEL.match(line):
            out.append(m.group(1))
        elif m := _ENCODED.match(line):
            high = _HIGH_WORD.match(lines[i + 1]) if i + 1 < len(lines) else None
            if high is None:
                raise ValueError(f"SASS line {i + 1} has no second encoding word: not an sm_70+ -hex listing")
            stall, write, read, wait = control_code(int(high.group(1), 16))
            out.append(Instruction(m.group(2).strip(), stall, write, read, wait))
    return out


def code_lines(sass: str) -> list[str]:
    """The instructions (without their addresses) and branch labels of a SASS listing, in order."""
    out = []
    for line in sass.splitlines():
        if m := LABEL.match(line):
            out.append(m.group(1) + ":")
        elif m := INSTRUCTION.match(line):
            out.append(m.group(2).strip())
    return out


def listing_digest(sass: str) -> str:
    """sha256 of a SASS listing's instructions and labels (`code_lines`): equal for the same machine code."""
    lines = code_lines(sass)
    if not lines:
        raise RuntimeError("the SASS listing holds no instruction")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def digest(cubin: bytes) -> str:
    """`listing_digest` of a cubin's SASS."""
    return listing_digest(disassemble(cubin))


def digest_of(compiled) -> str:
    """The digest of a Triton compiled kernel (what `triton.compile` or a launch on a device returns)."""
    return digest(compiled.asm["cubin"])
