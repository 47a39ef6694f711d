"""A decode step the GPU never waits on, by default: the deferred input checks of
`PNMixCache(check_finite=True)` and of `pnmix.hf.PNMixHFCache`, counted per layer and step
inside `model.generate(...)`, and what they report, when, and in what state they leave the cache."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import pnmix.hf
from pnmix import PNMixCache, _runtime
from pnmix.cache import FLAG_BYTES, WATCHED
from pnmix.hf import ATTENTION, PNMixHFCache
from pnmix.tests.counting import counting
from reference import PNMixConfig
from reference.methods import METHODS

pytestmark = pytest.mark.interpreter if _runtime.INTERPRETED else pytest.mark.gpu
DEV = _runtime.kernel_device()
SMALL = PNMixConfig(group_size=8, residual_length=8, n_sink=4)
#: What runs per layer in a forward: the cache update and the attention function.
PER_LAYER = ((PNMixHFCache, "update"), (ALL_ATTENTION_FUNCTIONS, ATTENTION))
PROMPT, STEPS = 13, 3  # 13 tokens: 4 sinks, one page, 1 residual; 3 steps complete no page


def prompt_ids(n=PROMPT, seed=0):
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed)).to(DEV)


def forward(model, ids, cache):
    return model(input_ids=ids, **{pnmix.hf.cache_argument(model): cache}, use_cache=True).logits


@pytest.mark.parametrize("capacity", [32, None], ids=["preallocated", "dynamic"])
@pytest.mark.parametrize("check_finite", [True, "eager"], ids=["default", "eager"])
@torch.no_grad()
def test_the_default_hf_decode_step_never_waits_on_the_device(tiny_qwen3, monkeypatch, check_finite, capacity):
    model = tiny_qwen3
    cache = PNMixHFCache(model.config, SMALL, backend="triton", max_cache_len=capacity, check_finite=check_finite)
    prompt = prompt_ids()
    ids = torch.cat([prompt, forward(model, prompt, cache)[:, -1:].argmax(-1)], 1)
    with counting(monkeypatch, watch=PER_LAYER) as decode:  # every forward of this generate is a decode step
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            **{pnmix.hf.cache_argument(model): cache},
        )
    per_step = model.config.num_hidden_layers * STEPS
    syncs, aten, launches = sum(decode.syncs.values()) / per_step, decode.aten / per_step, decode.triton / per_step
    print(
        f"check_finite={check_finite!r} {'dynamic' if capacity is None else 'preallocated'}, per layer-step: "
        f"{syncs:g} syncs {dict(decode.syncs)}, {aten:g} aten ops, {launches:g} Triton launches; "
        f"{dict(decode.kernels)}"
    )
    assert cache.layers[0].cache.layout[:3] == (4, 8, 1 + STEPS)  # decode steps only, no flush among them
    assert launches <= 3
    if check_finite is True:
        assert syncs == 0, decode.syncs
        assert decode.kernels["aten.linalg_vector_norm"] == 3 * per_step  # k, v, q: checked all the same
        assert aten <= 6
    else:  # the counter sees what waits: k and v finite and in range, q finite
        assert syncs == 5 and decode.syncs["_local_scalar_dense"] == 5 * per_step
    cache.check()


def tensors(seed, t, heads=2, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, t, 16, generator=gen) * 2).to(dtype).to(DEV)


def prefilled(check_finite=True, prompt=PROMPT, dtype=torch.float16):
    q, k, v = tensors(0, prompt, 4, dtype), tensors(1, prompt, dtype=dtype), tensors(2, prompt, dtype=dtype)
    return PNMixCache.from_prefill(q, k, v, SMALL, max_cache_len=40, check_finite=check_finite)


@pytest.mark.parametrize("method", ["PN-Mix", "Kitty", "KIVI-2"])
@pytest.mark.parametrize("capacity", [40, None], ids=["preallocated", "dynamic"])
def test_decode_steps_that_flush_a_page_never_wait_on_the_device(monkeypatch, method, capacity):
    """A one-token step that completes a page (quantizes, packs and indexes the high plane's channels) reads
    nothing back from the device: the salient channels' count is the layout's (`CacheLayout.n_high_channels`),
    not read from the mask (`reference.equations.packing.salient_channel_index`); Kitty's per-page selection
    too."""
    cfg = METHODS[method](group_size=8, residual_length=8, n_sink=4)
    q, k, v = tensors(0, PROMPT, 4), tensors(1, PROMPT), tensors(2, PROMPT)
    cache = PNMixCache.from_prefill(q, k, v, cfg, max_cache_len=capacity)
    flushes = 0
    for step in range(9):
        quantized = cache.layout[1]
        with counting(monkeypatch) as append:
            cache.append(tensors(10 + step, 1), tensors(30 + step, 1))
        flushes += cache.layout[1] > quantized
        assert not append.syncs, f"step {step} (quantized {quantized} -> {cache.layout[1]}): {dict(append.syncs)}"
    assert flushes == 1
    cache.check()


def poisoned(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t[0, 1, -1, 3] = value
    return t


def test_checks_on_the_device_change_no_result_and_pass_good_input():
    checked, unchecked = prefilled(True), prefilled(False)
    assert checked._flags.numel() * 4 == FLAG_BYTES and unchecked._flags is None
    for i in range(4):
        k, v, q = tensors(10 + i, 1), tensors(20 + i, 1), tensors(30 + i, 1, heads=4)
        for cache in (checked, unchecked):
            cache.append(k, v)
        assert torch.equal(checked.attend(q), unchecked.attend(q))
    checked.check()
    assert checked.sync_length() == unchecked.length == PROMPT + 4
    last = [float(t.float().abs().max()) for t in (k, v, q)]
    assert checked._flags[0].tolist() == last  # the reductions are exact
    checked.check()  # passing does not change what is checked


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("k", float("nan"), "k contains NaN or Inf"),
        ("v", float("inf"), "v contains NaN or Inf"),
        ("q", float("-inf"), "q contains NaN or Inf"),
        ("v", 2e5, r"v has magnitude 1.997e\+05, above 6.55e\+04, the most a 2-bit group"),  # bfloat16
    ],
)
@pytest.mark.parametrize("read", ["check", "sync_length"])
def test_bad_decode_input_goes_through_and_is_reported_at_the_next_read(name, value, message, read):
    dtype = torch.bfloat16 if value == 2e5 else torch.float16  # float16 holds nothing above the limit
    cache, eager = prefilled(True, dtype=dtype), prefilled("eager", dtype=dtype)
    k, v, q = tensors(10, 1, dtype=dtype), tensors(20, 1, dtype=dtype), tensors(30, 1, heads=4, dtype=dtype)
    bad = {"k": k, "v": v, "q": q} | {name: poisoned({"k": k, "v": v, "q": q}[name], value)}
    with pytest.raises(ValueError, match=message):  # eager: at once, nothing stored
        eager.append(bad["k"], bad["v"])
        eager.attend(bad["q"])
    assert eager.length == PROMPT + (name == "q")  # a bad q: the append before it was good
    cache.append(bad["k"], bad["v"])  # no read: the step goes through as given
    cache.attend(bad["q"])
    assert cache.length == PROMPT + 1
    with pytest.raises(ValueError, match=message) as reported:
        getattr(cache, read)()
    call = "attend" if name == "q" else "append"
    assert f"given to {call} since prefill" in str(reported.value) and f"{read}()" in str(reported.value)
    for later in (lambda: cache.append(k, v), lambda: cache.attend(q), cache.check, cache.sync_length):
        with pytest.raises(ValueError, match=message):  # from the host: nothing read again
            later()
    assert cache.length == PROMPT + 1


def test_the_first_bad_argument_is_named_k_then_v_then_q():
    cache = prefilled()
    cache.append(tensors(10, 1), poisoned(tensors(20, 1), float("nan")))
    cache.attend(poisoned(tensors(30, 1, heads=4), float("nan")))
    cache.append(poisoned(tensors(11, 1), float("inf")), tensors(21, 1))
    with pytest.raises(ValueError, match=r"^k contains NaN or Inf"):
        cache.check()
    assert WATCHED == ("k", "v", "q")


def test_prefill_is_checked_before_anything_is_stored():
    q, k, v = tensors(0, PROMPT, 4), tensors(1, PROMPT), tensors(2, PROMPT)
    cache = PNMixCache(SMALL)
    with pytest.raises(ValueError, match="q contains NaN or Inf"):
        cache.prefill(poisoned(q, float("nan")), k, v)
    assert cache.cache_layout is None and cache._flags is None


@torch.no_grad()
def test_the_hf_cache_reports_bad_input_by_layer_at_check_and_at_the_next_prompt(tiny_qwen3, monkeypatch):
    model = tiny_qwen3
    cache = PNMixHFCache(model.config, SMALL, backend="triton", max_cache_len=32)
    token = forward(model, prompt_ids(), cache)[:, -1:].argmax(-1)
    cache.check()
    weight = model.model.layers[1].self_attn.k_proj.weight
    saved = weight.clone()
    weight[0, 0] = float("inf")  # layer 1's keys go bad from the next step on
    try:
        with counting(monkeypatch, watch=PER_LAYER) as step:
            forward(model, token, cache)
        assert not step.syncs  # the bad step waits on nothing
    finally:
        weight.copy_(saved)
    with counting(monkeypatch) as read:
        with pytest.raises(ValueError, match=r"^layer 1: k contains NaN or Inf"):
            cache.check()
    assert sum(read.syncs.values()) == 1  # every layer in one read
    with pytest.raises(ValueError, match=r"^layer 1: k contains NaN or Inf"):
        forward(model, prompt_ids(2, seed=1), cache)  # more than one token: its mask check waits anyway


@pytest.mark.skipif(_runtime.INTERPRETED, reason="CUDA graphs need CUDA and compiled kernels (no TRITON_INTERPRET)")
def test_a_checked_decode_step_is_captured_and_replays_its_checks():
    cache = prefilled(True, prompt=12)  # (4, 8, 0): 7 steps before the page completes
    static_k, static_v, static_q = tensors(10, 1), tensors(20, 1), tensors(30, 1, heads=4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernels), one real step
        cache.append(static_k, static_v)
        cache.attend(static_q)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache.append(static_k, static_v)
        cache.attend(static_q)
    assert cache.sync_length() == 13
    graph.replay()
    assert cache.sync_length() == 14  # good input: replays pass the checks
    static_v.copy_(poisoned(static_v, float("nan")))
    graph.replay()
    with pytest.raises(ValueError, match="v contains NaN or Inf"):
        cache.sync_length()
