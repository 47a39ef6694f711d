"""The host path of a decode step: how many device kernels it launches, that it never waits on
the GPU (unless check_finite="eager"), and that the token counts on the device stay right.

Launches and host reads are counted by `pnmix.tests.counting`.
"""

from __future__ import annotations

import pytest
import torch

import reference as R
from pnmix import PNMixCache, _runtime
from pnmix.hf import LayerMask, PNMixHFCache, pnmix_mask
from pnmix.kernels import append_rows, decode_attention
from pnmix.tests.counting import counting
from reference import PNMixConfig
from reference.methods import METHODS

pytestmark = pytest.mark.interpreter if _runtime.INTERPRETED else pytest.mark.gpu
DEV = _runtime.kernel_device()
SMALL = PNMixConfig(group_size=8, residual_length=8, n_sink=3)
CONFIGS = {
    "PN-Mix": SMALL,
    "KIVI-2": METHODS["KIVI-2"](group_size=8, residual_length=8, n_sink=3),
    "Kitty": METHODS["Kitty"](group_size=8, residual_length=8, n_sink=3),
}
#: Methods whose decode step, once the prompt fills a page, only appends (no sliding value window).
SHARED = [name for name, config in CONFIGS.items() if config.value_residual == "shared"]


def data(shape, seed, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 2).to(dtype).to(DEV)


def prefilled(config=SMALL, prompt=13, capacity=48, check_finite=False, seed=0):
    """A cache of 1 x 2 KV heads (4 query heads), head_dim 16, after a prompt of `prompt` tokens."""
    q, k, v = data((1, 4, prompt, 16), seed), data((1, 2, prompt, 16), seed + 1), data((1, 2, prompt, 16), seed + 2)
    return PNMixCache.from_prefill(q, k, v, config, max_cache_len=capacity, check_finite=check_finite)


def step_tensors(seed, t=1):
    return data((1, 2, t, 16), 100 + seed), data((1, 2, t, 16), 200 + seed), data((1, 4, t, 16), 300 + seed)


# -- the counter itself -------------------------------------------------------------------


def test_the_counter_sees_copies_launches_and_host_reads(monkeypatch):
    cache = prefilled()
    k, v, q = step_tensors(0)
    rows = cache._rows
    with counting(monkeypatch) as eager:  # the decode-path append as it was: one copy per buffer
        rows["residual_key"].grow(1).copy_(k)
        rows["residual_value"].grow(1).copy_(v)
    assert eager.kernels == {"aten.copy_": 2} and not eager.syncs
    with counting(monkeypatch) as launched:
        decode_attention(q, cache.region(), cache.cache_layout)
    assert launched.total == 2 and not launched.syncs, launched.kernels
    with counting(monkeypatch) as reads:
        bool(torch.isfinite(k).all())
        k.float().sum().item()
        k.tolist()
    assert reads.syncs == {"_local_scalar_dense": 2, "tolist": 1}


# -- kernels per decode step --------------------------------------------------------------


@pytest.mark.parametrize("capacity", [48, None], ids=["preallocated", "dynamic"])
@pytest.mark.parametrize("method", SHARED)
def test_a_decode_step_launches_at_most_three_kernels_and_never_waits(monkeypatch, method, capacity):
    cache = prefilled(CONFIGS[method], capacity=capacity)  # 13 tokens: 3 sinks, one page, 2 residual
    for i in range(3):
        k, v, q = step_tensors(i)
        with counting(monkeypatch) as append:
            cache.append(k, v)
        with counting(monkeypatch) as attend:
            cache.attend(q)
        print(
            f"{method} {'dynamic' if capacity is None else 'preallocated'}: append {dict(append.kernels)}, "
            f"attend {dict(attend.kernels)}"
        )
        assert append.kernels == {"_append_rows_kernel": 1}
        assert attend.total == 2, attend.kernels
        assert not append.syncs and not attend.syncs
    assert cache.layout[:3] == (3, 8, 5)


