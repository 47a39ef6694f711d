"""The GPUs the ahead-of-time gate (`pnmix.aot`) judges kernels for, with where each number comes from.

Boost clock, SM count and HBM bandwidth make the static issue-bound ceiling: a kernel that
issues I warp-instructions per B bytes of cache it reads cannot read faster than
B / I x (SMs x 4 schedulers x clock) bytes per second, whatever the memory system does.
"""

from __future__ import annotations

from typing import NamedTuple


class GPU(NamedTuple):
    name: str
    arch: int  # compute capability, 80 = sm_80
    sms: int
    boost_ghz: float
    hbm_gbps: float  # GB/s, 10^9 bytes
    smem_per_block: int  # bytes a block may opt in to (the kernel's shared memory must fit)
    source: str

    @property
    def issue_rate(self) -> float:
        """Warp-instructions per second the whole chip can issue: 4 schedulers per SM, 1 per clock."""
        return self.sms * 4 * self.boost_ghz * 1e9


_SMEM = "CUDA C++ Programming Guide, Technical Specifications per Compute Capability, max shared memory per block"

GPUS = (
    GPU("A100-SXM4-40GB", 80, 108, 1.41, 1555.0, 166_912,
        f"NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 1410 MHz boost, 1555 GB/s); {_SMEM}: 163 KB"),
    GPU("H100-SXM", 90, 132, 1.98, 3350.0, 232_448,
        f"NVIDIA H100 Tensor Core GPU datasheet (SXM5: 132 SMs, 1980 MHz max boost, 3.35 TB/s); {_SMEM}: 227 KB"),
    GPU("H200", 90, 132, 1.98, 4800.0, 232_448,
        f"NVIDIA H200 Tensor Core GPU product brief (H100 SXM chip, 4.8 TB/s HBM3e); {_SMEM}: 227 KB"),
)  # fmt: skip

#: The compile targets: one per distinct compute capability.
ARCHS = tuple(sorted({g.arch for g in GPUS}))

#: Static ceilings the default configuration's decode kernel must reach (fraction of HBM bandwidth).
REQUIRED_CEILING = {"A100-SXM4-40GB": 0.70, "H100-SXM": 0.50}


def smem_limit(arch: int) -> int:
    """The smallest per-block shared memory of the GPUs of this compute capability."""
    return min(g.smem_per_block for g in GPUS if g.arch == arch)


def ceiling(gpu: GPU, bytes_per_tile: float, warp_instructions_per_tile: float) -> float:
    """Fraction of HBM bandwidth reachable when instruction issue is the only limit."""
    return bytes_per_tile / warp_instructions_per_tile * gpu.issue_rate / (gpu.hbm_gbps * 1e9)
