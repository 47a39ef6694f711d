"""The GPUs the ahead-of-time gate (`pnmix.aot`) judges kernels for, with where each number comes from.

Two static bounds on the fraction of HBM bandwidth a decode kernel can reach, each an upper bound
with its own assumptions (`issue_bound`, `memory_bound`); the lower one binds (`ceiling`).

- Issue: a kernel that issues I warp-instructions per B bytes of cache it reads cannot read faster
  than B / I x (SMs x 4 schedulers x clock) bytes per second, whatever the memory system does.
- Memory (Little's law): to stream at bandwidth W with a latency of L, W x L bytes must be in
  flight; a kernel that keeps P programs on an SM, each with S tiles of B bytes in flight, holds at
  most P x S x B per SM, so it cannot read faster than P x S x B x SMs / L.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class GPU(NamedTuple):
    name: str
    arch: int  # compute capability, 80 = sm_80
    sms: int
    boost_ghz: float
    hbm_gbps: float  # GB/s, 10^9 bytes
    smem_per_block: int  # bytes a block may opt in to (the kernel's shared memory must fit)
    dram_latency_ns: float  # an idle load's round trip to DRAM (see LATENCY_SOURCE)
    source: str

    @property
    def issue_rate(self) -> float:
        """Warp-instructions per second the whole chip can issue: 4 schedulers per SM, 1 per clock."""
        return self.sms * 4 * self.boost_ghz * 1e9

    @property
    def bytes_in_flight_per_sm(self) -> float:
        """Little's law: the bytes each SM must have requested and not yet received to stream at HBM bandwidth."""
        return self.hbm_gbps * 1e9 * self.dram_latency_ns * 1e-9 / self.sms


class SMLimits(NamedTuple):
    """What one SM of a compute capability holds at once (the occupancy calculator's inputs)."""

    registers: int  # 32-bit registers per SM
    register_unit: int  # registers are allocated per warp in units of this many
    warps: int  # resident warps per SM
    programs: int  # resident blocks per SM
    shared: int  # shared memory per SM, bytes
    shared_reserved: int  # shared memory the system reserves per block, bytes
    source: str


_SMEM = "CUDA C++ Programming Guide, Technical Specifications per Compute Capability, max shared memory per block"
_GUIDE = (
    "CUDA C++ Programming Guide, Technical Specifications per Compute Capability (64K registers, 64 warps, "
    "32 blocks per SM; {} KB shared memory per SM; 1 KB reserved per block) and the CUDA Occupancy Calculator "
    "(registers allocated per warp in units of 256)"
)

#: DRAM latency: the pointer-chasing benchmark `gpu-latency` of RRZE-HPC/gpu-benches (the suite of D. Ernst et al.,
#: "Analytical performance estimation during code generation on modern GPUs", J. Parallel Distrib. Comput. 2023,
#: doi:10.1016/j.jpdc.2022.11.003), its published result files at commit 1038c5d: a single thread walks a buffer
#: in random order, one dependent load at a time, with every cache line visited once per pass. Taken at the
#: buffers of 1.6-1.7 GB (DRAM, past every cache): A100-SXM4-80GB (`a100_80.txt`) 552.4 cycles at 1410 MHz =
#: 392 ns; GH200 (`gh200.txt`, the H100 GPU with HBM3/HBM3e at 1980 MHz) 688.8 cycles = 348 ns. A100-SXM4-40GB has
#: the 80 GB part's chip and clocks (HBM2 instead of HBM2e); H100-SXM and H200 take GH200's number (the same GPU
#: and clock; H200 is H100 with HBM3e). The same files give less at 65-100 MB
#: buffers (fewer page-table misses): A100 365-388 ns (1-7 % less), GH200 310-316 ns (9-11 % less); and a loaded
#: memory system answers later than an idle one.
LATENCY_SOURCE = "RRZE-HPC/gpu-benches gpu-latency (Ernst et al., JPDC 2023): A100-SXM4-80GB 392 ns, GH200 348 ns"

