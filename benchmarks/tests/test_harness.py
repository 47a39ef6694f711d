"""The benchmark harness: static caches allocate what the storage model says; misuse is named;
device clocks time device work only, graphs replay the captured step, out of memory anywhere in a
point is a data point, and each process takes its own GPU and memory cap."""

import contextlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.efficiency import harness, memory
from benchmarks.efficiency.architectures import tiny_architecture
from reference.records import GIB

ARCH = tiny_architecture()


@pytest.fixture(scope="module")
def model():
    return harness.build_model(ARCH, torch.device("cpu"), torch.bfloat16)


def test_fp16_generation_is_exact_bytes_and_checks_capacity(model):
    gen = harness.Generation(model, "FP16", 2, 20, 64)
    assert harness.measured_cache_bytes(gen.cache) == memory.cache_bytes(ARCH, "FP16", 2, 64)
    gen.fill_to(63)
    gen.step()
    assert gen.length == 64
    with pytest.raises(ValueError, match="cache is full"):
        gen.step()
    with pytest.raises(ValueError, match="length must be within"):
        gen.fill_to(10)


def test_prompt_must_fit(model):
    with pytest.raises(ValueError, match=r"capacity \(64\) must exceed the prompt"):
        harness.Generation(model, "PN-Mix", 1, 64, 64)
    with pytest.raises(ValueError, match="method must be one of"):
        harness.Generation(model, "KIVI-3", 1, 8, 64)


def test_time_ms_reports_cpu_wall_time_only():
    t = harness.time_ms(lambda: sum(range(1000)), torch.device("cpu"), reps=3, warmup=1)
    assert t["gpu_ms"] is None and t["ms"] == t["wall_ms"] > 0


def test_out_of_memory_is_a_data_point_and_other_errors_are_not():
    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    cpu = torch.device("cpu")
    assert harness.unless_oom(oom, cpu, tokens_per_s=None) == {
        "oom": True,
        "tokens_per_s": None,
        "oom_error": "CUDA out of memory. Tried to allocate 2.00 GiB",
    }
    assert harness.unless_oom(lambda: {"tokens_per_s": 3.0}, cpu) == {"oom": False, "tokens_per_s": 3.0}
    with pytest.raises(ZeroDivisionError):
        harness.unless_oom(lambda: 1 / 0, cpu)


# -- the GPU each process takes, and its memory cap --------------------------------------------


def test_each_xdist_worker_takes_its_own_gpu_and_shares_only_when_told():
    assert harness.worker_gpu(None, 4) == 0  # no pytest-xdist
    assert [harness.worker_gpu(f"gw{i}", 4) for i in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"gw2 has no GPU of its own \(2 visible\).*--share-gpu"):
        harness.worker_gpu("gw2", 2)
    assert [harness.worker_gpu(f"gw{i}", 2, share=True) for i in range(5)] == [0, 1, 0, 1, 0]
    assert harness.worker_gpu("gw3", 1, share=True) == 0
    with pytest.raises(ValueError, match="gw<N>"):
        harness.worker_gpu("master", 2)
    with pytest.raises(ValueError, match="device_count"):
        harness.worker_gpu("gw0", 0)


def test_every_benchmark_test_takes_the_gpu_and_cap_first_whatever_ran_before(request):
    assert "gpu_session" in request.fixturenames  # autouse, session-scoped: set up before the first test


def test_take_gpu_makes_the_device_current_and_caps_its_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("device", d)))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append(("fraction", f, d)))
    device, cap = harness.take_gpu(1, 40.0)
    assert device == torch.device("cuda", 1) and cap == 40.0
    assert calls == [("device", device), ("fraction", 0.5, device)]
    calls.clear()
    assert harness.take_gpu(0, 0.0)[1] is None and harness.take_gpu(0, 80.0)[1] is None  # none asked, none needed
    assert all(c[0] == "device" for c in calls)


# -- device clocks and CUDA graphs, on a simulated GPU -----------------------------------------


