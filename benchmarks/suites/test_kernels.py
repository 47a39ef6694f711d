"""Decode-attention kernel microbenchmark: one layer, effective bandwidth vs the same device's copy.

Bytes read by a packed cache are its bytes by `reference.storage_model` (packed keys and
values, scales, zeros, selection metadata, sinks, residual) plus q and the output; FP16 is
SDPA over dense K/V. Times: triton.testing.do_bench (median, L2 flushed) and, on CUDA, the
replay of a captured CUDA graph (launch overhead removed) where capture succeeds.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import harness
from benchmarks.conftest import points
from benchmarks.workloads import SCALES, kernel_decode
from reference import storage_model


def graph_ms(fn, device) -> tuple[float | None, str | None]:
    """Median ms of replaying fn captured in a CUDA graph, or (None, why not)."""
    if device.type != "cuda":
        return None, "no CUDA graphs on the CPU"
    try:
        fn()  # compile and warm up outside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        return harness.do_bench_ms(graph.replay, device), None
    except Exception as error:  # capture is an optimisation: record why it was not possible
        return None, f"{type(error).__name__}: {error}"[:200]


@pytest.mark.parametrize("work", points(kernel_decode))
def test_decode_attention_bandwidth(work, bench_device, copy_gbps, benchmark, record):
    scale = SCALES[work.scale]
    kv_heads, n_rep, d = work.layer
    try:
        if work.method == harness.FP16:
            k = torch.randn(work.batch, kv_heads, work.context, d, device=bench_device, dtype=torch.float16)
            v = torch.randn_like(k)
            q = torch.randn(work.batch, kv_heads * n_rep, 1, d, device=bench_device, dtype=torch.float16)
            fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            cache_bytes = 2 * k.numel() * k.element_size()
        else:
            cache, q = harness.build_decode_cache(
                work.method, work.batch, work.context, work.layer, bench_device, scale.prompt
            )
            fn = lambda: cache.attend(q)  # noqa: E731
            cache_bytes = storage_model(harness.method_config(work.method), work.batch, kv_heads, d, work.context).total
    except Exception as error:
        if not harness.out_of_memory(error):
            raise
        record("kernel", work, scale, oom=True)
        pytest.skip(f"out of memory building a {work.context}-token cache at B = {work.batch}")
    ms = benchmark.pedantic(harness.do_bench_ms, args=(fn, bench_device), rounds=1, iterations=1)
    graph, why = graph_ms(fn, bench_device)
    nbytes = cache_bytes + 2 * q.numel() * q.element_size()
    gbps = nbytes / (ms * 1e-3) / 1e9
    record(
        "kernel",
        work,
        scale,
        oom=False,
        ms=ms,
        graph_ms=graph,
        graph_note=why,
        bytes=nbytes,
        gbps=gbps,
        copy_gbps=copy_gbps,
        fraction_of_copy=gbps / copy_gbps,
        roofline_ms=nbytes / (copy_gbps * 1e9) * 1e3,
        timing="triton.testing.do_bench median" if bench_device.type == "cuda" else "wall clock (CPU, not predictive)",
    )
    assert ms > 0 and nbytes > 0
