"""The fragment-order loop on the device (`pnmix.kernels.fragment_decode`: the design of the next decode kernel,
pnmix/kernels/NOTES.md "Codes in fragment order, compiled"), the first thing a GPU session measures.

Per point (`benchmarks.efficiency.workloads.kernel_fragment`): the device's self-test of the loop
(`pnmix.kernels.fragment_check.decide`: against float64 attention on a fixed synthetic head, with the inline-PTX
unpack and then without), recorded in its own words with the path it chose; then, where a path passed, the split
kernel's device time (`harness.device_ms`, L2 flushed) over `batch` x 8 KV heads of `context` quantized tokens of
random fragment-order words and scales (every word is valid codes), at the package's split count, and the bytes it
reads (72 per token per KV head, the default configuration's, plus the queries) against the device's copy
bandwidth: the figure the gate predicts as the split kernel's time (`python -m pnmix.aot`, section "Fragment-order
loop"), the merge left out. Off the GPU the self-test is not run (no launcher) and the point records why.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.conftest import points
from benchmarks.efficiency import harness
from benchmarks.efficiency.workloads import SCALES, kernel_fragment

KV_HEADS = 8  # one Qwen3-8B layer
BYTES_PER_TOKEN = 72  # per KV head: codes, scales and zeros of the default configuration


def random_heads(heads: int, tokens: int, device: torch.device) -> dict:
    """Fragment-order tiles and scales of `heads` KV heads, random, made on the device (any word is valid codes)."""
    from pnmix.kernels import fragment, fragment_decode  # deferred: triton compiles kernels as they are imported

    tiles, groups = tokens // fragment.TILE, tokens // fragment_decode.GROUP
    g = torch.Generator(device=device).manual_seed(0)

    def halves(*shape):
        return (torch.rand(*shape, generator=g, device=device) * 0.5 + 0.05).to(torch.float16)

    q = torch.randn(heads, 16, 128, generator=g, device=device).to(torch.float16)
    return {
        "q": q,
        "qh": q[..., :64].contiguous(),
        "words": torch.randint(0, 1 << 32, (heads, tiles, fragment.WARPS, 32, fragment.WORDS), generator=g,
                               device=device).to(torch.int32),  # every bit pattern, wrapped to int32
        "ks": halves(heads, groups, 128),
        "kz": halves(heads, groups, 128),
        "khs": halves(heads, groups, 64),
        "vs": halves(heads, tiles * fragment.TILE),
        "vz": halves(heads, tiles * fragment.TILE),
    }  # fmt: skip


@pytest.mark.parametrize("work", points(kernel_fragment))
def test_fragment_order_loop(work, bench_device, copy_gbps, benchmark, record):
    from pnmix.kernels import attention, fragment_check, fragment_decode  # deferred: kernels compile as imported

    scale = SCALES[work.scale]
    path, why = fragment_check.decide(bench_device)
    heads = work.batch * KV_HEADS
    nbytes = heads * work.context * BYTES_PER_TOKEN + heads * 16 * 128 * 2

    def measure() -> dict:
        if path == "off":
            return {"path": path, "self_test": why}
        args = random_heads(heads, work.context, bench_device)
        splits = attention.default_splits(heads, work.context, fragment_decode.TOKENS_PER_ITERATION)
        qk_scale = 1 / math.sqrt(128) / math.log(2)
        timing = harness.device_ms(lambda: fragment_check.launch(args, qk_scale, splits, path == "ptx"), bench_device)
        gbps = nbytes / (timing["ms"] * 1e-3) / 1e9
        return {"path": path, "self_test": why, "splits": splits, "ms": timing["ms"], "gbps": gbps,
                "fraction_of_copy": gbps / copy_gbps}  # fmt: skip

    result = benchmark.pedantic(measure, rounds=1, iterations=1)
    record("kernel-fragment", work, scale, **result, bytes=nbytes, copy_gbps=copy_gbps, check_finite=False)
    if bench_device.type == "cuda" and torch.cuda.get_device_capability(bench_device)[0] >= 8:
        assert path != "off", f"the fragment-order loop failed its self-test on {bench_device}: {why}"