class FakeGpu:
    """torch.cuda's events, sleep, streams and graphs over a simulated in-order queue: each op has
    a duration in ms and an action run when the GPU runs it (eagerly, or at each graph replay)."""

    def __init__(self, sleep_ms_per_cycle: float = 1e-3) -> None:
        self.ops: list[tuple[str, float]] = []  # what the GPU ran, in order
        self.capturing: list | None = None
        self.sleep_ms_per_cycle = sleep_ms_per_cycle
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = None

            def record(self, stream=None) -> None:
                self.at = len(gpu.ops)
                gpu.ops.append(("event", 0.0))

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return sum(ms for _, ms in gpu.ops[self.at : end.at])

        class Graph:
            def __init__(self) -> None:
                self.work = []

            def replay(self) -> None:
                for kind, ms, action in self.work:
                    gpu.run(kind, ms, action)

        @contextlib.contextmanager
        def capture(graph, **kwargs):
            gpu.capturing = graph.work
            try:
                yield
            finally:
                gpu.capturing = None

        self.Event, self.CUDAGraph, self.graph = Event, Graph, capture

    def enqueue(self, kind: str, ms: float, action=None) -> None:
        if self.capturing is not None:
            self.capturing.append((kind, ms, action))
        else:
            self.run(kind, ms, action)

    def run(self, kind: str, ms: float, action=None) -> None:
        if action is not None:
            action()
        self.ops.append((kind, ms))

    def install(self, monkeypatch) -> None:
        stream = SimpleNamespace(wait_stream=lambda other: None)
        patches = {
            "Event": self.Event,
            "CUDAGraph": self.CUDAGraph,
            "graph": self.graph,
            "_sleep": lambda cycles: self.enqueue("sleep", cycles * self.sleep_ms_per_cycle),
            "synchronize": lambda device=None: None,
            "empty_cache": lambda: None,
            "current_device": lambda: 0,
            "Stream": lambda device=None: stream,
            "current_stream": lambda device=None: stream,
            "stream": lambda s: contextlib.nullcontext(),
        }
        for name, value in patches.items():
            monkeypatch.setattr(torch.cuda, name, value, raising=False)
        monkeypatch.setattr(harness, "_SLEEP_CYCLES_PER_MS", {})
        monkeypatch.setattr(harness, "l2_flusher", lambda device: lambda: self.enqueue("flush", 0.5))


CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    fake = FakeGpu()
    fake.install(monkeypatch)
    return fake


def timed_spans(ops: list[tuple[str, float]]) -> list[list[str]]:
    """The ops between consecutive events after the last sleep (the timed calls)."""
    last_sleep = max(i for i, (kind, _) in enumerate(ops) if kind == "sleep")
    events = [i for i, (kind, _) in enumerate(ops) if kind == "event" and i > last_sleep + 1]
    return [[kind for kind, _ in ops[a + 1 : b]] for a, b in zip(events[::2], events[1::2], strict=True)]


def test_device_ms_times_device_work_only_behind_a_hold(gpu):
    t = harness.device_ms(lambda: gpu.enqueue("fn", 1.0), CUDA, reps=8, between=lambda: gpu.enqueue("reset", 0.25))
    assert t["ms"] == t["min_ms"] == 1.0 and t["reps"] == 8
    assert t["host_gaps_excluded"]  # the hold outlasted the host's enqueueing
    spans = timed_spans(gpu.ops)
    assert spans == [["fn"]] * 8  # each timed region holds the call and nothing else
    kinds = [k for k, _ in gpu.ops if k != "event"]
    assert kinds[-8 * 3 :] == ["flush", "reset", "fn"] * 8  # L2 flush and `between` come before each call


