"""Fig. 6c: decode throughput (generated tokens/s) vs batch at L_gen = 8K, P = 141, greedy.

Sampled protocol (default): the cache is filled to several lengths, a few decode steps are
timed at each (CUDA events), and the piecewise-linear step time is integrated over all
L_gen steps (`benchmarks.analysis.integrated_decode_seconds`); the prompt's time is added.
Full protocol (--throughput-protocol full): every step is run and the whole loop timed.
Steps are eager (CUDA events around each, launch overhead included). Out of memory anywhere in
a point is recorded as {"oom": true}.
"""

from __future__ import annotations

import pytest

from benchmarks import analysis, harness
from benchmarks.conftest import points
from benchmarks.workloads import SCALES, fig6c_throughput


def step_roofline_ms(arch, method: str, batch: int, length: int, gbps: float) -> float:
    """Milliseconds to read the weights once and the cache of `length` tokens at copy bandwidth."""
    from reference import storage_model

    s = arch.shape
    kv = s.layers * storage_model(harness.method_config(method), batch, s.kv_heads, s.head_dim, length).total
    return (arch.weight_bytes() + kv) / (gbps * 1e9) * 1e3


@pytest.mark.parametrize("work", points(fig6c_throughput))
def test_fig6c_throughput(work, models, bench_device, copy_gbps, pytestconfig, benchmark, record):
    scale = SCALES[work.scale]
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
        steps, wall = [], []
        for s in work.samples:
            gen.fill_to(scale.prompt + s)
            t = harness.time_ms(gen.step, bench_device, scale.reps, scale.warmup)
            steps.append(t["ms"])
            wall.append(t["wall_ms"])
        decode_s = analysis.integrated_decode_seconds(work.samples, steps, 0, work.generation)
        roofline = [
            step_roofline_ms(scale.arch, work.method, work.batch, scale.prompt + s, copy_gbps) for s in work.samples
        ]
        return {
            "decode_s": decode_s,
            "sample_lengths": list(work.samples),
            "step_ms": steps,
            "wall_step_ms": wall,
            "roofline_step_ms": roofline,
        }

    def generate() -> dict:
        model = models.get(scale)
        make = lambda: harness.Generation(model, work.method, work.batch, scale.prompt, capacity)  # noqa: E731
        gen, prefill_wall, prefill_gpu = harness.timed(make, bench_device)
        prefill_ms = prefill_wall if prefill_gpu is None else prefill_gpu
        figures = measure(gen)
        total_s = prefill_ms / 1e3 + figures["decode_s"]
        tokens_per_s = analysis.tokens_per_second(work.batch, work.generation, total_s)
        return {"prefill_ms": prefill_ms, "total_s": total_s, "tokens_per_s": tokens_per_s, **figures,
                "check_finite": gen.check_finite}  # fmt: skip

    def run() -> dict:
        return harness.unless_oom(generate, bench_device, tokens_per_s=None, sample_lengths=[], step_ms=[],
                                  total_s=None, check_finite=harness.CHECK_FINITE)  # fmt: skip

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
