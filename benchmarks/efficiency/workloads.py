"""The benchmark workloads, named after the paper's figures, at two scales.

- full: the paper's protocol on a GPU (Qwen3-8B architecture, P = 141, Fig. 6 and 7 grids);
- tiny: the same harness on the CPU in seconds (a two-layer model, lengths that still cross
  the sinks, two quantized pages and a residual), whose timings predict nothing about a GPU.
Each point is one test, so pytest-xdist can spread a sweep over GPUs, one worker per GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from benchmarks.efficiency.analysis import K
from benchmarks.efficiency.architectures import ARCHITECTURES, Architecture, tiny_architecture
from benchmarks.efficiency.memory import FIG6A_GENERATION, FIG6B_BATCHES
from reference.methods import names
from reference.paper import FIG6A_BATCH, FIG6B_GENERATION, FIG6B_MAX_BATCH, FIG6C_TOKENS_PER_S, PROMPT

GPU_METHODS = names(tag="gpu")
TINY_METHODS = names(tag="tiny")
FIG6 = names(tag="fig6")  # the two cache paths; conformance covers every method's kernels
FP16_MAX, PNMIX_MAX = FIG6B_MAX_BATCH["FP16"][0], FIG6B_MAX_BATCH["PN-Mix"][0]  # the paper's largest batches


@dataclass(frozen=True)
class Scale:
    name: str
    arch: Architecture
    methods: tuple[str, ...]
    prompt: int
    reps: int  # timed decode steps per sampled length
    warmup: int


FULL = Scale("full", ARCHITECTURES["Qwen3-8B"], GPU_METHODS, PROMPT, reps=5, warmup=2)
TINY = Scale("tiny", tiny_architecture(), TINY_METHODS, 40, reps=1, warmup=0)
SCALES = {s.name: s for s in (FULL, TINY)}


@dataclass(frozen=True)
class Workload:
    """One benchmark point: a scale, a method, and the figure's own coordinates."""

    scale: str
    method: str
    LABEL: ClassVar[str] = ""  # the coordinates in the test id, formatted from the fields

    @property
    def id(self) -> str:
        return f"{self.scale}-{self.method}-" + self.LABEL.format(**asdict(self))


@dataclass(frozen=True)
class Fig6Memory(Workload):
    """Peak memory of prefill plus one decode step with the cache preallocated to P + generation."""

    batch: int
    generation: int
    LABEL: ClassVar[str] = "B{batch}-gen{generation}"


@dataclass(frozen=True)
class Fig6cThroughput(Workload):
    """Decode throughput at one batch: L_gen = 8K steps, sampled at `samples` (steps from the prompt)."""

    batch: int
    generation: int
    samples: tuple[int, ...]
    LABEL: ClassVar[str] = "B{batch}"


@dataclass(frozen=True)
class Fig7Latency(Workload):
    """Per-step decode latency at B = 1 after `step` generated tokens (of a `generation`-token run)."""

    step: int
    generation: int
    LABEL: ClassVar[str] = "step{step}"


@dataclass(frozen=True)
class KernelDecode(Workload):
    """One layer's decode attention over a cache of `context` tokens (layer = KV heads, n_rep, d)."""

    batch: int
    context: int
    layer: tuple[int, int, int]
    LABEL: ClassVar[str] = "B{batch}-ctx{context}"


@dataclass(frozen=True)
class KernelLaunch(Workload):
    """The decode kernel at one launch choice (`pnmix.kernels.decode_attention`'s tile, warps,
    stages, and splits as a multiple of its default), over one layer's cache of `context` tokens."""

    batch: int
    context: int
    layer: tuple[int, int, int]
    block_n: int
    warps: int
    stages: int
    split_factor: int
    LABEL: ClassVar[str] = "B{batch}-ctx{context}-n{block_n}-w{warps}-s{stages}-x{split_factor}"


@dataclass(frozen=True)
class KernelPtx(Workload):
    """The decode kernel over one layer's cache of `context` tokens with the PTX unpack of its value codes asked for
    and not (`pnmix.kernels.ptx_unpack`)."""

    batch: int
    context: int
    layer: tuple[int, int, int]
    LABEL: ClassVar[str] = "B{batch}-ctx{context}"


#: The launch choices a GPU session compares (block_n, warps, stages, split factor). The first is
#: the reference the others are timed against (the default of variants 14-17); today's default,
#: 4 stages on sm_90 and 3 on sm_80 (`pnmix.kernels.attention.pipeline_stages`), comes second and
#: third. The levers the first GPU run pointed at (pnmix/kernels/NOTES.md): prefetching the next
#: tile (stages), fewer registers per program (smaller tiles, more warps), more splits.
LAUNCH_GRID = (
    (64, 4, 2, 1),
    (64, 4, 4, 1),
    (64, 4, 3, 1),
    (64, 4, 1, 1),
    (32, 4, 1, 1),
    (32, 4, 2, 1),
    (64, 8, 1, 1),
    (128, 8, 1, 1),
    (64, 4, 2, 2),
    (64, 4, 2, 4),
)