def test_device_ms_says_when_the_host_was_not_ahead(monkeypatch):
    gpu = FakeGpu(sleep_ms_per_cycle=0.0)  # a hold that ends at once, as when fn waits for the GPU
    gpu.install(monkeypatch)
    monkeypatch.setattr(harness, "_SLEEP_CYCLES_PER_MS", {0: 1e6})
    t = harness.device_ms(lambda: gpu.enqueue("fn", 2.0), CUDA, reps=5)
    assert t["ms"] == 2.0 and t["host_gaps_excluded"] is False


def test_graph_replays_are_timed_and_device_state_is_put_back_before_each(gpu):
    length, written = torch.tensor(5), []

    def step() -> None:  # a decode step: writes at the device-side length, then advances it
        gpu.enqueue("step", 3.0, lambda: (written.append(int(length)), length.add_(1)))

    result = harness.graph_ms(step, CUDA, warmup=1, state=[length])
    assert result == {"graph_ms": 3.0, "graph_note": None}
    assert written[0] == 5 and set(written[1:]) == {6}  # the warm-up, then every replay at the captured position
    assert int(length) == 7  # where the captured step left it, as the host believes


def test_graph_capture_failure_is_recorded_with_its_reason(gpu):
    def step() -> None:
        if gpu.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")

    result = harness.graph_ms(step, CUDA)
    assert result["graph_ms"] is None
    assert result["graph_note"] == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert harness.graph_ms(step, torch.device("cpu")) == {"graph_ms": None, "graph_note": "no CUDA graphs on the CPU"}


OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize("where", ["setup", "warm-up", "timing", "capture"])
def test_out_of_memory_anywhere_in_a_point_is_a_data_point(gpu, where):
    calls = {"n": 0}

    def fn() -> None:
        calls["n"] += 1
        if (where, calls["n"]) in (("warm-up", 1), ("timing", 4)):
            raise torch.cuda.OutOfMemoryError(OOM)
        if where == "capture" and gpu.capturing is not None:
            try:
                raise torch.cuda.OutOfMemoryError(OOM)
            except torch.cuda.OutOfMemoryError:  # capture ends in its own error, raised while handling the OOM
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from None

    def measure() -> dict:
        if where == "setup":
            raise torch.cuda.OutOfMemoryError(OOM)
        ms = harness.device_ms(fn, CUDA, reps=5)["ms"]
        return {"ms": ms, **harness.graph_ms(fn, CUDA)}

    result = harness.unless_oom(measure, CUDA, ms=None, graph_ms=None)
    assert result == {"oom": True, "ms": None, "graph_ms": None, "oom_error": OOM}


def test_generation_leaves_finite_checks_off_and_has_no_graph_on_the_cpu(model):
    gen = harness.Generation(model, "PN-Mix", 1, 20, 64)
    assert gen.check_finite is False and not any(layer.cache.check_finite for layer in gen.cache.layers)
    assert gen.graph_step() == {"graph_ms": None, "graph_note": "no CUDA graphs on the CPU", "graph_steps": 0}
    assert gen.length == 20 and harness.Generation(model, "FP16", 1, 20, 64).check_finite is False


@pytest.mark.parametrize(
    ("method", "twin", "capturable"), [("PN-Mix", True, True), ("Kitty", False, False), ("FP16", False, True)]
)
def test_fig7_graphs_a_capturable_twin_where_the_cache_can_be_and_times_the_eager_cache(
    model, method, twin, capturable
):
    walk = harness.LatencyWalk(model, method, 20, 64)
    assert (walk.graphed is not walk.eager) is twin
    if method != "FP16":  # the timed steps stay the cache a transformers user runs; the graph replays every position
        assert not any(layer.cache.capturable for layer in walk.eager.cache.layers)
        assert all(layer.cache.capturable for layer in walk.graphed.cache.layers) is twin
    walk.fill_to(30)
    walk.eager.step()
    graph = walk.graph_step()
    assert walk.graphed.length == walk.eager.length == 31  # the graph is taken where the eager step was timed
    assert graph == {
        "graph_ms": None,
        "graph_note": "no CUDA graphs on the CPU",
        "graph_steps": 0,
        "graph_capturable": capturable,
    }
    # on a GPU: a replay on the eager cache itself ran its steps there; one on a non-capturable cache says what it
    # leaves out
    walk.graphed.graph_step = lambda: {"graph_ms": 1.0, "graph_note": None, "graph_steps": 2}
    graph = walk.graph_step()
    assert graph["graph_steps"] == (0 if twin else 2)
    assert (graph["graph_note"] is not None) is (method == "Kitty")
    if method == "Kitty":
        assert "Kitty's cache is not capturable" in graph["graph_note"] and "without their work" in graph["graph_note"]
    if twin:
        with pytest.raises(ValueError, match="capturable=True is for the built-in caches"):
            harness.Generation(model, method, 1, 20, 64, plugin=SimpleNamespace(name="x"), capturable=True)


