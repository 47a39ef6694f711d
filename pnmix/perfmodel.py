"""A prediction of a kernel's time on a GPU from its SASS, without the GPU: the gate's performance model.

The bounds of `pnmix.gpus` say what a kernel cannot beat; this module says what it is expected to take. It simulates,
cycle by cycle, one SM sub-partition (one warp scheduler, a quarter of an SM) running the warps the occupancy allows,
each executing the kernel's own SASS as ptxas scheduled it, and extrapolates over the loops' trip counts, the grid's
waves of SMs and every kernel launched per decode step:

- issue: one instruction per cycle per scheduler, from the ready warp that issued least recently;
- the dependency chain as scheduled: a warp's next instruction issues no sooner than the stall count of its control
  code (`pnmix.sass.Instruction`) after the last, and no sooner than every scoreboard of its wait mask is released;
  variable-latency instructions release theirs after their latency (`Machine`): global loads after a DRAM round trip,
  shared-memory loads after the shared-memory latency plus their wait for the shared-memory data path, the rest after
  a fixed latency;
- execution pipes: each instruction occupies its pipe for 32 / lanes-per-sub-partition cycles (`pnmix.gpus.PIPES`'
  rates; tensor-core instructions for their FMAs at the tensor rate);
- the shared-memory / L1 data path (128 bytes per clock per SM, shared by its four schedulers): every shared or global
  access takes one cycle per 128-byte wavefront it moves, counted conflict-free from its width (`wavefronts`: bank
  conflicts cannot be read from SASS, so this side is optimistic);
- the pipeline as compiled: asynchronous copies (LDGSTS) complete a DRAM round trip after issue, LDGDEPBAR closes a
  group and `DEPBAR.LE SBn, k` waits until at most k groups are outstanding, so a copy issued at the end of a loop
  body and waited at the top of the next is exposed as it is on the device;
- barriers: BAR.SYNC holds a warp until every warp of its program on the scheduler has arrived, plus a fixed cost
  (with 4 warps per program, one per scheduler, the others are symmetric);
- DRAM bandwidth: a loop's iteration takes at least the bytes every resident program reads in it at the GPU's
  bandwidth per SM;
- the grid: programs per SM from the compiled registers, shared memory and warps, in waves of SMs, a partial last wave
  at its own occupancy; per-split work from the kernel's own split rule (the heaviest program of a wave sets its
  time); the merge kernel likewise, and a launch overhead per kernel.

What it leaves out, and which way that errs: L2 hits (every global load pays DRAM latency: pessimistic for repeated
bytes), bank conflicts (optimistic), the scheduler's exact policy, dual issue and register-bank stalls (minor either
way), and clock throttling (optimistic). Its accuracy is what `CALIBRATION` measures: each point is a kernel a GPU
timed, compiled again here, and predicted at the point it was timed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from pnmix import sass
from pnmix.gpus import GPU, PIPES, fp16_decode_rate, programs_per_sm
from pnmix.sass import Instruction

#: Latencies in cycles (sm_80 and sm_90 alike; see LATENCY_NOTE) of the instructions that release a scoreboard.
SHARED_LATENCY = 30
FIXED_LATENCY = {"LDC": 12, "S2R": 20, "S2UR": 20, "SHFL": 24, "REDUX": 30, "MUFU": 18, "LDGDEPBAR": 2}
#: Conversions and other xu-pipe instructions that release a scoreboard.
XU_LATENCY = 16
#: Cycles after issue at which a memory instruction has read its operands (its read barrier is released).
OPERANDS_READ = 8
#: Cycles a BAR.SYNC costs once every warp of the program has arrived.
BARRIER_CYCLES = 20
#: Cycles from a tensor-core instruction's end in its pipe to its result (warpgroup MMAs, waited by
#: WARPGROUP.DEPBAR; warp-level HMMA results are covered by the stall counts ptxas scheduled).
MMA_LATENCY = 30
LATENCY_NOTE = (
    "shared-memory load 30 cycles (ldmatrix alike): rounded from the ~29-33 cycles microbenchmarks give on A100 and "
    "H100 (Luo et al., 'Benchmarking and Dissecting the Nvidia Hopper GPU Architecture', IPDPS 2024); DRAM: "
    "pnmix.gpus.LATENCY_SOURCE at the boost clock; others a few tens of cycles, as their stall counts suggest"
)
#: Microseconds a kernel launch adds to a decode step, eager, back to back on one stream: RRZE-HPC/gpu-benches
#: `gpu-small-kernels` (10,000 back-to-back kernels, T = V / (a + V / b)): a = 2,555 ns on A100-80GB, 2,433 ns on H200.
LAUNCH_US = 2.5
LAUNCH_NOTE = (
    "2.5 us per kernel launched back to back (RRZE-HPC/gpu-benches gpu-small-kernels: 2.6 us A100, 2.4 us H200)"
)
#: The DRAM round trip a kernel meets on the device, as a multiple of the idle pointer-chasing latency of
#: `pnmix.gpus`: the model's one fitted constant, fitted on the H200 point of `pnmix.calibration` (variant 6, 109.6 us
#: measured; predicted 57.4 us at 1.0, 109.1 us at 3.3, compiled with triton 3.7.1, 2026-12-06). It lumps what the
#: simulation leaves out on the memory side: a loaded memory system, TLB misses after the timing's L2 flush,
#: instruction fetch of loops larger than the instruction cache.
LATENCY_FACTOR = 3.3
#: Cycles of data-path work a scheduler may have queued before a shared or global access stalls at issue.
DATA_PATH_QUEUE = 32
#: Loop iterations simulated before a loop's steady state is extrapolated over its remaining trips.
SIMULATED_ITERATIONS = 3

_TENSOR_SHAPE = re.compile(r"^(?:HMMA|HGMMA)\.(\d+)x?(\d*)x?(\d*)")


@dataclass(frozen=True)
class Machine:
    """One GPU's constants as the simulation uses them, in cycles of its boost clock."""

    gpu: GPU
    dram_cycles: float
    mma_fma_per_cycle: float  # dense fp16 FMAs per cycle per sub-partition of a warpgroup MMA (HGMMA)

    hmma_fma_per_cycle: float  # the same for warp-level mma.sync (HMMA)

    @classmethod
    def of(cls, gpu: GPU, latency_factor: float | None = None) -> Machine:
        """The constants of `gpu`, its DRAM latency times latency_factor (None: `LATENCY_FACTOR`, the calibrated one;
        1: the idle pointer-chasing latency of `pnmix.gpus`)."""
        # A100: HMMA.16816.F32 takes 8 cycles per sub-partition (2048 FMAs: 256 per cycle; Abdelkhalik et al.,
        # "Demystifying the Nvidia Ampere Architecture through Microbenchmarking", HPEC 2022, Table III). H100 SXM:
        # 989 TFLOPS dense fp16 = 2048 FMA/clk/SM for warpgroup MMAs (datasheet), "the older mma.sync instruction can
        # only reach about 2/3 the peak throughput of Hopper Tensor Cores" (FlashAttention-3 blog, PyTorch, 2024).
        fma = 256 if gpu.arch < 90 else 512
        hmma = 256 if gpu.arch < 90 else 512 * 2 / 3
        factor = LATENCY_FACTOR if latency_factor is None else latency_factor
        return cls(gpu, gpu.dram_latency_ns * gpu.boost_ghz * factor, fma, hmma)

    @property
    def bytes_per_cycle_per_sm(self) -> float:
        return self.gpu.hbm_gbps / self.gpu.sms / self.gpu.boost_ghz


