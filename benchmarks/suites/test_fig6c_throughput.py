"""Fig. 6c: decode throughput (generated tokens/s) vs batch at L_gen = 8K, P = 141, greedy.

Sampled protocol (default): the cache is filled to several lengths, a few decode steps are
timed at each (CUDA events), and the piecewise-linear step time is integrated over all
L_gen steps (`benchmarks.efficiency.analysis.integrated_decode_seconds`); the prompt's time is added.
Full protocol (--throughput-protocol full): every step is run and the whole loop timed.
Steps are eager (CUDA events around each, launch overhead included). Out of memory anywhere in
a point is recorded as {"oom": true}. A plug-in (--impl, `benchmarks.efficiency.plugins`) runs PN-Mix's
points with its own caches in the model (`PNMixHFCache(impl=)`, not preallocated); its
roofline counts the bytes its caches hold (`harness.Generation.read_bytes`).
"""

from __future__ import annotations

import pytest

from benchmarks.conftest import skip_unclaimed
from benchmarks.efficiency import analysis, harness
from benchmarks.efficiency.workloads import SCALES, fig6c_throughput

#: Tokens a decode step appends to every layer's cache.
STEP_TOKENS = 1


def step_roofline_ms(arch, cache_bytes: int, gbps: float) -> float:
    """Milliseconds to read the weights once and `cache_bytes` of caches at copy bandwidth."""
    return (arch.weight_bytes() + cache_bytes) / (gbps * 1e9) * 1e3


def skip_unless_model_claimed(plugin, scale, device) -> None:
    """A model-level point of a plug-in: the model's dtype and head_dim, the prompt and one-token steps."""
    sizes = (scale.prompt, STEP_TOKENS)
    skip_unclaimed(
        plugin, device=device.type, dtype=harness.MODEL_DTYPE, head_dim=scale.arch.shape.head_dim, sizes=sizes
    )


@pytest.mark.bench_points(workloads=fig6c_throughput)
def test_fig6c_throughput(work, plugin, models, bench_device, copy_gbps, pytestconfig, benchmark, record):
    scale = SCALES[work.scale]
    skip_unless_model_claimed(plugin, scale, bench_device)
    protocol = pytestconfig.getoption("--throughput-protocol")
    capacity = scale.prompt + work.generation

    def measure(gen) -> dict:
        if protocol == "full":
            _, wall, gpu = harness.timed(lambda: [gen.step() for _ in range(work.generation)], bench_device)
            return {
                "decode_s": (wall if gpu is None else gpu) / 1e3,
                "sample_lengths": [],
                "step_ms": [],
                "wall_step_ms": [],
            }
        steps, wall, roofline = [], [], []
        for s in work.samples:
            gen.fill_to(scale.prompt + s)
            roofline.append(step_roofline_ms(scale.arch, gen.read_bytes(), copy_gbps))
            t = harness.time_ms(gen.step, bench_device, scale.reps, scale.warmup)
            steps.append(t["ms"])
            wall.append(t["wall_ms"])
        decode_s = analysis.integrated_decode_seconds(work.samples, steps, 0, work.generation)
        return {
            "decode_s": decode_s,
            "sample_lengths": list(work.samples),
            "step_ms": steps,
            "wall_step_ms": wall,
            "roofline_step_ms": roofline,
        }

    def generate() -> dict:
        model = models.get(scale)

        def make():
            return harness.Generation(model, work.method, work.batch, scale.prompt, capacity, plugin=plugin)

        gen, prefill_wall, prefill_gpu = harness.timed(make, bench_device)
        prefill_ms = prefill_wall if prefill_gpu is None else prefill_gpu
        figures = measure(gen)
        total_s = prefill_ms / 1e3 + figures["decode_s"]
        tokens_per_s = analysis.tokens_per_second(work.batch, work.generation, total_s)
        return {
            "prefill_ms": prefill_ms,
            "total_s": total_s,
            "tokens_per_s": tokens_per_s,
            **figures,
            "check_finite": gen.check_finite,
            "code_order": gen.code_order,
        }

    def run() -> dict:
        return harness.unless_oom(
            generate,
            bench_device,
            tokens_per_s=None,
            sample_lengths=[],
            step_ms=[],
            total_s=None,
            check_finite=None if plugin else harness.CHECK_FINITE,
        )

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    record(
        "fig6c-throughput",
        work,
        scale,
        protocol=protocol,
        copy_gbps=copy_gbps,
        **result,
    )
    if not result["oom"]:
        assert result["tokens_per_s"] > 0
        assert all(ms > 0 for ms in result["step_ms"])
