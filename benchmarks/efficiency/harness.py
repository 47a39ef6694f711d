"""What every efficiency benchmark shares: clocks, memory probes, the model with random weights,
caches under the paper's static protocol, and greedy decode steps (the environment record each
result carries is `reference.records.environment`).

The same code runs the paper's shapes on CUDA and a tiny architecture on the CPU (Triton
interpreter), so the CPU run checks the harness that produces the GPU numbers. Caches:
- FP16: transformers' `StaticCache` read by SDPA, the baseline a transformers user gets;
- every quantized method: `pnmix.hf.PNMixHFCache` on the Triton kernels, preallocated to
  max_cache_len = prompt + generation (`reference.channels.storage.allocation`);
- an implementation named with --impl (`benchmarks.efficiency.plugins`): `PNMixHFCache(impl=...)`, its own
  cache through the protocol, not preallocated.
Cache contents beyond the prompt are synthetic (random post-RoPE keys and values written
straight into the cache), since decode cost does not depend on what the keys say; the
prompt itself goes through the model, so PN-Mix selects its pairs from real queries.

Clocks: `timed`/`time_ms` put CUDA events around one eager call (a decode step as a user
runs it, launch overhead included); `device_ms` times device work only (kernels; host gaps
kept out by enqueueing every call while the GPU is held busy); `graph_ms` and
`Generation.graph_step` time replays of a captured CUDA graph.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict

import torch

from benchmarks.efficiency.architectures import Architecture
from reference import PNMixConfig, methods, storage_model
from reference.methods import FP16
from reference.records import GIB

#: Finite-value checks of the packed caches are off on the benchmark path: each reads a tensor
#: back to the host (a synchronization per append and per attend, and no CUDA graph capture),
#: and the inputs here are model activations or random normals. Every result records the setting.
CHECK_FINITE = False
FP16_ATTENTION = "sdpa over transformers StaticCache (16-bit K/V, preallocated)"
PACKED_ATTENTION = "pnmix: Triton split-K decode over PNMixHFCache (packed, preallocated)"
PLUGIN_ATTENTION = "attend(q) of the implementation's own cache (reference.contract protocol, not preallocated)"
#: The dtype of the models' weights, activations and caches (Fig. 6c, Fig. 7), and of the kernel points.
MODEL_DTYPE = torch.bfloat16
KERNEL_DTYPE = torch.float16
#: Tokens written into a cache per append when filling it with synthetic keys and values.
FILL_CHUNK = 4096


# -- clocks and memory ------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float, float | None]:
    """(fn's result, wall ms, GPU ms) of one call. GPU time comes from CUDA events around the
    call; wall time from the host clock with the device synchronized at both ends, so it also
    counts the launch overhead the events do not see. GPU ms is None on the CPU."""
    synchronize(device)
    t0 = time.perf_counter()
    if device.type != "cuda":
        result = fn()
        return result, (time.perf_counter() - t0) * 1e3, None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    end.synchronize()
    return result, (time.perf_counter() - t0) * 1e3, start.elapsed_time(end)


def time_ms(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 1, setup=None) -> dict:
    """Median wall and GPU milliseconds of fn over reps calls, after warmup calls (see `timed`), setup (if given)
    run before each, untimed; "ms" is the GPU time on CUDA and the wall time on the CPU; "rounds_ms" every timed
    call's ("wall_rounds_ms" their wall times), in order."""
    prepare = setup or (lambda: None)
    for _ in range(warmup):
        prepare()
        fn()
    runs = []
    for _ in range(reps):
        prepare()
        runs.append(timed(fn, device)[1:])
    return _figures([w for w, _ in runs], [g for _, g in runs] if device.type == "cuda" else None)


class DeviceClock:
    """pytest-benchmark's timer for the suites that time model steps (`@pytest.mark.benchmark(timer=harness.CLOCK)`),
    so that its statistics are the figure: on CUDA, seconds of device time between two readings (a CUDA event
    recorded and waited for at each, as `timed` brackets a call: launch gaps included, the host's clock not), summed
    in float64 from short spans (an event's elapsed time is float32 milliseconds); on the CPU, the host clock. Each
    reading also keeps the host clock (after the event completed), for the synchronized wall time of the same calls."""

    def __init__(self) -> None:
        self.readings: list[tuple[float, float]] = []  # (host seconds, clock seconds) of each reading
        self._total, self._last = 0.0, None
        self.void = False  # readings are NaN: a point that ran out of memory before its calls has no time
        self.replay: Iterator[float] | None = None  # readings given by `reported_ms`: times measured elsewhere
        self.__name__ = "CLOCK"  # how pytest-benchmark names the timer in its JSON: benchmarks.efficiency.harness.CLOCK

    def __call__(self) -> float:
        if self.replay is not None:
            return next(self.replay)
        if self.void:
            self.readings.append((math.nan, math.nan))
            return math.nan
        if not torch.cuda.is_available():
            now = time.perf_counter()
            self.readings.append((now, now))
            return now
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        event.synchronize()
        if self._last is not None:
            self._total += self._last.elapsed_time(event) / 1e3
        self._last = event
        self.readings.append((time.perf_counter(), self._total))
        return self._total


#: The suites' pytest-benchmark timer (`DeviceClock`); `benchmarked_ms` reads its host readings.
CLOCK = DeviceClock()


def benchmarked_ms(benchmark, fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 1, setup=None):
    """`time_ms`'s figures of fn, with pytest-benchmark timing exactly these calls: `benchmark.pedantic` runs
    `warmup` untimed rounds, then `reps` rounds of one fn() call each, with `CLOCK` as its timer, so the benchmark's
    statistics (seconds) are the "ms" returned (the device time on CUDA, the wall time on the CPU) and
    `pytest-benchmark compare` compares the figure. setup: run before each round, untimed (pytest-benchmark's). Under
    --benchmark-disable, or without a benchmark fixture, `time_ms` times the same calls with setup before each.
    Also returns "rounds_ms" and "wall_rounds_ms": every timed call's, in order."""
    if benchmark is None or benchmark.disabled:
        return time_ms(fn, device, reps, warmup, setup)
    first = len(CLOCK.readings)

    def call() -> None:
        try:
            fn()
        except Exception as error:
            if _oom_of(error) is None:
                raise
            raise _Stopped(error) from error

    try:
        benchmark.pedantic(call, setup=setup, rounds=reps, warmup_rounds=warmup, iterations=1)
    except _Stopped as stop:
        raise stop.error from None
    finally:
        readings = CLOCK.readings[first:]
        CLOCK.readings.clear()  # read once: a session's readings are not kept
    if len(readings) != 2 * (warmup + reps):
        raise RuntimeError(
            "benchmarked_ms: the benchmark's timer is not harness.CLOCK; mark the test "
            "@pytest.mark.benchmark(timer=harness.CLOCK) so that its statistics are the device time"
        )
    timed_pairs = readings[2 * warmup :]
    walls = [(timed_pairs[i + 1][0] - timed_pairs[i][0]) * 1e3 for i in range(0, len(timed_pairs), 2)]
    clock = [seconds * 1e3 for seconds in benchmark.stats.stats.data]
    return _figures(walls, clock if device.type == "cuda" else None)


class _Stopped(BaseException):
    """Out of memory in a timed call, carried past pytest-benchmark's `except Exception` (which would drop the
    benchmark, and with it the point's record): its statistics keep the calls that completed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def reported_ms(benchmark, rounds_ms: Sequence[float]) -> None:
    """Hand times measured elsewhere (`device_ms`'s per-call device times, which pytest-benchmark's host-side rounds
    cannot take: the GPU held busy while the host enqueues, the L2 flushed between calls) to pytest-benchmark as its
    rounds: `CLOCK` replays them, one round per call, so that its statistics are those times and `pytest-benchmark
    compare` compares them. The test is marked `@pytest.mark.benchmark(timer=harness.CLOCK)`. Nothing when the
    benchmark is disabled, absent or has its statistics already."""
    if benchmark is None or benchmark.disabled or benchmark.stats is not None:
        return
    readings, total = [], 0.0
    for ms in rounds_ms:
        readings += [total, total + ms / 1e3]
        total += ms / 1e3
    CLOCK.replay = iter(readings)
    try:
        benchmark.pedantic(lambda: None, rounds=len(rounds_ms), iterations=1)
        left = next(CLOCK.replay, None)
    finally:
        CLOCK.replay = None
    if left is not None or len(readings) == 0:
        raise RuntimeError(
            "reported_ms: the benchmark's timer is not harness.CLOCK (or no time was given); mark the test "
            "@pytest.mark.benchmark(timer=harness.CLOCK) so that its statistics are the times measured"
        )


def untimed(benchmark) -> None:
    """Put a point whose calls were never timed (out of memory before them) into pytest-benchmark's JSON, where the
    report reads its record: one round of NaN seconds (no time), never a made-up figure. Nothing when the benchmark
    is disabled or has its statistics already."""
    if benchmark is None or benchmark.disabled or benchmark.stats is not None:
        return
    CLOCK.void = True
    try:
        benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    finally:
        CLOCK.void = False
        CLOCK.readings.clear()


def _figures(walls: list[float], gpus: list[float] | None) -> dict:
    wall = statistics.median(walls)
    gpu = statistics.median(gpus) if gpus is not None else None
    rounds = walls if gpus is None else gpus
    return {
        "ms": wall if gpu is None else gpu,
        "wall_ms": wall,
        "gpu_ms": gpu,
        "rounds_ms": list(rounds),
        "wall_rounds_ms": list(walls),
    }


#: Bytes zeroed between timed kernel calls so that each one starts with a cold L2 (as
#: triton.testing.do_bench does): larger than the L2 of any current GPU.
L2_FLUSH_BYTES = 256 * 2**20
#: The longest the GPU is held idle while the host enqueues the timed calls (see `device_ms`).
MAX_HOLD_MS = 1000.0
_SLEEP_CYCLES_PER_MS: dict[int, float] = {}


def _sleep_cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of `torch.cuda._sleep` per millisecond on this device, measured once."""
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _SLEEP_CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS[index] = 1_000_000 / max(start.elapsed_time(end), 1e-3)
    return _SLEEP_CYCLES_PER_MS[index]


def l2_flusher(device: torch.device) -> Callable[[], None]:
    buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    return buffer.zero_


def device_ms(
    fn: Callable[[], object],
    device: torch.device,
    *,
    reps: int | None = None,
    target_ms: float = 100.0,
    flush_l2: bool = True,
    between: Callable[[], object] | None = None,
) -> dict:
    """Median milliseconds of the device work of one fn() call, without the host's time.

    On CUDA each call sits between two CUDA events, with the L2 flushed (flush_l2) and
    `between` run before each start event, outside the timed region. A GPU left idle after a
    synchronize would time the host too: the events of a call that the host is slower to
    enqueue than the GPU to run (Python, argument checks, launches) would include the wait for
    the launch. So the GPU is first held busy (`torch.cuda._sleep`) while the host enqueues
    every call; `host_gaps_excluded` says whether the host finished before the hold ended (it
    cannot when fn synchronizes with the host). reps: calls timed (default: about target_ms of
    device time, 5 to 500; fewer when the host could not enqueue them within MAX_HOLD_MS). On
    the CPU: the wall clock of `reps` (default 1) calls.
    """
    if device.type != "cuda":
        runs = [timed(fn, device)[1] for _ in range(reps or 1)]
        return {"ms": statistics.median(runs), "reps": len(runs), "host_gaps_excluded": None, "rounds_ms": runs}
    flush = l2_flusher(device) if flush_l2 else None

    def prepare() -> None:
        if flush is not None:
            flush()
        if between is not None:
            between()

    fn()  # compiles, allocates, warms caches
    synchronize(device)
    t0 = time.perf_counter()
    prepare()
    fn()
    host_ms = (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    prepare()
    start.record()
    fn()
    end.record()
    synchronize(device)
    estimate = max(start.elapsed_time(end), 1e-3)  # an upper bound: it may include host time
    n = reps or min(500, max(5, int(target_ms / estimate)))
    n = min(n, max(5, int((MAX_HOLD_MS - 1.0) / (2 * host_ms))))  # all n enqueued within one hold
    sleep = getattr(torch.cuda, "_sleep", None)
    cycles_per_ms = _sleep_cycles_per_ms(device) if sleep is not None else 0.0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    covered = False
    for _ in range(2):  # a second try with the hold sized from the first try's enqueue time
        hold_ms = min(MAX_HOLD_MS, 2 * n * host_ms + 1.0)
        held_from, held_to = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        t0 = time.perf_counter()
        held_from.record()
        if sleep is not None:
            sleep(int(hold_ms * cycles_per_ms))
        held_to.record()
        for i in range(n):
            prepare()
            starts[i].record()
            fn()
            ends[i].record()
        enqueue_ms = (time.perf_counter() - t0) * 1e3
        synchronize(device)
        # The hold began no earlier than t0 on the host's clock, so every call was enqueued
        # before the GPU was free to start it when the host took less than the hold lasted.
        covered = sleep is not None and enqueue_ms < held_from.elapsed_time(held_to)
        if covered or hold_ms >= MAX_HOLD_MS:
            break
        host_ms = enqueue_ms / n
    rounds = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    times = sorted(rounds)
    return {
        "ms": statistics.median(times),
        "min_ms": times[0],
        "reps": n,
        "host_gaps_excluded": covered,
        "rounds_ms": rounds,  # each call's, in order (`reported_ms` hands them to pytest-benchmark)
    }


def graph_ms(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup: int = 1,
    flush_l2: bool = True,
    state: Sequence[torch.Tensor] = (),
) -> dict:
    """fn captured once in a CUDA graph, its replays timed by `device_ms` (launch overhead gone,
    as gpt-fast measures decode): {"graph_ms", "graph_note"}; graph_ms is None with the reason in
    graph_note when there is no graph (CPU) or capture fails.

    fn runs `warmup` times on a side stream first; those calls and the capture do whatever fn
    does to host-side state, replays repeat only the captured device work. state: device
    tensors that a replay advances (cache lengths), saved before the capture and put back before
    every replay, untimed, so that each replay redoes the captured call. Out of memory is
    raised, as everywhere in a point.
    """
    if device.type != "cuda":
        return {"graph_ms": None, "graph_note": "no CUDA graphs on the CPU"}
    graph = torch.cuda.CUDAGraph()
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        saved = [t.clone() for t in state]
        with torch.cuda.graph(graph):
            fn()
    except Exception as error:
        if out_of_memory(error):
            raise
        return {"graph_ms": None, "graph_note": f"capture failed: {type(error).__name__}: {error}"[:300]}

    def rewind() -> None:
        with torch.inference_mode():  # the state may be inference tensors (the decode loop makes them)
            for t, s in zip(state, saved, strict=True):
                t.copy_(s)

    try:
        # Every replay starts from the saved state (the first one too: capture runs nothing), so
        # the state ends where the captured call left it, as the host-side state believes.
        timing = device_ms(graph.replay, device, flush_l2=flush_l2, between=rewind if state else None)
    finally:
        del graph
        release(device)
    note = None if timing["host_gaps_excluded"] else "replays not enqueued ahead: host gaps may be included"
    return {"graph_ms": timing["ms"], "graph_note": note}


def copy_bandwidth_gbps(device: torch.device, nbytes: int) -> float:
    """GB/s of a device-to-device copy of an nbytes buffer (read + write counted), this run, this device."""

    def copy_ms() -> float:
        src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
        dst = torch.empty_like(src)
        return device_ms(lambda: dst.copy_(src), device, flush_l2=False)["ms"]

    ms = copy_ms()
    release(device)  # the 2 nbytes go back before the points that follow
    return 2 * nbytes / (ms * 1e-3) / 1e9


def worker_gpu(worker: str | None, device_count: int, share: bool = False) -> int:
    """The CUDA device index a pytest-xdist worker takes: gwN takes GPU N, its own; with more
    workers than GPUs, ValueError unless share is set, then GPU N mod the device count (two
    processes on one GPU time each other's work, so sharing is asked for, not fallen into).
    worker None (no pytest-xdist) takes GPU 0 (the first of CUDA_VISIBLE_DEVICES)."""
    if device_count < 1:
        raise ValueError(f"device_count must be at least 1, got {device_count}")
    if worker is None:
        return 0
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        raise ValueError(f"PYTEST_XDIST_WORKER must be gw<N>, got {worker!r}")
    n = int(worker[2:])
    if n >= device_count and not share:
        raise ValueError(
            f"pytest-xdist worker {worker} has no GPU of its own ({device_count} visible): run at most "
            f"-n {device_count} workers, or share GPUs with --share-gpu (PNMIX_SHARE_GPU=1)"
        )
    return n % device_count


def take_gpu(index: int, budget_gib: float) -> tuple[torch.device, float | None]:
    """Make CUDA device `index` this process's current device (kernels launch on it) and cap its
    memory at budget_gib (0: no cap): (the device, the cap in force, None when none is)."""
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device, cap_memory(device, budget_gib) if budget_gib > 0 else None


def cap_memory(device: torch.device, budget_gib: float) -> float | None:
    """Limit this process to budget_gib on a CUDA device (a larger GPU then reproduces a 40 GiB
    card's boundaries); returns the cap in GiB, None on the CPU or when the device is smaller."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    if budget_gib * GIB >= total:
        return None
    torch.cuda.set_per_process_memory_fraction(budget_gib * GIB / total, device)
    return budget_gib


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> tuple[float | None, float | None]:
    """(max allocated, max reserved) GiB since reset_peak; (None, None) on the CPU (no allocator stats)."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB


def _oom_of(error: BaseException | None) -> BaseException | None:
    """CUDA's out of memory if it is the error or one it was raised from or while handling (a
    graph capture that runs out of memory ends in a capture error of its own)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, torch.cuda.OutOfMemoryError):  # torch.OutOfMemoryError from 2.5 on, same class
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def out_of_memory(error: BaseException) -> bool:
    return _oom_of(error) is not None


def unless_oom(measure: Callable[[], dict], device: torch.device, benchmark=None, **oom_figures) -> dict:
    """measure() with {"oom": False} added, or {"oom": True, **oom_figures, "oom_error": message}
    when the device runs out of memory anywhere in it (building, warm-up, timing, graph capture):
    out of memory is a data point of a sweep, not a crash. Memory held by the measurement is
    released either way, before the next point. benchmark: the fixture whose statistics measure()
    fills (`benchmarked_ms`); a point that ran out of memory before them still has a record (`untimed`)."""
    release(device)
    try:
        return {"oom": False, **measure()}
    except Exception as error:
        oom = _oom_of(error)
        if oom is None:
            raise
        untimed(benchmark)
        return {"oom": True, **oom_figures, "oom_error": (str(oom).splitlines() or [""])[0][:200]}
    finally:
        release(device)


# -- model and caches -------------------------------------------------------------------------


def build_model(arch: Architecture, device: torch.device, dtype: torch.dtype, path: str | None = None, seed: int = 0):
    """The architecture with random weights (seeded), or a local checkpoint when `path` is given."""
    from transformers import AutoModelForCausalLM

    if path is not None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device.type)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(arch.hf_config(), dtype=dtype)
    return model.eval()


def method_config(method: str) -> PNMixConfig:
    """The channel-family method's configuration (the efficiency benchmarks run PNMixConfig caches)."""
    if methods.method(method).precision != methods.CHANNELS:
        raise ValueError(f"method must be one of {list(methods.METHODS)}, got {method!r}")
    return methods.config(method)


def config_record(config: PNMixConfig) -> dict:
    return {k: str(v) if isinstance(v, torch.dtype) else v for k, v in asdict(config).items()}


def attention_of(method: str, plugin=None) -> str:
    if plugin is not None:
        return PLUGIN_ATTENTION
    return FP16_ATTENTION if method == FP16 else PACKED_ATTENTION


def point_config(method: str, plugin=None) -> PNMixConfig:
    """The configuration a point's cache runs: the plug-in's (`benchmarks.efficiency.plugins.Plugin.config`) or
    the method's."""
    return method_config(method) if plugin is None else plugin.config


def modelled_cache_bytes(
    config: PNMixConfig, batch: int, kv_heads: int, head_dim: int, length: int, layers: int = 1
) -> int:
    """Bytes of `layers` caches of `config` holding `length` tokens, by the storage model (what a decode step reads)."""

    return layers * storage_model(config, batch, kv_heads, head_dim, length).total


def measured_cache_bytes(cache) -> int:
    """Bytes of the tensors the cache really holds, all layers (what `memory.cache_bytes` predicts)."""
    from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import

    if isinstance(cache, PNMixHFCache):
        return sum(layer.cache.storage().total for layer in cache.layers)
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


class Generation:
    """One batch of greedy generation under the static protocol: a cache preallocated to
    `capacity`, the prompt through the model, then synthetic fill and timed decode steps.
    check_finite: the packed caches' finite-value checks (`pnmix.cache.PNMixCache`'s modes: True,
    on the device and read back on request; "eager", before every call; False; the FP16 path has none).
    plugin: a `benchmarks.efficiency.plugins.Plugin` whose caches the model runs instead (`method` is then
    its name): `PNMixHFCache(impl=)`, not preallocated (the protocol has no capacity; `capacity`
    still bounds the generation), its input checks its own.
    capturable: the packed caches built capturable (`pnmix.PNMixCache`'s capturable: every decode step
    launches a page completion's work, so one captured step replays across completions); FP16's
    StaticCache is so already. Not for a plug-in."""

    def __init__(
        self,
        model,
        method: str,
        batch: int,
        prompt: int,
        capacity: int,
        seed: int = 0,
        check_finite: bool | str = CHECK_FINITE,
        plugin=None,
        capturable: bool = False,
    ) -> None:
        from transformers import StaticCache

        from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import

        if prompt >= capacity:
            raise ValueError(f"capacity ({capacity}) must exceed the prompt ({prompt})")
        if capturable and plugin is not None:
            raise ValueError(f"capturable=True is for the built-in caches; plugin {plugin.name!r} builds its own")
        self.model, self.method, self.batch, self.capacity = model, method, batch, capacity
        self.plugin = plugin
        self.config = point_config(method, plugin)
        self.device, self.dtype = model.device, model.dtype
        cfg = model.config
        self.kv_heads, self.head_dim = cfg.num_key_value_heads, getattr(cfg, "head_dim", None)
        model.set_attn_implementation("sdpa" if method == FP16 else pnmix_attention())
        if plugin is not None:
            self.cache = PNMixHFCache(cfg, self.config, impl=plugin.impl)
        elif method == FP16:
            self.cache = StaticCache(config=cfg, max_cache_len=capacity)
        else:
            self.cache = PNMixHFCache(
                cfg,
                self.config,
                backend="triton",
                max_cache_len=capacity,
                check_finite=check_finite,
                capturable=capturable,
            )
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.length = 0
        prompt_ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=self.gen, device=self.device)
        self.token = self._forward(prompt_ids)

    @property
    def check_finite(self) -> bool | None:
        """Whether finite-value checks are in force on this cache's appends and attends (None for a
        plug-in: it checks what it checks, and the protocol has no switch)."""
        if self.plugin is not None:
            return None
        if self.method == FP16:
            return False
        return all(layer.cache.check_finite for layer in self.cache.layers)

    @property
    def code_order(self) -> str | None:
        """The order the Triton caches hold their codes in ("spec", or "fragment": the fragment-order loop decodes
        them; `pnmix.cache.PNMixCache`'s code_order), None for FP16 and plug-ins: which kernel a row timed."""
        if self.plugin is not None or self.method == FP16:
            return None
        return "/".join(sorted({layer.cache.code_order for layer in self.cache.layers}))

    def read_bytes(self) -> int:
        """Bytes of every layer's cache a decode step reads now: the storage model of the method's
        configuration at the current length, or what a plug-in's caches hold (a format of its own,
        not preallocated)."""
        if self.plugin is not None:
            return measured_cache_bytes(self.cache)
        layers = len(self.cache.layers)
        return modelled_cache_bytes(self.config, self.batch, self.kv_heads, self.head_dim, self.length, layers)

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        from pnmix.hf import cache_argument  # deferred: transformers takes seconds to import

        positions = torch.arange(self.length, self.length + ids.shape[1], device=self.device).unsqueeze(0)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_argument(self.model): self.cache},
        )
        self.length += ids.shape[1]
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def step(self) -> None:
        """One greedy decode step (the token fed is the previous step's argmax)."""
        if self.length >= self.capacity:
            raise ValueError(f"the cache is full: {self.length} tokens of max_cache_len {self.capacity}")
        self.token = self._forward(self.token)

    def graph_step(self) -> dict:
        """The decode step at the current length captured in a CUDA graph, its replays timed
        (`graph_ms`), as gpt-fast times decode: {"graph_ms", "graph_note", "graph_steps"}.

        The side-stream warm-up and the capture each take a step (graph_steps: 2). Every replay
        redoes the captured step at the same position: the device-side token counts a replay
        advances (transformers' StaticCache keeps one per layer, PNMixCache one per layer) are
        put back before each, so replays never write past the captured position.
        """
        if self.device.type != "cuda":
            return {**graph_ms(self.step, self.device), "graph_steps": 0}
        if self.plugin is not None:
            return {
                "graph_ms": None,
                "graph_steps": 0,
                "graph_note": f"not captured: {self.plugin.name}'s cache has no device-side token counts the "
                "protocol exposes, to put back before each replay",
            }
        if self.capacity - self.length < 2:
            return {
                "graph_ms": None,
                "graph_note": "no room in the cache for a warm-up and a captured step",
                "graph_steps": 0,
            }
        token, start = self.token, self.length
        result = graph_ms(
            lambda: self._forward(token), self.device, warmup=1, flush_l2=False, state=self._device_counts()
        )
        self._check_counts()
        return {**result, "graph_steps": self.length - start}

    def _device_counts(self) -> list[torch.Tensor]:
        """The per-layer token counts held on the device, which a decode step advances there."""
        if self.method == FP16:
            return [layer.cumulative_length for layer in self.cache.layers]
        counts = [layer.cache.region().counts for layer in self.cache.layers]  # views of the live counts
        return [c for c in counts if c is not None]

    def _check_counts(self) -> None:
        """Every layer's cache holds self.length tokens on the device too (reads them back). A
        capture that failed part-way through the model leaves the host-side mirrors of the
        layers before the failure one step ahead of their devices: they are reset from them."""
        if self.method == FP16:
            held = [int(layer.cumulative_length) for layer in self.cache.layers]
        else:
            held = [layer.cache.sync_length() for layer in self.cache.layers]
        if any(n != self.length for n in held):
            raise AssertionError(
                f"graph replays moved the cache: layers hold {sorted(set(held))} tokens, the generation {self.length}"
            )

    @torch.inference_mode()
    def fill_to(self, length: int, chunk: int = FILL_CHUNK) -> None:
        """Write random post-RoPE keys and values into every layer until the cache holds `length` tokens."""
        if not self.length <= length <= self.capacity:
            raise ValueError(f"length must be within [{self.length}, {self.capacity}], got {length}")
        while self.length < length:
            n = min(chunk, length - self.length)
            shape = (self.batch, self.kv_heads, n, self.head_dim)
            for layer in self.cache.layers:
                k = torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype)
                v = torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype)
                if self.method == FP16:
                    positions = torch.arange(self.length, self.length + n, device=self.device)
                    layer.update(k, v, {"cache_position": positions})
                else:
                    layer.cache.append(k, v)
            self.length += n


