"""A cache whose quantized region is stored in fragment order: the spec's bytes, reordered at each page flush (eager,
preallocated, capturable), put back by `packed()`, accounted the same, and attended over by the fragment-order loop's
path (its torch twin on a CPU) as the spec's order is by the Triton kernel, judged against float64 attention."""

from __future__ import annotations

import math

import pytest
import torch

import reference as R
from pnmix import PNMixCache
from pnmix.kernels import fragment, fragment_check, fragment_decode
from reference.contract.tolerances import attention_bound
from reference.equations import packing


def spec_bytes(lead: tuple[int, ...], tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random codes of whole tiles packed in the spec's layouts: key_low, key_high and value_payload bytes."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randint(0, 2, (*lead, tokens, 128), generator=g, dtype=torch.uint8)
    high = torch.randint(0, 4, (*lead, tokens, 64), generator=g, dtype=torch.uint8)
    values = torch.randint(0, 4, (*lead, tokens, 128), generator=g, dtype=torch.uint8)
    return packing.pack_fields(low, 1, -2), packing.pack_fields(high, 2, -2), packing.pack_fields(values, 2, -1)


@pytest.mark.parametrize(("lead", "tokens"), [((), 64), ((2, 3), 256), ((1, 1), 0)])
def test_fragment_order_reorders_the_spec_bytes_and_back(lead, tokens):
    planes = spec_bytes(lead, tokens, seed=tokens)
    reordered = fragment.to_fragment_order(*planes)
    for got, want in zip(reordered, planes, strict=True):
        assert got.shape == want.shape and got.dtype == torch.uint8  # same components, same bytes counted
    for got, want in zip(fragment.to_spec_order(*reordered), planes, strict=True):
        assert torch.equal(got, want)
    if tokens:
        assert not torch.equal(reordered[0], planes[0])  # an order that moved nothing would pass the above too


def test_a_tile_in_fragment_order_is_the_tile_the_table_packs():
    """Tile j of a head is, in each component, that plane's words of `fragment.pack` for the tile's warp slices."""
    tokens = 128
    lo_b, hi_b, v_b = spec_bytes((), tokens, seed=5)
    low = packing.unpack_fields(lo_b, 1, -2)  # [tokens, 128]
    high = packing.unpack_fields(hi_b, 2, -2)
    values = packing.unpack_fields(v_b, 2, -1)
    slices = tokens // fragment.TOKENS_PER_WARP
    words = fragment.pack(
        low.view(slices, 16, 128).transpose(1, 2).long(),
        high.view(slices, 16, 64).transpose(1, 2).long(),
        values.view(slices, 16, 128).long(),
    )
    tiles = tokens // fragment.TILE
    got = [
        p.contiguous().view(torch.int32).view(tiles, fragment.WARPS, 32, -1)
        for p in fragment.to_fragment_order(lo_b, hi_b, v_b)
    ]
    assert torch.equal(torch.cat(got, dim=-1), words)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"key_low": torch.zeros(2, 4, 128, dtype=torch.uint8)}, r"key_low must be uint8 \[\.\.\., 8, 128\]"),
        ({"key_high": torch.zeros(2, 16, 64, dtype=torch.int32)}, r"key_high must be uint8"),
        ({"value_payload": torch.zeros(2, 32, 32, dtype=torch.uint8)}, r"key_low must be uint8 \[\.\.\., 4, 128\]"),
    ],
)
def test_a_region_of_another_shape_is_refused_by_name(bad, match):
    planes = dict(zip(("key_low", "key_high", "value_payload"), spec_bytes((2,), 64, seed=0), strict=True)) | bad
    with pytest.raises(ValueError, match=match):
        fragment.to_fragment_order(**planes)