def wavefronts(ins: Instruction) -> int:
    """128-byte shared-memory / L1 wavefronts a warp's access moves, conflict-free (0: not such an access)."""
    op, base = ins.opcode, ins.base
    if base in ("LDSM", "STSM"):
        m = re.search(r"\.(\d)$", op)
        return int(m.group(1)) if m else 1
    if base in ("LDS", "STS", "LDG", "STG", "LDGSTS", "LD", "ST", "ATOMS", "ATOM", "RED"):
        m = re.search(r"\.(128|64)\b", op)
        return {"128": 4, "64": 2}[m.group(1)] if m else 1
    return 0


def _pipe(ins: Instruction, machine: Machine) -> tuple[str | None, float]:
    """(pipe, cycles it is busy) of an instruction on one sub-partition; (None, 0) for what the model does not
    charge to a pipe (uniform datapath, branches, barriers, memory, fp16 at the issue rate)."""
    base, arch = ins.base, machine.gpu.arch
    if base in ("HMMA", "HGMMA"):
        m = _TENSOR_SHAPE.match(ins.opcode)
        dims = [int(x) for x in m.groups() if x] if m else []
        if base == "HMMA" and dims and len(str(dims[0])) >= 3:  # "16816": m16 n8 k16
            digits = str(dims[0])
            mm, nn, kk = int(digits[:2]), int(digits[2]), int(digits[3:])
            fmas = mm * nn * kk
        elif base == "HGMMA" and len(dims) == 3:  # 64xNxK over the four sub-partitions of a warpgroup
            fmas = dims[0] * dims[1] * dims[2] // 4
        else:
            fmas = 16 * 8 * 16
        rate = machine.mma_fma_per_cycle if base == "HGMMA" else machine.hmma_fma_per_cycle
        return "tensor", fmas / rate
    by_name = {p.name: p for p in PIPES}
    if base in by_name["imad"].opcodes:  # the integer multiplies: the fma pipe's heavy half on sm_90
        return "fma", 32 / (by_name["imad"].lanes[arch] / 4)
    for pipe in PIPES:
        if pipe.name != "imad" and base in pipe.opcodes:
            return pipe.name, 32 / (pipe.lanes[arch] / 4)
    return None, 0.0