@pytest.mark.parametrize("capacity", [48, None], ids=["preallocated", "dynamic"])
def test_a_sliding_value_window_quantizes_one_value_a_step_without_waiting(monkeypatch, capacity):
    cache = prefilled(CONFIGS["KIVI-2"], capacity=capacity)  # 3 sinks; keys: one page + 2; values: 2 + window 8
    for i in range(3):
        k, v, q = step_tensors(i)
        with counting(monkeypatch) as append:
            cache.append(k, v)
        assert cache.layout == (3, 8, 3 + i, 3 + i, 8)
        # The oldest value of the window is quantized: the value kernels, once, and no key kernel.
        assert append.kernels["_group_params_kernel"] == append.kernels["_encode_pack_kernel"] == 1
        assert "_append_rows_kernel" not in append.kernels
        assert not append.syncs
        with counting(monkeypatch) as attend:
            cache.attend(q)
        assert attend.total == 2 and not attend.syncs, attend.kernels


def test_eager_checks_are_what_waits_and_deferred_ones_never_wait(monkeypatch):
    k, v, q = step_tensors(0)
    counts = {}
    for mode in ("eager", True, False):
        cache = prefilled(check_finite=mode)
        assert cache.check_finite == mode
        with counting(monkeypatch) as step:
            cache.append(k, v)
            cache.attend(q)
        counts[mode] = step
        assert step.triton == 3 and step.kernels["_append_rows_kernel"] == 1, step.kernels
    # eager: k and v finite and in range, q finite, each read back. True: the same checks reduced on
    # the device (a reduction per input, a maximum per call), nothing read back. False: nothing.
    assert counts["eager"].syncs["_local_scalar_dense"] == 5
    assert not counts[True].syncs and not counts[False].syncs
    assert counts[True].kernels["aten.linalg_vector_norm"] == 3 and counts[True].kernels["aten.maximum"] == 2
    assert counts[True].aten == 5 and counts[False].aten == 0
    bad = k.clone()
    bad[0, 1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="k contains NaN or Inf"):
        prefilled(check_finite="eager").append(bad, v)
    unchecked = prefilled(check_finite=False)
    unchecked.append(bad, v)  # taken as given: the caller vouches for its inputs
    unchecked.check()
    for wrong in (1, None, "lazy"):
        with pytest.raises(TypeError, match="check_finite must be True, False or 'eager'"):
            PNMixCache(SMALL, check_finite=wrong)


@pytest.mark.parametrize("capacity", [48, None], ids=["preallocated", "dynamic"])
def test_flush_and_sink_steps_run_eagerly_with_more_kernels(monkeypatch, capacity):
    cache = prefilled(capacity=capacity, prompt=2)  # two of the three sinks
    k, v, _ = step_tensors(0)
    with counting(monkeypatch) as sink_step:
        cache.append(k, v)
    assert "_append_rows_kernel" not in sink_step.kernels and sink_step.kernels["aten.copy_"] >= 2
    for i in range(7):  # the residual up to 7 of 8 tokens
        cache.append(*step_tensors(i + 1)[:2])
    assert cache.layout[:3] == (3, 0, 7)
    k, v, _ = step_tensors(9)
    with counting(monkeypatch) as flush_step:
        cache.append(k, v)
    print(
        f"flush step ({'dynamic' if capacity is None else 'preallocated'}): {flush_step.total} kernels "
        f"{dict(flush_step.kernels)}, host reads {dict(flush_step.syncs)}"
    )
    assert cache.layout[:3] == (3, 8, 0)
    assert flush_step.kernels["_group_params_kernel"] >= 1 and flush_step.kernels["_encode_pack_kernel"] >= 1
    assert flush_step.total > 3


# -- the counts on the device -------------------------------------------------------------


def device_layout(cache) -> tuple[int, ...]:
    return tuple(cache.region().counts.tolist())