def test_kernel_benchmark_cache_is_preallocated_without_finite_checks():
    cache, q = harness.build_decode_cache("PN-Mix", 1, 150, (2, 2, 16), torch.device("cpu"), prompt=40)
    assert cache.capacity == cache.length == 150 and cache.check_finite is False
    assert q.shape == (1, 4, 1, 16)


class HostReads(TorchDispatchMode):
    """The ops that read a tensor's value back to the host: each a device->host sync on CUDA,
    which neither a CUDA graph capture nor calls enqueued ahead of the GPU allow."""

    OPS = ("_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.OPS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", ["FP16", "PN-Mix"])
def test_a_benchmark_decode_step_reads_nothing_back_to_the_host(model, method):
    gen = harness.Generation(model, method, 1, 20, 64)
    gen.step()
    with HostReads() as reads:
        gen.step()
    assert reads.seen == []
    if method != "FP16":  # the probe sees the reads that eager finite-value checks make
        checked = harness.Generation(model, method, 1, 20, 64, check_finite="eager")
        with HostReads() as reads:
            checked.step()
        assert reads.seen


def test_the_kernel_benchmark_call_reads_nothing_back_to_the_host():
    cache, q = harness.build_decode_cache("PN-Mix", 1, 150, (2, 2, 16), torch.device("cpu"), prompt=40)
    with HostReads() as reads:
        cache.attend(q)
    assert reads.seen == []


# -- pytest-benchmark's statistics are the calls timed -------------------------------------------

BENCHMARKED = """
import pytest, torch
from benchmarks.efficiency import harness

CPU = torch.device("cpu")


def oom():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.benchmark(timer=harness.CLOCK)
def test_timed(benchmark):
    calls = []
    t = harness.benchmarked_ms(benchmark, lambda: calls.append(sum(range(20000))), CPU, reps=5, warmup=2)
    assert len(calls) == 7 and harness.CLOCK.readings == []  # read once, not kept for the session
    benchmark.extra_info.update(t)


@pytest.mark.benchmark(timer=harness.CLOCK)
def test_oom_at_the_second_timed_call(benchmark):
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 3:
            oom()

    result = harness.unless_oom(lambda: harness.benchmarked_ms(benchmark, step, CPU, reps=4, warmup=1), CPU, benchmark)
    assert len(calls) == 3
    benchmark.extra_info.update(result)


@pytest.mark.benchmark(timer=harness.CLOCK)
def test_oom_before_any_call(benchmark):
    benchmark.extra_info.update(harness.unless_oom(oom, CPU, benchmark))


def test_another_timer_is_refused(benchmark):
    with pytest.raises(RuntimeError, match="harness.CLOCK"):
        harness.benchmarked_ms(benchmark, lambda: None, CPU, reps=2, warmup=0)


@pytest.mark.benchmark(timer=harness.CLOCK)
def test_reported(benchmark):
    harness.reported_ms(benchmark, [1.5, 2.0, 0.25])


def test_reported_needs_the_clock(benchmark):
    with pytest.raises(RuntimeError, match="harness.CLOCK"):
        harness.reported_ms(benchmark, [1.0])
"""


