"""Fig. 6c: decode throughput (generated tokens/s) vs batch at L_gen = 8K, P = 141, greedy.

Sampled protocol (default): the cache is filled to several lengths, a few decode steps are
timed at each (CUDA events), and the piecewise-linear step time is integrated over all
L_gen steps (`benchmarks.efficiency.analysis.integrated_decode_seconds`); the prompt's time is added.
Full protocol (--throughput-protocol full): every step is run and the whole loop timed.
Steps are eager (CUDA events around each, launch overhead included). Out of memory anywhere in
a point is recorded as {"oom": true}. pytest-benchmark's statistics are the decode it timed
(`harness.benchmarked_ms`): the steps at the sampled lengths (`reps` each, in order; fill and warm-up
untimed), or the whole decode window (full protocol); the prompt's time is in extra_info alone.
A plug-in (--impl, `benchmarks.efficiency.plugins`) runs PN-Mix's points with its own caches in the
model (`PNMixHFCache(impl=)`, not preallocated); its roofline counts the bytes its caches hold
(`harness.Generation.read_bytes`).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.efficiency import analysis, harness
from benchmarks.efficiency.workloads import SCALES, fig6c_throughput
from benchmarks.plugin import dest, skip_unclaimed

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
@pytest.mark.benchmark(timer=harness.CLOCK)
def test_fig6c_throughput(work, plugin, models, bench_device, copy_gbps, pytestconfig, benchmark, record):
    scale = SCALES[work.scale]
    skip_unless_model_claimed(plugin, scale, bench_device)
    protocol = pytestconfig.getoption(dest("--throughput-protocol"))
    capacity = scale.prompt + work.generation

    def measure(gen) -> dict:
        # pytest-benchmark times the decode: its statistics are the window (full) or the steps (sampled)
        if protocol == "full":

            def window() -> None:
                for _ in range(work.generation):
                    gen.step()

            t = harness.benchmarked_ms(benchmark, window, bench_device, reps=1, warmup=0)
            return {"decode_s": t["ms"] / 1e3, "sample_lengths": [], "step_ms": [], "wall_step_ms": []}
        samples, reps, roofline = list(work.samples), scale.reps, []
        rounds = iter(range(len(samples) * reps))

        def setup() -> None:
            """Before the first timed step at a sampled length: fill to it and warm up there (untimed)."""
            r = next(rounds)
            if r % reps == 0:
                gen.fill_to(scale.prompt + samples[r // reps])
                roofline.append(step_roofline_ms(scale.arch, gen.read_bytes(), copy_gbps))
                for _ in range(scale.warmup):
                    gen.step()

        t = harness.benchmarked_ms(benchmark, gen.step, bench_device, len(samples) * reps, warmup=0, setup=setup)
        steps = [statistics.median(t["rounds_ms"][j * reps : (j + 1) * reps]) for j in range(len(samples))]
        wall = [statistics.median(t["wall_rounds_ms"][j * reps : (j + 1) * reps]) for j in range(len(samples))]
        decode_s = analysis.integrated_decode_seconds(work.samples, steps, 0, work.generation)
        return {
            "decode_s": decode_s,
            "sample_lengths": samples,
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
            benchmark,
            tokens_per_s=None,
            sample_lengths=[],
            step_ms=[],
            total_s=None,
            check_finite=None if plugin else harness.CHECK_FINITE,
        )

    result = run()
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