@pytest.mark.parametrize("method", ["PN-Mix", "KIVI-2"])  # shared / sliding value residual
@pytest.mark.parametrize("capacity", [60, None], ids=["preallocated", "dynamic"])
@pytest.mark.parametrize(
    ("prompt", "appends"),
    [(1, [1] * 14), (2, [3, 1, 5, 1, 1, 9, 2]), (3, [8, 8, 1]), (12, [1, 2, 3, 4, 5, 6, 7]), (20, [16, 1, 7, 1])],
)
def test_device_counts_equal_the_host_mirror_and_the_spec(prompt, appends, capacity, method):
    config = CONFIGS[method]
    gen = torch.Generator().manual_seed(prompt)
    q, k, v = (torch.randn(1, h, prompt, 16, generator=gen).half() for h in (4, 2, 2))
    cache = PNMixCache.from_prefill(q.to(DEV), k.to(DEV), v.to(DEV), config, max_cache_len=capacity)
    ref = R.ReferenceCache.from_prefill(q, k, v, config)
    assert device_layout(cache) == tuple(cache.layout)[:4] and cache._counts[4] == 0
    for t in appends:
        new_k, new_v = (torch.randn(1, 2, t, 16, generator=gen).half() for _ in range(2))
        cache.append(new_k.to(DEV), new_v.to(DEV))
        ref.append(new_k, new_v)
        assert device_layout(cache) == tuple(cache.layout)[:4] and cache.layout == ref.layout
        assert cache._counts[4] == 0  # the arrival counter is reset by every launch
        assert torch.equal(cache.residual()[0].cpu(), ref.residual()[0])
        assert torch.equal(cache.residual()[1].cpu(), ref.residual()[1])
        length = cache.length
        assert cache.sync_length() == length  # nothing to catch up on after eager calls
    assert cache.storage() == R.storage_model(config, 1, 2, 16, cache.length, torch.float16, capacity=capacity)


def test_replayed_appends_move_only_the_device_counts_until_sync_length():
    # What a CUDA-graph replay does, on any device: the captured launches run again on the same
    # tensors, and the host learns nothing until sync_length().
    eager, replayed = prefilled(), prefilled()  # 13 tokens: (3, 8, 2)
    static_k, static_v, static_q = step_tensors(0)
    rk, rv = replayed._rows["residual_key"].data, replayed._rows["residual_value"].data
    for i in range(4):
        k, v, q = step_tensors(i)
        eager.append(k, v)
        expected = eager.attend(q)
        static_k.copy_(k), static_v.copy_(v), static_q.copy_(q)
        append_rows(static_k, static_v, rk, rv, replayed._counts)
        assert device_layout(replayed) == (3, 8, 3 + i, 8) and replayed.length == 13
    assert replayed.sync_length() == 17 == eager.length
    assert torch.equal(replayed.residual()[0], eager.residual()[0])
    assert torch.equal(replayed.attend(static_q), expected)
    for _ in range(3):  # the residual page completes: only an eager append may flush it
        append_rows(static_k, static_v, rk, rv, replayed._counts)
    with pytest.raises(RuntimeError, match="replayed past the end of the residual page"):
        replayed.sync_length()


# -- CUDA graphs --------------------------------------------------------------------------


@pytest.mark.skipif(_runtime.INTERPRETED, reason="CUDA graphs need CUDA and compiled kernels (no TRITON_INTERPRET)")
@pytest.mark.parametrize("method", SHARED)
def test_a_captured_decode_step_replays_like_eager_decoding(method):
    config = CONFIGS[method]
    eager, graphed = prefilled(config, prompt=12), prefilled(config, prompt=12)  # (3, 8, 1): 6 steps of room
    static_k, static_v, static_q = step_tensors(0)
    eager.append(static_k, static_v)
    eager.attend(static_q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernels), one real step
        graphed.append(static_k, static_v)
        graphed.attend(static_q)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.append(static_k, static_v)
        static_out = graphed.attend(static_q)
    assert graphed.length == 14 and graphed.sync_length() == 13 == eager.length  # capture ran no kernel
    for i in range(1, 5):
        k, v, q = step_tensors(i)
        eager.append(k, v)
        expected = eager.attend(q)
        static_k.copy_(k), static_v.copy_(v), static_q.copy_(q)
        graph.replay()
        assert torch.equal(static_out, expected), f"replay {i}"  # the same launches on the same counts
    assert graphed.sync_length() == eager.length == 17
    assert torch.equal(graphed.residual()[0], eager.residual()[0])
    assert torch.equal(graphed.attend(static_q), eager.attend(static_q))