GPUS = (
    GPU(
        "A100-SXM4-40GB",
        80,
        108,
        1.41,
        1555.0,
        166_912,
        392.0,
        f"NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 1410 MHz boost, 1555 GB/s); {_SMEM}: 163 KB; "
        f"DRAM latency: {LATENCY_SOURCE}",
    ),
    GPU(
        "H100-SXM",
        90,
        132,
        1.98,
        3350.0,
        232_448,
        348.0,
        f"NVIDIA H100 Tensor Core GPU datasheet (SXM5: 132 SMs, 1980 MHz max boost, 3.35 TB/s); {_SMEM}: 227 KB; "
        f"DRAM latency: {LATENCY_SOURCE}",
    ),
    GPU(
        "H200",
        90,
        132,
        1.98,
        4800.0,
        232_448,
        348.0,
        f"NVIDIA H200 Tensor Core GPU product brief (H100 SXM chip, 4.8 TB/s HBM3e); {_SMEM}: 227 KB; "
        f"DRAM latency: {LATENCY_SOURCE}",
    ),
)

SM_LIMITS = {
    80: SMLimits(65536, 256, 64, 32, 167_936, 1024, _GUIDE.format(164)),
    90: SMLimits(65536, 256, 64, 32, 233_472, 1024, _GUIDE.format(228)),
}

#: The compile targets: one per distinct compute capability.
ARCHS = tuple(sorted({g.arch for g in GPUS}))

#: Targets at the default configuration (fp16 and bf16), as fractions of HBM bandwidth: the memory bound on every
#: GPU, and the binding ceiling (the lower of the two bounds) per dtype where named.
REQUIRED_MEMORY_BOUND = 0.90
#: The target the decode kernel is judged by: its predicted decode-attention speed-up over FP16 SDPA
#: (`pnmix.perfmodel.decode_step`) at this GPU and workload; the project's goal past it.
REQUIRED_SPEEDUP = {"gpu": "H100-SXM", "workload": "Qwen3-8B layer, B=64, 32K", "speedup": 2.0}
#: The fragment-order path's predicted speed-ups over FP16 SDPA required on REQUIRED_SPEEDUP's GPU (float16, the
#: default configuration): the long-context ones and no slower than FP16 at 4K.
REQUIRED_PATH_SPEEDUPS = {
    "Qwen3-8B layer, B=64, 32K": 2.0,
    "Qwen3-8B layer, B=1, 32K": 1.5,
    "Qwen3-8B layer, B=1, 4K": 1.0,
    "Qwen3-8B layer, B=64, 4K": 1.0,
}
#: The fragment-order path's predicted time in bfloat16 at most this many times float16's, at those points.
REQUIRED_BF16_RATIO = 1.15
GOAL_SPEEDUP = 3.0
#: The binding ceilings the kernel was once held to (bounds, not predictions: kept as facts the gate prints).
REQUIRED_CEILING = {
    "float16": {"A100-SXM4-40GB": 0.30, "H100-SXM": 0.25, "H200": 0.18},
    "bfloat16": {"A100-SXM4-40GB": 0.25, "H100-SXM": 0.20},
}


class Pipe(NamedTuple):
    """An execution pipe of an SM: the SASS opcodes it runs and its throughput, results (thread-operations) per
    clock per SM by compute capability; a warp-instruction is 32 results."""

    name: str
    lanes: dict[int, int]
    opcodes: frozenset[str]


