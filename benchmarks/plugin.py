"""pytest plug-in of the benchmark suites (`benchmarks/suites/`): their options, fixtures and hooks. Registered as
the `pytest11` entry point named `benchmarks.plugin` (`benchmarks.entry`, which loads this module where the `test`
extra is installed), so that an installed package runs the suites (`pytest --pyargs benchmarks.suites
--benchmark-only ...`), and named by the repository's root conftest.py for a checkout that is not installed.

    pytest benchmarks --benchmark-only [--bench-scale full|tiny|all] [--budget-gib 40]
        [--throughput-protocol sampled|full] [--model-path DIR] [--share-gpu] [--impl NAME ...]
        --benchmark-json PATH

Installed, it is loaded by every pytest run of the environment, so it stays inert unless the run is the suites':
a path of the run (or a --pyargs name) inside `benchmarks/suites` or above it (`conformance.runs.runs_inside`).
Inert, it adds its options and a marker and nothing else: no GPU is taken, no implementation is loaded, nothing is
printed. Options whose names other projects use too are the plug-in's as --pnmix-budget-gib, --pnmix-eval-speed,
--pnmix-model-path and --pnmix-share-gpu; the repository's conftest adds the short names (`add_short_names`).

Full-scale points need CUDA and skip without it; tiny points run wherever the suite runs
(CUDA if present, else the CPU under the Triton interpreter). The figures are in each
benchmark's `extra_info`. pytest-benchmark's own statistics are the figure where a suite times model steps
(Fig. 7: the decode step; Fig. 6c: the decode steps at the sampled lengths, or the decode window; grouped
"SUITE (SCALE)") and where the kernel suites time decode calls (`harness.device_ms`'s per-call device times,
handed over by `harness.reported_ms`), so that `pytest-benchmark compare --group-by=group` compares them; the
fragment-order and PTX design suites, which time several variants in one point, time the whole point.

--impl (the conformance suite's option, or its PNMIX_IMPL) adds implementations timed beside the
built-in methods at the kernel, Fig. 7 and Fig. 6c points (`benchmarks.efficiency.plugins`); a name that
does not load stops the run before any test, with the loader's one-line reason.

Before the first test of a session, whichever it is, this process takes its GPU and caps its
memory (`gpu_session`): results do not depend on which tests ran before. Under pytest-xdist,
worker gwN takes GPU N; more workers than GPUs is an error unless --share-gpu says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from tabulate import tabulate

from benchmarks.efficiency import extra_info, harness, memory, plugins
from benchmarks.efficiency.workloads import SCALES, in_short_sweep
from conformance.runs import runs_inside
from reference import records

#: The suites' folder: a run whose paths (or --pyargs names) reach it is the suites' run (`active`).
SUITES_DIR = Path(__file__).parent.joinpath("suites").resolve()
SUITES_MODULE = "benchmarks.suites"

OPTIONS = {
    "--bench-scale": (
        {"choices": ("all", "full", "tiny"), "default": "all"},
        "full: the paper's shapes (CUDA); tiny: the same harness in seconds (any device)",
    ),
    "--bench-sweep": (
        {"choices": ("all", "short"), "default": "all"},
        "short: the subset a time-limited GPU session can run (benchmarks.efficiency.workloads.in_short_sweep)",
    ),
    "--budget-gib": (
        {"type": float, "default": memory.DEFAULT_BUDGET_GIB},
        "cap usable GPU memory (default 40, the paper's A100-40GB; 0: no cap)",
    ),
    "--throughput-protocol": (
        {"choices": ("sampled", "full"), "default": "sampled"},
        "Fig. 6c: time decode steps at a few lengths and integrate (default), or run every step",
    ),
    "--eval-speed": (
        {"action": "store_true", "default": False},
        "run the evaluation-speed suite (suites/test_eval_speed.py: SmolLM2 on the CPU, one thread; tens of "
        "minutes), which is skipped otherwise",
    ),
    "--model-path": ({"default": None}, "a local checkpoint of the full-scale architecture instead of random weights"),
    "--share-gpu": (
        {"action": "store_true", "default": os.environ.get("PNMIX_SHARE_GPU", "") not in ("", "0")},
        "let pytest-xdist workers share GPUs (gwN takes GPU N mod the count; env PNMIX_SHARE_GPU=1)",
    ),
}


#: Options named as other projects may name theirs: --pnmix-NAME here, NAME in the repository (`add_short_names`).
SHARED_NAMES = ("--budget-gib", "--eval-speed", "--model-path", "--share-gpu")


def dest(name: str) -> str:
    """Where an option's value is read (`config.getoption(dest(name))`), whichever name set it: prefixed, since
    pytest refuses a second option of the same destination (another project's --model-path has model_path)."""
    return "pnmix_" + name.removeprefix("--").replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pnmix benchmarks")
    for name, (kwargs, text) in OPTIONS.items():
        flag = "--pnmix-" + name.removeprefix("--") if name in SHARED_NAMES else name
        group.addoption(
            flag, dest=dest(name), help=text + ("" if flag == name else f"; in the repository {name}"), **kwargs
        )


def add_short_names(parser: pytest.Parser) -> None:
    """The repository's names of the options an installed plug-in registers as --pnmix-NAME (one setting each)."""
    for name in SHARED_NAMES:
        kwargs, text = OPTIONS[name]
        parser.addoption(name, dest=dest(name), help=text, **kwargs)


_ACTIVE = pytest.StashKey[bool]()
_SUITE_TESTS = pytest.StashKey[set]()  # node ids of the suites' tests collected in this run


def active(config: pytest.Config) -> bool:
    """Whether this run is the suites' (module doc): otherwise the plug-in changes nothing."""
    if _ACTIVE not in config.stash:
        config.stash[_ACTIVE] = runs_inside(config, SUITES_DIR, SUITES_MODULE)
    return config.stash[_ACTIVE]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[_SUITE_TESTS] = {i.nodeid for i in items if Path(i.path).resolve().is_relative_to(SUITES_DIR)}
    if not active(config):
        return
    scale, short = config.getoption(dest("--bench-scale")), config.getoption(dest("--bench-sweep")) == "short"
    named = config.stash[_PLUGINS]

    def wanted(work) -> bool:
        if work.method in named:  # a plug-in's sweep is that of the method whose points it takes
            work = replace(work, method=plugins.BASE_METHOD)
        return (scale in ("all", work.scale)) and (not short or in_short_sweep(work))

    keep, drop = [], []
    for item in items:
        work = item.callspec.params.get("work") if hasattr(item, "callspec") else None
        (keep if work is None or not hasattr(work, "scale") or wanted(work) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def points(workloads, plugin_names: Sequence[str] = ()) -> list:
    """pytest params of both scales; full-scale ones carry the gpu mark (skipped without CUDA).
    Each plug-in named takes the points of `plugins.BASE_METHOD`, with its name as the method."""
    out = []
    for scale in SCALES.values():
        marks = [pytest.mark.gpu] if scale.name == "full" else []
        works = workloads(scale)
        works += [replace(w, method=name) for name in plugin_names for w in works if w.method == plugins.BASE_METHOD]
        out += [pytest.param(w, id=w.id, marks=marks) for w in works]
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mark = metafunc.definition.get_closest_marker("bench_points")
    if mark is not None:  # workloads by keyword: a lone function argument would make the mark decorate it
        workloads = mark.kwargs["workloads"]
        metafunc.parametrize("work", points(workloads, list(metafunc.config.stash[_PLUGINS])))


_GPU_INDEX = pytest.StashKey[int]()
_PLUGINS = pytest.StashKey[dict]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "bench_points(workloads=fn): the test's `work` is every point of workloads, and of each --impl"
    )
    config.stash[_PLUGINS] = {}
    if not active(config):
        return
    try:  # --impl is the conformance plug-in's option; without that plug-in, PNMIX_IMPL alone
        config.stash[_PLUGINS] = plugins.load(plugins.requested(config.getoption("--impl", default=None) or []))
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    # Decided at start-up, so that a worker without a GPU of its own stops the run with the reason.
    if torch.cuda.is_available():
        worker, share = os.environ.get("PYTEST_XDIST_WORKER"), config.getoption(dest("--share-gpu"))
        try:
            config.stash[_GPU_INDEX] = harness.worker_gpu(worker, torch.cuda.device_count(), share)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None


@dataclass(frozen=True)
class GpuSession:
    device: torch.device
    shared: bool  # more pytest-xdist workers than GPUs: some share this one
    budget_gib: float | None  # the memory cap in force (None: none)
    requested_gib: float  # --budget-gib (0: no cap asked for)


@pytest.fixture(scope="session", autouse=True)
def gpu_session(pytestconfig) -> GpuSession:
    """This process's GPU and memory cap, set before the first test of the session runs (the suites' run only)."""
    requested = pytestconfig.getoption(dest("--budget-gib"))
    if not active(pytestconfig) or not torch.cuda.is_available():
        return GpuSession(torch.device("cpu"), False, None, requested)
    device, cap = harness.take_gpu(pytestconfig.stash[_GPU_INDEX], requested)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return GpuSession(device, workers > torch.cuda.device_count(), cap, requested)


@pytest.fixture(scope="session")
def bench_device(gpu_session) -> torch.device:
    return gpu_session.device


@pytest.fixture(scope="session")
def budget_gib(gpu_session) -> float | None:
    """The memory cap in force for the session (None: no cap)."""
    return gpu_session.budget_gib


class Models:
    """One model per scale for the session (the full one is 16 GiB of weights)."""

    def __init__(self, device: torch.device, path: str | None) -> None:
        self.device, self.path, self._models = device, path, {}

    def get(self, scale):
        if scale.name not in self._models:
            self._models.clear()  # never two large models at once
            harness.release(self.device)
            path = self.path if scale.name == "full" else None
            self._models[scale.name] = harness.build_model(scale.arch, self.device, harness.MODEL_DTYPE, path)
        return self._models[scale.name]


@pytest.fixture(scope="session")
def models(pytestconfig, bench_device) -> Models:
    return Models(bench_device, pytestconfig.getoption(dest("--model-path")))


@pytest.fixture(scope="session")
def copy_gbps(bench_device) -> float:
    return harness.copy_bandwidth_gbps(bench_device, 2**30 if bench_device.type == "cuda" else 2**22)


class Implementations:
    """What each point's results say about the code that ran: its implementation and its
    fingerprint, each worked out once a session."""

    def __init__(self, named: dict[str, plugins.Plugin]) -> None:
        self.named, self._described, self._code = named, {}, {}

    def plugin(self, method: str) -> plugins.Plugin | None:
        return self.named.get(method)

    def describe(self, method: str) -> dict:
        if method not in self._described:
            self._described[method] = plugins.describe(method, self.plugin(method))
        return self._described[method]

    def code(self, method: str, suite_module: str, kernel: bool) -> dict:
        targets = plugins.code_targets(method, suite_module, kernel=kernel, plugin=self.plugin(method))
        if targets not in self._code:
            self._code[targets] = records.code_fingerprint(*targets)
        return self._code[targets]


@pytest.fixture(scope="session")
def implementations(pytestconfig) -> Implementations:
    return Implementations(pytestconfig.stash[_PLUGINS])


@pytest.fixture
def plugin(work, implementations) -> plugins.Plugin | None:
    """The plug-in a point runs (None for a built-in method)."""
    return implementations.plugin(work.method)


def skip_unclaimed(plugin: plugins.Plugin | None, **point) -> None:
    """Skip the point, with the reason, when a plug-in does not claim what it needs (`plugins.unclaimed`)."""
    reason = None if plugin is None else plugins.skip_reason(plugin, **point)
    if reason is not None:
        pytest.skip(reason)


#: Suites whose points time one layer's decode attention (the rest time the whole model).
KERNEL_SUITES = ("kernel", "kernel-launch")


@pytest.fixture
def record(request, benchmark, gpu_session, implementations):
    """Fills a benchmark's extra_info with the shared record plus the suite's own figures; each
    suite says whether finite-value checks were on (`harness.CHECK_FINITE` on this path; None: a
    plug-in's own). Every record names the implementation that ran and fingerprints the code
    measured (`plugins.code_targets`)."""
    bench_device = gpu_session.device

    def fill(suite: str, work, scale, *, check_finite: bool | None, **figures) -> dict:
        plugin = implementations.plugin(work.method)
        info = extra_info.record(
            suite,
            work,
            scale,
            device=bench_device,
            described=implementations.describe(work.method),
            code=implementations.code(work.method, request.module.__name__, suite in KERNEL_SUITES),
            attention=harness.attention_of(work.method, plugin),
            method_config=harness.config_record(harness.point_config(work.method, plugin)),
            gpu=gpu_session,
            check_finite=check_finite,
            **figures,
        )
        if plugin is not None:  # a plug-in's rows carry its own name, not the import path it was given by
            info["method"] = info["implementation"]
        benchmark.group = f"{suite} ({scale.name})"
        if benchmark.stats is not None:  # timed already (`harness.benchmarked_ms`): its statistics take the group
            benchmark.stats.group = benchmark.group
        benchmark.extra_info.update(info)
        return info

    return fill


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    suites = config.stash.get(_SUITE_TESTS, set())
    if not active(config) or not any(r.nodeid in suites for r in terminalreporter.stats.get("passed", [])):
        return
    rows = memory.comparison(memory.ARCHITECTURES["Qwen3-8B"])
    terminalreporter.section("PN-Mix memory feasibility model (computed, Qwen3-8B, 40 GiB) vs the paper")
    terminalreporter.write_line(
        tabulate(
            [{k: r[k] for k in ("figure", "method", "paper", "model", "agrees")} for r in rows],
            headers="keys",
            tablefmt="github",
        )
    )
    if config.getoption("benchmark_json", None) is None and torch.cuda.is_available():
        terminalreporter.write_line("no --benchmark-json PATH given: the measured figures were not saved")