def test_a_region_of_a_partial_tile_is_refused_by_name():
    planes = [p[..., : p.shape[-2] // 2, :] for p in spec_bytes((), 64, seed=0)]
    with pytest.raises(ValueError, match="whole tiles of 64 tokens, got 32"):
        fragment.to_spec_order(*planes)


def data(shape, seed, scale=1.0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def judge(cache_out: torch.Tensor, reference: R.ReferenceCache, q: torch.Tensor) -> tuple[float, float]:
    """(error, bound): the output against float64 attention over the spec's dequantized cache, and the bound of
    twice the error of the same attention in float16 (`attention_bound`)."""
    k_hat, v_hat = reference.dequantize()
    oracle = R.attention_ref(q.double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = R.attention_ref(q, k_hat.to(q.dtype), v_hat.to(q.dtype), causal=True, upcast=False)
    return (cache_out.double() - oracle).abs().max().item(), attention_bound(oracle, low, q.dtype)


@pytest.mark.parametrize(
    ("kwargs", "prompt", "steps", "splits", "dtype"),
    [
        ({}, 32 + 2 * 128 + 20, 0, None, torch.float16),  # pages flushed by prefill, a dynamic cache
        ({}, 32 + 4 * 128 + 20, 0, 4, torch.float16),  # the exact regions in a split of their own
        ({}, 32 + 2 * 128 + 20, 0, 4, torch.bfloat16),  # bfloat16 queries, keys and values
        ({"max_cache_len": 512}, 32 + 127, 2, 1, torch.float16),  # an eager page flush into a preallocated cache
        ({"max_cache_len": 512, "capturable": True}, 32 + 127, 2, None, torch.float16),  # completed on the device
    ],
)
def test_a_cache_in_fragment_order_stores_the_spec_bytes_and_attends_as_the_spec(kwargs, prompt, steps, splits, dtype):
    batch, n_kv, n_rep, d = 1, 2, 4, 128
    cfg = R.PNMixConfig()
    q, k, v = (
        data((batch, n_kv * n_rep, prompt, d), 1, dtype=dtype),
        data((batch, n_kv, prompt, d), 2, 2.0, dtype),
        data((batch, n_kv, prompt, d), 3, dtype=dtype),
    )
    frag = PNMixCache.from_prefill(q, k, v, cfg, code_order="fragment", **kwargs)
    spec = PNMixCache.from_prefill(q, k, v, cfg, code_order="spec", **kwargs)
    ref = R.ReferenceCache.from_prefill(q, k, v, cfg)
    for step in range(steps):
        kk, vv = data((batch, n_kv, 1, d), 10 + step, 2.0, dtype), data((batch, n_kv, 1, d), 20 + step, dtype=dtype)
        for cache in (frag, spec, ref):
            cache.append(kk, vv)
    assert frag.code_order == "fragment" and frag.fragment_path[0] == "twin" and spec.code_order == "spec"
    assert frag.layout.n_quantized >= fragment.TILE  # a page was flushed
    for name, held in frag.packed().items():
        assert torch.equal(held, spec.packed()[name]), name
    assert not torch.equal(frag.region().tensors["key_low"], spec.region().tensors["key_low"])  # stored reordered
    assert frag.storage() == spec.storage()
    new_q = data((batch, n_kv * n_rep, 1, d), 4, dtype=dtype)
    out = frag.attend(new_q, num_splits=splits)
    err, bound = judge(out, ref, new_q)
    assert err <= bound, (err, bound)
    spec_err, _ = judge(spec.attend(new_q), ref, new_q)
    assert err <= 2 * spec_err + bound / 10  # and as close as the Triton kernel over the spec's order
    # two new tokens: the loop does not cover them, the spec's order is read back
    two = data((batch, n_kv * n_rep, 2, d), 5, dtype=dtype)
    assert torch.equal(frag.attend(two), spec.attend(two))


def test_a_wrong_loop_would_show(monkeypatch):
    """The same cache whose loop drops its last tile: the judge of the test above fails it."""
    cfg = R.PNMixConfig()
    prompt, d = 32 + 2 * 128 + 4, 128
    q, k, v = data((1, 4, prompt, d), 1), data((1, 1, prompt, d), 2, 2.0), data((1, 1, prompt, d), 3)
    frag = PNMixCache.from_prefill(q, k, v, cfg, code_order="fragment")
    ref = R.ReferenceCache.from_prefill(q, k, v, cfg)
    twin = fragment_decode.twin

    def short(q, idx, words, *args, **kwargs):
        words = words.clone()
        words[-1, :, :, 4:] = 0  # the last tile's values all read as code 0
        return twin(q, idx, words, *args, **kwargs)

    monkeypatch.setattr(fragment_decode, "twin", short)
    new_q = data((1, 4, 1, d), 4)
    err, bound = judge(frag.attend(new_q), ref, new_q)
    assert err > bound


@pytest.mark.parametrize(
    ("config", "dtype", "d", "match"),
    [
        (R.PNMixConfig(b_high=4), torch.float16, 128, r"b_high - b_low 2"),
        (R.PNMixConfig(ratio=0.25), torch.float16, 128, r"64 salient channels \(got 32\)"),
        (R.PNMixConfig(group_size=64, residual_length=128), torch.float16, 128, r"group_size 128 \(got 64\)"),
        (R.PNMixConfig(scale_dtype=torch.bfloat16), torch.bfloat16, 128, r"float16 scales"),
        (R.PNMixConfig(), torch.float16, 64, r"head_dim 128 \(got 64\)"),
        (R.PNMixConfig(value_bits=4), torch.float16, 128, r"2-bit values"),
    ],
)
def test_fragment_order_where_the_loop_cannot_read_it_is_refused_by_name(config, dtype, d, match):
    q, k, v = data((1, 2, 40, d), 1).to(dtype), data((1, 1, 40, d), 2).to(dtype), data((1, 1, 40, d), 3).to(dtype)
    with pytest.raises(ValueError, match="code_order='fragment': the fragment-order loop needs .*" + match):
        PNMixCache.from_prefill(q, k, v, config, code_order="fragment")
    assert PNMixCache.from_prefill(q, k, v, config).code_order == "spec"  # auto: the spec's order, silently


def test_an_unknown_code_order_is_refused_by_name():
    with pytest.raises(ValueError, match=r"code_order must be one of \('auto', 'spec', 'fragment'\), got 'mma'"):
        PNMixCache(code_order="mma")


def test_auto_takes_fragment_order_where_the_self_test_passed(monkeypatch):
    monkeypatch.setattr(fragment_check, "decide", lambda device, dtype: ("plain", "self-test passed"))
    q, k, v = data((1, 2, 40, 128), 1), data((1, 1, 40, 128), 2), data((1, 1, 40, 128), 3)
    cache = PNMixCache.from_prefill(q, k, v)
    assert cache.code_order == "fragment" and cache.fragment_path == ("plain", "self-test passed")
    monkeypatch.setattr(fragment_check, "decide", lambda device, dtype: ("off", "self-test failed"))
    assert PNMixCache.from_prefill(q, k, v).code_order == "spec"


def test_the_loop_keeps_q_s_in_float16_range_whatever_the_scales():
    """Scales so large that q * 2 s passes float16's 65504: the headroom exponent keeps the twin's (the kernel's)
    high-plane operands finite and the result as accurate as float32 attention."""
    stacked, planes = fragment_check.synthetic(4, seed=7, rows=4)
    args = fragment_check.head(stacked, 0)
    args["q"] = (args["q"].float() * 40).to(torch.float16)
    args["ks"] = (args["ks"].float() * 4000).to(torch.float16)  # |q 2 s| up to ~1e6
    assert float(args["q"].float().abs().max() * 2 * args["ks"].float().abs().max()) > 65504
    qk_scale = 1e-6 / math.log(2)  # logits of order one
    out = fragment_decode.merge(*fragment_decode.twin(**args, qk_scale=qk_scale, n_splits=2))[:4].double()
    exact = fragment_check.reference(args, planes[0], qk_scale, torch.float64)
    single = fragment_check.reference(args, planes[0], qk_scale, torch.float32).double()
    assert bool(torch.isfinite(out).all())
    assert (out - exact).abs().max() <= 2 * (single - exact).abs().max()
