"""The benchmark suites' result: a pytest-benchmark file whose every benchmark carries the measured figures in its
`extra_info` (pytest-benchmark's own statistics are the figure's calls where a suite times them with
`harness.CLOCK`, else the whole point). This module states it once: the shared
record every point writes (`record`, filled by the suites' `record` fixture), what each suite adds (`EXTRA_INFO`),
and the file's schema (`KIND`). Its tables and figures are the report's performance and memory sections, which
read many such files together.
"""

from __future__ import annotations

from dataclasses import asdict

from reference import records, schema
from reference.records import BENCHMARK

#: The file as a whole; each benchmark's extra_info is judged by `EXTRA_INFO`, and one outside it is
#: left out with a note (a pytest-benchmark file may hold benchmarks of other suites).
PYTEST_BENCHMARK = {
    "machine_info": {"cpu?": {"brand_raw?": schema.TEXT}},
    "benchmarks": schema.ListOf(
        {
            "name": str,
            "extra_info?": schema.Maybe(dict),
            # host-clock wall times over the rounds (the tiny harness shows their spread)
            "stats?": {
                **{f"{k}?": schema.Maybe(schema.SECONDS) for k in ("median", "min", "max")},
                "rounds?": schema.Maybe(schema.COUNT),
            },
        }
    ),
}


#: extra_info of every benchmark of the suites the report reads, and of each suite.
EXTRA_INFO_COMMON = {
    "suite": str,
    "scale": str,
    "device": str,
    "versions": dict,
    "date_utc": str,
    "command": str,
    "model": str,
    "method": str,
    "timing": str,
}
_POINT = {"batch": schema.BATCH, "prompt": schema.COUNT}
EXTRA_INFO = {
    "fig6-memory": {
        **_POINT,
        "generation": schema.POSITIVE_COUNT,
        "oom": bool,
        "peak_allocated_gib": schema.Figure(schema.GIB),
        "model_peak_gib": schema.Figure(schema.GIB),
        "peak_reserved_gib?": schema.Maybe(schema.GIB),
        # the memory cap the point ran under (0: none); the memory section keeps the paper's 40 GiB points
        "budget_gib?": schema.Maybe(schema.GIB),
    },
    "fig6c-throughput": {
        **_POINT,
        "generation": schema.POSITIVE_COUNT,
        "protocol": str,
        "tokens_per_s": schema.Figure(schema.Range(0, 1e9, above=True)),
        "total_s": schema.Figure(schema.ELAPSED_S),
        "oom": bool,
    },
    "fig7-latency": {**_POINT, "step": schema.COUNT, "step_ms": schema.Figure(schema.MILLISECONDS)},
    "kernel": {
        "batch": schema.BATCH,
        "context": schema.POSITIVE_COUNT,
        "ms": schema.Figure(schema.MILLISECONDS),
        "bytes": schema.Figure(schema.BYTES),
        "gbps": schema.Figure(schema.GBPS),
        "copy_gbps": schema.GBPS,
        "fraction_of_copy": schema.Figure(schema.COPY_FRACTION),
        "roofline_ms?": schema.Maybe(schema.MILLISECONDS),
        "oom?": bool,
    },
    # benchmarks/suites/test_eval_speed.py: one task item or one generation through a method's cache, CPU
    "eval-speed": {
        "work": schema.OneOf(("item", "generation")),
        "length": schema.POSITIVE_COUNT,
        "threads": schema.POSITIVE_COUNT,
        "seconds": schema.Figure(schema.ELAPSED_S),
    },
    # benchmarks/suites/test_ptx_unpack.py: the decode kernel with and without the PTX unpack of its value codes
    "kernel-ptx": {
        "batch": schema.BATCH,
        "context": schema.POSITIVE_COUNT,
        "bytes": schema.Figure(schema.BYTES),
        "copy_gbps": schema.GBPS,
        "plain_path": schema.OneOf(("plain", "ptx")),
        "ptx_path": schema.OneOf(("plain", "ptx")),
        "self_test": str,
        "device_on?": (bool, schema.NONE),
        "identical": bool,
        "plain_max_error": schema.Figure(schema.NONNEGATIVE),
        "ptx_max_error": schema.Figure(schema.NONNEGATIVE),
        "error_bound": schema.Figure(schema.NONNEGATIVE),
        "plain_ms": schema.Figure(schema.MILLISECONDS),
        "ptx_ms": schema.Figure(schema.MILLISECONDS),
        "plain_fraction_of_copy?": schema.Figure(schema.COPY_FRACTION),
        "ptx_fraction_of_copy?": schema.Figure(schema.COPY_FRACTION),
    },
    # benchmarks/suites/test_fragment_design.py: the fragment-order loop in the form the package launches
    # (its path "off", and no timing, where its self-test cannot run: no CUDA device)
    "kernel-fragment": {
        "batch": schema.BATCH,
        "context": schema.POSITIVE_COUNT,
        "bytes": schema.Figure(schema.BYTES),
        "copy_gbps": schema.GBPS,
        "path": str,
        "self_test": str,
        "splits?": schema.POSITIVE_COUNT,
        "merge?": schema.OneOf(("in the loop", "merge kernel")),
        "ms?": schema.Figure(schema.MILLISECONDS),
        "gbps?": schema.Figure(schema.GBPS),
        "fraction_of_copy?": schema.Figure(schema.COPY_FRACTION),
    },
    "kernel-launch": {
        "batch": schema.BATCH,
        "context": schema.POSITIVE_COUNT,
        "block_n": schema.LAUNCH_PARAMETER,
        "warps": schema.LAUNCH_PARAMETER,
        "stages": schema.LAUNCH_PARAMETER,
        "split_factor": schema.LAUNCH_PARAMETER,
        "fits": (bool, schema.NONE),
        "ms": schema.Figure(schema.MILLISECONDS),
        "gbps": schema.Figure(schema.GBPS),
        "copy_gbps": schema.Figure(schema.GBPS),
        "fraction_of_copy": schema.Figure(schema.COPY_FRACTION),
        "max_error?": schema.Maybe(schema.NONNEGATIVE),
        "error_bound?": schema.Maybe(schema.Range(0, above=True)),
        "splits?": schema.LAUNCH_PARAMETER,
        "oom?": bool,
    },
}


