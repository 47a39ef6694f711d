"""Fig. 6a/6b: peak GPU memory per method under the static protocol, and the feasibility model.

Each point preallocates the cache to P + L_gen, runs the prompt and one decode step, and
records max allocated and reserved memory (CUDA allocator statistics). The allocation does not
grow afterwards, and neither attention path keeps length-dependent workspace beyond it, so this
is the peak of the whole generation. Out of memory under the budget, anywhere in a point, is a
data point ({"oom": true}); the cap in force is each point's budget_gib. Implementations named
with --impl are not measured here: these points are the static protocol's preallocated caches,
which the implementation protocol does not have (they are timed by the other suites).
"""

from __future__ import annotations

import pytest

from benchmarks.efficiency import harness, memory
from benchmarks.efficiency.workloads import SCALES, fig6_memory
from benchmarks.plugin import points
from reference import records
from reference.paper import FIG6A_MAX_GENERATION, FIG6B_MAX_BATCH
from reference.records import GIB


@pytest.mark.parametrize("work", points(fig6_memory))
def test_fig6_peak_memory(work, models, bench_device, budget_gib, benchmark, record):
    scale = SCALES[work.scale]
    capacity = scale.prompt + work.generation

    def measure() -> dict:
        model = models.get(scale)
        harness.reset_peak(bench_device)
        gen = harness.Generation(model, work.method, work.batch, scale.prompt, capacity)
        gen.step()
        harness.synchronize(bench_device)
        allocated, reserved = harness.peak_gib(bench_device)
        return {
            "peak_allocated_gib": allocated,
            "peak_reserved_gib": reserved,
            "measured_cache_bytes": harness.measured_cache_bytes(gen.cache),
            "check_finite": gen.check_finite,
        }

    def run() -> dict:
        oom = dict.fromkeys(("peak_allocated_gib", "peak_reserved_gib", "measured_cache_bytes"))
        return harness.unless_oom(measure, bench_device, **oom, check_finite=harness.CHECK_FINITE)

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    predicted = memory.point(
        scale.arch,
        work.method,
        work.batch,
        work.generation,
        budget_gib=budget_gib or memory.DEFAULT_BUDGET_GIB,
    )
    record(
        "fig6-memory",
        work,
        scale,
        capacity=capacity,
        **result,
        model_peak_gib=predicted.peak_gib,
        weights_gib=predicted.weights / GIB,
        cache_gib=predicted.cache / GIB,
        workspace_estimate_gib=predicted.workspace.bytes / GIB,
        # what the estimate stands in for: the measured peak beyond weights and cache
        workspace_measured_gib=None
        if result["peak_allocated_gib"] is None
        else result["peak_allocated_gib"] - (predicted.weights + predicted.cache) / GIB,
    )
    if not result["oom"]:
        # The cache holds exactly what the storage model allocates, buffer by buffer summed.
        assert result["measured_cache_bytes"] == memory.cache_bytes(scale.arch, work.method, work.batch, capacity)
        if result["peak_allocated_gib"] is not None:
            assert result["peak_allocated_gib"] * GIB >= predicted.weights + predicted.cache


def test_fig6_feasibility_model(benchmark, record):
    """The model (computed, no GPU) reproduces Fig. 6a's boundaries at 40 GiB and finds FP16's
    Fig. 6b point within one batch step; rows go to extra_info for the report."""
    arch = memory.ARCHITECTURES["Qwen3-8B"]
    benchmark.group = "fig6-model"  # before timing: the statistics take the group then
    rows = benchmark.pedantic(memory.comparison, args=(arch,), rounds=1, iterations=1)
    benchmark.extra_info.update(
        {
            "suite": "fig6-model",
            "model": arch.name,
            "comparison": rows,
            "notes": memory.explain(arch),
            # what computed the rows: the memory model, the architectures and the spec's storage model
            "code": records.code_fingerprint(memory.__name__, "benchmarks.efficiency.architectures", "reference"),
        }
    )
    by = {(r["figure"], r["method"]): r for r in rows}
    assert all(by["6a", m]["model_value"] == g for m, g in FIG6A_MAX_GENERATION.items())
    assert abs(by["6b", "FP16"]["model_value"] - FIG6B_MAX_BATCH["FP16"][0]) <= 1
    assert by["6b", "PN-Mix"]["model_value"] >= FIG6B_MAX_BATCH["PN-Mix"][0]