def _latency(ins: Instruction, machine: Machine) -> float:
    base = ins.base
    if base in ("LDG", "LD", "ATOM", "RED", "LDGSTS"):
        return machine.dram_cycles
    if base in ("LDS", "LDSM", "ATOMS"):
        return SHARED_LATENCY
    if base in FIXED_LATENCY:
        return FIXED_LATENCY[base]
    if base in next(p for p in PIPES if p.name == "xu").opcodes:
        return XU_LATENCY
    return 20


@dataclass(frozen=True)
class Loop:
    """A loop of the SASS: instructions [start, end) (indices into the instruction list), the last a backward
    branch to the first."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Code:
    """A kernel's instructions up to its first EXIT after its last loop, and its loops in address order."""

    instructions: tuple[Instruction, ...]
    loops: tuple[Loop, ...]

    @classmethod
    def of(cls, listing: list[Instruction | str]) -> Code:
        labels, body = {}, []
        for item in listing:
            if isinstance(item, str):
                labels[item] = len(body)
            else:
                body.append(item)
        loops = []
        for i, ins in enumerate(body):
            if (m := sass.BRANCH.search(ins.text)) and m.group(1) in labels and labels[m.group(1)] < i:
                loops.append(Loop(labels[m.group(1)], i + 1))
        last = max((lp.end for lp in loops), default=0)
        end = next((i + 1 for i in range(last, len(body)) if body[i].base == "EXIT"), len(body))
        return cls(tuple(body[:end]), tuple(sorted(loops, key=lambda lp: lp.start)))

    @property
    def main(self) -> Loop | None:
        """The largest loop (the decode kernel's quantized region)."""
        return max(self.loops, key=lambda lp: lp.size, default=None)


@dataclass
class _Warp:
    program: int
    pos: int = 0
    ready: float = 0.0
    board: list = field(default_factory=lambda: [0.0] * 6)
    groups: list = field(default_factory=list)  # completion times of committed copy groups
    open_group: float = 0.0
    async_mma: float = 0.0
    last_issue: float = -1.0
    ready_cause: str = "chain"
    board_cause: list = field(default_factory=lambda: ["chain"] * 6)
    barrier: float | None = None  # arrival time while held at a BAR.SYNC
    marks: dict = field(default_factory=dict)


def _trace(code: Code, trips: dict[int, int]) -> tuple[list[int], dict[int, list[int]]]:
    """The instruction indices a warp executes, each loop run min(trips, SIMULATED_ITERATIONS) times (trips by
    loop index; unnamed loops once), and the trace positions where each loop's iterations begin (plus its end)."""
    trace, marks, at = [], {}, 0
    for index, loop in enumerate(code.loops):
        trace.extend(range(at, loop.start))
        runs = min(trips.get(index, 1), SIMULATED_ITERATIONS)
        marks[index] = [len(trace) + i * loop.size for i in range(runs + 1)]
        for _ in range(runs):
            trace.extend(range(loop.start, loop.end))
        at = loop.end
    trace.extend(range(at, len(code.instructions)))
    return trace, marks


@dataclass(frozen=True)
class Simulated:
    """One sub-partition running `warps` warps of `programs` programs over a trace: total cycles, and per loop the
    cycles of one steady iteration (the mean over warps of its last simulated iteration)."""

    cycles: float
    per_iteration: dict[int, float]
    simulated_runs: dict[int, int]
    issued: int
    #: per loop, the warps' cycles between consecutive issues by what held each warp (`CAUSES`)
    causes: dict[int, dict[str, float]] = field(default_factory=dict)
    #: per instruction index (of `Code.instructions`), the cycles warps waited before it on a latency (DRAM, shared,
    #: other) or a barrier: where a kernel's waits are, for the one who rewrites it
    waits: dict[int, tuple[str, float]] = field(default_factory=dict)


#: What holds a warp between two of its issues: its own scheduled chain (stall counts), a wait on a DRAM load or
#: copy, on a shared-memory load, on another variable-latency result (or the tensor core's), a barrier, a busy pipe
#: or data path, or the scheduler issuing another warp.
CAUSES = ("chain", "dram", "shared", "other latency", "barrier", "pipe", "data path", "issue")