#: Where the pipes' rates and opcodes come from.
PIPE_SOURCE = (
    "CUDA C++ Programming Guide, Arithmetic Instructions, throughput of native arithmetic instructions (operations "
    "per clock per multiprocessor): 32-bit floating-point add, multiply, multiply-add 64 (8.0) and 128 (9.0); 32-bit "
    "integer add, multiply, multiply-add, shift, compare, min, max, bitwise operations 64 (8.0, 9.0); type "
    "conversions (other than 8/16-bit integer to 32-bit integer) and 32-bit reciprocal, log2, exp2 16; warp shuffle "
    "32. Nsight Compute Kernel Profiling Guide, pipelines: fma runs FP32 arithmetic and the integer multiplies "
    "(IMAD, IMUL: on the fmaheavy half only, so half of the fp32 rate on sm_90); alu runs the other integer, bit, "
    "compare, select and move instructions and, from Ampere on, the packed FP32-to-FP16 conversion (F2FP); xu the "
    "other conversions and the transcendentals (MUFU)."
)
#: The pipes the gate counts besides issue (one warp-instruction per clock per scheduler, 4 per SM): each bounds
#: the loop at its own rate. Not counted: fp16 arithmetic (HADD2, HFMA2: 256 results per clock on 8.0 and 9.0, the
#: issue rate), loads and stores, tensor cores, uniform-datapath instructions (U*).
PIPES = (
    Pipe(
        "fma",
        {80: 64, 90: 128},
        frozenset({"FFMA", "FADD", "FMUL", "FFMA32I", "FADD32I", "FMUL32I", "IMAD", "IMUL", "IMAD32I", "IMUL32I"}),
    ),
    Pipe("imad", {80: 64, 90: 64}, frozenset({"IMAD", "IMUL", "IMAD32I", "IMUL32I"})),
    Pipe(
        "alu",
        {80: 64, 90: 64},
        frozenset(
            {
                "IADD3",
                "IADD",
                "IADD32I",
                "VIADD",
                "LOP3",
                "LOP",
                "LOP32I",
                "SHF",
                "SHL",
                "SHR",
                "ISETP",
                "IMNMX",
                "VIMNMX",
                "IABS",
                "SEL",
                "FSEL",
                "FSETP",
                "FMNMX",
                "PRMT",
                "LEA",
                "BMSK",
                "SGXT",
                "PLOP3",
                "P2R",
                "R2P",
                "MOV",
                "MOV32I",
                "F2FP",
                "I2FP",
                "F2IP",
            }
        ),
    ),
    Pipe("xu", {80: 16, 90: 16}, frozenset({"MUFU", "I2F", "F2I", "F2F", "I2I", "FRND", "POPC", "FLO", "BREV"})),
    Pipe("shfl", {80: 32, 90: 32}, frozenset({"SHFL"})),
)


def pipe_counts(opcodes: dict[str, int]) -> dict[str, int]:
    """Instructions of each pipe of `PIPES` among SASS opcode counts (opcode without its modifiers: "IMAD" for
    IMAD.MOV.U32); pipes with none are left out."""
    counts = {p.name: sum(n for op, n in opcodes.items() if op in p.opcodes) for p in PIPES}
    return {name: n for name, n in counts.items() if n}


def pipe_bound(gpu: GPU, bytes_per_tile: float, warp_instructions_per_tile: float, pipe: Pipe) -> float:
    """Fraction of HBM bandwidth reachable when one pipe is the only limit: as `issue_bound`, at the pipe's rate
    (its results per clock per SM / 32 warp-instructions) instead of 4 per SM (may exceed 1)."""
    rate = gpu.sms * pipe.lanes[gpu.arch] / 32 * gpu.boost_ghz * 1e9
    return bytes_per_tile / warp_instructions_per_tile * rate / (gpu.hbm_gbps * 1e9)


def smem_limit(arch: int) -> int:
    """The smallest per-block shared memory of the GPUs of this compute capability."""
    return min(g.smem_per_block for g in GPUS if g.arch == arch)


def issue_bound(gpu: GPU, bytes_per_tile: float, warp_instructions_per_tile: float) -> float:
    """Fraction of HBM bandwidth reachable when instruction issue is the only limit (may exceed 1)."""
    return bytes_per_tile / warp_instructions_per_tile * gpu.issue_rate / (gpu.hbm_gbps * 1e9)