def test_the_benchmark_statistics_are_the_timed_calls_and_a_point_out_of_memory_keeps_its_record(tmp_path):
    (tmp_path / "test_benchmarked.py").write_text(BENCHMARKED)
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider", "--benchmark-json", str(out)]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = {b["name"]: b for b in json.loads(out.read_text())["benchmarks"]}
    timed = rows["test_timed"]
    # warm-up untimed, every timed call a round, and the figure is the statistics' median
    assert timed["stats"]["rounds"] == 5 and timed["options"]["timer"] == "CLOCK"
    assert [s * 1e3 for s in timed["stats"]["data"]] == pytest.approx(timed["extra_info"]["rounds_ms"], rel=1e-9)
    assert timed["stats"]["median"] * 1e3 == pytest.approx(timed["extra_info"]["ms"], rel=1e-9)
    # out of memory: the record stays, with the calls that completed, or no time (NaN) at all: never a made-up one
    cut = rows["test_oom_at_the_second_timed_call"]
    assert cut["extra_info"]["oom"] is True and cut["stats"]["rounds"] == 1 and cut["stats"]["data"][0] > 0
    before = rows["test_oom_before_any_call"]
    assert before["extra_info"]["oom"] is True and before["stats"]["rounds"] == 1
    assert math.isnan(before["stats"]["median"])
    # times measured elsewhere (a kernel's device times) are the statistics, one round each
    reported = rows["test_reported"]["stats"]
    assert reported["data"] == pytest.approx([1.5e-3, 2.0e-3, 0.25e-3], rel=1e-9) and reported["rounds"] == 3


def test_the_kernel_suite_statistics_are_its_timed_calls(tmp_path):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "kernel.json"
    suite = [sys.executable, "-m", "pytest", "benchmarks/suites/test_kernels.py", "--bench-scale", "tiny"]
    argv = [*suite, "-k", "bandwidth and PN-Mix", "-q", "-p", "no:cacheprovider", "--benchmark-json", str(out)]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (point, *_) = json.loads(out.read_text())["benchmarks"]
    info, stats = point["extra_info"], point["stats"]
    assert point["options"]["timer"] == "CLOCK" and stats["rounds"] == info["reps"] == len(info["rounds_ms"])
    assert [s * 1e3 for s in stats["data"]] == pytest.approx(info["rounds_ms"], rel=1e-9)
    assert stats["median"] * 1e3 == pytest.approx(info["ms"], rel=1e-9)


def test_pytest_benchmark_compare_on_two_runs_of_fig7_prints_their_decode_step_times(tmp_path):
    root = Path(__file__).resolve().parents[2]
    runs = [tmp_path / "first.json", tmp_path / "second.json"]
    suite = [sys.executable, "-m", "pytest", "benchmarks/suites/test_fig7_latency.py", "--bench-scale", "tiny"]
    for out in runs:
        argv = [*suite, "-k", "FP16", "-q", "-p", "no:cacheprovider", "--benchmark-json", str(out)]
        proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    command = Path(sys.executable).with_name("pytest-benchmark")  # the console script pytest-benchmark installs
    compare = [str(command), "compare", *map(str, runs), "--group-by=group"]
    proc = subprocess.run([*compare, "--columns=median", "--time-unit=ms"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "benchmark 'fig7-latency (tiny)'" in proc.stdout
    printed = {
        (m["name"], m["run"]): float(m["ms"])
        for m in re.finditer(r"^(?P<name>test_\S+) \(\d+/(?P<run>first|second)\)\s+(?P<ms>[\d.]+)", proc.stdout, re.M)
    }
    expected = {
        (b["name"], out.stem): b["extra_info"]["step_ms"]
        for out in runs
        for b in json.loads(out.read_text())["benchmarks"]
    }
    assert len(expected) == 4 and printed.keys() == expected.keys(), proc.stdout
    assert all(printed[k] == pytest.approx(expected[k], abs=5e-5) for k in expected), (printed, expected)