def _cause(ins: Instruction) -> str:
    base = ins.base
    if base in ("LDG", "LD", "ATOM", "RED", "LDGSTS", "LDGDEPBAR"):
        return "dram"
    if base in ("LDS", "LDSM", "ATOMS"):
        return "shared"
    return "other latency"


def simulate(code: Code, trips: dict[int, int], machine: Machine, programs: int, warps_per_program: int) -> Simulated:
    """Run `programs` programs' warps on one scheduler (each program has warps_per_program / 4 of its warps there, at
    least one) through the trace of `code` with these loop trips."""
    trace, marks = _trace(code, trips)
    mark_at = {p: (loop, i) for loop, ps in marks.items() for i, p in enumerate(ps)}
    per_sched = max(1, warps_per_program // 4)
    warps = [_Warp(program=p) for p in range(programs) for _ in range(per_sched)]
    pipes: dict[str, float] = {}
    datapath = 0.0  # the scheduler's share of the SM's 128 B/clk data path: 4 cycles per wavefront
    slot = 0.0
    issued = 0
    props = [(_pipe(ins, machine), _latency(ins, machine), wavefronts(ins)) for ins in code.instructions]
    loop_of = {}
    for n, loop in enumerate(code.loops):
        loop_of.update(dict.fromkeys(range(loop.start, loop.end), n))
    causes: dict[int, dict[str, float]] = {n: dict.fromkeys(CAUSES, 0.0) for n in range(len(code.loops))}
    waits: dict[int, tuple[str, float]] = {}
    end = len(trace)
    while True:
        best, best_t, best_cause = None, math.inf, "chain"
        for w in warps:
            if w.pos >= end or w.barrier is not None:
                continue
            ins = code.instructions[trace[w.pos]]
            t, why = w.ready, w.ready_cause
            mask = ins.wait_mask
            k = 0
            while mask:
                if mask & 1 and w.board[k] > t:
                    t, why = w.board[k], w.board_cause[k]
                mask >>= 1
                k += 1
            base = ins.base
            if base == "DEPBAR" and (m := re.search(r"SB\d+,\s*(0x[0-9a-f]+|\d+)", ins.text)):
                keep = int(m.group(1), 0)
                if len(w.groups) > keep and max(w.groups[: len(w.groups) - keep]) > t:
                    t, why = max(w.groups[: len(w.groups) - keep]), "dram"
            elif base == "WARPGROUP" and "DEPBAR" in ins.opcode and w.async_mma > t:
                t, why = w.async_mma, "other latency"
            (pipe, busy), _, fronts = props[trace[w.pos]]
            if pipe is not None and pipes.get(pipe, 0.0) > t:
                t, why = pipes[pipe], "pipe"
            if fronts and datapath - DATA_PATH_QUEUE > t:
                t, why = datapath - DATA_PATH_QUEUE, "data path"
            # loose round robin: of the warps that can issue soonest, the one that issued least recently
            if t < best_t or (t == best_t and best is not None and w.last_issue < best.last_issue):
                best, best_t, best_cause = w, t, why
        if best is None:
            if all(w.pos >= end for w in warps):
                break
            # every remaining warp is held at a barrier: release those whose whole program arrived
            for program in {w.program for w in warps if w.barrier is not None}:
                group = [w for w in warps if w.program == program and w.pos < end]
                if all(w.barrier is not None for w in group):
                    release = max(w.barrier for w in group) + BARRIER_CYCLES
                    for w in group:
                        w.barrier, w.ready, w.pos, w.ready_cause = None, release, w.pos + 1, "barrier"
            continue
        w, t = best, max(best_t, slot)
        index = trace[w.pos]
        ins = code.instructions[index]
        (pipe, busy), latency, fronts = props[index]
        if index in loop_of and w.last_issue >= 0:
            held = causes[loop_of[index]]
            held[best_cause] += max(0.0, best_t - w.last_issue)
            held["issue"] += t - best_t
            if best_cause in ("dram", "shared", "other latency", "barrier"):
                _, before = waits.get(index, (best_cause, 0.0))
                waits[index] = (best_cause, before + max(0.0, best_t - w.last_issue))
        slot = t + 1
        w.last_issue = t
        issued += 1
        if w.pos in mark_at:
            w.marks[mark_at[w.pos]] = t
        if pipe is not None:
            pipes[pipe] = t + busy
        done = t + latency
        if fronts:
            start = max(t, datapath)
            datapath = start + 4 * fronts
            if ins.base in ("LDS", "LDSM", "ATOMS"):
                done = start + 4 * fronts + SHARED_LATENCY
        base = ins.base
        if base == "LDGSTS":
            w.open_group = max(w.open_group, done)
        elif base == "LDGDEPBAR":
            w.groups.append(w.open_group)
            w.open_group = 0.0
        elif base == "DEPBAR":
            m = re.search(r"SB\d+,\s*(0x[0-9a-f]+|\d+)", ins.text)
            keep = int(m.group(1), 0) if m else 0
            w.groups = w.groups[len(w.groups) - keep :] if keep else []
        elif base == "HGMMA":
            w.async_mma = max(w.async_mma, pipes["tensor"] + MMA_LATENCY)
        if ins.write_barrier is not None and base != "LDGSTS" and done >= w.board[ins.write_barrier]:
            w.board[ins.write_barrier], w.board_cause[ins.write_barrier] = done, _cause(ins)
        if ins.read_barrier is not None and t + OPERANDS_READ >= w.board[ins.read_barrier]:
            w.board[ins.read_barrier], w.board_cause[ins.read_barrier] = t + OPERANDS_READ, "other latency"
        w.ready, w.ready_cause = t + max(ins.stall, 1), "chain"
        if base == "BAR" and ".SYNC" in ins.opcode:
            w.barrier = t
            group = [x for x in warps if x.program == w.program and x.pos < end]
            if all(x.barrier is not None for x in group):
                release = max(x.barrier for x in group) + BARRIER_CYCLES
                for x in group:
                    x.barrier, x.ready, x.pos, x.ready_cause = None, release, x.pos + 1, "barrier"
            continue
        w.pos += 1
        if w.pos == end:
            w.marks[("end", 0)] = t + max(ins.stall, 1)
    total = max(w.marks.get(("end", 0), slot) for w in warps)
    per_iteration, runs = {}, {}
    for loop, ps in marks.items():
        runs[loop] = len(ps) - 1
        # a middle iteration where there is one: from its first instruction's issue to the next iteration's, so that
        # waits at the top of the body count (the last iteration is followed by the loop's exit, which waits for none)
        last = len(ps) - 2 if len(ps) >= 4 else len(ps) - 1
        if last >= 1:
            steps = [w.marks[(loop, last)] - w.marks[(loop, last - 1)] for w in warps]
            per_iteration[loop] = sum(steps) / len(steps)
    return Simulated(total, per_iteration, runs, issued, causes, waits)


def program_cycles(
    code: Code,
    trips: dict[int, int],
    loop_bytes: dict[int, float],
    machine: Machine,
    programs: int,
    warps_per_program: int,
    cache: dict | None = None,
) -> dict:
    """Cycles `programs` co-resident programs (per SM) take to run with these loop trips: the simulation of the
    first iterations, each loop's steady iteration extrapolated over its remaining trips at no less than the DRAM
    time of the bytes the SM's programs read per iteration (`loop_bytes`, per program)."""
    runs = tuple(sorted((k, min(v, SIMULATED_ITERATIONS)) for k, v in trips.items()))
    # the simulation depends on the GPU through its arch and DRAM latency only (H100 and H200 share it)
    key = (id(code), machine.gpu.arch, machine.dram_cycles, programs, warps_per_program, runs)
    # the entry holds its code: a code freed after its entry was made cannot lend its id to another code and its
    # simulation to that code's prediction
    if cache is not None and key in cache and cache[key][0] is code:
        sim = cache[key][1]
    else:
        sim = simulate(code, trips, machine, programs, warps_per_program)
        if cache is not None:
            cache[key] = (code, sim)
    cycles = sim.cycles
    limits = {}
    for loop, runs in sim.simulated_runs.items():
        left = trips.get(loop, 1) - runs
        step = sim.per_iteration.get(loop, 0.0)
        memory = programs * loop_bytes.get(loop, 0.0) / machine.bytes_per_cycle_per_sm
        limits[loop] = "memory" if memory > step else "latency/issue"
        cycles += max(step, memory) * left + max(0.0, memory - step) * runs
    return {"cycles": cycles, "per_iteration": sim.per_iteration, "limits": limits, "causes": sim.causes}


# --- the decode step: split kernel, merge kernel, launches, against FP16 SDPA ---------------------------------------


@dataclass(frozen=True)
class Workload:
    """One decode step of one attention layer: batch, KV heads, query heads per KV head, head_dim, context."""

    name: str
    batch: int
    kv_heads: int
    gqa: int
    head_dim: int
    context: int

    @property
    def fp16_bytes(self) -> int:
        """Bytes FP16 SDPA reads: keys and values of every token, 2 bytes each."""
        return self.batch * self.kv_heads * self.context * self.head_dim * 2 * 2


#: The workloads the gate predicts: one Qwen3-8B layer (8 KV heads, GQA 4, d = 128) at 4K and 32K, batch 1 and 64.
WORKLOADS = tuple(
    Workload(f"Qwen3-8B layer, B={b}, {n // 1024}K", b, 8, 4, 128, n) for n in (4096, 32768) for b in (1, 64)
)


@dataclass(frozen=True)
class Kernel:
    """A compiled kernel as the model needs it: its code, resources and launch choices."""

    code: Code
    registers: int
    shared_bytes: int
    warps: int
    constexprs: dict

    @classmethod
    def of(cls, encoded_listing: str, registers: int, shared_bytes: int, warps: int, constexprs: dict) -> Kernel:
        return cls(Code.of(sass.instructions(encoded_listing)), registers, shared_bytes, warps, dict(constexprs))


@dataclass(frozen=True)
class Storage:
    """What the decode kernel's loops read, from the cache layout: the exact sinks, the residual page, key groups,
    and the quantized region's bytes per token per KV head."""

    n_sink: int
    residual_length: int
    group_size: int
    quantized_bytes_per_token: float


def _chunk(split: int, splits: int, n: int, block: int) -> tuple[int, int]:
    """A split's share [lo, hi) of n tokens in whole tiles: the decode kernel's own rule (`_chunk`)."""
    size = math.ceil(math.ceil(n / splits) / block) * block
    lo = split * size
    return lo, min(lo + size, n)


def split_roles(code: Code) -> list[str]:
    """What each loop of the decode kernel is: the largest loop is the quantized region ("quantized"); a loop under a
    quarter of its size before it is the per-split pre-pass over the split's key groups ("prepass"); the other loops
    before it are the exact regions ("exact"), in source order the sinks then the residual; any later loop "other"."""
    main = code.main
    roles = []
    for loop in code.loops:
        if loop == main:
            roles.append("quantized")
        elif loop.start < main.start:
            roles.append("prepass" if loop.size * 4 < main.size else "exact")
        else:
            roles.append("other")
    return roles


def split_trips(code: Code, storage: Storage, context: int, block_n: int, splits: int) -> list[dict[int, int]]:
    """Trips of each loop of the decode kernel (`split_roles`), per split: the quantized and exact regions' tiles
    and the pre-pass's key groups of the split's share (`_chunk`)."""
    sinks = min(storage.n_sink, context)
    rest = context - sinks
    n_q = rest // storage.residual_length * storage.residual_length
    exact = [sinks, rest - n_q]
    roles = split_roles(code)
    out = []
    for split in range(splits):
        trips, exact_seen = {}, 0
        lo, hi = _chunk(split, splits, n_q, block_n)
        for index, role in enumerate(roles):
            if role == "quantized":
                trips[index] = max(0, -(-(hi - lo) // block_n))
            elif role == "prepass":
                g = storage.group_size
                trips[index] = max(0, -(-hi // g) - lo // g) if hi > lo else 0
            elif role == "exact":
                n = exact[exact_seen] if exact_seen < len(exact) else 0
                a, b = _chunk(split, splits, n, block_n)
                trips[index] = max(0, -(-(b - a) // block_n))
                exact_seen += 1
            else:
                trips[index] = 1
        out.append(trips)
    return out


def split_plan(splits: int, items: int, slots: int) -> tuple[int, int, int]:
    """(quantized splits, exact split, programs) per (sequence, KV head) for `splits` programs of the package's split
    rule over `items` (sequence, KV head) pairs on a GPU that holds `slots` programs at once (2 per SM): the exact
    regions (sinks, residual) get a program of their own where one more per item still fits in those slots, so that
    their dense tiles run beside the quantized splits; else, from 4 splits on, the last of the `splits`; below that
    the last split reads them before its quantized tiles (large batches, whose programs fill the GPU already). The
    fragment-order loop is launched by this rule (`pnmix.kernels.fragment_decode` re-exports it)."""
    if splits >= 2 and items * (splits + 1) <= slots:
        return splits, splits, splits + 1
    if splits >= 4:
        return splits - 1, splits - 1, splits
    return splits, splits - 1, splits


def merges_in_loop(items: int, programs: int, slots: int) -> bool:
    """Whether the fragment-order loop merges its splits itself (the last program of each head) rather than leaving
    them to the merge kernel: where its `items` x `programs` fit the GPU's `slots` at once (one wave, batch 1), so
    that the merge kernel's launch and round trips would stand alone after it; with more waves (large batches) that
    merge is a few percent of the step, and the gate predicts the loop without the merge's code the faster there."""
    return items * programs <= slots


def split_trips_exact_last(
    code: Code,
    storage: Storage,
    context: int,
    block_n: int,
    plan: tuple[int, int, int],
    exact_block: int,
    merge_chunk: int | None = None,
) -> list[dict[int, int]]:
    """Trips of each loop of a split kernel whose exact regions one program reads, before any quantized tile of its
    own (the fragment-order loop, `split_plan`): a program of its own from 4 splits on, the last split otherwise.
    The loops before the main one are the sinks' and the residual's, in source order, `exact_block` tokens a trip;
    the main loop takes the split's share of the quantized tokens (`_chunk`); a loop after it is the merge of a
    kernel that merges its splits itself (`merge_chunk` splits a trip). Every program is given the merge: the
    simulation takes no branch, and the last program to finish, which merges, is the one the step waits for. One
    entry per program of a (sequence, KV head)."""
    sinks = min(storage.n_sink, context)
    rest = context - sinks
    n_q = rest // storage.residual_length * storage.residual_length
    exact = [sinks, rest - n_q]
    main = code.loops.index(code.main)
    before, after = list(range(main)), list(range(main + 1, len(code.loops)))  # loops in source order
    if len(before) != len(exact):
        raise ValueError(f"expected {len(exact)} exact-region loops before the main loop, found {len(before)}")
    if after and merge_chunk is None:
        raise ValueError(f"{len(after)} loops after the main loop (a merge in the kernel): give merge_chunk")
    quantized, exact_split, programs = plan
    out = []
    for split in range(programs):
        lo, hi = _chunk(split, quantized, n_q, block_n) if split < quantized else (0, 0)
        trips = {i: 1 for i in range(len(code.loops))}
        trips[main] = max(0, -(-(hi - lo) // block_n))
        for i, n in zip(before, exact, strict=True):
            trips[i] = -(-n // exact_block) if split == exact_split else 0
        for i in after:
            trips[i] = -(-programs // merge_chunk)
        out.append(trips)
    return out


def default_splits(gpu: GPU, work_items: int, length: int, block_n: int) -> int:
    """The package's split rule (`splits_for`) for this GPU."""
    return splits_for(gpu.sms, work_items, length, block_n)


def splits_for(sms: int, work_items: int, length: int, block_n: int) -> int:
    """The package's split rule, which the kernels launch by (`pnmix.kernels.attention.default_splits`) and the gate
    predicts by: enough splits that the (sequence, KV head) items x splits cover the SMs twice over
    (flash-decoding), each split at least 4 tiles of `block_n` tokens."""
    want = max(1, -(-2 * sms // max(work_items, 1)))
    return max(1, min(want, -(-length // (4 * block_n))))


def _waves(programs: int, per_sm: int, sms: int) -> list[tuple[int, int]]:
    """(waves, programs per SM) of a grid: full waves at the occupancy, then a partial one at its own."""
    slots = per_sm * sms
    full, left = divmod(programs, slots)
    out = [(full, per_sm)] if full else []
    if left:
        out.append((1, -(-left // sms)))
    return out


def kernel_cycles(
    kernel: Kernel,
    trips_per_program: list[dict[int, int]],
    loop_bytes: dict[int, float],
    machine: Machine,
    programs: int,
    programs_per_sm: int,
    cache: dict,
) -> tuple[float, list[tuple[int, int]], dict]:
    """Cycles of one launch of `programs` programs: per wave, the slowest kind of program (`trips_per_program`, a
    representative set of distinct trip counts) at the wave's programs per SM; and that program's `program_cycles`
    in the first wave (its loops' limits and causes)."""
    kinds = {tuple(sorted(t.items())): t for t in trips_per_program}.values()
    total, first = 0.0, None
    waves = _waves(programs, programs_per_sm, machine.gpu.sms)
    for count, per_sm in waves:
        runs = [program_cycles(kernel.code, t, loop_bytes, machine, per_sm, kernel.warps, cache) for t in kinds]
        slowest = max(runs, key=lambda r: r["cycles"])
        total += count * slowest["cycles"]
        first = first or slowest
    return total, waves, first or {"limits": {}, "causes": {}}


def decode_step(
    split: Kernel,
    merge: Kernel | None,
    storage: Storage,
    workload: Workload,
    gpu: GPU,
    cache: dict | None = None,
    latency_factor: float | None = None,
    exact_last: int | None = None,
    merge_chunk: int | None = None,
) -> dict:
    """The predicted decode-attention time of one layer at `workload` on `gpu`: the split kernel and the merge
    kernel each simulated over its grid's waves, a launch overhead per kernel; beside it FP16 SDPA's time at the
    rate `pnmix.gpus.fp16_decode_rate` states, the ratio FP16 / PN-Mix (above 1: PN-Mix faster) and the fraction of
    HBM bandwidth the quantized cache is read at. exact_last: the split kernel's last split alone reads the exact
    regions, this many tokens a trip (`split_trips_exact_last`); None: every split its share (`split_trips`).
    merge None: the split kernel merges its splits itself (its last program of a head, `merge_chunk` splits a trip
    of its merge loop): one launch."""
    cache = {} if cache is None else cache
    machine = Machine.of(gpu, latency_factor)
    block_n = int(split.constexprs["BLOCK_N"])
    items = workload.batch * workload.kv_heads
    splits = default_splits(gpu, items, workload.context, block_n)
    main = split.code.loops.index(split.code.main)
    per_tile = {"quantized": storage.quantized_bytes_per_token * block_n, "exact": block_n * workload.head_dim * 4}
    # exact keys and values are 16-bit: 2 x 2 bytes per channel
    if exact_last is None:
        trips = split_trips(split.code, storage, workload.context, block_n, splits)
        loop_bytes = {i: per_tile[r] for i, r in enumerate(split_roles(split.code)) if r in per_tile}
    else:
        plan = split_plan(splits, items, 2 * gpu.sms)
        trips = split_trips_exact_last(split.code, storage, workload.context, block_n, plan, exact_last, merge_chunk)
        loop_bytes = {i: exact_last * workload.head_dim * 4 for i in range(main)}  # the exact loops
        loop_bytes[main] = per_tile["quantized"]
    occupancy = programs_per_sm(gpu.arch, split.registers, split.warps, split.shared_bytes)
    if occupancy < 1:
        raise ValueError(f"the split kernel does not fit an SM of {gpu.name}")
    launched = len(trips)  # programs per (sequence, KV head): the splits, and an exact-region one where it has its own
    split_cycles, waves, slowest = kernel_cycles(split, trips, loop_bytes, machine, items * launched, occupancy, cache)
    merge_cycles = 0.0
    if merge is not None:
        merge_trips = {i: 1 for i in range(len(merge.code.loops))}
        if merge.code.main is not None and "CHUNK" in merge.constexprs:
            chunk = min(int(merge.constexprs["CHUNK"]), 1 << (launched - 1).bit_length())
            merge_trips[merge.code.loops.index(merge.code.main)] = -(-launched // chunk)
        merge_occupancy = programs_per_sm(gpu.arch, merge.registers, merge.warps, merge.shared_bytes)
        merge_cycles, _, _ = kernel_cycles(
            merge, [merge_trips], {}, machine, items * workload.gqa, max(1, merge_occupancy), cache
        )
    sinks = min(storage.n_sink, workload.context)
    n_q = (workload.context - sinks) // storage.residual_length * storage.residual_length
    read = items * (n_q * storage.quantized_bytes_per_token + (workload.context - n_q) * workload.head_dim * 4)
    split_us = split_cycles / (gpu.boost_ghz * 1e3)
    merge_us = merge_cycles / (gpu.boost_ghz * 1e3)
    memory_us = read / (gpu.hbm_gbps * 1e3)
    launches = 1 if merge is None else 2
    total_us = max(split_us, memory_us) + merge_us + launches * LAUNCH_US
    held = slowest["causes"].get(main, {})
    shares = {k: round(v / sum(held.values()), 3) for k, v in held.items() if v} if sum(held.values()) else {}
    if memory_us >= split_us or slowest["limits"].get(main) == "memory":
        limit = "HBM bandwidth"
    else:
        limit = max(shares, key=shares.get) if shares else "unknown"
    fraction, source = fp16_decode_rate(gpu, workload.batch, workload.context)
    fp16_us = workload.fp16_bytes / (fraction * gpu.hbm_gbps * 1e3)
    return {
        "workload": workload.name,
        "gpu": gpu.name,
        "splits": splits,
        "programs": items * launched,
        "programs_per_sm": occupancy,
        "waves": [list(w) for w in waves],
        "split_us": round(split_us, 3),
        "merge_us": round(merge_us, 3),
        "launch_us": launches * LAUNCH_US,
        "time_us": round(total_us, 3),
        "bytes": round(read),
        "fraction_of_hbm": round(read / (total_us * 1e-6) / (gpu.hbm_gbps * 1e9), 4),
        "limit": limit,
        "main_loop_causes": shares,
        "fp16_us": round(fp16_us, 3),
        "fp16_rate": fraction,
        "fp16_source": source,
        "speedup_vs_fp16": round(fp16_us / total_us, 3),
    }