def programs_per_sm(arch: int, registers: int, warps: int, shared_bytes: int) -> int:
    """Programs (blocks) of this size one SM holds at once: the least of what its registers, warps, block slots and
    shared memory allow (0: the program does not fit)."""
    sm = SM_LIMITS[arch]
    per_warp = math.ceil(registers * 32 / sm.register_unit) * sm.register_unit
    by_registers = (sm.registers // per_warp) // warps if per_warp else sm.programs
    by_shared = sm.shared // (shared_bytes + sm.shared_reserved)
    return min(by_registers, sm.warps // warps, sm.programs, by_shared)


def memory_bound(gpu: GPU, programs: int, stages: int, bytes_per_tile: float) -> float:
    """Fraction of HBM bandwidth reachable with programs x stages tiles of bytes_per_tile in flight per SM
    (Little's law; at most 1)."""
    return min(1.0, programs * stages * bytes_per_tile / gpu.bytes_in_flight_per_sm)


#: FP16 decode attention's rate as a fraction of datasheet HBM bandwidth, the baseline the gate's predictions are
#: compared with, per GPU and (batch 1 | batch > 1) x (context < 16K | >= 16K). Where no figure exists for a cell the
#: table takes the FP16-favourable one named (which can only lower PN-Mix's predicted speed-up).
_FI = "FlashInfer blog 'Accelerating Self-Attentions for LLM Serving with FlashInfer' (2024-02-02), read off the plot"
FP16_DECODE_RATES = {
    ("H200", 1, "long"): (
        0.557,
        "measured: FP16 SDPA, B=1, 32K, one Qwen3-8B layer, 2,672 GB/s on an NVIDIA H200 (4,800 GB/s datasheet), "
        "torch 2.11, 2026-11-30 (benchmarks/results/h200-2026-11-30)",
    ),
    ("H100-SXM", 1, "long"): (0.39, f"{_FI}, Fig. 8: FlashAttention 2.4.2, GQA 32/4, d=128, B=1, 32K, H100 SXM: ~39 %"),
    ("A100-SXM4-40GB", 1, "long"): (
        0.43,
        f"{_FI}, Fig. 8: FlashAttention 2.4.2, GQA 32/4, d=128, B=1, 32K, A100 PCIe 80GB: ~43 % "
        "(taken for the SXM4 40GB)",
    ),
    ("H100-SXM", 1, "short"): (0.18, f"{_FI}, Fig. 8: FlashAttention 2.4.2, GQA, B=1, 8K (no 4K point), H100: ~18 %"),
    ("H200", 1, "short"): (0.18, "no H200 figure: H100-SXM's (same chip)"),
    ("A100-SXM4-40GB", 1, "short"): (
        0.25,
        f"{_FI}, Fig. 8: FlashAttention 2.4.2, GQA, B=1, 8K (no 4K point), A100: ~25 %",
    ),
    ("H100-SXM", 64, "any"): (
        0.88,
        f"{_FI}, Fig. 9: FlashInfer tensor-core decode, GQA, B=64, 8K, H100: ~88 % (no SDPA figure at large batch)",
    ),
    ("H200", 64, "any"): (0.88, "no H200 figure at large batch: H100-SXM's (same chip)"),
    ("A100-SXM4-40GB", 64, "any"): (
        0.79,
        f"{_FI}, Fig. 9: FlashInfer tensor-core decode, GQA, B=64, 8K, A100 PCIe: ~79 % "
        "(no SDPA figure at large batch)",
    ),
}


def fp16_decode_rate(gpu: GPU, batch: int, context: int) -> tuple[float, str]:
    """(fraction of datasheet HBM bandwidth, its source) of FP16 decode attention at this point."""
    if batch > 1:
        return FP16_DECODE_RATES[(gpu.name, 64, "any")]
    return FP16_DECODE_RATES[(gpu.name, 1, "long" if context >= 16384 else "short")]
