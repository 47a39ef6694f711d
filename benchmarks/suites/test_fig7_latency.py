"""Fig. 7: per-step decode latency vs step at B = 1, P = 141, up to 32K steps (CUDA events).

Each step is its own test; one cache per method walks forward through the steps (synthetic
keys and values fill the gaps), so a sweep costs one fill, not one per point. The slope over
steps 11K-31K (`benchmarks.analysis.latency_slope_us`) is computed from these points by the report.
"""

from __future__ import annotations

import pytest

from benchmarks import harness
from benchmarks.conftest import points
from benchmarks.suites.test_fig6c_throughput import step_roofline_ms
from benchmarks.workloads import SCALES, fig7_latency


@pytest.fixture(scope="module")
def walkers():
    """The Generation of each (scale, method) in use, reused while steps only move forward."""
    state = {}
    yield state
    state.clear()


@pytest.mark.parametrize("work", points(fig7_latency))
def test_fig7_step_latency(work, models, walkers, bench_device, copy_gbps, benchmark, record):
    scale = SCALES[work.scale]
    model = models.get(scale)
    target = scale.prompt + work.step
    key = (work.scale, work.method)
    gen = walkers.get(key)
    if gen is None or gen.length > target or gen.model is not model:
        walkers.clear()  # one cache at a time
        harness.release(bench_device)
        gen = walkers[key] = harness.Generation(model, work.method, 1, scale.prompt, scale.prompt + work.generation)
    gen.fill_to(target)
    timing = benchmark.pedantic(
        harness.time_ms, args=(gen.step, bench_device, scale.reps, scale.warmup), rounds=1, iterations=1
    )
    record(
        "fig7-latency",
        work,
        scale,
        batch=1,
        step_ms=timing["ms"],
        wall_ms=timing["wall_ms"],
        gpu_ms=timing["gpu_ms"],
        copy_gbps=copy_gbps,
        roofline_step_ms=step_roofline_ms(scale.arch, work.method, 1, target, copy_gbps),
    )
    assert timing["ms"] > 0 and gen.length == target + scale.reps + scale.warmup
