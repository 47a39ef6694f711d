"""Fig. 7: per-step decode latency vs step at B = 1, P = 141, up to 32K steps (CUDA events).

Each step is its own test; one cache per method walks forward through the steps (synthetic
keys and values fill the gaps), so a sweep costs one fill, not one per point. The slope over
steps 11K-31K (`benchmarks.efficiency.analysis.latency_slope_us`) is computed from these points by the report.
step_ms is the eager step as a transformers user runs it (CUDA events around the call, launch
overhead included, as the paper measures), and pytest-benchmark's statistics are these same steps
(`harness.benchmarked_ms`: `pytest-benchmark compare` compares step times; a point that runs out of
memory before its steps are timed has none); graph_ms is the step at the same position replayed from
a CUDA graph (launch overhead removed, as gpt-fast reports decode) on a capturable twin of the
cache where the method's can be (`harness.LatencyWalk`: graph_capturable says so), with graph_note
saying why when there is none or what the replay leaves out. Out of memory anywhere in a point is
recorded as {"oom": true}. A plug-in (--impl, `benchmarks.efficiency.plugins`) runs PN-Mix's
points with its own caches in the model (`PNMixHFCache(impl=)`, not preallocated, no graph:
graph_note says why); roofline_step_ms counts the bytes its caches hold.
"""

from __future__ import annotations

import pytest

from benchmarks.efficiency import harness
from benchmarks.efficiency.workloads import SCALES, fig7_latency
from benchmarks.suites.test_fig6c_throughput import skip_unless_model_claimed, step_roofline_ms


@pytest.fixture(scope="module")
def walkers():
    """The LatencyWalk of each (scale, method) in use, reused while steps only move forward."""
    state = {}
    yield state
    state.clear()


@pytest.mark.bench_points(workloads=fig7_latency)
@pytest.mark.benchmark(timer=harness.CLOCK)
def test_fig7_step_latency(work, plugin, models, walkers, bench_device, copy_gbps, benchmark, record):
    scale = SCALES[work.scale]
    skip_unless_model_claimed(plugin, scale, bench_device)
    target = scale.prompt + work.step
    key = (work.scale, work.method)

    def measure() -> dict:
        model = models.get(scale)
        gen = walkers.get(key)
        if gen is None or gen.length > target or gen.model is not model:
            walkers.clear()  # one method's caches at a time
            harness.release(bench_device)
            gen = walkers[key] = harness.LatencyWalk(
                model, work.method, scale.prompt, scale.prompt + work.generation, plugin=plugin
            )
        gen.fill_to(target)
        roofline = step_roofline_ms(scale.arch, gen.eager.read_bytes(), copy_gbps)
        # pytest-benchmark times these steps: its statistics are step_ms (`harness.benchmarked_ms`)
        timing = harness.benchmarked_ms(benchmark, gen.eager.step, bench_device, scale.reps, scale.warmup)
        graph = gen.graph_step()
        return {
            "step_ms": timing["ms"],
            "wall_ms": timing["wall_ms"],
            "gpu_ms": timing["gpu_ms"],
            "rounds_ms": timing["rounds_ms"],
            **graph,
            "steps_run": gen.length - target,
            "roofline_step_ms": roofline,
            "check_finite": gen.eager.check_finite,
            "code_order": gen.eager.code_order,
        }

    def run() -> dict:
        return harness.unless_oom(
            measure,
            bench_device,
            benchmark,
            step_ms=None,
            wall_ms=None,
            gpu_ms=None,
            graph_ms=None,
            graph_note="out of memory",
            graph_steps=0,
            graph_capturable=None,
            roofline_step_ms=None,
            check_finite=None if plugin else harness.CHECK_FINITE,
        )

    result = run()
    if result["oom"]:
        walkers.clear()  # a cache that ran out of memory mid-step is not walked further
    record(
        "fig7-latency",
        work,
        scale,
        batch=1,
        **result,
        copy_gbps=copy_gbps,
    )
    if not result["oom"]:
        assert result["step_ms"] > 0
        assert result["steps_run"] == scale.reps + scale.warmup + result["graph_steps"]