@pytest.mark.skipif(_runtime.INTERPRETED, reason="CUDA graphs need CUDA and compiled kernels (no TRITON_INTERPRET)")
def test_capture_refuses_what_cannot_be_captured():
    checked, dynamic = prefilled(check_finite="eager"), prefilled(capacity=None)
    sliding = prefilled(CONFIGS["KIVI-2"])  # its value window is full: every step quantizes a value
    k, v, _ = step_tensors(0)
    for cache, match in (
        (checked, "check_finite='eager'"),
        (dynamic, "preallocated cache"),
        (sliding, "sliding value window"),
    ):
        with pytest.raises(RuntimeError, match=match), torch.cuda.graph(torch.cuda.CUDAGraph()):
            cache.append(k, v)


# -- Hugging Face path --------------------------------------------------------------------


def test_hf_mask_waits_only_outside_one_token_decode_steps(monkeypatch):
    ones, padded, right = (torch.ones(2, 9, dtype=torch.bool) for _ in range(3))
    padded[0, 0], right[0, -1] = False, False
    assert pnmix_mask(2, 9, 9, q_offset=0, attention_mask=padded).pads == (1, 0)  # left padding: read in a prompt
    with pytest.raises(ValueError, match="left padding only"):
        pnmix_mask(2, 9, 9, q_offset=0, attention_mask=right)
    grown = torch.cat([ones, ones[:, :1]], 1)
    with counting(monkeypatch) as decode:
        assert pnmix_mask(2, 1, 10, q_offset=9, attention_mask=grown) == LayerMask(None)
    assert not decode.syncs and not decode.kernels
    with counting(monkeypatch) as prompt:
        pnmix_mask(2, 9, 9, q_offset=0, attention_mask=ones)
    assert prompt.syncs


def test_hf_cache_passes_check_finite_to_its_layers():
    from types import SimpleNamespace

    model = SimpleNamespace(model_type="llama", num_hidden_layers=2)
    cache = PNMixHFCache(model, PNMixConfig(), backend="triton", pair_layout="split", check_finite=False)
    assert not cache.check_finite and all(not layer.check_finite for layer in cache.layers)
    with pytest.raises(ValueError, match="check_finite=False needs backend='triton'"):
        PNMixHFCache(model, PNMixConfig(), backend="reference", pair_layout="split", check_finite=False)


@pytest.mark.long  # about a minute under the interpreter; property 10 covers flushes in the main run
def test_a_flush_failed_at_any_point_leaves_the_cache_as_it_was():
    """A preallocated cache overwrites its residual rows when a page completes; failed at points
    spread over the append's torch calls (allocations, copies, kernel launches), and at the last
    ones, which follow the overwrite, it must come back intact (dynamic caches: property 10)."""
    from reference.contract.faults import FaultAt

    config = PNMixConfig(group_size=8, residual_length=8, n_sink=2)
    g = torch.Generator().manual_seed(0)
    q, k, v, new_k, new_v = (
        torch.randn(1, h, n, 16, generator=g).half() for h, n in ((4, 13), (2, 13), (2, 13), (2, 6), (2, 6))
    )

    def fresh() -> PNMixCache:
        return PNMixCache.from_prefill(q, k, v, config, max_cache_len=64)

    count, cache = FaultAt(None), fresh()
    with count:
        cache.append(new_k, new_v)  # 3 residual + 6: a page completes
    probe = torch.randn(1, 4, 1, 16, generator=g).half()
    for at in sorted({*range(0, count.calls, max(1, count.calls // 8)), *range(count.calls - 4, count.calls)}):
        cache = fresh()
        before, out = (cache.length, cache.storage(), *cache.dequantize()), cache.attend(probe)
        fault = FaultAt(at)
        with pytest.raises(torch.OutOfMemoryError), fault:
            cache.append(new_k, new_v)
        assert fault.fired
        after = (cache.length, cache.storage(), *cache.dequantize())
        assert before[:2] == after[:2] and all(map(torch.equal, before[2:], after[2:])), f"failed at torch call {at}"
        assert torch.equal(cache.attend(probe), out), f"failed at torch call {at}, attention changed"
        assert torch.equal(cache._counts.cpu(), torch.tensor([*cache.layout[:4], 0], dtype=torch.int32))