def kernel_launch(scale: Scale) -> list[KernelLaunch]:
    layer = _layer(scale)
    if scale.name == "full":
        batch, context, grid = 1, 32 * K, LAUNCH_GRID
    else:
        batch, context, grid = 1, 300, (LAUNCH_GRID[0], (32, 4, 2, 2))
    return [KernelLaunch(scale.name, "PN-Mix", batch, context, layer, *choice) for choice in grid]


def kernel_ptx(scale: Scale) -> list[KernelPtx]:
    """PN-Mix at the kernel step's point (B = 1, 32K tokens) and at a batch of 8 over 4K (more programs per SM)."""
    points = [(1, 32 * K), (8, 4 * K)] if scale.name == "full" else [(1, 300)]
    return [KernelPtx(scale.name, "PN-Mix", b, c, _layer(scale)) for b, c in points]


@dataclass(frozen=True)
class KernelFragment(Workload):
    """The fragment-order loop (`pnmix.kernels.fragment_decode`, not yet the package's decode) over `batch` x 8 KV
    heads of `context` quantized tokens in fragment order: its self-test on the device, then its time."""

    batch: int
    context: int
    LABEL: ClassVar[str] = "B{batch}-ctx{context}"


def kernel_fragment(scale: Scale) -> list[KernelFragment]:
    """The gate's target points for the fragment-order path (one Qwen3-8B layer at 4K and 32K, B = 1 and 64); tiny: B
    = 1 over two key groups."""
    points = [(1, 4 * K), (64, 4 * K), (1, 32 * K), (64, 32 * K)] if scale.name == "full" else [(1, 256)]
    return [KernelFragment(scale.name, "PN-Mix", b, c) for b, c in points]


def fig6_memory(scale: Scale) -> list[Fig6Memory]:
    if scale.name == "full":
        points = [(FIG6A_BATCH, g) for g in FIG6A_GENERATION] + [(b, FIG6B_GENERATION) for b in FIG6B_BATCHES]
        points = list(dict.fromkeys(points))  # B = 32 at 8K is in both figures
        methods = scale.methods
    else:
        points, methods = [(2, 300)], (*scale.methods, "Kitty")  # Kitty: per-page metadata allocation
    return [Fig6Memory(scale.name, m, b, g) for b, g in points for m in methods]


def fig6c_throughput(scale: Scale) -> list[Fig6cThroughput]:
    if scale.name == "full":
        # the paper's Fig. 6c batches, FP16's first out-of-memory batch, and a few in between
        batches = sorted({1, 8, 16, 32, 64, FP16_MAX + 1, *(b for _, b in FIG6C_TOKENS_PER_S)})
        generation = FIG6B_GENERATION
        samples = (0, 2 * K, 4 * K, 6 * K, 8 * K - 16)
    else:
        batches, generation, samples = (1,), 260, (0, 250)
    return [Fig6cThroughput(scale.name, m, b, generation, samples) for b in batches for m in scale.methods]


def fig7_latency(scale: Scale) -> list[Fig7Latency]:
    if scale.name == "full":
        generation = 32 * K
        steps = (1 * K, 2 * K, 4 * K, 8 * K, 11 * K, 16 * K, 21 * K, 26 * K, 31 * K, 32 * K - 16)
    else:
        generation, steps = 260, (10, 250)
    # method outer, step inner: a worker walks each method's cache forward instead of rebuilding it
    return [Fig7Latency(scale.name, m, s, generation) for m in scale.methods for s in steps]


def _layer(scale: Scale) -> tuple[int, int, int]:
    """One attention layer of the scale's model: (KV heads, query heads per KV head, head_dim)."""
    s = scale.arch.shape
    return s.kv_heads, s.query_heads // s.kv_heads, s.head_dim


def kernel_decode(scale: Scale) -> list[KernelDecode]:
    layer = _layer(scale)
    if scale.name == "full":
        points = [(b, c) for b in (1, FIG6A_BATCH, PNMIX_MAX) for c in (K, 8 * K, 32 * K)]
    else:
        points = [(1, 300)]
    return [KernelDecode(scale.name, m, b, c, layer) for b, c in points for m in scale.methods]


def in_short_sweep(work) -> bool:
    """The subset a time-limited GPU session runs (`--bench-sweep short`): every kernel point,
    the Fig. 6/7 points that decide the paper's claims, FP16 vs PN-Mix (and Kitty for Fig. 7)."""
    if work.scale != "full" or isinstance(work, (KernelDecode, KernelLaunch, KernelPtx)):
        return True
    if isinstance(work, Fig6Memory):
        return work.method in FIG6 and work.batch in (FIG6A_BATCH, FP16_MAX, FP16_MAX + 1, PNMIX_MAX, 128)
    if isinstance(work, Fig6cThroughput):
        return work.method in FIG6 and work.batch in (1, FP16_MAX, PNMIX_MAX)
    return work.method in names(tag="fig7")
