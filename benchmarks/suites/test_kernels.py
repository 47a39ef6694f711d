"""Decode-attention kernel microbenchmark: one layer, effective bandwidth vs the same device's copy.

Bytes read by a packed cache are its bytes by `reference.storage_model` for the tokens it holds
(packed keys and values, scales, zeros, selection metadata, sinks, residual: what attention
reads, not the preallocated room) plus q and the output; FP16 is SDPA over dense K/V. The cache
is preallocated (`max_cache_len`, the static protocol) with finite-value checks off. A plug-in
(--impl, `benchmarks.efficiency.plugins`) runs PN-Mix's points with `attend(q)` of its own cache, filled
through the protocol (not preallocated, its checks its own); its bytes are those its `storage()`
reports (`bytes_from`). Times:
`harness.device_ms` (median device time, L2 flushed, host gaps excluded) and the replay of the
call captured in a CUDA graph (`graph_ms`; graph_note says why there is none). Out of memory
anywhere in a point is recorded as {"oom": true}. A built-in method's point on a GPU records the machine code it
timed (`compiled`: `benchmarks.efficiency.compiled`), which keeps the timing current while its kernels compile to
the same SASS.

`test_decode_launch_choice` runs PN-Mix's decode kernel at each launch choice of
`benchmarks.efficiency.workloads.LAUNCH_GRID` (tile, warps, stages, splits) over one cache: its time and
bandwidth, and its error against the float64 oracle over the cache's dequantized keys and
values, judged by the conformance suite's rule (property 7). A choice that does not fit the
device (Triton's OutOfResources) is a data point, as out of memory is.
"""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.efficiency import compiled, harness
from benchmarks.efficiency.workloads import SCALES, kernel_decode, kernel_launch
from benchmarks.plugin import points, skip_unclaimed
from conformance.harness import judge
from pnmix import _runtime
from reference import storage_model

BYTES_FROM = {"FP16": "dense 16-bit K/V", "built-in": "reference.storage_model", "plug-in": "the cache's storage()"}


def io_bytes(work) -> int:
    """Bytes of q in and the output out of one decode call, 16-bit."""
    kv_heads, n_rep, d = work.layer
    return 2 * work.batch * kv_heads * n_rep * d * 2


def bytes_read(work) -> int:
    """Bytes one decode call of a built-in method reads and writes: the cache's tokens, q and the output."""
    kv_heads, _, d = work.layer
    if work.method == harness.FP16:
        return 2 * work.batch * kv_heads * work.context * d * 2 + io_bytes(work)
    config = harness.method_config(work.method)
    return storage_model(config, work.batch, kv_heads, d, work.context).total + io_bytes(work)


@pytest.mark.bench_points(workloads=kernel_decode)
@pytest.mark.benchmark(timer=harness.CLOCK)  # its statistics are the calls' device times (`harness.reported_ms`)
def test_decode_attention_bandwidth(work, plugin, bench_device, copy_gbps, benchmark, record):
    scale = SCALES[work.scale]
    kv_heads, n_rep, d = work.layer
    sizes = harness.decode_fill_sizes(work.context, scale.prompt)
    skip_unclaimed(plugin, device=bench_device.type, dtype=harness.KERNEL_DTYPE, head_dim=d, sizes=sizes)
    # a plug-in's bytes are known once its cache holds the tokens (its format is its own)
    nbytes = bytes_read(work) if plugin is None else None

    def measure() -> dict:
        machine_code = None
        if work.method == harness.FP16:
            k = torch.randn(work.batch, kv_heads, work.context, d, device=bench_device, dtype=harness.KERNEL_DTYPE)
            v = torch.randn_like(k)
            q = torch.randn(work.batch, kv_heads * n_rep, 1, d, device=bench_device, dtype=harness.KERNEL_DTYPE)
            fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            allocated, check_finite, read = 2 * k.numel() * k.element_size(), False, nbytes
            code_order = None
        else:
            cache, q = harness.build_decode_cache(
                work.method, work.batch, work.context, work.layer, bench_device, scale.prompt, plugin=plugin
            )
            fn = lambda: cache.attend(q)  # noqa: E731
            if plugin is None and bench_device.type == "cuda":  # the machine code timed, for the report's currency
                with _runtime.observing() as ran:
                    fn()
                machine_code = compiled.record(work.method, work.layer, harness.KERNEL_DTYPE, ran, bench_device)
            allocated = cache.storage().total
            check_finite = None if plugin is not None else getattr(cache, "check_finite", True)
            # which kernel decoded a Triton cache: the Triton kernel ("spec") or the fragment-order loop ("fragment")
            code_order = None if plugin is not None else getattr(cache, "code_order", None)
            read = nbytes if plugin is None else allocated + io_bytes(work)
        timing = harness.device_ms(fn, bench_device)
        graph = harness.graph_ms(fn, bench_device)
        gbps = read / (timing["ms"] * 1e-3) / 1e9
        return {
            "ms": timing["ms"],
            "reps": timing["reps"],
            "rounds_ms": timing["rounds_ms"],
            "host_gaps_excluded": timing["host_gaps_excluded"],
            **graph,
            "bytes": read,
            "gbps": gbps,
            "fraction_of_copy": gbps / copy_gbps,
            "graph_gbps": None if graph["graph_ms"] is None else read / (graph["graph_ms"] * 1e-3) / 1e9,
            "allocated_bytes": allocated,
            "check_finite": check_finite,
            "code_order": code_order,
            **({"compiled": machine_code} if machine_code is not None else {}),
        }

    def run() -> dict:
        return harness.unless_oom(
            measure,
            bench_device,
            ms=None,
            graph_ms=None,
            graph_note="out of memory",
            bytes=nbytes,
            gbps=None,
            fraction_of_copy=None,
            check_finite=None if plugin is not None else harness.CHECK_FINITE,
        )

    result = run()
    _report(benchmark, result)
    kind = "plug-in" if plugin is not None else "FP16" if work.method == harness.FP16 else "built-in"
    record(
        "kernel",
        work,
        scale,
        **result,
        bytes_from=BYTES_FROM[kind],
        copy_gbps=copy_gbps,
        roofline_ms=None if result["bytes"] is None else result["bytes"] / (copy_gbps * 1e9) * 1e3,
        timing="harness.device_ms: median of CUDA-event times, L2 flushed, host gaps excluded"
        if bench_device.type == "cuda"
        else "wall clock (CPU, not predictive)",
    )
    if not result["oom"]:
        assert result["ms"] > 0 and result["allocated_bytes"] > 0


