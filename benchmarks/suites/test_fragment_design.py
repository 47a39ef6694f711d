"""The fragment-order path on the device (`pnmix.kernels.fragment_attention`: what a `PNMixCache` of the default
configuration decodes with in float16 where the loop passed its self-test; pnmix/kernels/NOTES.md "Codes in
fragment order"), the first thing a GPU session measures.

Per point (`benchmarks.efficiency.workloads.kernel_fragment`): the device's self-test of the loop
(`pnmix.kernels.fragment_check.decide`: against float64 attention on fixed synthetic heads with sinks and a residual,
with the inline-PTX unpack and then without), recorded in its own words with the path it chose; then, where a path
passed, the device time (`harness.device_ms`, L2 flushed) of one decode step's attention over `batch` x 8 KV heads
holding `context` tokens (a cache's buffers filled with random codes, scales, sinks and residual, at the layout of
that many tokens: every byte is valid codes), the loop and the merge as the cache launches them, and the bytes it
reads (72 per quantized token per KV head, 512 per exact one, plus the queries) against the device's copy bandwidth:
the figure the gate predicts (`python -m pnmix.aot`, section "Fragment-order path"). Off the GPU the self-test is
not run (no launcher) and the point records why.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.efficiency import harness
from benchmarks.efficiency.workloads import SCALES, kernel_fragment
from benchmarks.plugin import points
from reference import PNMixConfig, token_layout

KV_HEADS, GQA = 8, 4  # one Qwen3-8B layer
BYTES_PER_TOKEN = 72  # per quantized token and KV head: codes, scales and zeros of the default configuration


def random_cache(batch: int, context: int, device: torch.device):
    """A cache's buffers holding `context` tokens of the default configuration (float16, d = 128, 8 KV heads), random,
    made on the device: (region, layout, salient channels) as `fragment_attention.decode` takes them."""
    from pnmix.kernels.attention import PackedRegion  # deferred: triton compiles kernels as they are imported
    from reference import CacheLayout, PNMixConfig

    layout = CacheLayout(PNMixConfig(), batch, KV_HEADS, 128, torch.float16)
    g = torch.Generator(device=device).manual_seed(0)
    tensors = layout.allocate(device, context)
    for t in tensors.values():
        if t.dtype == torch.uint8:  # codes and metadata: every bit pattern is valid
            t.copy_(torch.randint(0, 256, t.shape, generator=g, device=device))
        else:  # scales, zeros, exact keys and values
            t.copy_(torch.rand(t.shape, generator=g, device=device) * 0.5 + 0.05)
    channels = torch.rand(batch, KV_HEADS, 128, generator=g, device=device).argsort(-1)[..., :64]
    return PackedRegion(tensors, layout.tokens(context)), layout, channels.sort(-1).values.to(torch.int32)


@pytest.mark.parametrize("work", points(kernel_fragment))
def test_fragment_order_loop(work, bench_device, copy_gbps, benchmark, record):
    from pnmix import perfmodel  # deferred: importing pnmix decorates its kernels, as the line below does
    from pnmix.kernels import attention, fragment_attention, fragment_check, fragment_decode  # deferred: compiles

    scale = SCALES[work.scale]
    path, why = fragment_check.decide(bench_device)
    heads = work.batch * KV_HEADS
    tokens = token_layout(PNMixConfig(), work.context)
    exact = tokens.length - tokens.n_quantized
    nbytes = heads * (tokens.n_quantized * BYTES_PER_TOKEN + exact * 512) + heads * GQA * 128 * 2

    def measure() -> dict:
        if path == "off":
            return {"path": path, "self_test": why}
        region, layout, channels = random_cache(work.batch, work.context, bench_device)
        q = torch.randn(work.batch, KV_HEADS * GQA, 1, 128, device=bench_device).to(torch.float16)
        splits = attention.default_splits(heads, work.context, fragment_decode.TOKENS_PER_ITERATION)
        # the merge counters a cache holds, so that the form the package launches here is the one timed
        semaphores = torch.zeros(heads, dtype=torch.int32, device=bench_device)
        slots = 2 * torch.cuda.get_device_properties(bench_device).multi_processor_count
        programs = fragment_decode.split_plan(splits, heads, slots)[2]

        def step():
            return fragment_attention.decode(q, region, layout, channels, path, semaphores=semaphores)

        timing = harness.device_ms(step, bench_device)
        gbps = nbytes / (timing["ms"] * 1e-3) / 1e9
        merge = "in the loop" if perfmodel.merges_in_loop(heads, programs, slots) else "merge kernel"
        return {"path": path, "self_test": why, "splits": splits, "merge": merge, "ms": timing["ms"], "gbps": gbps,
                "fraction_of_copy": gbps / copy_gbps}  # fmt: skip

    result = benchmark.pedantic(measure, rounds=1, iterations=1)
    record("kernel-fragment", work, scale, **result, bytes=nbytes, copy_gbps=copy_gbps, check_finite=False)
    if bench_device.type == "cuda" and torch.cuda.get_device_capability(bench_device)[0] >= 8:
        assert path != "off", f"the fragment-order loop failed its self-test on {bench_device}: {why}"
