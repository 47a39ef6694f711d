"""The decode kernel with the PTX unpack of its value codes asked for and not (`pnmix.kernels.ptx_unpack`).

Per point (`benchmarks.efficiency.workloads.kernel_ptx`): PN-Mix's decode over one layer's preallocated cache, once
with the switch off and once asked for, each judged against the float64 oracle over the cache's dequantized keys and
values by the conformance suite's rule (property 7), and timed (`harness.device_ms`). The record says which path each
launch took (`attention.value_ptx` after the call: the PTX path only where the device's self-test passed and the
kernel's TTGIR groups four elements of one shift), the self-test's outcome in its own words, and whether the two
outputs are the same bits (the codes are, so the outputs should be). Under the interpreter the PTX path is never
taken: the tiny point checks the harness only.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.efficiency import harness
from benchmarks.efficiency.workloads import SCALES, kernel_ptx
from benchmarks.plugin import points
from benchmarks.suites.test_kernels import bytes_read
from conformance.harness import judge


@pytest.mark.parametrize("work", points(kernel_ptx))
def test_decode_with_and_without_the_ptx_unpack(work, bench_device, copy_gbps, benchmark, record):
    from pnmix.kernels import decode_attention, ptx_unpack  # deferred: triton compiles kernels as they are imported
    from pnmix.kernels.attention import value_ptx  # deferred: triton compiles kernels as they are imported

    scale = SCALES[work.scale]
    nbytes = bytes_read(work)

    def measure() -> dict:
        cache, q = harness.build_decode_cache(
            work.method, work.batch, work.context, work.layer, bench_device, scale.prompt
        )
        region, layout = cache.region(), cache.cache_layout
        k_hat, v_hat = (t.cpu() for t in cache.dequantize())
        figures, outs = {}, {}
        for name, asked in (("plain", False), ("ptx", True)):
            with ptx_unpack.request(asked):
                fn = lambda: decode_attention(q, region, layout)  # noqa: E731
                outs[name] = fn().cpu()
                took = "ptx" if value_ptx(layout, q.dtype) else "plain"
                state = ptx_unpack.state()
                timing = harness.device_ms(fn, bench_device)
            err, bound, _ = judge(outs[name], q.cpu(), k_hat, v_hat)
            gbps = nbytes / (timing["ms"] * 1e-3) / 1e9
            figures |= {
                f"{name}_path": took,
                f"{name}_max_error": err,
                f"{name}_ms": timing["ms"],
                f"{name}_fraction_of_copy": gbps / copy_gbps,
                "error_bound": bound,
            }
        return figures | {
            "self_test": state["why"],
            "device_on": state["on"],
            "identical": torch.equal(outs["ptx"].view(torch.int16), outs["plain"].view(torch.int16)),
        }

    result = benchmark.pedantic(measure, rounds=1, iterations=1)
    record("kernel-ptx", work, scale, **result, bytes=nbytes, copy_gbps=copy_gbps, check_finite=False)
    assert result["plain_path"] == "plain", result
    for name in ("plain", "ptx"):
        assert result[f"{name}_max_error"] <= result["error_bound"], (
            f"{work.id}, {name} path {result[f'{name}_path']}: attention error {result[f'{name}_max_error']:.3g} "
            f"above {result['error_bound']:.3g} (self-test: {result['self_test']})"
        )