@pytest.mark.parametrize("work", points(kernel_launch))
@pytest.mark.benchmark(timer=harness.CLOCK)  # its statistics are the calls' device times (`harness.reported_ms`)
def test_decode_launch_choice(work, bench_device, copy_gbps, benchmark, record):
    from triton.runtime.errors import OutOfResources

    from pnmix.kernels import decode_attention  # deferred: triton compiles kernels as they are imported
    from pnmix.kernels.attention import default_splits  # deferred: triton compiles kernels as they are imported

    scale = SCALES[work.scale]
    kv_heads = work.layer[0]
    nbytes = bytes_read(work)

    def measure() -> dict:
        cache, q = harness.build_decode_cache(
            work.method, work.batch, work.context, work.layer, bench_device, scale.prompt
        )
        region, layout = cache.region(), cache.cache_layout
        length = region.capacity or cache.length
        splits = work.split_factor * default_splits(work.batch * kv_heads, length, work.block_n)
        choice = {"num_splits": splits, "block_n": work.block_n, "num_warps": work.warps, "num_stages": work.stages}
        fn = lambda: decode_attention(q, region, layout, **choice)  # noqa: E731
        start = time.monotonic()
        try:
            out = fn()
        except OutOfResources as error:
            return {"fits": False, "fit_error": str(error).splitlines()[0][:200], "splits": splits}
        if bench_device.type == "cuda":
            torch.cuda.synchronize(bench_device)
        first_call_s = time.monotonic() - start
        err, bound, spec_err = judge(out.cpu(), q.cpu(), *(t.cpu() for t in cache.dequantize()))
        timing = harness.device_ms(fn, bench_device)
        gbps = nbytes / (timing["ms"] * 1e-3) / 1e9
        return {
            "fits": True,
            "splits": splits,
            "first_call_s": first_call_s,
            "max_error": err,
            "error_bound": bound,
            "spec_computation_error": spec_err,
            "ms": timing["ms"],
            "reps": timing["reps"],
            "rounds_ms": timing["rounds_ms"],
            "host_gaps_excluded": timing["host_gaps_excluded"],
            "gbps": gbps,
            "fraction_of_copy": gbps / copy_gbps,
        }

    def run() -> dict:
        return harness.unless_oom(measure, bench_device, fits=None, ms=None, gbps=None, fraction_of_copy=None)

    result = run()
    _report(benchmark, result)
    record("kernel-launch", work, scale, **result, bytes=nbytes, copy_gbps=copy_gbps, check_finite=False)
    if result.get("fits"):
        assert result["max_error"] <= result["error_bound"], (
            f"launch {work.id}: attention error {result['max_error']:.3g} above {result['error_bound']:.3g}"
        )
        assert result["ms"] > 0


def _report(benchmark, result: dict) -> None:
    """pytest-benchmark's rounds are the point's timed calls (`harness.reported_ms`); a point without them (out of
    memory, a launch that does not fit) one NaN round: no time, never a made-up one."""
    if result.get("rounds_ms"):
        harness.reported_ms(benchmark, result["rounds_ms"])
    else:
        harness.untimed(benchmark)