class LatencyWalk:
    """Fig. 7's walk of one method along the decode steps: `eager`, the Generation whose steps are
    timed as a transformers user runs them, and `graphed`, the one whose step a CUDA graph replays.

    A graph decode loop (gpt-fast's) replays one captured step at every position, so the graph is
    timed on a capturable twin where the method's cache can be (its every step pays a page
    completion's work); the eager walk stays the non-capturable cache, whose completions run only
    where a page fills, as the baselines' do. FP16's StaticCache and a plug-in (no graph) are walked
    once. A cache that cannot be capturable (`pnmix.cache.why_not_capturable`) has its eager step
    captured between completions: `graph_note` says that the replay leaves their work out.
    """

    def __init__(self, model, method: str, prompt: int, capacity: int, plugin=None) -> None:
        from pnmix.cache import why_not_capturable  # deferred: pnmix.cache imports triton

        self.eager = Generation(model, method, 1, prompt, capacity, plugin=plugin)
        self.not_capturable = None if method == FP16 or plugin is not None else why_not_capturable(self.eager.config)
        twin = method != FP16 and plugin is None and self.not_capturable is None
        self.graphed = Generation(model, method, 1, prompt, capacity, capturable=True) if twin else self.eager

    @property
    def model(self):
        return self.eager.model

    @property
    def length(self) -> int:
        return self.eager.length

    def fill_to(self, length: int) -> None:
        for gen in {id(g): g for g in (self.eager, self.graphed)}.values():
            gen.fill_to(length)

    def graph_step(self) -> dict:
        """`Generation.graph_step` of `graphed` at the eager walk's length, with graph_capturable (whether
        the replayed step is one every position can replay) and graph_steps (the steps it ran on the eager
        walk: none when a twin was captured)."""
        self.graphed.fill_to(max(self.graphed.length, self.eager.length))
        result = self.graphed.graph_step()
        capturable = self.eager.plugin is None and self.not_capturable is None
        if self.not_capturable and result["graph_ms"] is not None:
            result["graph_note"] = (
                f"{self.eager.method}'s cache is not capturable (it lacks {self.not_capturable}): the replay is "
                "a step between page completions, without their work"
            )
        if self.graphed is not self.eager:
            result["graph_steps"] = 0
        return {**result, "graph_capturable": capturable}


