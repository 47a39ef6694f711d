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
from pathlib import Path

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
LABEL = re.compile(r"^(\.L_x_\d+):")


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


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin, as nvdisasm prints it (-c: code sections only)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([_tool("nvdisasm"), "-c", str(path)], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"nvdisasm could not read the cubin: {done.stderr.strip() or 'no output'}")
    return done.stdout


def resource_usage(cubin: bytes) -> str:
    """cuobjdump -res-usage of a cubin (registers, stack, local and shared memory)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([_tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True).stdout


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