def did_not_run(info: dict) -> bool:
    """Whether a benchmark point did not run: out of memory, or a launch choice that does not fit."""
    return info.get("oom") is True or info.get("fits") is False


def null_figures(info: dict, suite: str, path: str = "extra_info") -> list[tuple[str, str]]:
    """The figures that are null at a full-scale point that ran: the sections compute with each of them
    (the tiny harness on a CPU leaves out what it cannot measure there, and its table shows "-")."""
    if info.get("scale") != "full" or did_not_run(info):
        return []
    why = "is null at a full-scale point that ran (neither out of memory nor a launch choice that does not fit)"
    return [
        (schema.key(path, k), f"{why}: expected a number")
        for k, sub in EXTRA_INFO[suite].items()
        if isinstance(sub, schema.Figure) and k in info and info[k] is None
    ]


def problems(info: dict, suite: str, path: str = "extra_info") -> list[str]:
    """Why the report cannot use a benchmark of `suite` with this extra_info (none: it can)."""
    found = schema.check({**EXTRA_INFO_COMMON, **EXTRA_INFO[suite]}, info, path)
    return [f"{p}: {problem}" for p, problem in found or null_figures(info, suite, path)]


def record(
    suite: str, work, scale, *, device, described: dict, code: dict, attention: str, method_config, gpu, **figures
) -> dict:
    """A point's extra_info: its coordinates (`work` less its scale), the suite and scale, the environment of
    `device`, the implementation that ran (`described`, with its measured `code`), how it attends, its method's
    configuration as data, how it was timed, the GPU session's device and memory cap (`gpu`), then the suite's
    own `figures`."""
    coordinates = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(work).items() if k != "scale"}
    return {
        **coordinates,
        "prompt": scale.prompt,
        "suite": suite,
        "scale": scale.name,
        **records.environment(device),
        "model": scale.arch.name,
        **described,
        "code": code,
        "attention": attention,
        "method_config": method_config,
        "timing": "cuda events" if device.type == "cuda" else "wall clock (CPU, not predictive of GPU performance)",
        "device_index": device.index,
        "gpu_shared": gpu.shared,
        "budget_gib": gpu.budget_gib,
        "budget_requested_gib": gpu.requested_gib,
        **figures,
    }


#: A pytest-benchmark file of the suites (a timing: current by its code fingerprint, no canary).
KIND = schema.Kind(BENCHMARK, PYTEST_BENCHMARK)