def pnmix_attention() -> str:
    from pnmix.hf import ATTENTION  # deferred: transformers takes seconds to import

    return ATTENTION


def decode_fill_sizes(context: int, prompt: int, chunk: int = FILL_CHUNK) -> list[int]:
    """Tokens of the prefill and of each append that fill a kernel point's cache to `context`."""
    sizes = [min(prompt, context)]
    while sum(sizes) < context:
        sizes.append(min(chunk, context - sum(sizes)))
    return sizes


def build_decode_cache(
    method: str,
    batch: int,
    context: int,
    layer: tuple[int, int, int],
    device,
    prompt: int,
    chunk: int = FILL_CHUNK,
    check_finite: bool = CHECK_FINITE,
    plugin=None,
):
    """One attention layer's PNMixCache preallocated to and holding `context` random tokens, and a
    decode query: the kernel microbenchmark's input (layer = (KV heads, query heads per KV head,
    head_dim)). plugin: a `benchmarks.efficiency.plugins.Plugin` whose `create(config)` makes the cache instead
    (not preallocated, its input checks its own)."""
    from pnmix.cache import PNMixCache  # deferred: triton compiles kernels as they are imported

    kv_heads, n_rep, head_dim = layer
    gen = torch.Generator(device=device).manual_seed(batch * 7919 + context)

    def rand(heads: int, n: int) -> torch.Tensor:
        return torch.randn(batch, heads, n, head_dim, generator=gen, device=device, dtype=KERNEL_DTYPE)

    first, *appends = decode_fill_sizes(context, prompt, chunk)
    q, k, v = rand(kv_heads * n_rep, first), rand(kv_heads, first), rand(kv_heads, first)
    if plugin is None:
        cache = PNMixCache.from_prefill(
            q, k, v, method_config(method), max_cache_len=context, check_finite=check_finite
        )
    else:
        cache = plugin.impl.create(plugin.config)
        cache.prefill(q, k, v)
    for n in appends:
        cache.append(rand(kv_heads, n), rand(kv_heads, n))
    return cache, rand(kv_heads * n_rep, 1)
